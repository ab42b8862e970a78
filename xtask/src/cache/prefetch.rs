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
//! This module only adds objects to cache.git; it never writes elsewhere,
//! and a dropped `Prefetch` stops its git (by pid) and its thread.

use anyhow::{Result, anyhow};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::cache::branch::KeyPlan;
use crate::cache::git::{BlobFetchError, CacheGit, Remote};
use crate::exit::{Code, fail};

/// How many chunks the fetcher may run ahead of the reader: enough that the
/// next chunk is there when the reader wants it, few enough that a restore
/// that fails early has not downloaded the rest.
pub const AHEAD: usize = 2;

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
    /// Time the fetcher spent fetching (it overlaps the unpack).
    pub fetch_ms: u64,
    /// Time the reader spent waiting for a chunk.
    pub wait_ms: u64,
}

enum Slot {
    Pending,
    Ready,
    /// Taken by the first `wait` that sees it.
    Failed(Option<anyhow::Error>),
}

struct State {
    slots: Vec<Slot>,
    /// The highest chunk the reader asked for.
    reader_at: usize,
    stop: bool,
    /// The running `git fetch`, to stop it on drop.
    child: Option<u32>,
    source: Source,
    fetched: u64,
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

    /// Records the running git's process group (`None`: it has exited). A
    /// git that starts after the reader hung up is stopped at once.
    fn register(&self, pid: Option<u32>) {
        let mut st = self.lock();
        if let (true, Some(pid)) = (st.stop, pid) {
            stop_group(pid);
        }
        st.child = pid;
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
    files: Vec<String>,
    sizes: Vec<u64>,
    label: String,
    fix: String,
}

impl Prefetch {
    /// Looks up which chunks of `kp` cache.git lacks and starts fetching
    /// them from `remote` (the branch `branch` was fetched from). Chunks
    /// already there are checked for size now.
    pub fn start(git: &CacheGit, remote: &Remote, branch: &str, kp: &KeyPlan) -> Result<Prefetch> {
        let have = git.blob_sizes(&kp.oids)?;
        let job = Job {
            git: git.clone(),
            remote: remote.clone(),
            branch: branch.to_string(),
            oids: kp.oids.clone(),
            files: kp.plan.pieces.iter().map(|p| p.file.clone()).collect(),
            sizes: kp.plan.pieces.iter().map(|p| p.size).collect(),
            label: kp.plan.label.clone(),
            fix: kp.plan.fix.clone(),
        };
        let slots: Vec<Slot> = have
            .iter()
            .enumerate()
            .map(|(i, size)| match size {
                None => Slot::Pending,
                Some(s) => match job.size_check(i, *s) {
                    Ok(()) => Slot::Ready,
                    Err(e) => Slot::Failed(Some(e)),
                },
            })
            .collect();
        let missing = slots.iter().any(|s| matches!(s, Slot::Pending));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                slots,
                reader_at: 0,
                stop: false,
                child: None,
                source: Source::Present,
                fetched: 0,
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

    /// Blocks until chunk `i` is in cache.git, or returns why it never will be.
    pub fn wait(&self, i: usize) -> Result<()> {
        let t = Instant::now();
        let mut st = self.shared.lock();
        if i > st.reader_at {
            st.reader_at = i;
            self.shared.changed.notify_all();
        }
        loop {
            match &mut st.slots[i] {
                Slot::Ready => break,
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
        st.waiting += t.elapsed();
        Ok(())
    }

    /// What was fetched, and how long it took.
    pub fn stats(&self) -> Stats {
        let st = self.shared.lock();
        Stats {
            source: st.source,
            fetched: st.fetched,
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
            if let Some(pid) = st.child {
                stop_group(pid);
            }
            self.shared.changed.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Job {
    fn run(&self, shared: &Shared) {
        for j in 0..self.oids.len() {
            {
                let mut st = shared.lock();
                if !matches!(st.slots[j], Slot::Pending) {
                    continue;
                }
                while !st.stop && j > st.reader_at + AHEAD {
                    st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
                }
                if st.stop {
                    return;
                }
            }
            let t = Instant::now();
            let fetched = self
                .git
                .fetch_blob(&self.remote, &self.oids[j], &mut |pid| shared.register(pid));
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
                    let r = self
                        .git
                        .refetch_branch(&self.remote, &self.branch, &mut |pid| {
                            shared.register(pid)
                        });
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

    /// The slot of chunk `j` once a fetch said it arrived: ready if it is
    /// in cache.git with its declared size.
    fn arrived(&self, j: usize) -> Slot {
        match self.git.blob_sizes(std::slice::from_ref(&self.oids[j])) {
            Ok(sizes) => match sizes.first().copied().flatten() {
                Some(size) => match self.size_check(j, size) {
                    Ok(()) => Slot::Ready,
                    Err(e) => Slot::Failed(Some(e)),
                },
                None => Slot::Failed(Some(self.fetch_error(j, BlobFetchError::NotOnRemote))),
            },
            Err(e) => Slot::Failed(Some(e)),
        }
    }

    fn size_check(&self, j: usize, size: u64) -> Result<()> {
        let want = self.sizes[j];
        if size == want {
            return Ok(());
        }
        let how = if size < want { "truncated" } else { "too long" };
        Err(fail(
            Code::Verify,
            format!(
                "chunk {} of {} is {size} bytes but warmstart.json says {want} ({how}): {}",
                self.files[j], self.label, self.fix
            ),
        ))
    }

    fn fetch_error(&self, j: usize, e: BlobFetchError) -> anyhow::Error {
        let oid = &self.oids[j];
        let short = &oid[..oid.len().min(12)];
        let what = format!(
            "cannot fetch chunk {} of {} (blob {short}) from {}",
            self.files[j], self.label, self.remote
        );
        fail(
            Code::Remote,
            match e {
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
        }
    }
    Ok(source)
}
