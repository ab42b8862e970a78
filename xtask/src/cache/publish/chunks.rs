//! Content-defined chunks of the tar, each compressed as its own zstd frame, on all cores.
//!
//! The uncompressed tar stream is cut by FastCDC (the 2020 variant of the
//! `fastcdc` crate: its gear hash and masks, our buffer), so that a change
//! early in the tar moves only the cuts near it: the chunks after it are the
//! same bytes as before, compress to the same frames, and become the same
//! git blobs, which git neither stores nor sends again. Each chunk is one
//! zstd frame made with every parameter set explicitly and single-threaded
//! (zstd's multithreaded mode cuts its own jobs, so its output may differ),
//! so the same bytes always give the same frame for one zstd version; the
//! concatenation of frames is one valid zstd stream, so `cat parts | zstd
//! -d` still restores.
//!
//! Workers compress in parallel; finished frames are handed over in chunk
//! order. Memory is bounded whatever the artifact: the cut buffer holds at
//! most two maximum chunks, and at most `2 * workers` chunks (and at most
//! `IN_FLIGHT_BYTES` of them) are being compressed or wait to be handed over.

use anyhow::{Context, Result, anyhow, bail};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::sync::{Arc, Mutex, mpsc};

use crate::cache::format::chunk_sizes::{MIN_AVG, Sizes};
use crate::cache::format::{CHUNKER, Frames};
use crate::hex;

/// Uncompressed bytes of chunks being compressed or waiting to be handed
/// over, at most (one chunk is always allowed, whatever its size).
pub const IN_FLIGHT_BYTES: u64 = 128 << 20;

/// The zstd parameters of every frame, all pinned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Params {
    pub level: i32,
    /// Set explicitly when given; else the level's default for the chunk size.
    pub window_log: Option<u32>,
}

impl Params {
    /// A compressor with every parameter that decides the frame bytes set:
    /// level, window, one thread (no zstdmt jobs), no long-distance
    /// matching, checksum and content size in the header, no dictionary id.
    fn compressor(&self) -> Result<zstd::bulk::Compressor<'static>> {
        use zstd::zstd_safe::CParameter as P;
        let mut z = zstd::bulk::Compressor::new(self.level).context("starting zstd")?;
        let mut params = vec![
            P::CompressionLevel(self.level),
            P::NbWorkers(0),
            P::EnableLongDistanceMatching(false),
            P::ChecksumFlag(true),
            P::ContentSizeFlag(true),
            P::DictIdFlag(false),
        ];
        if let Some(w) = self.window_log {
            params.push(P::WindowLog(w));
        }
        for p in params {
            z.set_parameter(p)
                .with_context(|| format!("setting zstd parameter {p:?}"))?;
        }
        Ok(z)
    }

    /// What `warmstart.json` records of these parameters and `sizes`.
    pub fn frames(&self, sizes: Sizes) -> Frames {
        Frames {
            chunker: CHUNKER.into(),
            min_size: sizes.min,
            avg_size: sizes.avg,
            max_size: sizes.max,
            zstd: zstd::zstd_safe::version_string().to_string(),
            level: self.level,
            window_log: self.window_log,
            checksum: true,
        }
    }
}

/// Earlier frames a publish may hand over instead of compressing again:
/// given the sha256 (hex) of a chunk's raw bytes, the bytes of a frame
/// made from such a chunk with the same parameters, if one is at hand.
/// They are used only when they decode to exactly the chunk's bytes.
pub type Reuse<'a> = &'a (dyn Fn(&str) -> Option<Vec<u8>> + Sync);

/// No earlier frames.
pub fn no_reuse(_: &str) -> Option<Vec<u8>> {
    None
}

/// Chunks this clone made before and still holds as blobs, which the
/// cutter hands over without cutting, hashing or compressing their bytes
/// where they start at one of its cuts (module `publish::unchanged` proves
/// that today's tar holds those very bytes there).
#[derive(Clone, Debug, Default)]
pub struct Skips {
    /// Tar offset -> the run `frames[first..end]` of whole chunks that
    /// starts there.
    pub at: BTreeMap<u64, (usize, usize)>,
    pub frames: Vec<KnownFrame>,
}

