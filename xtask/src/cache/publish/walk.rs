//! The walk of the pack root: what a pack selects, in tar order, with each
//! entry's lstat identity (the plan `--dry-run` prints and `pack` packs).
//!
//! Never writes, never runs git, and never follows a symlink: it reads
//! directories and lstats entries, nothing else.

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::cache::format::manifest::{CacheManifest, Glob};
use crate::exit::{Code, fail};
use crate::hex;

/// What kind of entry a path becomes in the tar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    /// A symlink with its target, verbatim.
    Symlink(Vec<u8>),
    /// A second (or later) name of a file already in the tar: its path.
    Hardlink(Vec<u8>),
}

/// One entry of the tar.
#[derive(Clone, Debug)]
pub struct Item {
    /// `/`-separated path relative to the pack root, as bytes.
    pub rel: Vec<u8>,
    pub kind: Kind,
    /// Permission bits (`mode & 0o777`).
    pub mode: u32,
    /// Seconds since the epoch (used only with `keep_mtime`).
    pub mtime: u64,
    /// File size in bytes at planning time (0 for other kinds).
    pub size: u64,
    /// What `lstat` said at planning time. Not part of the tar: it only
    /// tells whether the tree changed since another plan (`Plan::stamp`).
    pub stat: Stat,
}

/// The `lstat` fields that change whenever an entry's bytes may have:
/// a write, a truncate, a rename over it or a `touch` back all move ctime,
/// which user space cannot set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub dev: u64,
    pub ino: u64,
    /// `st_mode`: file type and all permission bits.
    pub mode: u32,
    pub size: u64,
    /// Nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Nanoseconds since the epoch.
    pub ctime_ns: i64,
}

impl Stat {
    fn of(md: &fs::Metadata) -> Stat {
        let ns = |s: i64, n: i64| s.saturating_mul(1_000_000_000).saturating_add(n);
        Stat {
            dev: md.dev(),
            ino: md.ino(),
            mode: md.mode(),
            size: md.size(),
            mtime_ns: ns(md.mtime(), md.mtime_nsec()),
            ctime_ns: ns(md.ctime(), md.ctime_nsec()),
        }
    }
}

/// What to pack: every entry in tar order.
#[derive(Clone, Debug)]
pub struct Plan {
    pub root: PathBuf,
    pub items: Vec<Item>,
    /// Sum of regular file sizes (hardlinks counted once).
    pub file_bytes: u64,
    pub keep_mtime: bool,
}

impl Plan {
    /// Number of regular files (not counting extra hardlink names).
    pub fn regular_files(&self) -> usize {
        self.items.iter().filter(|i| i.kind == Kind::File).count()
    }

    /// The plan's stamp: equal stamps, taken far enough apart from any
    /// change (module `packed` decides how far), mean the same tar.
    pub fn stamp(&self) -> TreeStamp {
        let mut h = Sha256::new();
        let mut buf = Vec::with_capacity(256);
        let put = |buf: &mut Vec<u8>, bytes: &[u8]| {
            buf.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
            buf.extend_from_slice(bytes);
        };
        put(&mut buf, TAR_LAYOUT.as_bytes());
        put(&mut buf, env!("CARGO_PKG_VERSION").as_bytes());
        put(&mut buf, self.root.as_os_str().as_bytes());
        buf.push(self.keep_mtime as u8);
        buf.extend_from_slice(&(self.items.len() as u64).to_le_bytes());
        h.update(&buf);
        let mut newest_ns = i64::MIN;
        for item in &self.items {
            buf.clear();
            put(&mut buf, &item.rel);
            match &item.kind {
                Kind::Dir => buf.push(b'd'),
                Kind::File => buf.push(b'f'),
                Kind::Symlink(t) => {
                    buf.push(b's');
                    put(&mut buf, t);
                }
                Kind::Hardlink(t) => {
                    buf.push(b'h');
                    put(&mut buf, t);
                }
            }
            let s = &item.stat;
            for n in [item.mtime, item.size, s.dev, s.ino, s.size] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
            for n in [item.mode, s.mode] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
            for n in [s.mtime_ns, s.ctime_ns] {
                buf.extend_from_slice(&n.to_le_bytes());
            }
            newest_ns = newest_ns.max(s.mtime_ns).max(s.ctime_ns);
            h.update(&buf);
        }
        TreeStamp {
            digest: hex::encode(&h.finalize()),
            newest_ns,
        }
    }
}

