//! `cache gc`: bound what one clone keeps under `<git-dir>/warmstart/`.
//!
//! The policy (README.md "Local state and `cache gc`"):
//! - a chunk file in `cache.git/chunks` that an installed key needs is never
//!   removed, whatever the budget says. What a key needs is recorded after
//!   each install (`<state>/cache/needs/<name>.json`, `installed`); a stamp
//!   without that record (an install made before it existed) is looked up
//!   in the `warmstart.json` of the stamp's commit in cache.git, and when
//!   neither can be read gc removes no chunk at all and says why;
//! - a chunk not fetched or used by an install within `keep` (default 14
//!   days; an install refreshes the mtime of every chunk it needs) goes;
//! - while the stores are still over the budget, the remaining chunks go,
//!   least recently used first;
//! - in cache.git and cache-meta.git, refs of cache branches no manifest
//!   names go, objects that neither a ref nor an installed key's commit
//!   reaches are dropped (also from promisor packs, which `git gc` keeps
//!   whole), and unreachable loose ones a day old are pruned;
//! - logs of steps restore.toml no longer names go after 30 days, and the
//!   background worker's appended log is cut to its last 256 KiB.
//!
//! Removal runs under the exclusive side of `<state>/cache.git.use.lock`:
//! a restore (and `cache verify`) holds the shared side while it may read a
//! chunk (`Reading`), so a chunk is never removed between a reader's check
//! and its read. Refs and objects are changed under each store's
//! `StoreLock`. A restore runs gc itself (`after_restore`) when the stores
//! pass `WARMSTART_GC_SIZE`, after its install, fail-open. This module never
//! touches an install, a stamp or the user's repository.

use anyhow::{Context, Result, anyhow};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashSet};
use std::fs::File;
use std::io::{IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use xshell::Shell;

use crate::cache::fetch::git::{CacheGit, STORE_LOCK_WAIT, StoreLock};
use crate::cache::format::BranchManifest;
use crate::cache::human_bytes;
use crate::cache::manifests;
use crate::cache::restore::branch::{Branch, Content};
use crate::cache::restore::stamp::{self, Loaded, Stamp};
use crate::cli::cache::GcArgs;
use crate::exit::{Code, fail};
use crate::repo::Repo;

/// The size of the stores past which a restore runs gc, and the budget of
/// `cache gc` (`WARMSTART_GC_SIZE` or `--max-size` change it).
pub const DEFAULT_SIZE: u64 = 4 << 30;
/// How long an unneeded chunk is kept after it was last fetched or used
/// (`WARMSTART_GC_KEEP` or `--keep`).
pub const DEFAULT_KEEP: Duration = Duration::from_secs(14 * 24 * 3600);
/// Logs of steps restore.toml no longer names go after this.
pub const LOG_AGE: Duration = Duration::from_secs(30 * 24 * 3600);
/// The worker's appended log is cut when over this size...
const WORKER_LOG_MAX: u64 = 1 << 20;
/// ...to its last this many bytes, once idle for `WORKER_LOG_IDLE`.
const WORKER_LOG_KEEP: u64 = 256 << 10;
const WORKER_LOG_IDLE: Duration = Duration::from_secs(600);
/// Loose objects younger than this stay: a publish writes its blobs before
/// any ref reaches them, and it does not take the use lock.
const LOOSE_GRACE: &str = "1.day.ago";
const NEEDS_FORMAT: u32 = 1;

/// The stores gc bounds, in `<state>`.
const STORES: [&str; 2] = ["cache.git", "cache-meta.git"];

/// `WARMSTART_GC_SIZE`, else the default.
pub fn size_setting() -> Result<u64> {
    Ok(crate::settings::size("WARMSTART_GC_SIZE")?.unwrap_or(DEFAULT_SIZE))
}

/// `WARMSTART_GC_KEEP`, else the default.
pub fn keep_setting() -> Result<Duration> {
    Ok(crate::settings::duration("WARMSTART_GC_KEEP")?.unwrap_or(DEFAULT_KEEP))
}

/// What one install needs from the chunk store: `<state>/cache/needs/<name>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    pub format: u32,
    pub name: String,
    /// The installed key and tar, as the stamp says (a record that does
    /// not match the stamp is stale).
    pub key: String,
    pub tar_sha256: String,
    pub commit: String,
    pub chunks: Vec<Need>,
}

