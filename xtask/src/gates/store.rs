//! Where green records live: one git ref per tree, shared with `git push`/`git fetch`.
//!
//! Storage choice: the record for tree T is the file `gates.json` in a small
//! commit that `refs/warmstart/gates/<T>` points to. Why not git notes:
//! notes attach to one notes ref for the whole repository, so two machines
//! that record gates for different trees conflict on every push and need
//! `git notes merge`; a ref per tree never conflicts across trees, fetching
//! one tree's record transfers three tiny objects whatever the history, and
//! refs are what every hosting server and CI checkout already moves. The
//! record commit's tree holds only `gates.json`, so it never pins or
//! transfers the source tree it speaks about. Each update is a new commit
//! whose parent is the previous record, and records that diverged (two
//! machines, same tree) are merged into a commit with both parents, so
//! pushes are always fast-forwards and nothing is ever force-pushed.
//!
//! This module runs git (through xshell, or the runner for network calls
//! that need a deadline) and never runs a gate.

use anyhow::{Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use xshell::{Shell, cmd};

use super::record::{ParseError, Record};
use crate::exit::{Code, fail};
use crate::process::runner;

/// The namespace of local (and pushed) records.
pub const REF_PREFIX: &str = "refs/warmstart/gates/";
/// Where a fetch lands before it is merged into the local record.
const FETCH_PREFIX: &str = "refs/warmstart/gates-fetch/";
/// The file holding the record inside a record commit.
const FILE: &str = "gates.json";
/// How often an update retries when another writer moved the ref meanwhile.
const ATTEMPTS: usize = 5;

/// The ref holding the record of `tree`.
pub fn ref_name(tree: &str) -> String {
    format!("{REF_PREFIX}{tree}")
}

/// HEAD's commit and tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub commit: String,
    pub tree: String,
}

