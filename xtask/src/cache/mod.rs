//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation, `git` the plumbing
//! both halves share (a private cache.git, shallow fetch, blobs, trees, push).
//! The publish half: `pack` (deterministic tar -> zstd -> chunk files),
//! `readme` (the branch README), `publish` (merge the key, root commit, push),
//! `packed` (the local record that lets an unchanged re-publish skip zstd),
//! `prune` (drop old keys in one root commit: `cache prune`, `[publish] keep`).
//! The restore half: `branch` reads and cross-checks a fetched branch,
//! `prefetch` fetches its chunks by id while they are read (`direct` reads
//! them straight from the server's pack stream where it can), `verify` streams it (no unverified byte reaches the decoder), `restore`
//! installs it (`fallback` picks a stand-in key on an exact miss), `stamp` makes the next run warm, `compare` checks an
//! installed copy, `check` is `cache verify`, `status` is `cache list` and
//! `cache status`, `migrate` moves a cache from a branch to a ref, `gc`
//! bounds the chunk store, the private stores' objects and old logs.

pub mod build;
pub mod check;
pub mod fetch;
pub mod format;
pub mod gc;
pub mod manifests;
pub mod publish;
pub mod restore;
pub mod status;

use anyhow::Result;
use xshell::Shell;

use crate::cli::cache::{CacheArgs, CacheCommand};

/// `cargo xtask cache ...`. `live_steps` names the steps restore.toml
/// declares, for gc's log cleanup (`cache gc`, and the gc a restore runs):
/// the cache never reads restore.toml itself.
pub fn run(sh: &Shell, args: CacheArgs, live_steps: gc::LiveSteps) -> Result<()> {
    match &args.command {
        CacheCommand::Publish(a) => a.network.apply()?,
        CacheCommand::Restore(a) => a.network.apply()?,
        CacheCommand::Verify(a) => a.network.apply()?,
        CacheCommand::List(a) | CacheCommand::Status(a) => a.network.apply()?,
        CacheCommand::Migrate(a) => a.network.apply()?,
        CacheCommand::Prune(a) => a.network.apply()?,
        CacheCommand::Resign(a) => a.network.apply()?,
        CacheCommand::Gc(_) | CacheCommand::Build(_) => {}
    }
    match args.command {
        CacheCommand::Publish(a) => publish::run(sh, a),
        CacheCommand::Build(a) => build::run_cli(a),
        CacheCommand::Restore(a) => restore::run(sh, a, live_steps),
        CacheCommand::Verify(a) => check::run(sh, a),
        CacheCommand::List(a) => status::list(sh, a),
        CacheCommand::Status(a) => status::status(sh, a),
        CacheCommand::Migrate(a) => publish::migrate::run(sh, a),
        CacheCommand::Prune(a) => publish::prune::run(sh, a),
        CacheCommand::Resign(a) => publish::resign_run(sh, a),
        CacheCommand::Gc(a) => gc::run(sh, a, live_steps),
    }
}

/// Sizes in every cache message: `size::human`, the progress bars' format
/// (`1.40 GiB`, `512.00 KiB`, `12 B`).
pub fn human_bytes(n: u64) -> String {
    crate::size::human(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_human() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(1_503_238_553), "1.40 GiB");
    }
}
