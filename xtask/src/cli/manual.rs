//! Arguments of `cargo xtask completions` and `cargo xtask man`.

use clap::Args;
use std::path::PathBuf;

/// `completions` (its help text is the `Command::Completions` doc comment).
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `man` (its help text is the `Command::Man` doc comment).
#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write one page per command into this directory (`warmstart.1`,
    /// `warmstart-cache.1`, `warmstart-cache-publish.1`, ...) instead of
    /// printing the top-level page on stdout.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}