pub fn head(sh: &Shell, root: &Path) -> Result<Head> {
    let (commit, tree) = ("HEAD^{commit}", "HEAD^{tree}");
    let out = cmd!(sh, "git -C {root} rev-parse {commit} {tree}")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("running git in {}", root.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines();
    match (out.status.success(), lines.next(), lines.next()) {
        (true, Some(commit), Some(tree)) => Ok(Head {
            commit: commit.to_string(),
            tree: tree.to_string(),
        }),
        _ => Err(fail(
            Code::NotFound,
            format!(
                "HEAD of {} has no commit yet: commit first, gates are recorded for a commit's tree",
                root.display()
            ),
        )),
    }
}

/// What makes the worktree differ from HEAD: `git status` lines (`M a.rs`,
/// `?? new.txt`), untracked files included, ignored files and the `ignore`
/// pathspecs of gates.toml excluded.
pub fn dirty(sh: &Shell, root: &Path, ignore: &[String]) -> Result<Vec<String>> {
    let excludes: Vec<String> = ignore
        .iter()
        .map(|p| format!(":(exclude,glob){p}"))
        .collect();
    let out = cmd!(
        sh,
        "git -C {root} status --porcelain=v1 -z --untracked-files=all --ignore-submodules=none -- . {excludes...}"
    )
    .quiet()
    .read()
    .with_context(|| format!("reading the worktree status of {}", root.display()))?;
    let mut paths = Vec::new();
    let mut fields = out.split('\0').filter(|f| !f.is_empty());
    while let Some(entry) = fields.next() {
        // A rename or copy (in either column) is followed by its source path.
        let xy = entry.get(..2).unwrap_or_default();
        if xy.contains('R') || xy.contains('C') {
            fields.next();
        }
        paths.push(entry.trim_start().to_string());
    }
    Ok(paths)
}

/// A stored record, or why it could not be read.
pub struct Stored {
    /// The record commit the ref points to.
    pub commit: String,
    pub record: std::result::Result<Record, ParseError>,
}

fn resolve(sh: &Shell, root: &Path, refname: &str) -> Result<Option<String>> {
    let spec = format!("{refname}^{{commit}}");
    let out = cmd!(sh, "git -C {root} rev-parse --verify -q {spec}")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("resolving {refname}"))?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

fn read_at(sh: &Shell, root: &Path, refname: &str, tree: &str) -> Result<Option<Stored>> {
    let Some(commit) = resolve(sh, root, refname)? else {
        return Ok(None);
    };
    let spec = format!("{commit}:{FILE}");
    let out = cmd!(sh, "git -C {root} cat-file blob {spec}")
        .quiet()
        .ignore_status()
        .output()
        .with_context(|| format!("reading {refname}"))?;
    let record = if out.status.success() {
        Record::parse(&out.stdout, tree)
    } else {
        Err(ParseError::Json(format!("commit {commit} has no {FILE}")))
    };
    Ok(Some(Stored { commit, record }))
}

/// The error for a local record that cannot be trusted, with the way out.
pub fn corrupt(refname: &str, e: &ParseError) -> anyhow::Error {
    fail(
        Code::Corrupt,
        format!(
            "gate record {refname} is unreadable: {e}; it was left as is: run the gates again to write a new record over it, or delete it with `git update-ref -d {refname}`"
        ),
    )
}

/// The error for a remote record that cannot be trusted; the local one is untouched.
fn corrupt_remote(remote: &str, refname: &str, e: &ParseError) -> anyhow::Error {
    // A remote given as a URL is shown without its userinfo.
    let remote = crate::redact::url(remote);
    fail(
        Code::Corrupt,
        format!(
            "gate record {refname} on `{remote}` is unreadable: {e}; the local record was left as is: delete the remote one with `git push {remote} :{refname}`, then push a good one with `{cmd} gates push {remote}`",
            cmd = crate::invocation::command(),
        ),
    )
}

/// The local record of `tree`, if any.
pub fn read(sh: &Shell, root: &Path, tree: &str) -> Result<Option<Stored>> {
    read_at(sh, root, &ref_name(tree), tree)
}

/// Like `read`, but an unreadable record is an error (exit 5).
pub fn read_valid(sh: &Shell, root: &Path, tree: &str) -> Result<Option<Record>> {
    match read(sh, root, tree)? {
        None => Ok(None),
        Some(Stored { record: Ok(r), .. }) => Ok(Some(r)),
        Some(Stored { record: Err(e), .. }) => Err(corrupt(&ref_name(tree), &e)),
    }
}

/// Writes `record` as a commit with `parents`; returns its id.
fn write_commit(sh: &Shell, root: &Path, record: &Record, parents: &[&str]) -> Result<String> {
    let what = || format!("writing the gate record of tree {}", record.tree);
    let blob = cmd!(sh, "git -C {root} hash-object -w --stdin")
        .stdin(record.to_bytes())
        .quiet()
        .read()
        .with_context(what)?;
    let listing = format!("100644 blob {blob}\t{FILE}\n");
    let tree = cmd!(sh, "git -C {root} mktree")
        .stdin(listing)
        .quiet()
        .read()
        .with_context(what)?;
    let parent_args: Vec<String> = parents
        .iter()
        .flat_map(|p| ["-p".into(), p.to_string()])
        .collect();
    let gates: Vec<&str> = record.gates.keys().map(String::as_str).collect();
    let message = format!(
        "warmstart gates for tree {}: {}",
        record.tree,
        if gates.is_empty() {
            "none".to_string()
        } else {
            gates.join(", ")
        }
    );
    // A fixed identity: the record must be writable on a CI machine with no
    // user.name, and who ran a gate is in the record (host), not the commit.
    cmd!(
        sh,
        "git -C {root} commit-tree {tree} {parent_args...} -m {message}"
    )
    .env("GIT_AUTHOR_NAME", "warmstart gates")
    .env("GIT_AUTHOR_EMAIL", "gates@warmstart.invalid")
    .env("GIT_COMMITTER_NAME", "warmstart gates")
    .env("GIT_COMMITTER_EMAIL", "gates@warmstart.invalid")
    .quiet()
    .read()
    .with_context(what)
}

/// Moves `refname` to `new` only if it still is `old` (None: must not exist).
/// Returns false when another writer got there first.
fn swap_ref(sh: &Shell, root: &Path, refname: &str, new: &str, old: Option<&str>) -> Result<bool> {
    let line = match old {
        Some(old) => format!("update {refname} {new} {old}\n"),
        None => format!("create {refname} {new}\n"),
    };
    let out = cmd!(sh, "git -C {root} update-ref --stdin")
        .stdin(line)
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .output()
        .with_context(|| format!("updating {refname}"))?;
    Ok(out.status.success())
}

/// Changes the local record of `tree` with `change` (given the current record,
/// or None), as a new commit on top of the current one. Safe against
/// concurrent writers: the ref moves only if nobody else moved it meanwhile,
/// else the change is applied again to their record. An unreadable record is
/// kept as the parent of the new one (so nothing is lost) with a warning.
pub fn update(
    sh: &Shell,
    root: &Path,
    tree: &str,
    mut change: impl FnMut(Option<Record>) -> Record,
) -> Result<Record> {
    let refname = ref_name(tree);
    for _ in 0..ATTEMPTS {
        let current = read(sh, root, tree)?;
        let (old, base) = match current {
            None => (None, None),
            Some(Stored {
                commit,
                record: Ok(r),
            }) => (Some(commit), Some(r)),
            Some(Stored {
                commit,
                record: Err(e),
            }) => {
                eprintln!(
                    "warning: gate record {refname} is unreadable ({e}); writing a new one over it (the old one stays in its history, {commit})"
                );
                (Some(commit), None)
            }
        };
        let record = change(base);
        let parents: Vec<&str> = old.iter().map(String::as_str).collect();
        let new = write_commit(sh, root, &record, &parents)?;
        if swap_ref(sh, root, &refname, &new, old.as_deref())? {
            return Ok(record);
        }
    }
    Err(fail(
        Code::Busy,
        format!("{refname} kept changing under concurrent writers; nothing recorded, run again"),
    ))
}

/// What a fetch did to the local record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetched {
    /// The remote has no record for this tree.
    NoneThere,
    /// The local record already contained the remote's.
    UpToDate,
    /// The local record was absent or older: it now is the remote's.
    FastForward,
    /// Both had news: a merge commit with both as parents.
    Merged,
}

