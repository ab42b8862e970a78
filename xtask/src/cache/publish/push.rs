//! The push of a publish, split in batches under a host's per-push limit.
//!
//! GitHub refuses any single push over 2 GiB, and a pinned toolchain's
//! chunks can be more. When the blobs the remote lacks pass the limit
//! (`[publish] push_limit`, `WARMSTART_PUSH_LIMIT`, default 1.5 GiB), they
//! go first in batches under it, each as a parentless commit whose tree
//! holds one batch, pushed to a temporary ref; then the root commit goes
//! with the lease on the cache ref as always (git sends nothing the
//! temporary refs already gave the server); then the temporary refs are
//! deleted. Temporary refs sit where the cache ref does: under
//! `refs/warmstart/tmp/<name>/` for a cache on a ref outside `refs/heads/`,
//! and on branches `warmstart-tmp/<name>/...` for a cache on a branch
//! (hosts that refuse other refs), one per batch: `<run>/<nnn>`, where
//! `<run>` is `<unix seconds>-<8 hex>`.
//!
//! An interrupted publish leaves its temporary refs. The next batched
//! publish of the same cache lists them, counts their blobs as landed (they
//! are not sent again), and deletes them after its root push, but only
//! those whose name has our shape and whose commit is one of ours (no
//! parent, our message), and only when their run is over: this clone's run
//! markers (`<state>/push-runs/<name>/<run>`, locked while the run lives)
//! say so, and a run of another clone is taken as over after a day. A
//! publish that fits one push looks for leftovers only when this clone has
//! a dead run marker, so the common publish costs no extra round trip.
//!
//! Never: delete a ref outside this cache's temporary namespace, a ref
//! whose commit is not ours, or a ref that moved since it was listed
//! (each deletion has a lease on the listed value).

use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::human_bytes;
use crate::cache::publish::report::Reporter;
use crate::exit::{Code, fail};
use crate::git::{self, CacheGit, PushProgress, Remote, TreeEntry};

/// Below GitHub's 2 GiB per push, with room for pack headers and the
/// root commit's small files.
pub const DEFAULT_PUSH_LIMIT: u64 = 1536 << 20;

/// The variable that overrides `[publish] push_limit`.
pub const VAR: &str = "WARMSTART_PUSH_LIMIT";

/// How a batch commit's message starts: what marks a leftover as ours.
const MESSAGE: &str = "warmstart push batch ";

/// A run of another clone whose temporary refs are this old is taken as
/// over (a batched push of a few GiB takes minutes, not a day).
const STALE_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What a publish's push did: `push` in `cache publish --json`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Report {
    /// The per-push limit in force.
    pub limit_bytes: u64,
    /// Bytes of blobs the remote did not have before this publish (the
    /// ones its batches sent in earlier attempts included).
    pub new_bytes: u64,
    /// Pushes of blobs through temporary refs before the root commit's,
    /// over all attempts of the publish (a lost lease is retried on them);
    /// 0: everything went in the root commit's one push.
    pub batches: usize,
    /// Bytes an interrupted earlier publish had already landed on
    /// temporary refs, not sent again.
    pub reused_bytes: u64,
    /// Temporary refs deleted after the root push (this run's and leftovers).
    pub temp_refs_removed: usize,
}

/// The per-push limit: `WARMSTART_PUSH_LIMIT`, else `[publish] push_limit`,
/// else `DEFAULT_PUSH_LIMIT`. Zero is refused (exit 10).
pub fn limit(m: &CacheManifest) -> Result<u64> {
    let limit = match crate::settings::size(VAR)? {
        Some(n) => n,
        None => m.push_limit.unwrap_or(DEFAULT_PUSH_LIMIT),
    };
    if limit == 0 {
        return Err(fail(
            Code::Config,
            format!(
                "a push limit of 0 bytes ({VAR} or [publish] push_limit) leaves nothing to push: give a size such as \"1.5GiB\""
            ),
        ));
    }
    Ok(limit)
}

/// Where this cache's temporary refs live, as `push_branch` names refs:
/// a full `refs/...` ref, or a branch name.
fn namespace(m: &CacheManifest) -> String {
    if git::remote_ref(&m.branch).starts_with("refs/heads/") {
        format!("warmstart-tmp/{}/", m.name)
    } else {
        format!("refs/warmstart/tmp/{}/", m.name)
    }
}

