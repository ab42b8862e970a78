//! The 10-minute rule: a step whose cold run took longer than restore.toml's
//! `slow_uncached` (default 10 minutes) and whose result no cache holds is
//! flagged in the orientation table, with the command that would cache it.
//!
//! Judged from what the run already knows (the rows, the plan, the cache
//! manifests on disk): never the network, never a probe, never a write. A
//! step's result is held by a cache when the step was warm in this run and
//! each of its outputs lies under the target of a `cache` step that restored
//! or found its key in this run; a step that had to run was held by no
//! cache, whatever lies around its output. Only kinds that make files are
//! judged (`command`, `download`): a `cache` step is the cache itself, and a
//! service, pin, freshness, links, submodules or doctor step makes nothing a
//! cache could hold.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::plan::{Kind, Plan, Step};
use super::report::Row;
use super::state::State;
use crate::cache::format::manifest::CacheManifest;
use crate::repo::Repo;

/// Sets `cache_hint` on each row of `rows` the rule flags under `plan`.
pub fn mark(repo: &Repo, plan: &Plan, rows: &mut [Row]) {
    let Some(limit) = plan.slow_uncached else {
        return;
    };
    let slow = |r: &Row| {
        r.last_cold_ms
            .is_some_and(|ms| Duration::from_millis(ms) > limit)
    };
    if !rows.iter().any(slow) {
        return;
    }
    let manifests: Vec<CacheManifest> = crate::cache::manifests::names(repo)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| crate::cache::manifests::load(repo, n).ok())
        .collect();
    let cached_by_plan = |name: &str| {
        plan.steps
            .iter()
            .any(|s| matches!(&s.kind, Kind::Cache(c) if c.cache == name))
    };
    // The targets of the cache steps that hold their key after this run.
    let held: Vec<PathBuf> = rows
        .iter()
        .filter(|r| {
            matches!(
                r.state,
                State::Warm | State::Done | State::Partial | State::Warned
            )
        })
        .filter_map(|r| plan.steps.iter().find(|s| s.name == r.step))
        .filter_map(|s| match &s.kind {
            Kind::Cache(c) => manifests.iter().find(|m| m.name == c.cache),
            _ => None,
        })
        .map(|m| m.restore_path.clone())
        .collect();
    for row in rows.iter_mut().filter(|r| slow(r)) {
        let Some(step) = plan.steps.iter().find(|s| s.name == row.step) else {
            continue;
        };
        let Some(outputs) = outputs(step) else {
            continue;
        };
        // A row that ran in this run has its log; a warm one has none.
        let warm = row.log.is_none() && !row.state.is_failure();
        let under_held = |o: &PathBuf| held.iter().any(|t| o.starts_with(t));
        if warm && !outputs.is_empty() && outputs.iter().all(under_held) {
            continue;
        }
        let cold = Duration::from_millis(row.last_cold_ms.unwrap_or(0));
        row.cache_hint = Some(format!(
            "took {} cold (more than slow_uncached = {}) and no cache holds its result: {}",
            crate::clock::human(cold),
            crate::net::show(limit),
            hint(repo, step, &outputs, &manifests, &cached_by_plan)
        ));
    }
}

/// What a step makes, for the kinds the rule judges (`None`: not judged;
/// empty: a command with only `unless`, whose output is not named).
fn outputs(step: &Step) -> Option<Vec<PathBuf>> {
    match &step.kind {
        Kind::Command(c) => Some(c.creates.iter().cloned().collect()),
        Kind::Download(d) => Some(vec![
            d.unpack_into.clone().unwrap_or_else(|| d.dest.clone()),
        ]),
        _ => None,
    }
}

/// The command that would cache `step`'s result: the publish of a cache
/// manifest that packs or restores its output, else a new manifest's.
fn hint(
    repo: &Repo,
    step: &Step,
    outputs: &[PathBuf],
    manifests: &[CacheManifest],
    cached_by_plan: &dyn Fn(&str) -> bool,
) -> String {
    let cmd = crate::invocation::command();
    let covers = |m: &&CacheManifest| {
        !outputs.is_empty()
            && outputs
                .iter()
                .all(|o| o.starts_with(&m.pack_root) || o.starts_with(&m.restore_path))
    };
    if let Some(m) = manifests.iter().find(covers) {
        let step_too = if cached_by_plan(&m.name) {
            String::new()
        } else {
            format!(
                ", and restore it with a `kind = \"cache\"` step (`cache = \"{}\"`) before step {}",
                m.name, step.name
            )
        };
        return format!("`{cmd} cache publish {}`{step_too}", m.name);
    }
    let what = match outputs.first() {
        Some(o) => format!("pack {}", shown(repo, o)),
        None => "pack what it makes".to_string(),
    };
    format!(
        "{what} in a cache manifest (cache-manifests/{name}.toml, docs/caches.md), publish it with `{cmd} cache publish {name}`, and restore it with a `kind = \"cache\"` step before step {name}",
        name = step.name
    )
}

/// A path relative to the repository when it lies inside it.
fn shown(repo: &Repo, p: &Path) -> String {
    p.strip_prefix(&repo.root)
        .map(|r| r.display().to_string())
        .unwrap_or_else(|_| p.display().to_string())
}
