//! Journaled merge of a staged tree into a shared prefix (such as `/usr/local`).
//!
//! Each file or symlink reaches the prefix by one rename: straight from the
//! staging directory when it is on the prefix's filesystem, else through a
//! copy to `.<name>.warmstart-new` beside the destination. The plan is written
//! to the journal (fsynced) before anything moves, and `recover` replays it:
//! whatever is still in staging is moved, leftover temporary copies are
//! removed, so a run killed at any point is completed by the next one.
//! Files in the prefix that the package does not contain are never touched.
//!
//! Durability: the journal and the directories it renames into are fsynced;
//! file contents are not (a `kill -9` cannot lose them, a power cut could).

use anyhow::{Context, Result};
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::journal::{Journal, Kind};
use super::swap::remove_tree;
use super::{Stats, fsync_dir, kill_point};
use crate::exit::{Code, fail};

/// Suffix of the temporary copies made when staging is on another filesystem.
const TMP_SUFFIX: &str = ".warmstart-new";

/// Merges every file of `staging` into `prefix`, each by rename, with a
/// journal at `journal` so that an interrupted merge is completed by
/// `recover(journal)`, which this function runs first.
///
/// Holds an exclusive `flock` on the `prefix` directory itself while it
/// works, so two merges into one prefix never overlap (and no lock file is
/// left beside it); callers must not flock the prefix directory themselves.
/// Existing files of `prefix` that `staging` does not contain are untouched;
/// ones it does contain are replaced. Refuses, before moving anything, a
/// staged file where the prefix has a directory and a staged directory where
/// the prefix has a file. Existing symlinks to directories in the prefix
/// (e.g. Debian's `/usr/local/man -> share/man`) are followed: they belong
/// to the machine, not to the archive. Removes `staging` at the end.
pub fn merge_into(staging: &Path, prefix: &Path, journal: &Path) -> Result<Stats> {
    recover(journal)?;
    fs::create_dir_all(prefix).with_context(|| format!("creating {}", prefix.display()))?;
    let mut plan = Journal {
        staging: absolute(staging)?,
        prefix: absolute(prefix)?,
        entries: Vec::new(),
    };
    let _lock = lock_dir(&plan.prefix)?;
    // A merge into this prefix killed while we waited for the lock.
    if let Some(left) = read_journal(journal)? {
        anyhow::ensure!(
            left.prefix == plan.prefix,
            "the merge journal {} belongs to {}, not {}: give each prefix its own journal",
            journal.display(),
            left.prefix.display(),
            plan.prefix.display()
        );
        complete(journal, &left)?;
    }
    scan(&plan.staging, Path::new(""), &mut plan.entries)?;
    preflight(&plan)?;
    write_journal(journal, &plan)?;
    kill_point("merge:journal-written");
    let stats = apply(&plan)?;
    finish(journal, &plan)?;
    Ok(stats)
}

/// Completes a merge that was interrupted (by a crash or `kill -9`), if the
/// journal at `journal` exists; a no-op otherwise. Locks the journal's
/// prefix like `merge_into`. A journal that cannot be parsed is an error
/// with `exit::Code::Corrupt` naming the file, and is left in place.
pub fn recover(journal: &Path) -> Result<()> {
    let Some(plan) = read_journal(journal)? else {
        return Ok(());
    };
    fs::create_dir_all(&plan.prefix)
        .with_context(|| format!("creating {}", plan.prefix.display()))?;
    let _lock = lock_dir(&plan.prefix)?;
    // Another process may have completed it while we waited.
    match read_journal(journal)? {
        Some(plan) => complete(journal, &plan),
        None => Ok(()),
    }
}

/// An exclusive flock on a directory (released when the file is dropped,
/// or by the kernel when the process dies).
fn lock_dir(dir: &Path) -> Result<File> {
    let file = File::open(dir).with_context(|| format!("opening {} to lock it", dir.display()))?;
    file.lock()
        .with_context(|| format!("locking {}", dir.display()))?;
    Ok(file)
}

fn absolute(path: &Path) -> Result<PathBuf> {
    std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
}

fn read_journal(journal: &Path) -> Result<Option<Journal>> {
    let bytes = match fs::read(journal) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("reading the merge journal {}", journal.display()));
        }
    };
    Journal::parse(&bytes).map(Some).map_err(|why| {
        fail(
            Code::Corrupt,
            format!(
                "merge journal {} is unreadable ({why}); inspect it, delete it, then run the install again",
                journal.display()
            ),
        )
    })
}

