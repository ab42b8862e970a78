//! `restore status`: the recorded state of each step, in manifest order,
//! with whether a background worker is still alive.
//!
//! It reads the plan and state.json only: it never probes, runs or locks a step.

use anyhow::Result;
use serde_json::json;

use super::plan;
use super::report::{self, Row};
use super::state::{self, Paths, State};
use crate::repo::Repo;

/// `restore status`: the state file, in manifest order, with worker liveness.
pub fn run(as_json: bool) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let paths = Paths::new(&repo);
    let file = state::read(&paths)?;
    // Manifest order when the manifest is readable; the state file alone otherwise.
    let order: Vec<(String, String, String)> = match plan::load(&repo) {
        Ok(p) => p
            .steps
            .iter()
            .map(|s| (s.name.clone(), s.kind_name().to_string(), s.source(&repo)))
            .collect(),
        Err(_) => file
            .steps
            .keys()
            .map(|k| (k.clone(), "-".into(), "-".into()))
            .collect(),
    };
    let mut rows = Vec::new();
    let mut extra = Vec::new();
    for (name, kind, source) in order {
        let Some(r) = file.steps.get(&name) else {
            rows.push(Row {
                step: name,
                kind,
                source,
                state: State::Skipped,
                what: "no run recorded in this clone (warm runs record nothing)".into(),
                warnings: vec![],
                ms: 0,
                last_cold_ms: None,
                log: None,
                pid: None,
                partial: None,
                cache_hint: None,
            });
            continue;
        };
        let alive = r.pid.map(state::pid_alive);
        let mut what = r.what.clone();
        if matches!(r.state, State::Running | State::Background) && alive == Some(false) {
            what = format!(
                "worker pid {} is gone: see its log; {what}",
                r.pid.unwrap_or(0)
            );
        }
        // RFC 3339 in JSON, as everywhere but the resume index.
        let at = |ms: Option<u64>| ms.map(crate::clock::rfc3339);
        extra.push(json!({
            "step": name, "alive": alive,
            "started_at": at(r.started_at), "finished_at": at(r.finished_at),
        }));
        rows.push(Row {
            step: name,
            kind,
            source,
            state: r.state,
            what,
            warnings: r.warnings.clone(),
            ms: r.ms.unwrap_or(0),
            last_cold_ms: r.last_cold_ms,
            log: r.log.clone(),
            pid: r.pid,
            partial: None,
            cache_hint: None,
        });
    }
    let running = rows.iter().any(|r| {
        matches!(r.state, State::Running | State::Background) && r.pid.is_some_and(state::pid_alive)
    });
    if as_json {
        let mut steps = serde_json::to_value(&rows)?;
        if let Some(list) = steps.as_array_mut() {
            for item in list.iter_mut() {
                if let Some(x) = extra.iter().find(|x| x["step"] == item["step"]) {
                    item["alive"] = x["alive"].clone();
                    item["started_at"] = x["started_at"].clone();
                    item["finished_at"] = x["finished_at"].clone();
                }
            }
        }
        crate::contract::document(
            json!({ "running": running, "steps": steps, "state_file": paths.state }),
        );
    } else {
        print!("{}", report::table(&rows, "LAST RUN"));
        if running {
            println!("background work is still running");
        }
    }
    Ok(())
}
