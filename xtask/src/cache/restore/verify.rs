//! Verified streaming: chunk bytes reach the decoder only after their sha256
//! matched, and the decoded tar is hashed and size-capped on its way out.
//!
//! Three stages run at once, joined by bounded channels of 1 MiB blocks
//! (memory stays at a few MiB, whatever the artifact's or a chunk's size):
//! 1. *read*: first hashes every chunk, streaming, and refuses the whole
//!    restore if any digest differs from `warmstart.json` (DESIGN.md, restore
//!    invariant 1); then reads them again, re-hashing, and passes the bytes
//!    on. A chunk the caller says this process already checked
//!    (`Opened::checked`: `cache::fetch::direct` hashes each chunk as it writes it
//!    to the chunk store) is only read that second time: if its file was
//!    changed in between, the changed bytes reach the decoder and staging,
//!    and the re-hash refuses the install at the chunk's end. Legacy
//!    branches only have a digest over the whole archive: there the whole
//!    archive is hashed and checked first, then read again, re-hashed,
//!    and passed on.
//! 2. *decode*: zstd (or gzip for legacy branches), refusing more bytes than
//!    declared, and hashing the tar stream unless the plan says the decoder
//!    is trusted (`Plan::hash_tar`: a plain restore of a v1 branch, whose
//!    every compressed byte was authenticated in stage 1).
//! 3. *consume*: the caller's function, e.g. `unpack::extract_tar` into a
//!    staging directory.
//!
//! The caller swaps a staged install in only after `stream` returned `Ok`, so
//! a late verdict (a legacy archive digest, the tar digest) never lets an
//! unverified byte into the install. This module never writes to disk itself
//! and never runs git; it reads what the caller's `open` function gives it.

use anyhow::{Result, anyhow};
use sha2::{Digest, Sha256};
use std::io::{self, Read};
use std::sync::mpsc::{Receiver, Sender, SyncSender, channel, sync_channel};

use crate::cache::format::MAX_CHUNK_BYTES;
use crate::exit::{Code, Failure, fail};
use crate::hex;

/// Size of the blocks passed between stages when nothing forces a chunk.
const BLOCK: usize = 1 << 20;

/// One piece of the compressed stream: a v1 chunk or a legacy part.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// The file name on the branch (used in every message).
    pub file: String,
    /// Its size in bytes (checked against the branch tree by the caller).
    pub size: u64,
    /// v1: the digest `warmstart.json` and `SHA256SUMS` give it.
    pub sha256: Option<[u8; 32]>,
}

/// How the compressed stream is checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    /// Every piece carries its own digest (v1): checked before any of its
    /// bytes are passed on.
    PerPiece,
    /// One digest over the concatenation of all pieces (legacy), named
    /// `archive` in SHA256SUMS: checked over every piece before the first
    /// byte is passed on, and again as they are passed on.
    Whole { archive: String, sha256: [u8; 32] },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    Zstd,
    Gzip,
}

/// What to stream and what it must add up to.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What the stream is, for messages: `key K on branch B`.
    pub label: String,
    /// What to do about a verification failure, for messages.
    pub fix: String,
    pub pieces: Vec<Piece>,
    pub check: Check,
    pub codec: Codec,
    /// v1: the tar's digest and exact size from `warmstart.json`.
    pub tar_sha256: Option<[u8; 32]>,
    pub tar_size: Option<u64>,
    /// Most decoded bytes accepted before refusing (`tar_size` for v1).
    pub tar_cap: u64,
    /// Hash the decoded tar (and compare it with `tar_sha256` when there is
    /// one). Every plan starts with it on. It checks the decoder, not the
    /// data: the chunk digests already authenticate every compressed byte,
    /// and zstd checks the content checksum that publish writes into its
    /// frames. So a plain restore of a v1 branch turns it off
    /// (`cache/restore/mod.rs`), saving a SHA-256 pass over the whole tar;
    /// `cache verify` and `restore --verify` keep it.
    pub hash_tar: bool,
    /// When every piece is its own zstd frame (`KeyEntry::frames`): the
    /// uncompressed size of each, in plan order. Such pieces are decoded
    /// on several cores at once (`framed`); `None` decodes one stream.
    pub frames: Option<Vec<u64>>,
}

/// What `stream` reports progress on, each byte once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Compressed bytes hashed and checked on their first read: for a
    /// chunk still arriving, that is the download.
    Verified,
    /// Tar bytes handed to the consumer (the extractor).
    Unpacked,
}

/// What each `Phase` adds up to over a whole `stream`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Totals {
    /// The compressed bytes: the sum of the pieces' sizes.
    pub compressed: u64,
    /// The tar's size, when the branch declares it (v1; not legacy).
    pub tar: Option<u64>,
}

impl Plan {
    /// The totals of the bytes `stream` reports through `on_progress`.
    pub fn progress_totals(&self) -> Totals {
        Totals {
            compressed: self.pieces.iter().map(|p| p.size).sum(),
            tar: self.tar_size,
        }
    }
}

/// What streaming did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// Compressed bytes read (and hashed).
    pub compressed_bytes: u64,
    /// Decoded tar bytes (all hashed).
    pub tar_bytes: u64,
    /// The tar's digest: computed when `tar_hashed`, else the one
    /// `warmstart.json` declares for the authenticated chunks.
    pub tar_sha256: String,
    /// Whether the decoded tar went through sha256 (`Plan::hash_tar`).
    pub tar_hashed: bool,
    /// Every byte that went through sha256: compressed (twice for v1,
    /// see `read_stage`) plus the tar when it was hashed.
    pub bytes_hashed: u64,
}

/// Opens piece `i` of the plan for reading.
pub type Open<'a> = dyn FnMut(usize) -> Result<Opened> + Send + 'a;

/// A piece, opened.
pub struct Opened {
    pub reader: Box<dyn Read + Send>,
    /// This process already checked the piece's size and sha256 (see
    /// `cache::fetch::direct`, which hashes a chunk as it arrives): `read_stage`
    /// skips its first read, and still re-hashes the one it decodes.
    pub checked: bool,
}

impl Opened {
    /// A piece nobody checked yet.
    pub fn unchecked(reader: impl Read + Send + 'static) -> Opened {
        Opened {
            reader: Box::new(reader),
            checked: false,
        }
    }
}

/// Parses a 64-digit hex digest.
pub fn parse_digest(hex: &str) -> Result<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return Err(anyhow!("{hex:?} is not a sha256 (64 hex digits)"));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).map_err(|_| anyhow!("{hex:?} is not hex"))?;
        out[i] = u8::from_str_radix(s, 16).map_err(|_| anyhow!("{hex:?} is not hex"))?;
    }
    Ok(out)
}

/// A stage stopped because the stage after it hung up (it failed first).
#[derive(Debug)]
struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("cancelled")
    }
}

impl std::error::Error for Cancelled {}

fn is_cancelled(e: &anyhow::Error) -> bool {
    e.downcast_ref::<Cancelled>().is_some()
}

/// Messages between stages: bytes, or "I failed" (the error itself is
/// returned by the failing stage's thread; this only stops the reader).
enum Msg {
    Data(Vec<u8>),
    Failed(String),
}

/// Reads the blocks a stage sends, handing spent buffers back for reuse.
struct BlockReader {
    rx: Receiver<Msg>,
    recycle: Sender<Vec<u8>>,
    cur: Vec<u8>,
    pos: usize,
    done: bool,
}

