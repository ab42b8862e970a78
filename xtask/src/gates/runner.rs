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
use std::sync::atomic::{AtomicI32, Ordering};
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

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
    /// Past its timeout; its group was killed.
    TimedOut,
    /// warmstart received this signal; the group was sent it, then killed.
    Interrupted(i32),
}

impl End {
    pub fn success(self) -> bool {
        self == End::Exited(0)
    }
}

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

static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(sig, Ordering::SeqCst);
}

/// From the first `run` on, SIGINT, SIGTERM and SIGHUP do not kill warmstart:
/// they are noted, and the running command's group is sent the same signal,
/// then killed after the grace period, and `run` reports `Interrupted`
/// (callers stop there). Needed because a command in its own process group
/// does not receive the terminal's Ctrl-C.
fn catch_interrupts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only stores into an atomic, which is
            // async-signal-safe.
            unsafe {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
        }
    });
}

/// The signal received since `catch_interrupts`, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The name of a signal number, for messages.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        n => format!("signal {n}"),
    }
}

fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
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

/// The process group of one command, reaped with waitpid(-pgid).
struct Group {
    pgid: i32,
    status: Option<libc::c_int>,
}

impl Group {
    /// Reaps every finished member we are the parent of; notes the leader's status.
    fn reap(&mut self) {
        loop {
            let mut st: libc::c_int = 0;
            // SAFETY: plain waitpid on our own children, status into a local.
            let pid = unsafe { libc::waitpid(-self.pgid, &mut st, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.pgid {
                self.status = Some(st);
            }
        }
    }

    /// Whether any process of the group still exists (zombies of processes
    /// we are not the parent of count: we cannot tell them apart).
    fn alive(&self) -> bool {
        // SAFETY: signal 0 only checks for existence and permission.
        let r = unsafe { libc::kill(-self.pgid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child's process group.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }

    /// `sig` to the group, up to `grace` for it to go, then SIGKILL; returns
    /// once the leader is reaped.
    fn terminate(&mut self, sig: i32, grace: Duration) {
        self.signal(sig);
        let until = Instant::now() + grace;
        loop {
            self.reap();
            if self.status.is_some() && !self.alive() {
                return;
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(POLL);
        }
        self.signal(libc::SIGKILL);
        if self.status.is_none() {
            let mut st: libc::c_int = 0;
            // SAFETY: blocking wait for our own child, which was just SIGKILLed.
            let pid = unsafe { libc::waitpid(self.pgid, &mut st, 0) };
            if pid == self.pgid {
                self.status = Some(st);
            }
        }
        // Reap the rest of the group as SIGKILL lands, briefly.
        let until = Instant::now() + Duration::from_secs(1);
        while self.alive() && Instant::now() < until {
            self.reap();
            std::thread::sleep(POLL);
        }
    }

    fn end(&self) -> End {
        let st = self.status.unwrap_or(0);
        if libc::WIFSIGNALED(st) {
            End::Signaled(libc::WTERMSIG(st))
        } else {
            End::Exited(libc::WEXITSTATUS(st))
        }
    }
}

/// Runs `cmd` to its end under `limits`. Errors only when it cannot start.
pub fn run(mut cmd: Command, limits: Limits, output: Output) -> Result<Outcome> {
    catch_interrupts();
    become_subreaper();
    let program = cmd.get_program().to_string_lossy().into_owned();
    let (mut reader, writer) = std::io::pipe().context("creating a pipe for the output")?;
    let (live, log, cap) = match output {
        Output::Live { log, tail } => (true, log, tail),
        Output::Capture { tail } => (false, None, tail),
    };
    let mut log_file = match &log {
        Some(path) => {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
            }
            Some(
                std::fs::File::create(path)
                    .with_context(|| format!("creating the log {}", path.display()))?,
            )
        }
        None => None,
    };
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
    let mut group = Group {
        pgid: child.id() as i32,
        status: None,
    };

    let tail = Arc::new(Mutex::new(Tail {
        buf: VecDeque::new(),
        cap,
    }));
    let (done_tx, done_rx) = mpsc::channel::<()>();
    {
        let tail = Arc::clone(&tail);
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                let n = match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => n,
                };
                let bytes = &chunk[..n];
                // `--quiet`: the output still goes to the log and the tail.
                if live && !crate::contract::quiet() {
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
    }

    let deadline = start + limits.timeout;
    let end = loop {
        group.reap();
        if group.status.is_some() {
            break group.end();
        }
        if let Some(sig) = interrupted() {
            group.terminate(sig, limits.grace);
            break End::Interrupted(sig);
        }
        if Instant::now() >= deadline {
            group.terminate(libc::SIGTERM, limits.grace);
            break End::TimedOut;
        }
        std::thread::sleep(POLL);
    };
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