/// One chunk: the digest its store file is named by, and its raw digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Need {
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_sha256: Option<String>,
    pub size: u64,
}

/// Where the record of cache `name`'s install lives.
pub fn needs_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("needs")
        .join(format!("{name}.json"))
}

/// After a completed install (the stamp is written): records which chunks
/// it needs and marks them used now. Never fails the restore: a record not
/// written only makes gc look the key up in cache.git, or keep every chunk.
pub fn installed(state_dir: &Path, s: &Stamp, branch: &Branch) {
    if let Err(e) = record(state_dir, s, branch) {
        eprintln!("warning: {e:#}; `cache gc` will keep every chunk it cannot account for");
    }
}

fn record(state_dir: &Path, s: &Stamp, branch: &Branch) -> Result<()> {
    let chunks = match &branch.content {
        Content::V1(bm) => needs_of(bm, &s.key),
        Content::Legacy { .. } => Vec::new(),
    };
    let chunk_dir = state_dir.join("cache.git").join("chunks");
    let now = SystemTime::now();
    for c in &chunks {
        // An mtime is how gc tells a recently used chunk: refresh it.
        if let Ok(f) = File::open(chunk_dir.join(&c.sha256)) {
            let _ = f.set_modified(now);
        }
    }
    let n = Needs {
        format: NEEDS_FORMAT,
        name: s.name.clone(),
        key: s.key.clone(),
        tar_sha256: s.tar_sha256.clone(),
        commit: s.commit.clone(),
        chunks,
    };
    let path = needs_path(state_dir, &s.name);
    let text = serde_json::to_string_pretty(&n).expect("needs serialize") + "\n";
    crate::restore::state::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("recording the chunks of {} in {}", s.key, path.display()))
}

