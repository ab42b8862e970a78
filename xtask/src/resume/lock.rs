//! The index lock: the directory `<index>.lock`, made with mkdir and removed
//! with rmdir, exactly as the JavaScript tool does, so both serialise on it.
//!
//! On top of that protocol this side is careful where the JavaScript tool is
//! not. A stale lock (older than 15 s, or dated more than 15 s in the future
//! by a clock that disagrees with ours) is stolen by renaming it to a unique
//! name and checking that the renamed directory is the very one judged stale
//! (same device, inode and mtime) before removing it, so two stealers never
//! both win and a fresh lock is never removed. Stealers of this tool also
//! take turns (flock on the directory) and look again in their turn, so they
//! never move a fresh lock at all; only the JavaScript tool's unchecked
//! rmdir-steal can make one move a fresh lock, which it then puts back. A
//! lock is released only while it is still the directory this process made,
//! and anything at the lock path that is not an empty directory is reported
//! at once instead of being waited on. This module never reads or writes the
//! index itself.

use crate::exit::{Code, fail};
use anyhow::{Context, Result};
use std::ffi::{CString, OsString};
use std::fs;
use std::io::ErrorKind;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a writer waits for the lock before giving up (exit 3).
pub const DEFAULT_WAIT: Duration = Duration::from_secs(4);
/// A lock whose mtime is older than this is stale: its writer died.
pub const DEFAULT_STALE: Duration = Duration::from_secs(15);

/// The waiting and staleness limits. Tests shorten them through the hidden
/// variables `WARMSTART_RESUME_LOCK_WAIT_MS` and `WARMSTART_RESUME_LOCK_STALE_MS`.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    pub wait: Duration,
    pub stale: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            wait: DEFAULT_WAIT,
            stale: DEFAULT_STALE,
        }
    }
}

impl Timing {
    /// The limits, shortened by the test variables. A value that does not
    /// parse never gets here: `settings::check_env` refused it at startup.
    pub fn from_env() -> Timing {
        let ms = |var: &str, default: Duration| {
            crate::settings::millis(var)
                .ok()
                .flatten()
                .unwrap_or(default)
        };
        Timing {
            wait: ms("WARMSTART_RESUME_LOCK_WAIT_MS", DEFAULT_WAIT),
            stale: ms("WARMSTART_RESUME_LOCK_STALE_MS", DEFAULT_STALE),
        }
    }
}

/// The identity of one lock directory: a new directory at the same path,
/// even one that reuses the inode number, has a different mtime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DirId {
    dev: u64,
    ino: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl DirId {
    fn of(meta: &fs::Metadata) -> DirId {
        DirId {
            dev: meta.dev(),
            ino: meta.ino(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// The lock directory for an index: `<index>.lock`.
pub fn lock_path(index: &Path) -> PathBuf {
    with_suffix(index, ".lock")
}

/// `path` with `suffix` appended to its last component.
pub fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = OsString::from(path.as_os_str());
    name.push(suffix);
    PathBuf::from(name)
}

/// A held lock. Dropping it releases it (if it is still ours).
#[derive(Debug)]
pub struct Lock {
    path: PathBuf,
    id: DirId,
    released: bool,
    /// The stale lock this process stole on the way, if any.
    pub stole: Option<Age>,
}

/// How old a lock is by its mtime, against this machine's clock.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Age {
    Past(Duration),
    /// Dated this far in the future: its maker's clock was ahead of ours
    /// (another machine on a shared disk), or ours was set back.
    Future(Duration),
}

impl Age {
    pub fn of(meta: &fs::Metadata) -> Age {
        let Ok(mtime) = meta.modified() else {
            return Age::Past(Duration::ZERO);
        };
        match SystemTime::now().duration_since(mtime) {
            Ok(age) => Age::Past(age),
            Err(e) => Age::Future(e.duration()),
        }
    }

    /// Stale: older than the limit, or dated more than the limit in the
    /// future. A live writer holds the lock under the limit, so a lock that
    /// far ahead of our clock cannot be the fresh lock of a live writer
    /// whose clock agrees with ours; waiting for it to age would take the
    /// skew plus the limit, forever if the skew is large.
    pub fn is_stale(self, limit: Duration) -> bool {
        match self {
            Age::Past(age) | Age::Future(age) => age > limit,
        }
    }
}

impl std::fmt::Display for Age {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Age::Past(age) => write!(f, "taken {} ago", crate::clock::human(*age)),
            Age::Future(skew) => write!(
                f,
                "dated {} in the future: clock skew",
                crate::clock::human(*skew)
            ),
        }
    }
}

