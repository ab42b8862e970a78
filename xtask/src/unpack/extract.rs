//! The checked tar extractor: reads headers with the `tar` crate and creates
//! every file, directory and link itself, so each rule is an error, not a skip.
//!
//! Why not `tar::Archive::unpack`: it silently skips some unsafe entries,
//! follows symlinks inside the destination when writing, and its long-name
//! handling reads extension records of any size into memory. Here the stream
//! is read through a budget (extension records are capped at `EXT_BUDGET`),
//! every parent directory is checked to be a real directory this run created,
//! and files are opened with `O_CREAT | O_EXCL | O_NOFOLLOW`. Small regular
//! files are created by a pool of writer threads (`writers.rs`) so that the
//! kernel's file creation overlaps with parsing.

use anyhow::{Context, Result};
use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::OsStr;
use std::fs::{self, File, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::create::{create_file, finish_file, refuse, set_symlink_mtime};
use super::writers::{Job, Writers};
use super::{Limits, Options, Stats};
use crate::exit::{Code, fail};

/// Most bytes of headers and extension records (GNU long names, PAX records)
/// that may precede one entry. Real archives need a few KiB.
const EXT_BUDGET: u64 = 1 << 20;

/// Copy buffer size: large enough that syscalls do not dominate.
const BUF_SIZE: usize = 1 << 20;

/// Regular files up to this size are read into an owned buffer and created
/// by the writer pool; larger ones are streamed by the main thread through
/// its copy buffer (they are few, and their cost is the data, not the inode).
const POOL_FILE_MAX: u64 = 1 << 20;

/// Most bytes of file data (plus a small charge per file) queued for the
/// writer pool at once: what the pool adds to the extractor's memory.
const POOL_BUDGET: u64 = 32 << 20;

/// Writer threads when `Options::writers` is `None`, measured on the Rust
/// sysroot (52k files, 1.3 GB) on 2 cores with a zstd decode thread feeding
/// the extractor, as in a restore: against no pool, 1 writer took about 0.9x
/// the wall time, 2 writers 0.74x and 3 writers 0.75x (medians, interleaved).
pub(super) const DEFAULT_WRITERS: usize = 2;

/// How many bytes the `tar` crate may still pull from the stream, and whether
/// it hit the limit (so the error can say so instead of "unexpected EOF").
struct Budget {
    allowance: Cell<u64>,
    exceeded: Cell<bool>,
}

struct BudgetReader<R> {
    inner: R,
    budget: Rc<Budget>,
}

impl<R: Read> Read for BudgetReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.budget.allowance.get();
        if left == 0 && !buf.is_empty() {
            self.budget.exceeded.set(true);
            return Err(io::Error::other("tar header budget exceeded"));
        }
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.budget.allowance.set(left - n as u64);
        Ok(n)
    }
}

/// Extracts a tar stream into `dest`, an empty directory the caller owns (a
/// staging directory on the target's filesystem).
///
/// Refuses with `exit::Code::Unsafe` and an error naming the entry: `..`
/// components, absolute paths, symlinks whose target leaves `dest` (unless
/// `opts.allow_external_symlinks`), writes through a symlink (any entry whose
/// parent path is a symlink), hardlinks to outside or to entries not yet
/// extracted, hardlinks to symlinks, duplicate entries, device nodes, fifos,
/// sparse files, more bytes than `limits.max_bytes` or entries than
/// `limits.max_entries`, and entries whose data is shorter or longer than
/// declared. On error, what was written stays in `dest` for the caller to
/// remove (it is a staging directory); nothing is ever written outside it.
///
/// Keeps file modes (permission bits; setuid, setgid and sticky bits are
/// dropped), mtimes, empty directories, relative symlinks, hardlinks, and long
/// and unicode names (PAX and GNU). Memory stays bounded: one copy buffer, one
/// path per directory, and `POOL_BUDGET` bytes of small files queued for the
/// writer threads (`Options::writers`), which only create regular files under
/// parents this thread checked; every check stays on the calling thread.
pub fn extract_tar<R: Read>(
    reader: R,
    dest: &Path,
    limits: &Limits,
    opts: &Options,
) -> Result<Stats> {
    extract_tar_select(
        reader,
        Some(dest),
        limits,
        opts,
        &mut |_| Select::Extract,
        &mut |_, _| Ok(()),
    )
}

