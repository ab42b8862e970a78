//! `cache`: a cache of `cache-manifests/<cache>.toml`, restored by the cache module.
//!
//! An adapter, nothing more: the probe is `cache::restore::is_warm` (key,
//! stamp and ready-probe: no network, no hashing, no write), the run is
//! `cache::restore::restore_named`, which fetches, verifies and installs
//! atomically under its own lock and stamp. On an exact miss of a cache
//! whose manifest sets `[build] on_miss`, a background step hands the miss
//! to `cache::restore::writeback`, which builds the key and publishes or
//! installs it. This module never reads a cache branch or writes into a
//! cache's target itself.

use anyhow::Result;
use anyhow::bail;
use serde::Deserialize;

use super::common::{Ctx, Outcome, Probe};
use crate::cache::restore::{self as cache_restore, PartialInfo, RestoreOptions, State, writeback};
use crate::restore::proc::Log;

/// A cache of `cache-manifests/<cache>.toml`, restored by the cache module.
#[derive(Debug)]
pub struct CacheStep {
    /// The cache manifest's name.
    pub cache: String,
    /// Fetch from this remote (name or URL) instead of the manifest's.
    pub remote: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCache {
    cache: String,
    remote: Option<String>,
}

pub fn resolve_cache(r: RawCache) -> Result<CacheStep> {
    let ok = !r.cache.is_empty()
        && !r.cache.starts_with('.')
        && r.cache
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!(
            "`cache` = {:?} must name a manifest cache-manifests/<cache>.toml (letters, digits, `.`, `_`, `-`)",
            r.cache
        );
    }
    if crate::cache::format::manifest::RESERVED.contains(&r.cache.as_str()) {
        bail!(
            "`cache` = {:?} names a reserved file, not a cache manifest",
            r.cache
        );
    }
    if let Some(remote) = &r.remote
        && (remote.is_empty() || remote.starts_with('-'))
    {
        bail!("`remote` = {remote:?} is not a remote name or URL");
    }
    Ok(CacheStep {
        cache: r.cache,
        remote: r.remote,
    })
}

fn short(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

/// `used stands in for wanted (src 2 -> 1)`: the WHAT of a partial row.
fn stands_in(p: &PartialInfo) -> String {
    let differs: Vec<String> = p
        .differs
        .iter()
        .map(|d| {
            format!(
                "{} {} -> {}",
                d.name,
                d.wanted.as_deref().unwrap_or("(none)"),
                d.used.as_deref().unwrap_or("(none)")
            )
        })
        .collect();
    format!(
        "{} stands in for {} ({}; fallback {})",
        p.used,
        p.wanted,
        differs.join(", "),
        p.fallback
    )
}

fn partial_json(p: &PartialInfo) -> serde_json::Value {
    serde_json::to_value(p).unwrap_or_default()
}

pub fn probe(ctx: &Ctx, c: &CacheStep) -> Probe {
    match cache_restore::is_warm(ctx.sh, ctx.repo, &c.cache) {
        Ok(Ok((s, Some(p)))) => Probe::Partial {
            what: format!(
                "{} at {} ({}@{}); exact key looked for again after {}",
                stands_in(&p),
                s.target.display(),
                s.branch,
                short(&s.commit),
                p.recheck_after
            ),
            partial: partial_json(&p),
        },
        // Built here and not published: said on every run, in the row and
        // as a warning, until a recheck finds the key on the branch.
        Ok(Ok((s, None))) if s.built.is_some() => {
            let line = s.built.map(|b| b.unpublished).unwrap_or_default();
            Probe::Warm {
                what: format!("{} at {}: {line}", s.key, s.target.display()),
                warnings: vec![line],
            }
        }
        Ok(Ok((s, None))) => Probe::warm(format!(
            "{} at {} ({}@{})",
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

/// Runs the step; `background` says whether it runs in the background
/// worker, the only place a write-back build may run from.
pub fn run(ctx: &Ctx, c: &CacheStep, background: bool, log: &mut Log) -> Result<Outcome> {
    let opts = RestoreOptions {
        remote: c.remote.clone(),
        live_steps: crate::restore::step_names,
        ..RestoreOptions::default()
    };
    let o = match cache_restore::restore_named(ctx.sh, ctx.repo, &c.cache, &opts) {
        Ok(o) => o,
        Err(miss) => {
            let w = writeback::on_miss(ctx.sh, ctx.repo, &c.cache, &opts, background, miss)?;
            return Ok(wrote_back(&w, log));
        }
    };
    if o.layout == "built"
        && let Some(line) = writeback::unpublished(ctx.sh, ctx.repo, &c.cache)
    {
        let what = format!("{} at {}: {line}", o.key, o.target.display());
        return Ok(Outcome::done(what).with_warnings(vec![line]));
    }
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
    let partial = o.partial.as_ref().filter(|_| o.state == State::Partial);
    Ok(Outcome::done(match (o.state, partial) {
        (State::Partial, Some(p)) => {
            format!("{} at {} (from {from})", stands_in(p), o.target.display())
        }
        (State::Warm | State::Reused | State::Verified | State::Partial, _) => {
            format!("{} at {} (from {from})", o.key, o.target.display())
        }
        // The files an overlay kept are named in the row, not only the log:
        // the user must know their edits outlived the restore.
        (State::Restored | State::Repaired, _) => format!(
            "restored {} into {} from {from}: {} in {} entries{}{}",
            o.key,
            o.target.display(),
            crate::cache::human_bytes(o.bytes),
            o.files,
            o.fetch_words(),
            o.kept_words()
        ),
    })
    .with_partial(partial.map(partial_json)))
}

/// The row of a write-back: what was built, and whether it was published
/// (then installed from the branch) or installed from the pack root with
/// the line saying what to run to publish it.
fn wrote_back(w: &writeback::WriteBack, log: &mut Log) -> Outcome {
    let took = match &w.built {
        Some(b) => {
            log.line(&format!(
                "built {} in {}; its output is in {}",
                w.key,
                crate::clock::human(b.duration),
                b.log.display()
            ));
            format!("in {}", crate::clock::human(b.duration))
        }
        None => "earlier: the pack root still holds it".to_string(),
    };
    match (&w.published, &w.unpublished) {
        (Some(o), _) => {
            log.line(&o.summary());
            Outcome::done(format!(
                "built {} {took}, published it to {}@{} and installed it at {} from there",
                w.key,
                o.branch,
                short(&o.commit),
                w.target.display()
            ))
        }
        (None, line) => {
            let line = line.clone().unwrap_or_default();
            log.line(&line);
            Outcome::done(format!(
                "{} at {} (built {took}): {line}",
                w.key,
                w.target.display()
            ))
            .with_warnings(vec![line])
        }
    }
}
