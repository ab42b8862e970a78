//! Standard output for reports: a reader that goes away (`... --json | head`)
//! ends the command quietly with status 0, as ripgrep does, never with a
//! panic (std's `println!` panics on a closed pipe, which exits 101).
//!
//! This module defines crate-wide `println!` and `print!` that shadow std's
//! (textual macro scope: `lib.rs` declares this module first), so every
//! report, including one added tomorrow, gets this without a change at its
//! call site. On a closed pipe they unwind with the `BrokenPipe` payload
//! (through `resume_unwind`, which prints nothing), so destructors still run
//! (locks, temporary directories); `quiet_on_broken_pipe` around the
//! command turns that into `Ok(())`. Output only ever goes to stdout from
//! the thread that runs the command.
//!
//! It also defines a crate-wide `eprintln!`, std's but for one thing: with
//! colour on (`--color`, `NO_COLOR`: `set_color`), the `error:` or
//! `warning:` a line opens with is drawn in red or yellow, so every warning,
//! including one added tomorrow, is coloured without a change at its call
//! site. Colour never reaches a pipe or a file unless `--color=always`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);
static COLOR: AtomicBool = AtomicBool::new(false);

/// When warmstart's own `error:` and `warning:` lines are coloured
/// (`--color`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Only when stderr is a terminal and `NO_COLOR` is unset or empty.
    #[default]
    Auto,
    /// Always, even into a pipe or a file.
    Always,
    /// Never.
    Never,
}

/// Records `--color`, resolving `auto` against stderr and `NO_COLOR`
/// (<https://no-color.org>: set and not empty means no colour).
pub fn set_color(choice: ColorChoice) {
    use std::io::IsTerminal;
    let on = match choice {
        ColorChoice::Always => true,
        ColorChoice::Never => false,
        ColorChoice::Auto => {
            std::io::stderr().is_terminal()
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
        }
    };
    COLOR.store(on, Ordering::Relaxed);
}

/// `line` as stderr shows it: its opening `error:` or `warning:` in bold
/// red or yellow when `color`, else unchanged.
pub fn paint(line: &str, color: bool) -> std::borrow::Cow<'_, str> {
    if color {
        for (prefix, sgr) in [("error:", "1;31"), ("warning:", "1;33")] {
            if let Some(rest) = line.strip_prefix(prefix) {
                return format!("\x1b[{sgr}m{prefix}\x1b[0m{rest}").into();
            }
        }
    }
    line.into()
}

/// Writes `args` and a newline to stderr as one write, painted (`paint`),
/// through std's `eprint!` (so unit tests still capture it).
pub fn write_stderr(args: std::fmt::Arguments<'_>) {
    let mut line = std::fmt::format(args);
    line.push('\n');
    std::eprint!("{}", paint(&line, COLOR.load(Ordering::Relaxed)));
}

/// Records `--quiet` (`contract::begin`, at parse time).
pub fn set_quiet(quiet: bool) {
    QUIET.store(quiet, Ordering::Relaxed);
}

/// Whether `--quiet` was given: no progress, no informational stderr. Here,
/// on the ground floor, because the child runners and the progress bars
/// ask it too, and they sit below the JSON contract.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// The unwind payload of a write to a closed stdout.
pub struct BrokenPipe;

/// Writes `args` (and a newline) to stdout; unwinds with `BrokenPipe` when
/// the reader is gone. Other write errors panic, as std's `println!` does.
pub fn write_stdout(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::panic::resume_unwind(Box::new(BrokenPipe))
        }
        Err(e) => panic!("failed printing to stdout: {e}"),
    }
}

/// Runs `f`; a write to a closed stdout inside it becomes `Ok(())` (exit 0:
/// the reader had all it wanted). Any other panic goes on unwinding.
pub fn quiet_on_broken_pipe(f: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<()> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) if payload.is::<BrokenPipe>() => Ok(()),
        Err(payload) => std::panic::resume_unwind(payload),
    }
}

/// std's `println!`, except that a closed stdout ends the command quietly.
macro_rules! println {
    () => {
        $crate::out::write_stdout(format_args!(""), true)
    };
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!($($arg)*), true)
    };
}

/// std's `eprintln!`, except that an opening `error:` or `warning:` is
/// coloured when `--color` says so (`write_stderr`).
macro_rules! eprintln {
    () => {
        $crate::out::write_stderr(format_args!(""))
    };
    ($($arg:tt)*) => {
        $crate::out::write_stderr(format_args!($($arg)*))
    };
}

/// std's `print!`, except that a closed stdout ends the command quietly.
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!($($arg)*), false)
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paint_colours_only_an_opening_error_or_warning() {
        assert_eq!(paint("warning: x", true), "\x1b[1;33mwarning:\x1b[0m x");
        assert_eq!(paint("error: x", true), "\x1b[1;31merror:\x1b[0m x");
        assert_eq!(paint("warning: x", false), "warning: x");
        assert_eq!(paint("a warning: x", true), "a warning: x");
    }
}
