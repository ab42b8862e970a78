//! `freshness`: fetch the current branch's upstream within a bounded time, and
//! fast-forward when behind and clean.
//!
//! When the work tree has local changes, or the branch has diverged, it
//! prints a loud warning and touches nothing: no merge, no stash, no reset.
//! A fetch that fails or does not finish within `timeout` is reported as the
//! remote being unreachable (the machine may be offline). The warm probe is
//! the time of the last check (`interval`), so a warm restore never goes to
//! the network.

use crate::clock::DurationSpec;
use crate::restore::fields::{dur, timeout};
use anyhow::bail;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::time::Duration;
use xshell::cmd;

use super::common::{Ctx, Outcome, Probe};
use crate::restore::proc::{self, Exit, Log};
use crate::restore::report::fmt_duration;
use crate::restore::state;

/// Fetch the current branch's upstream; fast-forward when behind and clean.
#[derive(Debug)]
pub struct Freshness {
    /// Default: the branch's configured remote, else `origin`.
    pub remote: Option<String>,
    /// Default: the branch's configured upstream branch, else its own name.
    pub branch: Option<String>,
    /// Bound on the fetch; past it the remote counts as unreachable.
    pub timeout: Duration,
    /// A check younger than this is warm (no network).
    pub interval: Duration,
    /// The step's `[network]` table (connect and stall deadlines).
    pub network: crate::net::ManifestNetwork,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFreshness {
    remote: Option<String>,
    branch: Option<String>,
    timeout: Option<DurationSpec>,
    interval: Option<DurationSpec>,
    #[serde(default)]
    network: crate::net::RawNetwork,
}

pub fn resolve_freshness(r: RawFreshness) -> Result<Freshness> {
    for (field, v) in [("remote", &r.remote), ("branch", &r.branch)] {
        if let Some(v) = v
            && (v.is_empty() || v.starts_with('-'))
        {
            bail!("`{field}` = {v:?} is not a remote or branch name");
        }
    }
    Ok(Freshness {
        remote: r.remote,
        branch: r.branch,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(10))?,
        interval: dur(&r.interval, "interval", Duration::from_secs(600))?,
        network: r.network.resolve()?,
    })
}

#[derive(Serialize, Deserialize)]
struct Stamp {
    checked_at: u64,
}

pub fn probe(ctx: &Ctx, name: &str, f: &Freshness) -> Probe {
    let stamp = state::read_stamp::<Stamp>(ctx.paths, name);
    match stamp.and_then(|s| super::common::checked_within(s.checked_at, f.interval)) {
        Some(ago) => Probe::warm(format!("checked {} ago", fmt_duration(ago))),
        _ => Probe::Needed("not checked recently".into()),
    }
}

pub fn run(ctx: &Ctx, name: &str, f: &Freshness, log: &mut Log) -> Result<Outcome> {
    let u = match upstream_of(ctx, f)? {
        Ok(u) => u,
        Err(nothing_to_do) => return Ok(nothing_to_do),
    };
    if let Some(failed) = fetch_upstream(ctx, f, &u, log)? {
        return Ok(failed);
    }
    let outcome = compare_and_move(ctx, f, &u, log)?;
    state::write_stamp(
        ctx.paths,
        name,
        &Stamp {
            checked_at: crate::clock::now_ms(),
        },
    )?;
    Ok(outcome)
}

