//! The delta install (issue 18): a replace-mode restore of a new key into a
//! target that holds an older key warmstart installed builds the staging
//! tree from the installed one, so that an unchanged file is not written.
//!
//! What it relies on, and where each piece comes from:
//! - the new key's per-file index (`cache::format::files`, `<key>.files.zst` on the
//!   branch), trusted only once its size and sha256 match the key's entry in
//!   `warmstart.json` and it agrees with the key (entry count, tar size);
//! - the record this module wrote after the previous install was final
//!   (`<state>/cache/installed/<name>.record`): each installed file's stat
//!   (dev, inode, size, mode, mtime, ctime), beside a copy of that key's
//!   index (`<name>.files.zst`), both bound to the stamp's key and tar.
//!
//! A new file entry is hardlinked from the installed tree when an installed
//! file has the same content digest and its stat still equals the record
//! (so the user did not change it: content, mode, a rename, a symlink or a
//! directory in its place, a hardlink made to it, a `touch` with the mtime
//! put back, which moves the ctime); reflinked or copied where a hardlink
//! fails (another file system, too many links, another mode); else written
//! from the tar. Directories and symlinks are made from the index. Only the
//! chunks that hold an entry to write are decoded (with `frames` each chunk
//! is its own zstd frame at a known tar offset; without, the whole stream
//! is decoded and only those entries are written), each still hashed before
//! its first byte is decoded (`verify::stream`). Every entry written from
//! the tar is checked against the index (path, kind, size, mode, mtime,
//! sha256 of its bytes): any disagreement, and any entry a full install
//! would have to judge (`..`, a symlink leaving the tree, a duplicate),
//! stops the delta with a `Fallback`, and the caller installs in full.
//!
//! The index records no mtimes: a delta is tried only when the manifest
//! keeps the fixed mtime (`pack::FIXED_MTIME`), and every decoded header
//! must carry it. Every create goes through directory handles
//! (`unpack::Dir`), never following a symlink; the installed tree is only
//! read (`O_PATH` handles, then a link to that very inode). The staging
//! directory is swapped in by the caller, as for a full install.
//!
//! Left open: a write into an installed file in the moment between its
//! check and its link reaches the new tree (the same inode).
#![warn(clippy::too_many_lines)]

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cache::fetch::prefetch;
use crate::cache::format::KeyEntry;
use crate::cache::format::files::{Entry, Index, Kind};
use crate::cache::publish::pack::FIXED_MTIME;
use crate::cache::restore::branch::{Branch, Content, KeyPlan};
use crate::cache::restore::stamp::{self, Loaded};
use crate::cache::restore::{self, verify};
use crate::git::CacheGit;
use crate::hex;
use crate::unpack::{self, Dir, Links};

/// Why a delta install gave way to a full one: one line, no exit code (the
/// full install that follows decides).
#[derive(Debug)]
pub struct Fallback(pub String);

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fallback {}

fn fallback(why: impl std::fmt::Display) -> anyhow::Error {
    anyhow!(Fallback(why.to_string()))
}

/// The reason, when `e` is (or wraps) a `Fallback`.
pub fn fallback_reason(e: &anyhow::Error) -> Option<String> {
    e.chain()
        .find_map(|x| x.downcast_ref::<Fallback>())
        .map(|f| f.0.clone())
}

/// One installed file's stat, as recorded once the install was final (a
/// link made into it, and the removal of the tree before, move its ctime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// `st_mode`, file-type bits included.
    pub mode: u32,
    /// Links to the inode: a hardlink someone made to it (from outside the
    /// tree too) changes it, whatever the clock.
    pub nlink: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStat {
    pub fn of(st: &libc::stat) -> FileStat {
        FileStat {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mode: st.st_mode,
            nlink: st.st_nlink,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }

    fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

/// The first line of every record this build writes and reads.
pub const RECORD_MAGIC: &str = "warmstart-installed 1";

/// `<state>/cache/installed/<name>.record`: what an install left, file by
/// file (one stat per `File` entry of the index, in index order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    pub tar_sha256: String,
    /// sha256 of the index file kept beside the record.
    pub index_sha256: String,
    /// The clock (ns since the epoch) before the stats were read: a file whose
    /// ctime is within `RACY_NS` of it could be changed again within the
    /// same tick of the file system's coarse clock, unseen by its ctime, so
    /// its bytes are hashed before it is linked (git's "racily clean").
    pub clock_ns: i64,
    /// Whether every recorded file was checked against the index's digest
    /// on this machine: a delta checks what it writes, hashes or inherits
    /// what it links, so its record is; a full install never compares the
    /// tar with the index (a pusher's index may lie about its own tar), so
    /// the next delta hashes each file of its record before linking it.
    pub verified: bool,
    pub stats: Vec<FileStat>,
}

/// More than a coarse clock tick (at most 10 ms, at HZ=100).
pub const RACY_NS: i64 = 20_000_000;

impl Record {
    pub fn render(&self) -> String {
        let mut s = format!(
            "{RECORD_MAGIC}\nkey {}\ntar {}\nindex {}\nclock {}\nverified {}\nfiles {}\n",
            self.key,
            self.tar_sha256,
            self.index_sha256,
            self.clock_ns,
            if self.verified { "yes" } else { "no" },
            self.stats.len()
        );
        for st in &self.stats {
            s.push_str(&format!(
                "{} {} {} {:o} {} {} {}\n",
                st.dev, st.ino, st.size, st.mode, st.nlink, st.mtime_ns, st.ctime_ns
            ));
        }
        s
    }

    pub fn parse(text: &str) -> Result<Record> {
        let mut lines = text.split_terminator('\n');
        anyhow::ensure!(lines.next() == Some(RECORD_MAGIC), "not a {RECORD_MAGIC:?}");
        let mut field = |name: &str| -> Result<String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no {name} line"))
        };
        let key = field("key")?;
        let tar_sha256 = field("tar")?;
        let index_sha256 = field("index")?;
        let clock_ns: i64 = field("clock")?.parse().context("clock")?;
        let verified = match field("verified")?.as_str() {
            "yes" => true,
            "no" => false,
            other => anyhow::bail!("verified is {other:?}, not yes or no"),
        };
        let count: usize = field("files")?.parse().context("files")?;
        let stats = lines.map(parse_stat).collect::<Result<Vec<_>>>()?;
        anyhow::ensure!(
            stats.len() == count,
            "{} stats for {count} files",
            stats.len()
        );
        Ok(Record {
            key,
            tar_sha256,
            index_sha256,
            clock_ns,
            verified,
            stats,
        })
    }
}

fn parse_stat(line: &str) -> Result<FileStat> {
    let f: Vec<&str> = line.split(' ').collect();
    anyhow::ensure!(f.len() == 7, "a stat line has 7 fields: {line:?}");
    let n = |i: usize| f[i].parse::<u64>().with_context(|| format!("{line:?}"));
    let t = |i: usize| f[i].parse::<i64>().with_context(|| format!("{line:?}"));
    Ok(FileStat {
        dev: n(0)?,
        ino: n(1)?,
        size: n(2)?,
        mode: u32::from_str_radix(f[3], 8).with_context(|| format!("{line:?}"))?,
        nlink: n(4)?,
        mtime_ns: t(5)?,
        ctime_ns: t(6)?,
    })
}

/// Where the records live.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cache").join("installed")
}

fn record_path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.record"))
}

fn index_path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.files.zst"))
}

/// Removes the record of cache `name` (and what a killed `remember` left):
/// called before the target is replaced, so no record outlives its tree.
pub fn forget(state_dir: &Path, name: &str) -> Result<()> {
    let d = dir(state_dir);
    let entries = match std::fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", d.display())),
    };
    let (record, index) = (format!("{name}.record"), format!("{name}.files.zst"));
    for e in entries {
        let e = e.with_context(|| format!("reading {}", d.display()))?;
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = [&record, &index]
            .iter()
            .any(|f| n == **f || n.starts_with(&format!("{f}.tmp-")));
        if ours {
            match std::fs::remove_file(e.path()) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(err).with_context(|| format!("removing {}", e.path().display()));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path.parent().expect("a record path has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut tmp = path.as_os_str().to_os_string();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming {} into place", tmp.display()))
}

