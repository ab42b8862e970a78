//! `cargo xtask cache prune <name>`, and `[publish] keep`: drop old keys
//! from a cache branch in one new root commit.
//!
//! Which keys go is decided by `select`, from `warmstart.json` alone (pure):
//! keys are grouped by their platform value (the part of the `platform`
//! pin, else of a pin named `platform`; one group when there is none), and
//! within a group sorted newest first by `created_at`. A key is dropped when
//! every limit given selects it (`--keep N`: not among the N newest of its
//! group; `--older-than D`: created before now minus D), unless it is
//! protected: the key today's pins give with each platform value of the
//! branch, and (after a publish) the key just published.
//!
//! The new tree is the old one minus exactly the chunk files
//! `warmstart.json` lists for the dropped keys and their signed statements,
//! with `README.md`, `warmstart.json` and `SHA256SUMS` written anew; every
//! other file (the kept keys' statements and signatures among them) stays
//! byte for byte, never re-signed, after `trust::sign::check_kept` named
//! each kept key that would not hold. The push takes publish's lease and its
//! retry schedule: a branch that moved meanwhile is fetched again and the
//! choice made again on what it now holds. This module never touches an
//! install, a stamp or the user's repository.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;
use xshell::Shell;

use crate::cache::format::manifest::{self, CacheManifest, Key, PinSource};
use crate::cache::format::{BranchManifest, KeyEntry};
use crate::cache::human_bytes;
use crate::cache::manifests;
use crate::cache::publish::branch::BranchState;
use crate::cache::publish::commit::generated_files;
use crate::cache::publish::lease::{Lease, lease_deadline};
use crate::cache::publish::report::{Reporter, plural};
use crate::cli::cache::PruneArgs;
use crate::clock::{self, parse_rfc3339_ms};
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, TreeEntry, healing, is_stale_lease};
use crate::repo::Repo;

/// What may go: the limits, and the keys that stay whatever they say.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Keep the N newest keys of each platform value.
    pub keep: Option<usize>,
    /// Drop keys created longer ago than this (with `now_ms`).
    pub older_than: Option<Duration>,
    pub now_ms: u64,
    /// Never dropped.
    pub protect: BTreeSet<String>,
}

/// The name of the key part that says the platform, if the manifest has one.
pub fn platform_part(m: &CacheManifest) -> Option<String> {
    m.pins
        .iter()
        .find(|p| matches!(p.source, PinSource::Platform))
        .or_else(|| m.pins.iter().find(|p| p.name == "platform"))
        .map(|p| p.name.clone())
}

/// The value of part `part` of a branch key (`""` when it has none).
fn part_value(e: &KeyEntry, part: Option<&str>) -> String {
    part.and_then(|name| e.key_parts.iter().find(|p| p.name == name))
        .map(|p| p.value.clone())
        .unwrap_or_default()
}

/// The keys today's pins give with each platform value found on the
/// branch (today's own key among them): a prune keeps them all.
pub fn pinned_keys(m: &CacheManifest, current: &Key, branch: &BranchManifest) -> BTreeSet<String> {
    let mut out = BTreeSet::from([current.value.clone()]);
    let Some(part) = platform_part(m) else {
        return out;
    };
    for e in branch.keys.values() {
        let value = part_value(e, Some(&part));
        let parts = current
            .parts
            .iter()
            .map(|p| {
                let mut p = p.clone();
                if p.name == part {
                    p.value = value.clone();
                }
                p
            })
            .collect();
        out.insert(manifest::key_from_parts(&m.name, parts).value);
    }
    out
}

/// The keys of `branch` the policy drops, sorted. Pure.
pub fn select(branch: &BranchManifest, part: Option<&str>, policy: &Policy) -> Vec<String> {
    let mut groups: BTreeMap<String, Vec<(&String, &KeyEntry)>> = BTreeMap::new();
    for (k, e) in &branch.keys {
        groups.entry(part_value(e, part)).or_default().push((k, e));
    }
    let cutoff = policy
        .older_than
        .map(|d| policy.now_ms.saturating_sub(d.as_millis() as u64));
    let mut drops = Vec::new();
    for keys in groups.values_mut() {
        // Newest first; a created_at that does not parse counts as oldest,
        // the same key name order breaks ties so the choice is stable.
        keys.sort_by(|a, b| {
            let (ta, tb) = (
                parse_rfc3339_ms(&a.1.created_at),
                parse_rfc3339_ms(&b.1.created_at),
            );
            tb.cmp(&ta).then_with(|| b.0.cmp(a.0))
        });
        for (rank, (k, e)) in keys.iter().enumerate() {
            if policy.protect.contains(*k) {
                continue;
            }
            let beyond_keep = policy.keep.is_none_or(|n| rank >= n);
            let too_old =
                cutoff.is_none_or(|c| parse_rfc3339_ms(&e.created_at).is_none_or(|t| t < c));
            if beyond_keep && too_old && (policy.keep.is_some() || policy.older_than.is_some()) {
                drops.push((*k).clone());
            }
        }
    }
    drops.sort();
    drops
}