/// The branch to refresh, and the remote and upstream branch it follows
/// (the step's settings first, then the branch's git config); an outcome
/// instead where there is nothing to refresh.
fn upstream_of(ctx: &Ctx, f: &Freshness) -> Result<Result<Upstream, Outcome>> {
    let sh = ctx.sh;
    let root = &ctx.repo.root;
    let git = |args: &[&str]| -> Result<String> {
        cmd!(sh, "git -C {root} {args...}")
            .quiet()
            .ignore_stderr()
            .read()
            .with_context(|| format!("git {}", args.join(" ")))
    };
    let Ok(branch) = git(&["symbolic-ref", "--quiet", "--short", "HEAD"]) else {
        return Ok(Err(Outcome::done("detached HEAD: no branch to refresh")
            .with_warnings(vec![
                "WARNING: HEAD is detached, so there is no branch to fetch or fast-forward".into(),
            ])));
    };
    let remote = match &f.remote {
        Some(r) => r.clone(),
        None => git(&["config", "--get", &format!("branch.{branch}.remote")])
            .unwrap_or_else(|_| "origin".into()),
    };
    let merge = git(&["config", "--get", &format!("branch.{branch}.merge")]).ok();
    let upstream = match (&f.branch, &merge) {
        (Some(b), _) => b.clone(),
        (None, Some(m)) => m.trim_start_matches("refs/heads/").to_string(),
        (None, None) => branch.clone(),
    };
    let guessed = f.branch.is_none() && merge.is_none();
    // Shown in messages: a remote given as a URL loses its credentials.
    let theirs_name = format!("{}/{upstream}", crate::redact::url(&remote));
    let is_url = remote.contains(':') || remote.contains('/');
    if !is_url && git(&["remote", "get-url", &remote]).is_err() {
        return Ok(Err(Outcome::failed(format!(
            "no remote named {remote:?} in this clone: add it, or set `remote` in the step"
        ))));
    }

    Ok(Ok(Upstream {
        branch,
        remote,
        upstream,
        theirs_name,
        guessed,
    }))
}

/// A branch and what it is compared with.
struct Upstream {
    branch: String,
    remote: String,
    upstream: String,
    /// `remote/upstream`, credentials removed, for messages.
    theirs_name: String,
    /// Neither the step nor git config names an upstream: the branch is
    /// compared with the remote's branch of the same name, and every
    /// message says so (a new branch has none, and that is no outage).
    guessed: bool,
}

impl Upstream {
    /// What a message says it compared with: `origin/main`, or, with no
    /// upstream set, that too.
    fn compared(&self) -> String {
        if self.guessed {
            format!(
                "{} (no upstream is set for {}; compared with the remote's branch of that name)",
                self.theirs_name, self.branch
            )
        } else {
            self.theirs_name.clone()
        }
    }
}

/// Fetches the upstream branch under the network watchdog; the failure's
/// outcome when it did not arrive.
fn fetch_upstream(
    ctx: &Ctx,
    f: &Freshness,
    u: &Upstream,
    log: &mut Log,
) -> Result<Option<Outcome>> {
    let (sh, root) = (ctx.sh, &ctx.repo.root);
    let Upstream {
        branch,
        remote,
        upstream,
        theirs_name,
        ..
    } = u;
    let refspec = format!("refs/heads/{upstream}");
    // `--progress` despite `--quiet`: the server's progress is how the
    // watchdog sees a fetch that is alive (see `crate::net`).
    let mut fetch: std::process::Command = cmd!(
        sh,
        "git -C {root} fetch --no-tags --quiet --progress {remote} {refspec}"
    )
    .into();
    fetch.env("GIT_TERMINAL_PROMPT", "0");
    log.line(&format!("$ {}", proc::show(&fetch)));
    let net = crate::net::settings(&f.network)?;
    let pack_dir = crate::net::PackDir(ctx.repo.git_dir.join("objects").join("pack"));
    let ran = crate::net::run(
        &mut fetch,
        net,
        Some(f.timeout),
        Some(pack_dir),
        &mut |_| {},
        &mut |_| {},
    )
    .context("running git fetch")?;
    let stderr = String::from_utf8_lossy(&ran.stderr);
    for l in crate::git::cause_lines(&stderr) {
        log.line(&l);
    }
    if let Some(v) = ran.stopped {
        let e = match v {
            crate::net::Verdict::Total(t) => {
                format!("{remote} did not answer within {}", fmt_duration(t))
            }
            v => v
                .error(&format!("fetch of {theirs_name}"), remote)
                .to_string(),
        };
        let e = crate::redact::text(&e);
        log.line(&format!("-> {e}"));
        return Ok(Some(Outcome::failed(format!(
            "offline or unreachable: {e}; {branch} not refreshed"
        ))));
    }
    log.line(&format!("-> {}", Exit::Status(ran.status).describe()));
    if !ran.status.success() {
        if u.guessed && stderr.contains("couldn't find remote ref") {
            return Ok(Some(Outcome::failed(format!(
                "{branch} has no upstream, and {remote} has no branch {upstream} to compare it with: push it (`git push -u {remote} {branch}`) or set `branch` in the step; {branch} not refreshed"
            ))));
        }
        let e = crate::git::remote_failure(&format!("fetching {theirs_name} failed"), &stderr);
        let shown = crate::redact::text(&format!("{e:#}"));
        let why = if crate::exit::code_of(&e) == crate::exit::Code::AuthRefused {
            "refused"
        } else {
            "offline or unreachable"
        };
        return Ok(Some(Outcome::failed(format!(
            "{why}: {shown}; {branch} not refreshed"
        ))));
    }
    Ok(None)
}

