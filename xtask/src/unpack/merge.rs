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
//! Containment (ARCHITECTURE.md): every create, rename and removal in the
//! prefix is made relative to a handle on a directory found by
//! `beneath::open_beneath` from a handle on the prefix root, so it can never
//! land outside the prefix, whatever symlinks the prefix holds (an earlier
//! archive's, `--allow-external-symlinks`' or the user's). Symlinked
//! directories of the prefix that stay beneath it are written through
//! (`lib64 -> lib`); any other meets an error naming both paths, raised by
//! `preflight` before anything moves. A staged symlink is judged from where
//! it really lands in the prefix, not from where the archive placed it.
//!
//! Durability: the journal and the directories it renames into are fsynced;
//! file contents are not (a `kill -9` cannot lose them, a power cut could).

use anyhow::{Context, Result};
use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::fs::{self, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::beneath::{self, Dir, Links, depth_below, is_dir, is_link, open_beneath};
use super::journal::{Journal, Kind};
use super::swap::remove_tree;
use super::{Stats, fsync_dir, kill_point};
use crate::exit::{Code, fail};
use checks::{Slot, dir_meets_file, file_meets_dir, judge_link, open_parent, split, through_link};

mod checks;

/// Suffix of the temporary copies made when staging is on another filesystem.
const TMP_SUFFIX: &str = ".warmstart-new";

/// Relaxations of a merge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergeOptions {
    /// Install staged symlinks whose target leaves the prefix from where they
    /// land (`--allow-external-symlinks`). They are never written through:
    /// a later directory meeting one is refused like any link that leaves.
    pub allow_external_symlinks: bool,
    /// Staged paths whose symlink may have an absolute target without `..`
    /// (a cache manifest's `pack.absolute_symlinks`); never written through.
    pub absolute_symlinks: Vec<crate::glob::Pattern>,
}

/// `merge_into_with` and the default (strict) options.
pub fn merge_into(staging: &Path, prefix: &Path, journal: &Path) -> Result<Stats> {
    merge_into_with(staging, prefix, journal, MergeOptions::default())
}

/// Merges every file of `staging` into `prefix`, each by rename, with a
/// journal at `journal` so that an interrupted merge is completed by
/// `recover(journal, prefix)`, which this function runs first.
///
/// Holds an exclusive `flock` on the `prefix` directory itself while it
/// works, so two merges into one prefix never overlap (and no lock file is
/// left beside it); callers must not flock the prefix directory themselves.
/// Existing files of `prefix` that `staging` does not contain are untouched;
/// ones it does contain are replaced. Refuses with `exit::Code::Unsafe`,
/// before moving anything: a staged file where the prefix has a directory, a
/// staged directory where the prefix has a file, a staged directory meeting
/// a symlink that does not resolve to a directory beneath the prefix, two
/// staged paths landing on one (through a symlink of the prefix), and a
/// staged symlink that would leave the prefix from where it lands. Symlinks
/// of the prefix to directories beneath it (Debian's `/usr/local/man ->
/// share/man`, `lib64 -> lib`) are followed: they belong to the machine.
/// Removes `staging` at the end.
pub fn merge_into_with(
    staging: &Path,
    prefix: &Path,
    journal: &Path,
    opts: MergeOptions,
) -> Result<Stats> {
    beneath::check_setting()?;
    recover(journal, prefix)?;
    fs::create_dir_all(prefix).with_context(|| format!("creating {}", prefix.display()))?;
    let mut plan = Journal {
        staging: absolute(staging)?,
        prefix: absolute(prefix)?,
        external_symlinks: opts.allow_external_symlinks,
        absolute_symlinks: opts
            .absolute_symlinks
            .iter()
            .map(|p| p.text.clone())
            .collect(),
        entries: Vec::new(),
    };
    let root = lock_root(&plan.prefix)?;
    // A merge into this prefix killed while we waited for the lock.
    if let Some(left) = read_journal(journal)? {
        check_owner(journal, &left, &plan.prefix)?;
        complete(journal, &left, &root)?;
    }
    let src = Dir::open_path(&plan.staging)
        .with_context(|| format!("opening the staging directory {}", plan.staging.display()))?;
    scan(&src, &plan.staging, Path::new(""), &mut plan.entries)?;
    preflight(&root, &src, &plan)?;
    write_journal(journal, &plan)?;
    kill_point("merge:journal-written");
    let stats = apply(&root, &plan)?;
    finish(journal, &plan)?;
    Ok(stats)
}

