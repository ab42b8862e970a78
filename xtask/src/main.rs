//! The `cargo xtask` entry point: parse, dispatch, map errors to exit codes.

use clap::Parser;
use std::process::ExitCode;
use warmstart::exit::{Code, code_of};

fn main() -> ExitCode {
    let cli = match warmstart::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            // clap prints help and version to stdout with exit 0, and usage
            // errors to stderr; usage errors take our code 2.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(Code::Usage.as_i32() as u8)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match warmstart::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // The last line of defence for secrets: whatever an error quotes
            // (a URL, git's own stderr), no userinfo is printed.
            eprintln!("error: {}", warmstart::redact::text(&format!("{err:#}")));
            ExitCode::from(code_of(&err).as_i32() as u8)
        }
    }
}
