//! `cargo xtask restore`: the ordered bootstrap of `cache-manifests/restore.toml`.
//!
//! `plan` validates the manifest into a `Plan` (nothing runs before the whole
//! manifest is known to be good); this module executes it: for each step a
//! cheap probe, then, only when needed, the step itself under a per-step
//! lock, with its own log. Background steps with work to do are handed to one
//! detached worker process (this same binary, `restore --worker`). It ends
//! with the orientation table (`report`) and keeps timings in `state`.
//!
//! A warm run must stay a near-instant no-op: it reads the manifest, the
//! state file and stamps, calls `stat`, and writes nothing. No step ever
//! prints; this module reports what they return.

pub mod plan;
pub mod proc;
pub mod report;
pub mod state;
pub mod steps;

use anyhow::{Context, Result};
use serde_json::json;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

use crate::cli::restore::{RestoreArgs, RestoreCommand};
use crate::exit::{Code, fail};
use crate::repo::Repo;
use plan::{Plan, Step};
use report::Row;
use state::{Paths, State, StepRecord};
use steps::{Ctx, Probe};

pub fn run(sh: &xshell::Shell, args: RestoreArgs) -> Result<()> {
    if let Some(RestoreCommand::Status(s)) = &args.command {
        return status(s.json);
    }
    args.network.apply()?;
    let repo = Repo::from_cwd()?;
    let plan = plan::load(&repo)?;
    let selected = select(&plan, &args.only)?;
    if args.dry_run {
        print_plan(&repo, &plan, &selected, args.json);
        return Ok(());
    }
    let paths = Paths::new(&repo);
    if args.background && !args.worker {
        return hand_off_everything(&repo, &paths, &selected, args.json);
    }
    let ctx = Ctx {
        sh,
        repo: &repo,
        paths: &paths,
    };
    execute(&ctx, &selected, &args)
}

/// The steps `--only` names, in manifest order (all when none is named).
fn select<'p>(plan: &'p Plan, only: &[String]) -> Result<Vec<&'p Step>> {
    for name in only {
        if !plan.steps.iter().any(|s| &s.name == name) {
            let names: Vec<_> = plan.steps.iter().map(|s| s.name.as_str()).collect();
            return Err(fail(
                Code::Usage,
                format!(
                    "no step named {name:?} in {}: steps are {}",
                    plan.file.display(),
                    names.join(", ")
                ),
            ));
        }
    }
    Ok(plan
        .steps
        .iter()
        .filter(|s| only.is_empty() || only.contains(&s.name))
        .collect())
}

fn print_plan(repo: &Repo, plan: &Plan, steps: &[&Step], as_json: bool) {
    let described: Vec<_> = steps.iter().map(|s| s.describe(repo)).collect();
    if as_json {
        let out = json!({ "file": plan.file, "steps": described });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return;
    }
    println!("plan from {} (nothing was run)", plan.file.display());
    for (i, (step, d)) in steps.iter().zip(&described).enumerate() {
        let mut flags = Vec::new();
        if step.background {
            flags.push("background");
        }
        if !step.fail_open {
            flags.push("fail-closed");
        }
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(" [{}]", flags.join(", "))
        };
        println!("{}. {} ({}){flags}", i + 1, step.name, step.kind_name());
        if let Some(obj) = d["detail"].as_object() {
            for (k, v) in obj {
                if !v.is_null() {
                    let v = v
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| v.to_string());
                    println!("   {k}: {v}");
                }
            }
        }
    }
}

