//! Gates: named commands whose success on a tree is recorded, so that a cache
//! is only published from a tree that passed them.
//!
//! `manifest` parses `cache-manifests/gates.toml` into a plan, `record` is the
//! JSON record format, `store` keeps records in git refs and moves them between
//! clones, `runner` runs one command in its own process group with a deadline.
//! This file holds the commands and [`require_green`], the check `cache
//! publish` calls.
//!
//! Must never: record a gate that did not pass, record for a dirty worktree
//! or for a tree other than the one the gate ran on, count an entry whose
//! command digest differs from the gate's current definition as green, or
//! leave a gate's processes running after it ends.

pub mod manifest;
pub mod record;
pub mod runner;
pub mod store;

use anyhow::Result;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, SystemTime};
use xshell::Shell;

use crate::cli::gates::{
    CheckArgs, FetchFirst, GatesArgs, GatesCommand, RemoteArgs, RunArgs, StatusArgs,
};
use crate::exit::{Code, fail};
use crate::repo::Repo;
use manifest::{Gate, Plan};
use record::{Entry, Record, State};
use store::Head;

/// Lines of a failed gate's output repeated after it, with the log's path.
const TAIL_LINES: usize = 30;

pub fn run(sh: &Shell, args: GatesArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    match args.command {
        GatesCommand::Run(a) => run_gates(sh, &repo, a),
        GatesCommand::Status(a) => status(sh, &repo, a),
        GatesCommand::Check(a) => check(sh, &repo, a),
        GatesCommand::Fetch(a) => fetch(sh, &repo, a),
        GatesCommand::Push(a) => push(sh, &repo, a),
    }
}

/// The green record covering every `required` gate for HEAD's tree on a clean
/// worktree, as JSON to embed in a cache branch's warmstart.json (the record
/// restricted to the required gates). With `required` empty: `Value::Null`.
///
/// Errors: exit 9 (`Code::NotGreen`) when the worktree is dirty or a gate is
/// missing or stale, naming them and the command that makes them green; exit
/// 10 when gates.toml is missing, invalid, or does not define a required
/// gate; exit 5 when the stored record is unreadable. Local only: call
/// [`fetch_record`] first to take records pushed from other machines.
pub fn require_green(sh: &Shell, repo: &Repo, required: &[String]) -> Result<Value> {
    if required.is_empty() {
        return Ok(Value::Null);
    }
    let plan = manifest::load(&repo.root)?;
    verdict(sh, repo, &plan, required)?.require()
}

/// Fetches `remote`'s record for HEAD's tree into this clone (merging it with
/// the local one). Exit 8 when the remote cannot be reached in `timeout`.
pub fn fetch_record(
    sh: &Shell,
    repo: &Repo,
    remote: &str,
    timeout: Duration,
) -> Result<store::Fetched> {
    let head = store::head(sh, &repo.root)?;
    store::fetch(sh, &repo.root, remote, &head.tree, timeout)
}

/// Where HEAD's tree stands against some gates.
struct Verdict {
    head: Head,
    dirty: Vec<String>,
    record: Option<Record>,
    /// (gate, state, digest), in the order asked.
    states: Vec<(String, State)>,
}

fn verdict(sh: &Shell, repo: &Repo, plan: &Plan, names: &[String]) -> Result<Verdict> {
    let gates = plan.select(names)?;
    let head = store::head(sh, &repo.root)?;
    let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
    let record = store::read_valid(sh, &repo.root, &head.tree)?;
    let states = gates
        .iter()
        .map(|g| {
            let state = record
                .as_ref()
                .map_or(State::Missing, |r| r.state(&g.name, &g.digest));
            (g.name.clone(), state)
        })
        .collect();
    Ok(Verdict {
        head,
        dirty,
        record,
        states,
    })
}