/// After an install is final (swapped in, the tree before removed):
/// records each file's stat, with the key's index, for the next delta.
/// `verified`: the install was a delta (see `Record::verified`).
pub fn remember(
    state_dir: &Path,
    name: &str,
    target: &Path,
    key: &str,
    tar_sha256: &str,
    new: &NewIndex,
    verified: bool,
) -> Result<()> {
    // Before the first stat: a file changed after its stat within the same
    // coarse tick as its ctime has a ctime no earlier than this less a
    // tick, however long the walk over the other files takes.
    let clock_ns = now_ns();
    let stats = stat_files(target, &new.index)?;
    let record = Record {
        key: key.to_string(),
        tar_sha256: tar_sha256.to_string(),
        index_sha256: hex::encode(&Sha256::digest(&new.bytes)),
        clock_ns,
        verified,
        stats,
    };
    // The index first: the record names it by digest, so a kill between
    // the two leaves a record that does not match, never a wrong one.
    write_atomic(&index_path(state_dir, name), &new.bytes)?;
    write_atomic(&record_path(state_dir, name), record.render().as_bytes())
}

/// The real-time clock in ns (the one file times are taken from; their
/// coarse ticks are never ahead of it).
fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `remember`, after the swap removed the tree before (links and that
/// removal moved ctimes). A failure only costs the next restore its delta:
/// a warning, never an error (the install itself is complete).
pub fn remember_or_warn(
    state_dir: &Path,
    name: &str,
    target: &Path,
    key: &str,
    tar_sha256: &str,
    new: &NewIndex,
    verified: bool,
) {
    if let Err(e) = remember(state_dir, name, target, key, tar_sha256, new, verified) {
        eprintln!("warning: {e:#}; the next restore of {name} installs in full");
    }
    unpack::kill_point("delta:recorded");
}

/// The stat of each `File` entry of `index` in `target`, read through
/// directory handles that never follow a symlink.
fn stat_files(target: &Path, index: &Index) -> Result<Vec<FileStat>> {
    let mut tree = Tree::open(target)?;
    let mut out = Vec::new();
    for e in index.entries.iter().filter(|e| e.kind == Kind::File) {
        let rel = entry_rel(e)?;
        let shown = || target.join(&rel).display().to_string();
        let (dir, name) = tree
            .parent(&rel)
            .with_context(|| format!("reading {}", shown()))?;
        let st = dir
            .lstat_at(name)
            .with_context(|| format!("reading {}", shown()))?
            .ok_or_else(|| anyhow!("{} is missing after the install", shown()))?;
        out.push(FileStat::of(&st));
    }
    Ok(out)
}

/// A key's index, checked against its entry.
#[derive(Clone, Debug)]
pub struct NewIndex {
    /// The file as on the branch (zstd of the text), kept for the record.
    pub bytes: Vec<u8>,
    pub index: Index,
}

/// The most index text accepted per entry: a long path escaped (`%XX`)
/// twice over (a hardlink's target) and the numbers.
const INDEX_BYTES_PER_ENTRY: u64 = 2 * 3 * 4096 + 256;

/// Decompresses and parses an index of a key with `files` entries.
fn decode_index(bytes: &[u8], files: u64) -> Result<Index, String> {
    let cap = files
        .saturating_add(1)
        .saturating_mul(INDEX_BYTES_PER_ENTRY);
    let mut text = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .and_then(|d| d.take(cap + 1).read_to_end(&mut text))
        .map_err(|e| format!("it does not decompress ({e})"))?;
    if text.len() as u64 > cap {
        return Err(format!("it decompresses to more than {cap} bytes"));
    }
    let text = String::from_utf8(text).map_err(|_| "it is not UTF-8 text".to_string())?;
    Index::parse(&text).map_err(|e| format!("{e:#}"))
}

/// Checks a fetched index against its key: its size and sha256 as
/// `warmstart.json` gives them, then that it agrees with the key.
pub fn check_index(bytes: Vec<u8>, entry: &KeyEntry) -> Result<NewIndex, String> {
    let Some(i) = &entry.index else {
        return Err("the key has no file index".into());
    };
    if bytes.len() as u64 != i.size {
        return Err(format!(
            "{} is {} bytes but warmstart.json says {}",
            i.file,
            bytes.len(),
            i.size
        ));
    }
    let got = hex::encode(&Sha256::digest(&bytes));
    if !got.eq_ignore_ascii_case(&i.sha256) {
        return Err(format!(
            "{} has sha256 {got} but warmstart.json says {}",
            i.file, i.sha256
        ));
    }
    let index = decode_index(&bytes, entry.files).map_err(|e| format!("{}: {e}", i.file))?;
    agree(&index, entry).map_err(|e| format!("{}: {e}", i.file))?;
    Ok(NewIndex { bytes, index })
}

/// The index covers the key's tar: one line per entry, from offset 0 to
/// the end-of-archive blocks.
fn agree(index: &Index, entry: &KeyEntry) -> Result<(), String> {
    if index.entries.len() as u64 != entry.files {
        return Err(format!(
            "it lists {} entries but the key has {}",
            index.entries.len(),
            entry.files
        ));
    }
    let (Some(first), Some(last)) = (index.entries.first(), index.entries.last()) else {
        return Ok(());
    };
    if first.offset != 0 || last.end.saturating_add(1024) > entry.tar_size {
        return Err(format!(
            "its entries span {}..{} but the tar is {} bytes",
            first.offset, last.end, entry.tar_size
        ));
    }
    Ok(())
}

/// What the installed tree is, by the record and its index.
#[derive(Clone, Debug)]
pub struct Installed {
    pub key: String,
    pub index: Index,
    /// One per index entry: the recorded stat of a `File`, else `None`.
    pub stats: Vec<Option<FileStat>>,
    /// Files whose recorded ctime is after this are hashed before use.
    pub racy_after_ns: i64,
}

/// The record of cache `name`, if it describes the install `stamp` names
/// (`key`, `tar_sha256`, `files`). `Ok(None)`: there is none (an older
/// warmstart installed it, or its key had no index). `Err`: it is there but
/// cannot be used (why, in words): our own state, so never an error.
pub fn installed(
    state_dir: &Path,
    name: &str,
    key: &str,
    tar_sha256: &str,
    files: u64,
) -> Result<Option<Installed>, String> {
    let path = record_path(state_dir, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let record = Record::parse(&text).map_err(|e| format!("{}: {e:#}", path.display()))?;
    if record.key != key || !record.tar_sha256.eq_ignore_ascii_case(tar_sha256) {
        return Err(format!(
            "{} describes key {}, not the installed {key}",
            path.display(),
            record.key
        ));
    }
    let ipath = index_path(state_dir, name);
    let bytes = std::fs::read(&ipath).map_err(|e| format!("{}: {e}", ipath.display()))?;
    if hex::encode(&Sha256::digest(&bytes)) != record.index_sha256 {
        return Err(format!(
            "{} is not the index its record names",
            ipath.display()
        ));
    }
    let index = decode_index(&bytes, files).map_err(|e| format!("{}: {e}", ipath.display()))?;
    // Unverified: every file counts as racy, so it is hashed before use.
    let clock_ns = if record.verified {
        record.clock_ns
    } else {
        i64::MIN.saturating_add(RACY_NS)
    };
    let mut stats = record.stats.into_iter();
    let aligned: Vec<Option<FileStat>> = index
        .entries
        .iter()
        .map(|e| {
            if e.kind == Kind::File {
                stats.next()
            } else {
                None
            }
        })
        .collect();
    let files_in_index = index
        .entries
        .iter()
        .filter(|e| e.kind == Kind::File)
        .count();
    if stats.next().is_some() || aligned.iter().flatten().count() != files_in_index {
        return Err(format!("{} does not match its index", path.display()));
    }
    Ok(Some(Installed {
        key: key.to_string(),
        index,
        stats: aligned,
        racy_after_ns: clock_ns.saturating_sub(RACY_NS),
    }))
}

/// An entry's path as a checked relative path (`Fallback` for anything a
/// full install would refuse, so that it is the one to refuse it).
fn entry_rel(e: &Entry) -> Result<PathBuf> {
    let rel = unpack::safe_relative(&e.path)
        .map_err(|why| fallback(format!("entry {}: {why}", shown(&e.path))))?;
    if rel.as_os_str().is_empty() && e.kind != Kind::Dir {
        return Err(fallback(format!("entry {} names the root", shown(&e.path))));
    }
    Ok(rel)
}

fn shown(path: &[u8]) -> String {
    format!("`{}`", String::from_utf8_lossy(path))
}

/// A tree reached through handles: its root, and the last parent opened
/// (entries come in path order, so siblings share it).
struct Tree {
    root: Dir,
    last: Option<(PathBuf, Dir)>,
}

impl Tree {
    fn open(path: &Path) -> Result<Tree> {
        let root = Dir::open_path(path).with_context(|| format!("opening {}", path.display()))?;
        Ok(Tree { root, last: None })
    }

    /// The directory `parent` (relative), never through a symlink.
    fn dir(&mut self, parent: &Path) -> io::Result<&Dir> {
        if parent.as_os_str().is_empty() {
            return Ok(&self.root);
        }
        if !matches!(&self.last, Some((p, _)) if p == parent) {
            let d = unpack::open_beneath(&self.root, parent, Links::None)?;
            self.last = Some((parent.to_path_buf(), d));
        }
        Ok(&self.last.as_ref().expect("just set").1)
    }

    /// The parent directory of `rel` and its last name.
    fn parent<'a>(&mut self, rel: &'a Path) -> io::Result<(&Dir, &'a OsStr)> {
        let name = rel.file_name().ok_or_else(|| io::Error::other("no name"))?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok((self.dir(parent)?, name))
    }

    /// `parent`, creating missing directories on the way (as the extractor
    /// does, mode 0777 less the umask), never through a symlink.
    fn parent_made<'a>(&mut self, rel: &'a Path) -> Result<(&Dir, &'a OsStr)> {
        let parent = rel.parent().unwrap_or(Path::new(""));
        if let Err(e) = self.dir(parent) {
            if e.kind() != io::ErrorKind::NotFound {
                return Err(fallback(format!(
                    "the parent of `{}` is not a directory ({e})",
                    rel.display()
                )));
            }
            let mut cur = self.root.try_clone()?;
            for c in parent.components() {
                let name = c.as_os_str();
                match cur.mkdir_at(name, 0o777) {
                    Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                        return Err(e).with_context(|| format!("creating {}", parent.display()));
                    }
                    _ => {}
                }
                cur = cur.open_dir_at(name).map_err(|e| {
                    fallback(format!("`{}` is not a directory ({e})", parent.display()))
                })?;
            }
        }
        Ok(self.parent(rel)?)
    }
}

