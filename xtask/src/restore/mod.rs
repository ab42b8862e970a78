//! `cargo xtask restore`: the ordered bootstrap of `cache-manifests/restore.toml`.
//!
//! `plan` validates the manifest into a `Plan` (nothing runs before the whole
//! manifest is known to be good); this module executes it: for each step a
//! cheap probe, then, only when needed, the step itself under a per-step
//! lock, with its own log. Background steps with work to do are handed to one
//! detached worker process (this same binary, `restore --worker`). It ends
//! with the orientation table (`report`) and keeps timings in `state`.
//! Steps run one by one in file order, unless the plan opts in with
//! `parallel`: then `schedule` orders them by `after` and runs independent
//! ones on threads; the table keeps the file order either way.
//!
//! A warm run must stay a near-instant no-op: it reads the manifest, the
//! state file and stamps, calls `stat`, and writes nothing. No step ever
//! prints; this module reports what they return.

pub mod doctor;
pub mod env;
pub mod exports;
pub mod fields;
pub mod plan;
pub mod proc;
pub mod report;
pub mod retry;
pub mod schedule;
pub mod slow;
pub mod state;
pub mod status;
pub mod steps;
pub mod stop;

use anyhow::{Context, Result};
use serde_json::json;
use std::cell::OnceCell;
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

/// The names of the steps restore.toml declares, for `cache gc`, which
/// keeps their logs (`cache::gc::LiveSteps`): `None` when it does not load,
/// none at all when there is no restore.toml.
pub fn step_names(repo: &Repo) -> Option<std::collections::BTreeSet<String>> {
    if !plan::path_of(repo).is_file() {
        return Some(std::collections::BTreeSet::new());
    }
    plan::load(repo)
        .ok()
        .map(|p| p.steps.into_iter().map(|s| s.name).collect())
}

