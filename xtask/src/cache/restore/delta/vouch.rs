//! Vouching for a full install: while the extractor unpacks the verified
//! stream, a copy of the bytes it reads goes to a thread beside it that
//! reads the same tar again, entry by entry, and compares each with the
//! key's file index (path, kind, size, and the sha256 of a regular file's
//! bytes, hashed here). The install's record is marked verified only when
//! every entry agreed, so the next delta links its files on their stat
//! alone instead of hashing each one.
//!
//! It never writes, never decides what the extractor installs and never
//! slows it down by more than a copy of the bytes into a bounded queue: a
//! disagreement (a lying index, a tar the extractor refused) only leaves
//! the record unverified, which costs the next delta a hash of each file
//! it links (the index is never trusted about the tar it came with).

use super::*;
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};

/// Bytes the tee collects before it hands them to the checker.
const BATCH: usize = 256 << 10;

/// Batches queued at once: at most 4 MiB of the stream held twice.
const DEPTH: usize = 16;

/// Unpacks the key of `ctx` into `dest` as `restore::unpack_into` does and,
/// when `index` is the key's checked index, says whether the tar agreed
/// with it entry for entry.
pub(super) fn unpack_vouched(
    ctx: &Ctx<'_>,
    dest: &Path,
    index: Option<&Index>,
) -> Result<(unpack::Stats, verify::Stats, prefetch::Stats, bool)> {
    let Some(index) = index else {
        let (u, v, f) = restore::unpack_into(
            ctx.git,
            ctx.branch,
            ctx.kp,
            dest,
            ctx.absolute_symlinks,
            ctx.progress,
        )?;
        return Ok((u, v, f, false));
    };
    let opts = unpack::Options {
        absolute_symlinks: ctx.absolute_symlinks.to_vec(),
        ..unpack::Options::default()
    };
    let mut vouched = false;
    let (u, v, f) = restore::stream_key(ctx.git, ctx.branch, ctx.kp, ctx.progress, |r| {
        std::thread::scope(|s| {
            let (tx, rx) = sync_channel(DEPTH);
            let checker = s.spawn(move || agrees_with(Queued::new(rx), index));
            let mut tee = Tee {
                inner: r,
                buf: Vec::with_capacity(BATCH),
                tx: Some(tx),
            };
            let out = unpack::extract_tar(&mut tee, dest, &ctx.kp.limits, &opts);
            tee.flush();
            drop(tee);
            vouched = checker.join().unwrap_or(false) && out.is_ok();
            out
        })
    })?;
    Ok((u, v, f, vouched))
}

/// Passes reads through and queues a copy of the bytes for the checker;
/// once the checker gave up (it hung up), only passes them through.
struct Tee<'r> {
    inner: &'r mut dyn Read,
    buf: Vec<u8>,
    tx: Option<SyncSender<Vec<u8>>>,
}

impl Tee<'_> {
    fn flush(&mut self) {
        if let Some(tx) = &self.tx
            && !self.buf.is_empty()
        {
            let full = std::mem::replace(&mut self.buf, Vec::with_capacity(BATCH));
            if tx.send(full).is_err() {
                self.tx = None;
            }
        }
    }
}

impl Read for Tee<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(out)?;
        if self.tx.is_some() {
            self.buf.extend_from_slice(&out[..n]);
            if self.buf.len() >= BATCH {
                self.flush();
            }
        }
        Ok(n)
    }
}

/// The checker's side of the queue, as a reader; it ends where the tee
/// was dropped.
struct Queued {
    rx: Receiver<Vec<u8>>,
    cur: Vec<u8>,
    at: usize,
}

impl Queued {
    fn new(rx: Receiver<Vec<u8>>) -> Queued {
        Queued {
            rx,
            cur: Vec::new(),
            at: 0,
        }
    }
}

impl Read for Queued {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.at == self.cur.len() {
            match self.rx.recv() {
                Ok(next) => (self.cur, self.at) = (next, 0),
                Err(_) => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len() - self.at);
        out[..n].copy_from_slice(&self.cur[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Whether the tar read from `r` is, entry for entry, what `index` says.
fn agrees_with(r: impl Read, index: &Index) -> bool {
    let mut ar = tar::Archive::new(r);
    let Ok(entries) = ar.entries() else {
        return false;
    };
    let mut want = index.entries.iter();
    let mut buf = vec![0; 1 << 16];
    for te in entries {
        let (Ok(mut te), Some(e)) = (te, want.next()) else {
            return false;
        };
        if !entry_agrees(&mut te, e, &mut buf) {
            return false;
        }
    }
    want.next().is_none()
}

/// One tar entry against its index line: the same path (as the extractor
/// and the record resolve both), kind, size and, for a file, digest.
fn entry_agrees<R: Read>(te: &mut tar::Entry<'_, R>, e: &Entry, buf: &mut [u8]) -> bool {
    let same_path = matches!(
        (unpack::safe_relative(&te.path_bytes()), unpack::safe_relative(&e.path)),
        (Ok(a), Ok(b)) if a == b
    );
    let t = te.header().entry_type();
    let link = te.link_name_bytes().map(|l| l.into_owned());
    let same = match e.kind {
        Kind::Dir => t.is_dir(),
        Kind::Symlink => t.is_symlink() && link == e.target,
        Kind::Hardlink => t.is_hard_link() && link == e.target,
        Kind::File => t.is_file() && te.size() == e.size,
    };
    if !same_path || !same {
        return false;
    }
    if e.kind != Kind::File {
        return true;
    }
    let mut h = Sha256::new();
    let mut done = 0u64;
    loop {
        match te.read(buf) {
            Ok(0) => break,
            Ok(n) => {
                h.update(&buf[..n]);
                done += n as u64;
            }
            Err(_) => return false,
        }
    }
    done == e.size && Some(<[u8; 32]>::from(h.finalize())) == e.sha256
}