/// A chunk of an earlier pack of this clone's, one frame, and its blob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnownFrame {
    pub raw_size: u64,
    pub raw_sha256: String,
    pub size: u64,
    pub sha256: String,
    /// Its blob in cache.git.
    pub oid: String,
}

/// One compressed chunk, in order.
#[derive(Clone, Debug)]
pub struct Frame {
    /// True when the bytes came from `Reuse` (checked) or are a known
    /// blob (`blob`), not from zstd now.
    pub reused: bool,
    pub index: usize,
    /// The frame; empty when `blob` names it.
    pub bytes: Vec<u8>,
    /// The frame's length.
    pub size: u64,
    /// The blob in cache.git that holds the frame already (`Skips`).
    pub blob: Option<String>,
    pub sha256: String,
    pub raw_size: u64,
    pub raw_sha256: String,
}

struct Job {
    index: usize,
    raw: Vec<u8>,
}

/// Runs `produce` with a writer that cuts what it writes into chunks and
/// compresses them on `workers` threads; `emit` gets every frame, in chunk
/// order, on this thread. A frame over `limit` bytes (possible only when
/// `limit` is below `bound(sizes.max)`) is split: its raw bytes are cut
/// again at smaller content-defined sizes until each piece fits, which
/// depends on the bytes only, so the same tar still gives the same frames. Returns what `produce` returned and the number
/// of chunks. An error of `emit` stops the run and is returned as is.
pub fn frames<T>(
    sizes: Sizes,
    params: Params,
    limit: u64,
    workers: usize,
    reuse: Reuse,
    produce: impl FnOnce(&mut dyn Write) -> Result<T>,
    emit: &mut dyn FnMut(Frame) -> Result<()>,
) -> Result<(T, usize)> {
    let (t, counts) = frames_skipping(sizes, params, limit, workers, reuse, None, produce, emit)?;
    Ok((t, counts.frames))
}

/// How many chunks were cut (known ones included) and how many frames
/// they became (more when a chunk was split to fit the limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    pub chunks: usize,
    pub frames: usize,
}

