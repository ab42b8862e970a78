//! `cargo xtask cache restore`: fetch, verify, install atomically, stamp.
//!
//! The warm path (stamp matches the current key, target and mode, and the
//! manifest's ready-probe holds) returns before any lock, fetch or hash. The
//! cold path takes the target's lock (one restorer per target), re-checks
//! the stamp (a restorer that waited reuses the one that worked), completes
//! or undoes what a killed run left behind, fetches the branch shallow into
//! cache.git, streams it through `verify::stream` into a staging directory
//! beside the target, and only then swaps it in (`unpack::swap_dir`) or
//! merges it (`unpack::merge_into`, journaled), and writes the stamp.
//!
//! This module never writes into the target except through `unpack`'s swap
//! and merge, never installs a byte before every digest matched, and never
//! leaves a stamp that describes anything but a complete install.

pub mod branch;
pub mod compare;
pub mod delta;
pub mod overlay;
pub mod stamp;
pub mod verify;

use crate::cache::human_bytes;
use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{IsTerminal, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xshell::Shell;

use crate::cache::fetch::prefetch;
use crate::cache::format::manifest::{CacheManifest, Key, Mode, Ready};
use crate::cache::manifests;
use crate::cache::restore::branch::{Branch, Content, KeyPlan};
use crate::cache::restore::stamp::{Loaded, Miss, Stamp};
use crate::cli::cache::RestoreArgs;
use crate::clock;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote};
use crate::hex;
use crate::repo::Repo;
use crate::unpack;

/// How long a restorer waits for another one working on the same target,
/// unless `WARMSTART_LOCK_TIMEOUT` (`90s`, `5m`, or seconds) says otherwise.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(1800);

/// How `restore_named` runs.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Fetch from this remote (name or URL) instead of the manifest's.
    pub remote: Option<String>,
    /// Ignore the stamp: fetch, verify, and compare the installed copy with
    /// the cache; replace it only if it differs.
    pub verify: bool,
    /// Show progress bars (only ever on a terminal).
    pub progress: bool,
    /// Restore this branch key instead of the one the manifest's pins give
    /// (`cache restore --key`).
    pub key: Option<String>,
    /// Give up waiting for another restorer of the same target after this.
    pub lock_timeout: Duration,
    /// The steps restore.toml names, for the gc a restore may run.
    pub live_steps: crate::cache::gc::LiveSteps,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            remote: None,
            verify: false,
            progress: false,
            key: None,
            lock_timeout: lock_timeout_from_env(),
            live_steps: crate::cache::gc::unknown_steps,
        }
    }
}

/// `WARMSTART_LOCK_TIMEOUT`, else the default. A value that does not parse
/// never gets here: `settings::check_env` refused it (exit 10) at startup.
fn lock_timeout_from_env() -> Duration {
    crate::settings::duration("WARMSTART_LOCK_TIMEOUT")
        .ok()
        .flatten()
        .unwrap_or(DEFAULT_LOCK_TIMEOUT)
}

/// What a restore did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum State {
    /// The stamp matched and the ready-probe held: nothing was done.
    Warm,
    /// Fetched, verified and installed.
    Restored,
    /// Another restorer of the same target finished while this one waited
    /// for the lock; its install is used as is.
    Reused,
    /// `--verify`: the installed copy was compared with the verified cache
    /// and found identical; nothing was replaced.
    Verified,
    /// `--verify`: the installed copy differed and was replaced.
    Repaired,
    /// The branch lacks the exact key; a `[[restore.fallback]]` key stands
    /// in for it (installed now, or earlier and still within
    /// `restore.recheck`). `RestoreOutcome::partial` says which and how.
    Partial,
}

/// What a `partial` install stands in for (`--json`'s `partial`).
#[derive(Clone, Debug, Serialize)]
pub struct PartialInfo {
    /// The exact key today's pins give.
    pub wanted: String,
    /// The key installed in its place.
    pub used: String,
    /// The fallback that matched (`drop src`, `prefix vc-`).
    pub fallback: String,
    /// The key parts that differ.
    pub differs: Vec<crate::cache::format::fallback::PartDiff>,
    /// When the next run looks for the exact key again (RFC 3339).
    pub recheck_after: String,
}

/// Time spent in each phase of a cold restore, in milliseconds.
///
/// `fetch_ms` is the branch fetch (commit, tree, small files: big chunks
/// are left out); the chunks are fetched by id during `unpack_ms`, which
/// `chunk_fetch_ms` (time spent fetching chunks, overlapping the unpack)
/// and `chunk_wait_ms` (time the unpack waited for a chunk) break down.
///
/// `--json` prints them as `timings_ms` without the `_ms` suffixes (the
/// contract's one convention for a breakdown, README.md "JSON output").
#[derive(Clone, Debug, Default, Serialize)]
pub struct Phases {
    #[serde(rename = "lock_wait")]
    pub lock_wait_ms: u64,
    #[serde(rename = "fetch")]
    pub fetch_ms: u64,
    /// The trust check between the branch fetch and the first chunk
    /// (reading the trust root, `ssh-keygen` verify); 0 with policy off.
    /// Kept in microseconds here; `--json` rounds it to milliseconds.
    #[serde(rename = "trust", serialize_with = "crate::contract::micros_as_ms")]
    pub trust_us: u64,
    #[serde(rename = "unpack")]
    pub unpack_ms: u64,
    #[serde(rename = "chunk_fetch")]
    pub chunk_fetch_ms: u64,
    #[serde(rename = "chunk_wait")]
    pub chunk_wait_ms: u64,
    #[serde(rename = "install")]
    pub install_ms: u64,
}

