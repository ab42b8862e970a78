//! Arguments of `cargo xtask resume`: the crash-resume index.

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `cargo xtask resume`: the index path and one subcommand (help text is on
/// `Command::Resume`).
#[derive(Debug, Args)]
pub struct ResumeArgs {
    /// The index file (default: $CRASH_RESUME_INDEX_PATH, else
    /// $HOME/.golems/crash-resume-index.json).
    #[arg(long, global = true, value_name = "FILE")]
    pub path: Option<PathBuf>,
    #[command(subcommand)]
    pub command: ResumeCommand,
}

#[derive(Debug, Subcommand)]
pub enum ResumeCommand {
    /// Record (or refresh) the session running on a surface.
    ///
    /// A surface seen before keeps its `captured_at` and any fields this tool
    /// does not know; `last_active` becomes now.
    Record {
        /// The terminal surface (pane, tab, window) id.
        surface: String,
        /// The agent session id to resume later.
        session: String,
        /// The repository the session works in (picks the launcher; not empty).
        repo: String,
        /// The session's role, e.g. `orchestrator` (stored as null when absent).
        role: Option<String>,
        /// The directory to `cd` into before resuming (made absolute).
        #[arg(long, value_name = "DIR")]
        cwd: Option<PathBuf>,
        /// If the index is corrupt or unreadable, move it aside to
        /// `<index>.corrupt-<ms>` and start a new one (a healthy index is kept).
        #[arg(long)]
        reinit: bool,
    },
    /// Mark a known surface as active now (exit 4 if the surface is unknown).
    Touch {
        /// The terminal surface id.
        surface: String,
    },
    /// Print a surface's entry as JSON, or `null` when there is none.
    Lookup {
        /// The terminal surface id.
        surface: String,
    },
    /// Print the shell line that resumes a surface's session.
    ///
    /// `cd <cwd> && <repo>Claude --resume <session>` (`orcClaude` for the
    /// orchestrator, `repoGolem` when the repository is unknown, or holds `/`,
    /// control or format characters); every word is quoted for a POSIX
    /// shell. Exit 4 when nothing is resumable.
    ResumeCmd {
        /// The terminal surface id.
        surface: String,
        /// Only resume a session active within this many milliseconds.
        #[arg(value_name = "MAX_AGE_MS")]
        max_age_ms: Option<u64>,
        /// Print {launcher, sessionId, cwd, shell_command} as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show every entry, most recently active first.
    List {
        /// Print the entries as a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove the entries not active within MAX_AGE_MS milliseconds.
    Prune {
        /// Age limit in milliseconds, measured from `last_active`
        /// (else `captured_at`).
        #[arg(value_name = "MAX_AGE_MS")]
        max_age_ms: u64,
        /// Print {path, pruned, remaining} as JSON.
        #[arg(long)]
        json: bool,
    },
}