/// This process's run: its id, its locked marker, and the temporary refs
/// it pushed (kept across a publish's lease retries, which reuse them).
struct Run {
    id: String,
    marker: Option<(PathBuf, File)>,
    pushed: Vec<(String, String)>,
    /// Bytes of blobs in `pushed`.
    bytes: u64,
}

fn run_state() -> &'static Mutex<Option<Run>> {
    static RUN: OnceLock<Mutex<Option<Run>>> = OnceLock::new();
    RUN.get_or_init(|| Mutex::new(None))
}

/// A fresh run id: `<unix seconds>-<8 hex>` (the hex from the clock's
/// nanoseconds and the pid, enough to keep two runs of one second apart).
fn new_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mix = (u64::from(now.subsec_nanos()) ^ (u64::from(std::process::id()) << 20))
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    format!("{}-{:08x}", now.as_secs(), mix >> 32)
}

/// A temporary ref's run id and batch number, if the part of its name
/// after the namespace has our shape (`<digits>-<8 hex>/<3+ digits>`).
pub(crate) fn parse_temp(rest: &str) -> Option<(&str, u32)> {
    let (run, batch) = rest.split_once('/')?;
    let (secs, hex) = run.split_once('-')?;
    let ok = secs.len() >= 9
        && secs.len() <= 12
        && secs.bytes().all(|b| b.is_ascii_digit())
        && hex.len() == 8
        && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && (3..=6).contains(&batch.len())
        && batch.bytes().all(|b| b.is_ascii_digit());
    ok.then(|| Some((run, batch.parse().ok()?)))?
}

/// Seconds since the epoch a run id was made at.
fn run_started(run: &str) -> Option<u64> {
    run.split_once('-')?.0.parse().ok()
}

/// The directory of this cache's run markers.
fn markers_dir(git: &CacheGit, name: &str) -> PathBuf {
    let state = git.dir.parent().unwrap_or(&git.dir);
    state.join("push-runs").join(name)
}

/// Runs of this clone that are over: a marker nobody holds locked.
fn dead_local_runs(dir: &Path) -> Vec<String> {
    let Ok(list) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    list.filter_map(|e| {
        let e = e.ok()?;
        let name = e.file_name().to_string_lossy().into_owned();
        let f = File::options().write(true).open(e.path()).ok()?;
        // Locked: its run is alive. Taken: it died (the kernel dropped the lock).
        f.try_lock().ok().map(|()| name)
    })
    .collect()
}

/// Takes this process's run (once): an id and a locked marker file.
fn start_run(dir: &Path) -> Result<()> {
    let mut state = run_state().lock().expect("run state");
    if state.is_some() {
        return Ok(());
    }
    let id = new_run_id();
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(&id);
    let file = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    file.try_lock()
        .map_err(|e| anyhow!("locking {}: {e}", path.display()))?;
    *state = Some(Run {
        id,
        marker: Some((path, file)),
        pushed: Vec::new(),
        bytes: 0,
    });
    Ok(())
}

/// A leftover temporary ref seen on the remote.
struct Leftover {
    name: String,
    oid: String,
    run: String,
    /// Its run is over: delete it after the root push.
    remove: bool,
}

/// Where one publish pushes: the store, the remote, the cache, and where
/// its temporary refs and run markers live.
struct Target<'a> {
    git: &'a CacheGit,
    remote: &'a Remote,
    m: &'a CacheManifest,
    /// `namespace(m)`.
    ns: String,
    /// `markers_dir`.
    markers: PathBuf,
    out: &'a Reporter,
}

/// What the remote lacks, and what an interrupted publish left there.
struct Survey {
    /// Blobs to send (id, size), in tree order.
    new: Vec<(String, u64)>,
    /// Bytes of new blobs before counting the leftovers' blobs as landed.
    first_new: u64,
    leftovers: Vec<Leftover>,
    /// This clone's runs that are over (their markers).
    dead: Vec<String>,
}

