//! Verified streaming: chunk bytes reach the decoder only after their sha256
//! matched, and the decoded tar is hashed and size-capped on its way out.
//!
//! Three stages run at once, joined by bounded channels of 1 MiB blocks
//! (memory stays at a few MiB, whatever the artifact's or a chunk's size):
//! 1. *read*: first hashes every chunk, streaming, and refuses the whole
//!    restore if any digest differs from `warmstart.json` (docs/format.md, restore
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

mod decode;
mod framed;
mod pipe;
mod read;
#[cfg(test)]
mod tests;

use decode::{TarTally, decode_stage};
use pipe::{BlockReader, Cancelled, Msg, failed, fill, is_cancelled, send, take_buffer};
pub use read::chunk_mismatch;
use read::{mismatch, read_stage, stream_piece};

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
