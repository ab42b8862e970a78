//! Stage 1 of the one-stream path: each chunk (or the whole legacy archive)
//! hashed and checked before its bytes are read again and passed on. No
//! byte leaves this stage before the digest it belongs to matched.

use super::*;

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
            hex(got),
            hex(expected),
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
            hex(got),
            hex(expected),
            plan.fix
        ),
    )
}