/// The keys `[publish] keep = n` drops in the commit that adds `entry` as
/// `key` to `before` (the branch as fetched): never `key` itself.
pub fn after_publish(
    m: &CacheManifest,
    key: &Key,
    before: Option<&BranchManifest>,
    entry: &KeyEntry,
    n: usize,
) -> Vec<String> {
    let mut after = before.cloned().unwrap_or_default();
    after.keys.insert(key.value.clone(), entry.clone());
    let policy = Policy {
        keep: Some(n),
        older_than: None,
        now_ms: clock::now_ms(),
        protect: pinned_keys(m, key, &after),
    };
    select(&after, platform_part(m).as_deref(), &policy)
}

/// One key, as `cache prune` reports it.
#[derive(Clone, Debug, Serialize)]
pub struct KeyReport {
    pub key: String,
    pub created_at: String,
    pub platform: String,
    /// Compressed bytes of its chunks.
    #[serde(rename = "compressed_bytes")]
    pub bytes: u64,
}

/// The `--json` output of `cache prune`.
#[derive(Clone, Debug, Serialize)]
pub struct PruneSummary {
    pub name: String,
    pub branch: String,
    #[serde(serialize_with = "crate::contract::shown_remote")]
    pub remote: String,
    /// `pruned`, `nothing to prune` or `dry-run`.
    pub status: &'static str,
    pub previous_commit: String,
    /// The branch's commit afterwards (the old one unless `pruned`).
    pub commit: String,
    pub dropped: Vec<KeyReport>,
    pub kept: Vec<KeyReport>,
    /// Compressed bytes of the dropped keys' chunks: what the branch no
    /// longer references (the host frees them only when it collects
    /// garbage).
    pub compressed_bytes_dropped: u64,
    /// Lost leases retried.
    pub retries: usize,
}

/// `cargo xtask cache prune`.
pub fn run(sh: &Shell, args: PruneArgs) -> Result<()> {
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let s = prune(sh, &args)?;
    if args.out.json {
        crate::contract::document(&s);
    }
    Ok(())
}

/// `--older-than`, parsed; refused unless `--keep` or it says what may go.
fn older_than(args: &PruneArgs) -> Result<Option<Duration>> {
    let older_than = args
        .older_than
        .as_deref()
        .map(|t| {
            clock::parse_positive_duration(t)
                .map_err(|e| fail(Code::Usage, format!("--older-than {t:?}: {e}")))
        })
        .transpose()?;
    if args.keep.is_none() && older_than.is_none() {
        return Err(fail(
            Code::Usage,
            "cache prune needs --keep N, --older-than D, or both: say which keys may go",
        ));
    }
    Ok(older_than)
}

/// The branch as it is now; it must exist and hold keys (format v1).
fn load_v1(
    git: &CacheGit,
    remote: &Remote,
    m: &CacheManifest,
    out: &Reporter,
) -> Result<BranchState> {
    let state = healing(|| BranchState::load(git, remote, &m.branch, out))?.ok_or_else(|| {
        fail(
            Code::NotFound,
            format!("{} does not exist on {remote}: nothing to prune", m.branch),
        )
    })?;
    if !state.entries.iter().any(|e| e.name == "warmstart.json") {
        return Err(fail(
            Code::NotFound,
            format!(
                "{} on {remote} is a legacy branch (one archive, no keys): nothing to prune; `{} cache publish {}` replaces it with format v1",
                m.branch,
                crate::invocation::command(),
                m.name
            ),
        ));
    }
    Ok(state)
}