/// Names the bytes `write_tar` makes for a plan. Change it whenever they
/// change (header fields, long names, padding, the fixed mtime): a stamp
/// taken under another layout must never vouch for today's tar.
const TAR_LAYOUT: &str = "warmstart tar 1: gnu, sorted, uid 0, mtime 946684800";

/// What a plan's tar depends on besides file contents, and each entry's
/// lstat identity (module `packed` keeps one per published tar).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeStamp {
    /// sha256 (hex) over the tar layout, the root, `keep_mtime` and, for
    /// each entry in tar order: path, kind, link target, mode, mtime,
    /// size, and its `Stat` (dev, inode, st_mode, size, mtime and ctime in
    /// nanoseconds).
    pub digest: String,
    /// The latest mtime or ctime of any entry, in ns since the epoch
    /// (`i64::MIN` for an empty plan).
    pub newest_ns: i64,
}

/// Which entries the walk packs: an entry is selected when it, or a
/// directory above it, matches an include, and it matches no exclude (the
/// rule of `CacheManifest::selects`). The walk carries "a directory above
/// is included" down the tree, so each path meets the include globs at most
/// once and the excludes once.
pub struct Rules<'a> {
    /// Whether `rel` itself matches an include glob.
    pub include: &'a dyn Fn(&str) -> bool,
    /// Whether `rel` matches an exclude glob (an excluded directory is not read).
    pub exclude: &'a dyn Fn(&str) -> bool,
    /// Whether directory `rel` (not excluded) may hold anything selected;
    /// a directory that cannot is not read.
    pub descend: &'a dyn Fn(&str) -> bool,
}

impl Rules<'static> {
    /// Every entry under the root.
    pub fn all() -> Rules<'static> {
        Rules {
            include: &|_| true,
            exclude: &|_| false,
            descend: &|_| true,
        }
    }
}

/// Walks `m.pack_root` and lists what the manifest selects, in tar order.
pub fn plan(m: &CacheManifest) -> Result<Plan> {
    let rules = Rules {
        include: &|rel| m.include.iter().any(|g| g.matches(rel)),
        exclude: &|rel| m.exclude.iter().any(|g| g.matches(rel)),
        descend: &|rel| m.include.iter().any(|g| could_contain(g, rel)),
    };
    plan_tree(&m.pack_root, m.keep_mtime, &rules).map_err(|e| {
        let code = crate::exit::code_of(&e);
        if code == Code::Failed {
            e.context(format!(
                "packing {} for {}",
                m.pack_root.display(),
                m.file.display()
            ))
        } else {
            e
        }
    })
}

/// A directory the walk has read or will read.
struct Dir {
    rel: Vec<u8>,
    /// It, or a directory above it, matches an include.
    included: bool,
}

/// The walk behind `plan`, selecting with `rules`.
///
/// Costs per entry, which add up over 50k entries in an unoptimised build:
/// one `fstatat` relative to the open directory (no path lookup from the
/// root), the globs as `Rules` says, and one sort of the selected entries.
pub fn plan_tree(root: &Path, keep_mtime: bool, rules: &Rules) -> Result<Plan> {
    check_root(root)?;
    let (mut selected, dirs) = walk(root, rules)?;
    add_parents(&mut selected, &dirs);
    let (items, file_bytes) = link_names(selected);
    Ok(Plan {
        root: root.to_path_buf(),
        items,
        file_bytes,
        keep_mtime,
    })
}

