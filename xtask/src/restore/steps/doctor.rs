//! `doctor`: run the network doctor (`restore::doctor`) as a step, always
//! fail-open: a host not reached, a dead proxy, or a doctor that cannot run
//! is a warning in the orientation table and the step's log, never a
//! failed step, not even under `--strict`.
//!
//! The doctor runs as a child (this same binary, `doctor --json`), bounded
//! by its own deadlines plus a margin, so a probe that hangs ends with the
//! child's process group and the restore goes on. The warm probe is the
//! time of the last check (`interval`, as `freshness`), so a warm restore
//! never goes to the network. Never: fail the restore, print a host's
//! credentials (the doctor's report has none), or probe from the probe.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use std::process::Command;
use std::time::Duration;

use super::common::{Ctx, Outcome, Probe};
use crate::clock::DurationSpec;
use crate::restore::fields::{dur, timeout};
use crate::restore::proc::{self, Log};
use crate::restore::report::fmt_duration;
use crate::restore::state;

/// Run `doctor`, fail-open, at most once per `interval`.
#[derive(Debug)]
pub struct Doctor {
    /// `doctor --connect-timeout` (default: the doctor's own).
    pub connect_timeout: Option<Duration>,
    /// `doctor --timeout`, one host's whole probe (default: the doctor's own).
    pub timeout: Option<Duration>,
    /// A check younger than this is warm (no network).
    pub interval: Duration,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDoctor {
    connect_timeout: Option<DurationSpec>,
    timeout: Option<DurationSpec>,
    interval: Option<DurationSpec>,
}

/// The doctor's default connect deadline, for the child's bound when the
/// step sets none (`WARMSTART_CONNECT_TIMEOUT` may set more: the margin
/// below covers the usual values, and the child's group ends either way).
const DEFAULT_CONNECT: Duration = Duration::from_secs(10);

pub fn resolve_doctor(r: RawDoctor, fail_open: bool) -> Result<Doctor> {
    if !fail_open {
        bail!(
            "a doctor step always fails open (a host not reached is a warning, never a failure): drop `fail_open = false`"
        );
    }
    let opt = |raw: &Option<DurationSpec>, field: &str| -> Result<Option<Duration>> {
        raw.as_ref()
            .map(|_| timeout(raw, field, Duration::ZERO))
            .transpose()
    };
    Ok(Doctor {
        connect_timeout: opt(&r.connect_timeout, "connect_timeout")?,
        timeout: opt(&r.timeout, "timeout")?,
        interval: dur(&r.interval, "interval", Duration::from_secs(3600))?,
    })
}

impl Doctor {
    /// The command line the step runs, for the table's SOURCE column.
    pub fn display(&self) -> String {
        self.args().join(" ")
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec!["doctor".to_string(), "--json".to_string()];
        if let Some(c) = self.connect_timeout {
            a.extend(["--connect-timeout".into(), crate::net::show(c)]);
        }
        if let Some(t) = self.timeout {
            a.extend(["--timeout".into(), crate::net::show(t)]);
        }
        a
    }

    /// How long the child may take: the doctor's own overall deadline
    /// (connect plus 10s unless `timeout` is set) and its 3s of grace,
    /// plus a margin for starting up.
    fn bound(&self) -> Duration {
        let connect = self.connect_timeout.unwrap_or(DEFAULT_CONNECT);
        let total = self
            .timeout
            .unwrap_or(connect + Duration::from_secs(10))
            .max(connect);
        total + Duration::from_secs(3 + 5)
    }
}

#[derive(Serialize, Deserialize)]
struct Stamp {
    checked_at: u64,
    what: String,
}

pub fn probe(ctx: &Ctx, name: &str, d: &Doctor) -> Probe {
    let stamp = state::read_stamp::<Stamp>(ctx.paths, name);
    match stamp.and_then(|s| Some((super::common::checked_within(s.checked_at, d.interval)?, s))) {
        Some((ago, s)) => Probe::warm(format!("checked {} ago: {}", fmt_duration(ago), s.what)),
        None => Probe::Needed("not checked recently".into()),
    }
}

/// One host of the doctor's `--json` report, as far as the step reads it.
#[derive(Deserialize)]
struct Host {
    host: String,
    port: u16,
    transport: String,
    result: String,
    reached: bool,
    meaning: String,
}

#[derive(Deserialize)]
struct Report {
    hosts: Vec<Host>,
    reached: usize,
    not_reached: usize,
}

pub fn run(ctx: &Ctx, name: &str, d: &Doctor, log: &mut Log) -> Result<Outcome> {
    let outcome = match examine(ctx, d, log) {
        Ok(o) => o,
        // Fail-open, whatever went wrong: the restore never stops for it.
        Err(e) => Outcome::done("the doctor did not report").with_warnings(vec![format!(
            "the network doctor did not run to the end: {e:#}; `{} doctor` shows the hosts",
            crate::invocation::command()
        )]),
    };
    for w in &outcome.warnings {
        log.line(w);
    }
    state::write_stamp(
        ctx.paths,
        name,
        &Stamp {
            checked_at: crate::clock::now_ms(),
            what: outcome.what.clone(),
        },
    )?;
    Ok(outcome)
}

/// Runs the doctor and reads its report: one warning per host not reached.
fn examine(ctx: &Ctx, d: &Doctor, log: &mut Log) -> Result<Outcome> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args(d.args())
        .envs(crate::net::flags_as_env())
        .current_dir(&ctx.repo.root);
    log.line(&format!("$ {}", proc::show(&cmd)));
    let (exit, out, err) = proc::capture(&mut cmd, Some(d.bound()))?;
    log.line(&format!("-> {}", exit.describe()));
    if !err.trim().is_empty() {
        log.line(err.trim_end());
    }
    let report: Report = serde_json::from_str(&out)
        .map_err(|e| anyhow::anyhow!("{} and printed no report ({e})", exit.describe()))?;
    let mut warnings = Vec::new();
    for h in &report.hosts {
        let line = format!(
            "{}:{} {} {}: {}",
            h.host, h.port, h.transport, h.result, h.meaning
        );
        log.line(&line);
        if !h.reached && h.result != "not-probed" {
            warnings.push(format!("network: {line}"));
        }
    }
    let what = if report.hosts.is_empty() {
        "no host to probe".to_string()
    } else {
        format!(
            "{} reached, {} not reached",
            report.reached, report.not_reached
        )
    };
    Ok(Outcome::done(what).with_warnings(warnings))
}
