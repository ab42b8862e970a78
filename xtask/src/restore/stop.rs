//! `restore stop [STEP]`: ends the plan's service steps and removes their
//! pidfiles.
//!
//! It reads the plan and each service's pidfile; the signal itself is
//! `steps::service::stop_group`, which never signals a group the pidfile
//! does not prove to be the service's.

use anyhow::Result;
use serde::Serialize;
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::plan::{self, Kind};
use super::state::{self, Paths};
use super::steps::service::Service;
use super::steps::service::{Liveness, liveness, stop_group};
use crate::cli::restore::StopArgs;
use crate::exit::{Code, fail};
use crate::repo::Repo;

/// One service's result in `restore stop`.
#[derive(Debug, Serialize)]
struct Stopped {
    step: String,
    pidfile: PathBuf,
    was_running: bool,
    pid: Option<u32>,
    /// `SIGTERM` or `SIGKILL` when it was running.
    signal: Option<&'static str>,
    /// Why it was not running, or why stopping failed.
    note: Option<String>,
    ok: bool,
    #[serde(rename = "duration_ms")]
    ms: u64,
}

fn stop_one(paths: &Paths, name: &str, s: &Service) -> Result<Stopped> {
    let _lock = state::lock_step(paths, name, true)?;
    let start = Instant::now();
    let mut out = Stopped {
        step: name.to_string(),
        pidfile: s.pidfile.clone(),
        was_running: false,
        pid: None,
        signal: None,
        note: None,
        ok: true,
        ms: 0,
    };
    match liveness(&s.pidfile, name) {
        Liveness::Absent => out.note = Some("not running (no pidfile)".into()),
        Liveness::NotRunning(why) => out.note = Some(format!("not running: {why}")),
        Liveness::Running(rec) => {
            out.was_running = true;
            out.pid = Some(rec.pid);
            match stop_group(rec.pid, s.kill_grace) {
                Ok(sig) => out.signal = Some(sig),
                Err(e) => {
                    out.ok = false;
                    out.note = Some(format!("{e:#}"));
                }
            }
        }
    }
    if out.ok {
        match std::fs::remove_file(&s.pidfile) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                out.ok = false;
                out.note = Some(format!("removing {}: {e}", s.pidfile.display()));
            }
        }
    }
    out.ms = start.elapsed().as_millis() as u64;
    Ok(out)
}

/// `restore stop [STEP]`: ends the named service (default: every service
/// step of the plan) by process group and removes its pidfile.
pub fn run(args: &StopArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let plan = plan::load(&repo)?;
    let services = select_services(&plan, args.step.as_deref())?;
    let paths = Paths::new(&repo);
    let mut results = Vec::new();
    for (name, s) in services {
        results.push(stop_one(&paths, name, s)?);
    }
    let result = match results.iter().find(|r| !r.ok) {
        Some(r) => Err(fail(
            Code::Failed,
            format!(
                "service {} did not stop: {}",
                r.step,
                r.note.as_deref().unwrap_or("")
            ),
        )),
        None => Ok(()),
    };
    if args.json {
        return crate::contract::finish(json!({ "services": results }), result);
    } else if crate::out::quiet() {
        // As `cache restore -q`: the lines say what happened, the exit code
        // already does, and a failure still prints its error.
    } else if results.is_empty() {
        println!("no service steps in {}", plan.file.display());
    } else {
        for r in &results {
            let line = match (r.pid, r.signal) {
                (Some(pid), Some(sig)) => format!(
                    "{}: stopped pid {pid} and its process group ({sig}, {}); removed {}",
                    r.step,
                    crate::clock::human(Duration::from_millis(r.ms)),
                    r.pidfile.display()
                ),
                _ => format!("{}: {}", r.step, r.note.as_deref().unwrap_or("")),
            };
            println!("{line}");
        }
    }
    result
}

fn select_services<'p>(
    plan: &'p plan::Plan,
    only: Option<&str>,
) -> Result<Vec<(&'p str, &'p Service)>> {
    let services: Vec<_> = plan
        .steps
        .iter()
        .filter_map(|st| match &st.kind {
            Kind::Service(s) if only.is_none_or(|o| o == st.name) => Some((st.name.as_str(), s)),
            _ => None,
        })
        .collect();
    if let Some(name) = only
        && services.is_empty()
    {
        let why = match plan.steps.iter().find(|s| s.name == name) {
            Some(st) => format!("step {name:?} is a {} step, not a service", st.kind_name()),
            None => format!("no step named {name:?}"),
        };
        let names: Vec<_> = plan
            .steps
            .iter()
            .filter(|s| matches!(s.kind, Kind::Service(_)))
            .map(|s| s.name.as_str())
            .collect();
        return Err(fail(
            Code::Usage,
            format!(
                "{why} in {}: services are {}",
                plan.file.display(),
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ));
    }
    Ok(services)
}