impl Verdict {
    fn missing(&self) -> Vec<String> {
        self.states
            .iter()
            .filter(|(_, s)| *s != State::Green)
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn green(&self) -> bool {
        self.dirty.is_empty() && self.missing().is_empty()
    }

    /// The record restricted to the asked gates, if green; else the exit-9 error.
    fn require(&self) -> Result<Value> {
        let tree = &self.head.tree;
        if !self.dirty.is_empty() {
            return Err(fail(
                Code::NotGreen,
                format!(
                    "gates not green for tree {tree}: {}",
                    dirty_reason(&self.dirty)
                ),
            ));
        }
        let missing = self.missing();
        if !missing.is_empty() {
            return Err(fail(
                Code::NotGreen,
                format!(
                    "gates not green for tree {tree}: missing {}; run `cargo xtask gates run {}`",
                    missing.join(", "),
                    missing.join(" ")
                ),
            ));
        }
        let names: Vec<String> = self.states.iter().map(|(n, _)| n.clone()).collect();
        // No gates asked (an empty gates.toml): green, with an empty record.
        let record = self
            .record
            .clone()
            .unwrap_or_else(|| Record::new(tree))
            .only(&names);
        Ok(serde_json::to_value(record)?)
    }
}

/// Why a dirty worktree cannot be green, naming a few paths and the ways out.
fn dirty_reason(dirty: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut shown = dirty
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if dirty.len() > SHOWN {
        shown.push_str(&format!(" and {} more", dirty.len() - SHOWN));
    }
    format!(
        "the worktree is dirty ({shown}); commit or stash the changes, or list the paths under `ignore` in {}",
        manifest::PATH
    )
}

fn fetch_first(sh: &Shell, repo: &Repo, opt: &FetchFirst) {
    if let Some(remote) = &opt.fetch
        && let Err(e) = fetch_record(sh, repo, remote, opt.fetch_timeout)
    {
        eprintln!("warning: {e:#}; using the records already in this clone");
    }
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("JSON values serialize")
    );
}

fn check(sh: &Shell, repo: &Repo, args: CheckArgs) -> Result<()> {
    let plan = manifest::load(&repo.root)?;
    let names = if args.names.is_empty() {
        plan.names()
    } else {
        args.names
    };
    fetch_first(sh, repo, &args.fetch);
    let v = verdict(sh, repo, &plan, &names)?;
    let result = v.require();
    if args.json {
        print_json(&json!({
            "green": result.is_ok(),
            "tree": v.head.tree,
            "head": v.head.commit,
            "dirty": v.dirty,
            "missing": v.missing(),
            "record": result.as_ref().ok(),
        }));
    } else if result.is_ok() {
        println!(
            "green: {} for tree {}",
            if names.is_empty() {
                "no gates defined".to_string()
            } else {
                names.join(", ")
            },
            v.head.tree
        );
    }
    result.map(|_| ())
}

fn status(sh: &Shell, repo: &Repo, args: StatusArgs) -> Result<()> {
    let plan = manifest::load(&repo.root)?;
    fetch_first(sh, repo, &args.fetch);
    let v = verdict(sh, repo, &plan, &plan.names())?;
    let entry = |name: &str| v.record.as_ref().and_then(|r| r.gates.get(name));
    if args.json {
        let gates: Vec<Value> = v
            .states
            .iter()
            .map(|(name, state)| json!({ "name": name, "state": state.as_str(), "entry": entry(name) }))
            .collect();
        print_json(&json!({
            "tree": v.head.tree,
            "head": v.head.commit,
            "clean": v.dirty.is_empty(),
            "dirty": v.dirty,
            "green": v.green(),
            "gates": gates,
        }));
        return Ok(());
    }
    println!(
        "tree {} (HEAD {}), {}",
        v.head.tree,
        short(&v.head.commit),
        if v.dirty.is_empty() {
            "worktree clean".to_string()
        } else {
            format!(
                "worktree dirty ({} paths): records do not apply until it is clean",
                v.dirty.len()
            )
        }
    );
    let mut rows = vec![
        ["GATE", "STATE", "TIME", "HOST", "FINISHED", "COMMIT"]
            .map(String::from)
            .to_vec(),
    ];
    for (name, state) in &v.states {
        let mut row = vec![name.clone(), state.as_str().to_string()];
        if let Some(e) = entry(name) {
            row.extend([
                seconds(Duration::from_millis(e.duration_ms)),
                e.host.clone(),
                e.finished_at.clone(),
                short(&e.commit).to_string(),
            ]);
        }
        rows.push(row);
    }
    print!("{}", table(&rows));
    if v.states.iter().any(|(_, s)| *s == State::Stale) {
        println!(
            "stale: the gate's command, cwd or env changed since it was recorded; run it again"
        );
    }
    Ok(())
}

