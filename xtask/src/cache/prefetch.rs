//! Chunks fetched by id in the background, a little ahead of the reader.
//!
//! A branch fetch (`CacheGit::try_fetch_branch`) leaves big chunks out, so a
//! restore can start as soon as the commit, the tree and the small files
//! have arrived. `Prefetch` then fetches the chunks one by one, in plan
//! order, at most `AHEAD` chunks ahead of the one being read, while
//! `verify::stream` hashes, decodes and unpacks the earlier ones; `wait(i)`
//! blocks the reader until chunk `i` is in cache.git. Git's own SHA-1 pass
//! over what it receives is not what authenticates a chunk: `verify` hashes
//! every byte against `warmstart.json` before the decoder sees it.
//!
//! Fallbacks: chunks already in cache.git (an earlier restore, or a server
//! that ignored the filter and sent everything) are not fetched; a server
//! that refuses a `want` by id (protocol v0 without
//! `uploadpack.allow*SHA1InWant`) gets one whole fetch of the branch
//! (`CacheGit::refetch_branch`), as before this module existed.
//!
//! When the remote is a repository on this machine, a smart HTTP(S)
//! server or an ssh server, chunks are read straight from
//! `git upload-pack`'s answer into
//! the chunk store instead (`cache::direct`), `PARALLEL` at a time, hashed
//! as they arrive; a chunk already in the store
//! is hashed again before it is used, and one that does not match is
//! fetched again. If that reader meets a server it does not handle, this
//! chunk and the rest go through `git fetch`.
//!
//! This module only adds objects to cache.git and files to its chunk
//! store; it never writes elsewhere, and a dropped `Prefetch` stops its
//! git (by process group) and its thread.

use anyhow::{Result, anyhow};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cache::branch::KeyPlan;
use crate::cache::direct::{self, Store};
use crate::cache::git::{BlobFetchError, CacheGit, Remote};
use crate::cache::verify;
use crate::exit::{Code, fail};

/// How many chunks the fetcher may run ahead of the reader: enough that the
/// next chunk is there when the reader wants it, few enough that a restore
/// that fails early has not downloaded the rest.
pub const AHEAD: usize = 2;

/// How many chunks are read at once by `cache::direct`. One
/// `git pack-objects`, which SHA-1s all it sends, delivers about 100 MB/s
/// while the unpack runs, less than the unpack takes: two keep the reader
/// from waiting (measured in BENCHMARKS.md).
pub const PARALLEL: usize = 2;

/// How the chunks of a plan reached cache.git.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Every chunk was already there (the branch fetch brought it, or an
    /// earlier run did): nothing fetched.
    Present,
    /// Fetched by id, overlapping the unpack.
    ById,
    /// The server refused blobs by id: the branch was fetched whole.
    Refetch,
}

/// What the fetcher did.
#[derive(Clone, Debug)]
pub struct Stats {
    pub source: Source,
    /// Chunks fetched by id.
    pub fetched: u64,
    /// Of those, chunks read straight from the pack stream into the chunk
    /// store (`cache::direct`).
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
    stop: bool,
    /// The process groups of the running fetches, to stop them on drop.
    children: Vec<u32>,
    source: Source,
    fetched: u64,
    direct: u64,
    /// Why the direct reader was given up, if it was.
    direct_fallback: Option<String>,
    fetching: Duration,
    waiting: Duration,
}

struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A callback for one fetch at a time (`CacheGit::fetch_blob`,
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

/// The chunks of one plan, being fetched.
pub struct Prefetch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// What the fetcher needs to know about the plan, owned by its thread.
struct Job {
    git: CacheGit,
    remote: Remote,
    branch: String,
    oids: Vec<String>,
    /// The plan's pieces: file names, declared sizes and digests.
    pieces: Vec<verify::Piece>,
    store: Store,
    /// The remote's server, when `cache::direct` can read from it.
    server: Option<direct::Server>,
    /// Cleared when `cache::direct` met a server it does not handle.
    direct_on: AtomicBool,
    label: String,
    fix: String,
}

impl Prefetch {
    /// Looks up which chunks of `kp` cache.git lacks and starts fetching
    /// them from `remote` (the branch `branch` was fetched from). Chunks
    /// already there are checked for size now.
    pub fn start(git: &CacheGit, remote: &Remote, branch: &str, kp: &KeyPlan) -> Result<Prefetch> {
        let have = git.blob_sizes(&kp.oids)?;
        let (server, skipped) = match direct::choose_server(remote, git) {
            Ok(s) => (Some(s), None),
            Err(why) => (None, Some(why)),
        };
        let job = Job {
            git: git.clone(),
            remote: remote.clone(),
            branch: branch.to_string(),
            oids: kp.oids.clone(),
            pieces: kp.plan.pieces.clone(),
            store: Store::of(git),
            server,
            direct_on: AtomicBool::new(true),
            label: kp.plan.label.clone(),
            fix: kp.plan.fix.clone(),
        };
        let slots: Vec<Slot> = have
            .iter()
            .enumerate()
            .map(|(i, size)| match size {
                None => Slot::Pending,
                Some(s) => match job.size_check(i, *s) {
                    Ok(()) => Slot::Ready(At::Git),
                    Err(e) => Slot::Failed(Some(e)),
                },
            })
            .collect();
        job.store.sweep();
        let missing = slots.iter().any(|s| matches!(s, Slot::Pending));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots,
                reader_at: 0,
                stop: false,
                children: Vec::new(),
                source: Source::Present,
                fetched: 0,
                direct: 0,
                // Why the direct reader is not used, when it is needed.
                direct_fallback: skipped.filter(|_| missing),
                fetching: Duration::ZERO,
                waiting: Duration::ZERO,
            }),
            changed: Condvar::new(),
        });
        let thread = missing.then(|| {
            let shared = shared.clone();
            std::thread::spawn(move || job.run(&shared))
        });
        Ok(Prefetch { shared, thread })
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
            match &mut st.slots[i] {
                Slot::Ready(at) => {
                    let at = at.clone();
                    st.waiting += t.elapsed();
                    return Ok(at);
                }
                Slot::Failed(e) => {
                    let e = e
                        .take()
                        .unwrap_or_else(|| anyhow!("fetching chunk {i} failed (reported above)"));
                    st.waiting += t.elapsed();
                    return Err(e);
                }
                Slot::Pending if self.thread.as_ref().is_none_or(|t| t.is_finished()) => {
                    return Err(anyhow!(
                        "chunk {i} is not in cache.git and nothing fetches it any more"
                    ));
                }
                Slot::Pending => {
                    // With a timeout, so that a fetcher that died (it
                    // cannot, short of a panic) is noticed above.
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

    /// What was fetched, and how long it took.
    pub fn stats(&self) -> Stats {
        let st = self.shared.lock();
        Stats {
            source: st.source,
            fetched: st.fetched,
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
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What `Job::take_from_store` did with a chunk.
enum Step {
    /// Its slot is set: on to the next chunk.
    Done,
    /// Its slot is set to a failure, or the reader hung up: stop.
    Stop,
    /// Fetch it with `git fetch`.
    Fetch,
}

/// Whether a fetcher should fetch chunk `j` now.
enum Turn {
    Go,
    /// It is here already (or failed).
    Skip,
    /// The reader hung up.
    Stop,
}

impl Job {
    fn run(self, shared: &Shared) {
        if self.server.is_some() {
            // Chunks from the store, or read straight from the server, by
            // `PARALLEL` fetchers taking the next chunk in turn.
            let next = AtomicUsize::new(0);
            std::thread::scope(|s| {
                for _ in 0..PARALLEL {
                    s.spawn(|| self.run_direct(shared, &next));
                }
            });
            if shared.lock().stop {
                return;
            }
        }
        // What is left: everything when the remote is elsewhere, else the
        // chunks from the first one the direct reader could not handle.
        self.run_git(shared)
    }

    fn run_direct(&self, shared: &Shared, next: &AtomicUsize) {
        loop {
            let j = next.fetch_add(1, Ordering::SeqCst);
            if j >= self.oids.len() || !self.direct_on.load(Ordering::SeqCst) {
                return;
            }
            match self.turn(shared, j, true) {
                Turn::Go => {}
                Turn::Skip => continue,
                Turn::Stop => return,
            }
            match self.take_from_store(j, shared) {
                Step::Done => {}
                Step::Stop | Step::Fetch => return,
            }
        }
    }

    /// Waits until chunk `j` is at most `AHEAD` chunks ahead of the reader.
    /// `Skip` when it is not pending (here, or failed); `Stop` when the
    /// reader hung up, and for a direct fetcher (`direct`) also when the
    /// direct reader was given up: the reader may be waiting for an earlier
    /// chunk that only `run_git` will fetch now.
    fn turn(&self, shared: &Shared, j: usize, direct: bool) -> Turn {
        let mut st = shared.lock();
        if !matches!(st.slots[j], Slot::Pending) {
            return Turn::Skip;
        }
        loop {
            if st.stop || (direct && !self.direct_on.load(Ordering::SeqCst)) {
                return Turn::Stop;
            }
            if j <= st.reader_at + AHEAD {
                return Turn::Go;
            }
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Fetches the chunks still pending, one by one, with `git fetch`, up
    /// to the first that failed (the reader stops there).
    fn run_git(&self, shared: &Shared) {
        for j in 0..self.oids.len() {
            if matches!(shared.lock().slots[j], Slot::Failed(_)) {
                return;
            }
            match self.turn(shared, j, false) {
                Turn::Go => {}
                Turn::Skip => continue,
                Turn::Stop => return,
            }
            match self.take_from_store(j, shared) {
                Step::Done => continue,
                Step::Stop => return,
                Step::Fetch => {}
            }
            let t = Instant::now();
            let fetched = self
                .git
                .fetch_blob(&self.remote, &self.oids[j], &mut shared.track());
            let mut st = shared.lock();
            st.fetching += t.elapsed();
            if st.stop {
                return;
            }
            match fetched {
                Ok(()) => {
                    st.fetched += 1;
                    st.source = Source::ById;
                    drop(st);
                    let slot = self.arrived(j);
                    let failed = matches!(slot, Slot::Failed(_));
                    shared.lock().slots[j] = slot;
                    shared.changed.notify_all();
                    if failed {
                        return;
                    }
                }
                Err(BlobFetchError::Refused) => {
                    drop(st);
                    let t = Instant::now();
                    let r =
                        self.git
                            .refetch_branch(&self.remote, &self.branch, &mut shared.track());
                    let mut st = shared.lock();
                    st.fetching += t.elapsed();
                    st.source = Source::Refetch;
                    drop(st);
                    // Fill every pending slot from what is there now.
                    let slots: Vec<(usize, Slot)> = (j..self.oids.len())
                        .map(|k| {
                            let slot = match &r {
                                Ok(_) => self.arrived(k),
                                Err(e) => Slot::Failed(Some(fail(
                                    crate::exit::code_of(e),
                                    format!("{e:#}"),
                                ))),
                            };
                            (k, slot)
                        })
                        .collect();
                    let mut st = shared.lock();
                    for (k, slot) in slots {
                        if matches!(st.slots[k], Slot::Pending) {
                            st.slots[k] = slot;
                        }
                    }
                    shared.changed.notify_all();
                    return;
                }
                Err(e) => {
                    st.slots[j] = Slot::Failed(Some(self.fetch_error(j, e)));
                    shared.changed.notify_all();
                    return;
                }
            }
        }
    }

    /// Chunk `j` from the chunk store: kept there by an earlier run (and
    /// hashed again now), or read straight from a remote on this machine
    /// (`cache::direct`). `Step::Fetch` when it has to come through
    /// `git fetch`: a legacy piece without a digest, a remote elsewhere, or
    /// a server the direct reader does not handle (then for every later
    /// chunk too).
    fn take_from_store(&self, j: usize, shared: &Shared) -> Step {
        let Some(digest) = self.pieces[j].sha256 else {
            return Step::Fetch;
        };
        let slot = match self.store.check(&digest, self.pieces[j].size) {
            Ok(true) => Slot::Ready(At::Store(self.store.path(&digest))),
            Err(e) => Slot::Failed(Some(e)),
            Ok(false) => {
                let Some(server) = self
                    .server
                    .as_ref()
                    .filter(|_| self.direct_on.load(Ordering::SeqCst))
                else {
                    return Step::Fetch;
                };
                let t = Instant::now();
                let r = direct::fetch(
                    &self.git,
                    server,
                    &self.oids[j],
                    self.pieces[j].size,
                    &digest,
                    &self.store,
                    &mut shared.track(),
                );
                let mut st = shared.lock();
                st.fetching += t.elapsed();
                if st.stop {
                    return Step::Stop;
                }
                match r {
                    Ok(()) => {
                        st.fetched += 1;
                        st.direct += 1;
                        st.source = Source::ById;
                        Slot::Ready(At::Store(self.store.path(&digest)))
                    }
                    Err(direct::Error::Unsupported(why)) => {
                        // Under the lock, so that a direct fetcher waiting
                        // in `turn` sees it when it wakes.
                        self.direct_on.store(false, Ordering::SeqCst);
                        st.direct_fallback.get_or_insert(why);
                        shared.changed.notify_all();
                        return Step::Fetch;
                    }
                    Err(direct::Error::NotOnRemote) => {
                        Slot::Failed(Some(self.fetch_error(j, BlobFetchError::NotOnRemote)))
                    }
                    Err(direct::Error::Size(n)) => Slot::Failed(Some(self.size_error(j, n))),
                    Err(direct::Error::Digest(got)) => Slot::Failed(Some(verify::chunk_mismatch(
                        &self.pieces[j].file,
                        &self.label,
                        &got,
                        &digest,
                        &self.fix,
                    ))),
                    Err(direct::Error::Failed(e)) => Slot::Failed(Some(self.fetch_error(
                        j,
                        match crate::exit::code_of(&e) {
                            Code::Failed => BlobFetchError::Failed(format!("{e:#}")),
                            code => BlobFetchError::Network {
                                code,
                                message: format!("{e:#}"),
                            },
                        },
                    ))),
                }
            }
        };
        let failed = matches!(slot, Slot::Failed(_));
        shared.lock().slots[j] = slot;
        shared.changed.notify_all();
        if failed { Step::Stop } else { Step::Done }
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
