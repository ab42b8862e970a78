//! Packing: the selected tree as a deterministic tar, cut at
//! content-defined boundaries into chunks that are each one zstd frame.
//!
//! `plan` walks the pack root and decides what goes in (read-only, so
//! `--dry-run` uses it). `write_tar` turns a plan into tar bytes, and `pack`
//! runs the whole pipeline: tar (hashed, and indexed per entry: module
//! `files`) -> FastCDC cuts -> one zstd frame per chunk on all cores
//! (module `chunks`) -> chunk frames, each handed to the caller, in order,
//! as soon as it is complete. Nothing holds the archive in memory or writes
//! it whole to disk: the caller decides how many finished chunks may exist
//! at once.
//!
//! Each file is read once. The thread that reads also builds the tar and
//! cuts it; the same bytes go, in 1 MiB blocks, to a digest thread that
//! computes the signed `tar_sha256` (SHA-256 over the whole tar, as
//! `sha256sum` of the tar would) and every file's content sha256 for the
//! index; each chunk's raw sha256 and its frame's are computed on the zstd
//! worker that compresses it, and the chunk file is written by whoever
//! takes it (cache.git's writer thread). So no stage but reading and
//! cutting is serial, and zstd has every core behind it.
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

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::cache::format::chunk_sizes::Sizes;
use crate::cache::format::files;
use crate::cache::format::manifest::CacheManifest;
use crate::cache::publish::chunks::{self, Frame, Params};
use crate::hex;

use crate::cache::publish::walk::join;
pub use crate::cache::publish::walk::{
    Item, Kind, Plan, Rules, Stat, TreeStamp, could_contain, plan_tree,
};

/// Walks `m.pack_root` and lists what the manifest selects, in tar order
/// (`walk::plan`), refusing what every restore of it would refuse (see
/// `refuse_what_restore_refuses`): so nothing is packed or pushed, and no
/// `--dry-run` shows a plan, that no restore can install.
pub fn plan(m: &CacheManifest) -> Result<Plan> {
    let plan = crate::cache::publish::walk::plan(m)?;
    refuse_what_restore_refuses(&plan, &m.absolute_symlinks)?;
    Ok(plan)
}

/// Exit 7 at the first entry of `plan` that a restore refuses, by the very
/// rules (and words) of `unpack`'s extractor: a name that is absolute or
/// climbs (`..`), a symlink with an empty target, an absolute one, or one
/// whose target leaves the restored tree. (Devices, fifos and sockets the
/// walk already refuses; it never descends through a symlink, and only a
/// regular file gets a second name.) Before, such a key was published
/// without complaint and every restore of it exited 7.
/// A symlink whose path matches `absolute` (`pack.absolute_symlinks`) may
/// be absolute, with no `..`, as every restore of the manifest allows.
pub fn refuse_what_restore_refuses(plan: &Plan, absolute: &[crate::glob::Pattern]) -> Result<()> {
    for item in &plan.items {
        let name = String::from_utf8_lossy(&item.rel);
        let refused = |reason: String| {
            crate::exit::fail(
                crate::exit::Code::Unsafe,
                format!(
                    "refusing tar entry `{name}`: {reason}: a restore refuses it (exit 7), so it is not published; leave it out with pack.exclude, or make the link relative and inside {}",
                    plan.root.display()
                ),
            )
        };
        let rel = crate::unpack::safe_relative(&item.rel).map_err(refused)?;
        if let Kind::Symlink(target) = &item.kind {
            if target.is_empty() {
                return Err(refused("symlink with an empty target".to_string()));
            }
            crate::unpack::check_symlink_target_with(&rel, target, absolute).map_err(refused)?;
        }
    }
    Ok(())
}

/// The mtime of every entry unless the manifest keeps real ones:
/// 2000-01-01T00:00:00Z. Not 0: tools that zip restored files (Python
/// wheels, for one) refuse timestamps before 1980, in any time zone.
pub const FIXED_MTIME: u64 = 946_684_800;

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
    tar_stream(plan, out, None, progress)
}

/// `write_tar`, also returning the per-file index of the tar it wrote.
pub fn write_tar_indexed(
    plan: &Plan,
    out: impl Write,
    progress: &mut dyn FnMut(u64),
) -> Result<(TarDigest, files::Index)> {
    write_tar_known(plan, out, None, progress)
}

/// `write_tar_indexed`, taking the content digest of each regular file
/// `known` has one for instead of hashing it.
fn write_tar_known(
    plan: &Plan,
    out: impl Write,
    known: Option<&Known>,
    progress: &mut dyn FnMut(u64),
) -> Result<(TarDigest, files::Index)> {
    let mut entries = Vec::with_capacity(plan.items.len());
    let digests = known.map(|k| k.digests.as_slice());
    let index = IndexOut {
        entries: &mut entries,
        known: digests,
    };
    let digest = tar_stream(plan, out, Some(index), progress)?;
    Ok((digest, files::Index { entries }))
}

