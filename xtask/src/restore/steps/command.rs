//! `command`: run a command only when `creates` is missing and `unless` fails.
//!
//! The probe checks `creates` first (one `stat`); only when that is missing
//! (or not given) does it run the `unless` probe, silently. After a run that
//! exits 0, a `creates` path that still does not exist is a failure: the
//! command did not do what the manifest says, and the next run would repeat it.
//! A run that exits non-zero or outlives `timeout` is tried again when the
//! manifest sets `retries` (`restore::retry`, the policy `download` uses);
//! a command that succeeded without creating `creates` is not, since the
//! manifest and not the network is wrong then.

use crate::cache::format::manifest::expand_path;
use crate::clock::DurationSpec;
use crate::repo::Repo;
use crate::restore::fields::retry_policy;
use anyhow::{Result, bail};
use serde::Deserialize;
use std::path::Path;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use super::common::{Ctx, Outcome, Probe};
use crate::restore::proc::{self, Log};
use crate::restore::retry::{self, Attempt, Failure};

/// Runs only when `creates` is missing and `unless` does not succeed.
#[derive(Debug)]
pub struct CommandStep {
    pub run: Cmdline,
    pub creates: Option<PathBuf>,
    pub unless: Option<Cmdline>,
    pub cwd: PathBuf,
    /// Bounds each attempt; one that runs out is a failed attempt.
    pub timeout: Option<Duration>,
    /// A failed attempt is tried again (default: never, a command may not
    /// be safe to repeat), with `download`'s semantics.
    pub retry: crate::restore::retry::Policy,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCommand {
    run: Cmdline,
    creates: Option<String>,
    unless: Option<Cmdline>,
    cwd: Option<String>,
    timeout: Option<DurationSpec>,
    retries: Option<toml::Value>,
    backoff: Option<toml::Value>,
}

pub fn resolve_command(repo: &Repo, r: RawCommand) -> Result<CommandStep> {
    r.run.check("run")?;
    if let Some(u) = &r.unless {
        u.check("unless")?;
    }
    if r.creates.is_none() && r.unless.is_none() {
        bail!(
            "a command needs `creates` (a path) or `unless` (a probe command), else it would run on every restore"
        );
    }
    Ok(CommandStep {
        run: r.run,
        creates: r.creates.map(|c| expand_path(repo, &c)).transpose()?,
        unless: r.unless,
        cwd: match r.cwd {
            Some(c) => expand_path(repo, &c)?,
            None => repo.root.clone(),
        },
        timeout: r
            .timeout
            .map(|t| t.resolve_positive("timeout"))
            .transpose()?,
        retry: retry_policy(r.retries.as_ref(), r.backoff, 0)?,
    })
}

/// A command line: a string runs through `sh -c`, a list runs as argv.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum Cmdline {
    Shell(String),
    Argv(Vec<String>),
}

impl Cmdline {
    pub fn program_and_args(&self) -> (String, Vec<String>) {
        match self {
            Cmdline::Shell(s) => ("sh".into(), vec!["-c".into(), s.clone()]),
            Cmdline::Argv(v) => (v[0].clone(), v[1..].to_vec()),
        }
    }

    pub fn display(&self) -> String {
        match self {
            Cmdline::Shell(s) => s.clone(),
            Cmdline::Argv(v) => v.join(" "),
        }
    }

    pub fn check(&self, what: &str) -> Result<()> {
        match self {
            Cmdline::Shell(s) if s.trim().is_empty() => bail!("`{what}` is empty"),
            Cmdline::Argv(v) if v.is_empty() || v[0].is_empty() => bail!("`{what}` is empty"),
            _ => Ok(()),
        }
    }
}

fn command(c: &Cmdline, cwd: &Path) -> Command {
    let (program, args) = c.program_and_args();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(cwd);
    cmd
}

/// Whether an `unless` probe succeeds (exit 0), run silently in `cwd`.
/// Shared with `download`, whose `unless` means the same.
pub fn unless_succeeds(c: &Cmdline, cwd: &Path) -> bool {
    command(c, cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|st| st.success())
}

pub fn probe(_ctx: &Ctx, s: &CommandStep) -> Probe {
    if let Some(p) = &s.creates
        && p.exists()
    {
        return Probe::warm(format!("{} exists", p.display()));
    }
    if let Some(u) = &s.unless
        && unless_succeeds(u, &s.cwd)
    {
        return Probe::warm(format!("`{}` succeeds", u.display()));
    }
    Probe::Needed(match &s.creates {
        Some(p) => format!("{} is missing", p.display()),
        None => "the `unless` probe fails".into(),
    })
}

pub fn run(_ctx: &Ctx, s: &CommandStep, log: &mut Log) -> Result<Outcome> {
    let shown = format!("`{}`", s.run.display());
    let tried = retry::run(s.retry, &shown, log, |log| {
        let exit = proc::run_logged(&mut command(&s.run, &s.cwd), log, s.timeout)?;
        Ok(if exit.success() {
            Attempt::Ok(())
        } else {
            Attempt::Transient(format!("{}: {}", exit.describe(), proc::last_log_line(log)))
        })
    })?;
    let warnings = tried.warnings;
    let failed = |why: String| Ok(Outcome::failed(why).with_warnings(warnings.clone()));
    match tried.result {
        Ok(()) => {}
        // A single attempt keeps the message it always had.
        Err(Failure::Exhausted { attempts: 1, last }) => return failed(format!("{shown} {last}")),
        Err(Failure::Exhausted { attempts, last }) => {
            return failed(format!("{shown} failed after {attempts} attempts: {last}"));
        }
        Err(Failure::Permanent(why)) => return failed(format!("{shown} {why}")),
    }
    if let Some(p) = &s.creates
        && !p.exists()
    {
        return failed(format!(
            "{shown} succeeded but did not create {}: fix `run` or `creates`",
            p.display()
        ));
    }
    let attempts = warnings.len() + 1;
    Ok(Outcome::done(if attempts > 1 {
        format!("ran {shown} (on attempt {attempts})")
    } else {
        format!("ran {shown}")
    })
    .with_warnings(warnings))
}
