//! `cargo xtask cache list` and `cache status`: what caches exist, how each
//! key is built, what is installed here, what the branch holds, and on a miss
//! which part of the key differs.
//!
//! Local state comes from the stamps (no hashing); branch state from a
//! chunk-less fetch into cache-meta.git (`CacheGit::open_meta`), so listing
//! never downloads an artifact. With `--offline` nothing touches the network.
//! Architecture: these commands never write outside the state directory and
//! never change an install.

use anyhow::Result;
use serde::Serialize;
use std::path::PathBuf;
use xshell::Shell;

use crate::cache::format::manifest::{self, CacheManifest};
use crate::cache::format::{BranchManifest, KeyPart};
use crate::cache::manifests;
use crate::cache::restore;
use crate::cache::restore::branch::{Branch, Content};
use crate::cache::restore::stamp::{self, Loaded, PartChange};
use crate::cli::cache::ListArgs;
use crate::exit::{Code, code_of, fail};
use crate::git::{CacheGit, RefProbe, Remote as GitRemote};
use crate::repo::Repo;

/// One pin whose value differs between what is wanted here and a branch key.
/// `wanted` and `used` are the one shape of `differs` everywhere (restore's
/// `partial.differs` has them too); `branch` and `current` are kept beside
/// them for scripts that read them (docs/reference/json.md, versioning).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BranchPartChange {
    pub name: String,
    /// The value in the branch's key (`None`: that key has no such pin).
    pub branch: Option<String>,
    /// The value this machine computes.
    pub current: Option<String>,
    /// = `current`: the value this machine wants.
    pub wanted: Option<String>,
    /// = `branch`: the value of the branch key a restore would have to use.
    pub used: Option<String>,
}

impl BranchPartChange {
    pub fn new(name: String, branch: Option<String>, current: Option<String>) -> Self {
        BranchPartChange {
            name,
            wanted: current.clone(),
            used: branch.clone(),
            branch,
            current,
        }
    }
}

/// What is installed here.
#[derive(Debug, Serialize)]
pub struct Local {
    /// `installed` (current key, ready), `stale` (another key or target),
    /// `not ready` (stamp matches, ready-probe fails), `not installed`,
    /// `corrupt stamp`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub installed_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// Why the install is not current, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// On a key miss: each pin that moved since the install.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub changed_parts: Vec<PartChange>,
}

/// One key the branch holds.
#[derive(Debug, Serialize)]
pub struct BranchKey {
    pub key: String,
    pub created_at: String,
    #[serde(rename = "tar_bytes")]
    pub tar_size: u64,
    #[serde(rename = "chunk_count")]
    pub chunks: usize,
    pub parts: Vec<KeyPart>,
    /// Signer and verdict (always checked, whatever the policy).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trust: Option<crate::trust::KeyTrust>,
}

/// What the branch holds.
#[derive(Debug, Serialize)]
pub struct Remote {
    /// `has key`, `key missing`, `legacy` (one archive, no keys), `no
    /// branch`, `unreachable`, `damaged`.
    pub state: String,
    #[serde(rename = "remote", serialize_with = "crate::contract::shown_remote")]
    pub source: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    pub keys: Vec<BranchKey>,
    /// On a miss: the branch key closest to ours, and the pins that differ.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nearest: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub differs: Vec<BranchPartChange>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The policy restores apply to this cache (`require`, `warn`, `off`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<&'static str>,
}

/// The state of one cache.
#[derive(Debug, Serialize)]
pub struct CacheStatus {
    pub name: String,
    pub description: String,
    pub branch: String,
    pub target: PathBuf,
    pub mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    pub key_parts: Vec<KeyPart>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key_error: Option<String>,
    pub local: Local,
    /// `None` with `--offline`. `remote_state` in `--json`, since a
    /// `remote` there is always `{name, url}`.
    #[serde(rename = "remote_state")]
    pub remote: Option<Remote>,
}

/// One listed cache: its state, or why its manifest could not be read.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Entry {
    Cache(Box<CacheStatus>),
    Broken { name: String, error: String },
}