/// The pack root must be a directory: `NotFound` when it is missing
/// (nothing was built), `Config` when it is something else.
fn check_root(root: &Path) -> Result<()> {
    let root_md = match fs::metadata(root) {
        Ok(md) => md,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(fail(
                Code::NotFound,
                format!(
                    "nothing to publish: the pack root {} does not exist (build the artifact first, or fix pack.root)",
                    root.display()
                ),
            ));
        }
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", root.display()))),
    };
    if !root_md.is_dir() {
        return Err(fail(
            Code::Config,
            format!(
                "the pack root {} is not a directory: pack.root names the directory to pack",
                root.display()
            ),
        ));
    }
    Ok(())
}

/// A selected entry, with its (device, inode) when it has several names.
type Selected = (Item, Option<(u64, u64)>);

/// Every directory read, by path: its mode, mtime, stat, and whether it is
/// selected itself.
type Dirs = BTreeMap<Vec<u8>, (u32, u64, Stat, bool)>;

/// Reads the tree under `root` as `rules` allow: the selected entries in
/// walk order, and every directory read. A special file selected is
/// `Unsafe`, naming the first few.
fn walk(root: &Path, rules: &Rules) -> Result<(Vec<Selected>, Dirs)> {
    let mut selected: Vec<Selected> = Vec::new();
    // Every directory to read, with its entry's mode, mtime, stat and
    // whether it is selected itself (for the parents below).
    let mut dirs: Dirs = BTreeMap::new();
    let mut special = Vec::new();
    let mut stack = vec![Dir {
        rel: Vec::new(),
        included: false,
    }];
    while let Some(d) = stack.pop() {
        let dir = join(root, &d.rel);
        let rd = fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?;
        for entry in rd {
            let entry = entry.with_context(|| format!("reading {}", dir.display()))?;
            let rel = child(&d.rel, &entry.file_name());
            // lstat relative to the directory being read (std uses statx
            // on the directory's fd with AT_SYMLINK_NOFOLLOW).
            let md = entry
                .metadata()
                .with_context(|| format!("reading {}", entry.path().display()))?;
            let rel_str = String::from_utf8_lossy(&rel);
            let included = d.included || (rules.include)(&rel_str);
            let excluded = (rules.exclude)(&rel_str);
            let ft = md.file_type();
            let stat = Stat::of(&md);
            let mode = stat.mode & 0o777;
            let mtime = md.mtime().max(0) as u64;
            if ft.is_dir() && !excluded && (rules.descend)(&rel_str) {
                dirs.insert(rel.clone(), (mode, mtime, stat, included));
                stack.push(Dir {
                    rel: rel.clone(),
                    included,
                });
            }
            if !included || excluded {
                continue;
            }
            let Some((kind, size, inode)) = kind_of(&entry, &md)? else {
                special.push(entry.path().display().to_string());
                continue;
            };
            selected.push((
                Item {
                    rel,
                    kind,
                    mode,
                    mtime,
                    size,
                    stat,
                },
                inode,
            ));
        }
    }
    if !special.is_empty() {
        return Err(special_files(special));
    }
    Ok((selected, dirs))
}

/// The path of entry `name` in directory `dir` (both relative to the root).
fn child(dir: &[u8], name: &OsStr) -> Vec<u8> {
    let mut rel = Vec::with_capacity(dir.len() + 1 + name.len());
    rel.extend_from_slice(dir);
    if !rel.is_empty() {
        rel.push(b'/');
    }
    rel.extend_from_slice(name.as_bytes());
    rel
}

/// An entry's kind, size, and (for a file with more than one name) its
/// device and inode.
type Found = (Kind, u64, Option<(u64, u64)>);

/// What a selected entry becomes; `None` for a special file.
fn kind_of(entry: &fs::DirEntry, md: &fs::Metadata) -> Result<Option<Found>> {
    let ft = md.file_type();
    Ok(Some(if ft.is_dir() {
        (Kind::Dir, 0, None)
    } else if ft.is_symlink() {
        let path = entry.path();
        let target = fs::read_link(&path).with_context(|| format!("reading {}", path.display()))?;
        (
            Kind::Symlink(target.as_os_str().as_bytes().to_vec()),
            0,
            None,
        )
    } else if ft.is_file() {
        let inode = (md.nlink() > 1).then(|| (md.dev(), md.ino()));
        (Kind::File, md.len(), inode)
    } else {
        return Ok(None);
    }))
}

