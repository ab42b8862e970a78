//! warmstart's library: every capability lives here; a binary is one line,
//! `fn main() { warmstart::main() }`, whether it is the `warmstart` binary
//! of this package or an adopter's own xtask crate.
//!
//! Modules are one per capability, in layers (ARCHITECTURE.md "Layers"):
//! the ground floor that every room may use and that uses none of them
//! (`out`, `exit`, `hex`, `clock`, `size`, `settings`, `redact`, `repo`,
//! `fsio`, `process`, `net`, `git`, `contract`, `progress`), then `cli` (all
//! argument types), then the rooms, one per command group.

// A function fits on a screen or two (clippy.toml: 100 lines); no module
// opts out.
#![warn(clippy::too_many_lines)]

// First, so that its `println!`/`print!` shadow std's in every module below.
#[macro_use]
pub mod out;

pub mod cache;
pub mod cli;
pub mod clock;
pub mod conda;
pub mod contract;
pub mod demo;
pub mod exit;
pub mod fsio;
pub mod gates;
pub mod git;
pub mod glob;
pub mod hex;
pub mod init;
pub mod invocation;
pub mod manual;
pub mod net;
pub mod oci;
pub mod process;
pub mod progress;
pub mod redact;
pub mod repo;
pub mod restore;
pub mod resume;
pub mod settings;
pub mod size;
#[cfg(test)]
mod test_rng;
pub mod trust;
pub mod unpack;
pub mod wheel;

use anyhow::Result;
use clap::{CommandFactory, FromArgMatches};

/// The whole program: parse the command line, run it, exit with the code of
/// `exit::code_of` (2 for usage errors, 0 for `--help` and `--version`).
/// Help and usage name the command as `invocation::command` decides.
pub fn main() -> ! {
    let code = main_code();
    // process::exit runs no destructors: flush what print! left buffered.
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(code)
}

/// Makes glibc give every chunk-sized buffer back to the kernel when it is
/// freed, for every command: publish's chunks and frames, restore's
/// compressed chunks and decode buffers. By default glibc's mmap threshold
/// rises to the size of the largest block freed (up to 32 MiB), after which
/// such buffers stay in each worker thread's arena: peak RSS grew by tens
/// of MiB over the chunks actually in flight.
fn bound_malloc() {
    // SAFETY: mallopt only sets allocator parameters; 1 MiB is in range.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

fn main_code() -> i32 {
    bound_malloc();
    let name = invocation::command();
    let command = cli::with_examples(cli::Cli::command().name(name).bin_name(name), name)
        .color(clap_color(std::env::args()));
    let parsed = command.clone().try_get_matches().and_then(|m| {
        let (path, json, quiet) = contract::from_matches(&m);
        contract::begin(&path, json, quiet);
        cli::Cli::from_arg_matches(&m)
    });
    let cli = match parsed {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help and version to stdout with exit 0, and usage
            // errors to stderr; usage errors take our code 2.
            let _ = err.print();
            if !err.use_stderr() {
                return 0;
            }
            let args: Vec<String> = std::env::args().collect();
            contract::usage_failure(&command, &args, &usage_message(&err.to_string()));
            return exit::Code::Usage.as_i32();
        }
    };
    match run(cli) {
        Ok(()) => 0,
        Err(err) => {
            let code = exit::code_of(&err).as_i32();
            // The last line of defence for secrets: whatever an error quotes
            // (a URL, git's own stderr), no userinfo is printed. Errors are
            // printed whatever `--quiet` says, and coloured as `--color` says.
            eprintln!("error: {}", crate::redact::text(&format!("{err:#}")));
            // With --json, the failure is also the one document on stdout.
            contract::failure(&err, code);
            code
        }
    }
}

/// `--color` as clap's own messages (help, usage errors) take it, read
/// before clap parses: a usage error is printed before any value is known.
fn clap_color(args: impl Iterator<Item = String>) -> clap::ColorChoice {
    let mut args = args.skip(1);
    let mut last = None;
    while let Some(a) = args.next() {
        if a == "--" {
            break;
        }
        if let Some(v) = a.strip_prefix("--color=") {
            last = Some(v.to_string());
        } else if a == "--color" {
            last = args.next();
        }
    }
    match last.as_deref() {
        Some("always") => clap::ColorChoice::Always,
        Some("never") => clap::ColorChoice::Never,
        _ => clap::ColorChoice::Auto,
    }
}

/// clap's error as one line for the `--json` envelope: every line of what
/// it says (`the following required arguments were not provided: <NAME>`),
/// not the first alone, which named no argument; without the usage and the
/// `--help` pointer, which follow on stderr anyway.
fn usage_message(text: &str) -> String {
    text.lines()
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
        .trim_start_matches("error: ")
        .to_string()
}

/// Runs one parsed command line: refuses unknown or unparsable `WARMSTART_*`
/// variables first (exit 10), and ends quietly with `Ok` when stdout closes.
pub fn run(cli: cli::Cli) -> Result<()> {
    out::set_color(cli.color);
    settings::check_env()?;
    oci::mirror::check_env()?;
    out::quiet_on_broken_pipe(|| dispatch(cli))
}

fn dispatch(cli: cli::Cli) -> Result<()> {
    let sh = xshell::Shell::new()?;
    // One arm per command group: `cli::Command::X(args) => x::run(&sh, args)`.
    // The cache is also handed how to read restore.toml's step names (for
    // gc's log cleanup), which it must not read itself.
    match cli.command {
        cli::Command::Cache(args) => cache::run(&sh, args, restore::step_names),
        cli::Command::Demo(args) => demo::run(&sh, args),
        cli::Command::Restore(args) => restore::run(&sh, args),
        cli::Command::Doctor(args) => restore::doctor::run(&sh, &args),
        cli::Command::Gates(args) => gates::run(&sh, args),
        cli::Command::Resume(args) => resume::run(&sh, args),
        cli::Command::Conda(args) => conda::run(&sh, args),
        cli::Command::Init(args) => init::run(&sh, args),
        cli::Command::Completions(args) => manual::completions(args),
        cli::Command::Man(args) => manual::man(args),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_usage_error_keeps_every_line_of_what_clap_said() {
        let text = "error: the following required arguments were not provided:\n  <NAME>\n  --to <DIR>\n\nUsage: warmstart cache restore <NAME>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            super::usage_message(text),
            "the following required arguments were not provided: <NAME> --to <DIR>"
        );
        assert_eq!(
            super::usage_message(
                "error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\nUsage: x\n"
            ),
            "unexpected argument '--bogus' found tip: to pass '--bogus' as a value, use '-- --bogus'"
        );
    }
}
