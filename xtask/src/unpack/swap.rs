//! Atomic replacement of a directory the cache owns by a staged copy.
//!
//! Names beside the target `T` in its parent directory:
//! `.T.staging-<pid>` (being built by process `pid`) and `.T.old-<pid>`
//! (the previous `T`, moved aside by `pid` during a two-rename swap).
//! `recover_swap` removes leftovers of dead processes and, if `T` is missing
//! while an `.old` copy exists, moves the old copy back, so every crash point
//! ends in either the old or the new complete tree.
//!
//! `.T.links` is the shadow a delta install keeps (`Retire::Shadow`): what
//! is left of the previous `T` once every name of an inode the new `T` does
//! not use was removed. Removing the previous tree whole would unlink a
//! second name of every file the delta linked, moving its ctime and link
//! count after the install recorded them; kept, those stay as recorded. It
//! is never the installed tree: `remove_shadow` drops it before the next
//! install records anything, and nothing else reads it. `recover_swap`
//! leaves it alone (it is not a leftover of a dead process).
//!
//! Every create, rename and removal here is made in one handle on the
//! target's parent directory, by single names (`beneath::Dir`), and
//! removing a tree never follows a symlink in it.

use anyhow::{Context, Result};
use std::collections::HashSet;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::beneath::{Dir, is_dir, remove_tree_at};
use super::kill_point;

fn parent_and_name(target: &Path) -> Result<(PathBuf, OsString)> {
    let name = target
        .file_name()
        .with_context(|| format!("{} has no final name", target.display()))?
        .to_os_string();
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    Ok((parent, name))
}

/// `.<name><suffix>`, a name beside the target.
fn beside(name: &OsStr, suffix: &str) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(suffix);
    s
}

fn open_parent(parent: &Path) -> Result<Dir> {
    Dir::open_path(parent).with_context(|| format!("opening {}", parent.display()))
}

/// Creates an empty staging directory beside `target` (same filesystem, so
/// the final rename is atomic): `<parent>/.<name>.staging-<pid>`. Cleans up
/// leftovers of earlier runs first; creates `target`'s parent if needed.
pub fn staging_dir_for(target: &Path) -> Result<PathBuf> {
    let (parent, name) = parent_and_name(target)?;
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    recover_swap(target)?;
    let dir = open_parent(&parent)?;
    let staging = beside(&name, &format!(".staging-{}", std::process::id()));
    let path = parent.join(&staging);
    remove_tree_at(&dir, &staging)
        .with_context(|| format!("removing the stale {}", path.display()))?;
    dir.mkdir_at(&staging, 0o777)
        .with_context(|| format!("creating {}", path.display()))?;
    Ok(path)
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
    let dir = match Dir::open_path(&parent) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", parent.display())),
    };
    let me = std::process::id();
    let old_prefix = beside(&name, ".old-").to_string_lossy().into_owned();
    let staging_prefix = beside(&name, ".staging-").to_string_lossy().into_owned();
    let mut olds = Vec::new();
    let mut stagings = Vec::new();
    for entry in dir
        .names()
        .with_context(|| format!("listing {}", parent.display()))?
    {
        let file_name = entry.to_string_lossy();
        if let Some(pid) = file_name.strip_prefix(&old_prefix) {
            if let Ok(pid) = pid.parse::<u32>()
                && (pid == me || !alive(pid))
            {
                olds.push(entry);
            }
        } else if let Some(pid) = file_name.strip_prefix(&staging_prefix)
            && let Ok(pid) = pid.parse::<u32>()
            && pid != me
            && !alive(pid)
        {
            stagings.push(entry);
        }
    }
    let target_missing = dir
        .lstat_at(&name)
        .with_context(|| format!("reading {}", target.display()))?
        .is_none();
    if target_missing && let Some(old) = olds.pop() {
        eprintln!(
            "warmstart: an earlier install of {} was interrupted; putting back the previous copy from {}",
            target.display(),
            parent.join(&old).display()
        );
        dir.rename_at(&old, &dir, &name).with_context(|| {
            format!(
                "moving {} back to {}",
                parent.join(&old).display(),
                target.display()
            )
        })?;
        dir.sync()
            .with_context(|| format!("syncing {}", parent.display()))?;
    }
    for leftover in olds.into_iter().chain(stagings) {
        remove_tree_at(&dir, &leftover)
            .with_context(|| format!("removing {}", parent.join(&leftover).display()))?;
    }
    Ok(())
}