/// `frames`, handing over the known chunks of `skips` wherever a cut
/// lands where one of their runs starts: the bytes of the run are then
/// taken from the writer and dropped, neither cut nor hashed nor
/// compressed. The frames are those a full pass would make, because a cut
/// depends only on the bytes since the previous cut.
#[allow(clippy::too_many_arguments)]
pub fn frames_skipping<T>(
    sizes: Sizes,
    params: Params,
    limit: u64,
    workers: usize,
    reuse: Reuse,
    skips: Option<&Skips>,
    produce: impl FnOnce(&mut dyn Write) -> Result<T>,
    emit: &mut dyn FnMut(Frame) -> Result<()>,
) -> Result<(T, Counts)> {
    let workers = workers.max(1);
    // Every worker's compressor is made (and its parameters checked) first.
    let compressors: Vec<_> = (0..workers)
        .map(|_| params.compressor())
        .collect::<Result<_>>()?;
    let (job_tx, job_rx) = mpsc::channel::<Job>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    let (done_tx, done_rx) = mpsc::channel::<Result<(usize, Vec<Frame>)>>();
    std::thread::scope(|s| {
        for mut z in compressors {
            let (rx, tx) = (Arc::clone(&job_rx), done_tx.clone());
            s.spawn(move || {
                loop {
                    let job = match rx.lock().map(|r| r.recv()) {
                        Ok(Ok(job)) => job,
                        _ => return,
                    };
                    let mut frames = Vec::new();
                    // Hashed once, here on the worker: both the reuse
                    // lookup and the frame record it.
                    let raw_sha256 = hex::encode(&Sha256::digest(&job.raw));
                    match reused(&job.raw, &raw_sha256, limit, reuse) {
                        Some(Ok(f)) => {
                            if tx.send(Ok((job.index, vec![f]))).is_err() {
                                return;
                            }
                            continue;
                        }
                        Some(Err(why)) => eprintln!(
                            "warning: chunk {} (raw sha256 {raw_sha256}): the earlier frame in cache.git {why}; compressing it again",
                            job.index,
                        ),
                        None => {}
                    }
                    let done = compress(&mut z, &job.raw, &raw_sha256, sizes, limit, &mut frames)
                        .with_context(|| format!("compressing chunk {}", job.index))
                        .map(|()| (job.index, frames));
                    if tx.send(done).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut cutter = Cutter {
            sizes,
            masks: masks(sizes),
            buf: Vec::with_capacity(2 * sizes.max as usize),
            start: 0,
            pos: 0,
            skip_left: 0,
            skips,
            order: Order {
                jobs: Some(job_tx),
                done: done_rx,
                next_index: 0,
                next_emit: 0,
                next_frame: 0,
                waiting: BTreeMap::new(),
                in_flight: 0,
                in_flight_bytes: 0,
                max_in_flight: 2 * workers,
                emit,
                error: None,
            },
        };
        let produced = cutter
            .after_cut()
            .map_err(|e| anyhow!(e))
            .and_then(|()| produce(&mut cutter));
        let finished = produced.and_then(|t| cutter.finish().map(|n| (t, n)));
        // Workers end when the job channel closes; the scope joins them.
        let error = cutter.order.error.take();
        drop(cutter);
        match (finished, error) {
            (_, Some(e)) => Err(e),
            (r, None) => r,
        }
    })
}

/// Compresses `raw` (whose sha256 is `raw_sha256`) into frames of at most
/// `limit` bytes (one, unless it does not fit), appended to `out`; their
/// `index` is set when handed over.
fn compress(
    z: &mut zstd::bulk::Compressor<'static>,
    raw: &[u8],
    raw_sha256: &str,
    sizes: Sizes,
    limit: u64,
    out: &mut Vec<Frame>,
) -> Result<()> {
    let bytes = z.compress(raw)?;
    if bytes.len() as u64 <= limit {
        out.push(Frame {
            reused: false,
            index: 0,
            sha256: hex::encode(&Sha256::digest(&bytes)),
            size: bytes.len() as u64,
            blob: None,
            bytes,
            raw_size: raw.len() as u64,
            raw_sha256: raw_sha256.to_string(),
        });
        return Ok(());
    }
    // Pieces that fit, merged greedily from the front while the merged
    // frame fits: frames near the limit, and a piece's group depends only
    // on the bytes before it and its own, as the cuts do.
    let mut pieces = Vec::new();
    split(z, raw, 0, sizes, limit, &mut pieces)?;
    let mut group: Option<(usize, usize, Vec<u8>)> = None;
    for (start, end, bytes) in pieces {
        group = Some(match group {
            None => (start, end, bytes),
            Some((s, e, prev)) => {
                let merged = z.compress(&raw[s..end])?;
                if merged.len() as u64 <= limit {
                    (s, end, merged)
                } else {
                    out.push(frame(&raw[s..e], prev));
                    (start, end, bytes)
                }
            }
        });
    }
    if let Some((s, e, bytes)) = group {
        out.push(frame(&raw[s..e], bytes));
    }
    Ok(())
}

/// The frame `reuse` has for `raw` (`None`: it has none), taken only if
/// it fits `limit`, is one zstd frame framed as ours are (`framing`), and a
/// streaming decoder with zstd's default memory limit (as `zstd -d` in the
/// coreutils line, and our own stream path) decodes it to exactly `raw`;
/// else why not (zstd then makes the frame). The bytes come from an
/// earlier key a pusher may have written: a frame of the right bytes that
/// asks for a 2 GiB window, or carries no checksum, would otherwise go into
/// a key CI signs, under a statement that promises otherwise.
fn reused(raw: &[u8], raw_sha256: &str, limit: u64, reuse: Reuse) -> Option<Result<Frame, String>> {
    let bytes = reuse(raw_sha256)?;
    Some(check_reused(raw, limit, &bytes).map(|()| Frame {
        reused: true,
        index: 0,
        sha256: hex::encode(&Sha256::digest(&bytes)),
        size: bytes.len() as u64,
        blob: None,
        bytes,
        raw_size: raw.len() as u64,
        raw_sha256: raw_sha256.to_string(),
    }))
}

fn check_reused(raw: &[u8], limit: u64, bytes: &[u8]) -> Result<(), String> {
    if bytes.len() as u64 > limit {
        return Err(format!(
            "is {} bytes, over the limit of {limit}",
            bytes.len()
        ));
    }
    if zstd::zstd_safe::find_frame_compressed_size(bytes).ok() != Some(bytes.len()) {
        return Err("is not one zstd frame".into());
    }
    framing(bytes, raw.len() as u64)?;
    let mut decoded = Vec::with_capacity(raw.len());
    let read = zstd::stream::read::Decoder::with_buffer(bytes)
        .map_err(|e| format!("does not decode ({e})"))?
        .take(raw.len() as u64 + 1)
        .read_to_end(&mut decoded);
    match read {
        Ok(_) if decoded == raw => Ok(()),
        Ok(_) => Err("decodes to other bytes than this chunk's".into()),
        Err(e) => Err(format!("does not decode ({e})")),
    }
}

/// Whether a frame's header is what every frame of ours has, and so what
/// the statement records (`frames`): a content checksum, no dictionary,
/// the content size, and a window no larger than the content needs.
/// (RFC 8878, section 3.1.1.1.)
fn framing(bytes: &[u8], raw_len: u64) -> Result<(), String> {
    const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    if bytes.get(..4) != Some(&MAGIC[..]) {
        return Err("is not a zstd frame".into());
    }
    let fhd = *bytes.get(4).ok_or("has no frame header")?;
    let (fcs_flag, single, checksum, dict) = (fhd >> 6, fhd & 0x20 != 0, fhd & 0x04 != 0, fhd & 3);
    if !checksum {
        return Err("carries no content checksum".into());
    }
    if dict != 0 || fhd & 0x08 != 0 {
        return Err("names a dictionary or sets a reserved bit".into());
    }
    if fcs_flag == 0 && !single {
        return Err("does not record its content size".into());
    }
    if !single {
        let wd = *bytes.get(5).ok_or("has no window descriptor")?;
        let log = 10 + u32::from(wd >> 3);
        let base = 1u64 << log;
        let window = base + (base / 8) * u64::from(wd & 7);
        // zstd never needs a window past the content's next power of two.
        let need = raw_len.max(1 << 10).next_power_of_two();
        if window > need {
            return Err(format!(
                "asks for a {window}-byte window where {raw_len} bytes need at most {need}"
            ));
        }
    }
    Ok(())
}

fn frame(raw: &[u8], bytes: Vec<u8>) -> Frame {
    Frame {
        reused: false,
        index: 0,
        sha256: hex::encode(&Sha256::digest(&bytes)),
        size: bytes.len() as u64,
        blob: None,
        bytes,
        raw_size: raw.len() as u64,
        raw_sha256: hex::encode(&Sha256::digest(raw)),
    }
}

/// Pieces of `raw` (at `base` in the chunk) whose frames fit `limit`, with
/// those frames: a piece that does not fit is cut again by FastCDC at a
/// quarter of the sizes (so what did not change in it still gives the same
/// pieces), and, below `MIN_AVG / 4`, in halves.
fn split(
    z: &mut zstd::bulk::Compressor<'static>,
    raw: &[u8],
    base: usize,
    sizes: Sizes,
    limit: u64,
    out: &mut Vec<(usize, usize, Vec<u8>)>,
) -> Result<()> {
    let bytes = z.compress(raw)?;
    if bytes.len() as u64 <= limit {
        out.push((base, base + raw.len(), bytes));
        return Ok(());
    }
    if raw.len() < 64 {
        bail!(
            "{} bytes of tar do not fit in a zstd frame of publish.chunk_bytes = {limit} bytes: raise publish.chunk_bytes",
            raw.len()
        );
    }
    if sizes.avg / 4 < MIN_AVG / 4 {
        let half = raw.len() / 2;
        split(z, &raw[..half], base, sizes, limit, out)?;
        return split(z, &raw[half..], base + half, sizes, limit, out);
    }
    let smaller = Sizes::from_avg(sizes.avg / 4);
    let masks = masks(smaller);
    let mut at = 0;
    while at < raw.len() {
        let n = cut(&raw[at..], smaller, masks);
        split(z, &raw[at..at + n], base + at, smaller, limit, out)?;
        at += n;
    }
    Ok(())
}

fn masks(sizes: Sizes) -> (u64, u64) {
    fastcdc::v2020::select_masks(sizes.avg as usize, fastcdc::v2020::Normalization::Level1)
}

/// The length of the chunk FastCDC cuts off the front of `data` (all of
/// it when it is no longer than `sizes.min`); it looks at `sizes.max`
/// bytes at most.
fn cut(data: &[u8], sizes: Sizes, (mask_s, mask_l): (u64, u64)) -> usize {
    let (_, n) = fastcdc::v2020::cut(
        data,
        sizes.min as usize,
        sizes.avg as usize,
        sizes.max as usize,
        mask_s,
        mask_l,
        mask_s << 1,
        mask_l << 1,
    );
    n
}

/// The writer `produce` writes into: cuts chunks off the front of `buf`
/// once it holds a maximum chunk (so a cut sees exactly what it would see
/// in the whole stream), and hands them to `order`.
struct Cutter<'a> {
    sizes: Sizes,
    masks: (u64, u64),
    buf: Vec<u8>,
    /// Bytes before `start` were cut already; they are dropped when the
    /// buffer needs room (one move of less than a maximum chunk).
    start: usize,
    /// The tar offset of `buf[start]`.
    pos: u64,
    /// Bytes still to drop of a run of known chunks handed over already.
    skip_left: u64,
    skips: Option<&'a Skips>,
    order: Order<'a>,
}

impl Cutter<'_> {
    /// Cuts one chunk off the front of what is buffered.
    fn cut_one(&mut self) -> io::Result<()> {
        let live = &self.buf[self.start..];
        let n = cut(live, self.sizes, self.masks);
        let raw = live[..n].to_vec();
        self.start += n;
        self.pos += n as u64;
        self.order.submit(raw)?;
        self.after_cut()
    }

    /// At a cut: hands over the run of known chunks that starts here, if
    /// any, and drops its bytes from the buffer (the rest as they come).
    fn after_cut(&mut self) -> io::Result<()> {
        let Some(skips) = self.skips else {
            return Ok(());
        };
        while self.skip_left == 0 {
            let Some(&(first, end)) = skips.at.get(&self.pos) else {
                return Ok(());
            };
            let run = &skips.frames[first..end];
            let total: u64 = run.iter().map(|k| k.raw_size).sum();
            if total == 0 {
                return Ok(());
            }
            self.order.submit_known(run)?;
            let take = ((self.buf.len() - self.start) as u64).min(total);
            self.start += take as usize;
            self.pos += take;
            self.skip_left = total - take;
        }
        Ok(())
    }

    /// Cuts and compresses what is left, waits for every frame; returns
    /// the number of chunks.
    fn finish(&mut self) -> Result<Counts> {
        let mut run = || -> io::Result<()> {
            while self.start < self.buf.len() {
                self.cut_one()?;
            }
            if self.skip_left > 0 {
                return Err(io::Error::other(format!(
                    "the tar ended {} bytes before the known chunks handed over did",
                    self.skip_left
                )));
            }
            // An empty tar cannot happen (it ends in two zero blocks), but
            // a key needs at least one chunk.
            if self.order.next_index == 0 {
                self.order.submit(Vec::new())?;
            }
            self.order.jobs.take();
            while self.order.in_flight > 0 {
                self.order.wait_one()?;
            }
            Ok(())
        };
        match run() {
            Ok(()) => Ok(Counts {
                chunks: self.order.next_index,
                frames: self.order.next_frame,
            }),
            Err(e) => Err(self.order.error.take().unwrap_or_else(|| anyhow!(e))),
        }
    }
}

impl Write for Cutter<'_> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if self.skip_left > 0 {
            let n = (data.len() as u64).min(self.skip_left);
            self.skip_left -= n;
            self.pos += n;
            if self.skip_left == 0 {
                self.after_cut()?;
            }
            return Ok(n as usize);
        }
        let max = self.sizes.max as usize;
        if self.buf.len() + data.len() > self.buf.capacity() && self.start > 0 {
            self.buf.drain(..self.start);
            self.start = 0;
        }
        let room = (2 * max).saturating_sub(self.buf.len()).max(1);
        let n = data.len().min(room);
        self.buf.extend_from_slice(&data[..n]);
        while self.buf.len() - self.start >= max {
            self.cut_one()?;
        }
        Ok(n)
    }

    /// Nothing to do: a cut depends on the bytes only, never on when the
    /// producer flushed.
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Chunks sent to the workers, and the frames that came back but wait for
/// an earlier one.
struct Order<'a> {
    jobs: Option<mpsc::Sender<Job>>,
    done: mpsc::Receiver<Result<(usize, Vec<Frame>)>>,
    /// The next chunk to send, the next to hand over (as cut), and the
    /// index of the next frame handed over (more when chunks are split).
    next_index: usize,
    next_emit: usize,
    next_frame: usize,
    waiting: BTreeMap<usize, (u64, Vec<Frame>)>,
    in_flight: usize,
    in_flight_bytes: u64,
    max_in_flight: usize,
    emit: &'a mut dyn FnMut(Frame) -> Result<()>,
    /// The first error of a worker or of `emit`, returned as is (the
    /// io::Error the writer passes up only says that something failed).
    error: Option<anyhow::Error>,
}

