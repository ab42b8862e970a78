//! Files written whole or not at all: the one atomic write of the crate.
//!
//! Every record warmstart keeps (state, stamps, packed records, delta and
//! overlay records, generated files) is written to a temporary file beside
//! its path, fsynced, renamed over the path, and the directory fsynced, so a
//! crash leaves the old bytes or the new ones, never a mix. The temporary
//! name is unique per process and per write (steps of a parallel plan write
//! from several threads at once) and starts with `.`, so a reader listing
//! the directory for records never takes it for one.
//!
//! Beside it, the one spelling of a path as a write would reach it:
//! `lexical` (`.` and `..` resolved without the file system) and
//! `through_links` (its longest existing prefix resolved through symlinks).

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The temporary name beside `path` for one write: `.<name>.tmp-<pid>-<n>`.
pub fn temp_beside(path: &Path) -> Result<PathBuf> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    Ok(dir.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )))
}

/// Writes `bytes` to `path` atomically (see the module doc), creating the
/// parent directory when it is missing. The file gets the mode a plain
/// create gives (0o666 less the umask).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write(path, bytes, None)
}

/// [`write_atomic`] with the file's permission bits set to exactly `mode`
/// (the umask does not apply): a generated script's 0o755, a private
/// journal's 0o600.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    write(path, bytes, Some(mode))
}

fn write(path: &Path, bytes: &[u8], mode: Option<u32>) -> Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = temp_beside(path)?;
    let dir = tmp
        .parent()
        .expect("temp_beside names a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // create_new with O_NOFOLLOW: never through a link or a file someone
    // left at the temporary name, even in a directory another user writes.
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::options()
            .write(true)
            .create_new(true)
            .mode(mode.unwrap_or(0o666))
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        if let Some(m) = mode {
            f.set_permissions(std::fs::Permissions::from_mode(m))?;
        }
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", tmp.display()));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("renaming onto {}", path.display()));
    }
    // The rename is durable once the directory is: a failure here changes
    // nothing a reader sees, so it is not an error.
    if let Ok(d) = std::fs::File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

// ---- paths as a write would reach them

/// `p` with `.` dropped and each `..` taking off the component before it
/// (no file system access).
pub fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// `p` with its longest existing prefix resolved through symlinks (the rest
/// taken lexically): where a write to `p` would land.
pub fn through_links(p: &Path) -> PathBuf {
    let parts: Vec<Component> = p.components().collect();
    for n in (1..=parts.len()).rev() {
        let head: PathBuf = parts[..n].iter().collect();
        if let Ok(real) = std::fs::canonicalize(&head) {
            let rest: PathBuf = parts[n..].iter().collect();
            return lexical(&real.join(rest));
        }
    }
    lexical(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_replaces_the_whole_file_and_leaves_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("sub/record.json");
        write_atomic(&p, b"first, longer text").unwrap();
        write_atomic(&p, b"second").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"second");
        let names: Vec<_> = std::fs::read_dir(p.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["record.json"]);
    }

    #[test]
    fn temporary_names_differ_per_write_within_one_process() {
        let p = Path::new("/x/y.json");
        let a = temp_beside(p).unwrap();
        let b = temp_beside(p).unwrap();
        assert_ne!(a, b);
        assert!(
            a.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(".y.json.tmp-")
        );
    }

    #[test]
    fn a_mode_is_set_exactly_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        for mode in [0o755, 0o600, 0o644] {
            let p = tmp.path().join(format!("f{mode:o}"));
            write_atomic_mode(&p, b"x", mode).unwrap();
            let got = std::fs::metadata(&p).unwrap().permissions().mode() & 0o7777;
            assert_eq!(got, mode);
        }
    }

    #[test]
    fn a_link_at_the_temporary_name_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let precious = tmp.path().join("precious");
        std::fs::write(&precious, "keep\n").unwrap();
        // Plant a link at every name the next few writes could take.
        let p = tmp.path().join("record");
        let next = temp_beside(&p).unwrap();
        let name = next.file_name().unwrap().to_string_lossy().into_owned();
        let (stem, n) = name.rsplit_once('-').unwrap();
        let n: u64 = n.parse().unwrap();
        for k in n + 1..n + 64 {
            std::os::unix::fs::symlink(&precious, tmp.path().join(format!("{stem}-{k}"))).unwrap();
        }
        // Another thread of this test binary may take some of those
        // numbers; whatever name this write gets, the link's target is kept.
        let _ = write_atomic(&p, b"new");
        assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep\n");
    }

    #[test]
    fn a_failed_rename_removes_its_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        // A directory in the way: the rename fails, nothing is left beside it.
        let p = tmp.path().join("busy");
        std::fs::create_dir_all(p.join("inside")).unwrap();
        assert!(write_atomic(&p, b"x").is_err());
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["busy"]);
    }
}