/// The result of `restore_named`, also printed by `--json`.
#[derive(Clone, Debug, Serialize)]
pub struct RestoreOutcome {
    pub name: String,
    pub state: State,
    pub key: String,
    pub target: PathBuf,
    pub mode: &'static str,
    pub branch: String,
    /// The remote the install came from (for warm runs: the one recorded
    /// in the stamp), as people read it; `--json` gives `remote: {name, url}`.
    #[serde(rename = "remote", serialize_with = "crate::contract::shown_remote")]
    pub source: String,
    pub commit: String,
    /// `v1`, `legacy-gzip` or `legacy-zstd`.
    pub layout: String,
    /// Uncompressed tar bytes unpacked (0 when nothing was unpacked).
    #[serde(rename = "tar_bytes")]
    pub bytes: u64,
    /// Compressed chunk bytes read (from cache.git or its chunk store).
    pub compressed_bytes: u64,
    /// How the chunks reached cache.git: `present` (with the branch fetch,
    /// or from an earlier run), `byid` (fetched one by one while unpacking),
    /// `refetch` (the server refuses objects by id: the branch was fetched
    /// whole); `null` when nothing was unpacked.
    pub chunk_source: Option<prefetch::Source>,
    /// What the machine had and what was fetched: `chunks_reused`,
    /// `chunks_from_clone`, `chunks_fetched`, `bytes_fetched` (issue 18).
    #[serde(flatten)]
    pub reuse: prefetch::Reuse,
    /// Of those, chunks read straight from the pack a remote on this
    /// machine sent, without `git fetch` (see `cache::fetch::direct`).
    pub chunks_direct: u64,
    /// Why the rest of the chunks went through `git fetch` after all
    /// (the server's answer was not what the direct reader handles), or
    /// why it was skipped (an ssh remote, a `url.*` setting); `null` when
    /// it read every chunk or none had to be fetched.
    pub direct_fallback: Option<String>,
    /// Entries installed (files, directories, links), as the stamp records
    /// (`entries` in JSON, as verify, publish and demo say).
    #[serde(rename = "entries")]
    pub files: u64,
    /// Bytes that went through sha256 in this run: 0 on the warm path.
    pub bytes_hashed: u64,
    /// `ssh-keygen` signature checks in this run: 0 on the warm path.
    pub signature_checks: u64,
    /// The trust policy and this key's verdict (null when warm or reused).
    pub trust: Option<crate::trust::Checked>,
    pub duration_ms: u64,
    #[serde(skip)]
    pub duration: Duration,
    #[serde(rename = "timings_ms")]
    pub phases: Phases,
    /// With `--verify`: the first difference found in the installed copy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<String>,
    /// Why the stamp did not make this run warm (`None` when warm, reused
    /// or with `--verify`), e.g. `installed key tc-1 differs: v 1 -> 2`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// With state `partial`: the exact key, the one used, what differs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialInfo>,
    /// Overlay mode, when something was unpacked: files kept because the
    /// user changed them since warmstart installed them (or made them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<u64>,
    /// The delta install (replace mode, `cache::restore::delta`).
    #[serde(flatten)]
    pub delta: DeltaInfo,
}

/// What a delta install of a new key over an installed one saved (all 0
/// when none was made), in `--json` beside the fetch counters.
#[derive(Clone, Debug, Default, Serialize)]
pub struct DeltaInfo {
    /// Files hardlinked (or reflinked) from the installed tree instead of
    /// written, and their bytes: what this install did not write.
    pub files_linked: u64,
    pub bytes_linked: u64,
    /// Chunks of the key that were not decoded at all.
    pub chunks_skipped: u64,
    /// Why a delta was possible but a full install was made instead
    /// (`null` when not).
    pub delta_fallback: Option<String>,
}

impl DeltaInfo {
    fn of(report: &Option<delta::Report>, fallback: Option<String>) -> DeltaInfo {
        let r = report.clone().unwrap_or_default();
        DeltaInfo {
            files_linked: r.files_linked,
            bytes_linked: r.bytes_linked,
            chunks_skipped: r.chunks_total.saturating_sub(r.chunks_decoded),
            delta_fallback: fallback,
        }
    }
}

/// `cargo xtask cache restore NAME`.
pub fn run(sh: &Shell, args: RestoreArgs, live_steps: crate::cache::gc::LiveSteps) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let opts = RestoreOptions {
        remote: args.remote,
        verify: args.verify,
        key: args.key,
        progress: !args.out.quiet() && !args.out.json && std::io::stderr().is_terminal(),
        live_steps,
        ..RestoreOptions::default()
    };
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let outcome = restore_named(sh, &repo, &args.name, &opts)?;
    if args.out.json {
        crate::contract::document(&outcome);
    } else if !args.out.quiet() {
        if let Some(note) = outcome.trust.as_ref().and_then(|t| t.note.as_ref()) {
            println!("{note}");
        }
        println!("{}", outcome.summary());
    }
    Ok(())
}

impl RestoreOutcome {
    /// `; kept 2 files the user changed` (overlay mode), else nothing.
    fn kept_words(&self) -> String {
        match self.kept {
            Some(n) if n > 0 => format!(
                "; kept {n} file{} the user changed since warmstart installed {}",
                if n == 1 { "" } else { "s" },
                if n == 1 { "it" } else { "them" }
            ),
            _ => String::new(),
        }
    }

    /// `; fetched 3 chunks (1.2 MiB), reused 37 (12 from the repository)`
    /// when chunks were read, else nothing.
    pub fn fetch_words(&self) -> String {
        let r = &self.reuse;
        if r.chunks_fetched + r.chunks_reused == 0 {
            return String::new();
        }
        let clone = match r.chunks_from_clone {
            0 => String::new(),
            n => format!(" ({n} from the repository)"),
        };
        format!(
            "; fetched {} chunk{} ({}), reused {}{clone}",
            r.chunks_fetched,
            if r.chunks_fetched == 1 { "" } else { "s" },
            human_bytes(r.bytes_fetched),
            r.chunks_reused
        )
    }

    /// `; linked 990 unchanged files (1.2 MB) from the installed tree`.
    fn linked_words(&self) -> String {
        match self.delta.files_linked {
            0 => String::new(),
            n => format!(
                "; linked {n} unchanged file{} ({}) from the installed tree",
                if n == 1 { "" } else { "s" },
                human_bytes(self.delta.bytes_linked)
            ),
        }
    }