/// Replays a journal under the prefix lock.
fn complete(journal: &Path, plan: &Journal) -> Result<()> {
    if !plan.staging.exists() {
        eprintln!(
            "warning: an interrupted merge into {} cannot be completed because its staging directory {} is gone; run the install again",
            plan.prefix.display(),
            plan.staging.display()
        );
        for (kind, rel) in &plan.entries {
            if *kind == Kind::File {
                remove_if_exists(&tmp_name(&plan.prefix.join(rel)))?;
            }
        }
        return finish(journal, plan);
    }
    eprintln!(
        "warmstart: completing an interrupted merge into {} (journal {})",
        plan.prefix.display(),
        journal.display()
    );
    apply(plan)?;
    finish(journal, plan)
}

/// Lists `dir` (relative `rel` under the staging root) in sorted order:
/// directories before their contents.
fn scan(root: &Path, rel: &Path, out: &mut Vec<(Kind, PathBuf)>) -> Result<()> {
    let dir = root.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    names.sort();
    for name in names {
        let child = rel.join(&name);
        let meta = fs::symlink_metadata(root.join(&child))
            .with_context(|| format!("reading {}", root.join(&child).display()))?;
        if meta.is_dir() {
            // Moving files out needs write access to their staging
            // directory; an archive may have made it read-only.
            let mode = meta.permissions().mode();
            if mode & 0o300 != 0o300 {
                let path = root.join(&child);
                fs::set_permissions(&path, fs::Permissions::from_mode(mode | 0o700))
                    .with_context(|| format!("making {} writable", path.display()))?;
            }
            out.push((Kind::Dir, child.clone()));
            scan(root, &child, out)?;
        } else {
            out.push((Kind::File, child));
        }
    }
    Ok(())
}

/// Refuses conflicts before anything moves, so the prefix stays intact.
fn preflight(plan: &Journal) -> Result<()> {
    for (kind, rel) in &plan.entries {
        let dst = plan.prefix.join(rel);
        let Ok(meta) = fs::symlink_metadata(&dst) else {
            continue;
        };
        match kind {
            Kind::Dir if !meta.is_dir() && !fs::metadata(&dst).is_ok_and(|m| m.is_dir()) => {
                anyhow::bail!(
                    "cannot merge into {}: {} is a file but the package has a directory there; move it away, then run again",
                    plan.prefix.display(),
                    dst.display()
                );
            }
            Kind::File if meta.is_dir() => {
                anyhow::bail!(
                    "cannot merge into {}: {} is a directory but the package has a file there; move it away, then run again",
                    plan.prefix.display(),
                    dst.display()
                );
            }
            _ => {}
        }
    }
    Ok(())
}

fn write_journal(journal: &Path, plan: &Journal) -> Result<()> {
    if let Some(parent) = journal.parent()
        && !parent.as_os_str().is_empty()
    {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut tmp = journal.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("writing the merge journal {}", tmp.display()))?;
    file.write_all(&plan.to_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing the merge journal {}", tmp.display()))?;
    fs::rename(&tmp, journal)
        .with_context(|| format!("renaming {} to {}", tmp.display(), journal.display()))?;
    sync_parent(journal)
}

fn sync_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            fsync_dir(p).with_context(|| format!("syncing {}", p.display()))
        }
        _ => fsync_dir(Path::new(".")).context("syncing the current directory"),
    }
}

fn tmp_name(dst: &Path) -> PathBuf {
    let name = dst.file_name().unwrap_or_default().to_string_lossy();
    dst.with_file_name(format!(".{name}{TMP_SUFFIX}"))
}

