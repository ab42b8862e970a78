//! Atomic replacement of a directory the cache owns by a staged copy.
//!
//! Names beside the target `T` in its parent directory:
//! `.T.staging-<pid>` (being built by process `pid`) and `.T.old-<pid>`
//! (the previous `T`, moved aside by `pid` during a two-rename swap).
//! `recover_swap` removes leftovers of dead processes and, if `T` is missing
//! while an `.old` copy exists, moves the old copy back, so every crash point
//! ends in either the old or the new complete tree.

use anyhow::{Context, Result};
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::{fsync_dir, kill_point};

fn parent_and_name(target: &Path) -> Result<(PathBuf, String)> {
    let name = target
        .file_name()
        .with_context(|| format!("{} has no final name", target.display()))?
        .to_string_lossy()
        .into_owned();
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// Creates an empty staging directory beside `target` (same filesystem, so
/// the final rename is atomic): `<parent>/.<name>.staging-<pid>`. Cleans up
/// leftovers of earlier runs first; creates `target`'s parent if needed.
pub fn staging_dir_for(target: &Path) -> Result<PathBuf> {
    let (parent, name) = parent_and_name(target)?;
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    recover_swap(target)?;
    let staging = parent.join(format!(".{name}.staging-{}", std::process::id()));
    match fs::remove_dir_all(&staging) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(e).with_context(|| format!("removing the stale {}", staging.display()));
        }
    }
    fs::create_dir(&staging).with_context(|| format!("creating {}", staging.display()))?;
    Ok(staging)
}

/// Whether process `pid` is alive (another restorer may own its files).
fn alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Cleans up after an interrupted `swap_dir` or restore of `target`:
/// if `target` is missing and a `.old` copy exists, moves it back; removes
/// `.old` and `.staging` leftovers of processes that are no longer running.
/// Leaves this process's own staging directory alone.
pub fn recover_swap(target: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(target)?;
    let read = match fs::read_dir(&parent) {
        Ok(r) => r,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", parent.display())),
    };
    let me = std::process::id();
    let old_prefix = format!(".{name}.old-");
    let staging_prefix = format!(".{name}.staging-");
    let mut olds = Vec::new();
    let mut stagings = Vec::new();
    for entry in read {
        let entry = entry.with_context(|| format!("listing {}", parent.display()))?;
        let file_name = entry.file_name();
        let file_name = file_name.to_string_lossy();
        if let Some(pid) = file_name.strip_prefix(&old_prefix) {
            if let Ok(pid) = pid.parse::<u32>()
                && (pid == me || !alive(pid))
            {
                olds.push(entry.path());
            }
        } else if let Some(pid) = file_name.strip_prefix(&staging_prefix)
            && let Ok(pid) = pid.parse::<u32>()
            && pid != me
            && !alive(pid)
        {
            stagings.push(entry.path());
        }
    }
    let target_missing = matches!(
        fs::symlink_metadata(target),
        Err(e) if e.kind() == io::ErrorKind::NotFound
    );
    if target_missing && let Some(old) = olds.pop() {
        eprintln!(
            "warmstart: an earlier install of {} was interrupted; putting back the previous copy from {}",
            target.display(),
            old.display()
        );
        fs::rename(&old, target)
            .with_context(|| format!("moving {} back to {}", old.display(), target.display()))?;
        fsync_dir(&parent).with_context(|| format!("syncing {}", parent.display()))?;
    }
    for leftover in olds.into_iter().chain(stagings) {
        remove_tree(&leftover)?;
    }
    Ok(())
}

/// Removes a directory tree, making read-only directories writable first.
pub fn remove_tree(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            make_dirs_writable(path)?;
            fs::remove_dir_all(path).with_context(|| format!("removing {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

fn make_dirs_writable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let meta = fs::symlink_metadata(path)?;
    if meta.is_dir() {
        let mode = meta.permissions().mode();
        fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o700))?;
        for entry in fs::read_dir(path)? {
            make_dirs_writable(&entry?.path())?;
        }
    }
    Ok(())
}