/// `cargo xtask cache list`.
pub fn list(sh: &Shell, args: ListArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let (all, err) = collect(sh, &repo, &args.names, args.offline)?;
    if !args.out.json && !args.out.quiet() {
        if all.is_empty() {
            println!(
                "no caches: add a manifest to {}",
                repo.manifests_dir().display()
            );
        }
        for e in &all {
            let c = match e {
                Entry::Cache(c) => c,
                Entry::Broken { name, error } => {
                    println!("{name:<20} cannot read its manifest: {error}");
                    continue;
                }
            };
            let remote = match &c.remote {
                None => "(offline)".to_string(),
                Some(r) => r.state.clone(),
            };
            println!(
                "{:<20} {:<24} {:<14} branch: {:<12} key: {}",
                c.name,
                c.branch,
                c.local.state,
                remote,
                c.key.as_deref().unwrap_or("(cannot compute)")
            );
            if let Some(r) = &c.remote {
                for k in &r.keys {
                    println!("{:<20}   {}", "", trust_words(k, r.policy));
                }
            }
        }
    }
    crate::contract::finish(
        serde_json::json!({ "caches": all }),
        err.map_or(Ok(()), Err),
    )
}

/// `art-1: signed by ci (SHA256:..): trusted`, and what `require` does.
fn trust_words(k: &BranchKey, policy: Option<&'static str>) -> String {
    let Some(t) = &k.trust else {
        return format!("{}: trust not checked", k.key);
    };
    let signer = t
        .signer
        .as_deref()
        .map(|s| format!("signed by {s}"))
        .unwrap_or_else(|| "no signature".into());
    let mut line = format!("{}: {signer}: {}", k.key, t.verdict);
    if let Some(why) = &t.reason {
        line.push_str(&format!(" ({why})"));
    }
    if !t.trusted() {
        line.push_str(match policy {
            Some("require") => "; refused by policy require",
            Some("warn") => "; restored with a warning (policy warn); require would refuse it",
            _ => "; policy off restores it; require would refuse it",
        });
    }
    line
}

/// `cargo xtask cache status`.
pub fn status(sh: &Shell, args: ListArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let (all, err) = collect(sh, &repo, &args.names, args.offline)?;
    if !args.out.json && !args.out.quiet() {
        for e in &all {
            match e {
                Entry::Cache(c) => print_status(c),
                Entry::Broken { name, error } => {
                    println!("cache {name}\n  cannot read its manifest: {error}")
                }
            }
        }
    }
    crate::contract::finish(
        serde_json::json!({ "caches": all }),
        err.map_or(Ok(()), Err),
    )
}

fn print_status(c: &CacheStatus) {
    if c.description.is_empty() {
        println!("cache {}", c.name);
    } else {
        println!("cache {} ({})", c.name, c.description);
    }
    println!(
        "  restores into {} ({} mode) from branch {}",
        c.target.display(),
        c.mode,
        c.branch
    );
    match (&c.key, &c.key_error) {
        (Some(k), _) => {
            println!("  key {k}");
            for p in &c.key_parts {
                println!("    {} = {}", p.name, p.value);
            }
        }
        (None, Some(e)) => println!("  key cannot be computed: {e}"),
        (None, None) => {}
    }
    let l = &c.local;
    match &l.installed_key {
        Some(k) => println!(
            "  here: {} ({k}, restored {} from commit {})",
            l.state,
            l.restored_at.as_deref().unwrap_or("?"),
            l.commit.as_deref().map_or("?", |c| &c[..c.len().min(12)])
        ),
        None => println!("  here: {}", l.state),
    }
    if let Some(why) = &l.why {
        println!("    {why}");
    }
    match &c.remote {
        None => println!("  branch: not checked (--offline)"),
        Some(r) => print_remote(r),
    }
}

/// The branch half of `cache status`: where it was read, its keys and
/// their trust, and on a miss the nearest key.
fn print_remote(r: &Remote) {
    let at = r
        .commit
        .as_deref()
        .map(|c| format!(" at {}", &c[..c.len().min(12)]))
        .unwrap_or_default();
    println!("  branch: {} on {}{at}", r.state, r.source);
    if let Some(e) = &r.error {
        println!("    {e}");
    }
    if let Some(p) = r.policy {
        println!("    trust policy: {p}");
    }
    for k in &r.keys {
        println!(
            "    {} ({} chunks, {} tar, published {})",
            k.key,
            k.chunks,
            crate::cache::human_bytes(k.tar_size),
            k.created_at
        );
        println!("      {}", trust_words(k, r.policy));
    }
    if let Some(n) = &r.nearest {
        println!("    nearest key on the branch: {n}; it differs in:");
        for d in &r.differs {
            println!(
                "      {}: branch has {}, this machine wants {}",
                d.name,
                d.branch.as_deref().unwrap_or("(no such pin)"),
                d.current.as_deref().unwrap_or("(no such pin)")
            );
        }
    }
}

