//! Running a step's child processes: bounded in time, output into the step's log.
//!
//! Every child runs in its own process group, so a timeout kills it and
//! everything it started (a `git fetch` and its transport helper, a shell and
//! its pipeline). Nothing here decides what a result means; the steps do.

use anyhow::{Context, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A step's log file, opened (and truncated) when the step starts real work.
pub struct Log {
    pub path: PathBuf,
    file: File,
}

impl Log {
    pub fn create(path: &Path, header: &str) -> Result<Log> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut log = Log {
            path: path.to_path_buf(),
            file,
        };
        log.line(header);
        Ok(log)
    }

    /// Appends one line (log writes never fail a step), without
    /// credentials: a command line may hold a URL with a password.
    pub fn line(&mut self, text: &str) {
        let _ = writeln!(
            self.file,
            "[{}] {}",
            crate::clock::rfc3339(crate::clock::now_ms()),
            crate::redact::text(text)
        );
    }

    fn stdio(&self) -> Result<Stdio> {
        Ok(Stdio::from(
            self.file.try_clone().context("duplicating the log file")?,
        ))
    }
}

/// How a bounded child ended.
#[derive(Debug)]
pub enum Exit {
    Status(ExitStatus),
    TimedOut(Duration),
}

impl Exit {
    pub fn success(&self) -> bool {
        matches!(self, Exit::Status(s) if s.success())
    }

    /// `exit 3`, `killed by signal 9`, `timed out after 2s`.
    pub fn describe(&self) -> String {
        match self {
            Exit::Status(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(s)) {
                (Some(c), _) => format!("exit {c}"),
                (None, Some(sig)) => format!("killed by signal {sig}"),
                _ => "ended abnormally".into(),
            },
            Exit::TimedOut(d) => format!("timed out after {}", super::report::fmt_duration(*d)),
        }
    }
}

fn wait_bounded(child: &mut Child, timeout: Option<Duration>) -> Result<Exit> {
    let start = Instant::now();
    wait_until(child, || match timeout {
        Some(limit) if start.elapsed() >= limit => Some(limit),
        _ => None,
    })
}

/// Waits for the child, polling `give_up`; when it returns the limit that was
/// passed, the child's whole process group is killed.
fn wait_until(child: &mut Child, mut give_up: impl FnMut() -> Option<Duration>) -> Result<Exit> {
    let mut nap = Duration::from_millis(1);
    loop {
        if let Some(status) = child.try_wait().context("waiting for a child process")? {
            return Ok(Exit::Status(status));
        }
        if let Some(limit) = give_up() {
            crate::process::group::kill_group(child);
            return Ok(Exit::TimedOut(limit));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

/// Runs `cmd` with stdout and stderr appended to the log.
pub fn run_logged(cmd: &mut Command, log: &mut Log, timeout: Option<Duration>) -> Result<Exit> {
    log.line(&format!("$ {}", show(cmd)));
    cmd.stdin(Stdio::null())
        .stdout(log.stdio()?)
        .stderr(log.stdio()?);
    let mut child = crate::process::group::spawn_leader(cmd)?;
    let exit = wait_bounded(&mut child, timeout)?;
    log.line(&format!("-> {}", exit.describe()));
    Ok(exit)
}

/// Runs `cmd` and captures what it prints (stdout, then stderr).
pub fn capture(cmd: &mut Command, timeout: Option<Duration>) -> Result<(Exit, String, String)> {
    let start = Instant::now();
    capture_until(cmd, || match timeout {
        Some(limit) if start.elapsed() >= limit => Some(limit),
        _ => None,
    })
}

/// `capture`, giving up when `give_up` returns a limit (see `wait_until`).
pub fn capture_until(
    cmd: &mut Command,
    give_up: impl FnMut() -> Option<Duration>,
) -> Result<(Exit, String, String)> {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = crate::process::group::spawn_leader(cmd)?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out = reader(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = reader(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let exit = wait_until(&mut child, give_up)?;
    let out = out.join().unwrap_or_default();
    let err = err.join().unwrap_or_default();
    Ok((exit, out, err))
}

/// The command line, for logs.
pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        // Each argument on its own: a whole URL is redacted by git's rule,
        // which the free-text redaction of `Log::line` cannot apply.
        .map(|a| crate::redact::url(&a.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last non-empty line of a tool's output: usually its error.
pub fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string()
}

/// What a failed tool said last, from the log: its last `fatal:` or
/// `error:` line when it printed one (git's errors are several lines, and
/// the last is often advice), else its last line.
pub fn last_log_line(log: &Log) -> String {
    let text = std::fs::read_to_string(&log.path).unwrap_or_default();
    let said: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('['))
        .collect();
    said.iter()
        .rev()
        .find(|l| l.starts_with("fatal:") || l.starts_with("error:"))
        .or(said.last())
        .map(|l| l.to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_kills_the_whole_group() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = Log::create(&tmp.path().join("l.log"), "test").unwrap();
        let start = Instant::now();
        // The shell's child `sleep` would keep the pipe open if only the shell died.
        let exit = run_logged(
            Command::new("sh").args(["-c", "sleep 30 & sleep 30"]),
            &mut log,
            Some(Duration::from_millis(200)),
        )
        .unwrap();
        assert!(matches!(exit, Exit::TimedOut(_)), "{exit:?}");
        assert!(start.elapsed() < Duration::from_secs(5));
        let (exit, out, _) = capture(
            Command::new("sh").args(["-c", "echo hi; sleep 30 & wait"]),
            Some(Duration::from_millis(200)),
        )
        .unwrap();
        assert!(!exit.success());
        assert_eq!(out, "hi\n");
        assert!(start.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn output_goes_to_the_log() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = Log::create(&tmp.path().join("l.log"), "head").unwrap();
        let exit = run_logged(
            Command::new("sh").args(["-c", "echo out; echo err >&2; exit 3"]),
            &mut log,
            None,
        )
        .unwrap();
        assert_eq!(exit.describe(), "exit 3");
        let text = std::fs::read_to_string(&log.path).unwrap();
        assert!(text.contains("out\n") && text.contains("err\n"), "{text}");
        assert_eq!(last_log_line(&log), "err");
    }

    #[test]
    fn a_logged_command_line_never_shows_a_password_with_a_quote() {
        let tmp = tempfile::tempdir().unwrap();
        let mut log = Log::create(&tmp.path().join("l.log"), "head").unwrap();
        run_logged(
            Command::new("true").args(["--", "http://ci:pa\"SECRET@127.0.0.1:1/x"]),
            &mut log,
            None,
        )
        .unwrap();
        let text = std::fs::read_to_string(&log.path).unwrap();
        assert!(text.contains("http://127.0.0.1:1/x"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
    }
}
