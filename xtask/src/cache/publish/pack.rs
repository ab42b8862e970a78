//! Packing: the selected tree as a deterministic tar, cut at
//! content-defined boundaries into chunks that are each one zstd frame.
//!
//! `plan` walks the pack root and decides what goes in (read-only, so
//! `--dry-run` uses it). `write_tar` turns a plan into tar bytes, and `pack`
//! runs the whole pipeline: tar (hashed, and indexed per entry: module
//! `files`) -> FastCDC cuts -> one zstd frame per chunk on all cores
//! (module `chunks`) -> chunk files, each handed to the caller, in order,
//! as soon as it is complete. Nothing holds the archive in memory or writes
//! it whole to disk: the caller decides how many finished chunks may exist
//! at once.
//!
//! Same input tree, same bytes: entries sorted by path (bytes), uid/gid 0,
//! no user or group names, a fixed mtime unless asked to keep them, modes
//! reduced to permission bits, GNU long-name records for names over 99
//! bytes; and the same tar gives the same chunks on any machine with the
//! same zstd (cuts depend on the bytes only, frames are single-threaded
//! with pinned parameters).
//!
//! This module never runs git and never writes outside the chunk directory
//! it is given.

#![warn(clippy::too_many_lines)]
use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::cache::format::files;
use crate::cache::format::manifest::{CacheManifest, Glob};
use crate::cache::publish::chunks::{self, Frame, Params, Sizes};
use crate::exit::{Code, fail};
use crate::hex;

/// The mtime of every entry unless the manifest keeps real ones:
/// 2000-01-01T00:00:00Z. Not 0: tools that zip restored files (Python
/// wheels, for one) refuse timestamps before 1980, in any time zone.
pub const FIXED_MTIME: u64 = 946_684_800;

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
            let name = entry.file_name();
            let mut rel = Vec::with_capacity(d.rel.len() + 1 + name.len());
            rel.extend_from_slice(&d.rel);
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(name.as_bytes());
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
            let (kind, size, inode) = if ft.is_dir() {
                (Kind::Dir, 0, None)
            } else if ft.is_symlink() {
                let path = entry.path();
                let target =
                    fs::read_link(&path).with_context(|| format!("reading {}", path.display()))?;
                (
                    Kind::Symlink(target.as_os_str().as_bytes().to_vec()),
                    0,
                    None,
                )
            } else if ft.is_file() {
                let inode = (md.nlink() > 1).then(|| (md.dev(), md.ino()));
                (Kind::File, md.len(), inode)
            } else {
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
        let n = special.len();
        special.truncate(5);
        return Err(fail(
            Code::Unsafe,
            format!(
                "cannot pack {n} special file(s) (socket, fifo or device): {}; only files, directories and symlinks are packed: add them to pack.exclude",
                special.join(", ")
            ),
        ));
    }
    Ok((selected, dirs))
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

fn join(root: &Path, rel: &[u8]) -> PathBuf {
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

/// The result of writing a tar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TarDigest {
    pub sha256: String,
    pub size: u64,
    pub entries: u64,
}

/// Writes the tar of `plan` to `out` and returns its digest. `progress` is
/// called with file bytes read so far.
pub fn write_tar(plan: &Plan, out: impl Write, progress: &mut dyn FnMut(u64)) -> Result<TarDigest> {
    let (size, hasher) = tar_stream(plan, out, Some(Sha256::new()), None, progress)?;
    Ok(TarDigest {
        sha256: hex::encode(&hasher.expect("a hasher was given").finalize()),
        size,
        entries: plan.items.len() as u64,
    })
}

/// `write_tar`, also returning the per-file index of the tar it wrote.
pub fn write_tar_indexed(
    plan: &Plan,
    out: impl Write,
    progress: &mut dyn FnMut(u64),
) -> Result<(TarDigest, files::Index)> {
    let mut entries = Vec::with_capacity(plan.items.len());
    let (size, hasher) = tar_stream(plan, out, Some(Sha256::new()), Some(&mut entries), progress)?;
    let digest = TarDigest {
        sha256: hex::encode(&hasher.expect("a hasher was given").finalize()),
        size,
        entries: plan.items.len() as u64,
    };
    Ok((digest, files::Index { entries }))
}

