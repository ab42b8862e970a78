//! Damage to a private store, told from the words of a git command that already
//! failed in it (never from a server's `remote:` lines) or from a store path that
//! cannot be opened as a store, and `healing`, which rebuilds such a store once
//! per process and runs the step again.

use anyhow::{Context, Result};

use std::path::{Path, PathBuf};
use xshell::Shell;

use super::*;

/// Words git prints when an object store lacks an object it should have or
/// holds a damaged one (deleted or truncated packs, a corrupt or empty
/// loose object, a ref to an object that is not there). Lines from the
/// server (`remote: ...`) never count: a damaged remote is not ours to
/// rebuild.
pub(super) const DAMAGE: [&str; 18] = [
    "bad object",
    "missing blob object",
    "missing tree object",
    "missing commit object",
    "did not send all necessary objects",
    "cannot be accessed",
    "object file",
    "is corrupt",
    "corrupt loose object",
    "inflate:",
    "unable to rename temporary",
    "does not match index",
    "bad packed object",
    "does not point to a valid object",
    "unable to read tree",
    "not a git repository",
    "index file",
    // The store's own `shallow` file: git reads no other.
    "bad shallow line",
];

/// Whether git (not the server) failed to take one of its own ref or
/// file locks in the store.
pub(super) fn says_locked(stderr: &str) -> bool {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("remote:"))
        .any(|l| l.contains("cannot lock ref") || l.contains(".lock': File exists"))
}

pub(super) fn says_damaged(stderr: &str) -> bool {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("remote:"))
        .any(|l| DAMAGE.iter().any(|w| l.contains(w)))
}

/// Whether git failed to parse the configuration file of the store at
/// `dir` (`bad config line 1 in file <dir>/config`). A bad line in the
/// user's own configuration (global, system, their repository's) is theirs
/// to fix, and rebuilding the store would not help: it never counts.
pub(super) fn says_config_damaged(dir: &Path, stderr: &str) -> bool {
    let own = format!("in file {}", dir.join("config").display());
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("remote:"))
        .any(|l| l.contains("bad config") && l.ends_with(&own))
}

/// A private store (cache.git, cache-meta.git) that failed in a way that
/// says it is damaged, found on the failure path only (from git's words):
/// `healing` rebuilds it once and runs the step again.
#[derive(Debug, Clone)]
pub struct StoreDamaged {
    pub dir: PathBuf,
    /// What git said.
    pub detail: String,
    /// The store's inode when the damage was seen: a store another process
    /// has rebuilt since then is not rebuilt again.
    inode: Option<u64>,
    /// Whether the message stands alone (inside an I/O error) or heads the
    /// error it is the context of (which already says what git said).
    standalone: bool,
}

impl StoreDamaged {
    /// `Some` when `stderr` (of git run in the store at `dir`) says damaged.
    pub(super) fn of(dir: &Path, stderr: &str) -> Option<StoreDamaged> {
        (says_damaged(stderr) || says_config_damaged(dir, stderr)).then(|| StoreDamaged {
            dir: dir.to_path_buf(),
            detail: last_lines(stderr),
            inode: inode(dir),
            standalone: true,
        })
    }
}

/// Rebuilds the store at `dir`, which is there but cannot be opened as a
/// store (`what`: a file where the directory belongs, a directory without
/// `HEAD`), once per process and with one warning, as `healing` does a store
/// git found damaged. Only called once the open has failed that way.
pub(super) fn rebuild_unopenable(dir: &Path, what: &str) -> Result<()> {
    let d = StoreDamaged {
        dir: dir.to_path_buf(),
        detail: what.to_string(),
        inode: inode(dir),
        standalone: true,
    };
    if !rebuild_once(&d)? {
        anyhow::bail!(
            "{} cannot be opened as a git store ({what}), and rebuilding it once did not help",
            dir.display()
        );
    }
    Ok(())
}

impl std::fmt::Display for StoreDamaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} looks damaged", self.dir.display())?;
        if self.standalone {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreDamaged {}

pub(super) fn inode(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// `err`, marked as a damaged store when `stderr` says so (its exit code
/// is kept: if a rebuild does not help, the remote really is at fault).
pub(super) fn damaged_or(dir: &Path, stderr: &str, err: anyhow::Error) -> anyhow::Error {
    match StoreDamaged::of(dir, stderr) {
        Some(d) => err.context(StoreDamaged {
            standalone: false,
            ..d
        }),
        None => err,
    }
}

/// The damaged store `err` reports, wherever it is in the chain (also
/// inside an I/O error from a `BlobReader`).
pub fn damage_of(err: &anyhow::Error) -> Option<StoreDamaged> {
    if let Some(d) = err.downcast_ref::<StoreDamaged>() {
        return Some(d.clone());
    }
    err.chain().find_map(|e| {
        e.downcast_ref::<StoreDamaged>().cloned().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<StoreDamaged>())
                .cloned()
        })
    })
}