impl Order<'_> {
    fn submit(&mut self, raw: Vec<u8>) -> io::Result<()> {
        let size = raw.len() as u64;
        while self.in_flight > 0
            && (self.in_flight >= self.max_in_flight
                || self.in_flight_bytes + size > IN_FLIGHT_BYTES)
        {
            self.wait_one()?;
        }
        let jobs = self.jobs.as_ref().expect("jobs are open until finish");
        jobs.send(Job {
            index: self.next_index,
            raw,
        })
        .map_err(|_| io::Error::other("the zstd workers stopped"))?;
        self.next_index += 1;
        self.in_flight += 1;
        self.in_flight_bytes += size;
        Ok(())
    }

    /// Waits for one chunk's frames, then hands over every frame that is
    /// next in order.
    fn wait_one(&mut self) -> io::Result<()> {
        let (index, frames) = match self.done.recv() {
            Ok(Ok(f)) => f,
            Ok(Err(e)) => return Err(self.fail(e)),
            Err(_) => return Err(self.fail(anyhow!("the zstd workers stopped"))),
        };
        let raw: u64 = frames.iter().map(|f| f.raw_size).sum();
        self.waiting.insert(index, (raw, frames));
        self.hand_over()
    }

    /// Queues known chunks (no worker makes them) after those submitted,
    /// and hands over whatever is next in order.
    fn submit_known(&mut self, run: &[KnownFrame]) -> io::Result<()> {
        for k in run {
            let f = Frame {
                reused: true,
                index: 0,
                bytes: Vec::new(),
                size: k.size,
                blob: Some(k.oid.clone()),
                sha256: k.sha256.clone(),
                raw_size: k.raw_size,
                raw_sha256: k.raw_sha256.clone(),
            };
            // Counted in flight (with no bytes) so that `finish` waits for it.
            self.waiting.insert(self.next_index, (0, vec![f]));
            self.next_index += 1;
            self.in_flight += 1;
        }
        self.hand_over()
    }

    /// Hands over every frame that is next in order.
    fn hand_over(&mut self) -> io::Result<()> {
        while let Some((raw, frames)) = self.waiting.remove(&self.next_emit) {
            self.in_flight -= 1;
            self.in_flight_bytes -= raw;
            self.next_emit += 1;
            for mut f in frames {
                f.index = self.next_frame;
                self.next_frame += 1;
                if let Err(e) = (self.emit)(f) {
                    return Err(self.fail(e));
                }
            }
        }
        Ok(())
    }

    fn fail(&mut self, e: anyhow::Error) -> io::Error {
        let msg = format!("{e:#}");
        self.error.get_or_insert(e);
        io::Error::other(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::chunk_sizes::bound;

    /// Bytes that do not compress and never repeat (xorshift64).
    fn noise(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    fn run(data: &[u8], sizes: Sizes, workers: usize, piece: usize) -> Vec<Frame> {
        let mut out = Vec::new();
        let (_, n) = frames(
            sizes,
            Params {
                level: 3,
                window_log: None,
            },
            u64::MAX,
            workers,
            &no_reuse,
            |w| {
                for p in data.chunks(piece) {
                    w.write_all(p)?;
                }
                Ok(())
            },
            &mut |f| {
                out.push(f);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn frames_decode_to_the_input_in_order_within_the_sizes() {
        let data = noise(3 << 20, 7);
        let sizes = Sizes::from_avg(64 << 10);
        let frames = run(&data, sizes, 3, 100_000);
        assert!(frames.len() > 10, "{}", frames.len());
        let mut back = Vec::new();
        for (i, f) in frames.iter().enumerate() {
            assert_eq!(f.index, i);
            assert!(f.raw_size <= sizes.max);
            if i + 1 < frames.len() {
                assert!(f.raw_size >= sizes.min, "chunk {i}: {}", f.raw_size);
            }
            assert!(f.bytes.len() as u64 <= bound(f.raw_size));
            let raw = zstd::decode_all(&f.bytes[..]).unwrap();
            assert_eq!(raw.len() as u64, f.raw_size);
            assert_eq!(hex::encode(&Sha256::digest(&raw)), f.raw_sha256);
            assert_eq!(hex::encode(&Sha256::digest(&f.bytes)), f.sha256);
            back.extend(raw);
        }
        assert_eq!(back, data);
        // The concatenation is one zstd stream.
        let all: Vec<u8> = frames.iter().flat_map(|f| f.bytes.clone()).collect();
        assert_eq!(zstd::decode_all(&all[..]).unwrap(), data);
    }

    /// The same bytes give the same frames whatever the number of workers
    /// and however the producer splits its writes; an insertion moves only
    /// the cuts near it.
    #[test]
    fn cuts_depend_on_the_bytes_only() {
        let data = noise(2 << 20, 11);
        let sizes = Sizes::from_avg(32 << 10);
        let ids = |fs: &[Frame]| fs.iter().map(|f| f.sha256.clone()).collect::<Vec<_>>();
        let a = ids(&run(&data, sizes, 1, 1 << 20));
        assert_eq!(a, ids(&run(&data, sizes, 4, 777)));
        assert_eq!(a, ids(&run(&data, sizes, 2, 1)[..]));
        let mut edited = data.clone();
        edited.splice(1000..1000, noise(5000, 3));
        let b = ids(&run(&edited, sizes, 2, 4096));
        let shared = b.iter().filter(|id| a.contains(id)).count();
        assert!(
            shared + 3 >= a.len(),
            "{shared} of {} chunks survived an early insertion",
            a.len()
        );
    }

    /// Below the worst case of a chunk, a frame over the limit is cut again
    /// at smaller sizes until each piece fits: every file stays under the
    /// limit, the frames still decode to the input in order, and a change
    /// at the end leaves the earlier pieces as they were.
    #[test]
    fn a_low_limit_splits_frames_and_keeps_order() {
        let mut data = noise(300_000, 9);
        data.extend(vec![0u8; 200_000]);
        data.extend(noise(100_000, 10));
        let limit = 20_000;
        let mut out = Vec::new();
        frames(
            Sizes::from_avg(64 << 10),
            Params {
                level: 3,
                window_log: None,
            },
            limit,
            2,
            &no_reuse,
            |w| Ok(w.write_all(&data)?),
            &mut |f| {
                out.push(f);
                Ok(())
            },
        )
        .unwrap();
        assert!(out.iter().all(|f| f.bytes.len() as u64 <= limit));
        assert!(out.iter().enumerate().all(|(i, f)| f.index == i));
        let all: Vec<u8> = out.iter().flat_map(|f| f.bytes.clone()).collect();
        assert_eq!(zstd::decode_all(&all[..]).unwrap(), data);
        assert!(out.len() >= 400_000 / 20_000, "{}", out.len());
        let mut longer = data.clone();
        longer.extend(noise(5000, 12));
        let mut again = Vec::new();
        frames(
            Sizes::from_avg(64 << 10),
            Params {
                level: 3,
                window_log: None,
            },
            limit,
            2,
            &no_reuse,
            |w| Ok(w.write_all(&longer)?),
            &mut |f| {
                again.push(f.sha256);
                Ok(())
            },
        )
        .unwrap();
        let same = out.iter().filter(|f| again.contains(&f.sha256)).count();
        assert!(same + 3 >= out.len(), "{same} of {} kept", out.len());
        let err = frames(
            Sizes::from_avg(1024),
            Params {
                level: 3,
                window_log: None,
            },
            8,
            1,
            &no_reuse,
            |w| Ok(w.write_all(&data)?),
            &mut |_| Ok(()),
        )
        .unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("raise publish.chunk_bytes"), "{err}");
    }

    /// Every frame we make passes the framing check (else a refresh would
    /// never reuse one), and frames framed otherwise do not.
    #[test]
    fn our_frames_pass_the_framing_check_and_others_do_not() {
        use zstd::zstd_safe::CParameter as P;
        let mut compressible = b"warmstart ".repeat(120_000);
        compressible.truncate(1 << 20);
        for data in [
            noise(100, 1),
            noise(5000, 2),
            noise(1 << 20, 3),
            compressible,
        ] {
            for level in [1, 3, 19] {
                for window_log in [None, Some(20), Some(27)] {
                    let mut z = Params { level, window_log }.compressor().unwrap();
                    let bytes = z.compress(&data).unwrap();
                    check_reused(&data, u64::MAX, &bytes).unwrap_or_else(|e| {
                        panic!(
                            "level {level} window {window_log:?} len {}: {e}",
                            data.len()
                        )
                    });
                }
            }
            let hostile = |params: &[P]| {
                let mut z = zstd::bulk::Compressor::new(3).unwrap();
                for p in params {
                    z.set_parameter(*p).unwrap();
                }
                z.compress(&data).unwrap()
            };
            let no_sum = hostile(&[P::ChecksumFlag(false)]);
            assert!(
                check_reused(&data, u64::MAX, &no_sum)
                    .unwrap_err()
                    .contains("checksum")
            );
            // A streamed frame without its size, asking for a 128 MiB window.
            let mut e = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
            e.set_parameter(P::ChecksumFlag(true)).unwrap();
            e.set_parameter(P::WindowLog(27)).unwrap();
            e.set_parameter(P::ContentSizeFlag(false)).unwrap();
            e.write_all(&data).unwrap();
            let wide = e.finish().unwrap();
            assert!(check_reused(&data, u64::MAX, &wide).is_err());
            let mut reserved = hostile(&[P::ChecksumFlag(true)]);
            reserved[4] |= 0x08;
            assert!(check_reused(&data, u64::MAX, &reserved).is_err());
        }
    }

    /// A frame from `Reuse` is handed over as it is when it decodes to the
    /// chunk's bytes, and ignored (zstd makes the frame) when it does not.
    #[test]
    fn reused_frames_are_checked_before_use() {
        let data = noise(1 << 20, 21);
        let sizes = Sizes::from_avg(64 << 10);
        let fresh = run(&data, sizes, 2, 1 << 16);
        let params = Params {
            level: 3,
            window_log: None,
        };
        let go = |reuse: Reuse| {
            let mut out = Vec::new();
            frames(
                sizes,
                params,
                u64::MAX,
                2,
                reuse,
                |w| Ok(w.write_all(&data)?),
                &mut |f| {
                    out.push(f);
                    Ok(())
                },
            )
            .unwrap();
            out
        };
        let by_raw: BTreeMap<String, Vec<u8>> = fresh
            .iter()
            .map(|f| (f.raw_sha256.clone(), f.bytes.clone()))
            .collect();
        let good = go(&|sha| by_raw.get(sha).cloned());
        assert!(good.iter().all(|f| f.reused));
        let other = fresh[0].bytes.clone();
        let wrong = go(&|_| Some(other.clone()));
        assert!(wrong.iter().skip(1).all(|f| !f.reused));
        let garbage = go(&|_| Some(b"not zstd".to_vec()));
        for got in [&good, &wrong, &garbage] {
            let ids: Vec<&String> = got.iter().map(|f| &f.sha256).collect();
            assert_eq!(ids, fresh.iter().map(|f| &f.sha256).collect::<Vec<_>>());
        }
    }

    #[test]
    fn an_emit_error_stops_the_run_with_that_error() {
        let data = noise(1 << 20, 5);
        let err = frames(
            Sizes::from_avg(16 << 10),
            Params {
                level: 1,
                window_log: None,
            },
            u64::MAX,
            2,
            &no_reuse,
            |w| Ok(w.write_all(&data)?),
            &mut |f| {
                if f.index == 3 {
                    bail!("git refused chunk {}", f.index)
                }
                Ok(())
            },
        )
        .unwrap_err();
        assert_eq!(format!("{err:#}"), "git refused chunk 3");
    }
}