/// What an earlier pack of this clone's says of today's plan (module
/// `publish::unchanged`): the content digest of each entry whose file is
/// the one that pack read (by `plan.items` index), and the chunks of
/// that pack which today's tar holds whole.
#[derive(Clone, Debug, Default)]
pub struct Known {
    pub digests: Vec<Option<[u8; 32]>>,
    pub skips: chunks::Skips,
}

/// The length of `item`'s entry in the tar (long-name records, header,
/// data and padding), as `write_entries` writes it.
pub fn entry_len(item: &Item, keep_mtime: bool) -> u64 {
    let mut header = Vec::with_capacity(1024);
    write_header(&mut header, item, keep_mtime).expect("writing to memory");
    let data = if item.kind == Kind::File {
        item.size
    } else {
        0
    };
    header.len() as u64 + data.div_ceil(512) * 512
}

/// The zstd level of a key's index file (about 140 bytes of text per
/// entry, half of it a hex digest no level compresses). The level the
/// chunks use: on a 50,000-file tree's 7 MB index, level 19 took 54 s of a
/// publish's CPU for 2.41 MB, level 3 took 0.7 s for 2.62 MB, and the
/// incremental restore reads it once either way.
pub const INDEX_LEVEL: i32 = 3;

/// The parts of a key's index file on its branch: `index.render()` cut by
/// `files::parts`, each part one zstd frame with a checksum and the content
/// size, made with the same parameters every time so that a part whose text
/// did not change is the same blob. Their concatenation is the index file.
pub fn index_parts(index: &files::Index) -> Result<Vec<Vec<u8>>> {
    let mut z = zstd::bulk::Compressor::new(INDEX_LEVEL).context("starting zstd for the index")?;
    z.include_checksum(true)
        .and_then(|()| z.include_contentsize(true))
        .context("configuring zstd for the index")?;
    let text = index.render();
    let mut at = 0;
    files::parts(text.as_bytes())
        .into_iter()
        .map(|n| {
            at += n;
            z.compress(&text.as_bytes()[at - n..at])
                .context("compressing the file index")
        })
        .collect()
}

/// The digest `write_tar` would return, without writing the tar anywhere.
/// This thread reads the files and builds the stream while a second one
/// hashes it (`tar_stream`), so reading and SHA-256 overlap.
pub fn tar_digest(plan: &Plan, progress: &mut dyn FnMut(u64)) -> Result<TarDigest> {
    tar_stream(plan, io::sink(), None, progress)
}

/// The tar bytes a digest thread is sent, in blocks of this size.
const FEED_BLOCK: usize = 1 << 20;

/// What the digest thread is told, in stream order.
enum Feed {
    /// The next bytes of the tar.
    Block(Vec<u8>),
    /// A regular file's content is the tar's bytes `start..end` (sent
    /// before any of them).
    File { start: u64, end: u64 },
}

/// The tar's sha256 and, in tar order, every regular file's.
struct Digests {
    tar: Sha256,
    files: Vec<[u8; 32]>,
}

/// Hashes the tar as its blocks arrive, and each file's content from the
/// same blocks: one read of the files feeds every digest, and the hashing
/// runs beside the thread that reads, cuts and hands chunks to zstd.
fn digest_thread(rx: mpsc::Receiver<Feed>, recycle: mpsc::Sender<Vec<u8>>) -> Digests {
    let mut d = Digests {
        tar: Sha256::new(),
        files: Vec::new(),
    };
    let mut pending = std::collections::VecDeque::<(u64, u64)>::new();
    let mut content = Sha256::new();
    let mut at = 0u64;
    for msg in rx {
        let block = match msg {
            Feed::File { start, end } => {
                pending.push_back((start, end));
                continue;
            }
            Feed::Block(b) => b,
        };
        d.tar.update(&block);
        let end = at + block.len() as u64;
        while let Some(&(s, e)) = pending.front() {
            if s >= end && e > s {
                break;
            }
            let (from, to) = (s.max(at), e.min(end));
            if to > from {
                content.update(&block[(from - at) as usize..(to - at) as usize]);
            }
            if e > end {
                break;
            }
            d.files.push(std::mem::take(&mut content).finalize().into());
            pending.pop_front();
        }
        at = end;
        // The producer may be gone (it failed); then the block is dropped.
        let _ = recycle.send(block);
    }
    d
}

