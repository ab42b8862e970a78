//! Arguments of `cargo xtask demo`.

use clap::Args;
use std::path::PathBuf;

/// Run the main job end to end on a local default, with no setup.
///
/// In a scratch directory: a bare `origin.git` set up like a hosting server,
/// a repository with its own `cache-manifests/demo.toml`, `cache publish`
/// of a real directory (by default this machine's
/// `$(rustc --print sysroot)/lib/rustlib`), a fresh clone, `cache restore`
/// into it, and a byte-for-byte comparison with the source. Prints what
/// happened, the timings, and the commands for real use. Touches nothing
/// outside the scratch directory, which is removed at the end.
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