/// Runs `step`; if it failed because a private store is damaged, rebuilds
/// that store (once per store and process, with a one-line warning) and
/// runs `step` again. Nothing is checked unless `step` failed, so this
/// adds no I/O to any path that works; and only the store is rebuilt,
/// never anything installed. `step` must be safe to run again from the
/// start (it fetches again what the store lost).
pub fn healing<T>(mut step: impl FnMut() -> Result<T>) -> Result<T> {
    let err = match step() {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match damage_of(&err) {
        Some(d) if rebuild_once(&d)? => step(),
        _ => Err(err),
    }
}

/// Rebuilds a damaged store empty, under its lock, unless this process
/// already did (then `false`: the damage is not the store's). The old
/// store is renamed aside first, so that no process ever sees half of one.
pub(super) fn rebuild_once(d: &StoreDamaged) -> Result<bool> {
    static REBUILT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut rebuilt = REBUILT.lock().unwrap_or_else(|p| p.into_inner());
    if rebuilt.contains(&d.dir) {
        return Ok(false);
    }
    rebuilt.push(d.dir.clone());
    let _lock = StoreLock::take(&d.dir, STORE_LOCK_WAIT)?;
    if d.inode.is_some() && inode(&d.dir) != d.inode {
        // Another process rebuilt it since we saw the damage.
        return Ok(true);
    }
    let name = d.dir.file_name().unwrap_or_default().to_string_lossy();
    let aside = d
        .dir
        .with_file_name(format!("{name}.damaged-{}", std::process::id()));
    remove_any(&aside);
    if std::fs::symlink_metadata(&d.dir).is_ok() {
        std::fs::rename(&d.dir, &aside).with_context(|| {
            format!(
                "moving the damaged {} aside to {}",
                d.dir.display(),
                aside.display()
            )
        })?;
    }
    let sh = Shell::new().context("starting a shell to rebuild a store")?;
    create(&sh, &d.dir)?;
    let kept = carry_chunks(&aside.join("chunks"), &d.dir.join("chunks"));
    remove_any(&aside);
    let kept = match kept {
        0 => String::new(),
        n => format!(" (kept the {n} verified chunk file(s) of its chunk store)"),
    };
    eprintln!(
        "warning: {} was damaged ({}): rebuilt it empty{kept}, and what it held is fetched again",
        d.dir.display(),
        d.detail
    );
    Ok(true)
}

/// Removes `path`, a directory tree, a file or a link, if anything is there.
fn remove_any(path: &Path) {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => {
            let _ = std::fs::remove_dir_all(path);
        }
        Ok(_) => {
            let _ = std::fs::remove_file(path);
        }
        Err(_) => {}
    }
}

/// Moves the chunk files of the old store's chunk store (`from`) into the
/// new one's (`to`): regular files named by a sha256, the name each got
/// once its bytes matched it (every reader checks them again). Partial
/// files and anything else stay behind and go with the old store. A
/// chunk store that is not a directory holds nothing to keep. Returns how
/// many were kept; a failure keeps fewer, never fails the rebuild.
fn carry_chunks(from: &Path, to: &Path) -> usize {
    if !std::fs::symlink_metadata(from).is_ok_and(|m| m.is_dir()) {
        return 0;
    }
    let Ok(entries) = std::fs::read_dir(from) else {
        return 0;
    };
    if std::fs::create_dir_all(to).is_err() {
        return 0;
    }
    let mut kept = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        let named = name.to_str().is_some_and(|n| {
            n.len() == 64
                && n.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        });
        if named
            && e.file_type().is_ok_and(|t| t.is_file())
            && std::fs::rename(e.path(), to.join(&name)).is_ok()
        {
            kept += 1;
        }
    }
    kept
}

/// Makes the chunk store directory `dir` (`cache.git/chunks`) if it is not
/// there. When that fails because something else is in its place (a file,
/// a link), that thing holds no chunk: it is removed, with one warning,
/// and the directory made, once per process: the store's damage judged
/// from the operation that failed, as `healing` judges git's words.
pub fn make_chunk_dir(dir: &Path) -> std::io::Result<()> {
    static HEALED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    if std::fs::create_dir_all(dir).is_ok() {
        return Ok(());
    }
    // Again under the lock: another fetcher thread may have healed it.
    let mut healed = HEALED.lock().unwrap_or_else(|p| p.into_inner());
    let err = match std::fs::create_dir_all(dir) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let in_the_way = std::fs::symlink_metadata(dir).is_ok_and(|m| !m.is_dir());
    if !in_the_way || healed.iter().any(|d| d == dir) {
        return Err(std::io::Error::new(
            err.kind(),
            format!("creating {}: {err}", dir.display()),
        ));
    }
    healed.push(dir.to_path_buf());
    std::fs::remove_file(dir)?;
    std::fs::create_dir_all(dir)?;
    eprintln!(
        "warning: {} was damaged (not a directory): rebuilt it empty, and the chunks it should hold are fetched again",
        dir.display()
    );
    Ok(())
}
