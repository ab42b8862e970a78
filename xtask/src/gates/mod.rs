//! Gates: named commands whose success on a tree is recorded, so that a cache
//! is only published from a tree that passed them.
//!
//! `manifest` parses `cache-manifests/gates.toml` into a plan, `record` is the
//! JSON record format, `store` keeps records in git refs and moves them between
//! clones, `own` keeps this clone's own runs, `evidence` is the rule of which
//! entries count, `run` is `gates run`. This file holds the other commands
//! and [`require_green`], the check `cache publish` calls.
//!
//! Must never: record a gate that did not pass, record for a dirty worktree
//! or for a tree other than the one the gate ran on, count an entry whose
//! command digest differs from the gate's current definition as green, count
//! an untrusted entry under `signed_gates`, or leave a gate's processes
//! running after it ends.

pub mod evidence;
pub mod manifest;
pub mod own;
pub mod record;
mod run;
pub mod store;

use anyhow::Result;
use serde_json::{Value, json};
use std::time::Duration;
use xshell::Shell;

use crate::cli::gates::{CheckArgs, FetchFirst, GatesArgs, GatesCommand, RemoteArgs, StatusArgs};
use crate::exit::{Code, fail};
use crate::repo::Repo;
use crate::trust::gatesig::Judge;
use evidence::{Rule, Standing, Use};
use manifest::Plan;
use record::{Record, State};
use store::Head;

pub fn run(sh: &Shell, args: GatesArgs) -> Result<()> {
    match &args.command {
        GatesCommand::Run(_) => {}
        GatesCommand::Status(a) => a.fetch.network.apply()?,
        GatesCommand::Check(a) => a.fetch.network.apply()?,
        GatesCommand::Fetch(a) | GatesCommand::Push(a) => a.network.apply()?,
    }
    let repo = Repo::from_cwd()?;
    match args.command {
        GatesCommand::Run(a) => run::run_gates(sh, &repo, a),
        GatesCommand::Status(a) => status(sh, &repo, a),
        GatesCommand::Check(a) => check(sh, &repo, a),
        GatesCommand::Fetch(a) => fetch(sh, &repo, a),
        GatesCommand::Push(a) => push(sh, &repo, a),
    }
}

/// The green record covering every `required` gate for HEAD's tree on a clean
/// worktree, as JSON to embed in a cache branch's warmstart.json (the
/// entries that count, `evidence`). With `required` empty: `Value::Null`.
/// `signed` says why only signed entries count for this caller (e.g. a cache
/// manifest's `[trust] signed_gates`); trust.toml's `signed_gates` asks it
/// of every caller.
///
/// Errors: exit 9 (`Code::NotGreen`) when the worktree is dirty or a gate is
/// missing or stale, naming them and the command that makes them green; exit
/// 12 when only signed entries count and a gate's is not trusted; exit 10
/// when gates.toml is missing, invalid, or does not define a required gate;
/// exit 5 when the stored record is unreadable. Local only: call
/// [`fetch_record`] first to take records pushed from other machines.
pub fn require_green(
    sh: &Shell,
    repo: &Repo,
    required: &[String],
    signed: Option<String>,
) -> Result<Value> {
    if required.is_empty() {
        return Ok(Value::Null);
    }
    let plan = manifest::load(&repo.root)?;
    verdict(sh, repo, &plan, required, signed)?.require()
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
    /// Each asked gate's standing for a publish, in the order asked.
    states: Vec<(String, Standing)>,
    /// Why only signed entries count, when they do.
    signed: Option<String>,
    judge: Judge,
}

fn verdict(
    sh: &Shell,
    repo: &Repo,
    plan: &Plan,
    names: &[String],
    signed: Option<String>,
) -> Result<Verdict> {
    let gates = plan.select(names)?;
    let head = store::head(sh, &repo.root)?;
    let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
    let record = store::read_valid(sh, &repo.root, &head.tree)?;
    let own = own::read(repo, &head.tree)?;
    let mut judge = Judge::new(sh, repo)?;
    let signed = signed.or_else(|| {
        judge.root.signed_gates.then(|| {
            format!(
                "{} sets signed_gates = true",
                crate::trust::policy::TRUST_FILE
            )
        })
    });
    let rule = if signed.is_some() {
        Rule::Signed
    } else {
        Rule::Open
    };
    let mut states = Vec::new();
    for g in gates {
        let s = evidence::standing(
            sh,
            &mut judge,
            rule,
            Use::Publish,
            &head.tree,
            g,
            record.as_ref(),
            &own,
        )?;
        states.push((g.name.clone(), s));
    }
    Ok(Verdict {
        head,
        dirty,
        record,
        states,
        signed,
        judge,
    })
}

impl Verdict {
    /// The asked gates with no entry of their current definition.
    fn missing(&self) -> Vec<String> {
        self.states
            .iter()
            .filter(|(_, s)| matches!(s, Standing::Missing | Standing::Stale))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// The record restricted to the asked gates, if green; else the exit-9
    /// (or, for an entry that does not count, exit-12) error.
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
                    "gates not green for tree {tree}: missing {}; run `{cmd} gates run {}`",
                    missing.join(", "),
                    missing.join(" "),
                    cmd = crate::invocation::command(),
                ),
            ));
        }
        // No gates asked (an empty gates.toml): green, with an empty record.
        let mut record = self
            .record
            .clone()
            .unwrap_or_else(|| Record::new(tree))
            .only(&[]);
        for (name, state) in &self.states {
            match state {
                Standing::Counts(e) => record.insert(name, (**e).clone()),
                Standing::NotEvidence(why) => {
                    let seen = match why {
                        evidence::Refused::Signature(s) => s.seen(),
                        evidence::Refused::NotOwn => None,
                    };
                    let e = self.judge.refusal(tree, name, &why.why(), seen);
                    return Err(match &self.signed {
                        Some(because) => e.context(because.clone()),
                        None => e,
                    });
                }
                Standing::Missing | Standing::Stale => unreachable!("refused above"),
            }
        }
        Ok(serde_json::to_value(record)?)
    }
}

