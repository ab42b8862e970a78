//! Chunks reused from this machine or fetched in batches, a little ahead of
//! the reader.
//!
//! A branch fetch (`CacheGit::try_fetch_branch`) leaves big chunks out, so a
//! restore can start as soon as the commit, the tree and the small files
//! have arrived. `Prefetch` then finds each chunk of the plan
//! (`cache::fetch::reuse`): in cache.git, in the chunk store (any earlier key or
//! cache of this clone put it there: chunks are named by their sha256), or
//! in the user's own repository (a full clone holds the chunk blobs), and
//! fetches only the others, while `verify::stream` hashes, decodes and
//! unpacks the earlier ones; `wait(i)` blocks the reader until chunk `i` is
//! here. Reused chunks are hashed before they are used (a stored one again,
//! one of the user's repository on its way into the store); one that does
//! not match is fetched instead.
//!
//! The missing chunks are fetched in batches (at most `BATCH_CHUNKS` chunks
//! and `BATCH_BYTES` bytes, in plan order, at least one chunk): one request
//! per batch, not one round trip per chunk, `PARALLEL` batches at a time,
//! none starting more than `AHEAD_BYTES` of the stream past the chunk being
//! read, so that a restore that fails early has not downloaded the rest.
//! When the remote is a repository on this machine, a smart HTTP(S) server,
//! an ssh server or a `git daemon`, a batch is read straight from `git
//! upload-pack`'s answer into the chunk store (`cache::fetch::direct`), each
//! chunk hashed as it arrives and ready as soon as it is stored; a
//! connection cut mid-batch keeps what arrived whole and the rest is asked
//! for again at once (`fetcher`), down to the one chunk the link cannot
//! carry, which the error names. Anything else, and every
//! batch after a server the direct reader does not handle (a delta in the
//! pack, protocol v0), goes through one `git fetch` of the batch's blobs
//! into cache.git. Git's own SHA-1 pass over what it receives is not what
//! authenticates a chunk: `verify` hashes every byte against
//! `warmstart.json` before the decoder sees it.
//!
//! Fallbacks: a server that refuses a `want` by id (protocol v0 without
//! `uploadpack.allow*SHA1InWant`) gets one whole fetch of the branch
//! (`CacheGit::refetch_branch`), as before this module existed.
//!
//! The threads' work (hashing what was found, fetching batches, their
//! errors) is in `fetcher`; this file holds the plan, the shared state and
//! the reader's side.
//!
//! This module only adds objects to cache.git and files to its chunk
//! store; it reads the user's repository and never writes to it, and a
//! dropped `Prefetch` stops its git (by process group) and its threads.

use anyhow::{Result, anyhow};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cache::fetch::direct::{self, Store};
use crate::cache::fetch::reuse::{self, Found};
use crate::cache::restore::branch::KeyPlan;
use crate::cache::restore::verify;
use crate::exit::{Code, fail};
use crate::git::{BlobFetchError, CacheGit, Remote};

mod fetcher;

/// How far into the compressed stream, past the chunk being read, a batch
/// may start: two 99 MiB chunks, or a few batches of small ones. Enough
/// that the next chunk is there when the reader wants it, little enough
/// that a restore that fails early has not downloaded the rest.
pub const AHEAD_BYTES: u64 = 200 << 20;

/// How many batches are fetched at once. One `git pack-objects`, which
/// SHA-1s all it sends, delivers about 100 MB/s while the unpack runs,
/// less than the unpack takes: two keep the reader from waiting (measured
/// in BENCHMARKS.md).
pub const PARALLEL: usize = 2;

/// The most chunks, and bytes, one request asks for (a batch holds at
/// least one chunk, whatever its size).
pub const BATCH_CHUNKS: usize = 64;
pub const BATCH_BYTES: u64 = 64 << 20;