/// The zstd level of a key's index file: it is small (about 120 bytes of
/// text per entry) and read on every incremental restore, so it gets the
/// highest level.
pub const INDEX_LEVEL: i32 = 19;

/// The bytes of a key's index file on its branch: `index.render()` as one
/// zstd frame with a checksum and the content size.
pub fn index_file(index: &files::Index) -> Result<Vec<u8>> {
    let mut z = zstd::bulk::Compressor::new(INDEX_LEVEL).context("starting zstd for the index")?;
    z.include_checksum(true)
        .and_then(|()| z.include_contentsize(true))
        .context("configuring zstd for the index")?;
    z.compress(index.render().as_bytes())
        .context("compressing the file index")
}

/// The digest `write_tar` would return, without writing the tar anywhere.
/// This thread reads the files and builds the stream while a second one
/// hashes it, so reading (page cache copies, disk waits) and SHA-256
/// overlap; a few MiB of buffers are in flight at most.
pub fn tar_digest(plan: &Plan, progress: &mut dyn FnMut(u64)) -> Result<TarDigest> {
    const BLOCK: usize = 1 << 20;
    let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(4);
    let (recycle_tx, recycle_rx) = mpsc::channel::<Vec<u8>>();
    let hasher = std::thread::spawn(move || {
        let mut h = Sha256::new();
        for block in rx {
            h.update(&block);
            // The builder may be gone (it failed); then the block is dropped.
            let _ = recycle_tx.send(block);
        }
        h
    });
    let out = BlockSender {
        block: Vec::with_capacity(BLOCK),
        tx,
        recycle: recycle_rx,
    };
    let size = tar_stream(plan, out, None, None, progress).map(|(size, _)| size);
    // The sender was dropped inside tar_stream (after its final flush), so
    // the hasher has seen every block and ends.
    let h = hasher
        .join()
        .map_err(|_| anyhow!("the tar hashing thread panicked"))?;
    Ok(TarDigest {
        sha256: hex::encode(&h.finalize()),
        size: size?,
        entries: plan.items.len() as u64,
    })
}

/// Collects writes into 1 MiB blocks and hands each full block (and the
/// last one, on flush) to the hashing thread.
struct BlockSender {
    block: Vec<u8>,
    tx: mpsc::SyncSender<Vec<u8>>,
    recycle: mpsc::Receiver<Vec<u8>>,
}

impl BlockSender {
    fn send_block(&mut self) -> io::Result<()> {
        let cap = self.block.capacity();
        let next = match self.recycle.try_recv() {
            Ok(mut b) => {
                b.clear();
                b
            }
            Err(_) => Vec::with_capacity(cap),
        };
        let full = std::mem::replace(&mut self.block, next);
        self.tx
            .send(full)
            .map_err(|_| io::Error::other("the tar hashing thread stopped"))
    }
}

impl Write for BlockSender {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let room = self.block.capacity() - self.block.len();
        let n = buf.len().min(room);
        self.block.extend_from_slice(&buf[..n]);
        if self.block.len() == self.block.capacity() {
            self.send_block()?;
        }
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        if !self.block.is_empty() {
            self.send_block()?;
        }
        Ok(())
    }
}