/// What a prune of `drops` from `state` drops and keeps.
fn summarize(
    m: &CacheManifest,
    remote: &Remote,
    state: &BranchState,
    drops: &[String],
    part: Option<&str>,
    retries: usize,
) -> PruneSummary {
    let report = |k: &String, e: &KeyEntry| KeyReport {
        key: k.clone(),
        created_at: e.created_at.clone(),
        platform: part_value(e, part),
        bytes: e.chunks.iter().map(|c| c.size).sum(),
    };
    let (dropped, kept): (Vec<_>, Vec<_>) = state
        .manifest
        .keys
        .iter()
        .map(|(k, e)| (drops.contains(k), report(k, e)))
        .partition(|(d, _)| *d);
    PruneSummary {
        name: m.name.clone(),
        branch: m.branch.clone(),
        remote: remote.to_string(),
        status: "nothing to prune",
        previous_commit: state.commit.clone(),
        commit: state.commit.clone(),
        compressed_bytes_dropped: dropped.iter().map(|(_, r)| r.bytes).sum(),
        dropped: dropped.into_iter().map(|(_, r)| r).collect(),
        kept: kept.into_iter().map(|(_, r)| r).collect(),
        retries,
    }
}

/// Says which keys go (or would go, on a dry run), or that none does.
fn say_choice(out: &Reporter, m: &CacheManifest, summary: &PruneSummary, dry_run: bool) {
    for r in &summary.dropped {
        out.say(format!(
            "{} {} (created {}, {})",
            if dry_run { "would drop" } else { "drop" },
            r.key,
            r.created_at,
            human_bytes(r.bytes)
        ));
    }
    if summary.dropped.is_empty() {
        out.say(format!(
            "nothing to prune on {} ({} kept)",
            m.branch,
            plural(summary.kept.len(), "key", "keys")
        ));
    }
}

/// The kept keys' statements and signatures go into the new commit byte
/// for byte, never re-signed; checked first, as a publish checks the keys
/// it keeps: each that does not hold is named in a warning, and kept
/// (restores refuse it by themselves; dropping it would delete another
/// publisher's key on this clone's say-so).
fn check_kept(
    sh: &Shell,
    checker: &mut crate::trust::Checker,
    (m, git): (&CacheManifest, &CacheGit),
    state: &BranchState,
    summary: &PruneSummary,
    out: &Reporter,
) -> Result<()> {
    let kept: Vec<String> = summary.kept.iter().map(|r| r.key.clone()).collect();
    let files = crate::trust::files_of_keys(git, &state.entries, &kept)?;
    let warn = |line: String| out.warn(line);
    crate::trust::sign::check_kept(sh, checker, m, &state.manifest, None, &files, &warn)?;
    Ok(())
}

/// Exit 3 when other publishers kept moving the branch past the deadline.
fn lease_lost(m: &CacheManifest, remote: &Remote, lease: &Lease) -> anyhow::Error {
    fail(
        Code::Busy,
        format!(
            "lease on {} lost {} in {:.0}s: publishers kept moving it on {remote}; nothing was pruned; prune again, or allow more time with [publish] lease_deadline or WARMSTART_PUBLISH_LEASE_DEADLINE",
            m.branch,
            plural(lease.lost, "time", "times"),
            lease.start.elapsed().as_secs_f64()
        ),
    )
}

