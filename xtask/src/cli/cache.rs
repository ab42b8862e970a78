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
    /// Run the manifest's `[build]` and put what it made into the pack root.
    ///
    /// The build runs at the repository root with `WARMSTART_BUILD_OUT`
    /// naming an empty staging directory; once it exits 0 that directory
    /// replaces `[pack] root` in one rename, so a failed, timed-out or
    /// interrupted build leaves the pack root as it was. It publishes
    /// nothing: `cache publish NAME` does, where gates and signing allow.
    Build(BuildArgs),
    /// Fetch, verify every chunk, and install atomically (a warm run is a no-op).
    Restore(RestoreArgs),
    /// Check a cache branch (every chunk and the tar digest) without installing.
    Verify(VerifyArgs),
    /// List the caches of this repository with their keys and local state.
    List(ListArgs),
    /// Show how each key is built, what the branch holds, and on a miss which part differs.
    Status(ListArgs),
    /// Move a cache from its branch to the ref its manifest names (`cache.ref`).
    ///
    /// One atomic push with leases: the same commit goes to the new ref (e.g.
    /// `refs/warmstart/cache/<NAME>`, which plain clones never download) and
    /// the old branch is deleted. Set `ref` in the manifest first.
    Migrate(MigrateArgs),
    /// Drop old keys from a cache branch, in one new root commit pushed with a lease.
    ///
    /// A key goes when every limit given selects it; the key today's pins
    /// give (with each platform value on the branch) always stays. Hosting
    /// servers keep unreachable blobs until they collect garbage, so this
    /// shortens the branch at once but frees remote storage only later.
    Prune(PruneArgs),
    /// Re-sign the keys of a cache branch with a new signing key, without repacking.
    ///
    /// Only keys whose signature is trusted at HEAD are re-signed (rotate by
    /// adding the new signer, re-signing, then removing the old one).
    Resign(ResignArgs),
    /// Bound this clone's local state: unneeded chunks, unreachable objects, old logs.
    ///
    /// Never removes a chunk an installed key needs. Removes chunks not
    /// fetched or used for `--keep`, then, while the stores are over
    /// `--max-size`, the least recently used others; drops refs of branches
    /// no manifest names and objects no ref reaches in cache.git and
    /// cache-meta.git; removes logs of steps restore.toml no longer names
    /// after 30 days. Waits for running restores (exit 3 after
    /// WARMSTART_LOCK_TIMEOUT). A restore runs it by itself when the stores
    /// pass WARMSTART_GC_SIZE.
    Gc(GcArgs),
}

#[derive(Debug, Args)]
pub struct GcArgs {
    /// The stores' size budget (`4G`, `512M`; default WARMSTART_GC_SIZE, else 4G).
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size_arg)]
    pub max_size: Option<u64>,
    /// Keep unneeded chunks used within this long (`2w`, `14d`, `12h`, `0s`; default WARMSTART_GC_KEEP, else 14d).
    #[arg(long, value_name = "DURATION")]
    pub keep_for: Option<String>,
    /// The old name of `--keep-for`: refused with a pointer to it, since
    /// `cache prune --keep` is a count and `cache gc --keep 3` read as 3 s.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = renamed_keep)]
    pub keep: Option<String>,
    /// Say what would go, and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// The cache: `cache-manifests/<NAME>.toml`, whose `cache.ref` is the new place.
    pub name: String,
    /// The branch the cache lives on now (default: `<NAME>-cache`).
    #[arg(long)]
    pub from: Option<String>,
    /// The remote (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub network: super::NetworkArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// `cache gc --keep`, renamed: always an error that names the new flag.
fn renamed_keep(value: &str) -> Result<String, String> {
    Err(format!(
        "`cache gc --keep` is now `--keep-for {value}` (a duration, such as 2w or 14d); `--keep` is a count of keys in `cache prune`"
    ))
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// Keep the N newest keys (by created_at) of each platform value.
    #[arg(long, value_name = "N")]
    pub keep: Option<usize>,
    /// Drop keys published longer ago than this (`30d`, `12h`, `1h30m`).
    #[arg(long, value_name = "DURATION")]
    pub older_than: Option<String>,
    /// Say which keys would go, and push nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The remote to push to (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub network: super::NetworkArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct ResignArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// Only these keys (default: every key on the branch).
    #[arg(long = "key", value_name = "KEY")]
    pub keys: Vec<String>,
    /// The ssh private key to sign with (default: `WARMSTART_SIGNING_KEY`).
    #[arg(long, value_name = "FILE")]
    pub signing_key: Option<std::path::PathBuf>,
    /// The remote to push to (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub network: super::NetworkArgs,
    #[command(flatten)]
    pub out: OutputArgs,
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
    /// Publish from a HEAD that no remote-tracking branch of the remote
    /// contains (as last fetched): without it that is refused (exit 9),
    /// since the cache would describe a tree nobody else can check out.
    /// Never lets a signed key be replaced by an unsigned one.
    #[arg(long)]
    pub allow_unpushed: bool,
    /// The remote to push to (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    /// Sign the key's statement with this ssh private key (default: `WARMSTART_SIGNING_KEY`).
    #[arg(long, value_name = "FILE")]
    pub signing_key: Option<std::path::PathBuf>,
    /// Check the remote first, and publish only when it lacks this key: a
    /// key on the branch that HEAD's trust policy refuses (unsigned under
    /// `require`, signed by nobody allowed) counts as missing and is
    /// replaced. A present key costs the branch fetch and one signature
    /// check: the pack root is not even read (status `present`). A missing
    /// key of a manifest with `[build]` is built first (`cache build`), after
    /// the checks that would refuse its publish.
    #[arg(long, conflicts_with = "key_only")]
    pub missing: bool,
    #[command(flatten)]
    pub network: super::NetworkArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// The cache: `cache-manifests/<NAME>.toml`, which must have a `[build]` table.
    pub name: String,
}

#[derive(Debug, Args)]
pub struct RestoreArgs {
    /// The cache: `cache-manifests/<NAME>.toml`.
    pub name: String,
    /// Re-verify the installed copy even when the stamp says it is current.
    #[arg(long)]
    pub verify: bool,
    /// Restore this branch key instead of the one the pins give (for
    /// debugging and scripts; exit 4 when the branch lacks it). The next
    /// plain restore installs the pins' key again.
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// The remote to fetch from (default: the manifest's, else `origin`).
    #[arg(long)]
    pub remote: Option<String>,
    #[command(flatten)]
    pub network: super::NetworkArgs,
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
    pub network: super::NetworkArgs,
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
    pub network: super::NetworkArgs,
    #[command(flatten)]
    pub out: OutputArgs,
}

/// Output flags shared by every cache command.
#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

impl OutputArgs {
    /// The global `--quiet`: for cache commands, no text report on stdout
    /// either (`--json` is still printed).
    pub fn quiet(&self) -> bool {
        crate::out::quiet()
    }
}