/// Writes the tar of `plan` to `out`, hashing it into `hasher` if given,
/// and recording each entry's place and content digest into `index` if
/// given (`cache::format::files`); returns the size and the hasher. `out` is
/// flushed once, at the end, and dropped before returning.
fn tar_stream(
    plan: &Plan,
    out: impl Write,
    hasher: Option<Sha256>,
    mut index: Option<&mut Vec<files::Entry>>,
    progress: &mut dyn FnMut(u64),
) -> Result<(u64, Option<Sha256>)> {
    let mut w = HashingWriter {
        inner: out,
        hasher,
        written: 0,
    };
    let mut buf = vec![0u8; 256 * 1024];
    let mut done = 0u64;
    for item in &plan.items {
        let mtime = if plan.keep_mtime {
            item.mtime
        } else {
            FIXED_MTIME
        };
        let (ty, size) = match &item.kind {
            Kind::Dir => (tar::EntryType::Directory, 0),
            Kind::File => (tar::EntryType::Regular, item.size),
            Kind::Symlink(_) => (tar::EntryType::Symlink, 0),
            Kind::Hardlink(_) => (tar::EntryType::Link, 0),
        };
        let mut name = item.rel.clone();
        if item.kind == Kind::Dir {
            name.push(b'/');
        }
        // The entry starts at its first block: a long-name record if any.
        let offset = w.written;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_size(size);
        h.set_mode(item.mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(mtime);
        set_long(&mut w, &mut h, Field::Name, &name)?;
        if let Kind::Symlink(t) | Kind::Hardlink(t) = &item.kind {
            set_long(&mut w, &mut h, Field::Link, t)?;
        }
        h.set_cksum();
        w.write_all(h.as_bytes())?;
        let mut content = index.is_some().then(Sha256::new);
        if item.kind == Kind::File {
            let path = join(&plan.root, &item.rel);
            let mut f = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
            let mut left = item.size;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = f
                    .read(&mut buf[..want])
                    .with_context(|| format!("reading {}", path.display()))?;
                if n == 0 {
                    bail!(
                        "{} shrank while it was being packed: publish again when nothing writes to it",
                        path.display()
                    );
                }
                w.write_all(&buf[..n])?;
                if let Some(c) = &mut content {
                    c.update(&buf[..n]);
                }
                left -= n as u64;
                done += n as u64;
                progress(done);
            }
            if f.read(&mut buf[..1])? != 0 {
                bail!(
                    "{} grew while it was being packed: publish again when nothing writes to it",
                    path.display()
                );
            }
            pad(&mut w, item.size)?;
        }
        if let Some(index) = index.as_deref_mut() {
            index.push(index_entry(item, offset, w.written, content));
        }
    }
    // End of archive: two zero blocks, as GNU tar writes.
    w.write_all(&[0u8; 1024])?;
    w.inner.flush()?;
    Ok((w.written, w.hasher))
}

/// The index line of `item`, whose tar bytes are `offset..end`.
fn index_entry(item: &Item, offset: u64, end: u64, content: Option<Sha256>) -> files::Entry {
    let (kind, target) = match &item.kind {
        Kind::Dir => (files::Kind::Dir, None),
        Kind::File => (files::Kind::File, None),
        Kind::Symlink(t) => (files::Kind::Symlink, Some(t.clone())),
        Kind::Hardlink(t) => (files::Kind::Hardlink, Some(t.clone())),
    };
    let is_file = kind == files::Kind::File;
    files::Entry {
        offset,
        end,
        kind,
        mode: item.mode,
        size: if is_file { item.size } else { 0 },
        sha256: content.filter(|_| is_file).map(|c| c.finalize().into()),
        path: item.rel.clone(),
        target,
    }
}

enum Field {
    Name,
    Link,
}

/// Puts a name into the header, preceded by a GNU long-name record (`L` for
/// names, `K` for link targets) when it does not fit in 99 bytes plus NUL.
fn set_long(w: &mut impl Write, h: &mut tar::Header, field: Field, bytes: &[u8]) -> io::Result<()> {
    let old = h.as_old_mut();
    let slot: &mut [u8; 100] = match field {
        Field::Name => &mut old.name,
        Field::Link => &mut old.linkname,
    };
    let n = bytes.len().min(slot.len());
    slot[..n].copy_from_slice(&bytes[..n]);
    if bytes.len() < slot.len() {
        return Ok(());
    }
    let mut long = tar::Header::new_gnu();
    long.as_old_mut().name[..13].copy_from_slice(b"././@LongLink");
    long.set_mode(0o644);
    long.set_uid(0);
    long.set_gid(0);
    long.set_mtime(0);
    long.set_size(bytes.len() as u64 + 1);
    long.set_entry_type(match field {
        Field::Name => tar::EntryType::GNULongName,
        Field::Link => tar::EntryType::GNULongLink,
    });
    long.set_cksum();
    w.write_all(long.as_bytes())?;
    w.write_all(bytes)?;
    w.write_all(&[0])?;
    pad(w, bytes.len() as u64 + 1)
}