impl Fetched {
    pub fn as_str(self) -> &'static str {
        match self {
            Fetched::NoneThere => "none-on-remote",
            Fetched::UpToDate => "up-to-date",
            Fetched::FastForward => "fast-forward",
            Fetched::Merged => "merged",
        }
    }
}

/// The `--timeout` of a whole fetch or push: every git command of it, and
/// its retries, share one end.
#[derive(Clone, Copy, Debug)]
struct Deadline {
    end: std::time::Instant,
    limit: Duration,
}

impl Deadline {
    fn after(limit: Duration) -> Deadline {
        Deadline {
            end: std::time::Instant::now() + limit,
            limit,
        }
    }

    /// The time left, never zero (a child given no time would fail with
    /// a message less clear than the timeout's own).
    fn left(&self) -> Duration {
        self.end
            .saturating_duration_since(std::time::Instant::now())
            .max(Duration::from_millis(1))
    }
}

/// Runs a git command that talks to `remote`, bounded by what is left of
/// `deadline`, output captured. A non-zero exit is returned, not raised; a
/// timeout is exit 8.
fn network_git(
    root: &Path,
    options: &[&str],
    remote: &str,
    refspec: &str,
    deadline: Deadline,
    what: &str,
) -> Result<runner::Outcome> {
    let timeout = deadline.left();
    let mut cmd = Command::new("git");
    // --end-of-options: a remote named `-x` is a remote, never an option.
    cmd.arg("-C")
        .arg(root)
        .args(options)
        .args(["--end-of-options", remote, refspec]);
    // From here on `remote` is only shown: a URL loses its userinfo.
    let remote = crate::redact::url(remote);
    // Messages in English so the porcelain and errors parse; never prompt.
    cmd.env("LC_ALL", "C").env("GIT_TERMINAL_PROMPT", "0");
    let net = network_settings(root)?;
    let start = std::time::Instant::now();
    let ran = crate::net::run(&mut cmd, net, Some(timeout), None, &mut |_| {}, &mut |_| {})
        .with_context(|| format!("{what} `{remote}`"))?;
    let mut output = ran.stdout;
    output.extend_from_slice(&ran.stderr);
    let end = match ran.stopped {
        Some(crate::net::Verdict::Total(_)) => runner::End::TimedOut,
        Some(crate::net::Verdict::Interrupted(sig)) => runner::End::Interrupted(sig),
        Some(v) => return Err(v.error(what, &format!("`{remote}`"))),
        None => match std::os::unix::process::ExitStatusExt::signal(&ran.status) {
            Some(sig) => runner::End::Signaled(sig),
            None => runner::End::Exited(ran.status.code().unwrap_or(1)),
        },
    };
    let outcome = runner::Outcome {
        end,
        duration: start.elapsed(),
        output,
        killed_leftovers: false,
    };
    match outcome.end {
        runner::End::TimedOut => Err(fail(
            Code::Remote,
            format!(
                "{what} `{remote}` took longer than {} in all and was stopped: check the remote, or raise --timeout",
                crate::clock::human(deadline.limit)
            ),
        )),
        runner::End::Interrupted(sig) => Err(fail(
            Code::Remote,
            format!(
                "{what} `{remote}` was interrupted by {}",
                crate::process::signals::signal_name(sig)
            ),
        )),
        _ => Ok(outcome),
    }
}