/// Passes every write to `inner` and copies what it took into blocks for
/// the digest thread.
struct Feeder<W> {
    inner: W,
    block: Vec<u8>,
    tx: Option<mpsc::SyncSender<Feed>>,
    recycle: mpsc::Receiver<Vec<u8>>,
    written: u64,
}

impl<W: Write> Feeder<W> {
    fn send(&mut self, msg: Feed) -> io::Result<()> {
        self.tx
            .as_ref()
            .and_then(|tx| tx.send(msg).ok())
            .ok_or_else(|| io::Error::other("the tar hashing thread stopped"))
    }

    fn send_block(&mut self) -> io::Result<()> {
        let next = match self.recycle.try_recv() {
            Ok(mut b) => {
                b.clear();
                b
            }
            Err(_) => Vec::with_capacity(FEED_BLOCK),
        };
        let full = std::mem::replace(&mut self.block, next);
        self.send(Feed::Block(full))
    }

    /// Sends the last block and closes the feed.
    fn close(&mut self) -> io::Result<()> {
        if !self.block.is_empty() {
            self.send_block()?;
        }
        self.tx.take();
        Ok(())
    }
}

impl<W: Write> Write for Feeder<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        let mut rest = &buf[..n];
        while !rest.is_empty() {
            let take = rest.len().min(FEED_BLOCK - self.block.len());
            self.block.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if self.block.len() == FEED_BLOCK {
                self.send_block()?;
            }
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

/// Writes the tar of `plan` to `out` and returns its digest, recording each
/// entry's place and content digest into `index` if given
/// (`cache::format::files`). The files are read once, on this thread; the
/// tar's sha256 and the files' are computed from those very bytes on a
/// second thread, at most a few MiB behind. `out` is flushed once, at the
/// end, and dropped before returning.
fn tar_stream(
    plan: &Plan,
    out: impl Write,
    mut index: Option<IndexOut<'_>>,
    progress: &mut dyn FnMut(u64),
) -> Result<TarDigest> {
    let (tx, rx) = mpsc::sync_channel::<Feed>(4);
    let (recycle_tx, recycle_rx) = mpsc::channel::<Vec<u8>>();
    let hasher = std::thread::spawn(move || digest_thread(rx, recycle_tx));
    let mut w = Feeder {
        inner: out,
        block: Vec::with_capacity(FEED_BLOCK),
        tx: Some(tx),
        recycle: recycle_rx,
        written: 0,
    };
    let wrote = write_entries(plan, &mut w, index.as_mut(), progress);
    let closed = wrote.and_then(|()| {
        w.close()?;
        w.inner.flush()?;
        Ok(())
    });
    let size = w.written;
    // Dropping the feeder closes the feed (also on error), so the hasher ends.
    drop(w);
    let d = hasher
        .join()
        .map_err(|_| anyhow!("the tar hashing thread panicked"))?;
    closed?;
    if let Some(index) = index {
        let mut digests = d.files.into_iter();
        let hashed = |e: &&mut files::Entry| e.kind == files::Kind::File && e.sha256.is_none();
        for e in index.entries.iter_mut().filter(hashed) {
            e.sha256 = digests.next();
        }
    }
    Ok(TarDigest {
        sha256: hex::encode(&d.tar.finalize()),
        size,
        entries: plan.items.len() as u64,
    })
}

/// Where `tar_stream` puts the per-file index: `entries`, each regular
/// file's content digest taken from `known` (by `plan.items` index) where
/// it has one, else hashed from the bytes the tar carries.
struct IndexOut<'a> {
    entries: &'a mut Vec<files::Entry>,
    known: Option<&'a [Option<[u8; 32]>]>,
}

/// Writes every entry of `plan` and the end of archive into `w`, telling
/// the digest thread where each regular file's content lies when an index
/// is kept (whose entries it pushes, their digests still unset).
fn write_entries<W: Write>(
    plan: &Plan,
    w: &mut Feeder<W>,
    mut index: Option<&mut IndexOut<'_>>,
    progress: &mut dyn FnMut(u64),
) -> Result<()> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut done = 0u64;
    for (i, item) in plan.items.iter().enumerate() {
        // The entry starts at its first block: a long-name record if any.
        let offset = w.written;
        write_header(w, item, plan.keep_mtime)?;
        let known = index
            .as_ref()
            .and_then(|x| x.known?.get(i).copied().flatten());
        if item.kind == Kind::File {
            if index.is_some() && known.is_none() {
                let start = w.written;
                w.send(Feed::File {
                    start,
                    end: start + item.size,
                })?;
            }
            let path = join(&plan.root, &item.rel);
            let mut copy = |n: u64| {
                done += n;
                progress(done)
            };
            copy_file(w, &path, item.size, &mut buf, &mut copy)?;
            pad(w, item.size)?;
        }
        if let Some(index) = index.as_mut() {
            let mut e = index_entry(item, offset, w.written);
            if e.kind == files::Kind::File {
                e.sha256 = known;
            }
            index.entries.push(e);
        }
    }
    // End of archive: two zero blocks, as GNU tar writes.
    w.write_all(&[0u8; 1024])?;
    Ok(())
}

