//! warmstart's library: every capability lives here; the `xtask` binary only
//! parses arguments and dispatches to `run`.
//!
//! Modules are one per capability (see ARCHITECTURE.md for the map). Shared
//! pieces: `exit` (exit codes), `repo` (finding the repository and its state
//! directory), `cli` (all argument types), `settings` (the `WARMSTART_*`
//! variables), `clock` and `size` (parsing and printing durations and sizes),
//! `out` (stdout that ends quietly on a closed pipe).

// First, so that its `println!`/`print!` shadow std's in every module below.
#[macro_use]
pub mod out;

pub mod cache;
pub mod cli;
pub mod clock;
pub mod conda;
pub mod demo;
pub mod exit;
pub mod gates;
pub mod glob;
pub mod repo;
pub mod restore;
pub mod resume;
pub mod settings;
pub mod size;
pub mod unpack;
pub mod wheel;

use anyhow::Result;

/// Runs one parsed command line: refuses unknown or unparsable `WARMSTART_*`
/// variables first (exit 10), and ends quietly with `Ok` when stdout closes.
pub fn run(cli: cli::Cli) -> Result<()> {
    settings::check_env()?;
    out::quiet_on_broken_pipe(|| dispatch(cli))
}

fn dispatch(cli: cli::Cli) -> Result<()> {
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
