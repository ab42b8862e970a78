//! Files written whole or not at all: the one atomic write of the crate.
//!
//! Every record warmstart keeps (state, stamps, packed records, delta and
//! overlay records, generated files) is written to a temporary file beside
//! its path, fsynced, renamed over the path, and the directory fsynced, so a
//! crash leaves the old bytes or the new ones, never a mix. The temporary
//! name is unique per process and per write (steps of a parallel plan write
//! from several threads at once) and starts with `.`, so a reader listing
//! the directory for records never takes it for one.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
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
/// parent directory when it is missing.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_beside(path)?;
    let dir = tmp
        .parent()
        .expect("temp_beside names a file in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
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
