//! Arguments of `cargo xtask gates`: run, status, check, fetch, push.

use clap::{Args, Subcommand};
use std::time::Duration;

use crate::clock::parse_positive_duration as parse_duration;

// The group's help is the doc comment of `Command::Gates` in cli/mod.rs.
#[derive(Debug, Args)]
pub struct GatesArgs {
    #[command(subcommand)]
    pub command: GatesCommand,
}

#[derive(Debug, Subcommand)]
pub enum GatesCommand {
    /// Run gates with live output, then print a summary table; each gate that
    /// passes is recorded green for HEAD's tree at once.
    ///
    /// Refuses a dirty worktree (modified or untracked files, except the
    /// `ignore` paths of gates.toml) unless --no-record. A gate that fails or
    /// times out records nothing; its output tail and log path are printed,
    /// and the exit code is 11. A gate past its timeout gets SIGTERM, then
    /// SIGKILL after `kill_grace`, with its whole process group.
    Run(RunArgs),
    /// Show which gates are green for HEAD's tree, and whether the worktree is clean.
    Status(StatusArgs),
    /// Exit 0 if the gates are green for HEAD's tree on a clean worktree, else
    /// exit 9 naming the missing gates and the command that makes them green.
    ///
    /// Where trust.toml sets `signed_gates` (or with --require-signed), an
    /// entry counts only when an allowed signer of HEAD signed it for this
    /// tree, gate and command: exit 12 naming the first that is not. This is
    /// the check `cache publish` makes; CI jobs call it before anything that
    /// must only happen on a proven tree.
    Check(CheckArgs),
    /// Fetch HEAD's tree's record from a remote and merge it into the local one.
    Fetch(RemoteArgs),
    /// Push HEAD's tree's record to a remote (merging the remote's first, so
    /// the push is a fast-forward; never forced).
    Push(RemoteArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Gates to run, in this order [default: every gate, in gates.toml order]
    pub names: Vec<String>,
    /// After a gate fails, run the remaining ones anyway [default: stop]
    #[arg(long)]
    pub keep_going: bool,
    /// Skip the gates already green for this tree: on an entry an allowed
    /// signer signed where trust.toml sets `signed_gates`, else only on one
    /// this clone's own `gates run` recorded (a fetched record never skips)
    #[arg(long)]
    pub skip_green: bool,
    /// Only run and report: record nothing, and allow a dirty worktree
    #[arg(long)]
    pub no_record: bool,
    /// Print the summary as JSON on stdout (gate output still goes to stderr)
    #[arg(long)]
    pub json: bool,
    /// Sign each recorded entry with the signing key (`--signing-key`, else `WARMSTART_SIGNING_KEY`)
    #[arg(long)]
    pub sign: bool,
    /// The ssh private key to sign entries with (implies --sign)
    #[arg(long, value_name = "FILE")]
    pub signing_key: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub fetch: FetchFirst,
    /// Print JSON on stdout
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Gates that must be green [default: every gate in gates.toml]
    pub names: Vec<String>,
    #[command(flatten)]
    pub fetch: FetchFirst,
    /// Print the verdict (and the record when green) as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Accept only entries signed by an allowed signer of HEAD (exit 12
    /// otherwise), as trust.toml's `signed_gates` makes every check do
    #[arg(long)]
    pub require_signed: bool,
}

/// Reading commands are local by default (fast, no network); these flags
/// fetch first.
#[derive(Debug, Args)]
pub struct FetchFirst {
    /// First fetch this tree's record from REMOTE [default: origin]; if the
    /// fetch fails, warn and use the local records
    #[arg(long, value_name = "REMOTE", num_args = 0..=1, require_equals = true, default_missing_value = "origin")]
    pub fetch: Option<String>,
    /// Give up on that fetch after this long in all (e.g. 500ms, 20s, 1m30s)
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub timeout: Duration,
    /// The old name of `--timeout`: refused with a pointer to it, since
    /// every command names its whole-operation bound `--timeout`.
    #[arg(long, hide = true, value_name = "DURATION", value_parser = renamed_fetch_timeout)]
    pub fetch_timeout: Option<String>,
    #[command(flatten)]
    pub network: super::NetworkArgs,
}

/// `--fetch-timeout`, renamed: always an error that names the new flag.
fn renamed_fetch_timeout(value: &str) -> Result<String, String> {
    Err(format!(
        "`--fetch-timeout` is now `--timeout {value}` (the whole fetch); `--connect-timeout` and `--stall-timeout` bound each network step"
    ))
}

#[derive(Debug, Args)]
pub struct RemoteArgs {
    /// A remote name or URL
    #[arg(default_value = "origin")]
    pub remote: String,
    /// Give up on the whole fetch or push (every network step of it, and
    /// its retries) after this long (e.g. 20s, 2m, 1m30s)
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub network: super::NetworkArgs,
    /// Print JSON on stdout
    #[arg(long)]
    pub json: bool,
}