/// Pushes `commit` to the cache ref with a lease on `expected` (see
/// `CacheGit::push_branch`), first in batches under the limit when the
/// new blobs pass it, and removes temporary refs after. `progress` gets the
/// bytes sent over all pushes.
pub(crate) fn push(
    git: &CacheGit,
    remote: &Remote,
    m: &CacheManifest,
    commit: &str,
    expected: Option<&str>,
    out: &Reporter,
    progress: &mut dyn FnMut(PushProgress),
) -> Result<Report> {
    let limit = limit(m)?;
    let t = Target {
        git,
        remote,
        m,
        ns: namespace(m),
        markers: markers_dir(git, &m.name),
        out,
    };
    // A retry after a lost lease: what this run's batches already sent.
    let earlier = run_state()
        .lock()
        .expect("run state")
        .as_ref()
        .map_or(0, |r| r.bytes);
    let survey = t.survey(commit, expected, limit)?;
    let new_bytes: u64 = survey.new.iter().map(|b| b.1).sum();
    let mut report = Report {
        limit_bytes: limit,
        new_bytes: survey.first_new + earlier,
        reused_bytes: survey.first_new - new_bytes,
        ..Report::default()
    };
    if report.reused_bytes > 0 {
        out.say(format!(
            "{} of new blobs already landed on {remote} in an interrupted publish's temporary refs: not sent again",
            human_bytes(report.reused_bytes)
        ));
    }
    let mut sent = 0u64;
    let pushed = (|| {
        if new_bytes > limit {
            t.send_batches(&survey.new, limit, &mut sent, progress)?;
        }
        t.push_root(commit, expected, &survey.leftovers, &mut |p| {
            progress(shifted(p, sent, new_bytes - sent))
        })
    })();
    if let Err(e) = pushed {
        // A lost lease is retried at once (publish merges again), reusing them.
        if !own_pushed().is_empty() && !git::is_stale_lease(&e) {
            out.warn(format!(
                "the temporary refs {}* stay on {remote}: the next publish reuses what they hold and removes them",
                git::remote_ref(&t.ns)
            ));
        }
        return Err(e);
    }
    // Over every attempt of this publish (lease retries included).
    report.batches = own_pushed().len();
    report.temp_refs_removed = remove_temp_refs(&t, &survey.leftovers, &survey.dead);
    Ok(report)
}

/// The temporary refs this process pushed (name, commit).
fn own_pushed() -> Vec<(String, String)> {
    run_state()
        .lock()
        .expect("run state")
        .as_ref()
        .map(|r| r.pushed.clone())
        .unwrap_or_default()
}

impl Target<'_> {
    /// The blobs `commit` has and the remote lacks: not reachable from the
    /// cache ref's commit (`expected`) nor from this run's temporary refs
    /// (a lease retry), nor, when leftovers are looked for, from theirs.
    fn survey(&self, commit: &str, expected: Option<&str>, limit: u64) -> Result<Survey> {
        let own_run = run_state()
            .lock()
            .expect("run state")
            .as_ref()
            .map(|r| r.id.clone());
        let mut have: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
        have.extend(own_pushed().into_iter().map(|(_, c)| c));
        let mut new = new_blobs(self.git, commit, &have)?;
        let first_new: u64 = new.iter().map(|b| b.1).sum();
        let dead = dead_local_runs(&self.markers);
        let mut leftovers = Vec::new();
        if first_new > limit || !dead.is_empty() {
            leftovers = list_leftovers(self, own_run.as_deref(), &dead)?;
            if !leftovers.is_empty() {
                have.extend(leftovers.iter().map(|l| l.oid.clone()));
                new = new_blobs(self.git, commit, &have)?;
            }
        }
        Ok(Survey {
            new,
            first_new,
            leftovers,
            dead,
        })
    }

    /// Pushes `new` in batches under `limit`, each to a temporary ref of
    /// this run; `sent` counts the bytes as they land.
    fn send_batches(
        &self,
        new: &[(String, u64)],
        limit: u64,
        sent: &mut u64,
        progress: &mut dyn FnMut(PushProgress),
    ) -> Result<()> {
        start_run(&self.markers)?;
        let batches = plan_batches(new, limit);
        let run = run_state()
            .lock()
            .expect("run state")
            .as_ref()
            .map(|r| r.id.clone());
        let run = run.expect("a started run");
        // After a lost lease, this run's earlier refs keep their numbers.
        let first = own_pushed().len();
        self.out.say(format!(
            "pushing {} of new blobs in {} batches under the push limit of {} ([publish] push_limit, {VAR}), through temporary refs {}{run}/*",
            human_bytes(new.iter().map(|b| b.1).sum()),
            batches.len(),
            human_bytes(limit),
            git::remote_ref(&self.ns),
        ));
        for (i, batch) in batches.iter().enumerate() {
            let bytes: u64 = batch.iter().map(|b| b.1).sum();
            let base = *sent;
            let what = format!("batch {} of {}", i + 1, batches.len());
            push_batch(self, &run, first + i + 1, &what, batch, &mut |p| {
                progress(shifted(p, base, bytes))
            })?;
            *sent += bytes;
            crate::unpack::kill_point("publish:batch-pushed");
        }
        Ok(())
    }

    /// The root commit's push, with the temporary refs' commits marked
    /// shallow meanwhile so that git leaves their blobs out (see
    /// `CacheGit::set_shallow`).
    fn push_root(
        &self,
        commit: &str,
        expected: Option<&str>,
        leftovers: &[Leftover],
        progress: &mut dyn FnMut(PushProgress),
    ) -> Result<()> {
        let mut temps: Vec<String> = leftovers.iter().map(|l| l.oid.clone()).collect();
        temps.extend(own_pushed().into_iter().map(|(_, c)| c));
        self.git.set_shallow(&temps, true)?;
        let root = self
            .git
            .push_branch(self.remote, &self.m.branch, commit, expected, progress);
        if let Err(e) = self.git.set_shallow(&temps, false) {
            self.out
                .warn(format!("{e:#} (harmless: those commits have no parent)"));
        }
        root
    }
}

