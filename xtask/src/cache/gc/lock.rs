//! `<state>/cache.git.use.lock`: readers of chunk files hold its shared
//! side, gc its exclusive side, so a chunk is never removed between a
//! reader's check and its read. It never waits past the time it is given.

use anyhow::{Context, Result, anyhow};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::exit::{Code, fail};

/// The shared side of the use lock, held by a command while it may read a
/// chunk file; gc removes nothing while one is held.
pub struct Reading {
    _file: File,
}

fn use_lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cache.git.use.lock")
}

fn open_use_lock(state_dir: &Path) -> Result<File> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let path = use_lock_path(state_dir);
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Waits at most `wait` for `try_lock`; `Ok(None)` when not had in time.
fn wait_for(
    file: &File,
    wait: Duration,
    try_lock: impl Fn(&File) -> Result<(), std::fs::TryLockError>,
) -> Result<Option<Duration>> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match try_lock(file) {
            Ok(()) => return Ok(Some(start.elapsed())),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                std::thread::sleep(pause.min(wait.saturating_sub(start.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(anyhow!(e)),
        }
    }
}

pub(super) fn busy(state_dir: &Path, wait: Duration, who: &str) -> anyhow::Error {
    fail(
        Code::Busy,
        format!(
            "{} is held by {who} after {}: try again when it is done",
            use_lock_path(state_dir).display(),
            crate::clock::human(wait)
        ),
    )
}

impl Reading {
    /// Waits at most `wait` for a running gc (exit 3 after that).
    pub fn take(state_dir: &Path, wait: Duration) -> Result<Reading> {
        let file = open_use_lock(state_dir)?;
        match wait_for(&file, wait, File::try_lock_shared)? {
            Some(_) => Ok(Reading { _file: file }),
            None => Err(busy(state_dir, wait, "a running `cache gc`")),
        }
    }
}

/// The exclusive side, and how long it took to get.
pub(super) fn exclusive(state_dir: &Path, wait: Duration) -> Result<Option<(File, Duration)>> {
    let file = open_use_lock(state_dir)?;
    Ok(wait_for(&file, wait, File::try_lock)?.map(|waited| (file, waited)))
}