impl BlockReader {
    fn new(rx: Receiver<Msg>, recycle: Sender<Vec<u8>>) -> BlockReader {
        BlockReader {
            rx,
            recycle,
            cur: Vec::new(),
            pos: 0,
            done: false,
        }
    }
}

impl Read for BlockReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.cur.len() {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            let spent = std::mem::take(&mut self.cur);
            if spent.capacity() > 0 {
                let _ = self.recycle.send(spent);
            }
            self.pos = 0;
            match self.rx.recv() {
                Ok(Msg::Data(block)) => self.cur = block,
                Ok(Msg::Failed(why)) => {
                    self.done = true;
                    return Err(io::Error::other(why));
                }
                // The sender finished: a clean end of stream.
                Err(_) => {
                    self.done = true;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Sends `block` on; `Cancelled` if the next stage is gone.
fn send(tx: &SyncSender<Msg>, block: Vec<u8>) -> Result<()> {
    tx.send(Msg::Data(block)).map_err(|_| anyhow!(Cancelled))
}

/// Tells the next stage this one failed, and returns the error.
fn failed(tx: &SyncSender<Msg>, err: anyhow::Error) -> anyhow::Error {
    if !is_cancelled(&err) {
        let _ = tx.send(Msg::Failed(format!("{err:#}")));
    }
    err
}

fn take_buffer(recycle: &Receiver<Vec<u8>>) -> Vec<u8> {
    recycle.try_recv().unwrap_or_default()
}

/// Reads until `buf` is full or the reader ends; returns how much it read.
fn fill(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// Streams the plan's pieces through verification and decoding into
/// `consume`, then checks the tar's size and digest. Returns `consume`'s
/// result only when every check passed; on any failure the first cause is
/// returned (a verification failure before a decode error before an unpack
/// error), with its exit code.
///
/// `on_progress` is called with compressed bytes as they are checked, and
/// with tar bytes as `consume` reads them (see `Phase`, `Plan::progress_totals`).
pub fn stream<T>(
    plan: &Plan,
    open: &mut Open<'_>,
    on_progress: &(dyn Fn(Phase, u64) + Sync),
    consume: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<(T, Stats)> {
    for p in &plan.pieces {
        if p.size > MAX_CHUNK_BYTES && plan.check == Check::PerPiece {
            return Err(fail(
                Code::Verify,
                format!(
                    "chunk {} of {} is {} bytes, more than a chunk may be ({MAX_CHUNK_BYTES}): {}",
                    p.file, plan.label, p.size, plan.fix
                ),
            ));
        }
    }
    // Blocks of `BLOCK` bytes; a few in flight between each pair of stages.
    let (raw_tx, raw_rx) = sync_channel::<Msg>(4);
    let (raw_recycle_tx, raw_recycle_rx) = channel::<Vec<u8>>();
    let (tar_tx, tar_rx) = sync_channel::<Msg>(4);
    let (tar_recycle_tx, tar_recycle_rx) = channel::<Vec<u8>>();

    let workers = framed::workers(plan);
    std::thread::scope(|s| {
        let producer = s.spawn(move || match workers {
            Some(w) => framed::produce(plan, w, open, on_progress, &tar_tx, &tar_recycle_rx),
            None => std::thread::scope(|s| {
                let reader = s.spawn(move || {
                    let r = read_stage(plan, open, on_progress, &raw_tx, &raw_recycle_rx);
                    r.map_err(|e| failed(&raw_tx, e))
                });
                let input = BlockReader::new(raw_rx, raw_recycle_tx);
                let decoded = decode_stage(plan, input, &tar_tx, &tar_recycle_rx)
                    .map_err(|e| failed(&tar_tx, e));
                (reader.join().expect("read stage panicked"), decoded)
            }),
        });
        let mut tar = Counted {
            inner: BlockReader::new(tar_rx, tar_recycle_tx),
            on_progress,
            pending: 0,
        };
        let consumed = consume(&mut tar).and_then(|v| {
            // The tar reader stops at the end-of-archive marker; the rest
            // (padding) still has to go through the digest.
            io::copy(&mut tar, &mut io::sink())
                .map_err(|e| anyhow!(e).context("reading the end of the tar stream"))?;
            Ok(v)
        });
        // Hang up, so that stages still sending stop (as `Cancelled`).
        drop(tar);
        let (read, decoded) = producer.join().expect("read and decode stages panicked");
        finish(plan, read, decoded, consumed)
    })
}

/// A reader that reports what it read as `Phase::Unpacked`, a block at a
/// time (the extractor reads in small bites: a call per read cost 0.5% of
/// a restore's instructions), and the rest at the end of the stream.
struct Counted<'a, R> {
    inner: R,
    on_progress: &'a (dyn Fn(Phase, u64) + Sync),
    pending: u64,
}

impl<R> Counted<'_, R> {
    fn flush(&mut self) {
        if self.pending > 0 {
            (self.on_progress)(Phase::Unpacked, std::mem::take(&mut self.pending));
        }
    }
}

impl<R: Read> Read for Counted<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pending += n as u64;
        if n == 0 || self.pending >= BLOCK as u64 {
            self.flush();
        }
        Ok(n)
    }
}

impl<R> Drop for Counted<'_, R> {
    fn drop(&mut self) {
        self.flush();
    }
}

/// Picks the verdict: the earliest stage's real failure wins.
fn finish<T>(
    plan: &Plan,
    read: Result<(u64, u64)>,
    decoded: Result<(u64, Option<[u8; 32]>)>,
    consumed: Result<T>,
) -> Result<(T, Stats)> {
    let read = match read {
        Err(e) if !is_cancelled(&e) => return Err(e),
        r => r,
    };
    let decoded = match (decoded, &consumed) {
        (Err(e), Err(c)) if !is_cancelled(&e) && code_is(&e, Code::Unsafe) => {
            // The cap tripped while the extractor was inside an entry: its
            // message names that entry, which helps more than a byte count.
            return Err(fail(Code::Unsafe, format!("{c:#}")));
        }
        (Err(e), _) if !is_cancelled(&e) => return Err(e),
        (d, _) => d,
    };
    let value = consumed?;
    // Both stages can only be cancelled if the consumer failed, handled above.
    let (compressed, hashed) = read?;
    let (tar_bytes, digest) = decoded?;
    let tar_sha256 = match (digest, plan.tar_sha256) {
        (Some(d), _) | (None, Some(d)) => hex::encode(&d),
        (None, None) => String::new(),
    };
    Ok((
        value,
        Stats {
            compressed_bytes: compressed,
            tar_bytes,
            tar_sha256,
            tar_hashed: digest.is_some(),
            bytes_hashed: hashed + if digest.is_some() { tar_bytes } else { 0 },
        },
    ))
}

fn code_is(e: &anyhow::Error, code: Code) -> bool {
    e.chain()
        .find_map(|x| x.downcast_ref::<Failure>())
        .is_some_and(|f| f.code == code)
}