fn remove_if_exists(path: &Path) -> Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Moves what is still in staging into the prefix; idempotent, so a replay
/// after a crash finishes the job.
fn apply(plan: &Journal) -> Result<Stats> {
    let mut stats = Stats::default();
    let mut seen_inodes = HashSet::new();
    let mut touched_dirs: HashSet<PathBuf> = HashSet::new();
    for (kind, rel) in &plan.entries {
        let src = plan.staging.join(rel);
        let dst = plan.prefix.join(rel);
        match kind {
            Kind::Dir => {
                if fs::metadata(&dst).is_ok_and(|m| m.is_dir()) {
                    continue;
                }
                fs::create_dir(&dst).with_context(|| format!("creating {}", dst.display()))?;
                if let Ok(meta) = fs::symlink_metadata(&src) {
                    fs::set_permissions(
                        &dst,
                        fs::Permissions::from_mode(meta.permissions().mode() | 0o700),
                    )
                    .with_context(|| format!("setting the mode of {}", dst.display()))?;
                }
                stats.dirs += 1;
            }
            Kind::File => {
                let meta = match fs::symlink_metadata(&src) {
                    Ok(m) => m,
                    // Moved by an earlier, interrupted run.
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e).with_context(|| format!("reading {}", src.display())),
                };
                if meta.file_type().is_symlink() {
                    stats.symlinks += 1;
                } else if meta.nlink() > 1 && !seen_inodes.insert((meta.dev(), meta.ino())) {
                    stats.hardlinks += 1;
                } else {
                    stats.files += 1;
                    stats.bytes += meta.len();
                }
                move_one(&src, &dst, &meta)?;
                if let Some(parent) = dst.parent() {
                    touched_dirs.insert(parent.to_path_buf());
                }
                kill_point("merge:moved-one");
            }
        }
    }
    for dir in touched_dirs {
        fsync_dir(&dir).with_context(|| format!("syncing {}", dir.display()))?;
    }
    Ok(stats)
}