/// Status of the named caches (all manifests when `names` is empty). The
/// first error, if any, is returned after everything was collected: a
/// manifest that cannot be read (exit 10, or 4 for a name with no manifest;
/// the others are still listed), or exit 8 when a remote could not be
/// reached (use `--offline` to look at local state only).
pub fn collect(
    sh: &Shell,
    repo: &Repo,
    names: &[String],
    offline: bool,
) -> Result<(Vec<Entry>, Option<anyhow::Error>)> {
    let names = if names.is_empty() {
        manifests::names(repo)?
    } else {
        names.to_vec()
    };
    let mut meta = None;
    let mut checker = None;
    let mut out = Vec::new();
    let mut err = None;
    for name in &names {
        let m = match manifests::load_git(repo, name, "cache list/status") {
            Ok(m) => m,
            Err(e) => {
                out.push(Entry::Broken {
                    name: name.clone(),
                    error: format!("{e:#}"),
                });
                err.get_or_insert(e);
                continue;
            }
        };
        // A key that cannot be computed (a missing pin file) is listed and
        // then the exit code: a script must not read "fine" from it.
        let (key, key_error) = match manifests::compute_key(sh, repo, &m) {
            Ok(k) => (Some(k), None),
            Err(e) => {
                let said = format!("{e:#}");
                err.get_or_insert(e);
                (None, Some(said))
            }
        };
        let local = local_state(repo, &m, key.as_ref());
        let remote = if offline {
            None
        } else {
            if meta.is_none() {
                meta = Some(CacheGit::open_meta(sh, repo)?);
            }
            if checker.is_none() {
                checker = Some(crate::trust::Checker::new(sh, repo)?);
            }
            let git = meta.as_mut().expect("opened above");
            git.set_network(&m.network)?;
            let trust = (checker.as_mut().expect("made above"), repo);
            let (r, e) = remote_state(sh, git, &m, key.as_ref(), trust);
            if let Some(e) = e {
                err.get_or_insert(e);
            }
            Some(r)
        };
        out.push(Entry::Cache(Box::new(CacheStatus {
            name: m.name.clone(),
            description: m.description.clone(),
            branch: m.branch.clone(),
            target: m.restore_path.clone(),
            mode: stamp::mode_name(m.mode),
            key: key.as_ref().map(|k| k.value.clone()),
            key_parts: key.map(|k| k.parts).unwrap_or_default(),
            key_error,
            local,
            remote,
        })));
    }
    Ok((out, err))
}

fn local_state(repo: &Repo, m: &CacheManifest, key: Option<&manifest::Key>) -> Local {
    let mut l = Local {
        state: "not installed".into(),
        installed_key: None,
        restored_at: None,
        commit: None,
        why: None,
        changed_parts: Vec::new(),
    };
    let file = stamp::path(&crate::cache::restore::records_place(repo, m), &m.name);
    let s = match stamp::load(&file) {
        Loaded::Missing => return l,
        Loaded::Corrupt(e) => {
            l.state = "corrupt stamp".into();
            l.why = Some(format!(
                "{e:#}: the next restore sets it aside and restores from scratch"
            ));
            return l;
        }
        Loaded::Found(s) => s,
    };
    l.installed_key = Some(s.key.clone());
    l.restored_at = Some(s.restored_at.clone());
    l.commit = Some(s.commit.clone());
    let Some(key) = key else {
        l.state = "unknown".into();
        l.why = Some("the current key cannot be computed".into());
        return l;
    };
    if let Some(p) = s.partial.as_ref().filter(|p| p.wanted == key.value) {
        l.state = "partial".into();
        l.why = Some(format!(
            "{} stands in for {} (fallback {}); the first restore after restore.recheck looks for {} again",
            s.key, p.wanted, p.fallback, p.wanted
        ));
        return l;
    }
    match s.matches(&key.value, &key.parts, &m.restore_path, m.mode) {
        Ok(()) => match restore::ready(m) {
            Ok(()) if s.built.is_some() => {
                l.state = "built".into();
                l.why = s.built.as_ref().map(|b| b.unpublished.clone());
            }
            Ok(()) => l.state = "installed".into(),
            Err(why) => {
                l.state = "not ready".into();
                l.why = Some(format!(
                    "the ready-probe fails: {why}; the next restore reinstalls it"
                ));
            }
        },
        Err(miss) => {
            l.state = "stale".into();
            l.why = Some(format!("{miss}; the next restore installs {}", key.value));
            if let stamp::Miss::Key { parts, .. } = miss {
                l.changed_parts = parts;
            }
        }
    }
    l
}