/// Compares HEAD with what was fetched and fast-forwards a clean tree that
/// is only behind; anything else is left as it is, with a warning.
fn compare_and_move(ctx: &Ctx, f: &Freshness, u: &Upstream, log: &mut Log) -> Result<Outcome> {
    let sh = ctx.sh;
    let root = &ctx.repo.root;
    let git = |args: &[&str]| -> Result<String> {
        cmd!(sh, "git -C {root} {args...}")
            .quiet()
            .ignore_stderr()
            .read()
            .with_context(|| format!("git {}", args.join(" ")))
    };
    let branch = &u.branch;
    let theirs_name = &u.compared();
    let theirs = git(&["rev-parse", "FETCH_HEAD"])?;
    let counts = git(&[
        "rev-list",
        "--left-right",
        "--count",
        &format!("HEAD...{theirs}"),
    ])?;
    let (ahead, behind) = counts
        .split_once('\t')
        .and_then(|(a, b)| Some((a.trim().parse::<u64>().ok()?, b.trim().parse::<u64>().ok()?)))
        .with_context(|| format!("reading `git rev-list --count` output {counts:?}"))?;
    log.line(&format!(
        "{branch}: ahead {ahead}, behind {behind} {theirs_name}"
    ));

    let outcome = if behind == 0 {
        Outcome::done(if ahead == 0 {
            format!("{branch} is up to date with {theirs_name}")
        } else {
            format!("{branch} is {ahead} commit(s) ahead of {theirs_name}")
        })
    } else if ahead > 0 {
        Outcome::done(format!("{branch} has diverged from {theirs_name}: untouched")).with_warnings(vec![format!(
            "WARNING: {branch} and {theirs_name} have diverged ({ahead} local, {behind} remote commit(s)): nothing was changed; rebase or merge by hand"
        )])
    } else {
        let dirty = git(&["status", "--porcelain", "--untracked-files=no"])?;
        if !dirty.is_empty() {
            Outcome::done(format!("{branch} is {behind} behind, tree dirty: untouched")).with_warnings(vec![format!(
                "WARNING: {branch} is {behind} commit(s) behind {theirs_name} and the work tree has local changes: nothing was changed; commit or stash, then `git merge --ff-only {}`", u.theirs_name
            )])
        } else {
            let mut merge: std::process::Command =
                cmd!(sh, "git -C {root} merge --ff-only --quiet {theirs}").into();
            let exit = proc::run_logged(
                &mut merge,
                log,
                Some(f.timeout.max(std::time::Duration::from_secs(60))),
            )?;
            if !exit.success() {
                return Ok(Outcome::failed(format!(
                    "fast-forward of {branch} to {theirs_name} failed: {}",
                    proc::last_log_line(log)
                )));
            }
            Outcome::done(format!(
                "fast-forwarded {branch} by {behind} commit(s) to {theirs_name} ({})",
                &theirs[..theirs.len().min(10)]
            ))
        }
    };
    Ok(outcome)
}