/// Completes a merge into `prefix` that was interrupted (by a crash or
/// `kill -9`), if the journal at `journal` exists; a no-op otherwise. Locks
/// the prefix like `merge_into`. A journal that cannot be parsed is an error
/// with `exit::Code::Corrupt` naming the file, and is left in place; one
/// that names another prefix, or a staging directory that is not one of
/// that prefix's, is refused (`exit::Code::Unsafe`) and left in place: a
/// replay moves files out of the staging directory and removes it, so a
/// planted journal could otherwise empty and delete any tree.
pub fn recover(journal: &Path, prefix: &Path) -> Result<()> {
    beneath::check_setting()?;
    let Some(plan) = read_journal(journal)? else {
        return Ok(());
    };
    check_owner(journal, &plan, &absolute(prefix)?)?;
    fs::create_dir_all(&plan.prefix)
        .with_context(|| format!("creating {}", plan.prefix.display()))?;
    let root = lock_root(&plan.prefix)?;
    // Another process may have completed it while we waited.
    match read_journal(journal)? {
        Some(plan) => complete(journal, &plan, &root),
        None => Ok(()),
    }
}

/// Refuses a journal that is not the record of a merge into `prefix` (an
/// absolute path) from its own staging directory, `.<name>.staging-<pid>`
/// beside it, as `staging_dir_for` makes them.
fn check_owner(journal: &Path, plan: &Journal, prefix: &Path) -> Result<()> {
    let refuse = |why: String| {
        Err(fail(
            Code::Unsafe,
            format!(
                "the merge journal {} {why}; nothing was replayed: inspect it, delete it, then run the install again (give each prefix its own journal)",
                journal.display()
            ),
        ))
    };
    if plan.prefix != prefix {
        return refuse(format!(
            "belongs to {}, not {}",
            plan.prefix.display(),
            prefix.display()
        ));
    }
    let ours = match (prefix.parent(), prefix.file_name()) {
        (Some(parent), Some(name)) => {
            let mut lead = OsString::from(".");
            lead.push(name);
            lead.push(".staging-");
            plan.staging.parent() == Some(parent)
                && plan.staging.file_name().is_some_and(|n| {
                    n.as_bytes()
                        .strip_prefix(lead.as_bytes())
                        .is_some_and(|pid| !pid.is_empty() && pid.iter().all(u8::is_ascii_digit))
                })
        }
        _ => false,
    };
    if !ours {
        return refuse(format!(
            "names {} as its staging directory, which is not one of {}'s",
            plan.staging.display(),
            prefix.display()
        ));
    }
    Ok(())
}