/// What `extract_tar_select` does with one entry, chosen from its checked
/// relative path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Select {
    /// Create it in the destination.
    Extract,
    /// Check it, then pass over it (e.g. outside `--only bin/`).
    Skip,
    /// Read a regular file's contents into memory (at most `CAPTURE_MAX`
    /// bytes) and hand them to the `capture` callback; other kinds are skipped.
    Capture,
}

/// Largest file `Select::Capture` reads into memory (metadata such as
/// `info/paths.json`).
pub const CAPTURE_MAX: u64 = 64 << 20;

/// `extract_tar` with a choice per entry: `select` sees each entry's path
/// (relative, already checked) and says whether to extract, skip or capture
/// it. Every entry is checked by the same rules whatever the choice, so a
/// hostile entry is refused even when it would have been skipped. `dest` may
/// be `None` when `select` never answers `Extract`.
pub fn extract_tar_select<R: Read>(
    reader: R,
    dest: Option<&Path>,
    limits: &Limits,
    opts: &Options,
    select: &mut dyn FnMut(&Path) -> Select,
    capture: &mut dyn FnMut(&Path, Vec<u8>) -> Result<()>,
) -> Result<Stats> {
    if let Some(dest) = dest {
        check_destination(dest)?;
    }
    let budget = Rc::new(Budget {
        allowance: Cell::new(0),
        exceeded: Cell::new(false),
    });
    let mut archive = tar::Archive::new(BudgetReader {
        inner: reader,
        budget: budget.clone(),
    });
    let mut entries = archive.entries().context("reading the tar stream")?;
    // Only files extracted to a destination are written by the pool.
    let threads = match dest {
        None => 0,
        Some(_) => opts.writers.unwrap_or(DEFAULT_WRITERS),
    };
    let pool = Writers::new(POOL_BUDGET);
    let mut x = Extractor {
        dest,
        limits,
        opts,
        select,
        capture,
        writers: (threads > 0).then_some(&pool),
        stats: Stats::default(),
        entries: 0,
        declared: 0,
        dirs: HashSet::new(),
        deferred_dirs: Vec::new(),
        buf: vec![0; BUF_SIZE],
    };
    // The scope joins the writers on every path out, so nothing is written
    // after this function returns (the caller may then remove `dest`).
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| pool.work());
        }
        // If this thread panics, the writers must still be told to stop, or
        // the scope would wait for them forever instead of unwinding.
        let _close = CloseOnPanic(&pool);
        match read_entries(&mut entries, &budget, &mut x) {
            Ok(()) => {
                pool.close(false);
                pool.wait_idle()?;
                x.finish()?;
                Ok(x.stats)
            }
            Err(err) => {
                // A writer's failure belongs to an earlier entry than the
                // main thread's: report it first.
                pool.close(true);
                pool.wait_idle()?;
                Err(err)
            }
        }
    })
}

/// The destination must be a directory already (not a symlink to one).
fn check_destination(dest: &Path) -> Result<()> {
    let meta = fs::symlink_metadata(dest)
        .with_context(|| format!("reading the destination {}", dest.display()))?;
    anyhow::ensure!(
        meta.is_dir(),
        "the destination {} is not a directory",
        dest.display()
    );
    Ok(())
}

/// Hands every entry of the stream to the extractor, each with the header
/// budget it may read before it.
fn read_entries<R: Read>(
    entries: &mut tar::Entries<'_, BudgetReader<R>>,
    budget: &Budget,
    x: &mut Extractor<'_>,
) -> Result<()> {
    let mut prev: Option<String> = None;
    let mut prev_unread: u64 = 0;
    loop {
        // Skipping the unread rest of the previous entry, its padding,
        // then the headers and extension records of the next one.
        budget
            .allowance
            .set(prev_unread.saturating_add(1024 + EXT_BUDGET));
        let entry = match entries.next() {
            None => return Ok(()),
            Some(Ok(entry)) => entry,
            Some(Err(err)) => return Err(stream_refused(prev.as_deref(), &err, budget)),
        };
        budget.allowance.set(u64::MAX);
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        prev_unread = x.entry(entry, &name)?;
        prev = Some(name);
    }
}

