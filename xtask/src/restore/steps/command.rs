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

use anyhow::{Result, bail};
use serde::Deserialize;
use std::path::Path;
use std::process::{Command, Stdio};

use super::common::{Ctx, Outcome, Probe};
use crate::restore::plan::CommandStep;
use crate::restore::proc::{self, Log};
use crate::restore::retry::{self, Attempt, Failure};

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
