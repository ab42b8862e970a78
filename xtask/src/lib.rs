//! warmstart's library: every capability lives here; the `xtask` binary only
//! parses arguments and dispatches to `run`.
//!
//! Modules are one per capability (see ARCHITECTURE.md for the map). Shared
//! pieces: `exit` (exit codes), `repo` (finding the repository and its state
//! directory), `cli` (all argument types).

pub mod cache;
pub mod cli;
pub mod clock;
pub mod conda;
pub mod demo;
pub mod exit;
pub mod gates;
pub mod net;
pub mod repo;
pub mod restore;
pub mod resume;
pub mod unpack;

use anyhow::Result;

/// Runs one parsed command line.
pub fn run(cli: cli::Cli) -> Result<()> {
    let sh = xshell::Shell::new()?;
    // One arm per command group: `cli::Command::X(args) => x::run(&sh, args)`.
    match cli.command {
        cli::Command::Cache(args) => cache::run(&sh, args),
        cli::Command::Demo(args) => demo::run(&sh, args),
        cli::Command::Restore(args) => restore::run(&sh, args),
        cli::Command::Gates(args) => gates::run(&sh, args),
        cli::Command::Resume(args) => resume::run(&sh, args),
        cli::Command::Conda(args) => conda::run(&sh, args),
    }
}