/// Why a dirty worktree cannot be green, naming a few paths and the ways out.
pub(crate) fn dirty_reason(dirty: &[String]) -> String {
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
        && let Err(e) = fetch_record(sh, repo, remote, opt.timeout)
    {
        eprintln!(
            "warning: {}; using the records already in this clone",
            crate::redact::text(&format!("{e:#}"))
        );
    }
}

/// The command's `--json` document (`crate::contract`, which also
/// redacts a remote URL quoted in records).
pub(crate) fn print_json(value: &Value) {
    crate::contract::document(value);
}

/// `{name, url}` of a remote given by name or URL (the URL alone when git
/// cannot say more).
fn remote_json(sh: &Shell, repo: &Repo, remote: &str) -> crate::contract::Remote {
    crate::git::resolve_remote(sh, &repo.root, remote)
        .map(|r| crate::contract::Remote::of(&r))
        .unwrap_or_else(|_| crate::contract::Remote::from_shown(remote))
}

fn check(sh: &Shell, repo: &Repo, args: CheckArgs) -> Result<()> {
    let plan = manifest::load(&repo.root)?;
    let names = if args.names.is_empty() {
        plan.names()
    } else {
        args.names
    };
    fetch_first(sh, repo, &args.fetch);
    let signed = args.require_signed.then(|| "--require-signed".to_string());
    let v = verdict(sh, repo, &plan, &names, signed)?;
    let result = v.require();
    if args.json {
        let doc = json!({
            "green": result.is_ok(),
            "tree": v.head.tree,
            "head": v.head.commit,
            "dirty": v.dirty,
            "missing": v.missing(),
            "record": result.as_ref().ok(),
        });
        return crate::contract::finish(doc, result.map(|_| ()));
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
    let v = Status::of(sh, repo, &plan)?;
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
    // The table shows the record as stored; which entries count is `check`'s.
    if crate::trust::policy::load_root(sh, repo).is_ok_and(|r| r.signed_gates) {
        println!(
            "{} sets signed_gates: an entry counts only when an allowed signer signed it; `{} gates check` says which do",
            crate::trust::policy::TRUST_FILE,
            crate::invocation::command()
        );
    }
    Ok(())
}

/// What `gates status` shows: the shared record's state of every gate, as
/// recorded (whether an entry would count is `gates check`'s question).
struct Status {
    head: Head,
    dirty: Vec<String>,
    record: Option<Record>,
    states: Vec<(String, State)>,
}

impl Status {
    fn of(sh: &Shell, repo: &Repo, plan: &Plan) -> Result<Status> {
        let head = store::head(sh, &repo.root)?;
        let dirty = store::dirty(sh, &repo.root, &plan.ignore)?;
        let record = store::read_valid(sh, &repo.root, &head.tree)?;
        let states = plan
            .gates
            .iter()
            .map(|g| {
                let state = record
                    .as_ref()
                    .map_or(State::Missing, |r| r.state(&g.name, &g.digest));
                (g.name.clone(), state)
            })
            .collect();
        Ok(Status {
            head,
            dirty,
            record,
            states,
        })
    }

    fn green(&self) -> bool {
        self.dirty.is_empty() && self.states.iter().all(|(_, s)| *s == State::Green)
    }
}

fn fetch(sh: &Shell, repo: &Repo, args: RemoteArgs) -> Result<()> {
    let head = store::head(sh, &repo.root)?;
    let fetched = store::fetch(sh, &repo.root, &args.remote, &head.tree, args.timeout)?;
    let record = store::read_valid(sh, &repo.root, &head.tree)?;
    let gates: Vec<&String> = record.iter().flat_map(|r| r.gates.keys()).collect();
    // A remote given as a URL is shown without its userinfo.
    let remote = crate::redact::url(&args.remote);
    if args.json {
        print_json(&json!({
            "remote": remote_json(sh, repo, &args.remote),
            "tree": head.tree,
            "result": fetched.as_str(),
            "gates": gates,
        }));
    } else if fetched == store::Fetched::NoneThere {
        println!("`{}` has no gate record for tree {}", remote, head.tree);
    } else {
        println!(
            "fetched the gate record for tree {} from `{}` ({}); green here now: {}",
            head.tree,
            remote,
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
    let remote = crate::redact::url(&args.remote);
    if args.json {
        print_json(&json!({
            "remote": remote_json(sh, repo, &args.remote),
            "tree": head.tree,
            "ref": store::ref_name(&head.tree),
            "result": pushed.as_str(),
            "gates": gates,
        }));
    } else {
        println!(
            "gate record for tree {} on `{}`: {} ({})",
            head.tree,
            remote,
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

pub(crate) fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A duration for people: `clock::human` (`0.4s` reads `400ms`).
pub(crate) fn seconds(d: Duration) -> String {
    crate::clock::human(d)
}

/// Left-aligned columns, two spaces apart; trailing blanks trimmed.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
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
        assert_eq!(seconds(Duration::from_millis(400)), "400ms");
        assert_eq!(seconds(Duration::from_secs(185)), "3m");
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