fn kind_of(meta: &fs::Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_symlink() {
        "symbolic link"
    } else if t.is_file() {
        "regular file"
    } else if t.is_fifo() {
        "fifo"
    } else if t.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// Takes the lock at `path` (the `<index>.lock` directory), waiting up to
/// `timing.wait` for another writer and stealing a lock older than
/// `timing.stale`. Fails with exit code 3 on timeout, 5 when the lock path
/// holds something no writer could have made.
pub fn acquire(path: &Path, timing: Timing) -> Result<Lock> {
    let deadline = Instant::now() + timing.wait;
    let mut stole = None;
    for attempt in 0u32.. {
        match fs::create_dir(path) {
            Ok(()) => {
                let meta = fs::symlink_metadata(path).with_context(|| {
                    format!("reading the lock directory {} just made", path.display())
                })?;
                return Ok(Lock {
                    path: path.to_path_buf(),
                    id: DirId::of(&meta),
                    released: false,
                    stole,
                });
            }
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("creating the lock directory {}", path.display()));
            }
        }
        let meta = match fs::symlink_metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            Err(e) => {
                return Err(e).with_context(|| format!("inspecting the lock {}", path.display()));
            }
        };
        if !meta.is_dir() {
            return Err(fail(
                Code::Corrupt,
                format!(
                    "the index lock {0} is a {1}, not an empty directory: no writer makes that, and the JavaScript tool would wait on it forever; remove it (rm {0}) when no writer is running",
                    path.display(),
                    kind_of(&meta)
                ),
            ));
        }
        match fs::read_dir(path).map(|mut d| d.next()) {
            Ok(None) => {}
            Ok(Some(entry)) => {
                let name = entry.map(|e| e.file_name()).unwrap_or_default();
                return Err(fail(
                    Code::Corrupt,
                    format!(
                        "the index lock directory {0} is not empty (it holds {1:?}): a lock directory is always empty, and the JavaScript tool can never remove this one; look inside, then remove it (rm -r {0}) when no writer is running",
                        path.display(),
                        name
                    ),
                ));
            }
            Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => {
                continue;
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("listing the lock directory {}", path.display()));
            }
        }
        let age = Age::of(&meta);
        if age.is_stale(timing.stale) {
            if steal(path, DirId::of(&meta))? {
                stole = Some(age);
            }
            continue;
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(fail(
                Code::Busy,
                format!(
                    "timed out after {} waiting for the index lock {}: another writer holds it ({age}; it counts as stale after {}); if no writer is running, remove it with `rmdir {}`",
                    crate::clock::human(timing.wait),
                    path.display(),
                    crate::clock::human(timing.stale),
                    path.display()
                ),
            ));
        }
        // Short sleeps with a little per-process spread: holders keep the
        // lock for milliseconds, and waiters should not move in lockstep.
        let spread = (std::process::id() + attempt) % 3;
        let pause = Duration::from_millis((1u64 << attempt.min(3)) + spread as u64);
        std::thread::sleep(pause.min(deadline - now));
    }
    unreachable!("the wait loop only returns")
}

/// A name no other process uses, next to the lock.
fn unique_sibling(path: &Path, what: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    with_suffix(path, &format!(".{what}-{}-{nanos}", std::process::id()))
}

/// Removes the stale lock `judged`, if it is still the one at `path`.
/// Returns true when this process removed it.
fn steal(path: &Path, judged: DirId) -> Result<bool> {
    // Stealers of this tool take turns (flock on the lock's directory, held
    // for microseconds) and look again inside their turn, so none of them
    // ever moves a lock made after another stealer removed the stale one.
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let turn = fs::File::open(parent).with_context(|| format!("opening {}", parent.display()))?;
    turn.lock()
        .with_context(|| format!("locking {} to steal a stale lock", parent.display()))?;
    match fs::symlink_metadata(path) {
        Ok(meta) if DirId::of(&meta) == judged => {}
        Ok(_) => return Ok(false),
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e).with_context(|| format!("inspecting the lock {}", path.display())),
    }
    take_if_same(path, judged)
}

/// Moves the lock at `path` aside and removes it if it is `judged`; puts it
/// back otherwise. Returns true when this process removed it.
fn take_if_same(path: &Path, judged: DirId) -> Result<bool> {
    let aside = unique_sibling(path, "stale");
    // Only one rename of a given directory can succeed, so even against the
    // JavaScript tool (which takes no turn) exactly one stealer moves it.
    match fs::rename(path, &aside) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(false),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("moving the stale lock {} aside", path.display()));
        }
    }
    // A writer that takes the lock meanwhile sweeps away moved-aside locks
    // older than the stale limit (see `store`): gone means it was stale.
    let meta = match fs::symlink_metadata(&aside) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(true),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("inspecting the moved lock {}", aside.display()));
        }
    };
    if DirId::of(&meta) == judged {
        return match fs::remove_dir(&aside) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(e).with_context(|| {
                format!(
                    "removing the stale lock {} (moved to {})",
                    path.display(),
                    aside.display()
                )
            }),
            _ => Ok(true),
        };
    }
    // Between our look and our rename the JavaScript tool removed the stale
    // lock and a writer made a fresh one, which we moved: put it back, never
    // over another lock.
    match rename_noreplace(&aside, path) {
        Ok(()) => Ok(false),
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            eprintln!(
                "warning: a fresh index lock was moved aside while stealing a stale one and another writer has taken {} since; the writer that made it will see it lost the lock",
                path.display()
            );
            let _ = fs::remove_dir(&aside);
            Ok(false)
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "putting the lock {} back at {}",
                aside.display(),
                path.display()
            )
        }),
    }
}