/// A handle on the prefix root with an exclusive flock on it (released when
/// the handle closes, or by the kernel when the process dies).
fn lock_root(prefix: &Path) -> Result<Dir> {
    let root = Dir::open_path(prefix)
        .with_context(|| format!("opening {} to lock it", prefix.display()))?;
    root.lock()
        .with_context(|| format!("locking {}", prefix.display()))?;
    Ok(root)
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
fn complete(journal: &Path, plan: &Journal, root: &Dir) -> Result<()> {
    if !plan.staging.exists() {
        eprintln!(
            "warning: an interrupted merge into {} cannot be completed because its staging directory {} is gone; run the install again",
            plan.prefix.display(),
            plan.staging.display()
        );
        for (kind, rel) in &plan.entries {
            if *kind == Kind::File {
                let (parent, name) = split(rel)?;
                // A directory that cannot be reached holds no copy of ours.
                if let Ok(dir) = open_beneath(root, parent, Links::Beneath) {
                    dir.unlink_if_exists(&tmp_name(name)).with_context(|| {
                        format!("removing {}", plan.prefix.join(parent).display())
                    })?;
                }
            }
        }
        return finish(journal, plan);
    }
    eprintln!(
        "warmstart: completing an interrupted merge into {} (journal {})",
        plan.prefix.display(),
        journal.display()
    );
    apply(root, plan)?;
    finish(journal, plan)
}

/// Lists `dir` (relative `rel` under the staging root `shown`) in sorted
/// order: directories before their contents.
fn scan(dir: &Dir, shown: &Path, rel: &Path, out: &mut Vec<(Kind, PathBuf)>) -> Result<()> {
    let at = shown.join(rel);
    let mut names = dir
        .names()
        .with_context(|| format!("listing {}", at.display()))?;
    names.sort();
    for name in names {
        let child = rel.join(&name);
        let st = dir
            .lstat_at(&name)
            .with_context(|| format!("reading {}", at.join(&name).display()))?
            .with_context(|| format!("{} vanished while listed", at.join(&name).display()))?;
        if is_dir(&st) {
            // Moving files out needs write access to their staging
            // directory; an archive may have made it read-only.
            let mode = st.st_mode & 0o7777;
            if mode & 0o700 != 0o700 {
                dir.chmod_dir_at(&name, mode | 0o700)
                    .with_context(|| format!("making {} writable", at.join(&name).display()))?;
            }
            let sub = dir
                .open_dir_at(&name)
                .with_context(|| format!("opening {}", at.join(&name).display()))?;
            out.push((Kind::Dir, child.clone()));
            scan(&sub, shown, &child, out)?;
        } else {
            out.push((Kind::File, child));
        }
    }
    Ok(())
}

/// Where a staged directory lands in the prefix.
#[derive(Clone, Debug)]
enum Place {
    /// An existing directory, `depth` real levels below the prefix root.
    Existing { dev: u64, ino: u64, depth: usize },
    /// A directory this merge creates (named by its staged path).
    New { rel: PathBuf, depth: usize },
}

/// A `Place` as a key: two staged paths with one key are one directory.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum PlaceKey {
    Existing(u64, u64),
    New(PathBuf),
}

impl Place {
    fn depth(&self) -> usize {
        match self {
            Place::Existing { depth, .. } | Place::New { depth, .. } => *depth,
        }
    }

    fn key(&self) -> PlaceKey {
        match self {
            Place::Existing { dev, ino, .. } => PlaceKey::Existing(*dev, *ino),
            Place::New { rel, .. } => PlaceKey::New(rel.clone()),
        }
    }

    fn existing(dir: &Dir, depth: usize) -> io::Result<Place> {
        let st = dir.stat()?;
        Ok(Place::Existing {
            dev: st.st_dev,
            ino: st.st_ino,
            depth,
        })
    }
}

/// Refuses, before anything moves, every entry that could not be installed
/// as it is, so the prefix stays intact: it places each staged directory
/// (an existing one, maybe through a symlink of the prefix, or a new one),
/// and judges each staged symlink from the directory it really lands in.
fn preflight(root: &Dir, src: &Dir, plan: &Journal) -> Result<()> {
    let mut places: HashMap<&Path, Place> = HashMap::new();
    places.insert(Path::new(""), Place::existing(root, 0)?);
    let mut landed: HashMap<(PlaceKey, &OsStr), (Kind, &Path)> = HashMap::new();
    let (mut dsts, mut srcs) = (Slot::default(), Slot::default());
    for (kind, rel) in &plan.entries {
        let (parent_rel, name) = split(rel)?;
        let parent = places
            .get(parent_rel)
            .cloned()
            .with_context(|| format!("`{}` is listed before its directory", rel.display()))?;
        if let Some((k0, r0)) = landed.insert((parent.key(), name), (*kind, rel)) {
            if k0 == Kind::Dir && *kind == Kind::Dir {
                // One directory by two staged paths (`lib/x/`, `lib64/x/`):
                // one place, so that what lands under either is compared.
                let same = places[r0].clone();
                places.insert(rel, same);
                continue;
            }
            return Err(same_landing(plan, r0, rel));
        }
        let dst = match parent {
            Place::Existing { .. } => Some(dsts.get(parent_rel, &plan.prefix, || {
                open_parent(root, plan, parent_rel)
            })?),
            Place::New { .. } => None,
        };
        let there = match &dst {
            Some(d) => d
                .lstat_at(name)
                .with_context(|| format!("reading {}", plan.prefix.join(rel).display()))?,
            None => None,
        };
        match kind {
            Kind::Dir => {
                let place = place_dir(root, plan, rel, parent.depth() + 1, there, dst)?;
                places.insert(rel, place);
            }
            Kind::File => {
                if there.as_ref().is_some_and(is_dir) {
                    return Err(dir_meets_file(plan, rel));
                }
                let staged = srcs.get(parent_rel, &plan.staging, || {
                    open_beneath(src, parent_rel, Links::None).with_context(|| {
                        format!("opening {}", plan.staging.join(parent_rel).display())
                    })
                })?;
                judge_link(plan, staged, rel, parent.depth(), dst)?;
            }
        }
    }
    Ok(())
}