fn remote_state(
    sh: &Shell,
    git: &CacheGit,
    m: &CacheManifest,
    key: Option<&manifest::Key>,
    (checker, repo): (&mut crate::trust::Checker, &Repo),
) -> (Remote, Option<anyhow::Error>) {
    let mut r = Remote {
        state: String::new(),
        source: crate::redact::url(&m.remote),
        commit: None,
        keys: Vec::new(),
        nearest: None,
        differs: Vec::new(),
        error: None,
        policy: checker
            .cache_trust(sh, &m.name)
            .ok()
            .map(|t| checker.root.effective(&t).0.name()),
    };
    let remote = match git.resolve_remote(sh, &m.remote) {
        Ok(remote) => remote,
        Err(e) => {
            r.state = "unreachable".into();
            r.error = Some(format!("{e:#}"));
            return (r, Some(e));
        }
    };
    r.source = remote.to_string();
    let (commit, b) = match find_branch(git, &remote, &m.branch) {
        Ok(Found::Read(commit, b)) => (commit, b),
        Ok(Found::Unread(c)) => {
            r.state = "unread".into();
            r.error = Some(format!(
                "{remote} does not filter fetches (uploadpack.allowFilter is off), so reading {} would download every chunk: not read; `{} cache restore {}` fetches it (status then reads that copy), or enable uploadpack.allowFilter on the server",
                m.branch,
                crate::invocation::command(),
                m.name
            ));
            r.commit = Some(c);
            return (r, None);
        }
        Ok(Found::Absent) => {
            r.state = "no branch".into();
            r.error = Some(format!(
                "publish it with `{cmd} cache publish {}`",
                m.name,
                cmd = crate::invocation::command(),
            ));
            return (r, None);
        }
        Err(e) => {
            let e = not_read(&mut r, e);
            return (r, Some(e));
        }
    };
    r.commit = Some(commit);
    let b = match b {
        Ok(b) => b,
        Err(e) => {
            r.state = "damaged".into();
            r.error = Some(format!("{e:#}"));
            return (r, None);
        }
    };
    match &b.content {
        Content::Legacy { archive, parts, .. } => {
            r.state = "legacy".into();
            r.error = Some(legacy_words(archive, parts));
        }
        Content::V1(bm) => {
            judge_keys(&mut r, sh, git, m, (&*b, bm), (checker, repo));
            key_state(&mut r, bm, key);
        }
    }
    (r, None)
}

/// How the branch was found on its remote.
enum Found {
    /// At this commit, read from a store (or its damage).
    Read(String, Result<Box<Branch>>),
    /// At this commit, not read: the server cannot filter and no store
    /// holds it, so reading it would download every chunk.
    Unread(String),
    /// The remote has no such branch.
    Absent,
}

/// Which store the branch is read from: cache-meta.git (fetched there,
/// and rebuilt once if damaged: `git::healing`), or, when the server
/// cannot filter, a store that already holds the commit (a restore
/// fetched it). A read that fails for another reason is the branch's
/// damage, which the caller reports.
fn find_branch(git: &CacheGit, remote: &GitRemote, branch: &str) -> Result<Found> {
    match git.probe_ref(remote, branch)? {
        RefProbe { commit: None, .. } => Ok(Found::Absent),
        RefProbe { filter: true, .. } => crate::git::healing(|| {
            let Some(commit) = git.try_fetch_branch(remote, branch)? else {
                return Ok(Found::Absent);
            };
            match Branch::read(git, remote.clone(), branch, commit.clone()) {
                Err(e) if crate::git::damage_of(&e).is_some() => Err(e),
                b => Ok(Found::Read(commit, b.map(Box::new))),
            }
        }),
        RefProbe {
            commit: Some(c),
            filter: false,
        } => Ok(
            match [Some(git.clone()), git.restore_store()]
                .into_iter()
                .flatten()
                .find(|g| g.has_commit(&c))
            {
                Some(g) => {
                    let b = Branch::read(&g, remote.clone(), branch, c.clone());
                    Found::Read(c, b.map(Box::new))
                }
                None => Found::Unread(c),
            },
        ),
    }
}

