//! The extractor's writer pool: threads that create regular files from owned
//! buffers while the main thread keeps parsing and checking the tar stream.
//!
//! File creation (inode allocation, then the data) is most of an unpack's
//! time, and the kernel does it on the calling thread; two threads creating
//! files overlap that work. The pool only ever creates new files with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` at paths whose parents the main thread
//! has already checked and created: it decides nothing about safety.
//!
//! Memory is bounded by `budget` bytes of queued file data (plus a fixed
//! charge per job), whatever the archive's size. The first failure stops the
//! pool: queued jobs are dropped, and the failure of the earliest entry in
//! archive order among those attempted is what `wait_idle` and `submit` report.

use anyhow::{Context, Result};
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::create::{create_file, finish_file};

/// What each queued job costs against the budget on top of its data, so
/// that a stream of empty files is bounded too.
const JOB_CHARGE: u64 = 4096;

/// One regular file to create.
pub(super) struct Job {
    /// Position of the entry in the archive (first failure wins by this).
    pub seq: u64,
    /// The entry's name as the archive spells it (for messages).
    pub name: String,
    /// Where to create it: the destination joined with the checked path.
    pub path: PathBuf,
    pub mode: u32,
    pub mtime: u64,
    pub data: Vec<u8>,
}

impl Job {
    fn cost(&self) -> u64 {
        self.data.len() as u64 + JOB_CHARGE
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    /// Cost of the queued jobs and of those being written.
    in_flight: u64,
    /// Jobs queued or being written.
    pending: usize,
    /// No more jobs will come: workers exit once the queue is empty.
    closed: bool,
    /// The failure with the lowest `seq` so far.
    error: Option<(u64, anyhow::Error)>,
}

pub(super) struct Writers {
    budget: u64,
    state: Mutex<State>,
    /// Signalled when a job is queued or the pool closes.
    work: Condvar,
    /// Signalled when a job finishes (budget freed, maybe idle).
    done: Condvar,
}

impl Writers {
    pub fn new(budget: u64) -> Writers {
        Writers {
            budget,
            state: Mutex::new(State::default()),
            work: Condvar::new(),
            done: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A worker never panics while holding the lock (it only moves jobs
        // and counters), so a poisoned lock still holds consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `job`, waiting while the budget is spent. Fails with the pool's
    /// first failure (after letting the jobs in progress finish) if a writer
    /// failed, in which case `job` is not written.
    pub fn submit(&self, job: Job) -> Result<()> {
        let cost = job.cost();
        let mut st = self.lock();
        loop {
            if st.error.is_some() {
                drop(st);
                return self.wait_idle();
            }
            // One job may always go in, however large, so nothing deadlocks.
            if st.in_flight == 0 || st.in_flight + cost <= self.budget {
                break;
            }
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st.in_flight += cost;
        st.pending += 1;
        st.queue.push_back(job);
        drop(st);
        self.work.notify_one();
        Ok(())
    }

    /// Waits until every queued file is complete; returns the first failure.
    pub fn wait_idle(&self) -> Result<()> {
        let mut st = self.lock();
        while st.pending > 0 {
            st = self.done.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        match st.error.take() {
            Some((_, err)) => Err(err),
            None => Ok(()),
        }
    }

    /// Drops the jobs not yet started and lets the workers exit once the
    /// ones in progress are done (the caller's thread scope joins them).
    pub fn close(&self, abandon: bool) {
        let mut st = self.lock();
        if abandon {
            let dropped = st.queue.len();
            let freed: u64 = st.queue.drain(..).map(|j| j.cost()).sum();
            st.pending -= dropped;
            st.in_flight -= freed;
        }
        st.closed = true;
        drop(st);
        self.work.notify_all();
        self.done.notify_all();
    }

    /// A worker thread's loop: takes jobs until the pool closes.
    pub fn work(&self) {
        let mut st = self.lock();
        loop {
            let job = match st.queue.pop_front() {
                Some(job) => job,
                None if st.closed => return,
                None => {
                    st = self.work.wait(st).unwrap_or_else(|e| e.into_inner());
                    continue;
                }
            };
            drop(st);
            let (seq, cost) = (job.seq, job.cost());
            // A panic must not leave `pending` counting a job forever.
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write_job(job)))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("a writer thread panicked")));
            st = self.lock();
            if let Err(err) = result {
                if st.error.as_ref().is_none_or(|(s, _)| seq < *s) {
                    st.error = Some((seq, err));
                }
                // Stop: nothing queued after a failure is written.
                let dropped = st.queue.len();
                let freed: u64 = st.queue.drain(..).map(|j| j.cost()).sum();
                st.pending -= dropped;
                st.in_flight -= freed;
            }
            st.pending -= 1;
            st.in_flight -= cost;
            self.done.notify_all();
        }
    }
}

fn write_job(job: Job) -> Result<()> {
    let mut file = create_file(&job.path, &job.name)?;
    file.write_all(&job.data)
        .with_context(|| format!("writing {}", job.path.display()))?;
    finish_file(&file, &job.path, job.mode, job.mtime)
}
