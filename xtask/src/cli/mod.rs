//! Every command-line type of `cargo xtask`, one file per command group.
//!
//! Doc comments here are the `--help` text: write them for the reader who
//! has never seen warmstart. This module only describes arguments; it never
//! does any work (that is `crate::run` and the capability modules).

pub mod cache;
pub mod demo;

use clap::{Parser, Subcommand};

/// warmstart: make a fresh or recycled machine fully working again in
/// seconds, from caches kept in the git repository itself.
///
/// Run it as `cargo xtask <COMMAND>` inside any repository that has a
/// `cache-manifests/` folder. Exit codes are listed in README.md.
#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    version,
    propagate_version = true
)]
#[command(max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cache branches: publish an artifact to an orphan branch of the
    /// repository's remote, and restore it on any machine, verified byte for byte.
    ///
    /// Each cache is described by `cache-manifests/<NAME>.toml`: what to pack,
    /// how its key is built, where it restores, and which gates a publish needs.
    Cache(cache::CacheArgs),
    /// The main job on a local default, no setup: publish a real directory to a
    /// scratch origin, restore it into a fresh clone, compare, and time it.
    ///
    /// In a scratch directory: a bare `origin.git` set up like a hosting server,
    /// a repository with its own `cache-manifests/demo.toml`, `cache publish`
    /// of a real directory (by default this machine's
    /// `$(rustc --print sysroot)/lib/rustlib`), a fresh clone, `cache restore`
    /// into it, and a byte-for-byte comparison with the source. Prints what
    /// happened, the timings, and the commands for real use. Touches nothing
    /// outside the scratch directory, which is removed at the end.
    Demo(demo::DemoArgs),
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }
}