/// A branch that could not be fetched: its state and words in `r`, and
/// the error `cache status` ends with (exit 8 says how to skip remotes).
fn not_read(r: &mut Remote, e: anyhow::Error) -> anyhow::Error {
    r.state = match code_of(&e) {
        Code::Remote => "unreachable",
        Code::AuthRefused => "refused",
        _ => "damaged",
    }
    .into();
    r.error = Some(format!("{e:#}"));
    if code_of(&e) == Code::Remote {
        fail(
            Code::Remote,
            format!("{e:#} (use --offline to show local state only)"),
        )
    } else {
        e
    }
}

/// What a branch of the old shell recipe holds, in words.
fn legacy_words(archive: &str, parts: &[String]) -> String {
    let shape = if parts.len() == 1 && parts[0] == *archive {
        "stored whole".to_string()
    } else {
        format!("in {} parts", parts.len())
    };
    format!(
        "made by the old shell recipe: one archive {archive} {shape}, checked by SHA256SUMS, restored whatever the key"
    )
}

/// Every key of the branch, with its signer and verdict, into `r.keys`.
fn judge_keys(
    r: &mut Remote,
    sh: &Shell,
    git: &CacheGit,
    m: &CacheManifest,
    (b, bm): (&Branch, &BranchManifest),
    (checker, repo): (&mut crate::trust::Checker, &Repo),
) {
    // Read-only: the rollback record is read, never written here.
    let seen =
        crate::trust::seen::load(&crate::trust::seen::path(&repo.state_dir())).unwrap_or_default();
    let names: Vec<String> = bm.keys.keys().cloned().collect();
    let all = crate::trust::files_of_keys(git, &b.entries, &names);
    for (k, e) in &bm.keys {
        let trust = match &all {
            Ok(all) => checker.judge(sh, m, k, e, &all[k], seen.get(&m.name, k)),
            Err(e) => Err(anyhow::anyhow!("{e:#}")),
        };
        let trust = match trust {
            Ok(t) => Some(t),
            Err(e) => {
                r.error = Some(format!("checking the signature of {k}: {e:#}"));
                None
            }
        };
        r.keys.push(BranchKey {
            key: k.clone(),
            created_at: e.created_at.clone(),
            tar_size: e.tar_size,
            chunks: e.chunks.len(),
            parts: e.key_parts.clone(),
            trust,
        });
    }
}

/// Whether the branch holds the key this machine wants, and on a miss
/// the nearest one.
fn key_state(r: &mut Remote, bm: &BranchManifest, key: Option<&manifest::Key>) {
    match key {
        Some(key) if bm.keys.contains_key(&key.value) => r.state = "has key".into(),
        Some(key) => {
            r.state = "key missing".into();
            if let Some((nearest, differs)) = nearest(&r.keys, &key.parts) {
                r.nearest = Some(nearest);
                r.differs = differs;
            }
        }
        None => r.state = "unknown".into(),
    }
}

/// The branch key whose pins differ least from `current`, and how.
pub fn nearest(keys: &[BranchKey], current: &[KeyPart]) -> Option<(String, Vec<BranchPartChange>)> {
    keys.iter()
        .map(|k| {
            let d: Vec<BranchPartChange> = stamp::diff_parts(&k.parts, current)
                .into_iter()
                .map(|c| BranchPartChange::new(c.name, c.installed, c.current))
                .collect();
            (k.key.clone(), d)
        })
        .min_by_key(|(_, d)| d.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(n: &str, v: &str) -> KeyPart {
        KeyPart {
            name: n.into(),
            value: v.into(),
        }
    }

    fn key(k: &str, parts: Vec<KeyPart>) -> BranchKey {
        BranchKey {
            key: k.into(),
            created_at: String::new(),
            tar_size: 0,
            chunks: 1,
            parts,
            trust: None,
        }
    }

    #[test]
    fn nearest_key_names_the_pins_that_differ() {
        let keys = vec![
            key(
                "tc-1.94-linux",
                vec![part("rust", "1.94"), part("os", "linux")],
            ),
            key(
                "tc-1.95-macos",
                vec![part("rust", "1.95"), part("os", "macos")],
            ),
        ];
        let current = vec![part("rust", "1.95"), part("os", "linux")];
        let (k, d) = nearest(&keys, &current).unwrap();
        // Both differ in one pin; the first in branch order wins the tie.
        assert_eq!(k, "tc-1.94-linux");
        assert_eq!(
            d,
            vec![BranchPartChange::new(
                "rust".into(),
                Some("1.94".into()),
                Some("1.95".into())
            )]
        );
        assert!(nearest(&[], &current).is_none());
    }
}