/// What a delta install did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// As a full unpack counts them; `bytes` is what was written.
    pub stats: unpack::Stats,
    /// Files hardlinked or reflinked from the installed tree, and their bytes.
    pub files_linked: u64,
    pub bytes_linked: u64,
    /// Files copied from the installed tree (a hardlink was not possible).
    pub files_copied: u64,
    /// Files written from the decoded tar.
    pub files_written: u64,
    pub chunks_decoded: u64,
    pub chunks_total: u64,
}

/// Decodes the given chunks of the key (ascending indices) as one stream,
/// verified chunk by chunk, into the consumer.
pub type Decode<'a> =
    dyn FnMut(&[usize], &mut dyn FnMut(&mut dyn Read) -> Result<()>) -> Result<()> + 'a;

/// The entries left for the later phases.
#[derive(Default)]
struct Plan {
    writes: Vec<usize>,
    hardlinks: Vec<usize>,
    dirs: Vec<(PathBuf, u32)>,
}

struct Builder<'a> {
    stage: Tree,
    /// The installed tree (`None` when it is gone: nothing to link).
    old_tree: Option<Tree>,
    old: &'a Installed,
    by_digest: HashMap<[u8; 32], Vec<usize>>,
    by_path: HashMap<&'a [u8], usize>,
    /// Installed inodes linked already, and where in staging: a second
    /// entry with that content is a copy (a hardlink would join two paths
    /// the tar keeps apart).
    used: HashMap<(u64, u64), PathBuf>,
    buf: Vec<u8>,
    report: Report,
}

/// Builds `staging` (empty, the caller's) as the key `entry` whose index is
/// `new`, from the installed tree at `target` that `old` describes, decoding
/// only the chunks that hold entries it must write.
pub fn build(
    staging: &Path,
    target: &Path,
    new: &Index,
    entry: &KeyEntry,
    old: &Installed,
    decode: &mut Decode<'_>,
) -> Result<Report> {
    let mut b = Builder::new(staging, target, old)?;
    let plan = b.link_phase(new)?;
    unpack::kill_point("delta:linked");
    b.write_phase(new, entry, &plan.writes, decode)?;
    unpack::kill_point("delta:written");
    b.hardlink_phase(new, &plan.hardlinks)?;
    b.finish_dirs(plan.dirs)?;
    Ok(b.report)
}

impl<'a> Builder<'a> {
    fn new(staging: &Path, target: &Path, old: &'a Installed) -> Result<Builder<'a>> {
        let mut by_digest: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        let mut by_path = HashMap::new();
        for (i, e) in old.index.entries.iter().enumerate() {
            if let (Some(d), Some(_)) = (e.sha256, old.stats[i]) {
                by_digest.entry(d).or_default().push(i);
                by_path.insert(e.path.as_slice(), i);
            }
        }
        Ok(Builder {
            stage: Tree::open(staging)?,
            old_tree: Tree::open(target).ok(),
            old,
            by_digest,
            by_path,
            used: HashMap::new(),
            buf: vec![0; 1 << 20],
            report: Report::default(),
        })
    }

    /// Directories, symlinks and reused files, in index order; returns what
    /// is left to write, to hardlink and to finish.
    fn link_phase(&mut self, new: &Index) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut seen = HashSet::new();
        for (i, e) in new.entries.iter().enumerate() {
            let rel = entry_rel(e)?;
            if rel.as_os_str().is_empty() {
                continue;
            }
            if !seen.insert(rel.clone()) {
                return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
            }
            match e.kind {
                Kind::Dir => {
                    self.mkdir(&rel)?;
                    plan.dirs.push((rel, e.mode));
                }
                Kind::Symlink => self.symlink(&rel, e)?,
                Kind::Hardlink => plan.hardlinks.push(i),
                Kind::File => {
                    if !self.reuse(&rel, e)? {
                        plan.writes.push(i);
                    }
                }
            }
        }
        Ok(plan)
    }

    fn mkdir(&mut self, rel: &Path) -> Result<()> {
        let (dir, name) = self.stage.parent_made(rel)?;
        match dir.mkdir_at(name, 0o777) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !dir.lstat_at(name)?.as_ref().is_some_and(unpack_is_dir) {
                    return Err(fallback(format!("duplicate entry `{}`", rel.display())));
                }
            }
            Err(e) => return Err(e).with_context(|| format!("creating `{}`", rel.display())),
        }
        self.report.stats.dirs += 1;
        Ok(())
    }

    fn symlink(&mut self, rel: &Path, e: &Entry) -> Result<()> {
        let target = e.target.as_deref().unwrap_or_default();
        unpack::check_symlink_target(rel, target)
            .map_err(|why| fallback(format!("entry {}: {why}", shown(&e.path))))?;
        let (dir, name) = self.stage.parent_made(rel)?;
        match dir.symlink_at(OsStr::from_bytes(target), name) {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
            }
            r => r.with_context(|| format!("creating the symlink `{}`", rel.display()))?,
        }
        dir.set_mtime_at(name, FIXED_MTIME)
            .with_context(|| format!("setting the mtime of `{}`", rel.display()))?;
        self.report.stats.symlinks += 1;
        Ok(())
    }
}

fn unpack_is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// How a file came from the installed tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reused {
    Linked,
    Copied,
    /// Its bytes were not the digest after all: written from the tar.
    No,
}