/// Writes the header of `item` (after its GNU long-name records, if its
/// name or link target needs them): uid and gid 0, the fixed mtime unless
/// `keep_mtime`.
fn write_header(w: &mut impl Write, item: &Item, keep_mtime: bool) -> io::Result<()> {
    let mtime = if keep_mtime { item.mtime } else { FIXED_MTIME };
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
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(ty);
    h.set_size(size);
    h.set_mode(item.mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    set_long(w, &mut h, Field::Name, &name)?;
    if let Kind::Symlink(t) | Kind::Hardlink(t) = &item.kind {
        set_long(w, &mut h, Field::Link, t)?;
    }
    h.set_cksum();
    w.write_all(h.as_bytes())
}

/// Copies exactly `size` bytes of the file at `path` into `w` through
/// `buf`, telling `copied` each read's length. A file that shrank or grew since the plan is an error.
fn copy_file(
    w: &mut impl Write,
    path: &Path,
    size: u64,
    buf: &mut [u8],
    copied: &mut dyn FnMut(u64),
) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut left = size;
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
        left -= n as u64;
        copied(n as u64);
    }
    if f.read(&mut buf[..1])? != 0 {
        bail!(
            "{} grew while it was being packed: publish again when nothing writes to it",
            path.display()
        );
    }
    Ok(())
}

/// The index line of `item`, whose tar bytes are `offset..end` (a file's
/// content digest is set once the digest thread has it).
fn index_entry(item: &Item, offset: u64, end: u64) -> files::Entry {
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
        sha256: None,
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

/// A finished chunk, handed over as soon as it is complete, its frame in
/// memory: whoever takes it writes the file (`write`) on its own thread,
/// so the thread that reads the tree and cuts it never waits on a write.
#[derive(Clone, Debug)]
pub struct ChunkFile {
    pub index: usize,
    /// Its scratch name (`name_of(index)`).
    pub name: String,
    /// Where `write` puts it (inside the chunk directory).
    pub path: PathBuf,
    /// The frame (empty in `Packed::chunks`, which keeps the record only).
    pub bytes: Vec<u8>,
    pub size: u64,
    pub sha256: String,
    /// The uncompressed slice of the tar it holds.
    pub raw_size: u64,
    pub raw_sha256: String,
    /// Its frame was an earlier one (checked), not compressed now.
    pub reused_frame: bool,
    /// The blob in cache.git that holds the frame already (`bytes` is
    /// empty): a known chunk of this clone's earlier pack.
    pub blob: Option<String>,
}

impl ChunkFile {
    /// Writes the frame to `path`.
    pub fn write(&self) -> Result<()> {
        fs::write(&self.path, &self.bytes)
            .with_context(|| format!("writing {}", self.path.display()))
    }
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
    /// Some chunk was split into several frames to fit the limit.
    pub split: bool,
}

/// Runs the pipeline for `plan`: the tar is cut at content-defined
/// boundaries, each chunk compressed as its own zstd frame on
/// `opts.threads` workers, and the chunks, named by `name_of(index)` in
/// `dir`, are passed to `on_chunk` one by one, in order, to be written
/// (`ChunkFile::write`) or dropped. A chunk whose frame `reuse` has
/// (checked to decode to it) is not compressed again.
#[allow(clippy::too_many_arguments)]
pub fn pack(
    plan: &Plan,
    opts: PackOptions,
    reuse: chunks::Reuse,
    known: Option<&Known>,
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
        compressed += f.size;
        let record = ChunkFile {
            index: f.index,
            name,
            path,
            size: f.size,
            blob: f.blob,
            bytes: Vec::new(),
            sha256: f.sha256,
            raw_size: f.raw_size,
            raw_sha256: f.raw_sha256,
            reused_frame: f.reused,
        };
        chunks.push(record.clone());
        on_chunk(ChunkFile {
            bytes: f.bytes,
            ..record
        })
    };
    let ((tar, index), counts) = chunks::frames_skipping(
        opts.sizes,
        opts.params,
        opts.limit,
        opts.threads,
        reuse,
        known.map(|k| &k.skips),
        |w| write_tar_known(plan, w, known, progress),
        &mut emit,
    )?;
    Ok(Packed {
        tar,
        index,
        chunks,
        compressed,
        split: counts.chunks != counts.frames,
    })
}

#[cfg(test)]
mod tests;
