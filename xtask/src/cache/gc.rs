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
//!
//! By job: `needs` is the record of what each install needs, `lock` the
//! use lock, `chunks` the choice and removal of chunk files, `stores` the
//! refs and objects of the private stores, `logs` the old logs.

mod chunks;
mod lock;
mod logs;
mod needs;
mod stores;

pub use lock::Reading;
pub use needs::installed;

use anyhow::{Result, anyhow};
use serde::Serialize;
use std::collections::BTreeSet;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::Duration;
use xshell::Shell;

use crate::cache::human_bytes;
use crate::cli::cache::GcArgs;
use crate::exit::{Code, fail};
use crate::git::STORE_LOCK_WAIT;
use crate::repo::Repo;
use chunks::collect_chunks;
use lock::{busy, exclusive};
use logs::collect_logs;
use stores::{collect_objects, manifest_branches, open_store};

/// The size of the stores past which a restore runs gc, and the budget of
/// `cache gc` (`WARMSTART_GC_SIZE` or `--max-size` change it).
pub const DEFAULT_SIZE: u64 = 4 << 30;
/// How long an unneeded chunk is kept after it was last fetched or used
/// (`WARMSTART_GC_KEEP` or `--keep-for`).
pub const DEFAULT_KEEP: Duration = Duration::from_secs(14 * 24 * 3600);

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

fn read_dir_or_empty(dir: &Path) -> Result<Vec<std::fs::DirEntry>> {
    match std::fs::read_dir(dir) {
        Ok(rd) => Ok(rd.flatten().collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    }
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

/// Asks the layer above for the steps restore.toml names, whose logs gc
/// keeps: the cache never reads restore.toml. It returns `None` when
/// restore.toml does not load (then no step log goes) and an empty set when
/// there is none. A function, not the names, so that a restore loads
/// restore.toml only when it does run gc.
pub type LiveSteps = fn(&Repo) -> Option<BTreeSet<String>>;

/// For callers that have no restore.toml to ask: every step log stays.
pub fn unknown_steps(_: &Repo) -> Option<BTreeSet<String>> {
    None
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
    /// The steps restore.toml names (`LiveSteps`): logs of any other step
    /// go once old; `None` keeps every step log.
    pub live_steps: Option<BTreeSet<String>>,
}

/// `cargo xtask cache gc`.
pub fn run(sh: &Shell, args: GcArgs, live_steps: LiveSteps) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let keep = match &args.keep_for {
        Some(t) => crate::clock::parse_duration(t)
            .map_err(|e| fail(Code::Usage, format!("--keep-for {t:?}: {e}")))?,
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
        live_steps: live_steps(&repo),
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

fn remove_file(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow!(e).context(format!("removing {}", path.display()))),
    }
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
pub fn after_restore(sh: &Shell, repo: &Repo, live_steps: LiveSteps) {
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
        live_steps: live_steps(repo),
    };
    match gc(sh, repo, &opts) {
        Ok(r) if !crate::out::quiet() => eprintln!(
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