impl Builder<'_> {
    /// Links (or copies) `e` from an installed file with its digest whose
    /// stat still matches the record, the same path first. False when
    /// there is none: the entry is written from the tar.
    fn reuse(&mut self, rel: &Path, e: &Entry) -> Result<bool> {
        let Some(cands) = e.sha256.and_then(|d| self.by_digest.get(&d)) else {
            return Ok(false);
        };
        let mut order = cands.clone();
        if let Some(&same) = self.by_path.get(e.path.as_slice())
            && let Some(pos) = order.iter().position(|&x| x == same)
        {
            order.swap(0, pos);
        }
        for oi in order {
            let stat = self.old.stats[oi].expect("candidates have stats");
            if stat.size != e.size || stat.mtime_ns != FIXED_MTIME as i64 * 1_000_000_000 {
                continue;
            }
            let how = if let Some(first) = self.used.get(&(stat.dev, stat.ino)).cloned() {
                self.copy_staged(rel, &first, e)?
            } else if let Some(inode) = self.checked_inode(oi, &stat, e) {
                self.link_or_copy(rel, &inode, &stat, e)?
            } else {
                Reused::No
            };
            match how {
                Reused::No => continue,
                Reused::Linked => {
                    self.used.insert((stat.dev, stat.ino), rel.to_path_buf());
                }
                Reused::Copied => {}
            }
            self.report.stats.files += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A handle on installed entry `oi` if it is still the file the record
    /// describes (same dev, inode, size, mode, links, mtime and ctime), and,
    /// when its ctime is racy (`Record::clock_ns`), still has `e`'s digest.
    fn checked_inode(&mut self, oi: usize, stat: &FileStat, e: &Entry) -> Option<File> {
        let tree = self.old_tree.as_mut()?;
        let rel = unpack::safe_relative(&self.old.index.entries[oi].path).ok()?;
        let (dir, name) = tree.parent(&rel).ok()?;
        let inode = dir.open_inode_at(name).ok()?;
        let now = FileStat::of(&unpack::fstat(&inode).ok()?);
        if now != *stat || !now.is_file() {
            return None;
        }
        if stat.ctime_ns > self.old.racy_after_ns {
            let mut f = unpack::reopen_for_reading(&inode).ok()?;
            let mut h = Sha256::new();
            io::copy(&mut f, &mut h).ok()?;
            if Some(<[u8; 32]>::from(h.finalize())) != e.sha256 {
                return None;
            }
        }
        Some(inode)
    }

    fn link_or_copy(
        &mut self,
        rel: &Path,
        inode: &File,
        stat: &FileStat,
        e: &Entry,
    ) -> Result<Reused> {
        let (dir, name) = self.stage.parent_made(rel)?;
        if stat.mode & 0o777 == e.mode & 0o777 {
            match dir.link_inode_at(inode, name) {
                Ok(()) => {
                    self.report.files_linked += 1;
                    self.report.bytes_linked += e.size;
                    return Ok(Reused::Linked);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
                }
                // Another file system, too many links, no /proc: copy.
                Err(_) => {}
            }
        }
        let Ok(src) = unpack::reopen_for_reading(inode) else {
            return Ok(Reused::No);
        };
        copy_into(dir, name, &src, e, &mut self.buf, &mut self.report)
    }

    /// A copy of what this install already linked at `first` in staging.
    fn copy_staged(&mut self, rel: &Path, first: &Path, e: &Entry) -> Result<Reused> {
        let parent = first.parent().unwrap_or(Path::new(""));
        let src_dir = unpack::open_beneath(&self.stage.root, parent, Links::None)
            .with_context(|| format!("opening `{}` in staging", parent.display()))?;
        let name = first.file_name().expect("a staged file has a name");
        let src = src_dir
            .open_file_at(name)
            .with_context(|| format!("opening `{}` in staging", first.display()))?;
        let (dir, name) = self.stage.parent_made(rel)?;
        copy_into(dir, name, &src, e, &mut self.buf, &mut self.report)
    }
}

/// Creates `name` in `dir` with the bytes of `src`: a reflink where the
/// file system makes one, else a copy, hashed on the way and refused
/// (removed, `Reused::No`) unless it is the entry's digest.
fn copy_into(
    dir: &Dir,
    name: &OsStr,
    src: &File,
    e: &Entry,
    buf: &mut [u8],
    report: &mut Report,
) -> Result<Reused> {
    let out = match dir.create_file_at(name) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
        }
        r => r.with_context(|| format!("creating {}", shown(&e.path)))?,
    };
    // SAFETY: two open fds; FICLONE only reads its argument.
    let cloned = unsafe { libc::ioctl(out.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0;
    if !cloned && !copy_hashed(src, &out, e, buf)? {
        dir.unlink_at(name)
            .with_context(|| format!("removing {}", shown(&e.path)))?;
        return Ok(Reused::No);
    }
    finish_file(&out, e)?;
    if cloned {
        report.files_linked += 1;
        report.bytes_linked += e.size;
    } else {
        report.files_copied += 1;
        report.stats.bytes += e.size;
    }
    Ok(if cloned {
        Reused::Linked
    } else {
        Reused::Copied
    })
}

/// Copies `src` into `out`; whether the bytes have the entry's size and digest.
fn copy_hashed(mut src: &File, mut out: &File, e: &Entry, buf: &mut [u8]) -> Result<bool> {
    let mut h = Sha256::new();
    let mut done = 0u64;
    loop {
        let n = src
            .read(buf)
            .with_context(|| format!("reading the installed {}", shown(&e.path)))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", shown(&e.path)))?;
        done += n as u64;
    }
    Ok(done == e.size && Some(<[u8; 32]>::from(h.finalize())) == e.sha256)
}

/// The entry's mode (permission bits, as the extractor keeps them) and the
/// fixed mtime.
fn finish_file(out: &File, e: &Entry) -> Result<()> {
    out.set_permissions(std::fs::Permissions::from_mode(e.mode & 0o777))
        .with_context(|| format!("setting the mode of {}", shown(&e.path)))?;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(FIXED_MTIME);
    out.set_modified(t)
        .with_context(|| format!("setting the mtime of {}", shown(&e.path)))
}

/// The chunks that hold any of `writes` (ascending), and the tar span of
/// each: all of them, as one span, when the chunks are not independent
/// frames.
/// A slice of the tar: `start..end`.
type Span = (u64, u64);

fn select(entry: &KeyEntry, writes: &[&Entry]) -> Result<(Vec<usize>, Vec<Span>)> {
    let n = entry.chunks.len();
    if entry.frames.is_none() {
        return Ok(((0..n).collect(), vec![(0, entry.tar_size)]));
    }
    let mut spans = Vec::with_capacity(n);
    let mut off = 0u64;
    for c in &entry.chunks {
        let raw = c
            .raw_size
            .ok_or_else(|| fallback(format!("chunk {} has no raw_size", c.file)))?;
        spans.push((off, off + raw));
        off += raw;
    }
    let mut chosen = vec![false; n];
    for e in writes {
        let mut k = spans.partition_point(|s: &(u64, u64)| s.1 <= e.offset);
        while k < n && spans[k].0 < e.end {
            chosen[k] = true;
            k += 1;
        }
    }
    let picked: Vec<usize> = (0..n).filter(|&k| chosen[k]).collect();
    let picked_spans = picked.iter().map(|&k| spans[k]).collect();
    Ok((picked, picked_spans))
}

/// The decoded stream of the chosen chunks, with each byte's tar offset.
struct Positioned<'r> {
    inner: &'r mut dyn Read,
    spans: &'r [(u64, u64)],
    at: usize,
    pos: u64,
}

impl<'r> Positioned<'r> {
    fn new(inner: &'r mut dyn Read, spans: &'r [(u64, u64)]) -> Positioned<'r> {
        let pos = spans.first().map_or(0, |s| s.0);
        Positioned {
            inner,
            spans,
            at: 0,
            pos,
        }
    }

    /// Moves on to the next span once this one is read.
    fn settle(&mut self) {
        while self.at < self.spans.len() && self.pos >= self.spans[self.at].1 {
            self.at += 1;
            if let Some(s) = self.spans.get(self.at) {
                self.pos = s.0;
            }
        }
    }

    /// Reads and drops the bytes up to tar offset `off`.
    fn skip_to(&mut self, off: u64) -> io::Result<()> {
        loop {
            self.settle();
            let Some(&(_, end)) = self.spans.get(self.at) else {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "past the chunks",
                ));
            };
            if off < self.pos {
                return Err(io::Error::other(format!(
                    "offset {off} is not in a decoded chunk"
                )));
            }
            let stop = off.min(end);
            let want = stop - self.pos;
            let got = io::copy(&mut (&mut *self.inner).take(want), &mut io::sink())?;
            if got != want {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "chunks end early",
                ));
            }
            self.pos = stop;
            if off < end {
                return Ok(());
            }
        }
    }
}

impl Read for Positioned<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.settle();
        let Some(&(_, end)) = self.spans.get(self.at) else {
            return Ok(0);
        };
        let want = buf
            .len()
            .min(usize::try_from(end - self.pos).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 && want > 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "chunks end early",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
}