pub fn run(sh: &xshell::Shell, args: RestoreArgs) -> Result<()> {
    if let Some(RestoreCommand::Status(s)) = &args.command {
        return status::run(s.json);
    }
    if let Some(RestoreCommand::Env(e)) = &args.command {
        return env::run(e);
    }
    if let Some(RestoreCommand::Stop(s)) = &args.command {
        return stop::run(s);
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
    let result = execute(&ctx, &plan, &selected, &args);
    // The table ends with the line that puts the exports in the caller's
    // shell; a step that failed fatally leaves the others' exports valid.
    let fatal_only = result
        .as_ref()
        .err()
        .is_none_or(|e| crate::exit::code_of(e) == Code::StepFailed);
    if !args.json
        && !args.worker
        && fatal_only
        && let Some(line) = env::eval_hint(&plan)
    {
        println!("{line}");
    }
    result
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

/// `restore --dry-run`: the plan as JSON, or as text with no JSON in it.
fn print_plan(repo: &Repo, plan: &Plan, steps: &[&Step], as_json: bool) {
    let described: Vec<_> = steps.iter().map(|s| s.describe(repo)).collect();
    if as_json {
        crate::contract::document(json!({
            "file": plan.file,
            "parallel": plan.parallel,
            "env": plan.exports.describe(),
            "steps": described,
        }));
        return;
    }
    println!("plan from {} (nothing was run)", plan.file.display());
    match plan.parallel {
        Some(n) => println!("parallel: up to {n} steps at once, each after the steps it names"),
        None => println!("in file order, one step at a time"),
    }
    if !plan.exports.is_empty() {
        println!(
            "[env] (always exported): {}",
            report::plain(&plan.exports.describe())
        );
    }
    for (i, (step, d)) in steps.iter().zip(&described).enumerate() {
        let mut flags = Vec::new();
        if step.background {
            flags.push("background");
        }
        if !step.fail_open {
            flags.push("fail-closed");
        }
        let after = format!("after {}", step.after.join(", "));
        if !step.after.is_empty() {
            flags.push(&after);
        }
        let flags = if flags.is_empty() {
            String::new()
        } else {
            format!(" [{}]", flags.join(", "))
        };
        println!("{}. {} ({}){flags}", i + 1, step.name, step.kind_name());
        if let Some(obj) = d["detail"].as_object() {
            for (k, v) in obj {
                if !report::is_empty(v) {
                    println!("   {k}: {}", report::plain(v));
                }
            }
        }
    }
}

fn execute(ctx: &Ctx, plan: &Plan, selected: &[&Step], args: &RestoreArgs) -> Result<()> {
    let prior = state::read_for_restore(ctx.paths);
    let ran = match plan.parallel {
        None => in_file_order(ctx, selected, args, &prior)?,
        Some(limit) => schedule_steps(ctx, selected, args, &prior, limit)?,
    };
    // The exit code of the step that stopped the restore: 12 when the trust
    // policy refused its cache key, else 11 (README "Restore"). In a
    // parallel plan the first such step in file order decides.
    let fatal = ran
        .iter()
        .find_map(|r| r.fatal.clone().map(|f| (f, r.code)));
    let deferred: Vec<usize> = (0..ran.len()).filter(|&i| ran[i].deferred).collect();
    let mut rows: Vec<Row> = ran.into_iter().map(|r| r.row).collect();
    slow::mark(ctx.repo, plan, &mut rows);

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

    let result = match fatal {
        Some((why, code)) => Err(fail(
            code,
            format!("{why}; restore stopped (fail-open is off: --strict or `fail_open = false`)"),
        )),
        None => Ok(()),
    };
    if args.json {
        // `ok` is the envelope's (the exit status); a step that failed open
        // shows in `all_steps_ok` and its row.
        let doc = json!({
            "all_steps_ok": !rows.iter().any(|r| r.state.is_failure()),
            "steps": rows,
            "background_pid": worker_pid,
        });
        return crate::contract::finish(doc, result);
    } else {
        print!("{}", report::table(&rows, "THIS RUN"));
        if let Some(pid) = worker_pid {
            println!(
                "background steps continue in pid {pid}: `{cmd} restore status` shows progress",
                cmd = crate::invocation::command(),
            );
        }
    }
    result
}

/// One step's part in a run: its row, whether it went to the background
/// worker, and the fatal failure it stops the restore with.
struct Ran {
    row: Row,
    deferred: bool,
    fatal: Option<String>,
    /// The exit code `fatal` stops the restore with.
    code: Code,
}

fn new_row(ctx: &Ctx, step: &Step, prior: &state::StateFile) -> Row {
    Row {
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
        partial: None,
        cache_hint: None,
    }
}

/// The default: one step after the other in file order; after a fatal
/// failure the rest are not run. A freshness step that fast-forwards may
/// replace the steps after it with those of the pulled restore.toml.
fn in_file_order(
    ctx: &Ctx,
    selected: &[&Step],
    args: &RestoreArgs,
    prior: &state::StateFile,
) -> Result<Vec<Ran>> {
    let replanned = OnceCell::new();
    let mut queue: Vec<&Step> = selected.to_vec();
    let mut next = 0;
    let mut ran: Vec<Ran> = Vec::new();
    while let Some(&step) = queue.get(next) {
        next += 1;
        if ran.iter().any(|r| r.fatal.is_some()) {
            let mut row = new_row(ctx, step, prior);
            row.what = "not run: an earlier step failed".into();
            ran.push(Ran {
                row,
                deferred: false,
                fatal: None,
                code: Code::StepFailed,
            });
            continue;
        }
        let mut r = attempt(ctx, step, args, prior, true)?;
        if matches!(step.kind, plan::Kind::Freshness(_))
            && r.row.log.is_some()
            && matches!(r.row.state, State::Done | State::Warned)
        {
            match replan(ctx, &args.only, &replanned, &mut queue, next, &step.name) {
                Ok(None) => {}
                Ok(Some(note)) => r.row.what = format!("{}; {note}", r.row.what),
                Err(warning) => {
                    eprintln!("{warning}");
                    r.row.warnings.push(warning);
                    r.row.state = State::Warned;
                }
            }
            // `restore status` says what this table says.
            record_final(ctx.paths, &r.row, None)?;
        }
        ran.push(r);
    }
    Ok(ran)
}

/// `parallel` plans: `schedule` decides the order, one thread per running
/// step (each with its own `Shell`, which is not shared across threads).
/// A spinner names the steps running now; the rows stay in file order.
fn schedule_steps(
    ctx: &Ctx,
    selected: &[&Step],
    args: &RestoreArgs,
    prior: &state::StateFile,
    limit: usize,
) -> Result<Vec<Ran>> {
    let index = |name: &str| selected.iter().position(|s| s.name == name);
    let nodes: Vec<schedule::Node> = selected
        .iter()
        .map(|s| schedule::Node {
            // `after` a step that `--only` left out: nothing to wait for.
            after: s.after.iter().filter_map(|a| index(a)).collect(),
            exclusive: s.writes_repo_git(),
        })
        .collect();
    let (repo, paths) = (ctx.repo, ctx.paths);
    let pb = crate::progress::spinner(String::new());
    let results = schedule::run(
        &nodes,
        limit,
        |i| {
            let sh = xshell::Shell::new().context("starting a shell for a parallel step")?;
            let ctx = Ctx {
                sh: &sh,
                repo,
                paths,
            };
            let r = attempt(&ctx, selected[i], args, prior, false)?;
            let end = if r.fatal.is_some() {
                schedule::End::Fatal
            } else if r.row.state.is_failure() {
                schedule::End::Failed
            } else {
                schedule::End::Ok
            };
            Ok((r, end))
        },
        |status| {
            let now: Vec<&str> = (0..status.len())
                .filter(|&i| status[i] == schedule::Status::Running)
                .map(|i| selected[i].name.as_str())
                .collect();
            pb.set_message(format!("running: {}", now.join(", ")));
        },
    );
    pb.finish_and_clear();
    Ok(results?
        .into_iter()
        .enumerate()
        .map(|(i, r)| match r {
            Ok(ran) => ran,
            Err(why) => {
                let mut row = new_row(ctx, selected[i], prior);
                row.what = match why {
                    schedule::Skip::AfterFailed(j) => {
                        format!("skipped: after failed step {}", selected[j].name)
                    }
                    schedule::Skip::Stopped => "not run: an earlier step failed".into(),
                };
                Ran {
                    row,
                    deferred: false,
                    fatal: None,
                    code: Code::StepFailed,
                }
            }
        })
        .collect())
}

/// Probes one step and runs it (or hands it to the background worker),
/// then reports its warnings and failure on stderr.
fn attempt(
    ctx: &Ctx,
    step: &Step,
    args: &RestoreArgs,
    prior: &state::StateFile,
    spin: bool,
) -> Result<Ran> {
    let start = Instant::now();
    let mut row = new_row(ctx, step, prior);
    let mut deferred = false;
    let mut fatal = None;
    let mut refused: Option<Code> = None;
    match warm_row(&mut row, steps::probe(ctx, step)) {
        None => {
            // `restore env` reads recorded states only: a step that
            // exports is recorded warm once (a steady warm run still
            // writes nothing).
            let recorded_ok = prior.steps.get(&step.name).is_some_and(|r| {
                matches!(
                    r.state,
                    State::Done | State::Warm | State::Warned | State::Partial
                )
            });
            if !step.exports.is_empty() && !recorded_ok {
                record_final(ctx.paths, &row, None)?;
            }
        }
        Some(why) => {
            let inline = args.worker || args.strict || !step.background;
            if inline {
                refused = run_step(ctx, step, &why, &mut row, spin)?;
            } else {
                match state::lock_step(ctx.paths, &step.name, false)? {
                    // Free: the worker spawned at the end will take it.
                    Some(lock) => {
                        drop(lock);
                        row.state = State::Background;
                        row.what = why;
                        deferred = true;
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
    let code = match refused {
        Some(Code::Untrusted) => Code::Untrusted,
        _ => Code::StepFailed,
    };
    Ok(Ran {
        row,
        deferred,
        fatal,
        code,
    })
}

/// After a freshness step did work (it may have fast-forwarded): reads
/// restore.toml again, and when the steps after `fresh` differ from those
/// queued, queues the new ones instead, so that a pin bump pulled now is
/// restored now rather than next session (cache keys are computed when a
/// step is probed, so a moved pin file is seen anyway; this is for what
/// restore.toml itself says: a new sha256, a new step). Once per run.
/// `Ok(Some(note))` for the row's WHAT when it re-planned; `Err(warning)`
/// when the file no longer loads (the queue stays as it was).
fn replan<'q>(
    ctx: &Ctx,
    only: &[String],
    cell: &'q OnceCell<Plan>,
    queue: &mut Vec<&'q Step>,
    next: usize,
    fresh: &str,
) -> std::result::Result<Option<String>, String> {
    let kept = |why: String| {
        Err(format!(
            "WARNING: {why}: the steps after {fresh} run as loaded at the start"
        ))
    };
    let new = match plan::load(ctx.repo) {
        Ok(p) => p,
        Err(e) => return kept(format!("restore.toml does not load now ({e:#})")),
    };
    let Some(at) = new.steps.iter().position(|s| s.name == fresh) else {
        return kept(format!("restore.toml has no step {fresh:?} now"));
    };
    let rest: Vec<&Step> = new.steps[at + 1..]
        .iter()
        .filter(|s| only.is_empty() || only.contains(&s.name))
        .collect();
    // What each step will do; `source` is left out, as it reads cache
    // manifests, which the probe reads afresh anyway.
    let describe = |steps: &[&Step]| -> Vec<serde_json::Value> {
        steps
            .iter()
            .map(|s| {
                let mut d = s.describe(ctx.repo);
                if let Some(o) = d.as_object_mut() {
                    o.remove("source");
                }
                d
            })
            .collect()
    };
    if describe(&rest) == describe(&queue[next..]) {
        return Ok(None);
    }
    if cell.get().is_some() {
        return kept("restore.toml changed again (it is re-read once per run)".into());
    }
    let n = rest.len();
    let new = cell.get_or_init(|| new);
    queue.truncate(next);
    queue.extend(
        new.steps[at + 1..]
            .iter()
            .filter(|s| only.is_empty() || only.contains(&s.name)),
    );
    Ok(Some(format!(
        "restore.toml changed: the {n} step(s) after it run as it says now"
    )))
}

/// Fills `row` from a probe that found the step warm (or partial) and
/// returns `None`; returns why it is needed otherwise.
fn warm_row(row: &mut Row, probe: Probe) -> Option<String> {
    match probe {
        Probe::Warm { what, warnings } => {
            row.state = if warnings.is_empty() {
                State::Warm
            } else {
                State::Warned
            };
            row.what = what;
            row.warnings = warnings;
            None
        }
        Probe::Partial { what, partial } => {
            row.state = State::Partial;
            row.what = what;
            row.partial = Some(partial);
            None
        }
        Probe::Needed(why) => Some(why),
    }
}

/// Runs one step that its probe said is needed: lock, re-probe, log, run,
/// record. Returns the exit code of its error when it failed with one
/// (`Code::Untrusted` for a cache key the trust policy refused).
fn run_step(ctx: &Ctx, step: &Step, why: &str, row: &mut Row, spin: bool) -> Result<Option<Code>> {
    let _lock = state::lock_step(ctx.paths, &step.name, true)?;
    // Another process may have finished it while we waited for the lock.
    if warm_row(row, steps::probe(ctx, step)).is_none() {
        return Ok(None);
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
    // In a parallel run the scheduler's one spinner names the running steps.
    let pb = spin.then(|| crate::progress::spinner(format!("{}: {why}", step.name)));
    // No "step NAME" context here: every line that quotes the outcome (the
    // table row, the messages of `execute`, the step's own log) names the
    // step already, and saying it twice read `step x failed: step x: ...`.
    let mut code = None;
    let outcome = steps::run(ctx, step, &mut log).unwrap_or_else(|e| {
        code = Some(crate::exit::code_of(&e));
        // A trust refusal reads `untrusted: key ... of cache ...` in the WHAT
        // column and the state file: its own line, which names the key, the
        // cache and the signer, first.
        let refusal = e
            .chain()
            .find_map(|x| x.downcast_ref::<crate::exit::Failure>())
            .filter(|f| f.code == Code::Untrusted);
        match refusal {
            Some(f) => steps::Outcome::failed(f.message.clone()),
            None => steps::Outcome::failed(format!("{e:#}")),
        }
    });
    if let Some(pb) = pb {
        pb.finish_and_clear();
    }
    let ms = start.elapsed().as_millis() as u64;
    log.line(&format!(
        "{} in {}: {}",
        if outcome.failed { "failed" } else { "done" },
        report::fmt_ms(Some(ms)),
        outcome.what
    ));
    row.state = if outcome.failed {
        State::FailedOpen
    } else if outcome.partial.is_some() {
        State::Partial
    } else if outcome.warnings.is_empty() {
        State::Done
    } else {
        State::Warned
    };
    row.what = outcome.what;
    row.warnings = outcome.warnings;
    row.partial = outcome.partial;
    row.log = Some(log_path);
    if !outcome.failed {
        row.last_cold_ms = Some(ms);
    }
    record_final(ctx.paths, row, Some((started_at, ms)))?;
    Ok(code)
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
        crate::contract::document(
            json!({ "background_pid": pid, "steps": names, "log": paths.worker_log() }),
        );
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
