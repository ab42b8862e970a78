//! `command`: run a command only when `creates` is missing and `unless` fails.
//!
//! The probe checks `creates` first (one `stat`); only when that is missing
//! (or not given) does it run the `unless` probe, silently. After a run that
//! exits 0, a `creates` path that still does not exist is a failure: the
//! command did not do what the manifest says, and the next run would repeat it.

use anyhow::Result;
use std::process::{Command, Stdio};

use super::{Ctx, Outcome, Probe};
use crate::restore::plan::{Cmdline, CommandStep};
use crate::restore::proc::{self, Log};

fn command(c: &Cmdline, s: &CommandStep) -> Command {
    let (program, args) = c.program_and_args();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(&s.cwd);
    cmd
}

fn unless_succeeds(c: &Cmdline, s: &CommandStep) -> bool {
    command(c, s)
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
        && unless_succeeds(u, s)
    {
        return Probe::warm(format!("`{}` succeeds", u.display()));
    }
    Probe::Needed(match &s.creates {
        Some(p) => format!("{} is missing", p.display()),
        None => "the `unless` probe fails".into(),
    })
}

pub fn run(_ctx: &Ctx, s: &CommandStep, log: &mut Log) -> Result<Outcome> {
    let exit = proc::run_logged(&mut command(&s.run, s), log, s.timeout)?;
    if !exit.success() {
        return Ok(Outcome::failed(format!(
            "`{}` {}: {}",
            s.run.display(),
            exit.describe(),
            proc::last_log_line(log)
        )));
    }
    if let Some(p) = &s.creates
        && !p.exists()
    {
        return Ok(Outcome::failed(format!(
            "`{}` succeeded but did not create {}: fix `run` or `creates`",
            s.run.display(),
            p.display()
        )));
    }
    Ok(Outcome::done(format!("ran `{}`", s.run.display())))
}
