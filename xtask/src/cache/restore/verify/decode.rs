//! Stage 2 of the one-stream path: the verified compressed stream decoded,
//! capped and hashed, and the tar checked against `warmstart.json`. It only
//! ever sees bytes stage 1 passed on.

use super::*;

/// Stage 2: decode, hash and cap the tar stream, pass it on.
pub(super) fn decode_stage(
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
pub(super) fn check_tar(plan: &Plan, total: u64, digest: Option<[u8; 32]>) -> Result<()> {
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
                hex(&digest),
                hex(&expected),
                plan.fix
            ),
        ));
    }
    Ok(())
}