/// A batch push's progress as progress of all pushes: `base` bytes were
/// sent before it, and it sends about `len`.
fn shifted(p: PushProgress, base: u64, len: u64) -> PushProgress {
    PushProgress {
        percent: p.percent,
        bytes: Some(base + p.bytes_of(len)),
    }
}

/// Splits blobs (id, size) in order into batches of at most `limit` bytes;
/// a blob over the limit alone goes in a batch of its own (a chunk cannot
/// be split; chunks stay under 100 MiB, far under any host's limit).
pub(crate) fn plan_batches(blobs: &[(String, u64)], limit: u64) -> Vec<Vec<(String, u64)>> {
    let mut batches: Vec<Vec<(String, u64)>> = Vec::new();
    let mut size = 0u64;
    for b in blobs {
        match batches.last_mut() {
            Some(last) if size + b.1 <= limit => {
                last.push(b.clone());
                size += b.1;
            }
            _ => {
                batches.push(vec![b.clone()]);
                size = b.1;
            }
        }
    }
    batches
}

/// Pushes one batch (`what`: `batch 2 of 5`) as a parentless commit of
/// its blobs to this run's temporary ref number `n`, and records it.
fn push_batch(
    t: &Target,
    run: &str,
    n: usize,
    what: &str,
    batch: &[(String, u64)],
    progress: &mut dyn FnMut(PushProgress),
) -> Result<()> {
    let entries: Vec<TreeEntry> = batch
        .iter()
        .map(|(oid, _)| TreeEntry {
            mode: "100644".into(),
            kind: "blob".into(),
            oid: oid.clone(),
            size: None,
            name: oid.clone(),
        })
        .collect();
    let tree = t
        .git
        .mktree(&entries)
        .with_context(|| format!("writing the tree of push {what}"))?;
    // `what` is `batch 2 of 5`: the message starts with `MESSAGE`.
    let message = format!("warmstart push {what} for cache {} (run {run})", t.m.name);
    let commit = t.git.commit_tree(&tree, &message)?;
    let name = format!("{}{run}/{n:03}", t.ns);
    match t.git.push_branch(t.remote, &name, &commit, None, progress) {
        Ok(()) => {}
        // A fresh name that exists already: not the cache ref's lease, so
        // not the publish's retry either.
        Err(e) if git::is_stale_lease(&e) => {
            return Err(fail(
                Code::Busy,
                format!(
                    "{} already has the temporary ref {name}: publish again",
                    t.remote
                ),
            ));
        }
        Err(e) => return Err(e.context(format!("pushing {what} to {name}"))),
    }
    if let Some(r) = run_state().lock().expect("run state").as_mut() {
        r.pushed.push((name, commit));
        r.bytes += batch.iter().map(|b| b.1).sum::<u64>();
    }
    Ok(())
}

