//! Damage to a private store, told from the words of a git command that already
//! failed in it (never from a server's `remote:` lines), and `healing`, which
//! rebuilds such a store once per process and runs the step again.

use anyhow::{Context, Result};

use std::path::{Path, PathBuf};
use xshell::Shell;

use super::*;

/// Words git prints when an object store lacks an object it should have or
/// holds a damaged one (deleted or truncated packs, a corrupt or empty
/// loose object, a ref to an object that is not there). Lines from the
/// server (`remote: ...`) never count: a damaged remote is not ours to
/// rebuild.
pub(super) const DAMAGE: [&str; 17] = [
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
        says_damaged(stderr).then(|| StoreDamaged {
            dir: dir.to_path_buf(),
            detail: last_lines(stderr),
            inode: inode(dir),
            standalone: true,
        })
    }
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
    let _ = std::fs::remove_dir_all(&aside);
    if d.dir.exists() {
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
    let _ = std::fs::remove_dir_all(&aside);
    eprintln!(
        "warning: {} was damaged ({}): rebuilt it empty, and what it held is fetched again",
        d.dir.display(),
        d.detail
    );
    Ok(true)
}