/// rename(2) that fails with EEXIST instead of replacing `to`.
fn rename_noreplace(from: &Path, to: &Path) -> std::io::Result<()> {
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(std::io::Error::other);
    let (from_c, to_c) = (c(from)?, c(to)?);
    // SAFETY: both are valid NUL-terminated paths that outlive the call.
    // The raw syscall, not glibc's wrapper: that one is GLIBC_2.28, and the
    // wheel's binary must link against glibc 2.17 (manylinux_2_17).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            from_c.as_ptr(),
            libc::AT_FDCWD,
            to_c.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Lock {
    /// True while the lock directory is still the one this process made.
    pub fn still_owned(&self) -> bool {
        matches!(fs::symlink_metadata(&self.path), Ok(m) if DirId::of(&m) == self.id)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Releases the lock, reporting a failure to remove it.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.release_inner()
    }

    fn release_inner(&self) -> Result<()> {
        if !self.still_owned() {
            eprintln!(
                "warning: the index lock {} is no longer the one this writer made (it was held past the {} s stale limit and taken over); left it alone",
                self.path.display(),
                DEFAULT_STALE.as_secs()
            );
            return Ok(());
        }
        fs::remove_dir(&self.path)
            .with_context(|| format!("removing the index lock {}", self.path.display()))
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.released {
            let _ = self.release_inner();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::code_of;

    fn fast() -> Timing {
        Timing {
            wait: Duration::from_millis(200),
            stale: Duration::from_secs(15),
        }
    }

    fn set_mtime(path: &Path, ago: Duration) {
        let dir = fs::File::open(path).unwrap();
        dir.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn acquire_release_and_busy() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("i.json.lock");
        let lock = acquire(&path, fast()).unwrap();
        assert!(path.is_dir() && lock.still_owned());
        let err = acquire(&path, fast()).unwrap_err();
        assert_eq!(code_of(&err), Code::Busy);
        assert!(format!("{err:#}").contains(&path.display().to_string()));
        lock.release().unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn stale_lock_is_stolen_and_fresh_one_is_not_removed() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("i.json.lock");
        fs::create_dir(&path).unwrap();
        set_mtime(&path, Duration::from_secs(20));
        let judged = DirId::of(&fs::symlink_metadata(&path).unwrap());
        let lock = acquire(&path, fast()).unwrap();
        assert!(matches!(lock.stole, Some(Age::Past(age)) if age >= Duration::from_secs(19)));
        // A stealer that judged the old lock stale must not remove the new
        // one: it does not move it, and if it had (racing the JavaScript
        // tool) it puts it back unchanged.
        assert!(!steal(&path, judged).unwrap());
        assert!(lock.still_owned());
        assert!(!take_if_same(&path, judged).unwrap());
        assert!(lock.still_owned());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_lock_dated_past_the_limit_in_the_future_is_stale_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("i.json.lock");
        fs::create_dir(&path).unwrap();
        let dir = fs::File::open(&path).unwrap();
        dir.set_modified(SystemTime::now() + Duration::from_secs(3600))
            .unwrap();
        let lock = acquire(&path, fast()).unwrap();
        assert!(
            matches!(lock.stole, Some(Age::Future(skew)) if skew > Duration::from_secs(3590)),
            "{:?}",
            lock.stole
        );
        assert!(lock.stole.unwrap().to_string().contains("in the future"));
        lock.release().unwrap();
        // Within the limit it is a live writer's lock (clocks differ a
        // little): waited on, and the timeout says how far ahead it is.
        fs::create_dir(&path).unwrap();
        let dir = fs::File::open(&path).unwrap();
        dir.set_modified(SystemTime::now() + Duration::from_secs(5))
            .unwrap();
        let err = acquire(&path, fast()).unwrap_err();
        assert_eq!(code_of(&err), Code::Busy);
        assert!(format!("{err:#}").contains("in the future"), "{err:#}");
    }

    #[test]
    fn a_lock_that_is_no_longer_ours_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("i.json.lock");
        let lock = acquire(&path, fast()).unwrap();
        fs::remove_dir(&path).unwrap();
        fs::create_dir(&path).unwrap();
        set_mtime(&path, Duration::from_secs(1));
        assert!(!lock.still_owned());
        lock.release().unwrap();
        assert!(path.is_dir(), "another writer's lock was removed");
    }

    #[test]
    fn odd_things_at_the_lock_path_fail_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("a.lock");
        fs::write(&file, "").unwrap();
        let full = tmp.path().join("b.lock");
        fs::create_dir(&full).unwrap();
        fs::write(full.join("pid"), "1").unwrap();
        let slow = Timing {
            wait: Duration::from_secs(30),
            stale: DEFAULT_STALE,
        };
        let start = Instant::now();
        for path in [&file, &full] {
            let err = acquire(path, slow).unwrap_err();
            assert_eq!(code_of(&err), Code::Corrupt, "{err:#}");
            assert!(format!("{err:#}").contains(&path.display().to_string()));
        }
        assert!(start.elapsed() < Duration::from_secs(5));
    }
}
