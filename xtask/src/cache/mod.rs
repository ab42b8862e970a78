//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation, `git` the plumbing
//! both halves share (a private cache.git, shallow fetch, blobs, trees, push).
//! The publish half: `pack` (deterministic tar -> zstd -> chunk files),
//! `readme` (the branch README), `publish` (merge the key, root commit, push).
//! The restore half: `branch` reads and cross-checks a fetched branch,
//! `verify` streams it (no unverified byte reaches the decoder), `restore`
//! installs it, `stamp` makes the next run warm, `compare` checks an
//! installed copy.

pub mod branch;
pub mod compare;
pub mod format;
pub mod git;
pub mod manifest;
pub mod pack;
pub mod publish;
pub mod readme;
pub mod restore;
pub mod stamp;
pub mod verify;

use anyhow::Result;
use xshell::Shell;

use crate::cli::cache::{CacheArgs, CacheCommand};
use crate::exit::{Code, fail};

/// `cargo xtask cache ...`.
pub fn run(sh: &Shell, args: CacheArgs) -> Result<()> {
    match args.command {
        CacheCommand::Publish(a) => publish::run(sh, a),
        CacheCommand::Restore(a) => restore::run(sh, a),
        // The restore half (branch cache-restore) wires these arms.
        CacheCommand::Verify(_) | CacheCommand::List(_) | CacheCommand::Status(_) => Err(fail(
            Code::Failed,
            "this build of warmstart lacks cache verify, list and status: they come with the restore half",
        )),
    }
}