impl Builder<'_> {
    /// Decodes the chunks that hold `writes` and writes those entries.
    fn write_phase(
        &mut self,
        new: &Index,
        entry: &KeyEntry,
        writes: &[usize],
        decode: &mut Decode<'_>,
    ) -> Result<()> {
        let entries: Vec<&Entry> = writes.iter().map(|&i| &new.entries[i]).collect();
        let (chunks, spans) = if entries.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            select(entry, &entries)?
        };
        self.report.chunks_decoded = chunks.len() as u64;
        self.report.chunks_total = entry.chunks.len() as u64;
        let (stage, buf, report) = (&mut self.stage, &mut self.buf, &mut self.report);
        decode(&chunks, &mut |r| {
            let mut pos = Positioned::new(r, &spans);
            for e in &entries {
                write_entry(stage, &mut pos, e, buf)?;
                report.files_written += 1;
                report.stats.files += 1;
                report.stats.bytes += e.size;
            }
            Ok(())
        })
    }
}

/// Writes the file entry `e` from its bytes in the decoded stream, after
/// checking that its header and data are what the index says.
fn write_entry(
    stage: &mut Tree,
    pos: &mut Positioned<'_>,
    e: &Entry,
    buf: &mut [u8],
) -> Result<()> {
    pos.skip_to(e.offset)
        .with_context(|| format!("reading up to {}", shown(&e.path)))?;
    let mut take = Read::take(&mut *pos, e.end - e.offset);
    {
        let mut ar = tar::Archive::new(&mut take);
        let mut it = ar.entries().context("reading the tar stream")?;
        let mut te = match it.next() {
            Some(Ok(te)) => te,
            Some(Err(err)) => {
                return Err(fallback(format!(
                    "no tar entry at offset {} where the index has {} ({err})",
                    e.offset,
                    shown(&e.path)
                )));
            }
            None => return Err(fallback(format!("the tar ends before {}", shown(&e.path)))),
        };
        check_header(&te, e)?;
        let rel = entry_rel(e)?;
        let (dir, name) = stage.parent_made(&rel)?;
        write_file(dir, name, &mut te, e, buf)?;
    }
    io::copy(&mut take, &mut io::sink()).context("reading the tar padding")?;
    Ok(())
}

/// The tar header agrees with the index line.
fn check_header<R: Read>(te: &tar::Entry<'_, R>, e: &Entry) -> Result<()> {
    let h = te.header();
    let differs = |what: &str| {
        fallback(format!(
            "the tar's entry at offset {} differs from the index ({what})",
            e.offset
        ))
    };
    if te.path_bytes().as_ref() != e.path.as_slice() {
        return Err(differs(&format!(
            "{} against {}",
            shown(&te.path_bytes()),
            shown(&e.path)
        )));
    }
    if !h.entry_type().is_file() || te.size() != e.size {
        return Err(differs("kind or size"));
    }
    if h.mode().map_err(|_| differs("mode"))? & 0o777 != e.mode & 0o777 {
        return Err(differs("mode"));
    }
    if h.mtime().map_err(|_| differs("mtime"))? != FIXED_MTIME {
        return Err(fallback(
            "the tar keeps real mtimes, which the file index does not record",
        ));
    }
    Ok(())
}

fn write_file(
    dir: &Dir,
    name: &OsStr,
    src: &mut dyn Read,
    e: &Entry,
    buf: &mut [u8],
) -> Result<()> {
    let mut out = match dir.create_file_at(name) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
        }
        r => r.with_context(|| format!("creating {}", shown(&e.path)))?,
    };
    let mut h = Sha256::new();
    let mut done = 0u64;
    loop {
        let n = src
            .read(buf)
            .with_context(|| format!("reading tar entry {}", shown(&e.path)))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", shown(&e.path)))?;
        done += n as u64;
    }
    let digest: [u8; 32] = h.finalize().into();
    if done != e.size || Some(digest) != e.sha256 {
        return Err(fallback(format!(
            "{} in the tar has sha256 {} but the file index says another",
            shown(&e.path),
            hex::encode(&digest)
        )));
    }
    finish_file(&out, e)
}

impl Builder<'_> {
    /// Hardlink entries, to earlier file entries now in staging.
    fn hardlink_phase(&mut self, new: &Index, hardlinks: &[usize]) -> Result<()> {
        let files: HashMap<&[u8], usize> = new
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == Kind::File)
            .map(|(i, e)| (e.path.as_slice(), i))
            .collect();
        for &i in hardlinks {
            let e = &new.entries[i];
            let to = e.target.as_deref().unwrap_or_default();
            if files.get(to).is_none_or(|&t| t >= i) {
                return Err(fallback(format!(
                    "hardlink {} is not to an earlier file entry",
                    shown(&e.path)
                )));
            }
            let rel = entry_rel(e)?;
            let trel = unpack::safe_relative(to)
                .map_err(|why| fallback(format!("hardlink {}: {why}", shown(&e.path))))?;
            let tparent = trel.parent().unwrap_or(Path::new(""));
            let src = unpack::open_beneath(&self.stage.root, tparent, Links::None)
                .map_err(|err| fallback(format!("hardlink {}: {err}", shown(&e.path))))?;
            let tname = trel.file_name().expect("a file entry has a name");
            let (dir, name) = self.stage.parent_made(&rel)?;
            match src.link_at(tname, dir, name) {
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
                }
                r => r.with_context(|| format!("creating the hardlink {}", shown(&e.path)))?,
            }
            self.report.stats.hardlinks += 1;
        }
        Ok(())
    }

    /// Directory modes and mtimes, deepest first, once their children exist.
    fn finish_dirs(&mut self, mut dirs: Vec<(PathBuf, u32)>) -> Result<()> {
        dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
        for (rel, mode) in dirs {
            let (dir, name) = self
                .stage
                .parent(&rel)
                .with_context(|| format!("opening the parent of `{}`", rel.display()))?;
            dir.chmod_dir_at(name, mode & 0o777)
                .with_context(|| format!("setting the mode of `{}`", rel.display()))?;
            dir.set_mtime_at(name, FIXED_MTIME)
                .with_context(|| format!("setting the mtime of `{}`", rel.display()))?;
        }
        Ok(())
    }
}

/// What the restore's staging directory was built from.
pub struct Staged {
    pub unpacked: unpack::Stats,
    pub verified: verify::Stats,
    pub fetched: prefetch::Stats,
    /// Set when it was a delta of the installed tree.
    pub delta: Option<Report>,
    /// Why a delta was tried and gave way to a full install.
    pub fallback: Option<String>,
}

/// What `stage` needs from the restore.
pub struct Ctx<'a> {
    pub git: &'a CacheGit,
    pub branch: &'a Branch,
    pub kp: &'a KeyPlan,
    pub name: &'a str,
    pub target: &'a Path,
    pub state_dir: &'a Path,
    pub stamp_file: &'a Path,
    /// The new key's index (`fetch_index`), when it has one.
    pub index: Option<&'a Result<NewIndex, String>>,
    /// Replace mode, no `--verify`, and the manifest keeps the fixed mtime.
    pub allowed: bool,
    pub progress: bool,
}

/// Builds the empty staging directory `dest`: as a delta of the installed
/// tree where `try_delta` can, else (after one line saying why, when a
/// delta was possible but refused) by a full unpack.
pub fn stage(ctx: &Ctx<'_>, dest: &Path) -> Result<Staged> {
    let why = match try_delta(ctx, dest) {
        Ok(Some(staged)) => return Ok(staged),
        Ok(None) => None,
        Err(e) => Some(fallback_reason(&e).ok_or(e)?),
    };
    if let Some(why) = &why {
        eprintln!("warning: {why}: installing {} in full", ctx.kp.key);
        // What the delta made so far goes; the same empty directory again.
        let again = unpack::staging_dir_for(ctx.target)?;
        anyhow::ensure!(again == dest, "staging moved to {}", again.display());
    }
    let (unpacked, verified, fetched) =
        restore::unpack_into(ctx.git, ctx.branch, ctx.kp, dest, ctx.progress)?;
    Ok(Staged {
        unpacked,
        verified,
        fetched,
        delta: None,
        fallback: why,
    })
}