/// The refusal of a stream the `tar` crate could not read past `prev`.
fn stream_refused(prev: Option<&str>, err: &io::Error, budget: &Budget) -> anyhow::Error {
    let after = match prev {
        Some(name) => format!("after entry `{name}`"),
        None => "at the first entry".to_string(),
    };
    if budget.exceeded.get() {
        return fail(
            Code::Unsafe,
            format!(
                "refusing tar stream {after}: headers and extension records (long names, pax) exceed {EXT_BUDGET} bytes"
            ),
        );
    }
    // A compressed stream that ends before its own end marker is a cut
    // file (an interrupted download), not a hostile one: say so, and how to
    // get a whole one.
    let text = err.to_string();
    if err.kind() == io::ErrorKind::UnexpectedEof || text.contains("EOF") {
        return fail(
            Code::Unsafe,
            format!(
                "refusing tar stream {after}: {text}: the file is truncated (an interrupted download?); download it again"
            ),
        );
    }
    fail(
        Code::Unsafe,
        format!(
            "refusing tar stream {after}: {text} (an entry's data is longer than its declared size, or the stream is corrupt)"
        ),
    )
}

/// Closes the writer pool (dropping queued files) when dropped during a
/// panic, so that the writers return and `thread::scope` can unwind.
struct CloseOnPanic<'a>(&'a Writers);

impl Drop for CloseOnPanic<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.close(true);
        }
    }
}

/// Reads all `size` bytes of an entry's data into memory (the caller caps
/// `size`), refusing an entry whose data ends early.
fn read_whole(entry: &mut impl Read, size: u64, name: &str) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(size as usize);
    entry
        .take(size)
        .read_to_end(&mut data)
        .with_context(|| format!("reading tar entry `{name}`"))?;
    if (data.len() as u64) < size {
        return Err(refuse(
            name,
            format!(
                "declares {size} bytes but the stream ends after {}",
                data.len()
            ),
        ));
    }
    Ok(data)
}

/// Splits an archive path into its normal components, refusing absolute
/// paths and `..`. `.` and empty components (`a//b`) are dropped. Returns an
/// empty path for the archive root (`.`, `./`).
pub(crate) fn safe_relative(raw: &[u8]) -> Result<PathBuf, String> {
    if raw.first() == Some(&b'/') {
        return Err("absolute path".into());
    }
    let mut out = PathBuf::new();
    for comp in raw.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." => return Err("path contains a `..` component".into()),
            name => out.push(OsStr::from_bytes(name)),
        }
    }
    Ok(out)
}

/// Checks that a symlink at `rel` (relative to the destination) pointing to
/// `target` resolves inside the destination. Allowed shapes: `../../x/y`
/// (leading `..`s that stay within the link's depth, then names). A `..`
/// after a name is refused, because the name may itself be a symlink and
/// `..` would then resolve from wherever that points.
pub(crate) fn check_symlink_target(rel: &Path, target: &[u8]) -> Result<(), String> {
    if target.is_empty() {
        return Err("symlink with an empty target".into());
    }
    if target.first() == Some(&b'/') {
        return Err(format!(
            "symlink to the absolute path `{}` leaves the destination",
            String::from_utf8_lossy(target)
        ));
    }
    let mut level = rel.components().count() as i64 - 1;
    let mut seen_name = false;
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." if seen_name => {
                return Err(format!(
                    "symlink target `{}` has `..` after a name, which could resolve outside through another symlink",
                    String::from_utf8_lossy(target)
                ));
            }
            b".." => {
                level -= 1;
                if level < 0 {
                    return Err(format!(
                        "symlink target `{}` leaves the destination",
                        String::from_utf8_lossy(target)
                    ));
                }
            }
            _ => seen_name = true,
        }
    }
    Ok(())
}

