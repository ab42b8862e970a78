//! The private stores' refs and objects: refs of branches no manifest
//! names, promisor packs rewritten to what is still reached, old
//! unreachable loose objects pruned, each store under its `StoreLock`.
//! It never drops the commit of an installed key, nor a ref when a
//! manifest does not load. Partial packs a dead or failed git left
//! (`tmp_pack_*`) go too, never one a process holds open.

use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use xshell::Shell;

use super::{Options, StoreReport, read_dir_or_empty, remove_file, tree_size};
use crate::cache::restore::stamp::{self, Loaded};
use crate::git::{CacheGit, StoreLock};
use crate::repo::Repo;

/// Loose objects younger than this stay: a publish writes its blobs before
/// any ref reaches them, and it does not take the use lock.
const LOOSE_GRACE: &str = "1.day.ago";

pub(super) fn open_store(sh: &Shell, repo: &Repo, name: &str) -> Result<CacheGit> {
    Ok(match name {
        "cache.git" => CacheGit::open(sh, repo)?,
        _ => CacheGit::open_meta(sh, repo)?,
    })
}

/// The branch of every manifest, or `None` when one does not load (then no
/// ref is dropped: a typo in a manifest must not cost a cache).
pub(super) fn manifest_branches(repo: &Repo) -> Option<BTreeSet<String>> {
    let names = crate::cache::manifests::names(repo).ok()?;
    names
        .iter()
        .map(|n| {
            crate::cache::manifests::load(repo, n)
                .ok()
                .map(|m| m.branch)
        })
        .collect()
}

/// Refs of gone branches, unreachable objects (promisor packs included)
/// and old unreachable loose objects of one store, under its `StoreLock`.
pub(super) fn collect_objects(
    git: &CacheGit,
    name: &str,
    branches: Option<&BTreeSet<String>>,
    opts: &Options,
) -> Result<StoreReport> {
    let _lock = StoreLock::take(&git.dir, opts.wait)?;
    let objects = git.dir.join("objects");
    let mut r = StoreReport {
        store: name.to_string(),
        before_bytes: tree_size(&objects),
        ..StoreReport::default()
    };
    let refs = git_out(
        git,
        &["for-each-ref", "--format=%(refname)", "refs/warmstart/"],
    )?;
    for full in refs.lines() {
        let branch = full.trim_start_matches("refs/warmstart/");
        if branches.is_some_and(|b| !b.contains(branch)) && is_cache_branch(git, full) {
            r.refs_dropped.push(branch.to_string());
            if !opts.dry_run {
                git_out(git, &["update-ref", "-d", full])?;
            }
        }
    }
    if !opts.dry_run {
        remove_dead_temp_packs(&objects.join("pack"));
        // The commits installs came from stay, with their trees and the
        // chunk blobs git holds, after their branch moved on.
        let installed = installed_commits(git);
        r.objects_dropped =
            repack_promisor(git, &installed).with_context(|| format!("repacking {name}"))?;
        let mut prune = vec!["prune".to_string(), format!("--expire={LOOSE_GRACE}")];
        prune.extend(installed);
        let prune: Vec<&str> = prune.iter().map(String::as_str).collect();
        git_out(git, &prune).with_context(|| format!("pruning {name}"))?;
    }
    r.after_bytes = tree_size(&objects);
    Ok(r)
}

/// A partial pack this old that no process holds open is a dead git's.
const TEMP_PACK_GRACE: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes the partial packs (`tmp_pack_*`, `tmp_idx_*`, `tmp_rev_*`, ...)
/// a git left in `pack_dir` when it died or failed (a full disk leaves
/// index-pack's): those no process holds open and older than
/// `TEMP_PACK_GRACE`, so that a fetch running now (a fetch of blobs by id
/// does not take the store's lock) never loses its file, even in the instant
/// between writing an index and renaming it.
fn remove_dead_temp_packs(pack_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(pack_dir) else {
        return;
    };
    let candidates: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("tmp_"))
        .filter(|e| {
            e.metadata()
                .ok()
                .filter(std::fs::Metadata::is_file)
                .and_then(|m| m.modified().ok())
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= TEMP_PACK_GRACE)
        })
        .map(|e| e.path())
        .collect();
    if candidates.is_empty() {
        return;
    }
    let open = crate::process::group::files_open_under(pack_dir);
    for path in candidates.iter().filter(|p| !open.contains(*p)) {
        let _ = std::fs::remove_file(path);
    }
}