    /// One line for people.
    pub fn summary(&self) -> String {
        let t = self.target.display();
        let secs = clock::human(self.duration);
        let from = format!(
            "{} {}@{}",
            self.source,
            self.branch,
            &self.commit[..self.commit.len().min(12)]
        );
        match self.state {
            State::Warm => format!(
                "cache {}: {} is installed at {t} (warm, {secs})",
                self.name, self.key
            ),
            State::Reused => format!(
                "cache {}: {} was installed at {t} by another restore while this one waited ({secs})",
                self.name, self.key
            ),
            State::Restored => format!(
                "cache {}: restored {} into {t}: {} in {} entries from {from} in {secs}{}{}{}",
                self.name,
                self.key,
                human_bytes(self.bytes),
                self.files,
                self.fetch_words(),
                self.kept_words(),
                self.linked_words()
            ),
            State::Verified => format!(
                "cache {}: the installed copy of {} at {t} matches {from} ({secs})",
                self.name, self.key
            ),
            State::Repaired => format!(
                "cache {}: the installed copy of {} at {t} differed ({}); replaced it from {from} in {secs}{}{}",
                self.name,
                self.key,
                self.difference.as_deref().unwrap_or("?"),
                self.fetch_words(),
                self.kept_words()
            ),
            State::Partial => {
                let p = self.partial.as_ref();
                format!(
                    "cache {}: {} stands in for {} at {t} (partial: {}; fallback {}; the exact key is looked for again after {}) ({secs})",
                    self.name,
                    self.key,
                    p.map_or("?", |p| &p.wanted),
                    p.map_or_else(|| "?".to_string(), |p| describe_differs(&p.differs)),
                    p.map_or("?", |p| &p.fallback),
                    p.map_or("?", |p| &p.recheck_after),
                )
            }
        }
    }
}

/// Restores cache `name` of `repo`: a no-op when warm, else fetch, verify
/// and install. The API `cargo xtask restore`'s `cache` steps call.
pub fn restore_named(
    sh: &Shell,
    repo: &Repo,
    name: &str,
    opts: &RestoreOptions,
) -> Result<RestoreOutcome> {
    let start = Instant::now();
    let started_ms = clock::now_ms();
    let m = manifests::load(repo, name)?;
    let key = match &opts.key {
        // Its parts are known once the branch is read (`cold`).
        Some(k) => {
            crate::cache::format::check_key(k)
                .map_err(|e| fail(Code::Usage, format!("--key: {e:#}")))?;
            Key {
                value: k.clone(),
                parts: Vec::new(),
            }
        }
        None => manifests::compute_key(sh, repo, &m)?,
    };
    let state_dir = repo.state_dir();
    let stamp_file = stamp::path(&state_dir, name);

    let mut reason = None;
    if !opts.verify {
        match warm_check(&m, &key, &stamp_file, true)? {
            Ok(s) => return Ok(from_stamp(&m, &s, State::Warm, start, Phases::default())),
            Err(miss) => reason = Some(miss.to_string()),
        }
    }

    let (_lock, waited) = lock_target(&state_dir, &m.restore_path, opts.lock_timeout)?;
    let phases = Phases {
        lock_wait_ms: waited.as_millis() as u64,
        ..Phases::default()
    };
    // Another restorer may have installed this key while we waited: use
    // its result (with --verify, only if it finished after we started).
    if let Ok(s) = warm_check(&m, &key, &stamp_file, true)?
        && (!opts.verify || s.restored_at_ms >= started_ms)
    {
        return Ok(from_stamp(&m, &s, State::Reused, start, phases));
    }
    // A damaged cache.git is rebuilt once and the restore starts over
    // (`git::healing`); nothing was installed by the failed attempt.
    // `cache gc` removes no chunk while this restore may read one.
    let reading = crate::cache::gc::Reading::take(&state_dir, opts.lock_timeout)?;
    let mut outcome =
        crate::git::healing(|| cold(sh, repo, &m, &key, &stamp_file, opts, start, phases.clone()))
            .with_context(|| format!("restoring cache {name} into {}", m.restore_path.display()))?;
    drop(reading);
    crate::cache::gc::after_restore(sh, repo, opts.live_steps);
    outcome.reason = reason;
    Ok(outcome)
}

/// Whether cache `name` is installed for its current key, without doing
/// anything: `Ok(Ok((stamp, partial)))` when warm (`partial` when a
/// fallback key stands in), `Ok(Err(why))` when a restore would
/// work. Read-only: it computes the key (git pins run `git rev-parse`),
/// reads the stamp and runs the ready-probe; no lock, no fetch, no hashing,
/// no write (a corrupt stamp is only reported: `restore_named` sets it
/// aside). The probe `cargo xtask restore`'s `cache` steps use.
pub fn is_warm(
    sh: &Shell,
    repo: &Repo,
    name: &str,
) -> Result<Result<(Stamp, Option<PartialInfo>), String>> {
    let m = manifests::load(repo, name)?;
    let key = manifests::compute_key(sh, repo, &m)?;
    let file = stamp::path(&repo.state_dir(), name);
    Ok(warm_check(&m, &key, &file, false)?
        .map(|s| {
            let partial = partial_info(&m, &s);
            (s, partial)
        })
        .map_err(|miss| miss.to_string()))
}

/// The stamp, if it makes the current restore warm; else why not. With
/// `set_aside`, a corrupt stamp is moved aside (with a warning) and counts
/// as missing, so the restore that follows writes a good one; without, it
/// is only reported (`Miss::Corrupt`) and nothing is written.
fn warm_check(
    m: &CacheManifest,
    key: &Key,
    file: &Path,
    set_aside: bool,
) -> Result<Result<Stamp, Miss>> {
    let s = match stamp::load(file) {
        Loaded::Missing => return Ok(Err(Miss::NoStamp)),
        Loaded::Corrupt(e) if !set_aside => return Ok(Err(Miss::Corrupt(format!("{e:#}")))),
        Loaded::Corrupt(e) => {
            let aside = stamp::set_aside(file, clock::now_ms())?;
            eprintln!(
                "warning: {e:#}; moved it to {} and restoring from scratch",
                aside.display()
            );
            return Ok(Err(Miss::NoStamp));
        }
        Loaded::Found(s) => *s,
    };
    if let Some(p) = &s.partial
        && p.wanted == key.value
    {
        // A stand-in for today's key: warm until the recheck is due (a
        // clock read, no network), then the cold path looks again.
        if let Err(miss) = s.matches(&s.key, &s.key_parts, &m.restore_path, m.mode) {
            return Ok(Err(miss));
        }
        let recheck = m.recheck.unwrap_or_default().as_millis() as u64;
        if clock::now_ms().saturating_sub(p.checked_at_ms) >= recheck {
            return Ok(Err(Miss::Recheck {
                installed: s.key.clone(),
                wanted: p.wanted.clone(),
            }));
        }
        return Ok(ready(m).map(|()| s).map_err(Miss::NotReady));
    }
    if let Err(miss) = s.matches(&key.value, &key.parts, &m.restore_path, m.mode) {
        return Ok(Err(miss));
    }
    Ok(ready(m).map(|()| s).map_err(Miss::NotReady))
}