/// `check_symlink_target`, except that a symlink whose path matches one of
/// `absolute` (the manifest's `pack.absolute_symlinks`) may have an absolute
/// target, as long as no component of it is `..`. Pack time and every
/// restore judge by this one function so that they never disagree.
pub(crate) fn check_symlink_target_with(
    rel: &Path,
    target: &[u8],
    absolute: &[crate::glob::Pattern],
) -> Result<(), String> {
    let matched = || {
        rel.to_str()
            .is_some_and(|rel| absolute.iter().any(|p| p.matches(rel)))
    };
    if target.first() == Some(&b'/') && matched() {
        if target.split(|&b| b == b'/').any(|c| c == b"..") {
            return Err(format!(
                "symlink to the absolute path `{}` has a `..` component, which pack.absolute_symlinks never allows",
                String::from_utf8_lossy(target)
            ));
        }
        return Ok(());
    }
    check_symlink_target(rel, target)
}

struct Extractor<'a> {
    dest: Option<&'a Path>,
    limits: &'a Limits,
    opts: &'a Options,
    select: &'a mut dyn FnMut(&Path) -> Select,
    capture: &'a mut dyn FnMut(&Path, Vec<u8>) -> Result<()>,
    /// The pool that creates small regular files; `None`: this thread
    /// creates every file.
    writers: Option<&'a Writers>,
    stats: Stats,
    entries: u64,
    /// Sum of declared sizes of all entries so far (bounds the work too).
    declared: u64,
    /// Relative paths known to be real directories (created or checked by
    /// this run). Nothing can replace one later: duplicates are refused.
    dirs: HashSet<PathBuf>,
    /// Directory modes and mtimes, applied at the end so that a read-only
    /// directory does not stop its own children from being created.
    deferred_dirs: Vec<(PathBuf, u32, u64)>,
    buf: Vec<u8>,
}

enum Kind {
    File,
    Dir,
    /// A symlink and its (checked) target.
    Symlink(Vec<u8>),
    /// A hardlink and the (checked) relative path it links to.
    Hardlink(PathBuf, String),
}