/// The commits of installed keys (per their stamps) that `git` holds.
fn installed_commits(git: &CacheGit) -> Vec<String> {
    let Some(state_dir) = git.dir.parent() else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    for e in read_dir_or_empty(&stamp::dir(state_dir)).unwrap_or_default() {
        if let Loaded::Found(s) = stamp::load(&e.path())
            && s.commit.len() == 40
            && s.commit.bytes().all(|b| b.is_ascii_hexdigit())
            && git_out(
                git,
                &["cat-file", "-e", &format!("{}^{{commit}}", s.commit)],
            )
            .is_ok()
        {
            out.insert(s.commit.clone());
        }
    }
    out.into_iter().collect()
}

/// Whether `r`'s tree is a cache branch's (`warmstart.json` or a legacy
/// `SHA256SUMS` at its root): any other ref under `refs/warmstart/` is
/// someone else's (a push's temporary ref) and stays.
fn is_cache_branch(git: &CacheGit, r: &str) -> bool {
    // The tree alone: a blob left out of the fetch must not matter.
    git_out(
        git,
        &[
            "ls-tree",
            "--name-only",
            r,
            "--",
            "warmstart.json",
            "SHA256SUMS",
        ],
    )
    .is_ok_and(|names| !names.trim().is_empty())
}

/// Rewrites the promisor packs (what filtered fetches brought) to hold only
/// objects some ref still reaches; `git gc` keeps every promisor object.
/// Returns how many objects were dropped. Nothing is written when none is
/// unreachable.
fn repack_promisor(git: &CacheGit, installed: &[String]) -> Result<u64> {
    let pack_dir = git.dir.join("objects").join("pack");
    let packs = promisor_packs(&pack_dir)?;
    if packs.is_empty() {
        return Ok(0);
    }
    let held = objects_in(git, &packs)?;
    let mut args = vec!["rev-list", "--objects", "--all", "--missing=allow-any"];
    args.extend(installed.iter().map(String::as_str));
    let reachable = git_out(git, &args)?;
    let keep: BTreeSet<&str> = reachable
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|o| held.contains(*o))
        .collect();
    let dropped = (held.len() - keep.len()) as u64;
    if dropped == 0 {
        return Ok(0);
    }
    let new_base = write_pack(git, &pack_dir, &keep)?;
    // Marked before the old packs go, so the objects never stop being
    // promisor objects (a reachable tree names blobs the store never had).
    File::create(new_base.with_extension("promisor"))
        .with_context(|| format!("marking {}.pack", new_base.display()))?;
    for p in packs.iter().filter(|p| **p != new_base) {
        for ext in ["pack", "idx", "rev", "bitmap", "promisor"] {
            remove_file(&p.with_extension(ext))?;
        }
    }
    Ok(dropped)
}

/// The promisor packs of `pack_dir` not marked `.keep`, without extension.
fn promisor_packs(pack_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut packs = Vec::new();
    for e in read_dir_or_empty(pack_dir)? {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "promisor") && !p.with_extension("keep").exists() {
            packs.push(p.with_extension(""));
        }
    }
    Ok(packs)
}

/// The ids of every object the packs hold, from their indexes.
fn objects_in(git: &CacheGit, packs: &[PathBuf]) -> Result<BTreeSet<String>> {
    let mut held = BTreeSet::new();
    for p in packs {
        let idx = File::open(p.with_extension("idx"))
            .with_context(|| format!("opening {}.idx", p.display()))?;
        let out = git
            .git()
            .arg("show-index")
            .stdin(idx)
            .stderr(Stdio::piped())
            .output()
            .context("running git show-index")?;
        anyhow::ensure!(out.status.success(), "git show-index failed");
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(oid) = line.split_whitespace().nth(1) {
                held.insert(oid.to_string());
            }
        }
    }
    Ok(held)
}

/// One new pack of the objects `keep` in `pack_dir`; its path without
/// extension.
fn write_pack(git: &CacheGit, pack_dir: &Path, keep: &BTreeSet<&str>) -> Result<PathBuf> {
    let mut input = keep.iter().copied().collect::<Vec<_>>().join("\n");
    input.push('\n');
    let mut child = git
        .git()
        .args(["pack-objects", "-q"])
        .arg(pack_dir.join("pack"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running git pack-objects")?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child
        .wait_with_output()
        .context("running git pack-objects")?;
    let _ = writer.join();
    anyhow::ensure!(
        out.status.success(),
        "git pack-objects failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let new = String::from_utf8_lossy(&out.stdout).trim().to_string();
    Ok(pack_dir.join(format!("pack-{new}")))
}

fn git_out(git: &CacheGit, args: &[&str]) -> Result<String> {
    let mut cmd = git.git();
    // A repack or prune outlived by nobody: it holds git's locks in the store.
    crate::process::group::die_with_parent(&mut cmd);
    let out = cmd
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running git {}", args.join(" ")))?;
    anyhow::ensure!(
        out.status.success(),
        "git {} in {} failed: {}",
        args.join(" "),
        git.dir.display(),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
