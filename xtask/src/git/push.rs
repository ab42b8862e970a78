//! Leased pushes of a cache branch and what git says of them: a lost lease,
//! a refusal by the host's rules, and the progress of the bytes sent.

use crate::exit::{Code, fail};
use crate::net;
use anyhow::{Context, Result};

use super::*;

impl CacheGit {
    /// Pushes `commit` to `remote_ref(branch)` with a lease: the remote ref
    /// must still be `expected` (`None`: must not exist). `progress` gets
    /// git's "Writing objects" percentage as it goes.
    pub fn push_branch(
        &self,
        remote: &Remote,
        branch: &str,
        commit: &str,
        expected: Option<&str>,
        progress: &mut dyn FnMut(PushProgress),
    ) -> Result<()> {
        check_branch(branch)?;
        let dst = remote_ref(branch);
        let lease = format!("--force-with-lease={dst}:{}", expected.unwrap_or(""));
        let mut cmd = self.git();
        self.belts(&mut cmd, &remote.url);
        cmd.args(["push", "--porcelain", "--progress", "--no-verify"])
            .arg(&lease)
            .arg("--")
            .arg(&remote.url)
            .arg(format!("{commit}:{dst}"));
        let mut parser = ProgressParser::default();
        let ran = net::run(
            &mut cmd,
            self.net,
            None,
            None,
            &mut |bytes| parser.feed(bytes, progress),
            &mut |_| {},
        )
        .context("running git push")?;
        if let Some(v) = ran.stopped {
            return Err(v.error(&format!("push of {branch}"), &remote.to_string()));
        }
        let stderr = final_lines(&ran.stderr);
        let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
        if ran.status.success() {
            return Ok(());
        }
        // The lease is checked twice: by us against the advertised value
        // (`[rejected] (stale info)`, or `(fetch first)` when the ref exists
        // and the lease said it must not), and by the server while it locks
        // the ref, which is how a push racing another one for the same ref
        // loses (`[remote rejected] (cannot lock ref ...: is at X but
        // expected Y)`). `--porcelain` puts the verdict on stdout, one
        // `!\t<src>:<dst>\t<why>` line per rejected ref: that line decides.
        // Only when git printed none (a transport that died early) is
        // stderr searched for the same words.
        let said = format!("{stdout}\n{stderr}");
        // Before the lease: a protected branch's refusal can read "fetch
        // first" too, and retrying it would only be refused again.
        if let Some(rule) = crate::git::protected_refusal(&said) {
            return Err(fail(
                Code::Remote,
                format!(
                    "{remote} refuses to replace {dst} ({rule}): every publish force-pushes a new root commit, so a branch protection rule or ruleset on it (receive.denyNonFastForwards on a plain git server) stops every publish; allow force pushes to {dst} on the host, or set cache.branch in the manifest to a branch no rule covers"
                ),
            ));
        }
        if let Some(git_said) = lease_lost(&stdout, &stderr, &dst) {
            return Err(anyhow::Error::new(StaleLease {
                message: format!(
                    "{branch} on {remote} changed since it was fetched (another publish?): nothing was pushed; publish again to build on it"
                ),
                git: crate::exit::Failure {
                    code: Code::Busy,
                    message: format!("git said: {git_said}"),
                },
            }));
        }
        if let Some(hint) = refusal_hint(&dst, &said) {
            let git_said = last_lines(&said);
            return Err(fail(
                Code::Remote,
                format!("{remote} refused {dst} (git said: {git_said}): {hint}"),
            ));
        }
        let prefix = format!("cannot push {branch} to {remote}");
        let failure = if crate::git::auth_refused(&stderr).is_some()
            || !crate::git::cause_lines(&stderr).is_empty()
        {
            crate::git::remote_failure(&prefix, &stderr)
        } else {
            crate::git::remote_failure(&prefix, &stdout)
        };
        // `pack-objects` failing on an object cache.git lost says so.
        Err(damaged_or(&self.dir, &stderr, failure))
    }
}

