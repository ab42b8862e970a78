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
        // The entry starts at its first block: a long-name record if any.
        let offset = w.written;
        write_header(&mut w, item, plan.keep_mtime)?;
        let mut content = index.is_some().then(Sha256::new);
        if item.kind == Kind::File {
            let path = join(&plan.root, &item.rel);
            let mut copy = |n: u64| {
                done += n;
                progress(done)
            };
            copy_file(
                &mut w,
                &path,
                item.size,
                &mut buf,
                content.as_mut(),
                &mut copy,
            )?;
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
/// `buf`, hashing them into `content` if given and telling `copied` each
/// read's length. A file that shrank or grew since the plan is an error.
fn copy_file(
    w: &mut impl Write,
    path: &Path,
    size: u64,
    buf: &mut [u8],
    mut content: Option<&mut Sha256>,
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
        if let Some(c) = content.as_deref_mut() {
            c.update(&buf[..n]);
        }
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
mod tests;