fn execute(ctx: &Ctx, selected: &[&Step], args: &RestoreArgs) -> Result<()> {
    let prior = state::read_for_restore(ctx.paths);
    let mut rows: Vec<Row> = Vec::new();
    let mut deferred: Vec<usize> = Vec::new();
    let mut fatal: Option<String> = None;
    for step in selected {
        let start = Instant::now();
        let mut row = Row {
            step: step.name.clone(),
            kind: step.kind_name().into(),
            source: step.source(ctx.repo),
            state: State::Skipped,
            what: String::new(),
            warnings: Vec::new(),
            ms: 0,
            last_cold_ms: prior.steps.get(&step.name).and_then(|r| r.last_cold_ms),
            log: None,
            pid: None,
        };
        if fatal.is_some() {
            row.what = "not run: an earlier step failed".into();
            rows.push(row);
            continue;
        }
        match steps::probe(ctx, step) {
            Probe::Warm { what, warnings } => {
                row.state = if warnings.is_empty() {
                    State::Warm
                } else {
                    State::Warned
                };
                row.what = what;
                row.warnings = warnings;
            }
            Probe::Needed(why) => {
                let inline = args.worker || args.strict || !step.background;
                if inline {
                    run_step(ctx, step, &why, &mut row)?;
                } else {
                    match state::lock_step(ctx.paths, &step.name, false)? {
                        // Free: the worker spawned below will take it.
                        Some(lock) => {
                            drop(lock);
                            row.state = State::Background;
                            row.what = why;
                            deferred.push(rows.len());
                        }
                        None => {
                            row.state = State::Running;
                            row.what = "already running in another process".into();
                            row.pid = prior.steps.get(&step.name).and_then(|r| r.pid);
                        }
                    }
                }
            }
        }
        row.ms = start.elapsed().as_millis() as u64;
        for w in &row.warnings {
            eprintln!("{w}");
        }
        if row.state.is_failure() {
            let log = row
                .log
                .as_ref()
                .map(|l| format!(" (log: {})", l.display()))
                .unwrap_or_default();
            if args.strict || !step.fail_open {
                row.state = State::Failed;
                eprintln!("restore: {} failed: {}{log}", step.name, row.what);
                fatal = Some(format!("step {} failed: {}", step.name, row.what));
            } else {
                eprintln!(
                    "restore: {} failed (fail-open, continuing): {}{log}",
                    step.name, row.what
                );
            }
            if row.state == State::Failed {
                record_final(ctx.paths, &row, None)?;
            }
        }
        rows.push(row);
    }

    let mut worker_pid = None;
    if !deferred.is_empty() {
        let names: Vec<String> = deferred.iter().map(|&i| rows[i].step.clone()).collect();
        let pid = spawn_worker(ctx.repo, ctx.paths, &names)?;
        for &i in &deferred {
            rows[i].pid = Some(pid);
            rows[i].log = Some(ctx.paths.log(&rows[i].step));
        }
        worker_pid = Some(pid);
    }

    if args.json {
        let out = json!({
            "ok": fatal.is_none() && !rows.iter().any(|r| r.state.is_failure()),
            "steps": rows,
            "background_pid": worker_pid,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report::table(&rows, "THIS RUN"));
        if let Some(pid) = worker_pid {
            println!(
                "background steps continue in pid {pid}: `{cmd} restore status` shows progress",
                cmd = crate::invocation::command(),
            );
        }
    }
    match fatal {
        Some(why) => Err(fail(
            Code::StepFailed,
            format!("{why}; restore stopped (fail-open is off: --strict or `fail_open = false`)"),
        )),
        None => Ok(()),
    }
}

/// Runs one step that its probe said is needed: lock, re-probe, log, run, record.
fn run_step(ctx: &Ctx, step: &Step, why: &str, row: &mut Row) -> Result<()> {
    let _lock = state::lock_step(ctx.paths, &step.name, true)?;
    // Another process may have finished it while we waited for the lock.
    if let Probe::Warm { what, warnings } = steps::probe(ctx, step) {
        row.state = if warnings.is_empty() {
            State::Warm
        } else {
            State::Warned
        };
        row.what = what;
        row.warnings = warnings;
        return Ok(());
    }
    let log_path = ctx.paths.log(&step.name);
    let started_at = crate::clock::now_ms();
    state::update(ctx.paths, |f| {
        let mut r = f
            .steps
            .remove(&step.name)
            .unwrap_or_else(|| StepRecord::new(State::Running, ""));
        r.state = State::Running;
        r.what = why.to_string();
        r.started_at = Some(started_at);
        r.finished_at = None;
        r.pid = Some(std::process::id());
        r.log = Some(log_path.clone());
        f.steps.insert(step.name.clone(), r);
    })?;
    let mut log = proc::Log::create(
        &log_path,
        &format!(
            "restore step {} ({}), pid {}: {why}",
            step.name,
            step.kind_name(),
            std::process::id()
        ),
    )?;
    let start = Instant::now();
    let pb = crate::progress::spinner(format!("{}: {why}", step.name));
    let outcome = steps::run(ctx, step, &mut log)
        .with_context(|| format!("step {}", step.name))
        .unwrap_or_else(|e| steps::Outcome::failed(format!("{e:#}")));
    pb.finish_and_clear();
    let ms = start.elapsed().as_millis() as u64;
    log.line(&format!(
        "{} in {}: {}",
        if outcome.failed { "failed" } else { "done" },
        report::fmt_ms(Some(ms)),
        outcome.what
    ));
    row.state = if outcome.failed {
        State::FailedOpen
    } else if outcome.warnings.is_empty() {
        State::Done
    } else {
        State::Warned
    };
    row.what = outcome.what;
    row.warnings = outcome.warnings;
    row.log = Some(log_path);
    if !outcome.failed {
        row.last_cold_ms = Some(ms);
    }
    record_final(ctx.paths, row, Some((started_at, ms)))
}

/// Writes a finished row into the state file.
fn record_final(paths: &Paths, row: &Row, timing: Option<(u64, u64)>) -> Result<()> {
    state::update(paths, |f| {
        let r = f
            .steps
            .entry(row.step.clone())
            .or_insert_with(|| StepRecord::new(row.state, ""));
        r.state = row.state;
        r.what = row.what.clone();
        r.warnings = row.warnings.clone();
        r.pid = None;
        r.log = row.log.clone().or(r.log.take());
        if let Some((started_at, ms)) = timing {
            r.started_at = Some(started_at);
            r.finished_at = Some(crate::clock::now_ms());
            r.ms = Some(ms);
            if !row.state.is_failure() {
                r.last_cold_ms = Some(ms);
                r.last_cold_at = r.finished_at;
            }
        }
    })
}

/// Starts the detached worker for `names`: a new session (no terminal, no
/// signals from this one), output into the worker log, nothing inherited.
/// The state file says `background` for each step before the worker starts,
/// so that the worker's own `running`/`done` is never overwritten.
fn spawn_worker(repo: &Repo, paths: &Paths, names: &[String]) -> Result<u32> {
    state::update(paths, |f| {
        for n in names {
            let r = f
                .steps
                .entry(n.clone())
                .or_insert_with(|| StepRecord::new(State::Background, ""));
            r.state = State::Background;
            r.what = "queued for the background worker".into();
            r.pid = None;
        }
    })?;
    std::fs::create_dir_all(&paths.logs)
        .with_context(|| format!("creating {}", paths.logs.display()))?;
    let log_path = paths.worker_log();
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let exe = std::env::current_exe().context("finding this executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["restore", "--worker", "--only", &names.join(",")])
        .envs(crate::net::flags_as_env())
        .current_dir(&repo.root)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .context("starting the background restore worker")?;
    let pid = child.id();
    state::update(paths, |f| {
        for n in names {
            if let Some(r) = f.steps.get_mut(n)
                && r.state == State::Background
                && r.pid.is_none()
            {
                r.pid = Some(pid);
            }
        }
    })?;
    Ok(pid)
}

/// `--background`: hand every selected step to a worker and return at once.
fn hand_off_everything(
    repo: &Repo,
    paths: &Paths,
    selected: &[&Step],
    as_json: bool,
) -> Result<()> {
    let names: Vec<String> = selected.iter().map(|s| s.name.clone()).collect();
    let pid = spawn_worker(repo, paths, &names)?;
    if as_json {
        let out = json!({ "background_pid": pid, "steps": names, "log": paths.worker_log() });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "restore of {} step(s) continues in the background (pid {pid}); `{cmd} restore status` shows progress; log: {}",
            names.len(),
            paths.worker_log().display(),
            cmd = crate::invocation::command(),
        );
    }
    Ok(())
}

/// `restore status`: the state file, in manifest order, with worker liveness.
fn status(as_json: bool) -> Result<()> {
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
        extra.push(json!({
            "step": name, "alive": alive,
            "started_at": r.started_at, "finished_at": r.finished_at,
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
        let out = json!({ "running": running, "steps": steps, "state_file": paths.state });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", report::table(&rows, "LAST RUN"));
        if running {
            println!("background work is still running");
        }
    }
    Ok(())
}