/// How the chunks of a plan reached this machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Every chunk was already here (cache.git, the chunk store, the
    /// user's repository): nothing fetched.
    Present,
    /// Fetched by id, overlapping the unpack.
    ById,
    /// The server refused blobs by id: the branch was fetched whole.
    Refetch,
}

/// What the machine already had, and what crossed the network: the
/// `chunks_reused`, `chunks_from_clone`, `chunks_fetched` and
/// `bytes_fetched` of `cache restore --json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Reuse {
    /// Chunks already on this machine before this run: in cache.git or
    /// its chunk store (from any earlier key or cache of this clone), or
    /// copied out of the user's repository.
    pub chunks_reused: u64,
    /// Of those, the ones copied out of the user's repository.
    pub chunks_from_clone: u64,
    /// Chunks fetched by id in this run. Chunks small enough to come with
    /// the branch fetch (under `WARMSTART_FETCH_BLOB_LIMIT`) are in neither
    /// count; their bytes are in `bytes_fetched`.
    pub chunks_fetched: u64,
    /// The compressed bytes of every chunk that crossed the network in
    /// this run, by id or with the branch fetch (git's pack framing aside).
    pub bytes_fetched: u64,
}

/// What the fetcher did.
#[derive(Clone, Debug)]
pub struct Stats {
    pub source: Source,
    pub reuse: Reuse,
    /// Of the chunks fetched, those read straight from the pack stream
    /// into the chunk store (`cache::fetch::direct`).
    pub direct: u64,
    /// Why the direct reader handed the rest to `git fetch`, if it did.
    pub direct_fallback: Option<String>,
    /// Time spent fetching, summed over the fetchers (it overlaps the
    /// unpack).
    pub fetch_ms: u64,
    /// Time the reader spent waiting for a chunk.
    pub wait_ms: u64,
}

/// Where a chunk that is ready can be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum At {
    /// In cache.git, not yet hashed by this process.
    Git,
    /// A file of the chunk store, whose size and digest this process
    /// checked.
    Store(std::path::PathBuf),
    /// A blob of the user's repository, whose size and digest this process
    /// checked once (it is read again from there, so `verify` hashes it
    /// again: unchecked).
    Clone(String),
}

enum Slot {
    Pending,
    Ready(At),
    /// Taken by the first `wait` that sees it.
    Failed(Option<anyhow::Error>),
}

struct State {
    slots: Vec<Slot>,
    /// The highest chunk the reader asked for.
    reader_at: usize,
    /// The reader hung up, or a fetch failed: no batch starts any more.
    stop: bool,
    /// The process groups of the running fetches, to stop them on drop.
    children: Vec<u32>,
    /// Batches no fetcher took yet, in plan order.
    queue: VecDeque<Vec<usize>>,
    source: Source,
    reuse: Reuse,
    direct: u64,
    /// Why the direct reader was given up, if it was.
    direct_fallback: Option<String>,
    fetching: Duration,
    waiting: Duration,
    /// The first failure's exit code and line: what the reader gets for
    /// any chunk it then waits for, whichever batch that chunk was in.
    failure: Option<(Code, String)>,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A callback for one fetch at a time (`CacheGit::fetch_blobs`,
    /// `direct::fetch`): records the running git's process group, and
    /// forgets it when it is told `None` (git exited). A git that starts
    /// after the reader hung up is stopped at once.
    fn track(&self) -> impl FnMut(Option<u32>) + '_ {
        let mut mine = None;
        move |pid| {
            let mut st = self.lock();
            match pid {
                Some(pid) => {
                    if st.stop {
                        stop_group(pid);
                    }
                    st.children.push(pid);
                    mine = Some(pid);
                }
                None => {
                    if let Some(m) = mine.take() {
                        st.children.retain(|&c| c != m);
                    }
                }
            }
        }
    }

    /// Sets chunk `j`'s slot if it is still pending, and wakes the reader.
    fn settle(&self, st: &mut State, j: usize, slot: Slot) {
        if matches!(st.slots[j], Slot::Pending) {
            st.slots[j] = slot;
        }
        self.changed.notify_all();
    }

