//! `cargo xtask cache restore`: fetch, verify, install atomically, stamp.
//!
//! The warm path (stamp matches the current key, target and mode, and the
//! manifest's ready-probe holds) returns before any lock, fetch or hash. The
//! cold path takes the target's lock (one restorer per target), re-checks
//! the stamp (a restorer that waited reuses the one that worked), completes
//! or undoes what a killed run left behind, fetches the branch shallow into
//! cache.git, streams it through `verify::stream` into a staging directory
//! beside the target, and only then swaps it in (`unpack::swap_dir`) or
//! merges it (`unpack::merge_into`, journaled), and writes the stamp.
//!
//! This module never writes into the target except through `unpack`'s swap
//! and merge, never installs a byte before every digest matched, and never
//! leaves a stamp that describes anything but a complete install.

pub mod branch;
pub mod compare;
pub mod delta;
pub mod overlay;
pub mod stamp;
pub mod verify;
pub mod writeback;

mod choose;
mod cold;
mod fetch;
mod lock;
mod outcome;
mod stream;
mod warm;

use choose::*;
use cold::*;
pub use fetch::*;
pub use lock::*;
pub use outcome::*;
pub use stream::*;
pub use warm::*;

use crate::cache::human_bytes;
use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xshell::Shell;

use crate::cache::fetch::prefetch;
use crate::cache::format::manifest::{CacheManifest, Key, Mode, Ready};
use crate::cache::restore::branch::{Branch, Content, KeyPlan};
use crate::cache::restore::stamp::{Loaded, Miss, Stamp};
use crate::cli::cache::RestoreArgs;
use crate::clock;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote};
use crate::hex;
use crate::repo::Repo;
use crate::unpack;

/// How long a restorer waits for another one working on the same target,
/// unless `WARMSTART_LOCK_TIMEOUT` (`90s`, `5m`, or seconds) says otherwise.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(1800);

/// How `restore_named` runs.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Fetch from this remote (name or URL) instead of the manifest's.
    pub remote: Option<String>,
    /// Ignore the stamp: fetch, verify, and compare the installed copy with
    /// the cache; replace it only if it differs.
    pub verify: bool,
    /// Show progress bars (only ever on a terminal).
    pub progress: bool,
    /// Restore this branch key instead of the one the manifest's pins give
    /// (`cache restore --key`).
    pub key: Option<String>,
    /// Give up waiting for another restorer of the same target after this.
    pub lock_timeout: Duration,
    /// The steps restore.toml names, for the gc a restore may run.
    pub live_steps: crate::cache::gc::LiveSteps,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            remote: None,
            verify: false,
            progress: false,
            key: None,
            lock_timeout: lock_timeout_from_env(),
            live_steps: crate::cache::gc::unknown_steps,
        }
    }
}

/// `WARMSTART_LOCK_TIMEOUT`, else the default. A value that does not parse
/// never gets here: `settings::check_env` refused it (exit 10) at startup.
fn lock_timeout_from_env() -> Duration {
    crate::settings::duration("WARMSTART_LOCK_TIMEOUT")
        .ok()
        .flatten()
        .unwrap_or(DEFAULT_LOCK_TIMEOUT)
}

/// `cargo xtask cache restore NAME`.
pub fn run(sh: &Shell, args: RestoreArgs, live_steps: crate::cache::gc::LiveSteps) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let opts = RestoreOptions {
        remote: args.remote,
        verify: args.verify,
        key: args.key,
        progress: !args.out.quiet() && !args.out.json && std::io::stderr().is_terminal(),
        live_steps,
        ..RestoreOptions::default()
    };
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let outcome = restore_named(sh, &repo, &args.name, &opts)?;
    if args.out.json {
        crate::contract::document(&outcome);
    } else if !args.out.quiet() {
        if let Some(note) = outcome.trust.as_ref().and_then(|t| t.note.as_ref()) {
            println!("{note}");
        }
        println!("{}", outcome.summary());
    }
    Ok(())
}

/// Restores cache `name` of `repo`: a no-op when warm, else fetch, verify
/// and install. The API `cargo xtask restore`'s `cache` steps call.
pub fn restore_named(
    sh: &Shell,
    repo: &Repo,
    name: &str,
    opts: &RestoreOptions,
) -> Result<RestoreOutcome> {
    let start = Instant::now();
    let started_ms = clock::now_ms();
    let m = crate::cache::manifests::load(repo, name)?;
    let key = match &opts.key {
        // Its parts are known once the branch is read (`cold`).
        Some(k) => {
            crate::cache::format::check_key(k)
                .map_err(|e| fail(Code::Usage, format!("--key: {e:#}")))?;
            Key {
                value: k.clone(),
                parts: Vec::new(),
            }
        }
        None => crate::cache::manifests::compute_key(sh, repo, &m)?,
    };
    let state_dir = records_dir(repo, &m)?;
    let stamp_file = stamp::path(&state_dir, name);

    let mut reason = None;
    if !opts.verify {
        match warm_check(&m, &key, &stamp_file, true)? {
            Ok(s) => return Ok(from_stamp(&m, &s, State::Warm, start, Phases::default())),
            Err(miss) => reason = Some(miss.to_string()),
        }
    }

    let (_lock, waited) = lock_target(&state_dir, &m.restore_path, opts.lock_timeout)?;
    let phases = Phases {
        lock_wait_ms: waited.as_millis() as u64,
        ..Phases::default()
    };
    // Another restorer may have installed this key while we waited: use
    // its result (with --verify, only if it finished after we started).
    if let Ok(s) = warm_check(&m, &key, &stamp_file, true)?
        && (!opts.verify || s.restored_at_ms >= started_ms)
    {
        return Ok(from_stamp(&m, &s, State::Reused, start, phases));
    }
    // A damaged cache.git is rebuilt once and the restore starts over
    // (`git::healing`); nothing was installed by the failed attempt.
    // `cache gc` removes no chunk while this restore may read one.
    // The chunk store is this worktree's, whichever directory the records use.
    let reading = crate::cache::gc::Reading::take(&repo.state_dir(), opts.lock_timeout)?;
    let mut outcome = crate::git::healing(|| {
        let cold = Cold {
            sh,
            repo,
            m: &m,
            stamp_file: &stamp_file,
            opts,
            start,
        };
        cold.run(&key, phases.clone())
    })
    .with_context(|| format!("restoring cache {name} into {}", m.restore_path.display()))?;
    drop(reading);
    crate::cache::gc::after_restore(sh, repo, opts.live_steps);
    outcome.reason = reason;
    Ok(outcome)
}

/// Whether cache `name` is installed for its current key, without doing
/// anything: `Ok(Ok((stamp, partial)))` when warm (`partial` when a
/// fallback key stands in), `Ok(Err(why))` when a restore would
/// work. Read-only: it computes the key (git pins run `git rev-parse`),
/// reads the stamp and runs the ready-probe; no lock, no fetch, no hashing,
/// no write (a corrupt stamp is only reported: `restore_named` sets it
/// aside). The probe `cargo xtask restore`'s `cache` steps use.
pub fn is_warm(
    sh: &Shell,
    repo: &Repo,
    name: &str,
) -> Result<Result<(Stamp, Option<PartialInfo>), String>> {
    let m = crate::cache::manifests::load(repo, name)?;
    let key = crate::cache::manifests::compute_key(sh, repo, &m)?;
    let file = stamp::path(&records_place(repo, &m), name);
    Ok(warm_check(&m, &key, &file, false)?
        .map(|s| {
            let partial = partial_info(&m, &s);
            (s, partial)
        })
        .map_err(|miss| miss.to_string()))
}