/// `src 2 -> 1, platform ...`: how a stand-in differs from the exact key.
fn describe_differs(d: &[crate::cache::format::fallback::PartDiff]) -> String {
    d.iter()
        .map(|p| {
            format!(
                "{} {} -> {}",
                p.name,
                p.wanted.as_deref().unwrap_or("(none)"),
                p.used.as_deref().unwrap_or("(none)")
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `partial` of an outcome, from its stamp.
fn partial_info(m: &CacheManifest, s: &Stamp) -> Option<PartialInfo> {
    let p = s.partial.as_ref()?;
    let recheck = m.recheck.unwrap_or_default().as_millis() as u64;
    Some(PartialInfo {
        wanted: p.wanted.clone(),
        used: s.key.clone(),
        fallback: p.fallback.clone(),
        differs: crate::cache::format::fallback::differs(&p.wanted_parts, &s.key_parts),
        recheck_after: clock::rfc3339(p.checked_at_ms.saturating_add(recheck)),
    })
}

/// The manifest's cheap ready-probe. `Err` says what is missing.
pub fn ready(m: &CacheManifest) -> Result<(), String> {
    let target = &m.restore_path;
    match &m.ready {
        Ready::Exists => {
            if target.is_dir() {
                Ok(())
            } else {
                Err(format!("{} is not a directory", target.display()))
            }
        }
        Ready::Path(p) => {
            let path = target.join(p);
            match std::fs::symlink_metadata(&path) {
                Ok(_) => Ok(()),
                Err(_) => Err(format!("{} does not exist", path.display())),
            }
        }
        Ready::Command { argv, matches } => {
            let dir = if target.is_dir() {
                target.clone()
            } else {
                std::env::temp_dir()
            };
            let out = std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .current_dir(dir)
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .map_err(|e| format!("running {}: {e}", argv[0]))?;
            if !out.status.success() {
                return Err(format!("`{}` failed ({})", argv.join(" "), out.status));
            }
            if let Some(re) = matches
                && !re.is_match(&String::from_utf8_lossy(&out.stdout))
            {
                return Err(format!(
                    "the output of `{}` does not match /{}/",
                    argv.join(" "),
                    re.as_str()
                ));
            }
            Ok(())
        }
    }
}

fn from_stamp(
    m: &CacheManifest,
    s: &Stamp,
    state: State,
    start: Instant,
    phases: Phases,
) -> RestoreOutcome {
    let duration = start.elapsed();
    let partial = partial_info(m, s);
    let state = match state {
        State::Warm if partial.is_some() => State::Partial,
        other => other,
    };
    RestoreOutcome {
        name: m.name.clone(),
        state,
        key: s.key.clone(),
        target: s.target.clone(),
        mode: stamp::mode_name(m.mode),
        branch: s.branch.clone(),
        source: crate::redact::url(&s.source),
        commit: s.commit.clone(),
        layout: s.layout.clone(),
        bytes: 0,
        compressed_bytes: 0,
        chunk_source: None,
        reuse: prefetch::Reuse::default(),
        chunks_direct: 0,
        direct_fallback: None,
        files: s.files,
        bytes_hashed: 0,
        signature_checks: 0,
        trust: None,
        duration_ms: duration.as_millis() as u64,
        duration,
        phases,
        difference: None,
        reason: None,
        partial,
        kept: None,
        delta: DeltaInfo::default(),
    }
}

/// The lock file of a target: under the state directory (never beside the
/// target, where it would be a stray file), named by a digest of the path.
pub fn lock_path(state_dir: &Path, target: &Path) -> PathBuf {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(target.as_os_str().as_bytes());
    state_dir
        .join("cache")
        .join("locks")
        .join(format!("{}.lock", &hex::encode(&digest)[..16]))
}

/// Takes the exclusive OS lock of `target`, waiting up to `timeout`.
/// Returns the held lock and how long it waited.
fn lock_target(state_dir: &Path, target: &Path, timeout: Duration) -> Result<(File, Duration)> {
    let path = lock_path(state_dir, target);
    let dir = path.parent().expect("a lock path has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the restore lock {}", path.display()))?;
    let t = Instant::now();
    loop {
        match file.try_lock() {
            Ok(()) => break,
            Err(TryLockError::WouldBlock) => {
                if t.elapsed() >= timeout {
                    let mut holder = String::new();
                    let _ = file.read_to_string(&mut holder);
                    return Err(fail(
                        Code::Busy,
                        format!(
                            "another restore of {} ({}) still holds {} after {}: wait for it, or raise WARMSTART_LOCK_TIMEOUT",
                            target.display(),
                            holder.trim(),
                            path.display(),
                            clock::human(timeout)
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(TryLockError::Error(e)) => {
                return Err(anyhow!(e).context(format!("locking {}", path.display())));
            }
        }
    }
    // Who holds it, for the message of whoever waits too long.
    let _ = file.set_len(0);
    let _ = write!(file, "pid {}", std::process::id());
    Ok((file, t.elapsed()))
}

/// The merge journal of a cache (merge mode only).
pub fn journal_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("journals")
        .join(format!("{name}.journal"))
}

/// Removes a staging directory unless it was handed on (swapped or merged).
struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = unpack::remove_tree(&p);
        }
    }
}

/// A spinner (`crate::progress`) when `on`, else a hidden one.
pub fn spinner(on: bool, what: String) -> indicatif::ProgressBar {
    if on {
        crate::progress::spinner(what)
    } else {
        crate::progress::hidden()
    }
}

/// The bars of `unpack_into` when `on` (else hidden ones): the compressed
/// bytes fetched and verified, and the tar bytes unpacked, one above the
/// other, each with its own total (`verify::Plan::progress_totals`).
fn restore_bars(
    on: bool,
    totals: verify::Totals,
) -> (
    Option<indicatif::MultiProgress>,
    [indicatif::ProgressBar; 2],
) {
    if !on {
        return (None, [crate::progress::hidden(), crate::progress::hidden()]);
    }
    let stack = crate::progress::stack();
    let fetch = stack.add(crate::progress::bytes_bar(totals.compressed, "fetch"));
    let unpack = stack.add(match totals.tar {
        Some(len) => crate::progress::bytes_bar(len, "unpack"),
        None => crate::progress::bytes_count("unpack"),
    });
    (Some(stack), [fetch, unpack])
}

/// Fetches `m`'s branch into cache.git, without its big chunks (see
/// `CacheGit::try_fetch_branch`), and reads it (cross-checked). The chunks
/// of a v1 key are fetched by `unpack_into` as it reads them; the parts of
/// a legacy branch (no declared sizes) are fetched here.
pub fn fetch(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    remote: Option<&str>,
    progress: bool,
) -> Result<(CacheGit, Branch)> {
    let mut git = CacheGit::open(sh, repo)?;
    git.set_network(&m.network)?;
    let remote = git.resolve_remote(sh, remote.unwrap_or(&m.remote))?;
    let spin = spinner(progress, format!("fetching {} from {remote}", m.branch));
    let packs = git.pack_indexes();
    let commit = git.fetch_branch(&remote, &m.branch);
    spin.finish_and_clear();
    let commit = commit?;
    fetch_metadata(&git, &remote, &m.branch, &commit)?;
    let mut branch = Branch::read(&git, remote.clone(), &m.branch, commit)?;
    // What this fetch brought (it keeps its pack: `fetch.unpackLimit=1`),
    // so that chunks small enough to come with it count as fetched.
    let new_packs = git.pack_indexes();
    branch.fresh = git.objects_in_packs(new_packs.difference(&packs))?;
    if let Content::Legacy { parts, .. } = &branch.content {
        let oids: Vec<String> = branch
            .entries
            .iter()
            .filter(|e| e.kind == "blob" && e.size.is_none() && parts.contains(&e.name))
            .map(|e| e.oid.clone())
            .collect();
        if !oids.is_empty() {
            let spin = spinner(progress, format!("fetching the parts of {}", m.branch));
            let r = prefetch::fetch_all(&git, &remote, &m.branch, &oids);
            spin.finish_and_clear();
            r?;
            let commit = git.fetch_branch_local(&m.branch)?;
            let mut fresh = std::mem::take(&mut branch.fresh);
            fresh.extend(oids);
            branch = Branch::read(&git, remote, &m.branch, commit)?;
            branch.fresh = fresh;
        }
    }
    Ok((git, branch))
}

/// Fetches by id the branch's own files that its fetch left out for
/// their size (a `warmstart.json` of thousands of chunks can pass
/// `WARMSTART_FETCH_BLOB_LIMIT`), so that the branch can be read: one
/// `git fetch`, only when one is missing.
fn fetch_metadata(git: &CacheGit, remote: &Remote, branch: &str, commit: &str) -> Result<()> {
    const FILES: [&str; 3] = ["warmstart.json", "SHA256SUMS", "README.md"];
    let entries = git
        .ls_tree(commit)
        .with_context(|| format!("listing branch {branch}"))?;
    let missing: Vec<String> = entries
        .iter()
        .filter(|e| e.kind == "blob" && e.size.is_none() && FILES.contains(&e.name.as_str()))
        .map(|e| e.oid.clone())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    git.fetch_blobs(remote, &missing, &mut |_| {}).map_err(|e| {
        let why = match e {
            crate::git::BlobFetchError::Network { code, message } => {
                return fail(
                    code,
                    format!("cannot fetch the files of {branch} from {remote}: {message}"),
                );
            }
            crate::git::BlobFetchError::NotOnRemote => "the remote does not have them".to_string(),
            crate::git::BlobFetchError::Refused => "the server refuses objects by id".to_string(),
            crate::git::BlobFetchError::Failed(why) => why,
        };
        fail(
            Code::Remote,
            format!("cannot fetch the files of {branch} from {remote}: {why}"),
        )
    })
}

/// The advice on a damaged branch.
pub fn republish_fix(name: &str) -> String {
    format!(
        "the branch is damaged or was edited by hand; republish it with `{cmd} cache publish {name}`",
        cmd = crate::invocation::command(),
    )
}

/// Streams `kp` (a key of `branch`) through verification into the empty
/// directory `dest`, fetching the chunks that are neither in cache.git nor
/// in its chunk store from the remote `branch` was fetched from, while the
/// earlier ones are unpacked. Returns what was unpacked, what was hashed,
/// and what was fetched.
pub fn unpack_into(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    dest: &Path,
    progress: bool,
) -> Result<(unpack::Stats, verify::Stats, prefetch::Stats)> {
    stream_key(git, branch, kp, progress, |r| {
        unpack::extract_tar(r, dest, &kp.limits, &unpack::Options::default())
    })
}

/// Streams `kp` through verification into `consume` (the extractor, or a
/// delta install's writer), fetching chunks as `unpack_into` says.
pub fn stream_key<T>(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    progress: bool,
    consume: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<(T, verify::Stats, prefetch::Stats)> {
    let (_stack, [fetch_bar, unpack_bar]) = restore_bars(progress, kp.plan.progress_totals());
    let chunks = prefetch::Prefetch::start(git, &branch.remote, &branch.name, kp, &branch.fresh)?;
    let reader = git.clone();
    let oids = kp.oids.clone();
    let chunks_ref = &chunks;
    let mut open = move |i: usize| -> Result<verify::Opened> {
        Ok(match chunks_ref.wait(i)? {
            prefetch::At::Git => verify::Opened::unchecked(reader.read_blob(&oids[i])?),
            prefetch::At::Clone(oid) => {
                verify::Opened::unchecked(crate::cache::fetch::reuse::open_blob(&reader, &oid)?)
            }
            prefetch::At::Store(path) => verify::Opened {
                reader: Box::new(
                    std::fs::File::open(&path)
                        .with_context(|| format!("opening {}", path.display()))?,
                ),
                checked: true,
            },
        })
    };
    let on_progress = |phase: verify::Phase, n: u64| match phase {
        verify::Phase::Verified => fetch_bar.inc(n),
        verify::Phase::Unpacked => unpack_bar.inc(n),
    };
    let r = if kp.plan.pieces.is_empty() {
        // A delta install with nothing to decode (zstd refuses an empty
        // stream): the consumer reads nothing.
        consume(&mut std::io::empty()).map(|v| (v, verify::Stats::default()))
    } else {
        verify::stream(&kp.plan, &mut open, &on_progress, consume)
    };
    fetch_bar.finish_and_clear();
    unpack_bar.finish_and_clear();
    let fetched = chunks.stats();
    drop(chunks);
    r.map(|(u, v)| (u, v, fetched)).map_err(|e| {
        if crate::exit::code_of(&e) == Code::Unsafe {
            // The extractor names the entry; say where it came from and
            // what to do, keeping the exit code.
            fail(
                Code::Unsafe,
                format!(
                    "{e:#} ({}: nothing was installed; republish it from a tree without such entries)",
                    kp.plan.label
                ),
            )
        } else {
            e
        }
    })
}

/// The keys to try from `branch`, in order: the exact one alone, or (on an
/// exact miss, without `--key`) every key the `[[restore.fallback]]`
/// entries allow (`fallback::candidates`), each with the `Partial` its
/// stamp would record. A returned key has the parts the branch recorded
/// for it.
fn choose_keys(
    m: &CacheManifest,
    key: &Key,
    opts: &RestoreOptions,
    branch: &Branch,
) -> Result<Vec<(Key, Option<stamp::Partial>)>> {
    let fix = republish_fix(&m.name);
    let recorded = |k: &str| match &branch.content {
        Content::V1(bm) => bm.keys.get(k).map(|e| e.key_parts.clone()),
        Content::Legacy { .. } => None,
    };
    match branch.plan(&key.value, &fix) {
        Ok(_) => {
            // A key named by `--key` has the parts the branch recorded for it.
            let parts = match &opts.key {
                Some(_) => recorded(&key.value).unwrap_or_default(),
                None => key.parts.clone(),
            };
            let value = key.value.clone();
            Ok(vec![(Key { value, parts }, None)])
        }
        Err(e)
            if opts.key.is_none()
                && !m.fallbacks.is_empty()
                && crate::exit::code_of(&e) == Code::NotFound =>
        {
            let Content::V1(bm) = &branch.content else {
                return Err(e);
            };
            let found = crate::cache::format::fallback::candidates(&m.fallbacks, key, bm);
            if found.is_empty() {
                return Err(fail(
                    Code::NotFound,
                    format!(
                        "{e:#}; no [[restore.fallback]] of {} matches a key either",
                        m.file.display()
                    ),
                ));
            }
            let now = clock::now_ms();
            Ok(found
                .into_iter()
                .map(|c| {
                    let partial = stamp::Partial {
                        wanted: key.value.clone(),
                        wanted_parts: key.parts.clone(),
                        fallback: c.fallback.to_string(),
                        checked_at_ms: now,
                    };
                    let parts = recorded(&c.key).unwrap_or_default();
                    (
                        Key {
                            value: c.key,
                            parts,
                        },
                        Some(partial),
                    )
                })
                .collect())
        }
        Err(e) => Err(e),
    }
}

/// The key to install and its trust check, before any chunk is fetched
/// (DESIGN.md invariant 9). The exact key is installed or refused (exit 12
/// under `require`). Fallback candidates the policy refuses are skipped
/// with a warning and the next one is tried (issue 17); when every one is
/// refused, exit 12 names each with its verdict. Nothing is installed then.
fn choose_trusted(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    opts: &RestoreOptions,
    git: &CacheGit,
    branch: &Branch,
) -> Result<(KeyPlan, Key, Option<stamp::Partial>, crate::trust::Checked)> {
    use crate::trust::Gate;
    let fix = republish_fix(&m.name);
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let mut skipped: Vec<String> = Vec::new();
    for (k, partial) in choose_keys(m, key, opts, branch)? {
        let kp = branch.plan(&k.value, &fix)?;
        match crate::trust::check_key(sh, repo, &mut checker, m, git, branch, &k.value)? {
            Gate::Pass(checked) => return Ok((kp, k, partial, checked)),
            Gate::Refused { line, .. } if partial.is_none() => {
                return Err(fail(
                    Code::Untrusted,
                    format!("{line}; nothing was fetched or installed"),
                ));
            }
            Gate::Refused { verdict, line } => {
                eprintln!("warning: {line}; skipping this fallback key, trying the next");
                skipped.push(format!(
                    "{} ({}; signer seen: {})",
                    k.value,
                    verdict.verdict,
                    verdict.signer.as_deref().unwrap_or("none")
                ));
            }
        }
    }
    Err(fail(
        Code::Untrusted,
        format!(
            "untrusted: cache {} on branch {} has no key {} and no fallback key passes the trust policy: skipped {}; who may sign is listed in {}; nothing was fetched or installed",
            m.name,
            branch.name,
            key.value,
            skipped.join(", "),
            checker.root.signers_where()
        ),
    ))
}

/// When the stand-in chosen again is the very install the stamp describes
/// (same key and tar, here, ready), nothing is fetched or unpacked: only
/// the stamp's `checked_at_ms` moves, so the next recheck is a full
/// interval away.
fn same_stand_in(
    m: &CacheManifest,
    stamp_file: &Path,
    branch: &Branch,
    key: &Key,
    partial: &stamp::Partial,
    start: Instant,
    phases: &Phases,
) -> Result<Option<RestoreOutcome>> {
    let Loaded::Found(mut s) = stamp::load(stamp_file) else {
        return Ok(None);
    };
    let tar = match &branch.content {
        Content::V1(bm) => bm.keys.get(&key.value).map(|e| e.tar_sha256.as_str()),
        Content::Legacy { .. } => None,
    };
    if s.key != key.value
        || tar != Some(s.tar_sha256.as_str())
        || s.matches(&key.value, &key.parts, &m.restore_path, m.mode)
            .is_err()
        || ready(m).is_err()
    {
        return Ok(None);
    }
    s.partial = Some(partial.clone());
    stamp::store(stamp_file, &s)?;
    let mut o = from_stamp(m, &s, State::Partial, start, phases.clone());
    o.commit = branch.commit.clone();
    Ok(Some(o))
}

/// Where a cold restore puts what it staged.
struct Installed<'a> {
    m: &'a CacheManifest,
    state_dir: &'a Path,
    stamp_file: &'a Path,
    journal: &'a Path,
    overlay_file: &'a Path,
}

impl Installed<'_> {
    /// Swaps `dest` in (replace) or merges it (merge, overlay).
    fn swap_or_merge(&self, dest: &Path, overlay_plan: Option<&overlay::Plan>) -> Result<()> {
        let (m, target) = (self.m, &self.m.restore_path);
        // No stamp (nor delta record) while the target is being replaced: a
        // crash between the swap and the new stamp must not leave the old
        // stamp describing the new tree.
        stamp::remove(self.stamp_file)?;
        delta::forget(self.state_dir, &m.name)?;
        match m.mode {
            Mode::Replace => unpack::swap_dir(dest, target)?,
            Mode::Merge => {
                unpack::merge_into(dest, target, self.journal)?;
            }
            Mode::Overlay => {
                let plan = overlay_plan.expect("overlay has a plan");
                // Before the merge, so that a merge completed by the next
                // run's journal replay leaves files the record knows.
                overlay::save(self.overlay_file, &plan.record)?;
                unpack::merge_into(dest, target, self.journal)?;
                overlay::save(self.overlay_file, &overlay::settle(target, plan)?)?;
            }
        }
        Ok(())
    }
}

/// The stamp of what a cold restore installed.
fn new_stamp(
    m: &CacheManifest,
    key: &Key,
    branch: &Branch,
    kp: &KeyPlan,
    vstats: &verify::Stats,
    files: u64,
    partial: Option<stamp::Partial>,
) -> Stamp {
    let now = clock::now_ms();
    Stamp {
        format: stamp::STAMP_FORMAT,
        name: m.name.clone(),
        key: key.value.clone(),
        key_parts: key.parts.clone(),
        target: m.restore_path.clone(),
        mode: stamp::mode_name(m.mode).to_string(),
        branch: branch.name.clone(),
        source: branch.remote.to_string(),
        commit: branch.commit.clone(),
        layout: kp.layout.to_string(),
        manifest_sha256: branch.manifest_sha256.clone(),
        tar_sha256: vstats.tar_sha256.clone(),
        // The key's (a delta decodes only part of it).
        tar_size: kp.plan.tar_size.unwrap_or(vstats.tar_bytes),
        files,
        restored_at: clock::rfc3339(now),
        restored_at_ms: now,
        partial,
    }
}

/// Finishes (or undoes) whatever a killed run left, before anything else:
/// even if the fetch after fails, the target is whole again. Returns the
/// state directory and the merge journal's path.
fn recover_first(repo: &Repo, m: &CacheManifest) -> Result<(PathBuf, PathBuf)> {
    let state_dir = repo.state_dir();
    let journal = journal_path(&state_dir, &m.name);
    match m.mode {
        Mode::Replace => unpack::recover_swap(&m.restore_path)?,
        Mode::Merge | Mode::Overlay => unpack::recover(&journal, &m.restore_path)?,
    }
    Ok((state_dir, journal))
}

/// Fetches the key's file index (replace mode keeps it for the next delta
/// install) and builds staging `dest`: a delta of the installed tree where
/// it can be, else a full unpack.
#[allow(clippy::too_many_arguments)]
fn stage(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    m: &CacheManifest,
    key: &Key,
    (state_dir, stamp_file): (&Path, &Path),
    opts: &RestoreOptions,
    dest: &Path,
) -> Result<(Option<Result<delta::NewIndex, String>>, delta::Staged)> {
    let index = match m.mode {
        Mode::Replace => delta::fetch_index(git, branch, &key.value)?,
        _ => None,
    };
    let ctx = delta::Ctx {
        git,
        branch,
        kp,
        name: &m.name,
        target: &m.restore_path,
        state_dir,
        stamp_file,
        index: index.as_ref(),
        allowed: m.mode == Mode::Replace && !opts.verify && !m.keep_mtime,
        progress: opts.progress,
    };
    let staged = delta::stage(&ctx, dest)?;
    Ok((index, staged))
}

/// With `--verify` over an installed copy: `Verified` when staging and the
/// target agree, else `Repaired` and the first difference.
fn compared(
    opts: &RestoreOptions,
    m: &CacheManifest,
    dest: &Path,
) -> Result<(State, Option<String>)> {
    let target = &m.restore_path;
    if !opts.verify || std::fs::symlink_metadata(target).is_err() {
        return Ok((State::Restored, None));
    }
    let (diff, _) = compare::first_difference(dest, target, m.mode == Mode::Replace)?;
    Ok(match diff {
        None => (State::Verified, None),
        Some(d) => (State::Repaired, Some(d)),
    })
}

/// The ready-probe after an install: a cache that installed but still is
/// not ready means the probe checks something else (exit 10).
fn ready_after_install(m: &CacheManifest, key: &Key) -> Result<()> {
    ready(m).map_err(|why| {
        fail(
            Code::Config,
            format!(
                "installed {} at {}, but the ready-probe of {} still fails ({why}): fix [ready] so that it checks something the cache contains",
                key.value,
                m.restore_path.display(),
                m.file.display()
            ),
        )
    })
}

#[allow(clippy::too_many_arguments)]
fn cold(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    stamp_file: &Path,
    opts: &RestoreOptions,
    start: Instant,
    mut phases: Phases,
) -> Result<RestoreOutcome> {
    let target = &m.restore_path;
    let (state_dir, journal) = recover_first(repo, m)?;

    let t = Instant::now();
    let (git, branch) = fetch(sh, repo, m, opts.remote.as_deref(), opts.progress)?;
    // Trusted before read (DESIGN.md invariant 9), for the key chosen (the
    // exact one or the first fallback candidate the policy lets through):
    // exit 12 here leaves the install as it is and fetches no chunk.
    let t_trust = Instant::now();
    let (mut kp, key, partial, trust) = choose_trusted(sh, repo, m, key, opts, &git, &branch)?;
    let key = &key;
    let trust_us = t_trust.elapsed().as_micros() as u64;
    if let Some(p) = &partial
        && !opts.verify
        && let Some(outcome) = same_stand_in(m, stamp_file, &branch, key, p, start, &phases)?
    {
        return Ok(outcome);
    }
    // Every compressed byte of a v1 branch is authenticated by its chunk's
    // digest before it is decoded, and zstd checks its frames' content
    // checksums: hashing the whole tar again would only check the decoder
    // (`verify::Plan::hash_tar`). `--verify` still does.
    if kp.plan.check == verify::Check::PerPiece && !opts.verify {
        kp.plan.hash_tar = false;
    }
    phases.fetch_ms = (t.elapsed().as_millis() as u64).saturating_sub(trust_us / 1000);
    phases.trust_us = trust_us;
    unpack::kill_point("restore:fetched");

    let t = Instant::now();
    let mut staging = Staging(Some(unpack::staging_dir_for(target)?));
    let dest = staging.0.clone().expect("staging is set");
    let files = (state_dir.as_path(), stamp_file);
    let (index, staged) = stage(&git, &branch, &kp, m, key, files, opts, &dest)?;
    let (ustats, vstats, fetched) = (staged.unpacked, &staged.verified, &staged.fetched);
    phases.unpack_ms = t.elapsed().as_millis() as u64;
    phases.chunk_fetch_ms = fetched.fetch_ms;
    phases.chunk_wait_ms = fetched.wait_ms;
    unpack::kill_point("restore:unpacked");

    let bytes_hashed = vstats.bytes_hashed;
    // Overlay: the files the user changed since they were installed leave
    // staging here, so neither `--verify`'s comparison nor the merge sees
    // them.
    let overlay_file = overlay::path(&state_dir, &m.name);
    let overlay_plan = match m.mode {
        Mode::Overlay => Some(overlay::hold_back(
            &dest,
            target,
            &overlay::load(&overlay_file, target),
        )?),
        _ => None,
    };
    let (mut state, difference) = compared(opts, m, &dest)?;

    let t = Instant::now();
    if state != State::Verified {
        let installed = Installed {
            m,
            state_dir: &state_dir,
            stamp_file,
            journal: &journal,
            overlay_file: &overlay_file,
        };
        installed.swap_or_merge(&dest, overlay_plan.as_ref())?;
        staging.0 = None;
        unpack::kill_point("restore:installed");
        if let Some(Ok(new)) = &index {
            let tar = &vstats.tar_sha256;
            let verified = staged.delta.is_some();
            delta::remember_or_warn(&state_dir, &m.name, target, &key.value, tar, new, verified);
        }
    }
    drop(staging);
    let files = ustats.files + ustats.dirs + ustats.symlinks + ustats.hardlinks;
    let s = new_stamp(m, key, &branch, &kp, vstats, files, partial.clone());
    stamp::store(stamp_file, &s)?;
    crate::cache::gc::installed(&state_dir, &s, &branch);
    phases.install_ms = t.elapsed().as_millis() as u64;
    ready_after_install(m, key)?;
    let duration = start.elapsed();
    if partial.is_some() && state == State::Restored {
        state = State::Partial;
    }
    Ok(RestoreOutcome {
        name: m.name.clone(),
        state,
        key: key.value.clone(),
        target: target.clone(),
        mode: stamp::mode_name(m.mode),
        branch: branch.name.clone(),
        source: branch.remote.to_string(),
        commit: branch.commit.clone(),
        layout: kp.layout.to_string(),
        bytes: vstats.tar_bytes,
        compressed_bytes: vstats.compressed_bytes,
        chunk_source: Some(fetched.source),
        reuse: fetched.reuse,
        chunks_direct: fetched.direct,
        direct_fallback: fetched.direct_fallback.clone(),
        files,
        bytes_hashed,
        signature_checks: crate::trust::sshsig::checks(),
        trust: Some(trust),
        duration_ms: duration.as_millis() as u64,
        duration,
        phases,
        difference,
        reason: None,
        partial: partial_info(m, &s),
        kept: overlay_plan.map(|p| p.kept.len() as u64),
        delta: DeltaInfo::of(&staged.delta, staged.fallback),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lock_per_target_path() {
        let s = Path::new("/r/.git/warmstart");
        assert_eq!(lock_path(s, Path::new("/a")), lock_path(s, Path::new("/a")));
        assert_ne!(lock_path(s, Path::new("/a")), lock_path(s, Path::new("/b")));
        assert!(lock_path(s, Path::new("/a")).starts_with("/r/.git/warmstart/cache/locks"));
    }

    #[test]
    fn a_second_locker_times_out_busy() {
        let tmp = tempfile::tempdir().unwrap();
        let target = tmp.path().join("t");
        let (_held, _) = lock_target(tmp.path(), &target, Duration::ZERO).unwrap();
        // flock locks belong to the open file description: a second open
        // in the same process conflicts, as another process would.
        let err = lock_target(tmp.path(), &target, Duration::from_millis(60)).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Busy);
        assert!(format!("{err:#}").contains("WARMSTART_LOCK_TIMEOUT"));
    }
}
