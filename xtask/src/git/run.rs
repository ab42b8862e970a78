//! Running git in a private store: the network commands under the watchdog,
//! local ones with their status checked, and git's last lines for messages.

use crate::net;
use anyhow::{Context, Result, anyhow, bail};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::*;

/// git's stderr without its progress updates: whole lines of the final state.
pub(super) fn final_lines(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .split(['\r', '\n'])
        .filter(|l| !l.contains("objects:") && !l.contains("Delta compression"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl CacheGit {
    /// Runs a git command that talks to `remote` (`what`: `fetch of x`)
    /// under the watchdog (`crate::net`), as the leader of a new process
    /// group, telling `pid` its id while it runs and `None` once it has
    /// exited. Killing the group (`kill(-pid, ...)`) stops git's helpers
    /// too (index-pack, remote-https, ssh), which hold stderr open. Past a
    /// deadline: exit 8 with one line saying which.
    pub(crate) fn run_network(
        &self,
        cmd: &mut Command,
        what: &str,
        remote: &Remote,
        pid: &mut dyn FnMut(Option<u32>),
    ) -> Result<std::process::Output> {
        let ran = net::run(cmd, self.net, None, Some(self.pack_dir()), &mut |_| {}, pid)
            .with_context(|| format!("running git for the {what}"))?;
        if let Some(v) = ran.stopped {
            return Err(v.error(what, &remote.to_string()));
        }
        Ok(std::process::Output {
            status: ran.status,
            stdout: ran.stdout,
            stderr: ran.stderr,
        })
    }
}

/// Runs `cmd` with `input` on its stdin and returns its stdout, or an error
/// naming `what` with git's last lines. The input is written from a thread,
/// so a command that answers while it reads (`cat-file --batch-check`)
/// cannot fill its stdout pipe and stall.
pub(super) fn run_with_input(cmd: &mut Command, input: Vec<u8>, what: &str) -> Result<Vec<u8>> {
    crate::process::group::die_with_parent(cmd);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {what}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child
        .wait_with_output()
        .with_context(|| format!("running {what}"))?;
    let write = writer.join().expect("the stdin writer does not panic");
    check_status(&out, what, store_of(cmd).as_deref())?;
    write.with_context(|| format!("writing to {what}"))?;
    Ok(out.stdout)
}

/// Runs `cmd` to its end (it dies with warmstart: see `die_with_parent`)
/// and returns its stdout, or an error with git's last lines.
pub(super) fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    crate::process::group::die_with_parent(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    check_status(&out, "git", store_of(cmd).as_deref())?;
    Ok(out.stdout)
}

/// The store a command from `CacheGit::git` runs in (its `--git-dir`).
pub(super) fn store_of(cmd: &Command) -> Option<PathBuf> {
    let mut args = cmd.get_args();
    (args.next()? == "--git-dir").then(|| args.next().map(PathBuf::from))?
}

/// An error naming `what` with git's last lines when it failed; marked as
/// a damaged `store` when git's words say so (see `damaged_or`).
pub(super) fn check_status(
    out: &std::process::Output,
    what: &str,
    store: Option<&Path>,
) -> Result<()> {
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let err = anyhow!("{what} failed: {}", last_lines(&stderr));
        return Err(match store {
            Some(dir) => damaged_or(dir, &stderr, err),
            None => err,
        });
    }
    Ok(())
}

pub(super) fn parse_oid(out: &[u8]) -> Result<String> {
    let s = String::from_utf8_lossy(out).trim().to_string();
    if !(s.len() == 40 || s.len() == 64) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("git printed {s:?} where an object id was expected");
    }
    Ok(s)
}

/// The last meaningful lines of a git error, joined on one line, without
/// progress, hints and boilerplate (`crate::git::cause`).
pub(super) fn last_lines(stderr: &str) -> String {
    // Git redacts URLs in its own messages, but not in every one (a hook's
    // output, a helper's), and this text is printed and put in JSON.
    crate::redact::text(&crate::git::cause(stderr))
}
