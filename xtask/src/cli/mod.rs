//! Every command-line type of `cargo xtask`, one file per command group.
//!
//! Doc comments here are the `--help` text: write them for the reader who
//! has never seen warmstart. This module only describes arguments; it never
//! does any work (that is `crate::run` and the capability modules).

pub mod cache;
pub mod restore;

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
    /// Bring this machine back: run the steps of cache-manifests/restore.toml
    /// (each only when its probe says it is needed) and print what each did.
    Restore(restore::RestoreArgs),
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
