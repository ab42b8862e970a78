//! `cargo xtask completions` and `cargo xtask man`: shell completions and man pages, from the same clap tree as `--help`.
//!
//! Both render the tree `main` parses with (`cli::with_examples`), named
//! `warmstart`: completions and man pages are for the installed binary,
//! whatever name this run was invoked by. Writes nothing but stdout, or
//! with `man --out DIR` the pages into DIR.

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::cli::manual::{CompletionsArgs, ManArgs};

/// The name completions and man pages are for.
const BIN: &str = "warmstart";

fn tree() -> clap::Command {
    crate::cli::with_examples(crate::cli::Cli::command().name(BIN).bin_name(BIN), BIN)
}

/// `completions <shell>`: the completion script on stdout.
pub fn completions(args: CompletionsArgs) -> Result<()> {
    let mut cmd = tree();
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, BIN, &mut script);
    print!("{}", String::from_utf8_lossy(&script));
    Ok(())
}

/// `man [--out DIR]`: the top-level page on stdout, or every page into DIR.
pub fn man(args: ManArgs) -> Result<()> {
    let cmd = tree();
    match args.out {
        Some(dir) => {
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            clap_mangen::generate_to(cmd, &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
        }
        None => {
            let mut page = Vec::new();
            clap_mangen::Man::new(cmd)
                .render(&mut page)
                .context("rendering the man page")?;
            print!("{}", String::from_utf8_lossy(&page));
        }
    }
    Ok(())
}