/// Where the staged directory `rel` lands: the directory there (maybe
/// through a symlink of the prefix), or a new one at `depth`.
fn place_dir(
    root: &Dir,
    plan: &Journal,
    rel: &Path,
    depth: usize,
    there: Option<libc::stat>,
    dst: Option<&Dir>,
) -> Result<Place> {
    Ok(match (there, dst) {
        (Some(st), _) if is_dir(&st) => Place::Existing {
            dev: st.st_dev,
            ino: st.st_ino,
            depth,
        },
        (Some(st), Some(dst)) if is_link(&st) => {
            let through = through_link(root, plan, rel, dst, split(rel)?.1)?;
            let depth = depth_below(root, &through)
                .with_context(|| format!("placing {}", plan.prefix.join(rel).display()))?;
            Place::existing(&through, depth)?
        }
        (Some(_), _) => return Err(file_meets_dir(plan, rel)),
        (None, _) => Place::New {
            rel: rel.to_path_buf(),
            depth,
        },
    })
}

fn same_landing(plan: &Journal, r0: &Path, rel: &Path) -> anyhow::Error {
    fail(
        Code::Unsafe,
        format!(
            "cannot merge into {}: `{}` and `{}` land on the same path, through a symlink of the prefix; nothing was installed",
            plan.prefix.display(),
            r0.display(),
            rel.display()
        ),
    )
}

/// The journal is private to the merging user (0o600) and written
/// atomically; `fsio` never writes through a link planted at its temporary
/// name.
fn write_journal(journal: &Path, plan: &Journal) -> Result<()> {
    crate::fsio::write_atomic_mode(journal, &plan.to_bytes(), 0o600)
        .with_context(|| format!("writing the merge journal {}", journal.display()))
}

fn sync_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => {
            fsync_dir(p).with_context(|| format!("syncing {}", p.display()))
        }
        _ => fsync_dir(Path::new(".")).context("syncing the current directory"),
    }
}

fn tmp_name(name: &OsStr) -> OsString {
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(TMP_SUFFIX);
    tmp
}

/// Moves what is still in staging into the prefix; idempotent, so a replay
/// after a crash finishes the job. Makes the same checks as `preflight`
/// (which is what refuses, before anything moves), so that even a prefix
/// changed since is never written outside.
fn apply(root: &Dir, plan: &Journal) -> Result<Stats> {
    let src_root = Dir::open_path(&plan.staging)
        .with_context(|| format!("opening the staging directory {}", plan.staging.display()))?;
    let mut run = Apply {
        root,
        plan,
        stats: Stats::default(),
        seen_inodes: HashSet::new(),
    };
    let (mut dsts, mut srcs) = (Slot::default(), Slot::default());
    for (kind, rel) in &plan.entries {
        let (parent_rel, name) = split(rel)?;
        let dst = dsts.get(parent_rel, &plan.prefix, || {
            open_parent(root, plan, parent_rel)
        })?;
        let src = srcs.get(parent_rel, &plan.staging, || {
            open_beneath(&src_root, parent_rel, Links::None)
                .with_context(|| format!("opening {}", plan.staging.join(parent_rel).display()))
        });
        let there = dst
            .lstat_at(name)
            .with_context(|| format!("reading {}", plan.prefix.join(rel).display()))?;
        match kind {
            Kind::Dir => run.dir(rel, dst, there, src.ok())?,
            Kind::File => {
                if run.file(rel, dst, there, src)? {
                    dsts.touched = true;
                    kill_point("merge:moved-one");
                }
            }
        }
    }
    dsts.flush(&plan.prefix)?;
    Ok(run.stats)
}

