//! Stage 1 of the one-stream path: each chunk (or the whole legacy archive)
//! hashed and checked before its bytes are read again and passed on. No
//! byte leaves this stage before the digest it belongs to matched.

use super::*;

/// Reads one piece in blocks, hashing them, and hands each block to `sink`
/// (which returns the buffer if it did not keep it). Checks the size;
/// returns the digest. The one loop that hashes a piece, in both paths
/// (`framed` has no buffers to recycle).
pub(super) fn stream_piece(
    plan: &Plan,
    piece: &Piece,
    src: &mut dyn Read,
    recycle: Option<&Receiver<Vec<u8>>>,
    sink: &mut dyn FnMut(Vec<u8>) -> Result<Option<Vec<u8>>>,
) -> Result<[u8; 32]> {
    let what = || format!("chunk {} of {}", piece.file, plan.label);
    let mut hasher = Sha256::new();
    let mut left = piece.size;
    let mut spare: Option<Vec<u8>> = None;
    loop {
        let mut buf = spare
            .take()
            .or_else(|| recycle.map(take_buffer))
            .unwrap_or_default();
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

pub(super) fn mismatch(
    plan: &Plan,
    piece: &Piece,
    got: &[u8; 32],
    expected: &[u8; 32],
) -> anyhow::Error {
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
pub(super) fn read_stage(
    plan: &Plan,
    open: &mut Open<'_>,
    on_progress: &(dyn Fn(Phase, u64) + Sync),
    tx: &SyncSender<Msg>,
    recycle: &Receiver<Vec<u8>>,
) -> Result<(u64, u64)> {
    let mut hashed = 0u64;
    if let Check::Whole { archive, sha256 } = &plan.check {
        hashed += check_whole_first(plan, archive, sha256, open, on_progress, recycle)?;
    }
    let mut total = 0u64;
    let mut whole = matches!(plan.check, Check::Whole { .. }).then(Sha256::new);
    // Set when the next stage hung up (it failed): the current chunk (v1) or
    // the whole archive (legacy) is still hashed to its end, so that damage
    // is reported as such rather than as whatever it decoded to.
    let mut downstream_gone = false;
    for (i, piece) in plan.pieces.iter().enumerate() {
        let checked = match plan.check {
            Check::PerPiece => {
                hashed += piece.size;
                check_piece_first(plan, i, piece, open, on_progress, recycle)?
            }
            Check::Whole { .. } => None,
        };
        let mut src = match checked {
            Some(o) => o.reader,
            None => open(i)?.reader,
        };
        let send_to = (tx, &mut downstream_gone);
        let got = pass_on_piece(plan, piece, &mut *src, recycle, send_to, whole.as_mut())?;
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
    if let (Check::Whole { archive, sha256 }, Some(whole)) = (&plan.check, whole) {
        // The second read must give the bytes the first one checked: the
        // parts are still in staging only if they changed in between.
        let got: [u8; 32] = whole.finalize().into();
        if got != *sha256 {
            let when = " (they changed while being read)";
            return Err(whole_mismatch(plan, archive, &got, sha256, when));
        }
        if downstream_gone {
            return Err(anyhow!(Cancelled));
        }
    }
    Ok((total, hashed))
}

/// The legacy archive's first read: every part hashed, in order, and the
/// digest compared with `SHA256SUMS` before any byte is passed on. Returns
/// the bytes hashed.
fn check_whole_first(
    plan: &Plan,
    archive: &str,
    sha256: &[u8; 32],
    open: &mut Open<'_>,
    on_progress: &(dyn Fn(Phase, u64) + Sync),
    recycle: &Receiver<Vec<u8>>,
) -> Result<u64> {
    let mut hashed = 0u64;
    let mut whole = Sha256::new();
    for (i, piece) in plan.pieces.iter().enumerate() {
        let mut src = open(i)?.reader;
        stream_piece(plan, piece, &mut *src, Some(recycle), &mut |buf| {
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
    Ok(hashed)
}

/// A v1 chunk's first read: hashed and checked before any byte of it is
/// passed on. A chunk this process checked as it arrived is not read again
/// here: it is returned, opened, for the read that decodes it.
fn check_piece_first(
    plan: &Plan,
    i: usize,
    piece: &Piece,
    open: &mut Open<'_>,
    on_progress: &(dyn Fn(Phase, u64) + Sync),
    recycle: &Receiver<Vec<u8>>,
) -> Result<Option<Opened>> {
    let expected = piece
        .sha256
        .ok_or_else(|| anyhow!("chunk {} has no digest", piece.file))?;
    let first = open(i)?;
    if first.checked {
        // Hashed as it arrived, by this process.
        on_progress(Phase::Verified, piece.size);
        return Ok(Some(first));
    }
    let mut src = first.reader;
    let got = stream_piece(plan, piece, &mut *src, Some(recycle), &mut |buf| {
        on_progress(Phase::Verified, buf.len() as u64);
        Ok(Some(buf))
    })?;
    if got != expected {
        return Err(mismatch(plan, piece, &got, &expected));
    }
    Ok(None)
}

/// The read that feeds the decoder: `piece` re-hashed (and, for a legacy
/// archive, added to `whole`) as its blocks are passed on. If the next
/// stage hangs up mid-piece, the piece is still read to its end, so that a
/// piece that changed is reported as such; `gone` says it hung up. This
/// read reports no progress: the consumer's reads of the tar do.
fn pass_on_piece(
    plan: &Plan,
    piece: &Piece,
    src: &mut dyn Read,
    recycle: &Receiver<Vec<u8>>,
    (tx, gone): (&SyncSender<Msg>, &mut bool),
    mut whole: Option<&mut Sha256>,
) -> Result<[u8; 32]> {
    stream_piece(plan, piece, src, Some(recycle), &mut |buf| {
        if let Some(w) = whole.as_mut() {
            w.update(&buf);
        }
        if *gone {
            return Ok(Some(buf));
        }
        if send(tx, buf).is_err() {
            *gone = true;
        }
        Ok(None)
    })
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
