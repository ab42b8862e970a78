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

use crate::cache::branch::{Branch, Content};
use crate::cache::format::KeyPart;
use crate::cache::git::CacheGit;
use crate::cache::manifest::{self, CacheManifest};
use crate::cache::restore;
use crate::cache::stamp::{self, Loaded, PartChange};
use crate::cli::cache::ListArgs;
use crate::exit::{Code, code_of, fail};
use crate::repo::Repo;

/// One pin whose value differs between what is wanted here and a branch key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BranchPartChange {
    pub name: String,
    /// The value in the branch's key (`None`: that key has no such pin).
    pub branch: Option<String>,
    /// The value this machine computes.
    pub current: Option<String>,
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
    pub tar_size: u64,
    pub chunks: usize,
    pub parts: Vec<KeyPart>,
}

/// What the branch holds.
#[derive(Debug, Serialize)]
pub struct Remote {
    /// `has key`, `key missing`, `legacy` (one archive, no keys), `no
    /// branch`, `unreachable`, `damaged`.
    pub state: String,
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
    /// `None` with `--offline`.
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
    if args.out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).expect("status serializes")
        );
    } else if !args.out.quiet {
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
        }
    }
    err.map_or(Ok(()), Err)
}

/// `cargo xtask cache status`.
pub fn status(sh: &Shell, args: ListArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let (all, err) = collect(sh, &repo, &args.names, args.offline)?;
    if args.out.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&all).expect("status serializes")
        );
    } else if !args.out.quiet {
        for e in &all {
            match e {
                Entry::Cache(c) => print_status(c),
                Entry::Broken { name, error } => {
                    println!("cache {name}\n  cannot read its manifest: {error}")
                }
            }
        }
    }
    err.map_or(Ok(()), Err)
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
        Some(r) => {
            let at = r
                .commit
                .as_deref()
                .map(|c| format!(" at {}", &c[..c.len().min(12)]))
                .unwrap_or_default();
            println!("  branch: {} on {}{at}", r.state, r.source);
            if let Some(e) = &r.error {
                println!("    {e}");
            }
            for k in &r.keys {
                println!(
                    "    {} ({} chunks, {} tar, published {})",
                    k.key,
                    k.chunks,
                    crate::cache::human_bytes(k.tar_size),
                    k.created_at
                );
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
        manifest::names(repo)?
    } else {
        names.to_vec()
    };
    let mut meta = None;
    let mut out = Vec::new();
    let mut err = None;
    for name in &names {
        let m = match manifest::load(repo, name) {
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
        let (key, key_error) = match manifest::compute_key(sh, repo, &m) {
            Ok(k) => (Some(k), None),
            Err(e) => (None, Some(format!("{e:#}"))),
        };
        let local = local_state(repo, &m, key.as_ref());
        let remote = if offline {
            None
        } else {
            if meta.is_none() {
                meta = Some(CacheGit::open_meta(sh, repo)?);
            }
            let git = meta.as_ref().expect("opened above");
            let (r, e) = remote_state(sh, git, &m, key.as_ref());
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
    let file = stamp::path(&repo.state_dir(), &m.name);
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
    match s.matches(&key.value, &key.parts, &m.restore_path, m.mode) {
        Ok(()) => match restore::ready(m) {
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
) -> (Remote, Option<anyhow::Error>) {
    let mut r = Remote {
        state: String::new(),
        source: m.remote.clone(),
        commit: None,
        keys: Vec::new(),
        nearest: None,
        differs: Vec::new(),
        error: None,
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
    // A damaged cache-meta.git is rebuilt once and the branch fetched
    // again (`git::healing`); a read that fails for another reason is the
    // branch's damage, reported below.
    let fetched = crate::cache::git::healing(|| {
        let Some(commit) = git.try_fetch_branch(&remote, &m.branch)? else {
            return Ok(None);
        };
        match Branch::read(git, remote.clone(), &m.branch, commit.clone()) {
            Err(e) if crate::cache::git::damage_of(&e).is_some() => Err(e),
            b => Ok(Some((commit, b))),
        }
    });
    let (commit, b) = match fetched {
        Ok(Some(found)) => found,
        Ok(None) => {
            r.state = "no branch".into();
            r.error = Some(format!(
                "publish it with `{cmd} cache publish {}`",
                m.name,
                cmd = crate::invocation::command(),
            ));
            return (r, None);
        }
        Err(e) => {
            r.state = if code_of(&e) == Code::Remote {
                "unreachable"
            } else {
                "damaged"
            }
            .into();
            r.error = Some(format!("{e:#}"));
            let e = if code_of(&e) == Code::Remote {
                fail(
                    Code::Remote,
                    format!("{e:#} (use --offline to show local state only)"),
                )
            } else {
                e
            };
            return (r, Some(e));
        }
    };
    r.commit = Some(commit.clone());
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
            r.error = Some(format!(
                "made by the old shell recipe: one archive {archive} in {} parts, restored whatever the key",
                parts.len()
            ));
        }
        Content::V1(bm) => {
            for (k, e) in &bm.keys {
                r.keys.push(BranchKey {
                    key: k.clone(),
                    created_at: e.created_at.clone(),
                    tar_size: e.tar_size,
                    chunks: e.chunks.len(),
                    parts: e.key_parts.clone(),
                });
            }
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
    }
    (r, None)
}

/// The branch key whose pins differ least from `current`, and how.
pub fn nearest(keys: &[BranchKey], current: &[KeyPart]) -> Option<(String, Vec<BranchPartChange>)> {
    keys.iter()
        .map(|k| {
            let d: Vec<BranchPartChange> = stamp::diff_parts(&k.parts, current)
                .into_iter()
                .map(|c| BranchPartChange {
                    name: c.name,
                    branch: c.installed,
                    current: c.current,
                })
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
            vec![BranchPartChange {
                name: "rust".into(),
                branch: Some("1.94".into()),
                current: Some("1.95".into()),
            }]
        );
        assert!(nearest(&[], &current).is_none());
    }
}