fn pad(w: &mut impl Write, size: u64) -> io::Result<()> {
    let rem = (size % 512) as usize;
    if rem != 0 {
        w.write_all(&[0u8; 512][..512 - rem])?;
    }
    Ok(())
}

struct HashingWriter<W> {
    inner: W,
    hasher: Option<Sha256>,
    written: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        if let Some(h) = &mut self.hasher {
            h.update(&buf[..n]);
        }
        self.written += n as u64;
        Ok(n)
    }
    // Never forwards flush: a zstd flush would end a block early and make
    // the output depend on when it was called.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How to cut and compress.
#[derive(Clone, Copy, Debug)]
pub struct PackOptions {
    /// zstd level and window of every frame.
    pub params: Params,
    /// Content-defined chunk sizes, of uncompressed tar.
    pub sizes: Sizes,
    /// No chunk file is larger (`[publish] chunk_bytes`).
    pub limit: u64,
    /// zstd workers (at least 1: the frames are the same for any count).
    pub threads: usize,
}

impl PackOptions {
    /// The options of a manifest: its level and chunk sizes, on every core
    /// (at most `MAX_THREADS`).
    pub fn new(level: i32, sizes: Sizes, limit: u64) -> PackOptions {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(MAX_THREADS);
        PackOptions {
            params: Params {
                level,
                window_log: None,
            },
            sizes,
            limit,
            threads,
        }
    }
}

/// At most this many zstd workers: each holds a compression context (a
/// few MiB at fast levels, up to about 100 MiB at level 19) and two chunks
/// in flight, and past a dozen cores reading the tree is the bottleneck.
pub const MAX_THREADS: usize = 12;

/// A finished chunk file, handed over as soon as it is complete.
#[derive(Clone, Debug)]
pub struct ChunkFile {
    pub index: usize,
    /// Its scratch name (`name_of(index)`).
    pub name: String,
    /// Where it was written (inside the chunk directory).
    pub path: PathBuf,
    pub size: u64,
    pub sha256: String,
    /// The uncompressed slice of the tar it holds.
    pub raw_size: u64,
    pub raw_sha256: String,
    /// Its frame was an earlier one (checked), not compressed now.
    pub reused_frame: bool,
}

/// What `pack` produced.
#[derive(Clone, Debug)]
pub struct Packed {
    pub tar: TarDigest,
    /// Where each entry lies in the tar, and its content digest.
    pub index: files::Index,
    pub chunks: Vec<ChunkFile>,
    /// Total compressed bytes.
    pub compressed: u64,
}