/// Reads one piece in blocks, hashing them, and hands each block to `sink`
/// (which returns the buffer if it did not keep it). Checks the size;
/// returns the digest.
fn stream_piece(
    plan: &Plan,
    piece: &Piece,
    src: &mut dyn Read,
    recycle: &Receiver<Vec<u8>>,
    sink: &mut dyn FnMut(Vec<u8>) -> Result<Option<Vec<u8>>>,
) -> Result<[u8; 32]> {
    let what = || format!("chunk {} of {}", piece.file, plan.label);
    let mut hasher = Sha256::new();
    let mut left = piece.size;
    let mut spare: Option<Vec<u8>> = None;
    loop {
        let mut buf = spare.take().unwrap_or_else(|| take_buffer(recycle));
        buf.resize(BLOCK, 0);
        let n =
            fill(src, &mut buf).map_err(|e| anyhow!(e).context(format!("reading {}", what())))?;
        if n == 0 {
            break;
        }
        buf.truncate(n);
        left = left.checked_sub(n as u64).ok_or_else(|| {
            fail(
                Code::Verify,
                format!(
                    "{} is longer than its {} bytes: {}",
                    what(),
                    piece.size,
                    plan.fix
                ),
            )
        })?;
        hasher.update(&buf);
        spare = sink(buf)?;
    }
    if left != 0 {
        return Err(fail(
            Code::Verify,
            format!(
                "{} ends after {} of its {} bytes: {}",
                what(),
                piece.size - left,
                piece.size,
                plan.fix
            ),
        ));
    }
    Ok(hasher.finalize().into())
}

fn mismatch(plan: &Plan, piece: &Piece, got: &[u8; 32], expected: &[u8; 32]) -> anyhow::Error {
    chunk_mismatch(&piece.file, &plan.label, got, expected, &plan.fix)
}

/// A chunk whose bytes do not have the digest the branch declares (exit 6).
pub fn chunk_mismatch(
    file: &str,
    label: &str,
    got: &[u8; 32],
    expected: &[u8; 32],
    fix: &str,
) -> anyhow::Error {
    fail(
        Code::Verify,
        format!(
            "chunk {file} of {label} has sha256 {} but warmstart.json and SHA256SUMS say {}: {fix}",
            hex::encode(got),
            hex::encode(expected),
        ),
    )
}

/// Stage 1: read, hash, check, pass on. Returns the compressed bytes passed
/// on and all bytes hashed.
///
/// v1 (`PerPiece`) reads every chunk twice, streaming, a few MiB at a time:
/// first the chunk is hashed and checked, and only then is it read again,
/// re-hashed, and passed to the decoder; then the next chunk. So a damaged
/// chunk is refused before the decoder sees a byte of it, memory does not
/// grow with the chunk size, and chunk `i + 1` may still be arriving (see
/// `cache::fetch::prefetch`) while chunk `i` is decoded: `open(i)` is called, in
/// order, twice per chunk, and only once chunk `i - 1` was passed on. What
/// the earlier chunks unpacked sits in staging, which the caller removes on
/// any error. The second read re-checks each chunk's digest at its end:
/// cache.git's objects cannot change between the two reads unless someone
/// rewrites them, and if they did, the install is refused (it is still in
/// staging). A piece opened as `checked` (its size and digest were checked
/// by this process as it arrived, `cache::fetch::direct`) is read once: the read
/// that decodes it, which still re-hashes it and refuses it at its end if
/// it changed since.
///
/// Legacy (`Whole`) has one digest over the concatenation of all pieces, so
/// the same two reads span the whole archive: every piece is hashed, in
/// order, and the digest compared with `SHA256SUMS`; only then is every
/// piece opened again, re-hashed and passed on, and the second digest must
/// match too. No byte of a damaged legacy archive reaches the decoder. The
/// caller fetched every part before (`restore::fetch`), so `open` is
/// called `0..n`, then `0..n` again.
fn read_stage(
    plan: &Plan,
    open: &mut Open<'_>,
    on_progress: &(dyn Fn(Phase, u64) + Sync),
    tx: &SyncSender<Msg>,
    recycle: &Receiver<Vec<u8>>,
) -> Result<(u64, u64)> {
    let mut hashed = 0u64;
    if let Check::Whole { archive, sha256 } = &plan.check {
        let mut whole = Sha256::new();
        for (i, piece) in plan.pieces.iter().enumerate() {
            let mut src = open(i)?.reader;
            stream_piece(plan, piece, &mut *src, recycle, &mut |buf| {
                on_progress(Phase::Verified, buf.len() as u64);
                whole.update(&buf);
                Ok(Some(buf))
            })?;
            hashed += piece.size;
        }
        let got: [u8; 32] = whole.finalize().into();
        if got != *sha256 {
            return Err(whole_mismatch(plan, archive, &got, sha256, ""));
        }
    }
    let mut total = 0u64;
    let mut whole = Sha256::new();
    // Set when the next stage hung up (it failed): the current chunk (v1) or
    // the whole archive (legacy) is still hashed to its end, so that damage
    // is reported as such rather than as whatever it decoded to.
    let mut downstream_gone = false;
    for (i, piece) in plan.pieces.iter().enumerate() {
        let checked = if plan.check == Check::PerPiece {
            let expected = piece
                .sha256
                .ok_or_else(|| anyhow!("chunk {} has no digest", piece.file))?;
            let first = open(i)?;
            if first.checked {
                // Hashed as it arrived, by this process.
                on_progress(Phase::Verified, piece.size);
                hashed += piece.size;
                Some(first)
            } else {
                let mut src = first.reader;
                let got = stream_piece(plan, piece, &mut *src, recycle, &mut |buf| {
                    on_progress(Phase::Verified, buf.len() as u64);
                    Ok(Some(buf))
                })?;
                if got != expected {
                    return Err(mismatch(plan, piece, &got, &expected));
                }
                hashed += piece.size;
                None
            }
        } else {
            None
        };
        let mut src = match checked {
            Some(o) => o.reader,
            None => open(i)?.reader,
        };
        // If the next stage hangs up mid-chunk, the chunk is still read to
        // its end: a chunk that changed is reported as such. This second
        // read reports no progress: the consumer's reads of the tar do.
        let whole_digest = matches!(plan.check, Check::Whole { .. });
        let got = stream_piece(plan, piece, &mut *src, recycle, &mut |buf| {
            if whole_digest {
                whole.update(&buf);
            }
            if downstream_gone {
                return Ok(Some(buf));
            }
            if send(tx, buf).is_err() {
                downstream_gone = true;
            }
            Ok(None)
        })?;
        if let Some(expected) = piece.sha256 {
            if got != expected {
                return Err(mismatch(plan, piece, &got, &expected));
            }
            if downstream_gone {
                return Err(anyhow!(Cancelled));
            }
        }
        total += piece.size;
        hashed += piece.size;
        if i == 0 {
            crate::unpack::kill_point("restore:first-chunk-decoding");
        }
    }
    if let Check::Whole { archive, sha256 } = &plan.check {
        // The second read must give the bytes the first one checked: the
        // parts are still in staging only if they changed in between.
        let got: [u8; 32] = whole.finalize().into();
        if got != *sha256 {
            return Err(whole_mismatch(
                plan,
                archive,
                &got,
                sha256,
                " (they changed while being read)",
            ));
        }
        if downstream_gone {
            return Err(anyhow!(Cancelled));
        }
    }
    Ok((total, hashed))
}

/// A legacy archive whose bytes do not have the digest SHA256SUMS gives
/// (exit 6).
fn whole_mismatch(
    plan: &Plan,
    archive: &str,
    got: &[u8; 32],
    expected: &[u8; 32],
    when: &str,
) -> anyhow::Error {
    let what = if plan.pieces.len() == 1 && plan.pieces[0].file == archive {
        format!("{archive} on {} has", plan.label)
    } else {
        format!("the parts of {archive} on {} concatenate to", plan.label)
    };
    fail(
        Code::Verify,
        format!(
            "{what} sha256 {}{when} but SHA256SUMS says {}: {}",
            hex::encode(got),
            hex::encode(expected),
            plan.fix
        ),
    )
}

