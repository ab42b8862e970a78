//! Arguments of `cargo xtask restore ...`.

use clap::{Args, Subcommand};

/// Bring this machine back to working order: run the ordered steps of
/// `cache-manifests/restore.toml` (cache branches, submodules, symlink farms,
/// commands, pinned downloads and `.conda` packages, tool version pins,
/// branch freshness, long-running services).
///
/// Every step first asks a cheap "already done?" probe and only runs when
/// needed, so a warm run is a near-instant no-op. A failed step prints one
/// line and the others go on (fail-open) unless `--strict` is given. Steps
/// marked `background = true` continue after the command returns; `cargo
/// xtask restore status` shows their progress. Each step that runs writes its
/// own log under `<git-dir>/warmstart/logs/`. The run ends with a table: step,
/// source, state (done, warm, warned, failed-open, background), time this run,
/// last cold time.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct RestoreArgs {
    #[command(subcommand)]
    pub command: Option<RestoreCommand>,
    /// Run only these steps (by name; repeat the flag or separate with commas).
    #[arg(long, value_name = "STEP", value_delimiter = ',')]
    pub only: Vec<String>,
    /// Return at once and do the whole restore in a detached process.
    #[arg(long, conflicts_with_all = ["strict", "dry_run"])]
    pub background: bool,
    /// Make any step failure fatal (exit 11), and run background steps in the
    /// foreground so that the command returns only when everything is done.
    #[arg(long)]
    pub strict: bool,
    /// Print the validated plan and touch nothing (no probe, no network).
    #[arg(long)]
    pub dry_run: bool,
    /// Print the result (or the plan) as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Internal: this process is the detached worker that runs background steps.
    #[arg(long, hide = true)]
    pub worker: bool,
    #[command(flatten)]
    pub network: super::NetworkArgs,
}

#[derive(Debug, Subcommand)]
pub enum RestoreCommand {
    /// Show the last state of every step, including background steps still
    /// running (with their process id and log file).
    Status(StatusArgs),
    /// Stop a `service` step's process (default: every service of the plan):
    /// SIGTERM to its whole process group, SIGKILL after its `kill_grace`,
    /// then remove its pidfile. A pidfile that does not prove the process is
    /// the service (pid reused, zombie, garbage) signals nothing.
    Stop(StopArgs),
    /// Print the PATH prepends and variables that restore.toml declares
    /// (`path = [...]`, `env = {...}` on steps and in `[env]`), for `eval`.
    ///
    /// Reads the recorded state only and runs no probe: `[env]` always
    /// counts, a step only when its last run was done or warm. A failed
    /// step adds nothing; a step still running in the background is left
    /// out with a line on stderr (eval again later).
    Env(EnvArgs),
}

#[derive(Debug, Args)]
pub struct EnvArgs {
    /// The shell to write for (default: the file name of $SHELL, else sh).
    #[arg(long, value_enum, conflicts_with_all = ["json", "github", "append"])]
    pub shell: Option<ShellKind>,
    /// Append to the files GitHub Actions names in $GITHUB_ENV and
    /// $GITHUB_PATH, so that later steps of the job see the exports.
    #[arg(long)]
    pub github: bool,
    /// Append the sh form to FILE (created if missing), such as the env
    /// file an agent hook passes. Nothing is printed on stdout.
    #[arg(long, value_name = "FILE")]
    pub append: Option<std::path::PathBuf>,
    /// Print JSON (`path`, `env`, `from`, `left_out`) instead of shell code.
    #[arg(long)]
    pub json: bool,
}

/// The shells `restore env` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ShellKind {
    Sh,
    Bash,
    Zsh,
    Fish,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct StopArgs {
    /// The service step to stop (default: all of them).
    #[arg(value_name = "STEP")]
    pub step: Option<String>,
    /// Print JSON on stdout instead of one line per service.
    #[arg(long)]
    pub json: bool,
}
