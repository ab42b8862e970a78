//! Runs one command in its own process group, with a deadline, and tees its output.
//!
//! A gate is a process tree: `cargo nextest` starts test binaries, a shell
//! starts background jobs. So each command gets its own process group
//! (`process_group(0)`), and everything that ends it (its timeout, Ctrl-C on
//! warmstart, or the leader exiting while children it started live on) signals
//! the whole group: SIGTERM, a grace period, then SIGKILL. On Linux warmstart
//! also makes itself a child subreaper, so orphans of the group are re-parented
//! to it and reaped here instead of lingering as zombies, which lets the grace
//! period end as soon as the group is really gone.
//!
//! stdout and stderr share one pipe, so their interleaving is kept; a thread
//! copies it to warmstart's stderr (live mode) or a buffer (capture mode), and
//! keeps the tail for error messages. This module never decides what a result
//! means; that is the caller's business.

use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

/// How long the output pipe may stay open after the group is gone (a process
/// that left the group with setsid can hold it forever).
const DRAIN_WAIT: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(20);

/// How long a command may run, and how long it gets to stop once told to.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub timeout: Duration,
    pub grace: Duration,
}

/// Where the command's output goes.
pub enum Output {
    /// Copied to our stderr as it comes, and to `log` if given; the last
    /// `tail` bytes are kept for the result.
    Live { log: Option<PathBuf>, tail: usize },
    /// Kept in memory (the last `tail` bytes), nothing shown.
    Capture { tail: usize },
}

pub use super::group::End;

#[derive(Debug)]
pub struct Outcome {
    pub end: End,
    pub duration: Duration,
    /// The last bytes of the combined output.
    pub output: Vec<u8>,
    /// The leader exited but processes of its group were still running;
    /// they were terminated.
    pub killed_leftovers: bool,
}

/// A bounded tail of bytes.
struct Tail {
    buf: VecDeque<u8>,
    cap: usize,
}

impl Tail {
    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend(bytes);
        let excess = self.buf.len().saturating_sub(self.cap);
        self.buf.drain(..excess);
    }
}

/// Runs `cmd` to its end under `limits`. Errors only when it cannot start.
pub fn run(mut cmd: Command, limits: Limits, output: Output) -> Result<Outcome> {
    crate::process::signals::catch_interrupts();
    crate::process::group::become_subreaper();
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (reader, writer) = std::io::pipe().context("creating a pipe for the output")?;
    let (live, log, cap) = match output {
        Output::Live { log, tail } => (true, log, tail),
        Output::Capture { tail } => (false, None, tail),
    };
    let log_file = log.as_deref().map(create_log).transpose()?;
    cmd.stdin(Stdio::null())
        .stdout(writer.try_clone().context("duplicating the output pipe")?)
        .stderr(writer)
        .process_group(0);
    let start = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{program}`"))?;
    // Our copies of the pipe's write end live in `cmd`: close them, so the
    // reader sees EOF once the group is gone.
    drop(cmd);
    let mut group = crate::process::group::Group {
        pgid: child.id() as i32,
        status: None,
    };

    let tail = Arc::new(Mutex::new(Tail {
        buf: VecDeque::new(),
        cap,
    }));
    let done_rx = tee(reader, live, log_file, Arc::clone(&tail));

    let end = wait(&mut group, start + limits.timeout, limits.grace);
    let duration = start.elapsed();
    // A command that ends while processes it started still run would leave
    // them holding the machine (and our output pipe): they go with it.
    let killed_leftovers = matches!(end, End::Exited(_) | End::Signaled(_)) && group.alive();
    if killed_leftovers {
        group.terminate(libc::SIGTERM, limits.grace);
    }
    let _ = done_rx.recv_timeout(DRAIN_WAIT);
    let output = tail
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .buf
        .iter()
        .copied()
        .collect();
    Ok(Outcome {
        end,
        duration,
        output,
        killed_leftovers,
    })
}

/// The command's log file, its directory made first.
fn create_log(path: &std::path::Path) -> Result<std::fs::File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::File::create(path).with_context(|| format!("creating the log {}", path.display()))
}

/// Copies the output pipe to stderr (live mode, unless `--quiet`), the log
/// and the tail, on a thread of its own; the receiver hears when it ends.
fn tee(
    mut reader: std::io::PipeReader,
    live: bool,
    mut log_file: Option<std::fs::File>,
    tail: Arc<Mutex<Tail>>,
) -> mpsc::Receiver<()> {
    let (done_tx, done_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            let n = match reader.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let bytes = &chunk[..n];
            // `--quiet`: the output still goes to the log and the tail.
            if live && !crate::out::quiet() {
                let mut err = std::io::stderr().lock();
                let _ = err.write_all(bytes);
                let _ = err.flush();
            }
            if let Some(f) = log_file.as_mut() {
                let _ = f.write_all(bytes);
            }
            tail.lock().unwrap_or_else(|e| e.into_inner()).push(bytes);
        }
        let _ = done_tx.send(());
    });
    done_rx
}

/// Waits for the group's leader until `deadline`; an interrupt noted by
/// `signals` or the deadline ends the group (the signal, then SIGKILL after
/// `grace`).
fn wait(group: &mut crate::process::group::Group, deadline: Instant, grace: Duration) -> End {
    loop {
        group.reap();
        if group.status.is_some() {
            return group.end();
        }
        if let Some(sig) = crate::process::signals::interrupted() {
            group.terminate(sig, grace);
            return End::Interrupted(sig);
        }
        if Instant::now() >= deadline {
            group.terminate(libc::SIGTERM, grace);
            return End::TimedOut;
        }
        std::thread::sleep(POLL);
    }
}

/// The last `n` lines of `bytes`, as text.
pub fn last_lines(bytes: &[u8], n: usize) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.trim_end().lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail {
            buf: VecDeque::new(),
            cap: 4,
        };
        t.push(b"abc");
        t.push(b"defg");
        assert_eq!(t.buf.iter().copied().collect::<Vec<_>>(), b"defg");
    }

    #[test]
    fn last_lines_of_text() {
        assert_eq!(last_lines(b"a\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines(b"a", 5), "a");
        assert_eq!(last_lines(b"", 5), "");
    }
}