/// Stage 2: decode, hash and cap the tar stream, pass it on.
fn decode_stage(
    plan: &Plan,
    input: BlockReader,
    tx: &SyncSender<Msg>,
    recycle: &Receiver<Vec<u8>>,
) -> Result<(u64, Option<[u8; 32]>)> {
    let what = match plan.codec {
        Codec::Zstd => "zstd",
        Codec::Gzip => "gzip",
    };
    let mut decoder: Box<dyn Read> = match plan.codec {
        Codec::Zstd => Box::new(
            zstd::stream::read::Decoder::new(input)
                .map_err(|e| anyhow!(e).context("starting the zstd decoder"))?,
        ),
        Codec::Gzip => Box::new(flate2::read::MultiGzDecoder::new(input)),
    };
    let mut hasher = plan.hash_tar.then(Sha256::new);
    let mut total = 0u64;
    loop {
        let mut buf = take_buffer(recycle);
        buf.resize(BLOCK, 0);
        let n = match fill(&mut *decoder, &mut buf) {
            Ok(n) => n,
            Err(e) => {
                return Err(fail(
                    Code::Verify,
                    format!(
                        "the {what} stream of {} does not decode: {e}: {}",
                        plan.label, plan.fix
                    ),
                ));
            }
        };
        if n == 0 {
            break;
        }
        buf.truncate(n);
        total += n as u64;
        if total > plan.tar_cap {
            // Pass on what fits first: the extractor then usually refuses
            // the entry that crosses the cap, and its error names it.
            let fits = n as u64 - (total - plan.tar_cap);
            buf.truncate(fits as usize);
            send(tx, buf)?;
            return Err(fail(
                Code::Unsafe,
                format!(
                    "the tar stream of {} is longer than the {} bytes declared for it",
                    plan.label, plan.tar_cap
                ),
            ));
        }
        if let Some(h) = hasher.as_mut() {
            h.update(&buf);
        }
        send(tx, buf)?;
    }
    let digest: Option<[u8; 32]> = hasher.map(|h| h.finalize().into());
    check_tar(plan, total, digest)?;
    Ok((total, digest))
}

/// The decoded tar's size, and its digest when it was hashed, against what
/// `warmstart.json` declares.
fn check_tar(plan: &Plan, total: u64, digest: Option<[u8; 32]>) -> Result<()> {
    if let Some(size) = plan.tar_size
        && size != total
    {
        return Err(fail(
            Code::Verify,
            format!(
                "the tar stream of {} is {total} bytes but warmstart.json says {size}: {}",
                plan.label, plan.fix
            ),
        ));
    }
    if let (Some(expected), Some(digest)) = (plan.tar_sha256, digest)
        && expected != digest
    {
        return Err(fail(
            Code::Verify,
            format!(
                "the tar stream of {} has sha256 {} but warmstart.json says {}: {}",
                plan.label,
                hex::encode(&digest),
                hex::encode(&expected),
                plan.fix
            ),
        ));
    }
    Ok(())
}

/// Independent frames decoded on several cores (`Plan::frames`): a key
/// whose every chunk is its own zstd frame can decode chunk `i + 1` while
/// chunk `i` is still being decoded, on another core.
///
/// The reader reads each chunk whole into memory, hashing it, and hands it
/// to a decoder only once its sha256 matched (DESIGN.md invariant 1: the
/// bytes a decoder sees are the very bytes that were hashed, so the
/// streaming path's second read is not needed). Decoders inflate whole
/// frames, each into at most its declared `raw_size` bytes; the emitter
/// puts the decoded chunks back in order, caps and (with `Plan::hash_tar`)
/// hashes the tar in order, and passes it to the consumer. Memory stays
/// bounded: at most `Flight::window` chunks are between the reader and the
/// emitter, each at most its compressed plus its decoded size, within
/// `BUDGET` (a plan whose chunks are too big for it decodes one stream).
mod framed {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::{Condvar, Mutex};

    /// What the chunks in flight may hold, compressed and decoded, at most.
    pub(super) const BUDGET: u64 = 160 << 20;
    /// Decoders at most, whatever the core count.
    const MAX_WORKERS: usize = 4;