/// Runs the pipeline for `plan`: the tar is cut at content-defined
/// boundaries, each chunk compressed as its own zstd frame on
/// `opts.threads` workers, and the chunk files, named by `name_of(index)`,
/// are written into `dir` and passed to `on_chunk` one by one, in order.
/// The callback may move or delete the file. A chunk whose frame `reuse`
/// has (checked to decode to it) is not compressed again.
#[allow(clippy::too_many_arguments)]
pub fn pack(
    plan: &Plan,
    opts: PackOptions,
    reuse: chunks::Reuse,
    dir: &Path,
    name_of: &dyn Fn(usize) -> String,
    on_chunk: &mut dyn FnMut(ChunkFile) -> Result<()>,
    progress: &mut dyn FnMut(u64),
) -> Result<Packed> {
    let mut chunks = Vec::new();
    let mut compressed = 0u64;
    let mut emit = |f: Frame| -> Result<()> {
        let name = name_of(f.index);
        let path = dir.join(&name);
        fs::write(&path, &f.bytes).with_context(|| format!("writing {}", path.display()))?;
        compressed += f.bytes.len() as u64;
        let c = ChunkFile {
            index: f.index,
            name,
            path,
            size: f.bytes.len() as u64,
            sha256: f.sha256,
            raw_size: f.raw_size,
            raw_sha256: f.raw_sha256,
            reused_frame: f.reused,
        };
        chunks.push(c.clone());
        on_chunk(c)
    };
    let ((tar, index), _) = chunks::frames(
        opts.sizes,
        opts.params,
        opts.limit,
        opts.threads,
        reuse,
        |w| write_tar_indexed(plan, w, progress),
        &mut emit,
    )?;
    Ok(Packed {
        tar,
        index,
        chunks,
        compressed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{PermissionsExt, symlink};

    fn all(root: &Path) -> Plan {
        plan_tree(root, false, &Rules::all()).unwrap()
    }

    fn tree(dir: &Path) {
        fs::create_dir_all(dir.join("b/c")).unwrap();
        fs::create_dir_all(dir.join("empty")).unwrap();
        fs::write(dir.join("a-b"), "x").unwrap();
        fs::write(dir.join("b/c/file"), "hello").unwrap();
        fs::write(dir.join("tool"), "#!/bin/sh\n").unwrap();
        fs::set_permissions(dir.join("tool"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::hard_link(dir.join("b/c/file"), dir.join("z-hard")).unwrap();
        symlink("./b//c/file", dir.join("link")).unwrap();
        let long = "n".repeat(150);
        fs::write(dir.join(&long), "long").unwrap();
        symlink(format!("{long}/../{long}"), dir.join("long-link")).unwrap();
    }

    fn tar_of(plan: &Plan) -> Vec<u8> {
        let mut out = Vec::new();
        write_tar(plan, &mut out, &mut |_| {}).unwrap();
        out
    }

    #[test]
    fn plan_is_sorted_and_links_are_kept() {
        let tmp = tempfile::tempdir().unwrap();
        tree(tmp.path());
        let p = all(tmp.path());
        let names: Vec<String> = p
            .items
            .iter()
            .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
            .collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
        assert_eq!(&names[..4], ["a-b", "b", "b/c", "b/c/file"]);
        let link = p.items.iter().find(|i| i.rel == b"link").unwrap();
        assert_eq!(link.kind, Kind::Symlink(b"./b//c/file".to_vec()));
        let hard = p.items.iter().find(|i| i.rel == b"z-hard").unwrap();
        assert_eq!(hard.kind, Kind::Hardlink(b"b/c/file".to_vec()));
        assert_eq!(p.file_bytes, 1 + 5 + 10 + 4);
    }

    /// Same tree, same bytes: a second tree made later (other mtimes, other
    /// inode numbers, other creation order) packs byte for byte the same.
    #[test]
    fn tar_digest_equals_the_digest_of_the_written_tar() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        // Bigger than one 1 MiB block, not a multiple of it.
        std::fs::write(dir.path().join("big.bin"), vec![7u8; (3 << 20) + 12345]).unwrap();
        let plan = all(dir.path());
        let mut bytes = Vec::new();
        let written = write_tar(&plan, &mut bytes, &mut |_| {}).unwrap();
        let mut seen = 0;
        let digest = tar_digest(&plan, &mut |d| seen = d).unwrap();
        assert_eq!(digest, written);
        assert_eq!(digest.sha256, hex::encode(&Sha256::digest(&bytes)));
        assert_eq!(digest.size, bytes.len() as u64);
        assert_eq!(seen, plan.file_bytes);
        // A file that vanished after planning is an error, not a digest.
        std::fs::remove_file(dir.path().join("big.bin")).unwrap();
        assert!(tar_digest(&plan, &mut |_| {}).is_err());
    }

    #[test]
    fn tar_is_deterministic() {
        let tmp = tempfile::tempdir().unwrap();
        tree(&tmp.path().join("one"));
        std::thread::sleep(std::time::Duration::from_millis(1100));
        tree(&tmp.path().join("two"));
        let a = tar_of(&all(&tmp.path().join("one")));
        let b = tar_of(&all(&tmp.path().join("two")));
        assert_eq!(a, b);
        assert_eq!(a.len() % 512, 0);
    }

    /// GNU tar reads what we write: long names, verbatim link targets,
    /// hardlinks, modes, owner 0 and the fixed mtime.
    #[test]
    fn gnu_tar_lists_what_we_write() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        tree(&src);
        let archive = tmp.path().join("a.tar");
        fs::write(&archive, tar_of(&all(&src))).unwrap();
        let out = std::process::Command::new("tar")
            .args(["--numeric-owner", "--full-time", "-tvf"])
            .arg(&archive)
            .env("TZ", "UTC")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listing = String::from_utf8_lossy(&out.stdout);
        let long = "n".repeat(150);
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {long}")))
            .unwrap_or_else(|| panic!("no line for the long name in {listing}"));
        assert!(line.starts_with("-rw-r--r-- 0/0 "), "{line}");
        assert!(line.contains(" 4 2000-01-01 00:00:00 "), "{line}");
        assert!(
            listing.contains(&format!("long-link -> {long}/../{long}")),
            "{listing}"
        );
        assert!(listing.contains("link -> ./b//c/file"), "{listing}");
        assert!(listing.contains("z-hard link to b/c/file"), "{listing}");
        assert!(listing.contains("-rwxr-xr-x 0/0"), "{listing}");
        assert!(listing.contains(" empty/\n"), "{listing}");
    }

    fn opts(level: i32, avg: u64, threads: usize) -> PackOptions {
        PackOptions {
            params: Params {
                level,
                window_log: None,
            },
            sizes: Sizes::from_avg(avg),
            limit: u64::MAX,
            threads,
        }
    }

    #[test]
    fn chunks_concatenate_to_the_zstd_stream() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        tree(&src);
        // Incompressible content so that small chunks stay small.
        let mut x = 1u64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        fs::write(src.join("noise"), &noise).unwrap();
        let out = tmp.path().join("out");
        fs::create_dir_all(&out).unwrap();
        let plan = all(&src);
        let opts = opts(3, 16 << 10, 2);
        let mut seen = Vec::new();
        let packed = pack(
            &plan,
            opts,
            &chunks::no_reuse,
            &out,
            &|i| format!("k.part{i:03}"),
            &mut |c| {
                seen.push(c.name.clone());
                Ok(())
            },
            &mut |_| {},
        )
        .unwrap();
        assert!(packed.chunks.len() >= 3, "{:?}", packed.chunks);
        assert_eq!(seen.len(), packed.chunks.len());
        let mut stream = Vec::new();
        let mut raw_total = 0;
        for (i, c) in packed.chunks.iter().enumerate() {
            assert_eq!(c.index, i);
            let bytes = fs::read(&c.path).unwrap();
            assert_eq!(bytes.len() as u64, c.size);
            assert!(c.raw_size <= opts.sizes.max);
            assert_eq!(hex::encode(&Sha256::digest(&bytes)), c.sha256);
            // Each chunk is a frame of its own.
            let raw = zstd::decode_all(&bytes[..]).unwrap();
            assert_eq!(raw.len() as u64, c.raw_size);
            assert_eq!(hex::encode(&Sha256::digest(&raw)), c.raw_sha256);
            raw_total += c.raw_size;
            stream.extend(bytes);
        }
        assert_eq!(stream.len() as u64, packed.compressed);
        let tar = zstd::decode_all(&stream[..]).unwrap();
        assert_eq!(tar, tar_of(&plan));
        assert_eq!(hex::encode(&Sha256::digest(&tar)), packed.tar.sha256);
        assert_eq!(tar.len() as u64, packed.tar.size);
        assert_eq!(raw_total, packed.tar.size);
        assert_eq!(packed.index.entries.len(), plan.items.len());

        // One worker or four: the same chunks.
        let out1 = tmp.path().join("out1");
        fs::create_dir_all(&out1).unwrap();
        let one = pack(
            &plan,
            PackOptions { threads: 1, ..opts },
            &chunks::no_reuse,
            &out1,
            &|i| format!("k.part{i:03}"),
            &mut |_| Ok(()),
            &mut |_| {},
        )
        .unwrap();
        let digests = |p: &Packed| {
            p.chunks
                .iter()
                .map(|c| c.sha256.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(digests(&one), digests(&packed));
    }

    #[test]
    fn a_failing_consumer_stops_the_pack_with_its_error() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        tree(&src);
        fs::write(src.join("zeros"), vec![0u8; 100_000]).unwrap();
        let err = pack(
            &all(&src),
            opts(1, 1024, 1),
            &chunks::no_reuse,
            tmp.path(),
            &|i| format!("p{i}"),
            &mut |c| {
                if c.index == 1 {
                    bail!("git refused chunk {}", c.name)
                } else {
                    Ok(())
                }
            },
            &mut |_| {},
        )
        .unwrap_err();
        assert_eq!(format!("{err:#}"), "git refused chunk p1");
    }

    #[test]
    fn special_files_are_refused_by_name() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("ok"), "x").unwrap();
        let fifo = tmp.path().join("pipe");
        let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let err = plan_tree(tmp.path(), false, &Rules::all()).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Unsafe);
        assert!(err.to_string().contains("pipe"), "{err}");
        // Excluded, it is no longer a problem.
        let rules = Rules {
            exclude: &|r| r == "pipe",
            ..Rules::all()
        };
        let p = plan_tree(tmp.path(), false, &rules).unwrap();
        assert_eq!(p.items.len(), 1);
    }

    #[test]
    fn selected_files_bring_their_directories() {
        let tmp = tempfile::tempdir().unwrap();
        tree(tmp.path());
        let rules = Rules {
            include: &|r| r == "b/c/file",
            ..Rules::all()
        };
        let p = plan_tree(tmp.path(), false, &rules).unwrap();
        let names: Vec<&[u8]> = p.items.iter().map(|i| i.rel.as_slice()).collect();
        assert_eq!(names, [&b"b"[..], b"b/c", b"b/c/file"]);
    }

    /// The walk selects exactly what `CacheManifest::selects` says, except
    /// under an excluded directory (not read), plus the directories above a
    /// selected entry, whatever the globs prune.
    #[test]
    fn plan_selects_what_the_manifest_selects() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("src");
        tree(&src);
        for rel in [
            "lib/a/x/f",
            "lib/a/y/f",
            "lib/b/x/f",
            "lib/b/x/g.tmp",
            "bin/t.tmp",
            "bin/t",
        ] {
            fs::create_dir_all(src.join(rel).parent().unwrap()).unwrap();
            fs::write(src.join(rel), rel).unwrap();
        }
        let every: Vec<String> = all(&src)
            .items
            .iter()
            .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
            .collect();
        let repo = crate::repo::Repo {
            root: tmp.path().to_path_buf(),
            git_dir: tmp.path().join(".git"),
        };
        fs::create_dir_all(repo.manifests_dir()).unwrap();
        for globs in [
            "",
            "include = [\"lib/*/x\", \"bin\", \"b/c\"]\nexclude = [\"**/*.tmp\", \"lib/b\"]\n",
            "include = [\"**/f\"]\n",
            "exclude = [\"b\", \"link\"]\n",
        ] {
            let text = format!(
                "[pack]\nroot = \"{}\"\n{globs}[restore]\npath = \"d\"\n",
                src.display()
            );
            fs::write(repo.manifests_dir().join("t.toml"), text).unwrap();
            let m = crate::cache::format::manifest::load(&repo, "t").unwrap();
            let mut want: BTreeSet<String> = BTreeSet::new();
            let under_excluded = |rel: &str| {
                rel.match_indices('/')
                    .any(|(i, _)| m.exclude.iter().any(|g| g.matches(&rel[..i])))
            };
            for rel in every.iter().filter(|r| m.selects(r) && !under_excluded(r)) {
                want.insert(rel.clone());
                for (i, _) in rel.match_indices('/') {
                    want.insert(rel[..i].to_string());
                }
            }
            let got: Vec<String> = plan(&m)
                .unwrap()
                .items
                .iter()
                .map(|i| String::from_utf8_lossy(&i.rel).into_owned())
                .collect();
            assert!(!want.is_empty(), "{globs}");
            assert_eq!(got, want.into_iter().collect::<Vec<_>>(), "{globs}");
        }
    }

    #[test]
    fn globs_prune_directories() {
        let g = Glob::new("lib/rustlib/*/lib").unwrap();
        assert!(could_contain(&g, "lib"));
        assert!(could_contain(&g, "lib/rustlib"));
        assert!(could_contain(&g, "lib/rustlib/x86_64/lib"));
        assert!(could_contain(&g, "lib/rustlib/x86_64/lib/deep"));
        assert!(!could_contain(&g, "share"));
        assert!(!could_contain(&g, "lib/other"));
        assert!(could_contain(&Glob::new("**/*.so").unwrap(), "any/where"));
    }
}