/// Removes a directory tree (or a file, or a symlink: never what it points
/// to), making read-only directories writable first; nothing there is fine.
/// Everything below `path`'s parent is reached through directory handles.
pub fn remove_tree(path: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(path)?;
    let dir = match Dir::open_path(&parent) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("opening {}", parent.display())),
    };
    remove_tree_at(&dir, &name).with_context(|| format!("removing {}", path.display()))
}

/// `.<name>.links`, the shadow of target `name`.
fn shadow_name(name: &OsStr) -> OsString {
    beside(name, ".links")
}

/// Where the shadow of `target` lives (see the module doc).
pub fn shadow_of(target: &Path) -> Result<PathBuf> {
    let (parent, name) = parent_and_name(target)?;
    Ok(parent.join(shadow_name(&name)))
}

/// Removes the shadow beside `target`, if there is one: before an install
/// records its stats, so that the links it drops move no recorded ctime.
pub fn remove_shadow(target: &Path) -> Result<()> {
    remove_tree(&shadow_of(target)?)
}

/// What becomes of the previous tree once the new one is in place.
#[derive(Clone, Copy, Debug)]
pub enum Retire<'a> {
    /// Removed whole.
    Remove,
    /// Its names of the inodes (dev, ino) in the set stay, as the shadow;
    /// every other name is removed.
    Shadow(&'a HashSet<(u64, u64)>),
}

/// `swap_dir`, removing the previous tree whole.
pub fn swap_dir(staging: &Path, target: &Path) -> Result<()> {
    swap_dir_then(staging, target, Retire::Remove)
}