fn needs_of(bm: &BranchManifest, key: &str) -> Vec<Need> {
    bm.keys
        .get(key)
        .map(|e| {
            e.chunks
                .iter()
                .map(|c| Need {
                    sha256: c.sha256.clone(),
                    raw_sha256: c.raw_sha256.clone(),
                    size: c.size,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The shared side of the use lock, held by a command while it may read a
/// chunk file; gc removes nothing while one is held.
pub struct Reading {
    _file: File,
}

fn use_lock_path(state_dir: &Path) -> PathBuf {
    state_dir.join("cache.git.use.lock")
}

fn open_use_lock(state_dir: &Path) -> Result<File> {
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating {}", state_dir.display()))?;
    let path = use_lock_path(state_dir);
    File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))
}

/// Waits at most `wait` for `try_lock`; `Ok(None)` when not had in time.
fn wait_for(
    file: &File,
    wait: Duration,
    try_lock: impl Fn(&File) -> Result<(), std::fs::TryLockError>,
) -> Result<Option<Duration>> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    loop {
        match try_lock(file) {
            Ok(()) => return Ok(Some(start.elapsed())),
            Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                std::thread::sleep(pause.min(wait.saturating_sub(start.elapsed())));
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => return Err(anyhow!(e)),
        }
    }
}

fn busy(state_dir: &Path, wait: Duration, who: &str) -> anyhow::Error {
    fail(
        Code::Busy,
        format!(
            "{} is held by {who} after {}: try again when it is done",
            use_lock_path(state_dir).display(),
            crate::clock::human(wait)
        ),
    )
}

impl Reading {
    /// Waits at most `wait` for a running gc (exit 3 after that).
    pub fn take(state_dir: &Path, wait: Duration) -> Result<Reading> {
        let file = open_use_lock(state_dir)?;
        match wait_for(&file, wait, File::try_lock_shared)? {
            Some(_) => Ok(Reading { _file: file }),
            None => Err(busy(state_dir, wait, "a running `cache gc`")),
        }
    }
}

/// The exclusive side, and how long it took to get.
fn exclusive(state_dir: &Path, wait: Duration) -> Result<Option<(File, Duration)>> {
    let file = open_use_lock(state_dir)?;
    Ok(wait_for(&file, wait, File::try_lock)?.map(|waited| (file, waited)))
}

/// Bytes of every file under the stores: a stat per file, no hashing.
pub fn store_size(state_dir: &Path) -> u64 {
    STORES.iter().map(|s| tree_size(&state_dir.join(s))).sum()
}

fn tree_size(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_size(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

/// One chunk file of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkFile {
    pub name: String,
    pub size: u64,
    /// Last fetched or used (mtime), epoch ms.
    pub used_ms: u64,
}

/// What `choose` needs to know.
#[derive(Clone, Debug)]
pub struct Budget {
    pub now_ms: u64,
    pub keep_ms: u64,
    /// The stores' size limit.
    pub max_bytes: u64,
    /// Bytes of the stores that are not chunk files.
    pub other_bytes: u64,
}

/// The chunks to remove (indices into `chunks`), pure: every one not in
/// `protected` that was not used within `keep_ms`, then, while the stores
/// are over `max_bytes`, the unprotected rest least recently used first
/// (by name on a tie). A protected chunk is never chosen.
pub fn choose(chunks: &[ChunkFile], protected: &HashSet<String>, b: &Budget) -> Vec<usize> {
    let mut total = b.other_bytes + chunks.iter().map(|c| c.size).sum::<u64>();
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if protected.contains(&c.name) {
            continue;
        }
        if b.now_ms.saturating_sub(c.used_ms) > b.keep_ms {
            total -= c.size;
            out.push(i);
        } else {
            rest.push(i);
        }
    }
    rest.sort_by(|&x, &y| {
        (chunks[x].used_ms, &chunks[x].name).cmp(&(chunks[y].used_ms, &chunks[y].name))
    });
    for i in rest {
        if total <= b.max_bytes {
            break;
        }
        total -= chunks[i].size;
        out.push(i);
    }
    out.sort_unstable();
    out
}

/// The chunk files of the store (64 lower-case hex digits; partial files
/// and anything else are not gc's).
fn list_chunks(dir: &Path) -> Result<Vec<ChunkFile>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_digest = name.len() == 64
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let Ok(m) = e.metadata() else { continue };
        if !is_digest || !m.is_file() {
            continue;
        }
        let used_ms = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        out.push(ChunkFile {
            name,
            size: m.len(),
            used_ms,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What the installed keys need: digests, or why it cannot be told.
struct Protected {
    digests: HashSet<String>,
    /// Installs whose chunks could not be told (gc then removes no chunk).
    unknown: Vec<String>,
    /// Records of installs that no stamp describes any more.
    stale: Vec<PathBuf>,
}

fn protected(state_dir: &Path, git: Option<&CacheGit>) -> Result<Protected> {
    let mut p = Protected {
        digests: HashSet::new(),
        unknown: Vec::new(),
        stale: Vec::new(),
    };
    let mut names = BTreeSet::new();
    let stamps = stamp::dir(state_dir);
    for e in read_dir_or_empty(&stamps)? {
        let path = e.path();
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        names.insert(name.to_string());
        let s = match stamp::load(&path) {
            Loaded::Found(s) => s,
            Loaded::Missing => continue,
            Loaded::Corrupt(_) => {
                p.unknown.push(format!("{name} (its stamp does not read)"));
                continue;
            }
        };
        match needs_for(state_dir, &s, git) {
            Some(needs) => {
                for n in needs {
                    p.digests.extend(n.raw_sha256);
                    p.digests.insert(n.sha256);
                }
            }
            None => p.unknown.push(format!(
                "{name} (key {}: no record of its chunks, and commit {} is not in cache.git; restore it once with `{} cache restore {name} --verify`)",
                s.key,
                &s.commit[..s.commit.len().min(12)],
                crate::invocation::command()
            )),
        }
    }
    let needs_dir = state_dir.join("cache").join("needs");
    for e in read_dir_or_empty(&needs_dir)? {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".json")
            && !names.contains(name)
        {
            p.stale.push(e.path());
        }
    }
    Ok(p)
}

fn read_dir_or_empty(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd.flatten().collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    }
}

/// The chunks stamp `s`'s install needs: its record when it matches the
/// stamp, else the `warmstart.json` of its commit in cache.git.
fn needs_for(state_dir: &Path, s: &Stamp, git: Option<&CacheGit>) -> Option<Vec<Need>> {
    if s.layout != "v1" {
        // Legacy archives are read from cache.git's objects, never the store.
        return Some(Vec::new());
    }
    let recorded = std::fs::read_to_string(needs_path(state_dir, &s.name))
        .ok()
        .and_then(|t| serde_json::from_str::<Needs>(&t).ok())
        .filter(|n| n.format == NEEDS_FORMAT && n.key == s.key && n.tar_sha256 == s.tar_sha256);
    if let Some(n) = recorded {
        return Some(n.chunks);
    }
    let out = git?
        .git()
        .args(["cat-file", "blob", &format!("{}:warmstart.json", s.commit)])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let bm = BranchManifest::parse(&String::from_utf8_lossy(&out.stdout)).ok()?;
    // The tar's digest ties the entry to the install the stamp describes.
    bm.keys
        .get(&s.key)
        .filter(|e| e.tar_sha256 == s.tar_sha256)?;
    Some(needs_of(&bm, &s.key))
}

/// What gc did (or, with `--dry-run`, would do): the `--json` document.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub dry_run: bool,
    /// The budget and the keep window that applied.
    pub max_bytes: u64,
    pub keep: String,
    /// The stores' size before and after.
    pub before_bytes: u64,
    pub after_bytes: u64,
    pub chunks: ChunkReport,
    pub stores: Vec<StoreReport>,
    pub logs: LogReport,
    /// How long gc waited for readers (restores) to finish.
    pub lock_wait_ms: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct ChunkReport {
    pub kept: u64,
    pub kept_bytes: u64,
    /// Of the kept: chunks an installed key needs.
    pub protected: u64,
    pub protected_bytes: u64,
    pub removed: u64,
    pub removed_bytes: u64,
    /// Installs whose chunks could not be told: no chunk was removed.
    pub unknown_installs: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct StoreReport {
    pub store: String,
    /// Refs of branches that no manifest names any more.
    pub refs_dropped: Vec<String>,
    pub objects_dropped: u64,
    pub before_bytes: u64,
    pub after_bytes: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct LogReport {
    pub removed: Vec<PathBuf>,
    pub trimmed: Vec<PathBuf>,
}

/// How one gc runs.
#[derive(Clone, Debug)]
pub struct Options {
    pub max_bytes: u64,
    pub keep: Duration,
    pub dry_run: bool,
    /// How long to wait for restores that are reading the store.
    pub wait: Duration,
    pub progress: bool,
}

/// `cargo xtask cache gc`.
pub fn run(sh: &Shell, args: GcArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let keep = match &args.keep {
        Some(t) => crate::clock::parse_duration(t)
            .map_err(|e| fail(Code::Usage, format!("--keep {t:?}: {e}")))?,
        None => keep_setting()?,
    };
    let opts = Options {
        max_bytes: match args.max_size {
            Some(n) => n,
            None => size_setting()?,
        },
        keep,
        dry_run: args.dry_run,
        wait: crate::settings::duration("WARMSTART_LOCK_TIMEOUT")?.unwrap_or(STORE_LOCK_WAIT),
        progress: !args.out.quiet() && !args.out.json && std::io::stderr().is_terminal(),
    };
    let r = gc(sh, &repo, &opts)?;
    if args.out.json {
        crate::contract::document(&r);
    } else if !args.out.quiet() {
        for line in r.lines() {
            println!("{line}");
        }
    }
    Ok(())
}

/// Runs gc on `repo`'s state: waits for readers, then chunks, stores, logs.
pub fn gc(sh: &Shell, repo: &Repo, opts: &Options) -> Result<Report> {
    let state_dir = repo.state_dir();
    let spin = if opts.progress {
        crate::progress::spinner("cache gc: waiting for restores that read the store")
    } else {
        crate::progress::hidden()
    };
    let Some((_lock, waited)) = exclusive(&state_dir, opts.wait)? else {
        return Err(busy(&state_dir, opts.wait, "a running restore or verify"));
    };
    test_pause();
    spin.set_message("cache gc");
    let mut r = Report {
        dry_run: opts.dry_run,
        max_bytes: opts.max_bytes,
        keep: crate::clock::human(opts.keep),
        before_bytes: store_size(&state_dir),
        lock_wait_ms: waited.as_millis() as u64,
        ..Report::default()
    };
    let branches = manifest_branches(repo);
    for name in STORES {
        let dir = state_dir.join(name);
        if dir.join("HEAD").is_file() {
            let git = open_store(sh, repo, name)?;
            r.stores
                .push(collect_objects(&git, name, branches.as_ref(), opts)?);
        }
    }
    let git = state_dir
        .join("cache.git/HEAD")
        .is_file()
        .then(|| open_store(sh, repo, "cache.git"))
        .transpose()?;
    r.chunks = collect_chunks(&state_dir, git.as_ref(), opts, &r)?;
    r.logs = collect_logs(repo, opts)?;
    r.after_bytes = if opts.dry_run {
        r.before_bytes.saturating_sub(r.chunks.removed_bytes)
    } else {
        store_size(&state_dir)
    };
    spin.finish_and_clear();
    Ok(r)
}

/// A pause with the lock held, so that tests can start a restore inside gc.
fn test_pause() {
    if let Ok(Some(d)) = crate::settings::millis("WARMSTART_TEST_GC_PAUSE_MS") {
        std::thread::sleep(d);
    }
}

fn open_store(sh: &Shell, repo: &Repo, name: &str) -> Result<CacheGit> {
    Ok(match name {
        "cache.git" => CacheGit::open(sh, repo)?,
        _ => CacheGit::open_meta(sh, repo)?,
    })
}

/// The branch of every manifest, or `None` when one does not load (then no
/// ref is dropped: a typo in a manifest must not cost a cache).
fn manifest_branches(repo: &Repo) -> Option<BTreeSet<String>> {
    let names = manifests::names(repo).ok()?;
    names
        .iter()
        .map(|n| manifests::load(repo, n).ok().map(|m| m.branch))
        .collect()
}

fn collect_chunks(
    state_dir: &Path,
    git: Option<&CacheGit>,
    opts: &Options,
    r: &Report,
) -> Result<ChunkReport> {
    let dir = state_dir.join("cache.git").join("chunks");
    let chunks = list_chunks(&dir)?;
    let p = protected(state_dir, git)?;
    let chunk_bytes: u64 = chunks.iter().map(|c| c.size).sum();
    let stores_now = if opts.dry_run {
        r.before_bytes
    } else {
        store_size(state_dir)
    };
    let budget = Budget {
        now_ms: crate::clock::now_ms(),
        keep_ms: opts.keep.as_millis() as u64,
        max_bytes: opts.max_bytes,
        other_bytes: stores_now.saturating_sub(chunk_bytes),
    };
    let gone = if p.unknown.is_empty() {
        choose(&chunks, &p.digests, &budget)
    } else {
        Vec::new()
    };
    let mut out = ChunkReport {
        unknown_installs: p.unknown,
        ..ChunkReport::default()
    };
    let gone_set: HashSet<usize> = gone.iter().copied().collect();
    for (i, c) in chunks.iter().enumerate() {
        if gone_set.contains(&i) {
            if !opts.dry_run {
                remove_file(&dir.join(&c.name))?;
            }
            out.removed += 1;
            out.removed_bytes += c.size;
        } else {
            out.kept += 1;
            out.kept_bytes += c.size;
            if p.digests.contains(&c.name) {
                out.protected += 1;
                out.protected_bytes += c.size;
            }
        }
    }
    if !opts.dry_run {
        for f in p.stale {
            remove_file(&f)?;
        }
    }
    Ok(out)
}

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow!(e).context(format!("removing {}", path.display()))),
    }
}

/// Refs of gone branches, unreachable objects (promisor packs included)
/// and old unreachable loose objects of one store, under its `StoreLock`.
fn collect_objects(
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
    let mut packs = Vec::new();
    for e in read_dir_or_empty(&pack_dir)? {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "promisor") && !p.with_extension("keep").exists() {
            packs.push(p.with_extension(""));
        }
    }
    if packs.is_empty() {
        return Ok(0);
    }
    let mut held = BTreeSet::new();
    for p in &packs {
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
    let new_base = pack_dir.join(format!("pack-{new}"));
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

fn git_out(git: &CacheGit, args: &[&str]) -> Result<String> {
    let out = git
        .git()
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

/// Logs of steps restore.toml no longer names, older than `LOG_AGE`, and
/// the worker's appended log cut to its tail. Nothing goes when
/// restore.toml does not load (a typo must not cost the logs).
fn collect_logs(repo: &Repo, opts: &Options) -> Result<LogReport> {
    let dir = repo.state_dir().join("logs");
    let mut r = LogReport::default();
    let steps: Option<BTreeSet<String>> = if crate::restore::plan::path_of(repo).is_file() {
        crate::restore::plan::load(repo)
            .ok()
            .map(|p| p.steps.into_iter().map(|s| s.name).collect())
    } else {
        Some(BTreeSet::new())
    };
    for e in read_dir_or_empty(&dir)? {
        let path = e.path();
        let file = e.file_name().to_string_lossy().into_owned();
        let Ok(m) = e.metadata() else { continue };
        if !m.is_file() {
            continue;
        }
        let idle = m.modified().ok().and_then(|t| t.elapsed().ok());
        if file == "restore-worker.log" {
            if m.len() > WORKER_LOG_MAX && idle.is_some_and(|d| d > WORKER_LOG_IDLE) {
                if !opts.dry_run {
                    trim_tail(&path, WORKER_LOG_KEEP)?;
                }
                r.trimmed.push(path);
            }
            continue;
        }
        let step = file
            .strip_suffix(".service.log")
            .or_else(|| file.strip_suffix(".log"));
        let (Some(step), Some(steps)) = (step, steps.as_ref()) else {
            continue;
        };
        if !steps.contains(step) && idle.is_some_and(|d| d > LOG_AGE) {
            if !opts.dry_run {
                remove_file(&path)?;
            }
            r.removed.push(path);
        }
    }
    Ok(r)
}

/// Keeps the last `keep` bytes of `path` (from a line start), atomically.
fn trim_tail(path: &Path, keep: u64) -> Result<()> {
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = f.metadata()?.len();
    f.seek(SeekFrom::Start(len.saturating_sub(keep)))?;
    let mut tail = Vec::new();
    f.read_to_end(&mut tail)
        .with_context(|| format!("reading {}", path.display()))?;
    let start = tail.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
    let mut text = b"[older lines removed by cache gc]\n".to_vec();
    text.extend_from_slice(&tail[start..]);
    crate::restore::state::write_atomic(path, &text)
}

impl Report {
    /// The text report.
    pub fn lines(&self) -> Vec<String> {
        let (verb, kept) = if self.dry_run {
            ("would remove", "would keep")
        } else {
            ("removed", "kept")
        };
        let c = &self.chunks;
        let mut out = vec![format!(
            "cache gc: {verb} {} chunk{} ({}); {kept} {} ({}), {} of them ({}) needed by installed keys",
            c.removed,
            if c.removed == 1 { "" } else { "s" },
            human_bytes(c.removed_bytes),
            c.kept,
            human_bytes(c.kept_bytes),
            c.protected,
            human_bytes(c.protected_bytes)
        )];
        for u in &c.unknown_installs {
            out.push(format!("  kept every chunk: cannot tell what {u} needs"));
        }
        for s in &self.stores {
            let refs = if s.refs_dropped.is_empty() {
                String::new()
            } else {
                format!(
                    "; {} refs of branches no manifest names: {}",
                    if self.dry_run {
                        "would drop"
                    } else {
                        "dropped"
                    },
                    s.refs_dropped.join(", ")
                )
            };
            out.push(format!(
                "  {}: objects {} -> {} ({} unreachable dropped){refs}",
                s.store,
                human_bytes(s.before_bytes),
                human_bytes(s.after_bytes),
                s.objects_dropped
            ));
        }
        for p in &self.logs.removed {
            out.push(format!("  {verb} old log {}", p.display()));
        }
        for p in &self.logs.trimmed {
            out.push(format!("  cut {} to its last lines", p.display()));
        }
        out.push(format!(
            "  stores: {} -> {} (budget {}; chunks no installed key needs stay {} after their last use)",
            human_bytes(self.before_bytes),
            human_bytes(self.after_bytes),
            human_bytes(self.max_bytes),
            self.keep
        ));
        out
    }
}

/// After a restore's install: gc when the stores passed `WARMSTART_GC_SIZE`
/// (a stat sum, no hashing), down to three quarters of it so that the next
/// restores do not run it again at once. Fail-open: one line on stderr when
/// it did something or failed, nothing when under the size; it never waits
/// for another restore that is reading the store.
pub fn after_restore(sh: &Shell, repo: &Repo) {
    let limit = match size_setting() {
        Ok(n) => n,
        Err(e) => return eprintln!("warning: automatic cache gc skipped: {e:#}"),
    };
    let size = store_size(&repo.state_dir());
    if size <= limit {
        return;
    }
    let opts = Options {
        max_bytes: limit / 4 * 3,
        keep: keep_setting().unwrap_or(DEFAULT_KEEP),
        dry_run: false,
        wait: Duration::ZERO,
        progress: false,
    };
    match gc(sh, repo, &opts) {
        Ok(r) if !crate::contract::quiet() => eprintln!(
            "cache gc: the stores passed WARMSTART_GC_SIZE ({}) at {}: removed {} unneeded chunks, now {}",
            human_bytes(limit),
            human_bytes(size),
            r.chunks.removed,
            human_bytes(r.after_bytes)
        ),
        Ok(_) => {}
        Err(e) if crate::exit::code_of(&e) == Code::Busy => eprintln!(
            "cache gc: the stores passed WARMSTART_GC_SIZE ({}), but another warmstart process of this clone is using them: the next restore runs gc",
            human_bytes(limit)
        ),
        Err(e) => eprintln!(
            "warning: automatic cache gc failed (the restore is done): {e:#}; run `{} cache gc`",
            crate::invocation::command()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for the property below.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n.max(1)
        }
    }

    #[test]
    fn choose_never_picks_a_protected_chunk_and_meets_the_budget_when_it_can() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let n = rng.below(30) as usize;
            let chunks: Vec<ChunkFile> = (0..n)
                .map(|i| ChunkFile {
                    name: format!("{i:064x}"),
                    size: 1 + rng.below(1000),
                    used_ms: rng.below(100_000),
                })
                .collect();
            let protected: HashSet<String> = chunks
                .iter()
                .filter(|_| rng.below(3) == 0)
                .map(|c| c.name.clone())
                .collect();
            let b = Budget {
                now_ms: 100_000,
                keep_ms: rng.below(120_000),
                max_bytes: rng.below(20_000),
                other_bytes: rng.below(2_000),
            };
            let gone = choose(&chunks, &protected, &b);
            let gone_set: HashSet<usize> = gone.iter().copied().collect();
            let mut left = b.other_bytes;
            let mut floor = b.other_bytes;
            for (i, c) in chunks.iter().enumerate() {
                let old = b.now_ms - c.used_ms > b.keep_ms;
                if protected.contains(&c.name) {
                    assert!(!gone_set.contains(&i), "a protected chunk was chosen");
                    floor += c.size;
                }
                if old && !protected.contains(&c.name) {
                    assert!(gone_set.contains(&i), "an old unneeded chunk stayed");
                }
                if !gone_set.contains(&i) {
                    left += c.size;
                }
            }
            if floor <= b.max_bytes {
                assert!(
                    left <= b.max_bytes,
                    "{left} > {} with floor {floor}",
                    b.max_bytes
                );
            }
            // Least recently used first: no kept unprotected chunk is older
            // than a recent one that went for the budget.
            let kept_oldest = chunks
                .iter()
                .enumerate()
                .filter(|(i, c)| !gone_set.contains(i) && !protected.contains(&c.name))
                .map(|(_, c)| c.used_ms)
                .min();
            for &i in &gone {
                let c = &chunks[i];
                if b.now_ms - c.used_ms <= b.keep_ms
                    && let Some(k) = kept_oldest
                {
                    assert!(c.used_ms <= k, "went {} kept {k}", c.used_ms);
                }
            }
        }
    }

    #[test]
    fn needs_records_round_trip() {
        let n = Needs {
            format: NEEDS_FORMAT,
            name: "art".into(),
            key: "art-1".into(),
            tar_sha256: "a".repeat(64),
            commit: "c".repeat(40),
            chunks: vec![Need {
                sha256: "b".repeat(64),
                raw_sha256: None,
                size: 3,
            }],
        };
        let text = serde_json::to_string(&n).unwrap();
        assert!(!text.contains("raw_sha256"), "{text}");
        assert_eq!(serde_json::from_str::<Needs>(&text).unwrap(), n);
    }
}
