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
//! When the remote is a repository on this machine, a smart HTTP(S) server
//! or an ssh server, a batch is read straight from `git upload-pack`'s
//! answer into the chunk store (`cache::fetch::direct`), each chunk hashed as it
//! arrives and ready as soon as it is stored. Anything else, and every
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
//! This module only adds objects to cache.git and files to its chunk
//! store; it reads the user's repository and never writes to it, and a
//! dropped `Prefetch` stops its git (by process group) and its threads.

use anyhow::{Result, anyhow};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cache::fetch::direct::{self, Store};
use crate::cache::fetch::reuse::{self, Found};
use crate::cache::restore::branch::KeyPlan;
use crate::cache::restore::verify;
use crate::exit::{Code, fail};
use crate::git::{BlobFetchError, CacheGit, Remote};

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

impl Prefetch {
    /// Finds the chunks of `kp` on this machine (`cache::fetch::reuse`) and starts
    /// fetching the others from `remote` (the branch `branch` was fetched
    /// from). `fresh` are blobs this run's branch fetch brought into
    /// cache.git: fetched, not reused. Chunks in cache.git are checked for
    /// size now.
    pub fn start(
        git: &CacheGit,
        remote: &Remote,
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
        let (server, skipped) = match direct::choose_server(remote, git) {
            Ok(s) => (Some(s), None),
            Err(why) => (None, Some(why)),
        };
        let offsets = sizes
            .iter()
            .scan(0u64, |at, s| {
                let here = *at;
                *at += s;
                Some(here)
            })
            .collect();
        let job = Arc::new(Job {
            git: git.clone(),
            remote: remote.clone(),
            branch: branch.to_string(),
            oids: kp.oids.clone(),
            pieces,
            offsets,
            store,
            server,
            direct_on: AtomicBool::new(true),
            git_fetch: Mutex::new(()),
            label: kp.plan.label.clone(),
            fix: kp.plan.fix.clone(),
        });
        let mut reuse = Reuse::default();
        let slots: Vec<Slot> = (0..found.len())
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

impl Job {
    /// Hashes the chunks found in the chunk store or the user's repository
    /// (`local`, in plan order); one that does not match is fetched on its
    /// own.
    fn run_local(&self, shared: &Shared, local: &[(usize, Found)]) {
        let mut clone: Option<reuse::Clone> = None;
        for &(j, found) in local {
            if shared.lock().stop {
                return;
            }
            let digest = self.pieces[j]
                .sha256
                .expect("only v1 chunks are found locally");
            let size = self.pieces[j].size;
            let taken = match found {
                Found::Store => self.store.check(&digest, size),
                _ => {
                    if clone.is_none() {
                        clone = reuse::Clone::open(&self.git).ok();
                    }
                    // A repository that cannot be read gives nothing.
                    Ok(clone
                        .as_mut()
                        .is_some_and(|c| c.check(&self.oids[j], size, &digest).unwrap_or(false)))
                }
            };
            match taken {
                Ok(true) => {
                    let mut st = shared.lock();
                    st.reuse.chunks_reused += 1;
                    let at = if found == Found::Clone {
                        st.reuse.chunks_from_clone += 1;
                        At::Clone(self.oids[j].clone())
                    } else {
                        At::Store(self.store.path(&digest))
                    };
                    shared.settle(&mut st, j, Slot::Ready(at));
                }
                Ok(false) => {
                    // Damaged, or not the declared bytes: fetched instead.
                    if !self.fetch_batch(shared, &[j]) {
                        return;
                    }
                }
                Err(e) => return shared.fail(&[j], e),
            }
        }
    }

    /// Fetches queued batches until none is left or one failed.
    fn run_fetcher(&self, shared: &Shared) {
        while let Some(batch) = self.next_batch(shared) {
            if !self.fetch_batch(shared, &batch) {
                return;
            }
        }
    }

    /// The next batch, once it starts at most `AHEAD_BYTES` past the chunk
    /// being read; `None` when the queue is empty or fetching stopped.
    fn next_batch(&self, shared: &Shared) -> Option<Vec<usize>> {
        let mut st = shared.lock();
        loop {
            if st.stop {
                return None;
            }
            let first = *st.queue.front()?.first()?;
            if self.offsets[first] <= self.offsets[st.reader_at] + AHEAD_BYTES {
                return st.queue.pop_front();
            }
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Fetches the chunks of `batch`: straight into the chunk store when
    /// the direct reader can, else (and for what it left when it gave up
    /// on the server) with one `git fetch`. False when fetching stops.
    fn fetch_batch(&self, shared: &Shared, batch: &[usize]) -> bool {
        let direct_ok = batch.iter().all(|&j| self.pieces[j].sha256.is_some());
        if let Some(server) = self
            .server
            .as_ref()
            .filter(|_| direct_ok && self.direct_on.load(Ordering::SeqCst))
        {
            match self.fetch_direct(shared, server, batch) {
                Ok(()) => return true,
                Err(direct::Error::Unsupported(why)) => {
                    // Under the lock, so that fetchers see it at once.
                    let mut st = shared.lock();
                    self.direct_on.store(false, Ordering::SeqCst);
                    st.direct_fallback.get_or_insert(why);
                }
                Err(e) => {
                    let first = {
                        let st = shared.lock();
                        let pending = batch
                            .iter()
                            .find(|&&j| matches!(st.slots[j], Slot::Pending));
                        pending.copied().unwrap_or(batch[0])
                    };
                    let err = self.direct_error(batch, first, e);
                    shared.fail(batch, err);
                    return false;
                }
            }
            if shared.lock().stop {
                return false;
            }
        }
        let rest: Vec<usize> = {
            let st = shared.lock();
            batch
                .iter()
                .copied()
                .filter(|&j| matches!(st.slots[j], Slot::Pending))
                .collect()
        };
        rest.is_empty() || self.fetch_git(shared, &rest)
    }

    /// One direct read of `batch` into the chunk store; each chunk is
    /// ready as soon as it is stored.
    fn fetch_direct(
        &self,
        shared: &Shared,
        server: &direct::Server,
        batch: &[usize],
    ) -> Result<(), direct::Error> {
        let wants: Vec<direct::Want> = batch
            .iter()
            .map(|&j| direct::Want {
                oid: self.oids[j].clone(),
                size: self.pieces[j].size,
                sha256: self.pieces[j].sha256.expect("checked by the caller"),
            })
            .collect();
        let t = Instant::now();
        let mut on_stored = |k: usize| {
            let j = batch[k];
            let mut st = shared.lock();
            st.reuse.chunks_fetched += 1;
            st.reuse.bytes_fetched += self.pieces[j].size;
            st.direct += 1;
            st.source = Source::ById;
            let at = At::Store(self.store.path(&wants[k].sha256));
            shared.settle(&mut st, j, Slot::Ready(at));
        };
        let r = direct::fetch(
            &self.git,
            server,
            &wants,
            &self.store,
            &mut shared.track(),
            &mut on_stored,
        );
        let mut st = shared.lock();
        st.fetching += t.elapsed();
        if st.stop {
            return Ok(());
        }
        r
    }

    /// The error of a direct read that failed for a reason other than an
    /// unsupported server.
    /// `first` is the earliest chunk of the batch still pending.
    fn direct_error(&self, batch: &[usize], first: usize, e: direct::Error) -> anyhow::Error {
        match e {
            direct::Error::Unsupported(_) => unreachable!("handled by the caller"),
            direct::Error::NotOnRemote(oid) => {
                let j = oid
                    .and_then(|o| batch.iter().copied().find(|&j| self.oids[j] == o))
                    .unwrap_or(first);
                self.fetch_error(j, BlobFetchError::NotOnRemote)
            }
            direct::Error::Digest { want, got } => {
                let j = batch[want];
                let expected = self.pieces[j].sha256.expect("checked by the caller");
                verify::chunk_mismatch(
                    &self.pieces[j].file,
                    &self.label,
                    &got,
                    &expected,
                    &self.fix,
                )
            }
            direct::Error::Failed(e) => self.fetch_error(
                first,
                match crate::exit::code_of(&e) {
                    Code::Failed => BlobFetchError::Failed(format!("{e:#}")),
                    code => BlobFetchError::Network {
                        code,
                        message: format!("{e:#}"),
                    },
                },
            ),
        }
    }

    /// One `git fetch` of the blobs of `chunks` into cache.git (or, for a
    /// server that refuses blobs by id, the whole branch). False when
    /// fetching stops.
    fn fetch_git(&self, shared: &Shared, chunks: &[usize]) -> bool {
        let _one = self.git_fetch.lock().unwrap_or_else(|p| p.into_inner());
        let oids: Vec<String> = chunks.iter().map(|&j| self.oids[j].clone()).collect();
        let t = Instant::now();
        let fetched = self
            .git
            .fetch_blobs(&self.remote, &oids, &mut shared.track());
        {
            let mut st = shared.lock();
            st.fetching += t.elapsed();
            if st.stop {
                return false;
            }
        }
        match fetched {
            Ok(()) => {
                let arrived: Vec<(usize, Slot)> =
                    chunks.iter().map(|&j| (j, self.arrived(j))).collect();
                let mut st = shared.lock();
                let mut ok = true;
                for (j, slot) in arrived {
                    ok &= !matches!(slot, Slot::Failed(_));
                    if matches!(slot, Slot::Ready(_)) {
                        st.reuse.chunks_fetched += 1;
                        st.reuse.bytes_fetched += self.pieces[j].size;
                        st.source = Source::ById;
                    }
                    shared.settle(&mut st, j, slot);
                }
                st.stop |= !ok;
                ok
            }
            Err(BlobFetchError::Refused) => {
                self.refetch(shared);
                false
            }
            Err(e) => {
                shared.fail(chunks, self.fetch_error(chunks[0], e));
                false
            }
        }
    }

    /// The server refuses blobs by id: the branch is fetched whole, and
    /// every chunk still pending is taken from what arrived.
    fn refetch(&self, shared: &Shared) {
        let t = Instant::now();
        let r = self
            .git
            .refetch_branch(&self.remote, &self.branch, &mut shared.track());
        let pending: Vec<usize> = {
            let mut st = shared.lock();
            st.fetching += t.elapsed();
            st.source = Source::Refetch;
            st.queue.clear();
            (0..st.slots.len())
                .filter(|&j| matches!(st.slots[j], Slot::Pending))
                .collect()
        };
        let slots: Vec<(usize, Slot)> = pending
            .iter()
            .map(|&k| {
                let slot = match &r {
                    Ok(_) => self.arrived(k),
                    Err(e) => Slot::Failed(Some(fail(crate::exit::code_of(e), format!("{e:#}")))),
                };
                (k, slot)
            })
            .collect();
        let mut st = shared.lock();
        for (k, slot) in slots {
            // Not by id: only the bytes count.
            if matches!(slot, Slot::Ready(_)) {
                st.reuse.bytes_fetched += self.pieces[k].size;
            }
            shared.settle(&mut st, k, slot);
        }
    }

    /// The slot of chunk `j` once a fetch said it arrived: ready if it is
    /// in cache.git with its declared size.
    fn arrived(&self, j: usize) -> Slot {
        match self.git.blob_sizes(std::slice::from_ref(&self.oids[j])) {
            Ok(sizes) => match sizes.first().copied().flatten() {
                Some(size) => match self.size_check(j, size) {
                    Ok(()) => Slot::Ready(At::Git),
                    Err(e) => Slot::Failed(Some(e)),
                },
                None => Slot::Failed(Some(self.fetch_error(j, BlobFetchError::NotOnRemote))),
            },
            Err(e) => Slot::Failed(Some(e)),
        }
    }

    fn size_check(&self, j: usize, size: u64) -> Result<()> {
        if size == self.pieces[j].size {
            return Ok(());
        }
        Err(self.size_error(j, size))
    }

    fn size_error(&self, j: usize, size: u64) -> anyhow::Error {
        let want = self.pieces[j].size;
        let how = if size < want { "truncated" } else { "too long" };
        fail(
            Code::Verify,
            format!(
                "chunk {} of {} is {size} bytes but warmstart.json says {want} ({how}): {}",
                self.pieces[j].file, self.label, self.fix
            ),
        )
    }

    fn fetch_error(&self, j: usize, e: BlobFetchError) -> anyhow::Error {
        let oid = &self.oids[j];
        let short = &oid[..oid.len().min(12)];
        let what = format!(
            "cannot fetch chunk {} of {} (blob {short}) from {}",
            self.pieces[j].file, self.label, self.remote
        );
        if let BlobFetchError::Network { code, message } = e {
            return fail(code, format!("{what}: {message}"));
        }
        fail(
            Code::Remote,
            match e {
                BlobFetchError::Network { .. } => unreachable!("handled above"),
                BlobFetchError::NotOnRemote => format!(
                    "{what}: the remote does not have it (the branch moved during the restore, or the remote repository is damaged): nothing was installed; run the restore again, and if this repeats, {}",
                    self.fix
                ),
                BlobFetchError::Failed(why) => format!("{what}: {why}"),
                BlobFetchError::Refused => {
                    format!("{what}: the server refuses objects by id")
                }
            },
        )
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