/// `Unsafe`: special files were selected; names the first few.
fn special_files(mut special: Vec<String>) -> anyhow::Error {
    let n = special.len();
    special.truncate(5);
    fail(
        Code::Unsafe,
        format!(
            "cannot pack {n} special file(s) (socket, fifo or device): {}; only files, directories and symlinks are packed: add them to pack.exclude",
            special.join(", ")
        ),
    )
}

/// Adds the directories above selected entries that were not selected
/// themselves.
fn add_parents(selected: &mut Vec<Selected>, dirs: &Dirs) {
    // Directories above a selected entry are packed too, so that their
    // modes travel even when only their contents were selected. Entries of
    // one directory are consecutive here, so each directory's ancestors are
    // looked at once; the climb stops at a directory that is selected or
    // already added, whose own ancestors are then already handled.
    let mut parents = BTreeSet::new();
    let mut last_parent: &[u8] = b"";
    for (item, _) in selected.iter() {
        let Some(slash) = item.rel.iter().rposition(|&b| b == b'/') else {
            continue;
        };
        let parent = &item.rel[..slash];
        if parent == last_parent {
            continue;
        }
        last_parent = parent;
        let mut p = parent;
        loop {
            // Only directories no exclude matches are in `dirs`: for them,
            // included is selected.
            let (_, _, _, dir_selected) = dirs[p];
            if dir_selected || !parents.insert(p) {
                break;
            }
            match p.iter().rposition(|&b| b == b'/') {
                Some(i) => p = &p[..i],
                None => break,
            }
        }
    }
    let parents: Vec<Vec<u8>> = parents.into_iter().map(<[u8]>::to_vec).collect();
    for rel in parents {
        let (mode, mtime, stat, _) = dirs[&rel];
        selected.push((
            Item {
                rel,
                kind: Kind::Dir,
                mode,
                mtime,
                size: 0,
                stat,
            },
            None,
        ));
    }
}

/// Sorts the entries into tar order and turns every later name of a
/// multiply-linked file into a hardlink entry; returns them and the bytes
/// of regular files.
fn link_names(mut selected: Vec<Selected>) -> (Vec<Item>, u64) {
    // Paths are unique, so an unstable sort gives the one order there is.
    selected.sort_unstable_by(|a, b| a.0.rel.cmp(&b.0.rel));
    // The first name of a multiply-linked file (in tar order) carries the
    // data; later names become hardlink entries pointing at it.
    let mut first: BTreeMap<(u64, u64), Vec<u8>> = BTreeMap::new();
    let mut file_bytes = 0;
    let mut items = Vec::with_capacity(selected.len());
    for (mut item, inode) in selected {
        if let Some(inode) = inode {
            if let Some(target) = first.get(&inode) {
                item.kind = Kind::Hardlink(target.clone());
                item.size = 0;
            } else {
                first.insert(inode, item.rel.clone());
            }
        }
        if item.kind == Kind::File {
            file_bytes += item.size;
        }
        items.push(item);
    }
    (items, file_bytes)
}

pub(super) fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

/// Whether directory `dir` may hold paths `glob` selects (conservative:
/// true when unsure). `selects` takes a matching directory's whole subtree,
/// so a glob whose literal components run out inside `dir` matches too.
pub fn could_contain(glob: &Glob, dir: &str) -> bool {
    let mut g = glob.text.split('/');
    for d in dir.split('/') {
        match g.next() {
            // The glob matched a directory above: its subtree is selected.
            None => return true,
            Some("**") => return true,
            Some(c) if c.contains(['*', '?', '[']) => continue,
            Some(c) if c == d => continue,
            Some(_) => return false,
        }
    }
    true
}
