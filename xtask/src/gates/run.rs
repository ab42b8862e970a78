//! `cargo xtask gates run`: run gates with live output, record each that
//! passes, then print the summary.
//!
//! A gate is recorded only if it exited 0 and HEAD's tree and the clean
//! worktree are the same after it as before; a failing, timed-out or
//! interrupted gate records nothing and its output tail is printed again.
//! `--skip-green` skips a gate only on an entry `evidence` counts for a skip.

use anyhow::Result;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;
use xshell::Shell;

use super::evidence::{self, Rule, Standing, Use};
use super::manifest::{self, Gate, Plan};
use super::record::{Entry, Record};
use super::store::{self, Head};
use super::{dirty_reason, seconds, short, table};
use crate::cli::gates::RunArgs;
use crate::exit::{Code, fail};
use crate::process::runner;
use crate::repo::Repo;
use crate::trust::gatesig::Judge;

/// Lines of a failed gate's output repeated after it, with the log's path.
const TAIL_LINES: usize = 30;

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

pub(super) fn run_gates(sh: &Shell, repo: &Repo, args: RunArgs) -> Result<()> {
    let plan = manifest::load(&repo.root)?;
    let gates = plan.select(&args.names)?;
    let head = store::head(sh, &repo.root)?;
    let record_it = !args.no_record;
    if record_it {
        refuse_dirty(sh, repo, &plan, &head)?;
    }
    let mut skips = if args.skip_green {
        Some(Skips::new(sh, repo, &head)?)
    } else {
        None
    };
    let host = host_name();
    let tool = format!("warmstart {}", env!("CARGO_PKG_VERSION"));
    // Found before any gate runs: a missing key must not waste a test run.
    let signing_key = (args.sign || args.signing_key.is_some())
        .then(|| crate::trust::gatesig::key_for_run(args.signing_key.as_deref()))
        .transpose()?;

    let mut runs: Vec<GateRun> = Vec::new();
    for gate in &gates {
        let stop = stop_reason(args.keep_going, &runs);
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
        if let Some(skips) = &mut skips {
            match skips.standing(sh, gate)? {
                Standing::Counts(_) => {
                    run.result = Ended::AlreadyGreen;
                    run.recorded = true;
                    runs.push(run);
                    continue;
                }
                Standing::NotEvidence(why) => {
                    run.note = Some(format!(
                        "not skipped: its record entry does not count, {}",
                        why.why()
                    ));
                }
                Standing::Missing | Standing::Stale => {}
            }
        }
        run_one(repo, &plan, gate, &mut run)?;
        if run.result == Ended::Passed && record_it {
            let who = (host.as_str(), tool.as_str(), signing_key.as_deref());
            record_pass(sh, repo, &plan, gate, &head, who, &mut run)?;
        }
        runs.push(run);
    }
    if args.json {
        let doc = json_report(&head, &runs, record_it);
        return crate::contract::finish(doc, finish(&head, &runs, record_it));
    }
    report(&head, &runs, record_it);
    finish(&head, &runs, record_it)
}

/// What `--skip-green` may skip on: the entries of HEAD's tree, shared and
/// this clone's own, judged by `evidence` (signed entries only, where
/// trust.toml sets `signed_gates`; else this clone's own only).
struct Skips {
    tree: String,
    record: Option<Record>,
    own: std::collections::BTreeMap<String, Entry>,
    judge: Judge,
    rule: Rule,
}

impl Skips {
    fn new(sh: &Shell, repo: &Repo, head: &Head) -> Result<Skips> {
        let judge = Judge::new(sh, repo)?;
        let rule = if judge.root.signed_gates {
            Rule::Signed
        } else {
            Rule::Open
        };
        Ok(Skips {
            tree: head.tree.clone(),
            record: store::read_valid(sh, &repo.root, &head.tree)?,
            own: super::own::read(repo, &head.tree)?,
            judge,
            rule,
        })
    }

    fn standing(&mut self, sh: &Shell, gate: &Gate) -> Result<Standing> {
        evidence::standing(
            sh,
            &mut self.judge,
            self.rule,
            Use::Skip,
            &self.tree,
            gate,
            self.record.as_ref(),
            &self.own,
        )
    }
}