fn fetch(sh: &Shell, repo: &Repo, args: RemoteArgs) -> Result<()> {
    let head = store::head(sh, &repo.root)?;
    let fetched = store::fetch(sh, &repo.root, &args.remote, &head.tree, args.timeout)?;
    let record = store::read_valid(sh, &repo.root, &head.tree)?;
    let gates: Vec<&String> = record.iter().flat_map(|r| r.gates.keys()).collect();
    if args.json {
        print_json(&json!({
            "remote": args.remote,
            "tree": head.tree,
            "result": fetched.as_str(),
            "gates": gates,
        }));
    } else if fetched == store::Fetched::NoneThere {
        println!(
            "`{}` has no gate record for tree {}",
            args.remote, head.tree
        );
    } else {
        println!(
            "fetched the gate record for tree {} from `{}` ({}); green here now: {}",
            head.tree,
            args.remote,
            fetched.as_str(),
            list_or_none(&gates)
        );
    }
    Ok(())
}

fn push(sh: &Shell, repo: &Repo, args: RemoteArgs) -> Result<()> {
    let head = store::head(sh, &repo.root)?;
    let (pushed, record) = store::push(sh, &repo.root, &args.remote, &head.tree, args.timeout)?;
    let gates: Vec<&String> = record.gates.keys().collect();
    if args.json {
        print_json(&json!({
            "remote": args.remote,
            "tree": head.tree,
            "ref": store::ref_name(&head.tree),
            "result": pushed.as_str(),
            "gates": gates,
        }));
    } else {
        println!(
            "gate record for tree {} on `{}`: {} ({})",
            head.tree,
            args.remote,
            pushed.as_str(),
            list_or_none(&gates)
        );
    }
    Ok(())
}

