//! Arguments of `cargo xtask cache ...`.

use clap::{Args, Subcommand};

/// Cache branches: publish an artifact to an orphan branch of the repository's
/// remote, and restore it on any machine, verified byte for byte.
///
/// Each cache is described by `cache-manifests/<NAME>.toml`: what to pack,
/// how its key is built, where it restores, and which gates a publish needs.
#[derive(Debug, Args)]
pub struct CacheArgs {
    #[command(subcommand)]
    pub command: CacheCommand,
}

#[derive(Debug, Subcommand)]
pub enum CacheCommand {
    /// Pack, compress, chunk and push the artifact as the single commit of its branch.
    ///
    /// Refused unless the manifest's required gates are green for the current
    /// tree (see `gates --help`). An unchanged artifact makes no commit
    /// and no push.
    Publish(PublishArgs),
    /// Fetch, verify every chunk, and install atomically (a warm run is a no-op).
    Restore(RestoreArgs),
    /// Check a cache branch (every chunk and the tar digest) without installing.
    Verify(VerifyArgs),
    /// List the caches of this repository with their keys and local state.
    List(ListArgs),
    /// Show how each key is built, what the branch holds, and on a miss which part differs.
    Status(ListArgs),
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// Print the key (and how it was built) and stop.
    #[arg(long)]
    pub key_only: bool,
    /// Print the plan (files, key, branch, remote) without packing or pushing.
    #[arg(long)]
    pub dry_run: bool,
    /// Publish even though the required gates are not green (loud; recorded in warmstart.json).
    #[arg(long)]
    pub allow_ungated: bool,
    /// The remote to push to (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// Re-verify the installed copy even when the stamp says it is current.
    #[arg(long)]
    pub verify: bool,
    /// The remote to fetch from (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// The remote to fetch from (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only these caches (default: every manifest in cache-manifests/).
    pub names: Vec<String>,
    /// Do not contact the remote; show local state only.
    #[arg(long)]
    pub offline: bool,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// Output flags shared by every cache command.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print nothing but errors.
    #[arg(long, short)]
    pub quiet: bool,
}