/// A recorded run must test the tree HEAD names: a dirty worktree is refused.
fn refuse_dirty(sh: &Shell, repo: &Repo, plan: &Plan, head: &store::Head) -> Result<()> {
    let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
    if dirty.is_empty() {
        return Ok(());
    }
    Err(fail(
        Code::NotGreen,
        format!(
            "refusing to run gates for tree {}: {} (or run with --no-record to only test)",
            head.tree,
            dirty_reason(&dirty)
        ),
    ))
}

/// Why the next gate is not run (an interrupt, or an earlier failure
/// without `--keep-going`), or `None` to run it.
fn stop_reason(keep_going: bool, runs: &[GateRun]) -> Option<String> {
    if let Some(sig) = crate::process::signals::interrupted() {
        Some(format!(
            "warmstart was interrupted by {}",
            crate::process::signals::signal_name(sig)
        ))
    } else if !keep_going && runs.iter().any(GateRun::bad) {
        Some("an earlier gate failed".to_string())
    } else {
        None
    }
}

/// Runs one gate with live output; fills in result, duration and log.
fn run_one(repo: &Repo, plan: &Plan, gate: &Gate, run: &mut GateRun) -> Result<()> {
    let cwd = repo.root.join(&gate.cwd);
    if !crate::out::quiet() {
        eprintln!(
            "==> gate {}: {} (in {}, timeout {})",
            gate.name,
            gate.command.display(),
            gate.cwd,
            seconds(gate.timeout)
        );
    }
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
        runner::End::Signaled(s) => Ended::Failed(format!(
            "killed by {}",
            crate::process::signals::signal_name(s)
        )),
        runner::End::TimedOut => Ended::TimedOut,
        runner::End::Interrupted(s) => Ended::Interrupted(s),
    };
    if outcome.killed_leftovers {
        run.note = Some("it left processes running; they were terminated".into());
    }
    if run.bad() {
        print_failure(plan, gate, run, &outcome.output);
    }
    Ok(())
}

/// Says on stderr why a gate failed, with the last lines of its output.
fn print_failure(plan: &Plan, gate: &Gate, run: &GateRun, output: &[u8]) {
    let why = match &run.result {
        Ended::Failed(why) => why.clone(),
        Ended::TimedOut => format!(
            "timed out after {}; its process group was sent SIGTERM, then SIGKILL after {}",
            seconds(gate.timeout),
            seconds(plan.kill_grace)
        ),
        Ended::Interrupted(s) => format!(
            "interrupted by {}",
            crate::process::signals::signal_name(*s)
        ),
        _ => String::new(),
    };
    eprintln!(
        "==> gate {} {}: {why}\n--- last {TAIL_LINES} lines of its output (full log: {})\n{}\n---",
        gate.name,
        run.label(),
        run.log
            .as_ref()
            .map_or(String::new(), |p| p.display().to_string()),
        runner::last_lines(output, TAIL_LINES)
    );
}

/// Records a passed gate, if HEAD and the worktree are still what it ran
/// on; `(host, tool, signing key)` say who ran it and who signs the entry.
fn record_pass(
    sh: &Shell,
    repo: &Repo,
    plan: &Plan,
    gate: &Gate,
    head: &Head,
    (host, tool, signing_key): (&str, &str, Option<&std::path::Path>),
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
        finished_at: crate::clock::rfc3339(crate::clock::now_ms()),
        commit: head.commit.clone(),
        extra: Default::default(),
    };
    let mut entry = entry;
    if let Some(key) = signing_key {
        crate::trust::gatesig::sign_entry(sh, key, &head.tree, &gate.name, &mut entry)?;
    }
    store::update(sh, &repo.root, &head.tree, |old| {
        let mut r = old.unwrap_or_else(|| Record::new(&head.tree));
        r.insert(&gate.name, entry.clone());
        r
    })?;
    // Kept apart from the shared record, which a fetch may merge over.
    super::own::keep(repo, &head.tree, &gate.name, &entry)?;
    run.recorded = true;
    Ok(())
}

/// The `--json` summary of a run (success document or failure details).
fn json_report(head: &Head, runs: &[GateRun], record_it: bool) -> Value {
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
    json!({
        "tree": head.tree,
        "head": head.commit,
        // Where the greens went; null with --no-record.
        "ref": record_it.then(|| store::ref_name(&head.tree)),
        "gates": gates,
    })
}

fn report(head: &Head, runs: &[GateRun], record_it: bool) {
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