fn prune(sh: &Shell, args: &PruneArgs) -> Result<PruneSummary> {
    let out = Reporter::new(args.out.quiet(), args.out.json);
    let older_than = older_than(args)?;
    let repo = Repo::from_cwd()?;
    let m = manifests::load_git(&repo, &args.name, "cache prune")?;
    let key = manifests::compute_key(sh, &repo, &m)?;
    let deadline = lease_deadline(&m)?;
    let remote_name = args.remote.clone().unwrap_or_else(|| m.remote.clone());
    let remote = crate::git::resolve_remote(sh, &repo.root, &remote_name)?;
    let mut git = CacheGit::open(sh, &repo)?.with_lock_wait(deadline);
    git.set_network(&m.network)?;
    let part = platform_part(&m);
    let mut checker = crate::trust::Checker::new(sh, &repo)?;
    let mut lease = Lease::new(deadline);
    loop {
        let state = load_v1(&git, &remote, &m, &out)?;
        let policy = Policy {
            keep: args.keep,
            older_than,
            now_ms: clock::now_ms(),
            protect: pinned_keys(&m, &key, &state.manifest),
        };
        let drops = select(&state.manifest, part.as_deref(), &policy);
        let mut summary = summarize(&m, &remote, &state, &drops, part.as_deref(), lease.lost);
        say_choice(&out, &m, &summary, args.dry_run);
        if drops.is_empty() {
            return Ok(summary);
        }
        if args.dry_run {
            summary.status = "dry-run";
            return Ok(summary);
        }
        check_kept(sh, &mut checker, (&m, &git), &state, &summary, &out)?;
        let commit = prune_commit(&git, &m, &remote, &state, &drops)?;
        let pushed = git.push_branch(
            &remote,
            &m.branch,
            &commit,
            Some(&state.commit),
            &mut |_| {},
        );
        match pushed {
            Ok(()) => {
                git.set_local_branch(&m.branch, &commit)?;
                summary.status = "pruned";
                summary.commit = commit.clone();
                out.say(format!(
                    "pruned {} from {} on {remote}: commit {} (one root commit), {} kept; {} of compressed chunks no longer referenced (the host reclaims it when it collects garbage)",
                    plural(drops.len(), "key", "keys"),
                    m.branch,
                    &commit[..12],
                    plural(summary.kept.len(), "key", "keys"),
                    human_bytes(summary.compressed_bytes_dropped)
                ));
                return Ok(summary);
            }
            Err(e) if is_stale_lease(&e) => {
                let Some(pause) = lease.lost() else {
                    return Err(lease_lost(&m, &remote, &lease));
                };
                out.say(format!(
                    "{} moved on {remote} while pruning (a publish?): choosing again in {} ms",
                    m.branch,
                    pause.as_millis()
                ));
                std::thread::sleep(pause);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The root commit of `state` without the keys `drops`: their chunk files
/// and file indexes (as `warmstart.json` lists them) leave the tree, the generated files are
/// written anew, and every other file stays as it is.
fn prune_commit(
    git: &CacheGit,
    m: &CacheManifest,
    remote: &Remote,
    state: &BranchState,
    drops: &[String],
) -> Result<String> {
    let mut manifest = state.manifest.clone();
    let mut gone: BTreeSet<String> = BTreeSet::new();
    for d in drops {
        if let Some(e) = state.manifest.keys.get(d) {
            gone.extend(e.chunks.iter().map(|c| c.file.clone()));
            gone.extend(e.index_files().map(|i| i.file.clone()));
        }
        // A dropped key's statement and signature vouch for nothing left.
        gone.insert(crate::trust::statement::file_name(d));
        gone.insert(crate::trust::statement::sig_name(d));
        manifest.keys.remove(d);
    }
    // A file a kept key lists is never dropped, even if a dropped key
    // (wrongly) listed it too.
    for e in manifest.keys.values() {
        for c in &e.chunks {
            gone.remove(&c.file);
        }
        for i in e.index_files() {
            gone.remove(&i.file);
        }
    }
    const GENERATED: [&str; 3] = ["README.md", "warmstart.json", "SHA256SUMS"];
    let mut tree = generated_files(git, m, remote, &manifest)?;
    tree.extend(
        state
            .entries
            .iter()
            .filter(|e| !GENERATED.contains(&e.name.as_str()) && !gone.contains(e.name.as_str()))
            .map(|e| TreeEntry {
                size: None,
                ..e.clone()
            }),
    );
    let tree_oid = git.mktree(&tree).context("writing the pruned tree")?;
    let message = format!(
        "warmstart cache {}: prune {}\n\nPruned by warmstart {}.\nKeys on this branch: {}.\n",
        m.name,
        drops.join(", "),
        env!("CARGO_PKG_VERSION"),
        manifest.keys.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    git.commit_tree(&tree_oid, &message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, KeyPart};

    fn entry(key: &str, platform: &str, created: &str) -> KeyEntry {
        KeyEntry {
            archive: format!("{key}.tar.zst"),
            compression: "zstd".into(),
            chunks: vec![Chunk {
                file: format!("{key}.tar.zst.part000"),
                size: 10,
                sha256: "a".repeat(64),
                raw_size: None,
                raw_sha256: None,
            }],
            tar_sha256: "b".repeat(64),
            tar_size: 1024,
            files: 1,
            key_parts: vec![
                KeyPart {
                    name: "src".into(),
                    value: key.into(),
                },
                KeyPart {
                    name: "platform".into(),
                    value: platform.into(),
                },
            ],
            source_commit: None,
            source_tree: None,
            gates: serde_json::Value::Null,
            ungated: false,
            created_at: created.into(),
            tool_version: "warmstart 0".into(),
            frames: None,
            index: None,
            index_parts: Vec::new(),
        }
    }

    fn branch(keys: &[(&str, &str, &str)]) -> BranchManifest {
        let mut m = BranchManifest::new();
        for (k, p, c) in keys {
            m.keys.insert(k.to_string(), entry(k, p, c));
        }
        m
    }

    #[test]
    fn keep_counts_per_platform_and_spares_protected_keys() {
        let b = branch(&[
            ("a1", "x", "2026-01-01T00:00:00Z"),
            ("a2", "x", "2026-01-02T00:00:00Z"),
            ("a3", "x", "2026-01-03T00:00:00Z"),
            ("b1", "y", "2026-01-01T00:00:00Z"),
            ("b2", "y", "2026-01-04T00:00:00Z"),
        ]);
        let mut policy = Policy {
            keep: Some(1),
            ..Policy::default()
        };
        assert_eq!(select(&b, Some("platform"), &policy), ["a1", "a2", "b1"]);
        // Without a platform part, one group.
        assert_eq!(select(&b, None, &policy), ["a1", "a2", "a3", "b1"]);
        policy.protect = BTreeSet::from(["a1".to_string()]);
        assert_eq!(select(&b, Some("platform"), &policy), ["a2", "b1"]);
        policy.keep = Some(0);
        assert_eq!(
            select(&b, Some("platform"), &policy),
            ["a2", "a3", "b1", "b2"]
        );
        policy.keep = Some(9);
        assert!(select(&b, Some("platform"), &policy).is_empty());
    }

    #[test]
    fn older_than_and_keep_must_both_select_a_key() {
        let b = branch(&[
            ("a1", "x", "2026-01-01T00:00:00Z"),
            ("a2", "x", "2026-01-10T00:00:00Z"),
            ("a3", "x", "not a time"),
        ]);
        let now = parse_rfc3339_ms("2026-01-11T00:00:00Z").unwrap();
        let day = Duration::from_secs(86_400);
        let policy = Policy {
            older_than: Some(5 * day),
            now_ms: now,
            ..Policy::default()
        };
        // A time that does not parse counts as old.
        assert_eq!(select(&b, None, &policy), ["a1", "a3"]);
        let policy = Policy {
            keep: Some(2),
            ..policy
        };
        // a3 sorts last (oldest), so keep 2 spares a1 and a2; a3 is both.
        assert_eq!(select(&b, None, &policy), ["a3"]);
        // No limit at all drops nothing.
        assert!(select(&b, None, &Policy::default()).is_empty());
    }

    #[test]
    fn a_property_no_protected_or_kept_key_is_ever_dropped() {
        // A small deterministic PRNG over many generated branches.
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for _ in 0..500 {
            let count = next(12) as usize;
            let mut keys = Vec::new();
            for i in 0..count {
                let day = 1 + next(28);
                let time = if next(10) == 0 {
                    "garbage".to_string()
                } else {
                    format!("2026-02-{day:02}T00:00:00Z")
                };
                keys.push((
                    format!("k{i}"),
                    ["x", "y", "z"][next(3) as usize].to_string(),
                    time,
                ));
            }
            let refs: Vec<(&str, &str, &str)> = keys
                .iter()
                .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
                .collect();
            let b = branch(&refs);
            let keep = next(4) as usize;
            let protect: BTreeSet<String> = keys
                .iter()
                .filter(|_| next(4) == 0)
                .map(|k| k.0.clone())
                .collect();
            let policy = Policy {
                keep: Some(keep),
                older_than: (next(2) == 0).then(|| Duration::from_secs(86_400 * next(30))),
                now_ms: parse_rfc3339_ms("2026-03-01T00:00:00Z").unwrap(),
                protect: protect.clone(),
            };
            let drops = select(&b, Some("platform"), &policy);
            for d in &drops {
                assert!(!protect.contains(d), "dropped protected {d}");
                assert!(b.keys.contains_key(d));
            }
            // Per platform, at least min(keep, size) keys stay.
            for p in ["x", "y", "z"] {
                let total = keys.iter().filter(|k| k.1 == p).count();
                let left = keys
                    .iter()
                    .filter(|k| k.1 == p && !drops.contains(&k.0))
                    .count();
                assert!(
                    left >= keep.min(total),
                    "{p}: {left} of {total} left, keep {keep}"
                );
            }
        }
    }
}