    /// How many decoders, and how many chunks may be in flight.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(super) struct Flight {
        pub workers: usize,
        pub window: usize,
    }

    /// The flight of a framed plan, or `None` for the one-stream path: no
    /// frames, a legacy archive, or chunks too big for `BUDGET`.
    pub(super) fn workers(plan: &Plan) -> Option<Flight> {
        let raws = plan.frames.as_ref()?;
        if plan.check != Check::PerPiece
            || plan.codec != Codec::Zstd
            || raws.len() != plan.pieces.len()
        {
            return None;
        }
        let biggest = plan.pieces.iter().map(|p| p.size).max().unwrap_or(0);
        let per = biggest + raws.iter().copied().max().unwrap_or(0);
        if per == 0 || per > BUDGET / 2 {
            return None;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = cores.clamp(1, MAX_WORKERS);
        let window = ((BUDGET / per) as usize).clamp(2, workers + 2);
        Some(Flight { workers, window })
    }

    /// How far the emitter got, so that the reader stays within the
    /// window; `stop` when a stage failed.
    struct Gate {
        state: Mutex<(usize, bool)>,
        moved: Condvar,
    }

    impl Gate {
        fn lock(&self) -> std::sync::MutexGuard<'_, (usize, bool)> {
            self.state.lock().unwrap_or_else(|p| p.into_inner())
        }

        /// Waits until chunk `i` fits in the window; `Cancelled` on stop.
        fn enter(&self, i: usize, window: usize) -> Result<()> {
            let mut st = self.lock();
            loop {
                if st.1 {
                    return Err(anyhow!(Cancelled));
                }
                if i < st.0 + window {
                    return Ok(());
                }
                st = self.moved.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        }

        fn emitted(&self, n: usize) {
            self.lock().0 = n;
            self.moved.notify_all();
        }

        fn stop(&self) {
            self.lock().1 = true;
            self.moved.notify_all();
        }

        fn stopped(&self) -> bool {
            self.lock().1
        }
    }

    /// What the read stage returns: compressed bytes passed on, all hashed.
    type ReadResult = Result<(u64, u64)>;
    /// What the decode stage returns: tar bytes, and their digest if hashed.
    type Decoded = Result<(u64, Option<[u8; 32]>)>;

    /// Reads, checks, decodes and emits the whole plan into `tx`: the
    /// results of the read and the decode, as `finish` takes them.
    pub(super) fn produce(
        plan: &Plan,
        f: Flight,
        open: &mut Open<'_>,
        on_progress: &(dyn Fn(Phase, u64) + Sync),
        tx: &SyncSender<Msg>,
        recycle: &Receiver<Vec<u8>>,
    ) -> (ReadResult, Decoded) {
        let gate = Gate {
            state: Mutex::new((0, false)),
            moved: Condvar::new(),
        };
        let (work_tx, work_rx) = sync_channel::<(usize, Vec<u8>)>(f.window);
        let work_rx = Mutex::new(work_rx);
        let (done_tx, done_rx) = channel::<(usize, Result<Vec<u8>>)>();
        std::thread::scope(|s| {
            let gate = &gate;
            let reader = s.spawn(move || {
                let r = read_chunks(plan, f.window, open, on_progress, gate, work_tx);
                if r.is_err() {
                    gate.stop();
                }
                r
            });
            for _ in 0..f.workers {
                let (done_tx, work_rx) = (done_tx.clone(), &work_rx);
                s.spawn(move || decode_frames(plan, work_rx, &done_tx));
            }
            drop(done_tx);
            let emitted = emit(plan, &done_rx, gate, tx, recycle);
            if emitted.is_err() {
                gate.stop();
            }
            drop(done_rx);
            let read = reader.join().expect("read stage panicked");
            let decoded = emitted.map_err(|e| match (&read, is_cancelled(&e)) {
                // An earlier stage failed: the consumer must not take the
                // end of the stream for the end of the tar.
                (Err(_), true) => {
                    let _ = tx.send(Msg::Failed("an earlier stage failed".into()));
                    e
                }
                _ => failed(tx, e),
            });
            (read, decoded)
        })
    }

    /// Stage 1: each chunk read whole, hashed and checked, then handed to
    /// the decoders, in order, within the window.
    fn read_chunks(
        plan: &Plan,
        window: usize,
        open: &mut Open<'_>,
        on_progress: &(dyn Fn(Phase, u64) + Sync),
        gate: &Gate,
        work: SyncSender<(usize, Vec<u8>)>,
    ) -> Result<(u64, u64)> {
        let mut total = 0u64;
        for (i, piece) in plan.pieces.iter().enumerate() {
            gate.enter(i, window)?;
            let expected = piece
                .sha256
                .ok_or_else(|| anyhow!("chunk {} has no digest", piece.file))?;
            let mut src = open(i)?.reader;
            let (data, got) = read_whole(plan, piece, &mut *src)?;
            if got != expected {
                return Err(mismatch(plan, piece, &got, &expected));
            }
            on_progress(Phase::Verified, piece.size);
            total += piece.size;
            work.send((i, data)).map_err(|_| anyhow!(Cancelled))?;
        }
        Ok((total, total))
    }

    /// A piece, whole, and its sha256; refused if it is not its size.
    fn read_whole(plan: &Plan, piece: &Piece, src: &mut dyn Read) -> Result<(Vec<u8>, [u8; 32])> {
        let what = || format!("chunk {} of {}", piece.file, plan.label);
        let mut data = Vec::with_capacity(piece.size as usize);
        src.take(piece.size + 1)
            .read_to_end(&mut data)
            .map_err(|e| anyhow!(e).context(format!("reading {}", what())))?;
        let n = data.len() as u64;
        if n > piece.size {
            return Err(fail(
                Code::Verify,
                format!(
                    "{} is longer than its {} bytes: {}",
                    what(),
                    piece.size,
                    plan.fix
                ),
            ));
        }
        if n < piece.size {
            return Err(fail(
                Code::Verify,
                format!(
                    "{} ends after {n} of its {} bytes: {}",
                    what(),
                    piece.size,
                    plan.fix
                ),
            ));
        }
        let digest: [u8; 32] = Sha256::digest(&data).into();
        Ok((data, digest))
    }

    /// Stage 2, on each worker: whole frames into their declared sizes.
    fn decode_frames(
        plan: &Plan,
        work: &Mutex<Receiver<(usize, Vec<u8>)>>,
        done: &Sender<(usize, Result<Vec<u8>>)>,
    ) {
        let raws = plan.frames.as_ref().expect("a framed plan");
        let Ok(mut z) = zstd::bulk::Decompressor::new() else {
            return;
        };
        loop {
            let job = work.lock().unwrap_or_else(|p| p.into_inner()).recv();
            let Ok((i, data)) = job else { return };
            let piece = &plan.pieces[i];
            let raw = raws[i];
            let out = match z.decompress(&data, raw as usize) {
                Ok(out) if out.len() as u64 == raw => Ok(out),
                Ok(out) => Err(fail(
                    Code::Verify,
                    format!(
                        "chunk {} of {} decodes to {} bytes but warmstart.json says {raw}: {}",
                        piece.file,
                        plan.label,
                        out.len(),
                        plan.fix
                    ),
                )),
                Err(e) => Err(fail(
                    Code::Verify,
                    format!(
                        "chunk {} of {} does not decode as one zstd frame of {raw} bytes ({e}): {}",
                        piece.file, plan.label, plan.fix
                    ),
                )),
            };
            drop(data);
            if done.send((i, out)).is_err() {
                return;
            }
        }
    }

    /// Stage 3: the decoded chunks in order, capped and hashed, into `tx`.
    fn emit(
        plan: &Plan,
        done: &Receiver<(usize, Result<Vec<u8>>)>,
        gate: &Gate,
        tx: &SyncSender<Msg>,
        recycle: &Receiver<Vec<u8>>,
    ) -> Result<(u64, Option<[u8; 32]>)> {
        let mut waiting: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        let mut hasher = plan.hash_tar.then(Sha256::new);
        let (mut next, mut total) = (0usize, 0u64);
        while next < plan.pieces.len() {
            let Ok((i, out)) = done.recv() else {
                // Every decoder is gone: a stage before failed.
                return Err(match gate.stopped() {
                    true => anyhow!(Cancelled),
                    false => anyhow!("the zstd decoders stopped early"),
                });
            };
            waiting.insert(i, out?);
            while let Some(raw) = waiting.remove(&next) {
                total += raw.len() as u64;
                if total > plan.tar_cap {
                    // What fits first, as `decode_stage` does.
                    let fits = raw.len() - (total - plan.tar_cap) as usize;
                    pass_on(&raw[..fits], tx, recycle)?;
                    return Err(fail(
                        Code::Unsafe,
                        format!(
                            "the tar stream of {} is longer than the {} bytes declared for it",
                            plan.label, plan.tar_cap
                        ),
                    ));
                }
                if let Some(h) = hasher.as_mut() {
                    h.update(&raw);
                }
                pass_on(&raw, tx, recycle)?;
                next += 1;
                gate.emitted(next);
                if next == 1 {
                    crate::unpack::kill_point("restore:first-chunk-decoding");
                }
            }
        }
        let digest: Option<[u8; 32]> = hasher.map(|h| h.finalize().into());
        check_tar(plan, total, digest)?;
        Ok((total, digest))
    }

    /// `raw` to the consumer in blocks of at most `BLOCK` bytes.
    fn pass_on(raw: &[u8], tx: &SyncSender<Msg>, recycle: &Receiver<Vec<u8>>) -> Result<()> {
        for piece in raw.chunks(BLOCK) {
            let mut buf = take_buffer(recycle);
            buf.clear();
            buf.extend_from_slice(piece);
            send(tx, buf)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::code_of;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Reads `r` to its end, counting in `seen` what the consumer saw.
    fn drain_counting(r: &mut dyn Read, seen: &std::sync::atomic::AtomicU64) -> Result<()> {
        let mut buf = [0u8; 4096];
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                return Ok(());
            }
            seen.fetch_add(n as u64, Ordering::Relaxed);
        }
    }

    fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// A v1 plan over `tar` compressed with zstd and cut into `parts` pieces.
    fn v1(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
        let z = zstd::encode_all(tar, 3).unwrap();
        let step = z.len().div_ceil(parts);
        let chunks: Vec<Vec<u8>> = z.chunks(step).map(<[u8]>::to_vec).collect();
        let pieces = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| Piece {
                file: format!("k.tar.zst.part{i:03}"),
                size: c.len() as u64,
                sha256: Some(Sha256::digest(c).into()),
            })
            .collect();
        let plan = Plan {
            label: "key k on branch b".into(),
            fix: "republish".into(),
            pieces,
            check: Check::PerPiece,
            codec: Codec::Zstd,
            tar_sha256: Some(Sha256::digest(tar).into()),
            tar_size: Some(tar.len() as u64),
            tar_cap: tar.len() as u64,
            hash_tar: true,
            frames: None,
        };
        (plan, chunks)
    }

    fn run(plan: &Plan, chunks: &[Vec<u8>]) -> Result<(Vec<u8>, Stats)> {
        let chunks = chunks.to_vec();
        let mut open = move |i: usize| -> Result<Opened> {
            Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
        };
        stream(plan, &mut open, &|_, _| {}, |r| {
            let mut out = Vec::new();
            r.read_to_end(&mut out)?;
            Ok(out)
        })
    }

    fn big_tar() -> Vec<u8> {
        // Incompressible enough to make several chunks.
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        tar_of(&[("a", b"hello"), ("b/c", &data)])
    }

    #[test]
    fn verified_stream_decodes_to_the_tar() {
        let tar = big_tar();
        let (plan, chunks) = v1(&tar, 4);
        let (out, stats) = run(&plan, &chunks).unwrap();
        assert_eq!(out, tar);
        assert_eq!(stats.tar_bytes, tar.len() as u64);
        assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
        let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(stats.compressed_bytes, compressed);
        // Every chunk is hashed twice (verify pass, decode pass), the tar once.
        assert_eq!(stats.bytes_hashed, 2 * compressed + tar.len() as u64);
        let totals = plan.progress_totals();
        assert_eq!(totals.compressed, compressed);
        assert_eq!(totals.tar, Some(tar.len() as u64));
    }

    /// Streams `plan` with each chunk opened `checked` or not, and returns
    /// the bytes reported per phase.
    fn reported(plan: &Plan, chunks: &[Vec<u8>], checked: bool) -> (u64, u64) {
        use std::sync::atomic::AtomicU64;
        let (verified, unpacked) = (AtomicU64::new(0), AtomicU64::new(0));
        let chunks = chunks.to_vec();
        let mut open = move |i: usize| -> Result<Opened> {
            Ok(Opened {
                reader: Box::new(io::Cursor::new(chunks[i].clone())),
                checked,
            })
        };
        let on = |phase: Phase, n: u64| {
            let counter = match phase {
                Phase::Verified => &verified,
                Phase::Unpacked => &unpacked,
            };
            counter.fetch_add(n, Ordering::Relaxed);
        };
        stream(plan, &mut open, &on, |r| {
            // Read in odd-sized bites, as an extractor does.
            let mut buf = [0u8; 7919];
            while r.read(&mut buf)? > 0 {}
            Ok(())
        })
        .unwrap();
        (verified.into_inner(), unpacked.into_inner())
    }

    /// Regression: the restore bar counted every chunk twice (its total was
    /// twice the download, and so was its rate). Each phase now reports
    /// each of its bytes once, adding up to the totals the bars are given,
    /// for v1 chunks (checked on arrival or not) and legacy parts.
    #[test]
    fn progress_counts_each_compressed_and_each_tar_byte_once() {
        let tar = big_tar();
        for parts in [1, 4] {
            let (plan, chunks) = v1(&tar, parts);
            let totals = plan.progress_totals();
            let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
            assert_eq!(totals.compressed, compressed);
            assert_eq!(totals.tar, Some(tar.len() as u64));
            for checked in [false, true] {
                let got = reported(&plan, &chunks, checked);
                assert_eq!(got, (compressed, tar.len() as u64), "{parts} {checked}");
            }
        }
        let (plan, chunks) = legacy(&tar, 3);
        let totals = plan.progress_totals();
        let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
        assert_eq!(
            totals,
            Totals {
                compressed,
                tar: None
            }
        );
        assert_eq!(
            reported(&plan, &chunks, false),
            (compressed, tar.len() as u64)
        );
    }

    #[test]
    fn a_flipped_byte_in_any_chunk_is_refused_before_the_decoder_sees_a_byte_of_it() {
        use std::sync::atomic::AtomicU64;
        let tar = big_tar();
        for bad in 0..4 {
            let (plan, mut chunks) = v1(&tar, 4);
            chunks[bad][10] ^= 1;
            let seen = AtomicU64::new(0);
            // How often each chunk was opened, in which order.
            let opens: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
            let order = std::sync::Mutex::new(Vec::new());
            let mut open = |i: usize| -> Result<Opened> {
                opens[i].fetch_add(1, Ordering::SeqCst);
                order.lock().unwrap().push(i);
                Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
            };
            let err =
                stream(&plan, &mut open, &|_, _| {}, |r| drain_counting(r, &seen)).unwrap_err();
            assert_eq!(code_of(&err), Code::Verify, "{err:#}");
            let msg = format!("{err:#}");
            assert!(msg.contains(&format!("k.tar.zst.part00{bad}")), "{msg}");
            assert!(msg.contains("republish"), "{msg}");
            // The damaged chunk was read once, to hash it, and never again
            // (the second read is the one that feeds the decoder); the
            // chunks after it were never opened.
            assert_eq!(opens[bad].load(Ordering::SeqCst), 1, "chunk {bad}");
            for (later, n) in opens.iter().enumerate().skip(bad + 1) {
                assert_eq!(n.load(Ordering::SeqCst), 0, "chunk {later}");
            }
            // Each chunk before it: hashed, then passed on, in order.
            let expected: Vec<usize> = (0..bad).flat_map(|i| [i, i]).chain([bad]).collect();
            assert_eq!(*order.lock().unwrap(), expected);
            if bad == 0 {
                assert_eq!(seen.load(Ordering::Relaxed), 0, "the consumer saw bytes");
            }
        }
    }

    #[test]
    fn a_chunk_that_changes_between_the_two_reads_is_refused() {
        let tar = big_tar();
        let (plan, chunks) = v1(&tar, 3);
        let opened = std::sync::atomic::AtomicUsize::new(0);
        let mut open = move |i: usize| -> Result<Opened> {
            let mut c = chunks[i].clone();
            // The second time chunk 1 is opened, it reads differently.
            if i == 1 && opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                c[0] ^= 1;
            }
            Ok(Opened::unchecked(io::Cursor::new(c)))
        };
        let err = stream(&plan, &mut open, &|_, _| {}, |r| {
            io::copy(r, &mut io::sink())?;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "{err:#}");
        assert!(format!("{err:#}").contains("part001"), "{err:#}");
    }

    #[test]
    fn a_checked_chunk_is_read_once_and_still_rehashed() {
        let tar = big_tar();
        let (plan, chunks) = v1(&tar, 3);
        let opens: Vec<AtomicUsize> = (0..3).map(|_| AtomicUsize::new(0)).collect();
        let run_with = |damage: bool| {
            for o in &opens {
                o.store(0, Ordering::SeqCst);
            }
            let chunks = chunks.clone();
            let mut open = |i: usize| -> Result<Opened> {
                opens[i].fetch_add(1, Ordering::SeqCst);
                let mut c = chunks[i].clone();
                if damage && i == 1 {
                    // Changed after it was checked.
                    c[3] ^= 1;
                }
                Ok(Opened {
                    reader: Box::new(io::Cursor::new(c)),
                    checked: i != 0,
                })
            };
            stream(&plan, &mut open, &|_, _| {}, |r| {
                let mut v = Vec::new();
                r.read_to_end(&mut v)?;
                Ok(v)
            })
        };
        let (out, stats) = run_with(false).unwrap();
        assert_eq!(out, tar);
        let opened: Vec<usize> = opens.iter().map(|o| o.load(Ordering::SeqCst)).collect();
        assert_eq!(opened, vec![2, 1, 1]);
        // Checked chunks count as hashed twice: once as they arrived.
        assert!(stats.tar_hashed);
        assert_eq!(
            stats.bytes_hashed,
            2 * stats.compressed_bytes + stats.tar_bytes
        );
        let err = run_with(true).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Verify, "{err:#}");
        assert!(format!("{err}").contains("has sha256"), "{err:#}");
    }

    #[test]
    fn a_truncated_or_long_chunk_is_refused() {
        let tar = big_tar();
        let (plan, mut chunks) = v1(&tar, 3);
        chunks[1].pop();
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify);
        assert!(format!("{err:#}").contains("part001 of key k on branch b ends after"));
        let (plan, mut chunks) = v1(&tar, 3);
        chunks[0].push(0);
        let err = run(&plan, &chunks).unwrap_err();
        assert!(format!("{err:#}").contains("longer than"), "{err:#}");
    }

    #[test]
    fn a_wrong_tar_digest_or_size_is_refused() {
        let tar = big_tar();
        let (mut plan, chunks) = v1(&tar, 2);
        plan.tar_sha256 = Some([7; 32]);
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify);
        assert!(
            format!("{err:#}").contains("the tar stream of key k"),
            "{err:#}"
        );
        let (mut plan, chunks) = v1(&tar, 2);
        plan.tar_size = Some(tar.len() as u64 + 512);
        plan.tar_cap = tar.len() as u64 + 512;
        assert!(
            format!("{:#}", run(&plan, &chunks).unwrap_err()).contains("but warmstart.json says")
        );
        // Without the tar hash the size is still checked.
        plan.hash_tar = false;
        assert!(
            format!("{:#}", run(&plan, &chunks).unwrap_err()).contains("but warmstart.json says")
        );
    }

    #[test]
    fn without_the_tar_hash_the_declared_digest_is_reported() {
        let tar = big_tar();
        let (mut plan, chunks) = v1(&tar, 3);
        let (_, hashed) = run(&plan, &chunks).unwrap();
        assert!(hashed.tar_hashed);
        plan.hash_tar = false;
        let (out, trusted) = run(&plan, &chunks).unwrap();
        assert_eq!(out, tar);
        assert!(!trusted.tar_hashed);
        assert_eq!(trusted.tar_sha256, hashed.tar_sha256);
        assert_eq!(trusted.bytes_hashed + tar.len() as u64, hashed.bytes_hashed);
        // The chunks are still checked before the decoder sees them.
        let mut bad = chunks.clone();
        bad[1][0] ^= 1;
        assert_eq!(code_of(&run(&plan, &bad).unwrap_err()), Code::Verify);
    }

    #[test]
    fn more_bytes_than_declared_are_refused_as_unsafe() {
        let tar = big_tar();
        let (mut plan, chunks) = v1(&tar, 2);
        plan.tar_cap = 4096;
        plan.tar_size = Some(4096);
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Unsafe, "{err:#}");
    }

    #[test]
    fn oversized_chunks_are_refused_before_reading() {
        let tar = big_tar();
        let (mut plan, chunks) = v1(&tar, 2);
        plan.pieces[0].size = MAX_CHUNK_BYTES + 1;
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify);
    }

    fn legacy(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        io::Write::write_all(&mut gz, tar).unwrap();
        let z = gz.finish().unwrap();
        let step = z.len().div_ceil(parts);
        let chunks: Vec<Vec<u8>> = z.chunks(step).map(<[u8]>::to_vec).collect();
        let pieces = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| Piece {
                file: format!("cache.tar.gz.part{i:02}"),
                size: c.len() as u64,
                sha256: None,
            })
            .collect();
        let plan = Plan {
            label: "branch b".into(),
            fix: "re-seed it".into(),
            pieces,
            check: Check::Whole {
                archive: "cache.tar.gz".into(),
                sha256: Sha256::digest(&z).into(),
            },
            codec: Codec::Gzip,
            tar_sha256: None,
            tar_size: None,
            tar_cap: 1 << 30,
            hash_tar: true,
            frames: None,
        };
        (plan, chunks)
    }

    #[test]
    fn legacy_archives_check_the_whole_digest_before_the_decoder_sees_a_byte() {
        let tar = big_tar();
        for parts in [1, 3] {
            let (plan, chunks) = legacy(&tar, parts);
            let (out, stats) = run(&plan, &chunks).unwrap();
            assert_eq!(out, tar);
            assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
            let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
            assert_eq!(plan.progress_totals().compressed, compressed);
            // A flipped byte anywhere, even in the last part or the gzip
            // trailer: refused, and the consumer never saw a byte. Offsets
            // from a small deterministic PRNG, plus both ends of each part.
            let mut rng = 0x2545_f491_4f6c_dd1du64;
            let mut flips: Vec<(usize, usize)> = Vec::new();
            for (bad, c) in chunks.iter().enumerate() {
                let n = c.len();
                flips.extend([(bad, 0), (bad, n - 1), (bad, n / 2)]);
            }
            for _ in 0..40 {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let bad = (rng % parts as u64) as usize;
                flips.push((bad, (rng >> 20) as usize % chunks[bad].len()));
            }
            for (bad, at) in flips {
                let (plan, mut chunks) = legacy(&tar, parts);
                chunks[bad][at] ^= 0xff;
                let seen = AtomicUsize::new(0);
                let chunks2 = chunks.clone();
                let mut open = move |i: usize| -> Result<Opened> {
                    Ok(Opened::unchecked(io::Cursor::new(chunks2[i].clone())))
                };
                let err = stream(&plan, &mut open, &|_, _| {}, |r| {
                    let mut buf = [0u8; 4096];
                    loop {
                        let n = r.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                        seen.fetch_add(n, Ordering::Relaxed);
                    }
                })
                .unwrap_err();
                assert_eq!(code_of(&err), Code::Verify, "{err:#}");
                let msg = format!("{err:#}");
                assert!(msg.contains("cache.tar.gz"), "{msg}");
                assert!(msg.contains("SHA256SUMS"), "{msg}");
                assert_eq!(seen.load(Ordering::Relaxed), 0, "the consumer saw bytes");
            }
        }
    }

    #[test]
    fn a_legacy_part_that_changes_between_the_two_reads_is_refused() {
        let tar = big_tar();
        let (plan, chunks) = legacy(&tar, 2);
        let opened = AtomicUsize::new(0);
        let mut open = move |i: usize| -> Result<Opened> {
            let mut c = chunks[i].clone();
            if i == 1 && opened.fetch_add(1, Ordering::SeqCst) > 0 {
                let n = c.len();
                c[n - 1] ^= 1;
            }
            Ok(Opened::unchecked(io::Cursor::new(c)))
        };
        let err = stream(&plan, &mut open, &|_, _| {}, |r| {
            io::copy(r, &mut io::sink())?;
            Ok(())
        })
        .unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "{err:#}");
        assert!(
            format!("{err:#}").contains("changed while being read"),
            "{err:#}"
        );
    }

    #[test]
    fn a_consumer_failure_is_reported_as_is() {
        let tar = big_tar();
        let (plan, chunks) = v1(&tar, 4);
        let chunks = chunks.to_vec();
        let mut open = move |i: usize| -> Result<Opened> {
            Ok(Opened::unchecked(io::Cursor::new(chunks[i].clone())))
        };
        let err = stream(&plan, &mut open, &|_, _| {}, |_r| -> Result<()> {
            Err(fail(Code::Unsafe, "refusing tar entry `x`"))
        })
        .unwrap_err();
        assert_eq!(code_of(&err), Code::Unsafe);
        assert_eq!(format!("{err:#}"), "refusing tar entry `x`");
    }

    /// A framed v1 plan: `tar` cut into `parts` slices, each compressed as
    /// its own zstd frame (as a publisher with `frames` writes them).
    fn framed_v1(tar: &[u8], parts: usize) -> (Plan, Vec<Vec<u8>>) {
        let step = tar.len().div_ceil(parts);
        let raws: Vec<&[u8]> = tar.chunks(step).collect();
        let chunks: Vec<Vec<u8>> = raws
            .iter()
            .map(|r| zstd::encode_all(*r, 3).unwrap())
            .collect();
        let (mut plan, _) = v1(tar, parts);
        plan.pieces = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| Piece {
                file: format!("k.tar.zst.part{i:03}"),
                size: c.len() as u64,
                sha256: Some(Sha256::digest(c).into()),
            })
            .collect();
        plan.frames = Some(raws.iter().map(|r| r.len() as u64).collect());
        (plan, chunks)
    }

    #[test]
    fn framed_chunks_decode_in_parallel_to_the_tar_in_order() {
        let tar = big_tar();
        for parts in [1, 2, 7, 13] {
            let (mut plan, chunks) = framed_v1(&tar, parts);
            assert!(framed::workers(&plan).is_some());
            let (out, stats) = run(&plan, &chunks).unwrap();
            assert!(out == tar, "{parts} parts");
            let compressed: u64 = chunks.iter().map(|c| c.len() as u64).sum();
            assert_eq!(stats.compressed_bytes, compressed);
            assert_eq!(stats.tar_sha256, hex::encode(&Sha256::digest(&tar)));
            // Each chunk is read and hashed once (held in memory between
            // the check and the decoder), the tar once.
            assert_eq!(stats.bytes_hashed, compressed + tar.len() as u64);
            assert_eq!(
                reported(&plan, &chunks, false),
                (compressed, tar.len() as u64)
            );
            plan.hash_tar = false;
            let (out, stats) = run(&plan, &chunks).unwrap();
            assert!(out == tar && !stats.tar_hashed);
        }
    }

    #[test]
    fn framed_flights_stay_within_the_memory_budget() {
        let tar = big_tar();
        let (mut plan, _) = framed_v1(&tar, 4);
        let f = framed::workers(&plan).unwrap();
        assert!(f.workers >= 1 && f.window >= 2);
        // Chunks of 16 MiB decoding to 16 MiB: a few in flight, within it.
        for p in &mut plan.pieces {
            p.size = 16 << 20;
        }
        plan.frames = Some(vec![16 << 20; 4]);
        let f = framed::workers(&plan).unwrap();
        assert!(f.window as u64 * (32 << 20) <= framed::BUDGET, "{f:?}");
        // Too big for the budget, a legacy archive, no frames: one stream.
        plan.frames = Some(vec![99 << 20; 4]);
        assert_eq!(framed::workers(&plan), None);
        let (legacy, _) = legacy(&tar, 2);
        assert_eq!(framed::workers(&legacy), None);
        let (plain, _) = v1(&tar, 2);
        assert_eq!(framed::workers(&plain), None);
    }

    /// Property: a flipped byte anywhere in any chunk of a framed plan is
    /// refused (exit 6, naming the chunk), no chunk after it is opened, and
    /// the consumer never sees a byte of the damaged chunk's slice of the
    /// tar, whatever was decoded in parallel before it.
    #[test]
    fn framed_a_damaged_chunk_is_refused_before_any_decoder_sees_it() {
        use std::sync::atomic::AtomicU64;
        let tar = big_tar();
        let parts = 9;
        let (plan, good) = framed_v1(&tar, parts);
        let raws = plan.frames.clone().unwrap();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        for case in 0..60 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let bad = if case < parts {
                case
            } else {
                (rng % parts as u64) as usize
            };
            let at = (rng >> 24) as usize % good[bad].len();
            let mut chunks = good.clone();
            chunks[bad][at] ^= 1 << (rng % 8);
            let opens: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
            let seen = AtomicU64::new(0);
            let mut open = |i: usize| -> Result<Opened> {
                opens[i].fetch_add(1, Ordering::SeqCst);
                Ok(Opened {
                    reader: Box::new(io::Cursor::new(chunks[i].clone())),
                    checked: case % 2 == 0,
                })
            };
            let err =
                stream(&plan, &mut open, &|_, _| {}, |r| drain_counting(r, &seen)).unwrap_err();
            assert_eq!(code_of(&err), Code::Verify, "case {case}: {err:#}");
            let msg = format!("{err:#}");
            assert!(
                msg.contains(&format!("part{bad:03}")) && msg.contains("has sha256"),
                "{msg}"
            );
            for (later, n) in opens.iter().enumerate().skip(bad + 1) {
                assert_eq!(
                    n.load(Ordering::SeqCst),
                    0,
                    "case {case}: chunk {later} opened"
                );
            }
            let before: u64 = raws[..bad].iter().sum();
            assert!(seen.load(Ordering::Relaxed) <= before, "case {case}");
        }
    }

    #[test]
    fn framed_a_frame_of_another_size_than_declared_is_refused() {
        let tar = big_tar();
        let (mut plan, chunks) = framed_v1(&tar, 4);
        let raws = plan.frames.as_mut().unwrap();
        raws[1] -= 1;
        raws[2] += 1;
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "{err:#}");
        // Both frames are wrong and decode on different cores: whichever
        // finishes first is named.
        let err = format!("{err:#}");
        assert!(err.contains("part001") || err.contains("part002"), "{err}");
        assert!(
            err.contains("decodes to") || err.contains("does not decode as one zstd frame"),
            "{err}"
        );
        // A truncated chunk whose digest matches what the branch says
        // (a publisher that cut a frame short) does not decode.
        let (mut plan, mut chunks) = framed_v1(&tar, 4);
        let cut = chunks[3].len() - 4;
        chunks[3].truncate(cut);
        plan.pieces[3].size = chunks[3].len() as u64;
        plan.pieces[3].sha256 = Some(Sha256::digest(&chunks[3]).into());
        let err = run(&plan, &chunks).unwrap_err();
        assert_eq!(code_of(&err), Code::Verify, "{err:#}");
        assert!(format!("{err:#}").contains("part003"), "{err:#}");
        // More tar than the cap: exit 7, as the one-stream path says.
        let (mut plan, chunks) = framed_v1(&tar, 4);
        plan.tar_cap = 4096;
        plan.tar_size = Some(4096);
        assert_eq!(code_of(&run(&plan, &chunks).unwrap_err()), Code::Unsafe);
    }

    #[test]
    fn digests_parse() {
        let d = parse_digest(&"ab".repeat(32)).unwrap();
        assert_eq!(d, [0xab; 32]);
        assert!(parse_digest("zz").is_err());
        assert!(parse_digest(&"g".repeat(64)).is_err());
    }
}
