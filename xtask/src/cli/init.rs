//! Arguments of `init`: set up warmstart in a repository.

use clap::{Args, ValueEnum};

/// `init` (its help text is the `Command::Init` doc comment).
#[derive(Debug, Args)]
pub struct InitArgs {
    /// Write nothing: report each file, and exit 6 when a generated file is
    /// missing or stale (a file you changed is reported, and does not fail).
    #[arg(long)]
    pub check: bool,
    /// Which binary the bootstrap script fetches: the repository's own xtask
    /// crate (the default when `xtask/Cargo.toml` exists), or the standalone
    /// `warmstart` binary.
    #[arg(long, value_enum)]
    pub binary: Option<Binary>,
    /// A published wheel's hash (`sha256:<hex>`, repeatable) for the
    /// bootstrap's registry step, `pip install --require-hashes
    /// warmstart==<this version>`. Without it the step is omitted.
    #[arg(long, value_name = "HASH")]
    pub pip_hash: Vec<String>,
    /// A signer allowed to publish caches, as `PRINCIPAL=PUBLIC_KEY_FILE`
    /// (repeatable, e.g. `ci=ci_signing_key.pub`): written to
    /// cache-manifests/allowed_signers, and then cache-manifests/trust.toml
    /// with `policy = "require"` and `signed_gates = true` (a gate record
    /// counts only when an allowed signer signed it). Without it no policy
    /// is written (off).
    #[arg(long, value_name = "PRINCIPAL=FILE")]
    pub signer: Vec<String>,
    /// Do not wire the `SessionStart` hook into `.claude/settings.json`, now
    /// or on later runs: the choice is recorded in
    /// cache-manifests/restore.toml, and `init --check` then reports the hook
    /// as `off` rather than unwired. `--agent-hook` wires it again.
    #[arg(long, conflicts_with = "agent_hook")]
    pub no_agent_hook: bool,
    /// Wire the `SessionStart` hook again after an earlier `--no-agent-hook`.
    #[arg(long)]
    pub agent_hook: bool,
    /// Print the file init would generate at PATH (e.g.
    /// tools/warmstart-bootstrap.sh) to stdout and write nothing: the new
    /// version of a file you edited, to compare with yours (`init --print
    /// PATH | diff -u PATH -`).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["check", "json"])]
    pub print: Option<String>,
    /// Print one JSON object: `files` (each `path`, `state`, `detail`),
    /// `registry_step`, `post_create_command`, `stale`.
    #[arg(long)]
    pub json: bool,
}

/// The binary the bootstrap script gets for this repository.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Binary {
    /// The repository's own xtask crate (depends on the warmstart library).
    Xtask,
    /// The standalone warmstart binary, keyed by its version.
    Standalone,
}
