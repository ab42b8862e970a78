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

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static QUIET: AtomicBool = AtomicBool::new(false);

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

/// std's `print!`, except that a closed stdout ends the command quietly.
macro_rules! print {
    ($($arg:tt)*) => {
        $crate::out::write_stdout(format_args!($($arg)*), false)
    };
}