/// Atomically replaces directory `target` with `staging`, a directory beside
/// it (from `staging_dir_for`); the previous tree is then retired as
/// `retire` says.
///
/// Uses `renameat2(RENAME_EXCHANGE)` where the filesystem supports it, so
/// `target` always names a complete tree; elsewhere falls back to
/// `target -> .target.old-<pid>`, `staging -> target`, which `recover_swap`
/// (run first by this function and by `staging_dir_for`) completes after a
/// crash. Every rename is made in one handle on the parent directory, by
/// single names.
pub fn swap_dir_then(staging: &Path, target: &Path, retire: Retire<'_>) -> Result<()> {
    let (parent, name) = parent_and_name(target)?;
    let (staging_parent, staging_name) = parent_and_name(staging)?;
    anyhow::ensure!(
        staging_parent == parent,
        "the staging directory {} is not beside {}",
        staging.display(),
        target.display()
    );
    recover_swap(target)?;
    let dir = open_parent(&parent)?;
    let meta = dir
        .lstat_at(&staging_name)
        .with_context(|| format!("reading the staging directory {}", staging.display()))?;
    anyhow::ensure!(
        meta.as_ref().is_some_and(is_dir),
        "the staging path {} is not a directory",
        staging.display()
    );
    match dir
        .lstat_at(&name)
        .with_context(|| format!("reading {}", target.display()))?
    {
        None => {
            move_into_place(&dir, &staging_name, &name, staging, target)?;
            dir.sync()
                .with_context(|| format!("syncing {}", parent.display()))?;
            return Ok(());
        }
        Some(st) if !is_dir(&st) => {
            return Err(anyhow::anyhow!(
                "{} exists and is not a directory: move it away, then run again",
                target.display()
            ));
        }
        Some(_) => {}
    }
    match dir.exchange_at(&staging_name, &name) {
        Ok(()) => {
            // `staging` now holds the previous tree; a crash from here on
            // leaves a complete new `target` and a leftover that
            // `recover_swap` removes.
            dir.sync()
                .with_context(|| format!("syncing {}", parent.display()))?;
            kill_point("swap:exchanged");
            retire_at(&dir, &staging_name, &name, retire)
                .with_context(|| format!("removing {}", staging.display()))
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP)
            ) =>
        {
            swap_by_two_renames(&dir, &staging_name, &name, staging, target, retire)
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
fn move_into_place(
    dir: &Dir,
    staging_name: &OsStr,
    name: &OsStr,
    staging: &Path,
    target: &Path,
) -> Result<()> {
    dir.rename_at(staging_name, dir, name).with_context(|| {
        format!(
            "moving {} to {} (they must be on the same filesystem)",
            staging.display(),
            target.display()
        )
    })
}

/// The fallback where RENAME_EXCHANGE is unsupported (some filesystems).
fn swap_by_two_renames(
    dir: &Dir,
    staging_name: &OsStr,
    name: &OsStr,
    staging: &Path,
    target: &Path,
    retire: Retire<'_>,
) -> Result<()> {
    let old = beside(name, &format!(".old-{}", std::process::id()));
    let old_path = target.with_file_name(&old);
    remove_tree_at(dir, &old).with_context(|| format!("removing {}", old_path.display()))?;
    dir.rename_at(name, dir, &old).with_context(|| {
        format!(
            "moving {} aside to {}",
            target.display(),
            old_path.display()
        )
    })?;
    kill_point("swap:target-moved-aside");
    move_into_place(dir, staging_name, name, staging, target)?;
    dir.sync()
        .with_context(|| format!("syncing the parent of {}", target.display()))?;
    kill_point("swap:staging-moved");
    retire_at(dir, &old, name, retire).with_context(|| format!("removing {}", old_path.display()))
}

/// Retires the previous tree, now at `old` beside target `name`. A kill
/// while it is pruned leaves it under a dead process's name, which
/// `recover_swap` removes whole: the next delta then finds the links it
/// counted gone and writes those files again (never links a changed one).
fn retire_at(dir: &Dir, old: &OsStr, name: &OsStr, retire: Retire<'_>) -> io::Result<()> {
    let Retire::Shadow(keep) = retire else {
        return remove_tree_at(dir, old);
    };
    prune_at(dir, old, keep)?;
    kill_point("swap:pruned");
    let shadow = shadow_name(name);
    remove_tree_at(dir, &shadow)?;
    dir.rename_at(old, dir, &shadow)
}

/// Removes every name below `name` in `dir` but directories and those of
/// inodes in `keep`, never following a symlink (one is removed, not what
/// it points to), making directories writable first.
fn prune_at(dir: &Dir, name: &OsStr, keep: &HashSet<(u64, u64)>) -> io::Result<()> {
    let child = dir.open_dir_at(name)?;
    let st = child.stat()?;
    if st.st_mode & 0o700 != 0o700 {
        child.chmod((st.st_mode & 0o7777) | 0o700)?;
    }
    for n in child.names()? {
        let Some(st) = child.lstat_at(&n)? else {
            continue;
        };
        if is_dir(&st) {
            prune_at(&child, &n, keep)?;
        } else if !keep.contains(&(st.st_dev, st.st_ino)) {
            child.unlink_if_exists(&n)?;
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) fn swap_by_two_renames_for_test(staging: &Path, target: &Path) -> Result<()> {
    let (parent, name) = parent_and_name(target)?;
    let dir = open_parent(&parent)?;
    let staging_name = staging.file_name().context("no name")?;
    swap_by_two_renames(&dir, staging_name, &name, staging, target, Retire::Remove)
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