/// One file or symlink into place by a single rename.
fn move_one(src: &Path, dst: &Path, meta: &fs::Metadata) -> Result<()> {
    #[cfg(test)]
    let renamed = if FORCE_COPY.with(|f| f.get()) {
        Err(io::Error::from_raw_os_error(libc::EXDEV))
    } else {
        fs::rename(src, dst)
    };
    #[cfg(not(test))]
    let renamed = fs::rename(src, dst);
    match renamed {
        Ok(()) => return Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
        Err(e) => {
            return Err(e)
                .with_context(|| format!("moving {} to {}", src.display(), dst.display()));
        }
    }
    // Another filesystem: copy beside the destination, then rename over it.
    let tmp = tmp_name(dst);
    remove_if_exists(&tmp)?;
    if meta.file_type().is_symlink() {
        let target =
            fs::read_link(src).with_context(|| format!("reading the symlink {}", src.display()))?;
        std::os::unix::fs::symlink(&target, &tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
    } else {
        let mut from = File::open(src).with_context(|| format!("opening {}", src.display()))?;
        let mut to =
            super::create_new_file(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        io::copy(&mut from, &mut to)
            .with_context(|| format!("copying {} to {}", src.display(), tmp.display()))?;
        to.set_permissions(meta.permissions())
            .with_context(|| format!("setting the mode of {}", tmp.display()))?;
        if let Ok(mtime) = meta.modified() {
            to.set_modified(mtime)
                .with_context(|| format!("setting the mtime of {}", tmp.display()))?;
        }
    }
    kill_point("merge:tmp-written");
    fs::rename(&tmp, dst)
        .with_context(|| format!("moving {} to {}", tmp.display(), dst.display()))?;
    remove_if_exists(src)
}

#[cfg(test)]
thread_local! {
    /// Makes `move_one` take the cross-filesystem path, as if staging were
    /// on another filesystem than the prefix.
    static FORCE_COPY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Removes the emptied staging tree, then the journal.
fn finish(journal: &Path, plan: &Journal) -> Result<()> {
    remove_tree(&plan.staging)?;
    remove_if_exists(journal)?;
    sync_parent(journal)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::unpack::test_hook::run_killed_at;

    /// A staged package and a prefix holding an unrelated file and an old
    /// version of one of the package's files.
    fn setup(root: &Path) -> (PathBuf, PathBuf, PathBuf) {
        let staging = root.join(".prefix.staging-1");
        let prefix = root.join("prefix");
        fs::create_dir_all(staging.join("bin")).unwrap();
        fs::create_dir_all(staging.join("lib/deep")).unwrap();
        fs::write(staging.join("bin/tool"), "new tool\n").unwrap();
        fs::set_permissions(staging.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(staging.join("lib/deep/a.so"), "a\n").unwrap();
        fs::write(staging.join("lib/b.so.1"), "b\n").unwrap();
        std::os::unix::fs::symlink("b.so.1", staging.join("lib/b.so")).unwrap();
        fs::create_dir_all(prefix.join("bin")).unwrap();
        fs::write(prefix.join("bin/tool"), "old tool\n").unwrap();
        fs::write(prefix.join("bin/unrelated"), "keep me\n").unwrap();
        (staging, prefix, root.join("state/merge.journal"))
    }

    fn assert_merged(prefix: &Path, staging: &Path, journal: &Path) {
        assert_eq!(
            fs::read_to_string(prefix.join("bin/tool")).unwrap(),
            "new tool\n"
        );
        let mode = fs::metadata(prefix.join("bin/tool"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            fs::read_to_string(prefix.join("bin/unrelated")).unwrap(),
            "keep me\n"
        );
        assert_eq!(
            fs::read_to_string(prefix.join("lib/deep/a.so")).unwrap(),
            "a\n"
        );
        assert_eq!(
            fs::read_link(prefix.join("lib/b.so")).unwrap(),
            Path::new("b.so.1")
        );
        assert!(!staging.exists(), "staging left behind");
        assert!(!journal.exists(), "journal left behind");
        // No temporary copies anywhere in the prefix.
        let mut stray = Vec::new();
        let mut stack = vec![prefix.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.to_string_lossy().ends_with(TMP_SUFFIX) {
                    stray.push(p.clone());
                }
                if p.is_dir() && !p.is_symlink() {
                    stack.push(p);
                }
            }
        }
        assert!(stray.is_empty(), "stray files: {stray:?}");
    }

    #[test]
    fn merge_replaces_package_files_and_keeps_others() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        let stats = merge_into(&staging, &prefix, &journal).unwrap();
        assert_eq!((stats.files, stats.symlinks), (3, 1));
        assert_merged(&prefix, &staging, &journal);
    }

    #[test]
    fn killed_after_journal_or_mid_move_is_completed_by_recover() {
        for point in ["merge:journal-written", "merge:moved-one"] {
            let tmp = tempfile::tempdir().unwrap();
            let (staging, prefix, journal) = setup(tmp.path());
            assert!(run_killed_at(point, || merge_into(
                &staging, &prefix, &journal
            )));
            assert!(journal.exists(), "{point}: journal must survive the kill");
            recover(&journal).unwrap();
            assert_merged(&prefix, &staging, &journal);
        }
    }

    #[test]
    fn a_later_merge_recovers_first() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        assert!(run_killed_at("merge:moved-one", || merge_into(
            &staging, &prefix, &journal
        )));
        let other = tmp.path().join(".prefix.staging-2");
        fs::create_dir_all(other.join("share")).unwrap();
        fs::write(other.join("share/doc"), "doc\n").unwrap();
        merge_into(&other, &prefix, &journal).unwrap();
        assert_merged(&prefix, &staging, &journal);
        assert_eq!(
            fs::read_to_string(prefix.join("share/doc")).unwrap(),
            "doc\n"
        );
    }

    #[test]
    fn cross_filesystem_copies_killed_midway_leave_no_stray_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        FORCE_COPY.with(|f| f.set(true));
        assert!(run_killed_at("merge:tmp-written", || merge_into(
            &staging, &prefix, &journal
        )));
        let stray = tmp_name(&prefix.join("bin/tool"));
        assert!(stray.exists(), "the kill point is after the copy");
        recover(&journal).unwrap();
        FORCE_COPY.with(|f| f.set(false));
        assert_merged(&prefix, &staging, &journal);
    }

    #[test]
    fn conflicts_are_refused_before_anything_moves() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        fs::write(prefix.join("lib"), "a file where the package has a dir").unwrap();
        let err = merge_into(&staging, &prefix, &journal).unwrap_err();
        assert!(format!("{err:#}").contains("lib"), "{err:#}");
        assert_eq!(
            fs::read_to_string(prefix.join("bin/tool")).unwrap(),
            "old tool\n"
        );
        assert!(!journal.exists());
    }

    #[test]
    fn a_corrupt_journal_is_an_error_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("merge.journal");
        fs::write(&journal, "garbage").unwrap();
        let err = recover(&journal).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Corrupt);
        assert!(format!("{err:#}").contains("merge.journal"));
        assert!(journal.exists());
    }
}
