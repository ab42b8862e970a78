//! The target's lock (one restorer per target) and the merge journal's
//! place, both under the state directory, never beside the target; and
//! which state directory a target's records live in.

use super::*;

/// Where the records of `m`'s install live (stamp, lock, journal, overlay
/// and delta records): a target inside the work tree belongs to this
/// worktree, so this worktree's state directory; a target outside it
/// (`~/.local/fstar`) is one install for every worktree of the clone, so
/// the state directory of the common git dir, or each worktree would
/// restore it again and fetch it again. Records an older build left in
/// this worktree's own directory move there first, stamp and delta record
/// together. The chunk store and what gc keeps stay per worktree.
pub fn records_dir(repo: &Repo, m: &CacheManifest) -> Result<PathBuf> {
    let own = repo.state_dir();
    if m.restore_path.starts_with(&repo.root) {
        return Ok(own);
    }
    let shared = repo.shared_state_dir();
    if shared != own {
        move_records(&own, &shared, &m.name)?;
    }
    Ok(shared)
}

/// `records_dir` without moving anything, for the read-only probes
/// (`is_warm`, `cache status`, `cache verify`): a record still in the old
/// place is read there.
pub fn records_place(repo: &Repo, m: &CacheManifest) -> PathBuf {
    let own = repo.state_dir();
    if m.restore_path.starts_with(&repo.root) || stamp::path(&own, &m.name).exists() {
        own
    } else {
        repo.shared_state_dir()
    }
}

/// Moves cache `name`'s records from `from` to `to` where `to` has no stamp
/// of it yet (a stamp there is newer than anything left behind).
fn move_records(from: &Path, to: &Path, name: &str) -> Result<()> {
    let old_stamp = stamp::path(from, name);
    if !old_stamp.exists() || stamp::path(to, name).exists() {
        return Ok(());
    }
    let rel = |p: PathBuf| p.strip_prefix(from).map(Path::to_path_buf).ok();
    let records = [
        delta::record_path(from, name),
        delta::index_path(from, name),
        overlay::path(from, name),
        journal_path(from, name),
        // The stamp last: until it moves, the old place is the whole record.
        old_stamp,
    ];
    for old in records.into_iter().filter(|p| p.exists()) {
        let Some(rel) = rel(old.clone()) else {
            continue;
        };
        let new = to.join(rel);
        let dir = new.parent().expect("a record path has a parent");
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::rename(&old, &new)
            .with_context(|| format!("moving {} to {}", old.display(), new.display()))?;
    }
    Ok(())
}

/// The lock file of a target: under the state directory (never beside the
/// target, where it would be a stray file), named by a digest of the path.
pub fn lock_path(state_dir: &Path, target: &Path) -> PathBuf {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(target.as_os_str().as_bytes());
    state_dir
        .join("cache")
        .join("locks")
        .join(format!("{}.lock", &hex::encode(&digest)[..16]))
}

/// Takes the exclusive OS lock of `target`, waiting up to `timeout`.
/// Returns the held lock and how long it waited.
pub(super) fn lock_target(
    state_dir: &Path,
    target: &Path,
    timeout: Duration,
) -> Result<(File, Duration)> {
    let path = lock_path(state_dir, target);
    let dir = path.parent().expect("a lock path has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the restore lock {}", path.display()))?;
    let t = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {
                if t.elapsed() >= timeout {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(fail(
                        Code::Busy,
                        format!(
                            "another restore of {} ({}) still holds {} after {}: wait for it, or raise WARMSTART_LOCK_TIMEOUT",
                            target.display(),
                            holder.trim(),
                            path.display(),
                            clock::human(timeout)
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(TryLockError::Error(e)) => {
                return Err(anyhow!(e).context(format!("locking {}", path.display())));
            }
        }
    }
    // Who holds it, for the message of whoever waits too long.
    let _ = file.set_len(0);
    let _ = write!(file, "pid {}", std::process::id());
    Ok((file, t.elapsed()))
}

/// The merge journal of a cache (merge mode only).
pub fn journal_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("journals")
        .join(format!("{name}.journal"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_per_target_path() {
        let s = Path::new("/r/.git/warmstart");
        assert_eq!(lock_path(s, Path::new("/a")), lock_path(s, Path::new("/a")));
        assert_ne!(lock_path(s, Path::new("/a")), lock_path(s, Path::new("/b")));
        assert!(lock_path(s, Path::new("/a")).starts_with("/r/.git/warmstart/cache/locks"));
    }

    #[test]
    fn a_second_locker_times_out_busy() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("t");
        let (_held, _) = lock_target(tmp.path(), &target, Duration::ZERO).unwrap();
        // flock locks belong to the open file description: a second open
        // in the same process conflicts, as another process would.
        let err = lock_target(tmp.path(), &target, Duration::from_millis(60)).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Busy);
        assert!(format!("{err:#}").contains("WARMSTART_LOCK_TIMEOUT"));
    }
}
