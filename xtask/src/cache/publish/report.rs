//! Where a publish, prune or re-sign says what it does: results on stdout,
//! warnings on stderr, progress bars on a terminal.
//!
//! Never prints a result with `--json` or `--quiet` (the JSON document is
//! the caller's, through `crate::contract`).

use std::io::IsTerminal;

/// Where the words go: results on stdout, warnings on stderr, progress bars
/// on stderr only when it is a terminal.
pub(crate) struct Reporter {
    quiet: bool,
    json: bool,
    tty: bool,
}

impl Reporter {
    pub(crate) fn new(quiet: bool, json: bool) -> Reporter {
        Reporter {
            quiet,
            json,
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub(crate) fn say(&self, msg: impl AsRef<str>) {
        if !self.quiet && !self.json {
            println!("{}", msg.as_ref());
        }
    }

    pub(crate) fn warn(&self, msg: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("warning: {}", msg.as_ref());
        }
    }

    /// A warning nobody should miss: printed even with --quiet.
    pub(crate) fn loud(&self, msg: impl AsRef<str>) {
        eprintln!("warning: {}", msg.as_ref());
    }

    /// A byte bar (`crate::progress`) on a terminal, unless `--quiet`.
    pub(crate) fn bar(&self, len: u64, what: &str) -> indicatif::ProgressBar {
        if !self.tty || self.quiet {
            return crate::progress::hidden();
        }
        crate::progress::bytes_bar(len, what)
    }
}

pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
