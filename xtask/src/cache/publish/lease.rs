//! The lease of a publish, prune or re-sign: how long one keeps trying
//! after other publishers moved the branch between its fetch and its push,
//! and the pauses between attempts.
//!
//! Never pushes anything itself, and never retries past the deadline.

use anyhow::Result;
use std::time::{Duration, Instant};

use crate::cache::format::manifest::CacheManifest;
use crate::clock;
use crate::exit::{Code, fail};

/// How long a publish keeps rebuilding its commit after other publishers
/// moved the branch between its fetch and its push (and how long it waits
/// for cache.git's lock), unless `[publish] lease_deadline` or
/// `WARMSTART_PUBLISH_LEASE_DEADLINE` says otherwise. A deadline, not a
/// count: with many publishers on one branch, each round lets one of them
/// land, so the last one may lose as many times as there are others.
pub const DEFAULT_LEASE_DEADLINE: Duration = Duration::from_secs(120);

/// The first pause after a lost lease, and the longest: the pause doubles
/// each time, and a random part of it (jitter) keeps publishers that lost
/// together from coming back together.
const LEASE_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// `WARMSTART_PUBLISH_LEASE_DEADLINE`, else `[publish] lease_deadline`,
/// else `DEFAULT_LEASE_DEADLINE`. A value that is not a positive duration
/// is an error (exit 10) naming it, never the default.
pub fn lease_deadline(m: &CacheManifest) -> Result<Duration> {
    const VAR: &str = "WARMSTART_PUBLISH_LEASE_DEADLINE";
    match std::env::var(VAR) {
        Ok(v) => clock::parse_positive_duration(&v).map_err(|e| {
            fail(
                Code::Config,
                format!("{VAR}={v:?}: {e} (how long a publish retries a lost lease), or unset it"),
            )
        }),
        Err(std::env::VarError::NotPresent) => {
            Ok(m.lease_deadline.unwrap_or(DEFAULT_LEASE_DEADLINE))
        }
        Err(std::env::VarError::NotUnicode(v)) => Err(fail(
            Code::Config,
            format!("{VAR}={v:?} is not text: give a duration such as 120s, or unset it"),
        )),
    }
}

/// The retry schedule of one publish's push: pauses that double from
/// `LEASE_PAUSE.0` to `LEASE_PAUSE.1`, each between half and all of its
/// nominal length, until the deadline.
pub(crate) struct Lease {
    pub(crate) start: Instant,
    deadline: Duration,
    pub(crate) lost: usize,
    rng: u64,
}

impl Lease {
    pub(crate) fn new(deadline: Duration) -> Lease {
        // Publishers that start together must not draw the same pauses:
        // seed from the process id and the clock.
        let seed = (u64::from(std::process::id()) << 32) ^ clock::now_ns() as u64;
        Lease {
            start: Instant::now(),
            deadline,
            lost: 0,
            rng: seed | 1,
        }
    }

    /// Records a lost lease; the pause before the next attempt, or `None`
    /// when that attempt would start past the deadline.
    pub(crate) fn lost(&mut self) -> Option<Duration> {
        self.lost += 1;
        let shift = (self.lost - 1).min(16) as u32;
        let nominal = LEASE_PAUSE.0.saturating_mul(1 << shift).min(LEASE_PAUSE.1);
        // xorshift64: jitter needs no quality, only variety.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let pause = nominal.mul_f64(0.5 + frac / 2.0);
        (self.start.elapsed() + pause < self.deadline).then_some(pause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_pauses_grow_with_jitter_and_stop_at_the_deadline() {
        let mut a = Lease::new(Duration::from_secs(3600));
        let mut b = Lease::new(Duration::from_secs(3600));
        b.rng = a.rng ^ 0x9e37_79b9_7f4a_7c15;
        let pa: Vec<Duration> = (0..12).map(|_| a.lost().unwrap()).collect();
        let pb: Vec<Duration> = (0..12).map(|_| b.lost().unwrap()).collect();
        for (i, p) in pa.iter().enumerate() {
            let nominal = (LEASE_PAUSE.0 * (1 << i.min(16))).min(LEASE_PAUSE.1);
            assert!(*p >= nominal / 2 && *p <= nominal, "pause {i}: {p:?}");
        }
        assert_ne!(pa, pb, "two publishers drew the same pauses");
        let mut short = Lease::new(Duration::ZERO);
        assert_eq!(short.lost(), None);
        assert_eq!(short.lost, 1);
    }
}
