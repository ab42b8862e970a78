//! Independent frames decoded on several cores (`Plan::frames`): a key
//! whose every chunk is its own zstd frame can decode chunk `i + 1` while
//! chunk `i` is still being decoded, on another core.
//!
//! The reader reads each chunk whole into memory, hashing it, and hands it
//! to a decoder only once its sha256 matched (docs/format.md, restore invariant 1: the
//! bytes a decoder sees are the very bytes that were hashed, so the
//! streaming path's second read is not needed). Decoders inflate whole
//! frames, each into at most its declared `raw_size` bytes; the emitter
//! puts the decoded chunks back in order, caps and (with `Plan::hash_tar`)
//! hashes the tar in order, and passes it to the consumer. Memory stays
//! bounded: at most `Flight::window` chunks are between the reader and the
//! emitter, each at most its compressed plus its decoded size, within
//! `BUDGET` (a plan whose chunks are too big for it decodes one stream).

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
    if plan.check != Check::PerPiece || plan.codec != Codec::Zstd || raws.len() != plan.pieces.len()
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
    let mut data = Vec::with_capacity(piece.size as usize);
    let digest = stream_piece(plan, piece, src, None, &mut |buf| {
        data.extend_from_slice(&buf);
        Ok(Some(buf))
    })?;
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
    let mut tally = TarTally::new(plan);
    let mut next = 0usize;
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
            if let Err(fits) = tally.take(&raw) {
                // What fits first, as `decode_stage` does.
                pass_on(&raw[..fits], tx, recycle)?;
                return Err(tally.over_cap());
            }
            pass_on(&raw, tx, recycle)?;
            next += 1;
            gate.emitted(next);
            if next == 1 {
                crate::unpack::kill_point("restore:first-chunk-decoding");
            }
        }
    }
    tally.finish()
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