impl Extractor<'_> {
    /// Handles one entry; returns how many bytes of its data were left unread.
    fn entry<R: Read>(&mut self, mut entry: tar::Entry<'_, R>, name: &str) -> Result<u64> {
        let size = entry.size();
        self.count(name, size)?;
        let header = entry.header();
        if header.entry_type().is_pax_global_extensions() {
            // Metadata for the whole archive; nothing to create.
            return Ok(size);
        }
        let mode = header.mode().unwrap_or(0o644) & 0o777;
        let mtime = header.mtime().unwrap_or(0);
        let raw = entry.path_bytes().into_owned();
        let rel = safe_relative(&raw).map_err(|reason| refuse(name, reason))?;
        let kind = classify(&entry, &raw, &rel, name, self.opts)?;
        if rel.as_os_str().is_empty() {
            return match kind {
                // `./` itself: the destination exists already; keep its mode.
                Kind::Dir => Ok(size),
                _ => Err(refuse(name, "the entry names the destination itself")),
            };
        }
        match (self.select)(&rel) {
            Select::Extract => {}
            Select::Skip => return Ok(size),
            Select::Capture => return self.capture_file(&mut entry, &kind, &rel, name, size),
        }
        let Some(dest) = self.dest else {
            anyhow::bail!(
                "tar entry `{name}` selected for extraction, but there is no destination"
            );
        };
        self.ensure_parent(dest, &rel, name)?;
        let path = dest.join(&rel);
        match kind {
            Kind::File => return self.file(&mut entry, path, size, mode, mtime, name),
            Kind::Dir => self.dir(&path, rel, mode, mtime, name)?,
            Kind::Symlink(target) => {
                create_symlink(&target, &path, mtime, name)?;
                self.stats.symlinks += 1;
            }
            Kind::Hardlink(link_rel, shown) => {
                self.hardlink(dest, &link_rel, &shown, &path, name)?;
                self.stats.hardlinks += 1;
            }
        }
        Ok(size)
    }

    /// Counts the entry and its declared size against the archive's caps.
    fn count(&mut self, name: &str, size: u64) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(refuse(
                name,
                format!(
                    "the archive has more than {} entries (the cap)",
                    self.limits.max_entries
                ),
            ));
        }
        self.declared = self.declared.saturating_add(size);
        if self.declared > self.limits.max_bytes {
            return Err(refuse(
                name,
                format!(
                    "the archive's contents exceed {} bytes (the cap)",
                    self.limits.max_bytes
                ),
            ));
        }
        Ok(())
    }

    /// `Select::Capture`: hands a regular file's contents to the callback
    /// (other kinds are passed over); returns the bytes left unread.
    fn capture_file(
        &mut self,
        entry: &mut impl Read,
        kind: &Kind,
        rel: &Path,
        name: &str,
        size: u64,
    ) -> Result<u64> {
        if !matches!(kind, Kind::File) {
            return Ok(size);
        }
        if size > CAPTURE_MAX {
            return Err(refuse(
                name,
                format!("{size} bytes is too large to read as metadata (the cap is {CAPTURE_MAX})"),
            ));
        }
        let data = read_whole(entry, size, name)?;
        (self.capture)(rel, data)?;
        Ok(0)
    }

    /// Creates a regular file: a small one through the writer pool, a large
    /// one (or any, without a pool) streamed by this thread. Reads all its data.
    fn file(
        &mut self,
        entry: &mut impl Read,
        path: PathBuf,
        size: u64,
        mode: u32,
        mtime: u64,
        name: &str,
    ) -> Result<u64> {
        if let Some(pool) = self.writers
            && size <= POOL_FILE_MAX
        {
            let data = read_whole(entry, size, name)?;
            pool.submit(Job {
                seq: self.entries,
                name: name.to_string(),
                path,
                mode,
                mtime,
                data,
            })?;
        } else {
            let file = create_file(&path, name)?;
            stream_file(entry, &mut self.buf, &file, &path, size, name)?;
            finish_file(&file, &path, mode, mtime)?;
        }
        self.stats.files += 1;
        self.stats.bytes += size;
        Ok(0)
    }

    /// Creates a directory (or checks the one an earlier entry made) and
    /// defers its mode and mtime to the end.
    fn dir(&mut self, path: &Path, rel: PathBuf, mode: u32, mtime: u64, name: &str) -> Result<()> {
        match fs::symlink_metadata(path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(refuse(
                    name,
                    "duplicate entry: a file or symlink of that name exists already",
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(path).with_context(|| format!("creating {}", path.display()))?;
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        }
        self.dirs.insert(rel.clone());
        self.deferred_dirs.push((rel, mode, mtime));
        self.stats.dirs += 1;
        Ok(())
    }

    /// Links `path` to the earlier regular-file entry `link_rel`, reached only
    /// through directories this run made or checked.
    fn hardlink(
        &self,
        dest: &Path,
        link_rel: &Path,
        shown: &str,
        path: &Path,
        name: &str,
    ) -> Result<()> {
        // The target may still be queued or half written.
        if let Some(pool) = self.writers {
            pool.wait_idle()?;
        }
        let not_earlier = || {
            refuse(
                name,
                format!("hardlink target `{shown}` is not an earlier entry of the archive"),
            )
        };
        // Every directory on the way must be one this run made or
        // checked, so the link cannot reach through a symlink.
        if let Some(parent) = link_rel.parent()
            && !parent.as_os_str().is_empty()
            && !self.dirs.contains(parent)
        {
            return Err(not_earlier());
        }
        let src = dest.join(link_rel);
        match fs::symlink_metadata(&src) {
            Ok(m) if m.file_type().is_file() => {}
            Ok(m) if m.file_type().is_symlink() => {
                return Err(refuse(
                    name,
                    format!("hardlink target `{shown}` is a symlink"),
                ));
            }
            Ok(_) => {
                return Err(refuse(
                    name,
                    format!("hardlink target `{shown}` is not a regular file"),
                ));
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(not_earlier()),
            Err(e) => return Err(e).with_context(|| format!("reading {}", src.display())),
        }
        match fs::hard_link(&src, path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                Err(refuse(name, "duplicate entry: the path exists already"))
            }
            Err(e) => Err(e).with_context(|| format!("creating the hardlink {}", path.display())),
        }
    }

    /// Makes sure every ancestor of `rel` is a real directory inside `dest`,
    /// creating missing ones, refusing symlinks and files on the way.
    fn ensure_parent(&mut self, dest: &Path, rel: &Path, name: &str) -> Result<()> {
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        if parent.as_os_str().is_empty() || self.dirs.contains(parent) {
            return Ok(());
        }
        let mut sofar = PathBuf::new();
        for comp in parent.components() {
            sofar.push(comp);
            if self.dirs.contains(&sofar) {
                continue;
            }
            let path = dest.join(&sofar);
            match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(refuse(
                        name,
                        format!(
                            "its parent `{}` is a symlink: writing through a symlink is refused",
                            sofar.display()
                        ),
                    ));
                }
                Ok(_) => {
                    return Err(refuse(
                        name,
                        format!("its parent `{}` is not a directory", sofar.display()),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir(&path)
                        .with_context(|| format!("creating {}", path.display()))?;
                }
                Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
            }
            self.dirs.insert(sofar.clone());
        }
        Ok(())
    }

    /// Applies directory modes and mtimes, deepest first, once all children exist.
    fn finish(&mut self) -> Result<()> {
        let Some(dest) = self.dest else {
            return Ok(());
        };
        self.deferred_dirs
            .sort_by_key(|(rel, _, _)| std::cmp::Reverse(rel.components().count()));
        for (rel, mode, mtime) in self.deferred_dirs.drain(..) {
            let path = dest.join(&rel);
            fs::set_permissions(&path, Permissions::from_mode(mode))
                .with_context(|| format!("setting the mode of {}", path.display()))?;
            set_symlink_mtime(&path, mtime)?;
        }
        Ok(())
    }
}

/// What an entry creates, from its type and path, with its link target
/// checked; refuses the kinds this extractor never creates.
fn classify<R: Read>(
    entry: &tar::Entry<'_, R>,
    raw: &[u8],
    rel: &Path,
    name: &str,
    opts: &Options,
) -> Result<Kind> {
    let ty = entry.header().entry_type();
    if ty.is_dir() || (ty.is_file() && raw.last() == Some(&b'/')) {
        Ok(Kind::Dir)
    } else if ty.is_file() || ty.is_contiguous() {
        Ok(Kind::File)
    } else if ty.is_symlink() {
        symlink_target(entry, rel, name, opts).map(Kind::Symlink)
    } else if ty.is_hard_link() {
        hardlink_target(entry, name)
    } else if ty.is_character_special() || ty.is_block_special() {
        Err(refuse(name, "device nodes are refused"))
    } else if ty.is_fifo() {
        Err(refuse(name, "fifos are refused"))
    } else if ty.is_gnu_sparse() {
        Err(refuse(name, "sparse files are not supported"))
    } else {
        Err(refuse(
            name,
            format!("unsupported entry type {:?}", ty.as_byte() as char),
        ))
    }
}

/// A symlink's target, refused when empty or (unless allowed) when it
/// leaves the destination.
fn symlink_target<R: Read>(
    entry: &tar::Entry<'_, R>,
    rel: &Path,
    name: &str,
    opts: &Options,
) -> Result<Vec<u8>> {
    let target = entry
        .link_name_bytes()
        .ok_or_else(|| refuse(name, "symlink without a target"))?
        .into_owned();
    if target.is_empty() {
        return Err(refuse(name, "symlink with an empty target"));
    }
    if !opts.allow_external_symlinks {
        check_symlink_target_with(rel, &target, &opts.absolute_symlinks).map_err(|reason| {
            refuse(
                name,
                format!(
                    "{reason} (allow with --allow-external-symlinks in `conda unpack`, or [pack] absolute_symlinks in a cache manifest)"
                ),
            )
        })?;
    }
    Ok(target)
}

/// A hardlink's target as a checked relative path (and as the archive spells
/// it, for messages); never the destination itself.
fn hardlink_target<R: Read>(entry: &tar::Entry<'_, R>, name: &str) -> Result<Kind> {
    let link = entry
        .link_name_bytes()
        .ok_or_else(|| refuse(name, "hardlink without a target"))?
        .into_owned();
    let shown = String::from_utf8_lossy(&link).into_owned();
    let link_rel = safe_relative(&link)
        .map_err(|reason| refuse(name, format!("hardlink target `{shown}`: {reason}")))?;
    if link_rel.as_os_str().is_empty() {
        return Err(refuse(name, "hardlink to the destination itself"));
    }
    Ok(Kind::Hardlink(link_rel, shown))
}

/// Copies exactly `size` bytes of an entry's data into `file` through `buf`,
/// refusing an entry whose data ends early.
fn stream_file(
    entry: &mut impl Read,
    buf: &mut [u8],
    mut file: &File,
    path: &Path,
    size: u64,
    name: &str,
) -> Result<()> {
    let mut done: u64 = 0;
    while done < size {
        let n = match entry.read(buf) {
            Ok(0) => {
                return Err(refuse(
                    name,
                    format!("declares {size} bytes but the stream ends after {done}"),
                ));
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).with_context(|| format!("reading tar entry `{name}`")),
        };
        file.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        done += n as u64;
    }
    Ok(())
}

/// Creates the symlink `path` -> `target`, refusing an existing path as a
/// duplicate entry.
fn create_symlink(target: &[u8], path: &Path, mtime: u64, name: &str) -> Result<()> {
    match std::os::unix::fs::symlink(OsStr::from_bytes(target), path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            return Err(refuse(name, "duplicate entry: the path exists already"));
        }
        Err(e) => {
            return Err(e).with_context(|| format!("creating the symlink {}", path.display()));
        }
    }
    set_symlink_mtime(path, mtime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn safe_relative_accepts_normal_and_refuses_escapes() {
        assert_eq!(safe_relative(b"a/b/c").unwrap(), Path::new("a/b/c"));
        assert_eq!(safe_relative(b"./a//b/").unwrap(), Path::new("a/b"));
        assert_eq!(safe_relative(b"./").unwrap(), Path::new(""));
        assert!(
            safe_relative(b"/etc/passwd")
                .unwrap_err()
                .contains("absolute")
        );
        assert!(safe_relative(b"a/../../b").unwrap_err().contains(".."));
        assert!(safe_relative(b"..").is_err());
    }

    #[test]
    fn symlink_targets_must_stay_inside() {
        let at = |p: &str, t: &str| check_symlink_target(Path::new(p), t.as_bytes());
        assert!(at("lib/libz.so", "libz.so.1").is_ok());
        assert!(at("share/x", "../lib/y").is_ok());
        assert!(at("a/b/c", "../../d/e").is_ok());
        assert!(at("a", ".").is_ok());
        assert!(at("top", "../x").unwrap_err().contains("leaves"));
        assert!(at("a/b", "../../x").unwrap_err().contains("leaves"));
        assert!(at("a/b", "/etc/passwd").unwrap_err().contains("absolute"));
        // `x/..` is where `x` points, plus one up: refused.
        assert!(at("a/b", "x/../y").unwrap_err().contains("after a name"));
        assert!(at("a", "").is_err());
    }
}

#[cfg(test)]
mod far_mtime_tests {
    use super::*;
    use crate::unpack::{Limits, Options};

    /// A base-256 mtime beyond what `SystemTime` holds used to panic in
    /// `epoch` (and, with the writer pool, hang the scope): now it is
    /// clamped, for a file written by a writer and one written inline.
    #[test]
    fn far_future_mtimes_neither_panic_nor_hang() {
        let mut b = tar::Builder::new(Vec::new());
        for (name, size) in [("small", 10usize), ("big", (1 << 20) + 1)] {
            let mut h = tar::Header::new_gnu();
            h.set_size(size as u64);
            h.set_mode(0o644);
            h.set_mtime(u64::MAX - 1);
            h.set_cksum();
            b.append_data(&mut h, name, &vec![7u8; size][..]).unwrap();
        }
        let tar = b.into_inner().unwrap();
        for writers in [None, Some(0)] {
            let tmp = tempfile::tempdir().unwrap();
            let opts = Options {
                writers,
                ..Options::default()
            };
            let stats = extract_tar(&tar[..], tmp.path(), &Limits::GENEROUS, &opts).unwrap();
            assert_eq!(stats.files, 2);
            assert_eq!(fs::read(tmp.path().join("small")).unwrap(), vec![7u8; 10]);
            assert_eq!(
                fs::metadata(tmp.path().join("big")).unwrap().len(),
                (1 << 20) + 1
            );
        }
    }
}