/// renameat2(2) with RENAME_EXCHANGE: swaps two paths atomically.
fn exchange(a: &Path, b: &Path) -> io::Result<()> {
    let a = CString::new(a.as_os_str().as_bytes())?;
    let b = CString::new(b.as_os_str().as_bytes())?;
    // SAFETY: both paths are valid NUL-terminated strings; the syscall only
    // reads them. The raw syscall avoids depending on the libc wrapper.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_renameat2,
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Atomically replaces directory `target` with `staging` (same filesystem).
///
/// Uses `renameat2(RENAME_EXCHANGE)` where the filesystem supports it, so
/// `target` always names a complete tree; elsewhere falls back to
/// `target -> .target.old-<pid>`, `staging -> target`, which `recover_swap`
/// (run first by this function and by `staging_dir_for`) completes after a
/// crash. The previous tree is removed afterwards.
pub fn swap_dir(staging: &Path, target: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(target)?;
    recover_swap(target)?;
    let meta = fs::symlink_metadata(staging)
        .with_context(|| format!("reading the staging directory {}", staging.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "the staging path {} is not a directory",
        staging.display()
    );
    match fs::symlink_metadata(target) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            move_into_place(staging, target)?;
            fsync_dir(&parent).with_context(|| format!("syncing {}", parent.display()))?;
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", target.display())),
        Ok(m) if !m.is_dir() => {
            return Err(anyhow::anyhow!(
                "{} exists and is not a directory: move it away, then run again",
                target.display()
            ));
        }
        Ok(_) => {}
    }
    match exchange(staging, target) {
        Ok(()) => {
            // `staging` now holds the previous tree; a crash from here on
            // leaves a complete new `target` and a leftover that
            // `recover_swap` removes.
            fsync_dir(&parent).with_context(|| format!("syncing {}", parent.display()))?;
            kill_point("swap:exchanged");
            remove_tree(staging)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
            ) =>
        {
            swap_by_two_renames(staging, target, &parent, &name)
        }
        Err(e) => Err(e).with_context(|| {
            format!(
                "swapping {} into {} (they must be on the same filesystem)",
                staging.display(),
                target.display()
            )
        }),
    }
}

/// Renames the staging tree to the target's name (nothing is there now).
fn move_into_place(staging: &Path, target: &Path) -> Result<()> {
    fs::rename(staging, target).with_context(|| {
        format!(
            "moving {} to {} (they must be on the same filesystem)",
            staging.display(),
            target.display()
        )
    })
}

/// The fallback where RENAME_EXCHANGE is unsupported (some filesystems).
fn swap_by_two_renames(staging: &Path, target: &Path, parent: &Path, name: &str) -> Result<()> {
    let old = parent.join(format!(".{name}.old-{}", std::process::id()));
    remove_tree(&old)?;
    fs::rename(target, &old)
        .with_context(|| format!("moving {} aside to {}", target.display(), old.display()))?;
    kill_point("swap:target-moved-aside");
    move_into_place(staging, target)?;
    fsync_dir(parent).with_context(|| format!("syncing {}", parent.display()))?;
    kill_point("swap:staging-moved");
    remove_tree(&old)
}

#[cfg(test)]
pub(crate) fn swap_by_two_renames_for_test(staging: &Path, target: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(target)?;
    swap_by_two_renames(staging, target, &parent, &name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unpack::test_hook::run_killed_at;

    fn tree(root: &Path, marker: &str) {
        fs::create_dir_all(root.join("sub")).unwrap();
        fs::write(root.join("sub/marker"), marker).unwrap();
    }

    fn marker(target: &Path) -> String {
        fs::read_to_string(target.join("sub/marker")).unwrap()
    }

    /// Only `target` is left beside `target`: no .old or .staging leftover.
    fn only_target(parent: &Path) {
        let names: Vec<_> = fs::read_dir(parent)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["target".to_string()], "leftovers: {names:?}");
    }

    #[test]
    fn swap_installs_into_missing_and_replaces_existing() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        let s1 = staging_dir_for(&target).unwrap();
        tree(&s1, "one");
        swap_dir(&s1, &target).unwrap();
        assert_eq!(marker(&target), "one");
        let s2 = staging_dir_for(&target).unwrap();
        tree(&s2, "two");
        swap_dir(&s2, &target).unwrap();
        assert_eq!(marker(&target), "two");
        only_target(tmp.path());
    }

    #[test]
    fn swap_refuses_a_target_that_is_a_file() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        fs::write(&target, "x").unwrap();
        let s = staging_dir_for(&target).unwrap();
        let err = swap_dir(&s, &target).unwrap_err();
        assert!(format!("{err:#}").contains("not a directory"));
        assert_eq!(fs::read_to_string(&target).unwrap(), "x");
    }

    #[test]
    fn every_kill_point_ends_old_or_new_and_recovers_clean() {
        // Exchange path, then the two-rename fallback forced directly.
        for (point, two_renames) in [
            ("swap:exchanged", false),
            ("swap:target-moved-aside", true),
            ("swap:staging-moved", true),
        ] {
            let tmp = tempfile::tempdir().unwrap();
            let target = tmp.path().join("target");
            fs::create_dir(&target).unwrap();
            tree(&target, "old");
            let s = staging_dir_for(&target).unwrap();
            tree(&s, "new");
            let killed = run_killed_at(point, || {
                if two_renames {
                    swap_by_two_renames_for_test(&s, &target)
                } else {
                    swap_dir(&s, &target)
                }
            });
            assert!(killed, "{point} was not reached");
            // The killed "process" is this one; pretend it is another by
            // renaming its leftovers to a pid that cannot be alive.
            for e in fs::read_dir(tmp.path()).unwrap() {
                let p = e.unwrap().path();
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if let Some(stem) = name.strip_suffix(&format!("-{}", std::process::id())) {
                    fs::rename(&p, tmp.path().join(format!("{stem}-4194999"))).unwrap();
                }
            }
            recover_swap(&target).unwrap();
            let got = marker(&target);
            match point {
                "swap:target-moved-aside" => assert_eq!(got, "old", "{point}"),
                _ => assert_eq!(got, "new", "{point}"),
            }
            only_target(tmp.path());
        }
    }

    #[test]
    fn a_live_processes_staging_is_left_alone() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("target");
        // pid 1 is always alive.
        let theirs = tmp.path().join(".target.staging-1");
        fs::create_dir(&theirs).unwrap();
        recover_swap(&target).unwrap();
        assert!(theirs.exists());
    }
}
