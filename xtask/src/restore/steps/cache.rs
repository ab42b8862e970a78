//! `cache`: a cache of `cache-manifests/<cache>.toml`, restored by the cache module.
//!
//! An adapter, nothing more: the probe is `cache::restore::is_warm` (key,
//! stamp and ready-probe: no network, no hashing, no write), the run is
//! `cache::restore::restore_named`, which fetches, verifies and installs
//! atomically under its own lock and stamp. This module never reads a cache
//! branch or writes into a cache's target itself.

use anyhow::Result;

use super::{Ctx, Outcome, Probe};
use crate::cache::restore::{self as cache_restore, RestoreOptions, State};
use crate::restore::plan::CacheStep;
use crate::restore::proc::Log;

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

pub fn probe(ctx: &Ctx, c: &CacheStep) -> Probe {
    match cache_restore::is_warm(ctx.sh, ctx.repo, &c.cache) {
        Ok(Ok(s)) => Probe::warm(format!(
            "{}{} at {} ({}@{})",
            s.partial
                .as_ref()
                .map(|p| format!("partial: stands in for {}: ", p.wanted))
                .unwrap_or_default(),
            s.key,
            s.target.display(),
            s.branch,
            short(&s.commit)
        )),
        Ok(Err(why)) => Probe::Needed(format!("cache {}: {why}", c.cache)),
        // A manifest that does not load or a key that cannot be computed:
        // the run says so (as the step's failure, fail-open by default).
        Err(e) => Probe::Needed(format!("cache {}: {e:#}", c.cache)),
    }
}

pub fn run(ctx: &Ctx, c: &CacheStep, log: &mut Log) -> Result<Outcome> {
    let opts = RestoreOptions {
        remote: c.remote.clone(),
        ..RestoreOptions::default()
    };
    let o = cache_restore::restore_named(ctx.sh, ctx.repo, &c.cache, &opts)?;
    log.line(&o.summary());
    log.line(&format!(
        "fetch {} ms, unpack {} ms, install {} ms, lock wait {} ms; {} bytes hashed",
        o.phases.fetch_ms,
        o.phases.unpack_ms,
        o.phases.install_ms,
        o.phases.lock_wait_ms,
        o.bytes_hashed
    ));
    let from = format!("{} {}@{}", o.source, o.branch, short(&o.commit));
    Ok(Outcome::done(match o.state {
        State::Warm | State::Reused | State::Verified => {
            format!("{} at {} (from {from})", o.key, o.target.display())
        }
        State::Partial => format!(
            "partial: {} stands in for {} at {} (from {from})",
            o.key,
            o.partial.as_ref().map_or("?", |p| p.wanted.as_str()),
            o.target.display()
        ),
        State::Restored | State::Repaired => format!(
            "restored {} into {} from {from}: {} in {} entries",
            o.key,
            o.target.display(),
            crate::cache::human_bytes(o.bytes),
            o.files
        ),
    }))
}
