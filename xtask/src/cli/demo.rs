//! Arguments of `cargo xtask demo`.

use clap::Args;
use std::path::PathBuf;

/// `cargo xtask demo` (its help text is the `Command::Demo` doc comment).
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The directory to publish (default: `$(rustc --print sysroot)/lib/rustlib`).
    #[arg(long, value_name = "DIR")]
    pub source: Option<PathBuf>,
    /// Keep the scratch directory (its path is printed) to look around.
    #[arg(long)]
    pub keep: bool,
    /// Print a JSON summary on stdout instead of the narrative.
    #[arg(long)]
    pub json: bool,
}
