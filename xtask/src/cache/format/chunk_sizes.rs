//! The content-defined chunk sizes a manifest sets (`[publish] chunk_avg`
//! within `chunk_bytes`): what `cache::publish::chunks` cuts the tar by.
//!
//! Pure arithmetic on the manifest's numbers: never reads, packs or
//! compresses anything.

use anyhow::{Result, bail};

/// The default average chunk: 4 MiB of tar. Smaller chunks share more
/// between two versions of a tree; each chunk costs a blob, a pack and a
/// round trip. H6's measurement (BENCHMARKS.md) decides the final value.
pub const DEFAULT_AVG: u64 = 4 << 20;

/// The smallest average accepted (the chunker's masks need a few bits).
pub const MIN_AVG: u64 = 256;

/// The largest average accepted: the chunker has masks up to 2^25, and a
/// maximum chunk (4 * avg, 64 MiB) must stay well under the 99 MiB files.
pub const MAX_AVG: u64 = 16 << 20;

/// Chunk sizes in bytes of uncompressed tar: FastCDC cuts no chunk below
/// `min` (but the last) and none above `max`, and aims at `avg`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    pub min: u64,
    pub avg: u64,
    pub max: u64,
}

impl Sizes {
    /// `min = avg / 4`, `max = avg * 4`, all even (the cut scans bytes in pairs).
    pub fn from_avg(avg: u64) -> Sizes {
        let even = |n: u64| n & !1;
        Sizes {
            min: even(avg / 4).max(2),
            avg: even(avg),
            max: even(avg * 4),
        }
    }

    /// The sizes a publish uses: `avg` (`[publish] chunk_avg`, else
    /// `DEFAULT_AVG`). A given `avg` must keep even an incompressible
    /// maximum chunk within `chunk_bytes` (the limit of a compressed chunk
    /// file). The default may not when `chunk_bytes` is lowered below its
    /// worst case (tests do, to get several chunks of a small tree): then a
    /// frame over the limit is split (`frames` in `cache::publish::chunks`).
    pub fn for_limit(avg: Option<u64>, chunk_bytes: u64) -> Result<Sizes> {
        let Some(a) = avg else {
            return Ok(Sizes::from_avg(DEFAULT_AVG));
        };
        if !(MIN_AVG..=MAX_AVG).contains(&a) {
            bail!(
                "publish.chunk_avg must be from {MIN_AVG} bytes to {} (e.g. \"4MiB\")",
                crate::size::human(MAX_AVG)
            );
        }
        let s = Sizes::from_avg(a);
        let worst = bound(s.max);
        if worst > chunk_bytes {
            bail!(
                "publish.chunk_avg = {a} allows chunks of {} bytes of tar, which zstd may compress to {worst} bytes, over publish.chunk_bytes = {chunk_bytes}: lower chunk_avg or raise chunk_bytes",
                s.max
            );
        }
        Ok(s)
    }
}

/// zstd's worst case for `n` input bytes: the compressed size never exceeds it.
pub fn bound(n: u64) -> u64 {
    zstd::zstd_safe::compress_bound(n as usize) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_keep_every_frame_under_the_limit() {
        let d = Sizes::for_limit(None, 99 << 20).unwrap();
        assert_eq!((d.min, d.avg, d.max), (1 << 20, 4 << 20, 16 << 20));
        assert!(bound(d.max) < 99 << 20);
        assert_eq!(Sizes::for_limit(None, 500).unwrap(), d);
        let e = Sizes::for_limit(Some(4 << 20), 10 << 20).unwrap_err();
        assert!(e.to_string().contains("lower chunk_avg"), "{e}");
        assert!(Sizes::for_limit(Some(100), 99 << 20).is_err());
        assert!(Sizes::for_limit(Some(32 << 20), 99 << 20).is_err());
        let big = Sizes::for_limit(Some(16 << 20), 99 << 20).unwrap();
        assert_eq!(big.max, 64 << 20);
        assert!(bound(big.max) < 99 << 20);
    }
}