    /// A fetch of `chunks` failed with `err`: the earliest of them still
    /// pending carries the error (the reader meets it first), the others
    /// say so, and no batch starts any more.
    fn fail(&self, chunks: &[usize], err: anyhow::Error) {
        let mut st = self.lock();
        if st.failure.is_none() {
            st.failure = Some((crate::exit::code_of(&err), format!("{err:#}")));
        }
        let mut err = Some(err);
        for &j in chunks {
            if matches!(st.slots[j], Slot::Pending) {
                st.slots[j] = Slot::Failed(err.take());
            }
        }
        st.stop = true;
        self.changed.notify_all();
    }
}

/// Stops a fetch: SIGTERM to git's process group (it leads one, see
/// `CacheGit::fetch_blob`), so that its helpers, which hold its stderr,
/// stop too.
fn stop_group(pid: u32) {
    // SAFETY: kill(2) has no memory-safety preconditions. The id is our
    // child's and is unregistered right after the fetcher thread reaped it;
    // only in that instant could it name a new group, and Linux hands out
    // pids in sequence, so that would take a wrap of the whole pid space.
    unsafe {
        libc::kill(-(pid as libc::pid_t), libc::SIGTERM);
    }
}

/// The chunks of one plan, being found or fetched.
pub struct Prefetch {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

/// What the fetchers need to know about the plan, shared by their threads.
struct Job {
    git: CacheGit,
    remote: Remote,
    branch: String,
    oids: Vec<String>,
    /// The plan's pieces: file names, declared sizes and digests.
    pieces: Vec<verify::Piece>,
    /// Where each piece starts in the compressed stream.
    offsets: Vec<u64>,
    store: Store,
    /// The remote's server, when `cache::fetch::direct` can read from it.
    server: Option<direct::Server>,
    /// The registry, when the remote is one (`cache::fetch::oci`): every
    /// missing chunk is fetched from it into the chunk store.
    oci: Option<crate::oci::Client>,
    /// Cleared when `cache::fetch::direct` met a server it does not handle.
    direct_on: AtomicBool,
    /// One `git fetch` into cache.git at a time.
    git_fetch: Mutex<()>,
    label: String,
    fix: String,
}

/// Cuts `chunks` (in plan order) into batches of at most `BATCH_CHUNKS`
/// chunks and `BATCH_BYTES` bytes, each at least one chunk.
fn batches(chunks: &[usize], sizes: &[u64]) -> VecDeque<Vec<usize>> {
    let mut out = VecDeque::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut bytes = 0u64;
    for &j in chunks {
        if !cur.is_empty() && (cur.len() == BATCH_CHUNKS || bytes + sizes[j] > BATCH_BYTES) {
            out.push_back(std::mem::take(&mut cur));
            bytes = 0;
        }
        cur.push(j);
        bytes += sizes[j];
    }
    if !cur.is_empty() {
        out.push_back(cur);
    }
    out
}

/// Where each piece starts in the compressed stream.
fn offsets(sizes: &[u64]) -> Vec<u64> {
    sizes
        .iter()
        .scan(0u64, |at, s| {
            let here = *at;
            *at += s;
            Some(here)
        })
        .collect()
}

/// The slots before any thread runs: chunks in cache.git are ready once
/// their size checks (reused, or fetched with the branch when `fresh`
/// holds them), every other one pending.
fn first_slots(
    job: &Job,
    found: &[Found],
    in_git: &[Option<u64>],
    fresh: &std::collections::HashSet<String>,
) -> (Vec<Slot>, Reuse) {
    let mut reuse = Reuse::default();
    let slots = (0..found.len())
        .map(|j| match (found[j], in_git[j]) {
            (Found::Git, Some(size)) => match job.size_check(j, size) {
                Ok(()) if fresh.contains(&job.oids[j]) => {
                    reuse.bytes_fetched += size;
                    Slot::Ready(At::Git)
                }
                Ok(()) => {
                    reuse.chunks_reused += 1;
                    Slot::Ready(At::Git)
                }
                Err(e) => Slot::Failed(Some(e)),
            },
            _ => Slot::Pending,
        })
        .collect();
    (slots, reuse)
}

/// The threads: one that hashes the chunks found in the chunk store or the
/// user's repository, if any, and up to `PARALLEL` fetchers of the queue.
fn spawn(job: &Arc<Job>, shared: &Arc<Shared>, found: &[Found]) -> Vec<JoinHandle<()>> {
    let mut threads = Vec::new();
    let local: Vec<(usize, Found)> = (0..found.len())
        .filter(|&j| matches!(found[j], Found::Store | Found::Clone))
        .map(|j| (j, found[j]))
        .collect();
    if !local.is_empty() {
        let (job, shared) = (job.clone(), shared.clone());
        threads.push(std::thread::spawn(move || job.run_local(&shared, &local)));
    }
    for _ in 0..PARALLEL.min(shared.lock().queue.len()) {
        let (job, shared) = (job.clone(), shared.clone());
        threads.push(std::thread::spawn(move || job.run_fetcher(&shared)));
    }
    threads
}

impl Prefetch {
    /// Finds the chunks of `kp` on this machine (`cache::fetch::reuse`) and starts
    /// fetching the others from `remote` (the branch `branch` was fetched
    /// from). `fresh` are blobs this run's branch fetch brought into
    /// cache.git: fetched, not reused. Chunks in cache.git are checked for
    /// size now. `registry` is the client a registry key was read with
    /// (its mirrors included), which fetches every missing chunk.
    pub fn start(
        git: &CacheGit,
        (remote, registry): (&Remote, Option<&crate::oci::Client>),
        branch: &str,
        kp: &KeyPlan,
        fresh: &std::collections::HashSet<String>,
    ) -> Result<Prefetch> {
        let in_git = git.blob_sizes(&kp.oids)?;
        let store = Store::of(git);
        store.sweep();
        let pieces = kp.plan.pieces.clone();
        let sizes: Vec<u64> = pieces.iter().map(|p| p.size).collect();
        let digests: Vec<Option<[u8; 32]>> = pieces.iter().map(|p| p.sha256).collect();
        let found = reuse::find(git, &store, &kp.oids, &sizes, &digests, &in_git);
        let missing: Vec<usize> = (0..found.len())
            .filter(|&j| found[j] == Found::Missing)
            .collect();
        let oci = match registry {
            Some(c) => Some(c.clone()),
            None => crate::oci::Registry::from_source_url(&remote.url)
                .map(|r| crate::oci::Client::new(r, git.network()))
                .transpose()?,
        };
        let (server, skipped) = match direct::choose_server(remote, git) {
            _ if oci.is_some() => (None, None),
            Ok(s) => (Some(s), None),
            Err(why) => (None, Some(why)),
        };
        let offsets = offsets(&sizes);
        let job = Arc::new(Job {
            git: git.clone(),
            remote: remote.clone(),
            branch: branch.to_string(),
            oids: kp.oids.clone(),
            pieces,
            offsets,
            store,
            server,
            oci,
            direct_on: AtomicBool::new(true),
            git_fetch: Mutex::new(()),
            label: kp.plan.label.clone(),
            fix: kp.plan.fix.clone(),
        });
        let (slots, reuse) = first_slots(&job, &found, &in_git, fresh);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots,
                reader_at: 0,
                stop: false,
                children: Vec::new(),
                queue: batches(&missing, &sizes),
                // Chunks that came with the branch fetch are `present`.
                source: Source::Present,
                reuse,
                direct: 0,
                // Why the direct reader is not used, when it is needed.
                direct_fallback: skipped.filter(|_| !missing.is_empty()),
                fetching: Duration::ZERO,
                waiting: Duration::ZERO,
                failure: None,
            }),
            changed: Condvar::new(),
        });
        let threads = spawn(&job, &shared, &found);
        Ok(Prefetch { shared, threads })
    }

    /// Blocks until chunk `i` is here, and says where; or returns why it
    /// never will be.
    pub fn wait(&self, i: usize) -> Result<At> {
        let t = Instant::now();
        let mut st = self.shared.lock();
        if i > st.reader_at {
            st.reader_at = i;
            self.shared.changed.notify_all();
        }
        loop {
            // A fetch failed and stopped the others, maybe before this
            // chunk's batch started: its failure is this chunk's too.
            let failure = st.failure.clone().filter(|_| st.stop);
            match &mut st.slots[i] {
                Slot::Ready(at) => {
                    let at = at.clone();
                    st.waiting += t.elapsed();
                    return Ok(at);
                }
                Slot::Failed(e) => {
                    let e = e.take().or_else(|| failure.map(|(c, m)| fail(c, m)));
                    let e = e.unwrap_or_else(|| anyhow!("fetching chunk {i} failed"));
                    st.waiting += t.elapsed();
                    return Err(e);
                }
                Slot::Pending if failure.is_some() => {
                    let (c, m) = failure.expect("just checked");
                    st.waiting += t.elapsed();
                    return Err(fail(c, m));
                }
                Slot::Pending if self.threads.iter().all(|t| t.is_finished()) => {
                    return Err(anyhow!(
                        "chunk {i} is not in cache.git and nothing fetches it any more"
                    ));
                }
                Slot::Pending => {
                    // With a timeout, so that fetchers that died (they
                    // cannot, short of a panic) are noticed above.
                    st = self
                        .shared
                        .changed
                        .wait_timeout(st, Duration::from_millis(500))
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }

    /// What was reused and fetched, and how long it took.
    pub fn stats(&self) -> Stats {
        let st = self.shared.lock();
        Stats {
            source: st.source,
            reuse: st.reuse,
            direct: st.direct,
            direct_fallback: st.direct_fallback.clone(),
            fetch_ms: st.fetching.as_millis() as u64,
            wait_ms: st.waiting.as_millis() as u64,
        }
    }
}

impl Drop for Prefetch {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stop = true;
            for &pid in &st.children {
                stop_group(pid);
            }
            self.shared.changed.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Fetches every blob of `oids` that cache.git lacks, before returning
/// (for legacy branches, whose parts carry no declared sizes, so the tree
/// listing must have them). Returns how they arrived.
pub fn fetch_all(git: &CacheGit, remote: &Remote, branch: &str, oids: &[String]) -> Result<Source> {
    let have = git.blob_sizes(oids)?;
    let mut source = Source::Present;
    for (oid, size) in oids.iter().zip(have) {
        if size.is_some() {
            continue;
        }
        match git.fetch_blob(remote, oid, &mut |_| {}) {
            Ok(()) => source = Source::ById,
            Err(BlobFetchError::Refused) => {
                git.refetch_branch(remote, branch, &mut |_| {})?;
                return Ok(Source::Refetch);
            }
            Err(BlobFetchError::NotOnRemote) => {
                return Err(fail(
                    Code::Remote,
                    format!(
                        "cannot fetch blob {oid} of {branch} from {remote}: the remote does not have it (the branch moved during the restore, or the remote repository is damaged): run the restore again"
                    ),
                ));
            }
            Err(BlobFetchError::Failed(why)) => {
                return Err(fail(
                    Code::Remote,
                    format!("cannot fetch blob {oid} of {branch} from {remote}: {why}"),
                ));
            }
            Err(BlobFetchError::Network { code, message }) => {
                return Err(fail(
                    code,
                    format!("cannot fetch blob {oid} of {branch} from {remote}: {message}"),
                ));
            }
        }
    }
    Ok(source)
}