fn list_or_none(names: &[&String]) -> String {
    if names.is_empty() {
        "none".into()
    } else {
        names
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How one gate of a run ended.
#[derive(Clone, Debug, PartialEq)]
enum Ended {
    Passed,
    AlreadyGreen,
    Failed(String),
    TimedOut,
    Interrupted(i32),
    NotRun,
}

struct GateRun {
    name: String,
    result: Ended,
    duration: Option<Duration>,
    /// Recorded green for the tree.
    recorded: bool,
    /// Why a passing gate was not recorded, or other remarks.
    note: Option<String>,
    log: Option<PathBuf>,
}

impl GateRun {
    fn label(&self) -> &'static str {
        match self.result {
            Ended::Passed => "passed",
            Ended::AlreadyGreen => "already-green",
            Ended::Failed(_) => "failed",
            Ended::TimedOut => "timed-out",
            Ended::Interrupted(_) => "interrupted",
            Ended::NotRun => "not-run",
        }
    }

    fn bad(&self) -> bool {
        matches!(
            self.result,
            Ended::Failed(_) | Ended::TimedOut | Ended::Interrupted(_)
        )
    }
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

fn run_gates(sh: &Shell, repo: &Repo, args: RunArgs) -> Result<()> {
    let plan = manifest::load(&repo.root)?;
    let gates = plan.select(&args.names)?;
    let head = store::head(sh, &repo.root)?;
    let record_it = !args.no_record;
    if record_it {
        let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
        if !dirty.is_empty() {
            return Err(fail(
                Code::NotGreen,
                format!(
                    "refusing to run gates for tree {}: {} (or run with --no-record to only test)",
                    head.tree,
                    dirty_reason(&dirty)
                ),
            ));
        }
    }
    let existing = if args.skip_green {
        store::read_valid(sh, &repo.root, &head.tree)?
    } else {
        None
    };
    let host = host_name();
    let tool = format!("warmstart {}", env!("CARGO_PKG_VERSION"));

    let mut runs: Vec<GateRun> = Vec::new();
    for gate in &gates {
        let stop = if let Some(sig) = runner::interrupted() {
            Some(format!(
                "warmstart was interrupted by {}",
                runner::signal_name(sig)
            ))
        } else if !args.keep_going && runs.iter().any(GateRun::bad) {
            Some("an earlier gate failed".to_string())
        } else {
            None
        };
        let mut run = GateRun {
            name: gate.name.clone(),
            result: Ended::NotRun,
            duration: None,
            recorded: false,
            note: None,
            log: None,
        };
        if let Some(why) = stop {
            run.note = Some(why);
            runs.push(run);
            continue;
        }
        if existing
            .as_ref()
            .is_some_and(|r| r.state(&gate.name, &gate.digest) == State::Green)
        {
            run.result = Ended::AlreadyGreen;
            run.recorded = true;
            runs.push(run);
            continue;
        }
        run_one(repo, &plan, gate, &mut run)?;
        if run.result == Ended::Passed && record_it {
            record_pass(sh, repo, &plan, gate, &head, &host, &tool, &mut run)?;
        }
        runs.push(run);
    }
    report(&head, &runs, args.json, record_it);
    finish(&head, &runs, record_it)
}

/// Runs one gate with live output; fills in result, duration and log.
fn run_one(repo: &Repo, plan: &Plan, gate: &Gate, run: &mut GateRun) -> Result<()> {
    let cwd = repo.root.join(&gate.cwd);
    eprintln!(
        "==> gate {}: {} (in {}, timeout {})",
        gate.name,
        gate.command.display(),
        gate.cwd,
        seconds(gate.timeout)
    );
    if !cwd.is_dir() {
        run.result = Ended::Failed(format!("its cwd {} is not a directory", cwd.display()));
        return Ok(());
    }
    let argv = gate.command.argv();
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).current_dir(&cwd).envs(&gate.env);
    let log = repo
        .state_dir()
        .join("gates")
        .join("logs")
        .join(format!("{}.log", gate.name));
    let limits = runner::Limits {
        timeout: gate.timeout,
        grace: plan.kill_grace,
    };
    let outcome = match runner::run(
        cmd,
        limits,
        runner::Output::Live {
            log: Some(log.clone()),
            tail: 64 * 1024,
        },
    ) {
        Ok(o) => o,
        Err(e) => {
            run.result = Ended::Failed(format!("{e:#}"));
            return Ok(());
        }
    };
    run.duration = Some(outcome.duration);
    run.log = Some(log);
    run.result = match outcome.end {
        runner::End::Exited(0) => Ended::Passed,
        runner::End::Exited(n) => Ended::Failed(format!("exit status {n}")),
        runner::End::Signaled(s) => Ended::Failed(format!("killed by {}", runner::signal_name(s))),
        runner::End::TimedOut => Ended::TimedOut,
        runner::End::Interrupted(s) => Ended::Interrupted(s),
    };
    if outcome.killed_leftovers {
        run.note = Some("it left processes running; they were terminated".into());
    }
    if run.bad() {
        let why = match &run.result {
            Ended::Failed(why) => why.clone(),
            Ended::TimedOut => format!(
                "timed out after {}; its process group was sent SIGTERM, then SIGKILL after {}",
                seconds(gate.timeout),
                seconds(plan.kill_grace)
            ),
            Ended::Interrupted(s) => format!("interrupted by {}", runner::signal_name(*s)),
            _ => String::new(),
        };
        eprintln!(
            "==> gate {} {}: {why}\n--- last {TAIL_LINES} lines of its output (full log: {})\n{}\n---",
            gate.name,
            run.label(),
            run.log
                .as_ref()
                .map_or(String::new(), |p| p.display().to_string()),
            runner::last_lines(&outcome.output, TAIL_LINES)
        );
    }
    Ok(())
}

/// Records a passed gate, if HEAD and the worktree are still what it ran on.
#[allow(clippy::too_many_arguments)]
fn record_pass(
    sh: &Shell,
    repo: &Repo,
    plan: &Plan,
    gate: &Gate,
    head: &Head,
    host: &str,
    tool: &str,
    run: &mut GateRun,
) -> Result<()> {
    let now = store::head(sh, &repo.root)?;
    let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
    if now.tree != head.tree {
        run.note = Some(format!(
            "not recorded: HEAD moved to tree {} while it ran",
            now.tree
        ));
        return Ok(());
    }
    if !dirty.is_empty() {
        run.note = Some(format!(
            "not recorded: while it ran, {}",
            dirty_reason(&dirty)
        ));
        return Ok(());
    }
    let entry = Entry {
        digest: gate.digest.clone(),
        command: gate.command.display(),
        cwd: gate.cwd.clone(),
        duration_ms: run.duration.unwrap_or_default().as_millis() as u64,
        host: host.to_string(),
        tool: tool.to_string(),
        finished_at: record::rfc3339(SystemTime::now()),
        commit: head.commit.clone(),
        extra: Default::default(),
    };
    store::update(sh, &repo.root, &head.tree, |old| {
        let mut r = old.unwrap_or_else(|| Record::new(&head.tree));
        r.insert(&gate.name, entry.clone());
        r
    })?;
    run.recorded = true;
    Ok(())
}

fn report(head: &Head, runs: &[GateRun], json: bool, record_it: bool) {
    if json {
        let gates: Vec<Value> = runs
            .iter()
            .map(|r| {
                json!({
                    "name": r.name,
                    "result": r.label(),
                    "duration_ms": r.duration.map(|d| d.as_millis() as u64),
                    "recorded": r.recorded,
                    "reason": match &r.result { Ended::Failed(w) => Some(w.clone()), _ => None },
                    "note": r.note,
                    "log": r.log,
                })
            })
            .collect();
        print_json(&json!({
            "tree": head.tree,
            "head": head.commit,
            // Where the greens went; null with --no-record.
            "ref": record_it.then(|| store::ref_name(&head.tree)),
            "gates": gates,
        }));
        return;
    }
    let mut rows = vec![
        ["GATE", "RESULT", "TIME", "RECORDED", "NOTE"]
            .map(String::from)
            .to_vec(),
    ];
    for r in runs {
        let note = match (&r.result, &r.note) {
            (Ended::Failed(w), Some(n)) => format!("{w}; {n}"),
            (Ended::Failed(w), None) => w.clone(),
            (_, Some(n)) => n.clone(),
            (_, None) => String::new(),
        };
        rows.push(vec![
            r.name.clone(),
            r.label().into(),
            r.duration.map(seconds).unwrap_or_else(|| "-".into()),
            if r.recorded { "yes" } else { "no" }.into(),
            note,
        ]);
    }
    println!();
    print!("{}", table(&rows));
    if record_it {
        println!(
            "tree {} (HEAD {}), record {}",
            head.tree,
            short(&head.commit),
            store::ref_name(&head.tree)
        );
    } else {
        println!("--no-record: nothing was recorded");
    }
}

/// The run's exit: 11 if a gate failed, timed out or was interrupted; 9 if a
/// gate passed but could not be recorded; else success.
fn finish(head: &Head, runs: &[GateRun], record_it: bool) -> Result<()> {
    let bad: Vec<String> = runs
        .iter()
        .filter(|r| r.bad())
        .map(|r| format!("{} ({})", r.name, r.label()))
        .collect();
    if !bad.is_empty() {
        return Err(fail(
            Code::StepFailed,
            format!(
                "gates failed for tree {}: {}; their output is above",
                head.tree,
                bad.join(", ")
            ),
        ));
    }
    let unrecorded: Vec<&str> = runs
        .iter()
        .filter(|r| record_it && r.result == Ended::Passed && !r.recorded)
        .map(|r| r.name.as_str())
        .collect();
    if !unrecorded.is_empty() {
        return Err(fail(
            Code::NotGreen,
            format!(
                "gates passed but were not recorded for tree {}: {} (the worktree or HEAD changed while they ran); run them again on a clean worktree",
                head.tree,
                unrecorded.join(", ")
            ),
        ));
    }
    Ok(())
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// `0.4s`, `12.0s`, `3m05s`.
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    }
}

/// Left-aligned columns, two spaces apart; trailing blanks trimmed.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            line.push_str(cell);
            line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let rows = vec![
            vec!["GATE".to_string(), "RESULT".to_string()],
            vec!["fmt".to_string(), "passed".to_string(), "x".to_string()],
        ];
        assert_eq!(table(&rows), "GATE  RESULT\nfmt   passed  x\n");
    }

    #[test]
    fn seconds_formats() {
        assert_eq!(seconds(Duration::from_millis(400)), "0.4s");
        assert_eq!(seconds(Duration::from_secs(185)), "3m05s");
    }

    #[test]
    fn dirty_reason_names_a_few_paths() {
        let many: Vec<String> = (0..7).map(|i| format!("?? f{i}")).collect();
        let r = dirty_reason(&many);
        assert!(
            r.starts_with("the worktree is dirty (?? f0, ?? f1, ?? f2, ?? f3, ?? f4 and 2 more)"),
            "{r}"
        );
        assert!(r.contains("`ignore` in cache-manifests/gates.toml"), "{r}");
    }
}