/// The delta, if the stamp, the record and the new index allow one:
/// `Ok(None)` when there is nothing to build from, `Err(Fallback)` when
/// something disagrees.
fn try_delta(ctx: &Ctx<'_>, dest: &Path) -> Result<Option<Staged>> {
    let (true, Some(new)) = (ctx.allowed, ctx.index) else {
        return Ok(None);
    };
    let key = &ctx.kp.key;
    let new = new
        .as_ref()
        .map_err(|why| fallback(format!("the file index of {key} cannot be used ({why})")))?;
    let Loaded::Found(s) = stamp::load(ctx.stamp_file) else {
        return Ok(None);
    };
    if s.mode != "replace" || s.target != ctx.target {
        return Ok(None);
    }
    let old = match installed(ctx.state_dir, ctx.name, &s.key, &s.tar_sha256, s.files) {
        Ok(Some(old)) => old,
        Ok(None) => return Ok(None),
        Err(why) => {
            return Err(fallback(format!(
                "the record of the installed {} cannot be used ({why})",
                s.key
            )));
        }
    };
    let Content::V1(bm) = &ctx.branch.content else {
        return Ok(None);
    };
    let entry = bm.keys.get(key).context("the key is on the branch")?;
    let mut got = None;
    let mut decode = |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
        let sub = sub_plan(ctx.kp, entry, chunks);
        let ((), v, f) = restore::stream_key(ctx.git, ctx.branch, &sub, ctx.progress, consume)?;
        got = Some((v, f));
        Ok(())
    };
    let report = build(dest, ctx.target, &new.index, entry, &old, &mut decode)?;
    let (mut verified, fetched) = got.context("the delta decoded nothing")?;
    verified.tar_sha256 = entry.tar_sha256.clone();
    Ok(Some(Staged {
        unpacked: report.stats,
        verified,
        fetched,
        delta: Some(report),
        fallback: None,
    }))
}

/// The plan of just the chosen chunks: their concatenation decodes to their
/// raw slices of the tar (each is a whole zstd frame), which only the
/// chunk digests authenticate. Without frames the chosen are all of them.
fn sub_plan(kp: &KeyPlan, entry: &KeyEntry, chunks: &[usize]) -> KeyPlan {
    let mut sub = kp.clone();
    if chunks.len() == kp.plan.pieces.len() && entry.frames.is_none() {
        return sub;
    }
    sub.plan.pieces = chunks.iter().map(|&i| kp.plan.pieces[i].clone()).collect();
    sub.oids = chunks.iter().map(|&i| kp.oids[i].clone()).collect();
    let raw: u64 = chunks
        .iter()
        .map(|&i| entry.chunks[i].raw_size.unwrap_or(0))
        .sum();
    sub.plan.tar_size = Some(raw);
    sub.plan.tar_cap = raw;
    sub.plan.tar_sha256 = None;
    sub.plan.hash_tar = false;
    sub
}

