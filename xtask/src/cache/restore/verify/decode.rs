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
    let mut tally = TarTally::new(plan);
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
        if let Err(fits) = tally.take(&buf) {
            buf.truncate(fits);
            send(tx, buf)?;
            return Err(tally.over_cap());
        }
        send(tx, buf)?;
    }
    tally.finish()
}

/// The decoded tar on its way to the consumer, the same in both decode
/// paths: its bytes counted against `Plan::tar_cap`, hashed when
/// `Plan::hash_tar` says so, and checked at the end (`check_tar`).
pub(super) struct TarTally<'p> {
    plan: &'p Plan,
    total: u64,
    hasher: Option<Sha256>,
}

impl<'p> TarTally<'p> {
    pub(super) fn new(plan: &'p Plan) -> TarTally<'p> {
        TarTally {
            plan,
            total: 0,
            hasher: plan.hash_tar.then(Sha256::new),
        }
    }

    /// Counts (and hashes) the next decoded bytes. `Err(fits)` when they
    /// cross the cap: the caller passes on the `fits` bytes that fit first
    /// (the extractor then usually refuses the entry that crosses the cap,
    /// and its error names it), then fails with `over_cap`.
    pub(super) fn take(&mut self, data: &[u8]) -> Result<(), usize> {
        self.total += data.len() as u64;
        if self.total > self.plan.tar_cap {
            return Err(data.len() - (self.total - self.plan.tar_cap) as usize);
        }
        if let Some(h) = self.hasher.as_mut() {
            h.update(data);
        }
        Ok(())
    }

    /// More tar than declared (exit 7).
    pub(super) fn over_cap(&self) -> anyhow::Error {
        fail(
            Code::Unsafe,
            format!(
                "the tar stream of {} is longer than the {} bytes declared for it",
                self.plan.label, self.plan.tar_cap
            ),
        )
    }

    /// The tar's size and, when hashed, its digest, once both agree with
    /// what `warmstart.json` declares.
    pub(super) fn finish(self) -> Result<(u64, Option<[u8; 32]>)> {
        let digest: Option<[u8; 32]> = self.hasher.map(|h| h.finalize().into());
        check_tar(self.plan, self.total, digest)?;
        Ok((self.total, digest))
    }
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
