//! The fetcher threads of a `Prefetch`: the chunks found on this machine
//! hashed before use, the missing ones fetched batch by batch (straight
//! into the chunk store, else by `git fetch`, else the whole branch), and
//! the errors that name the chunk. They only ever add to cache.git and its
//! chunk store, and stop as soon as the reader or a failed batch says so.

use anyhow::Result;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{AHEAD_BYTES, At, Job, Shared, Slot, Source};
use crate::cache::fetch::direct;
use crate::cache::fetch::reuse::{self, Found};
use crate::cache::restore::verify;
use crate::exit::{Code, fail};
use crate::git::BlobFetchError;

impl Job {
    /// Hashes the chunks found in the chunk store or the user's repository
    /// (`local`, in plan order); one that does not match is fetched on its
    /// own.
    pub(super) fn run_local(&self, shared: &Shared, local: &[(usize, Found)]) {
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
    pub(super) fn run_fetcher(&self, shared: &Shared) {
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
            if st.stop || crate::process::signals::ending().is_some() {
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
        if let Some(client) = &self.oci {
            return self.fetch_oci(shared, client, batch);
        }
        let direct_ok = batch.iter().all(|&j| self.pieces[j].sha256.is_some());
        if let Some(server) = self
            .server
            .as_ref()
            .filter(|_| direct_ok && self.direct_on.load(Ordering::SeqCst))
        {
            match self.fetch_resuming(shared, server, batch) {
                Ok(()) => return true,
                Err(direct::Error::Unsupported(why)) => {
                    // Under the lock, so that fetchers see it at once.
                    let mut st = shared.lock();
                    self.direct_on.store(false, Ordering::SeqCst);
                    st.direct_fallback.get_or_insert(why);
                }
                Err(e) => {
                    let first = self.pending(shared, batch).first().copied();
                    let err = self.direct_error(batch, first.unwrap_or(batch[0]), e);
                    shared.fail(batch, err);
                    return false;
                }
            }
            if shared.lock().stop {
                return false;
            }
        }
        let rest = self.pending(shared, batch);
        rest.is_empty() || self.fetch_git(shared, &rest)
    }

    /// The chunks of `batch` from a registry, one blob at a time, each
    /// into the chunk store and ready once stored (hashed on arrival by
    /// `cache::fetch::oci::fetch_chunk`). False when fetching stops.
    fn fetch_oci(&self, shared: &Shared, client: &crate::oci::Client, batch: &[usize]) -> bool {
        for j in self.pending(shared, batch) {
            if shared.lock().stop || crate::process::signals::ending().is_some() {
                return false;
            }
            let piece = &self.pieces[j];
            let Some(sha256) = piece.sha256 else {
                let e = anyhow::anyhow!("chunk {} of {} has no sha256", piece.file, self.label);
                shared.fail(&[j], e);
                return false;
            };
            let dest = self.store.path(&sha256);
            let t = Instant::now();
            let r = self
                .store
                .reserve_tmp(&sha256)
                .map_err(anyhow::Error::from)
                .and_then(|tmp| {
                    let mut track = shared.track();
                    crate::cache::fetch::oci::fetch_chunk(
                        client,
                        &sha256,
                        piece.size,
                        (&tmp, &dest),
                        &mut track,
                    )
                    .inspect_err(|_| {
                        let _ = std::fs::remove_file(&tmp);
                    })
                });
            let mut st = shared.lock();
            st.fetching += t.elapsed();
            match r {
                Ok(()) => {
                    st.reuse.chunks_fetched += 1;
                    st.reuse.bytes_fetched += piece.size;
                    st.source = Source::ById;
                    shared.settle(&mut st, j, Slot::Ready(At::Store(dest)));
                }
                Err(e) => {
                    drop(st);
                    let e = e.context(format!("fetching chunk {} of {}", piece.file, self.label));
                    shared.fail(&[j], e);
                    return false;
                }
            }
        }
        true
    }

    /// The chunks of `chunks` still pending.
    fn pending(&self, shared: &Shared, chunks: &[usize]) -> Vec<usize> {
        let st = shared.lock();
        chunks
            .iter()
            .copied()
            .filter(|&j| matches!(st.slots[j], Slot::Pending))
            .collect()
    }

    /// Direct reads of `batch` until every chunk of it is stored: a
    /// connection cut after some chunks arrived whole is asked again for
    /// the rest at once (each time at least one more chunk is kept, so
    /// this ends). A cut that kept none is tried once more with the chunk
    /// it was carrying alone; cut again, that chunk cannot pass this link,
    /// and the error says so (`Error::Cut`, see `direct_error`).
    fn fetch_resuming(
        &self,
        shared: &Shared,
        server: &direct::Server,
        batch: &[usize],
    ) -> Result<(), direct::Error> {
        let mut alone: Option<usize> = None;
        loop {
            let ask = match alone {
                Some(j) => vec![j],
                None => self.pending(shared, batch),
            };
            if ask.is_empty() || shared.lock().stop {
                return Ok(());
            }
            // A cut this process's own signal handler made (it stops the
            // reader's group) is not the link's: start nothing new.
            if let Some(sig) = crate::process::signals::ending() {
                return Err(direct::Error::Failed(anyhow::anyhow!(
                    "stopped by {}",
                    crate::process::signals::signal_name(sig)
                )));
            }
            match self.fetch_direct(shared, server, &ask) {
                Ok(()) => alone = None,
                Err(direct::Error::Cut { partial, cause }) => {
                    let left = self.pending(shared, &ask);
                    if left.len() < ask.len() {
                        alone = None;
                        continue;
                    }
                    let carried = partial.and_then(|p| ask.get(p.want).copied());
                    if ask.len() > 1 {
                        alone = Some(carried.unwrap_or(left[0]));
                        continue;
                    }
                    // Named by position in the whole plan from here on.
                    let partial = partial.map(|p| direct::Partial { want: ask[0], ..p });
                    return Err(direct::Error::Cut { partial, cause });
                }
                Err(e) => return Err(e),
            }
        }
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
            &|| shared.lock().stop,
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
            direct::Error::Cut { partial, cause } => self.cut_error(first, partial, &cause),
            direct::Error::HungUp(e) => {
                self.fetch_error(first, BlobFetchError::Failed(format!("{e:#}")))
            }
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
            // A full disk is the disk's, never the remote's (exit 1).
            direct::Error::Failed(e) if crate::git::is_disk_full(&e) => self.fetch_error(
                first,
                BlobFetchError::Network {
                    code: Code::Failed,
                    message: format!(
                        "{:#}",
                        crate::git::disk_full_error(
                            "storing it in the chunk store",
                            &self.git.dir.join("chunks"),
                            &format!("{e:#}"),
                        )
                    ),
                },
            ),
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

    /// A chunk that a link cut twice, the second time alone in its
    /// request: it cannot pass, and the restore says which, how big it is
    /// and where the cut fell, instead of asking again forever.
    fn cut_error(
        &self,
        first: usize,
        partial: Option<direct::Partial>,
        cause: &anyhow::Error,
    ) -> anyhow::Error {
        let j = partial.map_or(first, |p| p.want);
        let size = self.pieces[j].size;
        let cut = match partial {
            Some(p) => format!("after {} of its {size} bytes", p.arrived),
            None => "before any of its bytes".to_string(),
        };
        self.fetch_error(
            j,
            BlobFetchError::Network {
                code: Code::Remote,
                message: format!(
                    "the connection was cut {cut} arrived, twice, the second time with this chunk alone ({cause:#}): a chunk of {size} bytes is more than one connection to the remote carries; nothing was installed; restore over a link that does not drop, or publish with a smaller [publish] chunk_bytes"
                ),
            },
        )
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

    pub(super) fn size_check(&self, j: usize, size: u64) -> Result<()> {
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