/// One run of `apply`: where it moves to, and what it has moved.
struct Apply<'a> {
    root: &'a Dir,
    plan: &'a Journal,
    stats: Stats,
    /// `(dev, ino)` of the hardlinked files moved so far: the first of each
    /// counts as a file, the others as hardlinks.
    seen_inodes: HashSet<(u64, u64)>,
}

impl Apply<'_> {
    /// Creates the staged directory `rel` in `dst` unless it is there
    /// (`there`), maybe as a symlink of the prefix, with the staged mode.
    fn dir(
        &mut self,
        rel: &Path,
        dst: &Dir,
        there: Option<libc::stat>,
        src: Option<&Dir>,
    ) -> Result<()> {
        let (plan, name) = (self.plan, split(rel)?.1);
        let shown = plan.prefix.join(rel);
        match there {
            Some(st) if is_dir(&st) => return Ok(()),
            Some(st) if is_link(&st) => {
                through_link(self.root, plan, rel, dst, name)?;
                return Ok(());
            }
            Some(_) => return Err(file_meets_dir(plan, rel)),
            None => {}
        }
        dst.mkdir_at(name, 0o700)
            .with_context(|| format!("creating {}", shown.display()))?;
        let mode = match src.map(|s| s.lstat_at(name)) {
            Some(Ok(Some(st))) => (st.st_mode & 0o7777) | 0o700,
            _ => 0o755,
        };
        dst.open_dir_at(name)
            .and_then(|d| d.chmod(mode))
            .with_context(|| format!("setting the mode of {}", shown.display()))?;
        self.stats.dirs += 1;
        Ok(())
    }

    /// Moves the staged file or symlink `rel` into `dst`, judging a symlink
    /// from where it lands; returns whether it moved (it is not there when
    /// an earlier, interrupted run moved it).
    fn file(
        &mut self,
        rel: &Path,
        dst: &Dir,
        there: Option<libc::stat>,
        src: Result<&Dir>,
    ) -> Result<bool> {
        let plan = self.plan;
        let (parent_rel, name) = split(rel)?;
        let shown = plan.prefix.join(rel);
        let src = match src {
            Ok(s) => s,
            // Its directory was moved (emptied) by an earlier run.
            Err(_) if !plan.staging.join(parent_rel).exists() => return Ok(false),
            Err(e) => return Err(e),
        };
        let Some(st) = src
            .lstat_at(name)
            .with_context(|| format!("reading {}", plan.staging.join(rel).display()))?
        else {
            return Ok(false); // moved by an earlier, interrupted run
        };
        if there.as_ref().is_some_and(is_dir) {
            return Err(dir_meets_file(plan, rel));
        }
        if is_link(&st) {
            let depth = depth_below(self.root, dst)
                .with_context(|| format!("placing {}", shown.display()))?;
            judge_link(plan, src, rel, depth, Some(dst))?;
            self.stats.symlinks += 1;
        } else if st.st_nlink > 1 && !self.seen_inodes.insert((st.st_dev, st.st_ino)) {
            self.stats.hardlinks += 1;
        } else {
            self.stats.files += 1;
            self.stats.bytes += st.st_size as u64;
        }
        move_one(src, dst, name, &st).with_context(|| {
            format!(
                "moving {} to {}",
                plan.staging.join(rel).display(),
                shown.display()
            )
        })?;
        Ok(true)
    }
}

/// One file or symlink `name` from `src` into `dst` by a single rename.
fn move_one(src: &Dir, dst: &Dir, name: &OsStr, st: &libc::stat) -> io::Result<()> {
    #[cfg(test)]
    let renamed = if FORCE_COPY.with(|f| f.get()) {
        Err(io::Error::from_raw_os_error(libc::EXDEV))
    } else {
        src.rename_at(name, dst, name)
    };
    #[cfg(not(test))]
    let renamed = src.rename_at(name, dst, name);
    match renamed {
        Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {}
        r => return r,
    }
    // Another filesystem: copy beside the destination, then rename over it.
    let tmp = tmp_name(name);
    dst.unlink_if_exists(&tmp)?;
    if is_link(st) {
        dst.symlink_at(&src.read_link_at(name)?, &tmp)?;
    } else {
        let mut from = src.open_file_at(name)?;
        let mut to = dst.create_file_at(&tmp)?;
        io::copy(&mut from, &mut to)?;
        let meta = from.metadata()?;
        to.set_permissions(Permissions::from_mode(meta.permissions().mode() & 0o7777))?;
        to.set_modified(meta.modified()?)?;
    }
    kill_point("merge:tmp-written");
    dst.rename_at(&tmp, dst, name)?;
    src.unlink_if_exists(name)
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
    match fs::remove_file(journal) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("removing {}", journal.display()));
        }
        _ => {}
    }
    sync_parent(journal)
}