/// Blobs reachable from `tip` and not from `have` (commits this store
/// holds), with their sizes: what a push would send, as git computes it
/// (`rev-list --objects`). Blobs the filtered fetch left out are all
/// reachable from `have` (the cache ref's commit), so none is looked up.
fn new_blobs(git: &CacheGit, tip: &str, have: &[String]) -> Result<Vec<(String, u64)>> {
    let mut cmd = git.git();
    // Aggressive edges: the trees of `have` count although no commit
    // relates them to `tip` (every cache commit is a root), as in a push
    // from a shallow store.
    cmd.args([
        "rev-list",
        "--objects-edge-aggressive",
        "--no-object-names",
        tip,
    ]);
    if !have.is_empty() {
        cmd.arg("--not").args(have);
    }
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .context("running git rev-list --objects")?;
    if !out.status.success() {
        return Err(anyhow!(
            "git rev-list --objects {tip} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let oids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('-'))
        .map(str::to_string)
        .collect();
    // Trees and commits answer `None`: only blobs are batched.
    let sizes = git.blob_sizes(&oids)?;
    Ok(oids
        .into_iter()
        .zip(sizes)
        .filter_map(|(o, s)| Some((o, s?)))
        .collect())
}

/// Lists this cache's temporary refs on the remote (not this run's), makes
/// sure their commits are here (a fetch without blobs when not), and keeps
/// the ones that are ours; each marked for removal when its run is over.
fn list_leftovers(t: &Target, own_run: Option<&str>, dead: &[String]) -> Result<Vec<Leftover>> {
    let (git, remote, out) = (t.git, t.remote, t.out);
    let full = git::remote_ref(&t.ns);
    let mut cmd = git.git();
    git.belts(&mut cmd, &remote.url);
    cmd.args(["ls-remote", "--"])
        .arg(&remote.url)
        .arg(format!("{full}*"));
    let ran = git.run_network(&mut cmd, "look-up of temporary refs", remote, &mut |_| {})?;
    if !ran.status.success() {
        return Err(crate::git::remote_failure(
            &format!("cannot list the temporary refs {full}* on {remote}"),
            &String::from_utf8_lossy(&ran.stderr),
        ));
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&ran.stdout).lines() {
        match classify(line, &full, own_run, dead, now) {
            Some(Ok(l)) => found.push(l),
            Some(Err(name)) => out.warn(format!(
                "{name} on {remote} is not named like a warmstart temporary ref: left alone"
            )),
            None => {}
        }
    }
    let missing: Vec<String> = found
        .iter()
        .filter(|l| !git.has_commit(&l.oid))
        .map(|l| l.name.clone())
        .collect();
    if !missing.is_empty() {
        git.fetch_trees(remote, &missing)?;
    }
    Ok(found
        .into_iter()
        .filter(|l| {
            let ours = is_our_commit(git, &l.oid);
            if !ours {
                out.warn(format!(
                    "{} on {remote} does not hold a warmstart push batch: left alone",
                    l.name
                ));
            }
            ours
        })
        .collect())
}

/// One line of `ls-remote` (`<oid>\t<ref>`) read as a leftover of this
/// cache (`full`: its namespace as a full ref): `None` for a ref outside
/// the namespace or of this process's run, `Err(name)` for one inside
/// whose name or id is not of our shape. `now`: unix seconds.
fn classify(
    line: &str,
    full: &str,
    own_run: Option<&str>,
    dead: &[String],
    now: u64,
) -> Option<Result<Leftover, String>> {
    let (oid, name) = line.split_once('\t')?;
    // ls-remote matches patterns from the end: only our namespace counts.
    let rest = name.strip_prefix(full)?;
    let hex = (oid.len() == 40 || oid.len() == 64)
        && oid.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    let Some((run, _)) = parse_temp(rest).filter(|_| hex) else {
        return Some(Err(name.to_string()));
    };
    if Some(run) == own_run {
        return None;
    }
    let old = run_started(run).is_some_and(|s| now.saturating_sub(s) > STALE_AFTER.as_secs());
    Some(Ok(Leftover {
        name: name.to_string(),
        oid: oid.to_string(),
        run: run.to_string(),
        remove: old || dead.iter().any(|d| d == run),
    }))
}

/// A parentless commit whose message is a batch's.
fn is_our_commit(git: &CacheGit, oid: &str) -> bool {
    let Ok(out) = git
        .git()
        .args(["cat-file", "commit", oid])
        .stdin(std::process::Stdio::null())
        .output()
    else {
        return false;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let Some((head, message)) = text.split_once("\n\n") else {
        return false;
    };
    out.status.success()
        && !head.lines().any(|l| l.starts_with("parent "))
        && message.starts_with(MESSAGE)
}

/// Deletes this run's temporary refs and the leftovers whose run is over
/// (one push, each with a lease on the value seen), then their markers.
/// A failure only warns: the publish landed, and the next one retries.
fn remove_temp_refs(t: &Target, leftovers: &[Leftover], dead: &[String]) -> usize {
    let (git, remote, out, markers) = (t.git, t.remote, t.out, &t.markers);
    let mut state = run_state().lock().expect("run state");
    let mut refs: Vec<(String, String)> = leftovers
        .iter()
        .filter(|l| l.remove)
        .map(|l| (git::remote_ref(&l.name), l.oid.clone()))
        .collect();
    if let Some(r) = state.as_ref() {
        refs.extend(
            r.pushed
                .iter()
                .map(|(n, c)| (git::remote_ref(n), c.clone())),
        );
    }
    if !refs.is_empty()
        && let Err(e) = delete_refs(git, remote, &refs)
    {
        out.warn(format!(
            "{e:#}: the temporary refs stay on {remote}; the next batched publish removes them"
        ));
        return 0;
    }
    // Markers of runs whose refs are gone (or that never pushed any).
    let gone: Vec<&String> = dead
        .iter()
        .filter(|d| !leftovers.iter().any(|l| &l.run == *d && !l.remove))
        .collect();
    for d in gone {
        let _ = std::fs::remove_file(markers.join(d));
    }
    if let Some(r) = state.as_mut() {
        if let Some((path, _)) = r.marker.take() {
            let _ = std::fs::remove_file(path);
        }
        r.pushed.clear();
    }
    *state = None;
    refs.len()
}

/// One push deleting `refs` (full name, value seen), each with a lease.
fn delete_refs(git: &CacheGit, remote: &Remote, refs: &[(String, String)]) -> Result<()> {
    let mut cmd = git.git();
    git.belts(&mut cmd, &remote.url);
    cmd.args(["push", "--porcelain", "--no-verify"]);
    for (name, oid) in refs {
        cmd.arg(format!("--force-with-lease={name}:{oid}"));
    }
    cmd.arg("--").arg(&remote.url);
    for (name, _) in refs {
        cmd.arg(format!(":{name}"));
    }
    let ran = git.run_network(&mut cmd, "deletion of temporary refs", remote, &mut |_| {})?;
    if ran.status.success() {
        return Ok(());
    }
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    Err(crate::git::remote_failure(
        &format!("cannot delete {} temporary ref(s) on {remote}", refs.len()),
        &said,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_stay_under_the_limit_and_keep_the_order() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for case in 0..500 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let limit = 1 + x % 1000;
            let blobs: Vec<(String, u64)> = (0..(x % 40))
                .map(|i| (format!("b{i}"), (x >> (i % 50)) % 1200))
                .collect();
            let batches = plan_batches(&blobs, limit);
            let flat: Vec<_> = batches.iter().flatten().cloned().collect();
            assert_eq!(flat, blobs, "case {case}");
            for b in &batches {
                let sum: u64 = b.iter().map(|b| b.1).sum();
                assert!(!b.is_empty(), "case {case}");
                assert!(sum <= limit || b.len() == 1, "case {case}: {b:?}");
            }
            // Greedy: no two neighbours would fit in one.
            for w in batches.windows(2) {
                let a: u64 = w[0].iter().map(|b| b.1).sum();
                assert!(a + w[1][0].1 > limit, "case {case}");
            }
        }
    }

    #[test]
    fn only_our_names_parse() {
        assert_eq!(
            parse_temp("1764590000-0a1b2c3d/001"),
            Some(("1764590000-0a1b2c3d", 1))
        );
        assert_eq!(
            parse_temp("1764590000-0a1b2c3d/1234"),
            Some(("1764590000-0a1b2c3d", 1234))
        );
        for bad in [
            "",
            "main",
            "1764590000-0a1b2c3d",
            "1764590000-0a1b2c3d/",
            "1764590000-0a1b2c3d/01",
            "1764590000-0A1B2C3D/001",
            "1764590000-0a1b2c3/001",
            "x764590000-0a1b2c3d/001",
            "1764590000-0a1b2c3d/001/x",
            "1764590000-0a1b2c3d/0x1",
            "1764590000_0a1b2c3d/001",
            "../1764590000-0a1b2c3d/001",
        ] {
            assert_eq!(parse_temp(bad), None, "{bad}");
        }
        let id = new_run_id();
        assert!(parse_temp(&format!("{id}/001")).is_some(), "{id}");
    }

    /// Never a leftover outside the namespace, of another shape, with an id
    /// that is not one (it becomes an argument of git), of this run, or
    /// removed while its run may live: whatever the server lists.
    #[test]
    fn leftovers_are_only_ours_whatever_the_server_lists() {
        let full = "refs/heads/warmstart-tmp/art/";
        let pieces = [
            "refs/heads/warmstart-tmp/art/",
            "refs/heads/warmstart-tmp/art2/",
            "refs/heads/warmstart-tmp/",
            "refs/warmstart/tmp/art/",
            "x/refs/heads/warmstart-tmp/art/",
            "1764590000-0a1b2c3d",
            "1700000000-0badc0de",
            "1764590000-0A1B2C3D",
            "17-0a1b2c3d",
            "/",
            "001",
            "01",
            "..",
            "-",
            "\t",
            " ",
            "a",
        ];
        let oids = [
            "0123456789abcdef0123456789abcdef01234567",
            "--output=/tmp/x",
            "0123456789ABCDEF0123456789ABCDEF01234567",
            "",
            "0123",
        ];
        let dead = vec!["1764590000-0a1b2c3d".to_string()];
        let now = 1_764_600_000;
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: usize| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % n as u64) as usize
        };
        let mut accepted = 0;
        for case in 0..20_000 {
            // Half shaped like ours, with any piece swapped for another.
            let name: String = if next(2) == 0 {
                (0..1 + next(6))
                    .map(|_| pieces[next(pieces.len())])
                    .collect()
            } else {
                let mut shape = [pieces[0], pieces[5 + next(4)], "/", pieces[10 + next(2)]];
                if next(3) == 0 {
                    shape[next(4)] = pieces[next(pieces.len())];
                }
                shape.concat()
            };
            let oid = oids[next(oids.len())];
            let own = ["1764590001-00000000", "1700000000-0badc0de"][next(2)];
            let line = format!("{oid}\t{name}");
            match classify(&line, full, Some(own), &dead, now) {
                None => assert!(
                    !name.starts_with(full) || name.contains(own),
                    "case {case}: {line:?} skipped"
                ),
                Some(Err(n)) => assert!(n.starts_with(full), "case {case}: {line:?}"),
                Some(Ok(l)) => {
                    accepted += 1;
                    let rest = l.name.strip_prefix(full).expect("in the namespace");
                    let (run, batch) = rest.split_once('/').unwrap();
                    assert_ne!(run, own, "case {case}");
                    assert_eq!(format!("{full}{run}/{batch}"), name, "case {case}");
                    assert!(batch.len() >= 3 && batch.bytes().all(|b| b.is_ascii_digit()));
                    assert_eq!(l.oid.len(), 40, "case {case}: {line:?}");
                    assert!(!l.oid.starts_with('-'), "case {case}");
                    // Removed only when dead here, or a day old.
                    let old = run.starts_with("1700000000-");
                    assert_eq!(
                        l.remove,
                        old || dead.contains(&l.run),
                        "case {case}: {line:?}"
                    );
                }
            }
        }
        assert!(
            accepted > 50,
            "the generator found too few names of our shape: {accepted}"
        );
    }
}