/// The reason `git push --porcelain` gave for refusing `dst`, if it did:
/// the third field of a line `!\t<src>:<dst>\t[rejected] (stale info)`.
pub(super) fn push_rejection(stdout: &str, dst: &str) -> Option<String> {
    stdout.lines().find_map(|l| {
        let mut fields = l.split('\t');
        let (flag, refs, why) = (fields.next()?, fields.next()?, fields.next()?);
        let to = refs.rsplit_once(':').map(|(_, to)| to)?;
        (flag == "!" && to == dst).then(|| why.trim().to_string())
    })
}

/// What git said when a failed push to `dst` lost its lease, or `None`
/// when it failed for another reason. The porcelain verdict on `dst`
/// decides; stderr only when there is none.
pub(super) fn lease_lost(stdout: &str, stderr: &str, dst: &str) -> Option<String> {
    match push_rejection(stdout, dst) {
        Some(why) => is_lease_reason(&why).then_some(why),
        None => is_lease_reason(stderr).then(|| last_lines(stderr)),
    }
}

/// Words git uses when a ref moved under a push: the lease is lost, which
/// is contention (retry, then busy), never an unreachable remote.
pub(super) fn is_lease_reason(why: &str) -> bool {
    [
        "stale info",
        "fetch first",
        "cannot lock ref",
        "failed to update ref",
        "but expected",
        "reference already exists",
    ]
    .iter()
    .any(|w| why.contains(w))
}

/// A push refused because the remote ref is no longer the value the lease
/// named: someone else pushed in between. Callers may fetch again and retry
/// (`is_stale_lease`); unhandled, it exits 3 (busy): contention for the
/// ref, not a remote that cannot be reached.
#[derive(Debug)]
pub struct StaleLease {
    pub message: String,
    /// What git said, carrying the exit code (3) for `exit::code_of`.
    pub git: crate::exit::Failure,
}

impl std::fmt::Display for StaleLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StaleLease {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.git)
    }
}

/// Whether `err` is a push that lost its lease (see `StaleLease`).
pub fn is_stale_lease(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StaleLease>())
}

/// Where a push is, from git's "Writing objects" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushProgress {
    /// Of the objects.
    pub percent: u64,
    /// Bytes sent, once git printed its throughput (`, 1.00 MiB | ...`).
    pub bytes: Option<u64>,
}

impl PushProgress {
    /// Bytes sent: git's count, else `percent` of `total`.
    pub fn bytes_of(&self, total: u64) -> u64 {
        let share = u128::from(total) * u128::from(self.percent.min(100)) / 100;
        self.bytes.unwrap_or(share as u64)
    }
}

/// Reads git's progress output (lines ended by `\r` or `\n`) as it
/// comes, and reports the "Writing objects" lines.
#[derive(Default)]
pub(super) struct ProgressParser {
    line: Vec<u8>,
}

impl ProgressParser {
    pub(super) fn feed(&mut self, bytes: &[u8], progress: &mut dyn FnMut(PushProgress)) {
        for &b in bytes {
            if b == b'\r' || b == b'\n' {
                let l = String::from_utf8_lossy(&self.line);
                if let Some(p) = push_progress(&l) {
                    progress(p);
                }
                self.line.clear();
            } else {
                self.line.push(b);
            }
        }
    }
}

/// `Writing objects:  40% (2/5), 1.00 MiB | 2.00 MiB/s, done.` read.
pub(super) fn push_progress(line: &str) -> Option<PushProgress> {
    let rest = line
        .trim_start_matches("remote: ")
        .strip_prefix("Writing objects:")?;
    let (pct, rest) = rest.split_once('%')?;
    let percent = pct.trim().parse::<u64>().ok()?;
    let bytes = rest
        .split_once("), ")
        .and_then(|(_, r)| git_size(r.split(['|', ',']).next()?.trim()));
    Some(PushProgress { percent, bytes })
}

/// A size as git's progress prints it (`strbuf_humanise_bytes`):
/// `512 bytes`, `1 byte`, `1.50 KiB`, `12.00 MiB`, `1.02 GiB`.
pub(super) fn git_size(text: &str) -> Option<u64> {
    let (num, unit) = text.split_once(' ')?;
    let scale: u64 = match unit {
        "byte" | "bytes" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    Some((n * scale as f64) as u64)
}