/// The index of `key` on `branch`, fetched by id if the branch fetch left
/// it out, and checked (`check_index`): `None` when the key has none.
pub fn fetch_index(
    git: &CacheGit,
    branch: &Branch,
    key: &str,
) -> Result<Option<Result<NewIndex, String>>> {
    let Content::V1(bm) = &branch.content else {
        return Ok(None);
    };
    let Some(entry) = bm.keys.get(key) else {
        return Ok(None);
    };
    let Some(i) = &entry.index else {
        return Ok(None);
    };
    let Some(blob) = branch
        .entries
        .iter()
        .find(|e| e.name == i.file && e.kind == "blob")
    else {
        return Ok(Some(Err(format!(
            "{} is named in warmstart.json but not on branch {}",
            i.file, branch.name
        ))));
    };
    if blob.size.is_none() {
        prefetch::fetch_all(
            git,
            &branch.remote,
            &branch.name,
            std::slice::from_ref(&blob.oid),
        )
        .with_context(|| format!("fetching {} of branch {}", i.file, branch.name))?;
    }
    let mut bytes = Vec::new();
    git.read_blob(&blob.oid)?
        .take(i.size + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {} of branch {}", i.file, branch.name))?;
    Ok(Some(check_index(bytes, entry)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, Frames};
    use std::collections::BTreeMap;
    use std::os::unix::fs::MetadataExt;

    /// One entry of a hand-made tar.
    #[derive(Clone)]
    enum Item {
        D(String, u32),
        F(String, u32, Vec<u8>),
        L(String, String),
        H(String, String),
    }

    fn path_of(i: &Item) -> &str {
        match i {
            Item::D(p, _) | Item::F(p, _, _) | Item::L(p, _) | Item::H(p, _) => p,
        }
    }

    fn header(ty: tar::EntryType, mode: u32, size: u64) -> tar::Header {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(mode);
        h.set_size(size);
        h.set_mtime(FIXED_MTIME);
        h
    }

    /// A tar as publish writes it (GNU, fixed mtime, path order), and its index.
    fn tar_of(items: &[Item]) -> (Vec<u8>, Index) {
        let mut items = items.to_vec();
        items.sort_by(|a, b| path_of(a).as_bytes().cmp(path_of(b).as_bytes()));
        let mut b = tar::Builder::new(Vec::new());
        for it in &items {
            match it {
                Item::D(p, m) => {
                    let mut h = header(tar::EntryType::Directory, *m, 0);
                    b.append_data(&mut h, p, io::empty()).unwrap();
                }
                Item::F(p, m, data) => {
                    let mut h = header(tar::EntryType::Regular, *m, data.len() as u64);
                    b.append_data(&mut h, p, &data[..]).unwrap();
                }
                Item::L(p, t) => {
                    let mut h = header(tar::EntryType::Symlink, 0o777, 0);
                    b.append_link(&mut h, p, t).unwrap();
                }
                Item::H(p, t) => {
                    let mut h = header(tar::EntryType::Link, 0o644, 0);
                    b.append_link(&mut h, p, t).unwrap();
                }
            }
        }
        let tar = b.into_inner().unwrap();
        let index = index_of(&tar, &items);
        (tar, index)
    }

    /// The index of `tar`, from where each entry's data lies.
    fn index_of(tar: &[u8], items: &[Item]) -> Index {
        let mut ar = tar::Archive::new(tar);
        let mut entries = Vec::new();
        let mut offset = 0;
        for (te, it) in ar.entries().unwrap().zip(items) {
            let te = te.unwrap();
            let end = te.raw_file_position() + te.size().div_ceil(512) * 512;
            let (kind, mode, size, sha256, target) = match it {
                Item::D(_, m) => (Kind::Dir, *m, 0, None, None),
                Item::F(_, m, d) => (
                    Kind::File,
                    *m,
                    d.len() as u64,
                    Some(Sha256::digest(d).into()),
                    None,
                ),
                Item::L(_, t) => (Kind::Symlink, 0o777, 0, None, Some(t.as_bytes().to_vec())),
                Item::H(_, t) => (Kind::Hardlink, 0o644, 0, None, Some(t.as_bytes().to_vec())),
            };
            let path = path_of(it).as_bytes().to_vec();
            entries.push(Entry {
                offset,
                end,
                kind,
                mode,
                size,
                sha256,
                path,
                target,
            });
            offset = end;
        }
        Index { entries }
    }

    /// A key entry with chunks cut every `cut` bytes of the tar (anywhere,
    /// as a content-defined chunker does), or no frames.
    fn key_entry(tar: &[u8], index: &Index, cut: Option<usize>) -> (KeyEntry, Vec<(u64, u64)>) {
        let step = cut.unwrap_or(tar.len());
        let spans: Vec<(u64, u64)> = (0..tar.len())
            .step_by(step)
            .map(|s| (s as u64, (s + step).min(tar.len()) as u64))
            .collect();
        let chunks = spans
            .iter()
            .enumerate()
            .map(|(i, s)| Chunk {
                file: format!("k.tar.zst.part{i:03}"),
                size: 1,
                sha256: "0".repeat(64),
                raw_size: cut.map(|_| s.1 - s.0),
                raw_sha256: cut.map(|_| "0".repeat(64)),
            })
            .collect();
        let frames = cut.map(|c| Frames {
            chunker: crate::cache::format::CHUNKER.into(),
            min_size: 1,
            avg_size: c as u64,
            max_size: c as u64,
            zstd: "1".into(),
            level: 3,
            window_log: None,
            checksum: true,
        });
        let entry = KeyEntry {
            archive: "k.tar.zst".into(),
            compression: "zstd".into(),
            chunks,
            tar_sha256: hex::encode(&Sha256::digest(tar)),
            tar_size: tar.len() as u64,
            files: index.entries.len() as u64,
            key_parts: Vec::new(),
            source_commit: None,
            source_tree: None,
            gates: serde_json::Value::Null,
            ungated: false,
            created_at: String::new(),
            tool_version: String::new(),
            frames,
            index: None,
        };
        (entry, spans)
    }

    fn zst(index: &Index) -> NewIndex {
        NewIndex {
            bytes: zstd::encode_all(index.render().as_bytes(), 3).unwrap(),
            index: index.clone(),
        }
    }

    /// kind, mode, mtime, content or target of every path; hardlink groups.
    fn snapshot(root: &Path) -> (BTreeMap<String, String>, Vec<Vec<String>>) {
        let mut out = BTreeMap::new();
        let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for e in std::fs::read_dir(root.join(&rel)).unwrap() {
                let rel = rel.join(e.unwrap().file_name());
                let p = root.join(&rel);
                let md = std::fs::symlink_metadata(&p).unwrap();
                let what = if md.is_dir() {
                    stack.push(rel.clone());
                    "dir".to_string()
                } else if md.file_type().is_symlink() {
                    format!("-> {}", std::fs::read_link(&p).unwrap().display())
                } else {
                    inodes
                        .entry(md.ino())
                        .or_default()
                        .push(rel.display().to_string());
                    hex::encode(&Sha256::digest(std::fs::read(&p).unwrap()))
                };
                let mode = if md.file_type().is_symlink() {
                    0
                } else {
                    md.mode() & 0o7777
                };
                out.insert(
                    rel.display().to_string(),
                    format!("{what} {mode:o} {}", md.mtime()),
                );
            }
        }
        let mut groups: Vec<Vec<String>> = inodes.into_values().filter(|g| g.len() > 1).collect();
        groups.iter_mut().for_each(|g| g.sort());
        groups.sort();
        (out, groups)
    }

    fn extract(tar: &[u8], dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        crate::unpack::extract_tar(
            tar,
            dir,
            &unpack::Limits::GENEROUS,
            &unpack::Options::default(),
        )
        .unwrap();
    }

    /// A scratch area with the old key installed and recorded.
    struct Fx {
        t: tempfile::TempDir,
        target: PathBuf,
        state: PathBuf,
        old: Index,
    }

    impl Fx {
        fn new(items: &[Item]) -> Fx {
            Fx::installed_then(items, false)
        }

        /// With `settled`, the record is made a racy interval after the
        /// install, so that no ctime is racy and the stat alone decides.
        fn installed_then(items: &[Item], settled: bool) -> Fx {
            let t = tempfile::tempdir().unwrap();
            let (tar, old) = tar_of(items);
            let target = t.path().join("target");
            extract(&tar, &target);
            if settled {
                std::thread::sleep(std::time::Duration::from_nanos(RACY_NS as u64 + 5_000_000));
            }
            let state = t.path().join("state");
            let tar_hex = hex::encode(&Sha256::digest(&tar));
            remember(&state, "c", &target, "k1", &tar_hex, &zst(&old), true).unwrap();
            Fx {
                t,
                target,
                state,
                old,
            }
        }

        fn installed(&self) -> Installed {
            let text = std::fs::read_to_string(record_path(&self.state, "c")).unwrap();
            let r = Record::parse(&text).unwrap();
            installed(
                &self.state,
                "c",
                "k1",
                &r.tar_sha256,
                self.old.entries.len() as u64,
            )
            .unwrap()
            .unwrap()
        }

        /// Builds `items` as a delta; the report, the chunks decoded, and
        /// checks the result against a cold extract of the same tar.
        fn delta(&self, items: &[Item], cut: Option<usize>) -> Result<(Report, Vec<usize>)> {
            let (tar, new) = tar_of(items);
            let (entry, spans) = key_entry(&tar, &new, cut);
            let stage = self.t.path().join("stage");
            let _ = crate::unpack::remove_tree(&stage);
            std::fs::create_dir(&stage).unwrap();
            let mut seen = Vec::new();
            let mut decode =
                |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
                    seen.extend_from_slice(chunks);
                    let bytes: Vec<u8> = chunks
                        .iter()
                        .flat_map(|&i| tar[spans[i].0 as usize..spans[i].1 as usize].to_vec())
                        .collect();
                    consume(&mut &bytes[..])
                };
            let report = build(
                &stage,
                &self.target,
                &new,
                &entry,
                &self.installed(),
                &mut decode,
            )?;
            let cold = self.t.path().join("cold");
            let _ = crate::unpack::remove_tree(&cold);
            extract(&tar, &cold);
            assert_eq!(snapshot(&stage), snapshot(&cold));
            Ok((report, seen))
        }

        fn ino(&self, root: &str, rel: &str) -> u64 {
            std::fs::symlink_metadata(self.t.path().join(root).join(rel))
                .unwrap()
                .ino()
        }
    }

    fn f(p: &str, data: &str) -> Item {
        Item::F(p.into(), 0o644, data.as_bytes().to_vec())
    }

    /// Sixty files of 700 bytes in three directories, and the other kinds.
    fn tree(version: &str, changed: &[usize]) -> Vec<Item> {
        let mut items = vec![
            Item::D("a".into(), 0o755),
            Item::D("b".into(), 0o750),
            Item::D("b/c".into(), 0o555),
            Item::D("empty".into(), 0o700),
            Item::D("long".into(), 0o755),
            Item::L("link".into(), "a/f03".into()),
            Item::H("b/hard".into(), "a/f00".into()),
            Item::F(format!("long/{}", "n".repeat(150)), 0o755, b"long".to_vec()),
        ];
        for i in 0..60 {
            let dir = ["a", "b", "b/c"][i % 3];
            let body = if changed.contains(&i) { version } else { "1" };
            let data = format!("{body}{i:02}{}", "x".repeat(697)).into_bytes();
            items.push(Item::F(format!("{dir}/f{i:02}"), 0o644, data));
        }
        items
    }

    #[test]
    fn a_new_key_links_what_did_not_change_and_decodes_only_its_chunks() {
        let fx = Fx::new(&tree("1", &[]));
        let before = fx.ino("target", "b/f04");
        let (r, seen) = fx.delta(&tree("2", &[4, 5, 40]), Some(2000)).unwrap();
        assert_eq!(r.files_written, 3, "{r:?}");
        assert_eq!(r.files_linked, 58, "{r:?}");
        assert_eq!(r.bytes_linked, 57 * 700 + 4, "{r:?}");
        assert!(r.chunks_decoded < r.chunks_total / 4, "{r:?}");
        assert_eq!(seen.len() as u64, r.chunks_decoded);
        // Unchanged: the installed inode; changed: a new one.
        assert_eq!(fx.ino("stage", "a/f03"), fx.ino("target", "a/f03"));
        assert_ne!(fx.ino("stage", "b/f04"), before);
        assert_eq!(
            r.stats.files + r.stats.dirs + r.stats.symlinks + r.stats.hardlinks,
            68
        );
    }

    #[test]
    fn without_frames_everything_is_decoded_but_still_linked() {
        let fx = Fx::new(&tree("1", &[]));
        let (r, seen) = fx.delta(&tree("2", &[59]), None).unwrap();
        assert_eq!((r.files_written, r.files_linked), (1, 60), "{r:?}");
        assert_eq!(seen, vec![0]);
        // Nothing changed at all: nothing to decode. (A fresh install: the
        // links and their removal moved the ctimes of the first one.)
        let fx = Fx::new(&tree("1", &[]));
        let (r, seen) = fx.delta(&tree("1", &[]), Some(999)).unwrap();
        assert_eq!((r.files_written, r.chunks_decoded), (0, 0), "{r:?}");
        assert!(seen.is_empty());
    }

    #[test]
    fn the_same_content_twice_is_one_link_and_one_copy_and_a_new_mode_a_copy() {
        let fx = Fx::new(&[f("x", "same"), f("y", "other")]);
        let items = [
            f("x", "same"),
            f("x2", "same"),
            Item::F("y".into(), 0o600, b"other".to_vec()),
        ];
        let (r, _) = fx.delta(&items, Some(700)).unwrap();
        assert_eq!(
            (r.files_linked, r.files_copied + r.files_linked),
            (1, 3),
            "{r:?}"
        );
        assert_ne!(fx.ino("stage", "x"), fx.ino("stage", "x2"));
    }

    /// What a user may do to an installed file. Each must keep it out of
    /// the new tree (which still equals a cold restore: `Fx::delta`).
    fn hostile(i: usize, root: &Path, rel: &str, outside: &Path) {
        let p = root.join(rel);
        let mtime = std::fs::metadata(&p).unwrap().modified().unwrap();
        let same_size = |p: &Path| {
            let n = std::fs::metadata(p).unwrap().len() as usize;
            std::fs::write(p, "Z".repeat(n)).unwrap();
        };
        match i % 8 {
            0 => same_size(&p),
            1 => std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap(),
            2 => {
                std::fs::remove_file(&p).unwrap();
                std::os::unix::fs::symlink("f00", &p).unwrap();
            }
            3 => {
                std::fs::remove_file(&p).unwrap();
                std::fs::create_dir(&p).unwrap();
            }
            4 => std::fs::hard_link(&p, outside.join(format!("h{i}"))).unwrap(),
            5 => {
                same_size(&p);
                std::fs::File::options()
                    .write(true)
                    .open(&p)
                    .unwrap()
                    .set_modified(mtime)
                    .unwrap();
            }
            6 => {
                let tmp = root.join(format!("{rel}.tmp"));
                same_size(&p);
                std::fs::rename(&p, &tmp).unwrap();
                std::fs::rename(&tmp, &p).unwrap();
            }
            _ => std::fs::remove_file(&p).unwrap(),
        }
    }

    #[test]
    fn a_file_the_user_changed_is_never_linked() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..48 {
            let settled = case % 2 == 1;
            let fx = Fx::installed_then(&tree("1", &[]), settled);
            let racy = fx
                .installed()
                .stats
                .iter()
                .flatten()
                .filter(|s| s.ctime_ns > fx.installed().racy_after_ns)
                .count();
            // Unsettled, the files are usually racy (hashed before use);
            // a loaded machine may take longer than RACY_NS to install.
            assert!(!settled || racy == 0, "case {case}: {racy} racy files");
            let outside = fx.t.path().join("outside");
            std::fs::create_dir(&outside).unwrap();
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let victim = 3 + (rng % 57) as usize;
            let rel = format!("{}/f{victim:02}", ["a", "b", "b/c"][victim % 3]);
            // b/c is read-only, as installed: let the user in.
            std::fs::set_permissions(
                fx.target.join("b/c"),
                std::fs::Permissions::from_mode(0o755),
            )
            .unwrap();
            hostile(case, &fx.target, &rel, &outside);
            let edited = std::fs::symlink_metadata(fx.target.join(&rel))
                .map(|m| m.ino())
                .ok();
            let cut = [None, Some(512), Some(1777)][case % 3];
            let (r, _) = fx
                .delta(&tree("1", &[]), cut)
                .unwrap_or_else(|e| panic!("case {case}: {e:#}"));
            assert_eq!(r.files_written, 1, "case {case} ({rel}): {r:?}");
            assert_ne!(Some(fx.ino("stage", &rel)), edited, "case {case} ({rel})");
        }
    }

    #[test]
    fn an_index_that_disagrees_with_the_tar_is_a_fallback() {
        let fx = Fx::new(&tree("1", &[]));
        let (tar, mut new) = tar_of(&tree("2", &[7]));
        let e = new.entries.iter_mut().find(|e| e.path == b"b/f07").unwrap();
        e.sha256 = Some([9; 32]);
        let (entry, spans) = key_entry(&tar, &new, Some(1024));
        let stage = fx.t.path().join("stage");
        std::fs::create_dir(&stage).unwrap();
        let mut decode =
            |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
                let bytes: Vec<u8> = chunks
                    .iter()
                    .flat_map(|&i| tar[spans[i].0 as usize..spans[i].1 as usize].to_vec())
                    .collect();
                consume(&mut &bytes[..])
            };
        let err = build(
            &stage,
            &fx.target,
            &new,
            &entry,
            &fx.installed(),
            &mut decode,
        )
        .unwrap_err();
        let why = fallback_reason(&err).unwrap_or_else(|| panic!("{err:#}"));
        assert!(why.contains("b/f07") && why.contains("file index"), "{why}");
        // A path a full install refuses is left to it.
        let mut bad = new.clone();
        bad.entries[0].path = b"../up".to_vec();
        let err = build(
            &stage,
            &fx.target,
            &bad,
            &entry,
            &fx.installed(),
            &mut decode,
        )
        .unwrap_err();
        assert!(fallback_reason(&err).unwrap().contains(".."), "{err:#}");
        // The index names another path, mode or size than the tar holds
        // at that offset (each in a fresh staging directory).
        type Edit = fn(&mut Entry);
        let edits: [Edit; 3] = [|e| e.path.push(b'x'), |e| e.mode = 0o600, |e| e.size += 1];
        for edit in edits {
            let (_, mut bad) = tar_of(&tree("2", &[7]));
            edit(
                bad.entries
                    .iter_mut()
                    .find(|e| e.path.starts_with(b"b/f07"))
                    .unwrap(),
            );
            crate::unpack::remove_tree(&stage).unwrap();
            std::fs::create_dir(&stage).unwrap();
            let old = fx.installed();
            let err = build(&stage, &fx.target, &bad, &entry, &old, &mut decode).unwrap_err();
            let why = fallback_reason(&err).unwrap_or_else(|| panic!("{err:#}"));
            assert!(why.contains("differs from the index"), "{why}");
        }
    }

    /// A directory of the installed tree swapped for a symlink to a copy
    /// outside (whose files keep their inodes and stats): nothing under it
    /// is linked, as nothing is ever read through a symlink.
    #[test]
    fn nothing_is_linked_through_a_symlinked_directory() {
        let fx = Fx::new(&tree("1", &[]));
        let outside = fx.t.path().join("outside-a");
        std::fs::rename(fx.target.join("a"), &outside).unwrap();
        std::os::unix::fs::symlink(&outside, fx.target.join("a")).unwrap();
        let (r, _) = fx.delta(&tree("1", &[]), Some(4096)).unwrap();
        assert_eq!(r.files_written, 20, "{r:?}");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        assert_ne!(
            ino(&fx.t.path().join("stage/a/f00")),
            ino(&outside.join("f00"))
        );
    }

    #[test]
    fn records_and_indexes_are_checked_before_use() {
        let fx = Fx::new(&tree("1", &[]));
        let r = std::fs::read_to_string(record_path(&fx.state, "c")).unwrap();
        let rec = Record::parse(&r).unwrap();
        assert_eq!(Record::parse(&rec.render()).unwrap(), rec);
        let files = fx.old.entries.len() as u64;
        let load = || installed(&fx.state, "c", "k1", &rec.tar_sha256, files);
        assert!(load().unwrap().is_some());
        assert!(
            installed(&fx.state, "c", "k2", &rec.tar_sha256, files)
                .unwrap_err()
                .contains("k1")
        );
        for bad in [
            r.replace("clock ", "clock x"),
            r.replace("verified yes", "verified maybe"),
            r.replacen(" 100644 ", " 10064x ", 1),
            r.replacen(" 100644 ", " ", 1),
            r[..r.trim_end().rfind('\n').unwrap() + 1].to_string(),
            r.replacen("warmstart-installed 1", "warmstart-installed 2", 1),
            String::new(),
        ] {
            std::fs::write(record_path(&fx.state, "c"), &bad).unwrap();
            assert!(load().is_err(), "{bad}");
        }
        std::fs::write(record_path(&fx.state, "c"), &r).unwrap();
        std::fs::write(index_path(&fx.state, "c"), b"forged").unwrap();
        assert!(load().unwrap_err().contains("not the index"));
        forget(&fx.state, "c").unwrap();
        assert!(load().unwrap().is_none());
        assert_eq!(std::fs::read_dir(dir(&fx.state)).unwrap().count(), 0);

        // The branch's index: size, digest, then agreement with the key.
        let (tar, index) = tar_of(&tree("1", &[]));
        let (mut entry, _) = key_entry(&tar, &index, None);
        let ni = zst(&index);
        entry.index = Some(crate::cache::format::IndexFile {
            file: "k.files.zst".into(),
            size: ni.bytes.len() as u64,
            sha256: hex::encode(&Sha256::digest(&ni.bytes)),
        });
        assert!(check_index(ni.bytes.clone(), &entry).is_ok());
        let mut flipped = ni.bytes.clone();
        flipped[9] ^= 1;
        assert!(check_index(flipped, &entry).unwrap_err().contains("sha256"));
        assert!(
            check_index(ni.bytes[1..].to_vec(), &entry)
                .unwrap_err()
                .contains("bytes")
        );
        entry.files += 1;
        assert!(
            check_index(ni.bytes.clone(), &entry)
                .unwrap_err()
                .contains("entries")
        );
        entry.files -= 1;
        entry.tar_size = index.entries.last().unwrap().end;
        assert!(check_index(ni.bytes, &entry).unwrap_err().contains("span"));
    }
}
