//! Every command-line type of `cargo xtask`, one file per command group.
//!
//! Doc comments here are the `--help` text: write them for the reader who
//! has never seen warmstart. This module only describes arguments; it never
//! does any work (that is `crate::run` and the capability modules).

use clap::{Parser, Subcommand};

pub mod conda;

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
    /// Inspect and unpack conda packages (`.conda`, `.tar.bz2`) safely,
    /// e.g. to put a newer tool than the OS ships into /usr/local.
    ///
    /// Example: `cargo xtask conda unpack binaryen-118-h59595ed_0.conda
    /// --into /usr/local --only bin/ --only lib/`.
    Conda(conda::CondaArgs),
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