fn remote_error(what: &str, remote: &str, outcome: &runner::Outcome) -> anyhow::Error {
    // A remote given as a URL is shown without its userinfo.
    let remote = crate::redact::url(remote);
    let text = String::from_utf8_lossy(&outcome.output);
    if crate::git::auth_refused(&text).is_some() {
        return crate::git::remote_failure(&format!("{what} `{remote}` failed"), &text);
    }
    let said = runner::last_lines(&outcome.output, 3).replace('\n', " | ");
    let shown = crate::redact::text(&format!("{what} `{remote}` failed: {said}"));
    fail(Code::Remote, shown)
}

/// The deadlines of record pushes and fetches: flags, environment, then
/// gates.toml's `[network]` table when there is a gates.toml.
fn network_settings(root: &Path) -> Result<crate::net::NetworkSettings> {
    let manifest = if root.join(super::manifest::PATH).is_file() {
        super::manifest::load(root)?.network
    } else {
        crate::net::ManifestNetwork::default()
    };
    crate::net::settings(&manifest)
}

fn is_ancestor(sh: &Shell, root: &Path, a: &str, b: &str) -> Result<bool> {
    let out = cmd!(sh, "git -C {root} merge-base --is-ancestor {a} {b}")
        .quiet()
        .ignore_status()
        .output()
        .context("comparing gate record histories")?;
    Ok(out.status.success())
}

/// The prefix of records on remotes, from gates.toml's `records` (no
/// gates.toml: the default). An invalid gates.toml is an error here too.
fn remote_prefix(root: &Path) -> Result<&'static str> {
    if !root.join(crate::gates::manifest::PATH).is_file() {
        return Ok(crate::gates::manifest::Records::default().remote_prefix());
    }
    Ok(crate::gates::manifest::load(root)?.records.remote_prefix())
}

/// The host's own lines (`remote: ...`, e.g. a hook's message) and git's
/// verdict, on one line.
fn host_said(outcome: &runner::Outcome) -> String {
    let text = String::from_utf8_lossy(&outcome.output);
    let lines = |keep: &dyn Fn(&str) -> bool| {
        text.lines()
            .map(str::trim)
            .filter(|l| keep(l))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let host = lines(&|l| l.starts_with("remote:") && l.len() > "remote:".len());
    if host.is_empty() {
        lines(&|l| l.contains("[remote rejected]"))
    } else {
        host
    }
}

/// What to do when a host refused to store a record at `dst`, if it did.
fn refused_hint(dst: &str, outcome: &runner::Outcome) -> Option<String> {
    let said = String::from_utf8_lossy(&outcome.output);
    crate::git::refusal_hint(dst, &said)?;
    Some(if dst.starts_with("refs/heads/") {
        format!(
            "the host's rules refuse {dst}: allow branches under refs/heads/warmstart-gates/ to be created and fast-forwarded, or set `records = \"refs\"` in {}",
            crate::gates::manifest::PATH
        )
    } else {
        format!(
            "this host may accept only branches and tags: set `records = \"branches\"` in {} (records then live under refs/heads/warmstart-gates/)",
            crate::gates::manifest::PATH
        )
    })
}

/// Fetches `remote`'s record for `tree` and merges it into the local one.
/// The local record is untouched when the remote's is unreadable.
pub fn fetch(
    sh: &Shell,
    root: &Path,
    remote: &str,
    tree: &str,
    timeout: Duration,
) -> Result<Fetched> {
    fetch_within(sh, root, remote, tree, Deadline::after(timeout))
}

fn fetch_within(
    sh: &Shell,
    root: &Path,
    remote: &str,
    tree: &str,
    deadline: Deadline,
) -> Result<Fetched> {
    let staging = format!("{FETCH_PREFIX}{tree}");
    // A glob refspec that can only match this tree's ref: unlike an exact
    // refspec, it succeeds (and fetches nothing) when the remote has no record.
    let refspec = format!("+{}{tree}*:{FETCH_PREFIX}{tree}*", remote_prefix(root)?);
    let what = "fetching gate records from";
    let outcome = network_git(
        root,
        &[
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-maintenance",
        ],
        remote,
        &refspec,
        deadline,
        what,
    )?;
    if !outcome.end.success() {
        return Err(remote_error(what, remote, &outcome));
    }
    let result = merge_fetched(sh, root, remote, tree, &staging);
    // The staging ref is only a landing place; drop it whatever happened.
    let _ = cmd!(sh, "git -C {root} update-ref -d {staging}")
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .output();
    result
}

fn merge_fetched(
    sh: &Shell,
    root: &Path,
    remote: &str,
    tree: &str,
    staging: &str,
) -> Result<Fetched> {
    let Some(theirs) = read_at(sh, root, staging, tree)? else {
        return Ok(Fetched::NoneThere);
    };
    let their_record = theirs
        .record
        .map_err(|e| corrupt_remote(remote, &ref_name(tree), &e))?;
    let refname = ref_name(tree);
    for _ in 0..ATTEMPTS {
        let Some(ours) = read(sh, root, tree)? else {
            if swap_ref(sh, root, &refname, &theirs.commit, None)? {
                return Ok(Fetched::FastForward);
            }
            continue;
        };
        if ours.commit == theirs.commit || is_ancestor(sh, root, &theirs.commit, &ours.commit)? {
            return Ok(Fetched::UpToDate);
        }
        if is_ancestor(sh, root, &ours.commit, &theirs.commit)? {
            if swap_ref(sh, root, &refname, &theirs.commit, Some(&ours.commit))? {
                return Ok(Fetched::FastForward);
            }
            continue;
        }
        // Diverged. An unreadable local record loses to a readable remote one
        // (it stays in the merge commit's history).
        let merged = match &ours.record {
            Ok(r) => r.merge(&their_record),
            Err(_) => their_record.clone(),
        };
        let new = write_commit(sh, root, &merged, &[&ours.commit, &theirs.commit])?;
        if swap_ref(sh, root, &refname, &new, Some(&ours.commit))? {
            return Ok(Fetched::Merged);
        }
    }
    Err(fail(
        Code::Busy,
        format!("{refname} kept changing under concurrent writers; run the fetch again"),
    ))
}

/// What a push did on the remote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushed {
    Created,
    Updated,
    UpToDate,
}