#[cfg(test)]
mod tests {
    use super::checks::climbs_out;
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
            recover(&journal, &prefix).unwrap();
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
        let stray = prefix.join("bin").join(tmp_name(OsStr::new("tool")));
        assert!(stray.exists(), "the kill point is after the copy");
        recover(&journal, &prefix).unwrap();
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
    fn climbs_out_judges_from_the_real_depth() {
        assert!(!climbs_out(b"libz.so.1", 0));
        assert!(!climbs_out(b"../lib/x", 1));
        assert!(climbs_out(b"../lib/x", 0));
        assert!(!climbs_out(b"../..", 2));
        assert!(climbs_out(b"../../..", 2));
        assert!(climbs_out(b"a/../b", 5), "`..` after a name");
        assert!(climbs_out(b"/usr/bin/env", 9));
    }

    #[test]
    fn a_replayed_journal_keeps_absolute_symlinks_and_refuses_an_unmatched_one() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        std::os::unix::fs::symlink("/usr/bin/env", staging.join("bin/env")).unwrap();
        let opts = MergeOptions {
            absolute_symlinks: vec![crate::glob::Pattern::new("bin/e*").unwrap()],
            ..MergeOptions::default()
        };
        std::os::unix::fs::symlink("/etc", staging.join("bin/other")).unwrap();
        let err = merge_into_with(&staging, &prefix, &journal, opts.clone()).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Unsafe, "{err:#}");
        assert!(
            format!("{err:#}").contains("refusing symlink `bin/other`"),
            "{err:#}"
        );
        fs::remove_file(staging.join("bin/other")).unwrap();
        replayed_keeps_bin_env(&staging, &prefix, &journal, opts);
    }

    /// A merge with `opts` killed once its journal is written, replayed by
    /// `recover`: the absolute `bin/env` link is installed as the first run
    /// judged it.
    fn replayed_keeps_bin_env(staging: &Path, prefix: &Path, journal: &Path, opts: MergeOptions) {
        assert!(run_killed_at("merge:journal-written", || merge_into_with(
            staging, prefix, journal, opts
        )));
        recover(journal, prefix).unwrap();
        assert_eq!(
            fs::read_link(prefix.join("bin/env")).unwrap(),
            Path::new("/usr/bin/env")
        );
        assert_merged(prefix, staging, journal);
    }

    #[test]
    fn a_replayed_journal_keeps_allow_external_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        std::os::unix::fs::symlink("/usr/bin/env", staging.join("bin/env")).unwrap();
        let strict = merge_into(&staging, &prefix, &journal).unwrap_err();
        assert_eq!(crate::exit::code_of(&strict), Code::Unsafe, "{strict:#}");
        assert!(format!("{strict:#}").contains("refusing symlink `bin/env`"));
        let opts = MergeOptions {
            allow_external_symlinks: true,
            ..MergeOptions::default()
        };
        replayed_keeps_bin_env(&staging, &prefix, &journal, opts);
    }

    #[test]
    fn a_merge_through_lib64_killed_midway_is_completed_through_it() {
        for walk in [false, true] {
            crate::unpack::force_walk(walk);
            let tmp = tempfile::tempdir().unwrap();
            let (staging, prefix, journal) = setup(tmp.path());
            fs::create_dir_all(prefix.join("lib")).unwrap();
            std::os::unix::fs::symlink("lib", prefix.join("lib64")).unwrap();
            fs::create_dir_all(staging.join("lib64/sub")).unwrap();
            fs::write(staging.join("lib64/sub/c.so"), "c\n").unwrap();
            fs::write(staging.join("lib64/d.so"), "d\n").unwrap();
            assert!(run_killed_at("merge:moved-one", || merge_into(
                &staging, &prefix, &journal
            )));
            recover(&journal, &prefix).unwrap();
            assert_merged(&prefix, &staging, &journal);
            assert_eq!(
                fs::read_to_string(prefix.join("lib/sub/c.so")).unwrap(),
                "c\n"
            );
            assert_eq!(fs::read_to_string(prefix.join("lib/d.so")).unwrap(), "d\n");
            assert!(
                fs::symlink_metadata(prefix.join("lib64"))
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
        }
    }

    #[test]
    fn a_corrupt_journal_is_an_error_and_kept() {
        let tmp = tempfile::tempdir().unwrap();
        let journal = tmp.path().join("merge.journal");
        fs::write(&journal, "garbage").unwrap();
        let err = recover(&journal, tmp.path()).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Corrupt);
        assert!(format!("{err:#}").contains("merge.journal"));
        assert!(journal.exists());
    }

    /// A journal someone else planted (beside a `conda unpack --into`
    /// prefix, in a shared parent) names a staging directory of theirs or
    /// a tree of the victim's: the replay moved its files into the prefix
    /// and then removed that tree, wherever it was.
    #[test]
    fn a_planted_journal_never_moves_or_removes_a_tree_outside_the_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let (_staging, prefix, journal) = setup(tmp.path());
        let victim = tmp.path().join("victim");
        fs::create_dir_all(victim.join("d")).unwrap();
        fs::write(victim.join("d/keys"), "victim's\n").unwrap();
        let plan = Journal {
            staging: victim.clone(),
            prefix: prefix.clone(),
            external_symlinks: false,
            absolute_symlinks: Vec::new(),
            entries: vec![(Kind::Dir, "d".into()), (Kind::File, "d/keys".into())],
        };
        fs::create_dir_all(journal.parent().unwrap()).unwrap();
        fs::write(&journal, plan.to_bytes()).unwrap();
        let err = recover(&journal, &prefix).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Unsafe, "{err:#}");
        assert!(format!("{err:#}").contains("victim"), "{err:#}");
        assert_eq!(
            fs::read_to_string(victim.join("d/keys")).unwrap(),
            "victim's\n"
        );
        assert!(!prefix.join("d").exists());
        assert!(journal.exists(), "kept for inspection");
    }

    /// A journal naming another prefix than the one being installed (the
    /// manifest's path changed between the crash and the replay, or the
    /// journal was planted) was replayed into that other prefix.
    #[test]
    fn a_journal_for_another_prefix_is_never_replayed_into_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        assert!(run_killed_at("merge:journal-written", || merge_into(
            &staging, &prefix, &journal
        )));
        let elsewhere = tmp.path().join("elsewhere");
        let err = recover(&journal, &elsewhere).unwrap_err();
        assert!(format!("{err:#}").contains("elsewhere"), "{err:#}");
        let err = merge_into(&staging, &elsewhere, &journal).unwrap_err();
        assert!(
            format!("{err:#}").contains("give each prefix its own journal"),
            "{err:#}"
        );
        assert!(!elsewhere.join("bin").exists());
        assert_eq!(
            fs::read_to_string(prefix.join("bin/tool")).unwrap(),
            "old tool\n"
        );
        recover(&journal, &prefix).unwrap();
        assert_merged(&prefix, &staging, &journal);
    }

    /// Whoever can write the journal's directory plants a symlink at the
    /// journal's temporary name: writing the journal followed it and
    /// truncated its target.
    #[test]
    fn a_symlink_at_the_journal_temp_name_is_never_written_through() {
        let tmp = tempfile::tempdir().unwrap();
        let (staging, prefix, journal) = setup(tmp.path());
        let precious = tmp.path().join("precious");
        fs::write(&precious, "precious\n").unwrap();
        fs::create_dir_all(journal.parent().unwrap()).unwrap();
        let mut tmp_name = journal.as_os_str().to_owned();
        tmp_name.push(".tmp");
        std::os::unix::fs::symlink(&precious, &tmp_name).unwrap();
        merge_into(&staging, &prefix, &journal).unwrap();
        assert_eq!(fs::read_to_string(&precious).unwrap(), "precious\n");
        assert_merged(&prefix, &staging, &journal);
    }
}