impl Pushed {
    pub fn as_str(self) -> &'static str {
        match self {
            Pushed::Created => "created",
            Pushed::Updated => "updated",
            Pushed::UpToDate => "up-to-date",
        }
    }
}

/// Pushes the local record of `tree` to `remote`, first merging the remote's
/// (so the push is a fast-forward); retries when someone pushed meanwhile.
/// Returns what happened and the record now on the remote.
pub fn push(
    sh: &Shell,
    root: &Path,
    remote: &str,
    tree: &str,
    timeout: Duration,
) -> Result<(Pushed, Record)> {
    let refname = ref_name(tree);
    let dst = format!("{}{tree}", remote_prefix(root)?);
    let refspec = format!("{refname}:{dst}");
    let what = "pushing the gate record to";
    let shown = crate::redact::url(remote);
    let deadline = Deadline::after(timeout);
    for _ in 0..3 {
        fetch_within(sh, root, remote, tree, deadline)?;
        let Some(record) = read_valid(sh, root, tree)? else {
            return Err(fail(
                Code::NotFound,
                format!(
                    "no gate record for tree {tree} here or on `{shown}`: run `{cmd} gates run` first",
                    cmd = crate::invocation::command(),
                ),
            ));
        };
        let outcome = network_git(
            root,
            &["push", "--porcelain", "--no-verify"],
            remote,
            &refspec,
            deadline,
            what,
        )?;
        // `--porcelain` prints `<flag>\t<from>:<to>\t<summary>` per ref.
        let text = String::from_utf8_lossy(&outcome.output).into_owned();
        let line = text.lines().find(|l| l.contains(&format!("\t{refspec}\t")));
        match (outcome.end.success(), line.and_then(|l| l.chars().next())) {
            (true, Some('*')) => return Ok((Pushed::Created, record)),
            (true, Some('=')) => return Ok((Pushed::UpToDate, record)),
            (true, _) => return Ok((Pushed::Updated, record)),
            // Someone pushed between our fetch and our push: merge again.
            (false, Some('!')) if line.is_some_and(|l| l.contains("[rejected]")) => continue,
            _ => {
                return Err(match refused_hint(&dst, &outcome) {
                    Some(hint) => fail(
                        Code::Remote,
                        crate::redact::text(&format!(
                            "{what} `{shown}` was refused (host said: {}): {hint}",
                            host_said(&outcome)
                        )),
                    ),
                    None => remote_error(what, remote, &outcome),
                });
            }
        }
    }
    Err(fail(
        Code::Busy,
        format!("{refname} on `{shown}` kept changing while pushing; run the push again"),
    ))
}
