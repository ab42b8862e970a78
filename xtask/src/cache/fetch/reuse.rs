//! Chunks this machine already has, found before any is fetched.
//!
//! A chunk is looked for, in order, in cache.git (an earlier restore's
//! `git fetch`, or a server that ignored the filter), in the chunk store
//! `cache.git/chunks/<sha256>` (which any earlier key or cache of this clone
//! filled: chunks are named by content, so a key that shares a chunk with
//! another one finds it there), and in the user's own repository (a full
//! clone, or one that fetched the cache branch itself, holds the very chunk
//! blobs). Only what none of them holds is fetched (`cache::fetch::prefetch`).
//!
//! Looking is cheap (sizes only: one `git cat-file --batch-check` per
//! repository, one `stat` per chunk); a chunk is trusted only once its
//! bytes hashed to the sha256 `warmstart.json` gives it: `Store::check`
//! hashes a stored chunk again, and `Clone::check` a blob of the user's
//! repository, which the restore then reads from there (no copy: a full
//! clone's chunks do not take their size on disk twice), and `verify`
//! hashes again before decoding. A chunk that does not match is fetched
//! instead. The user's repository is only ever read
//! (`git cat-file`, with `GIT_NO_LAZY_FETCH`): no object, ref or config of
//! it changes.

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use crate::cache::fetch::direct::Store;
use crate::git::CacheGit;

/// Where a chunk was found, before any hashing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// In cache.git, with its declared size.
    Git,
    /// A chunk-store file of its declared size (to be hashed).
    Store,
    /// A blob of the user's repository of its declared size (to be
    /// hashed, then read from there).
    Clone,
    /// Nowhere here: fetch it.
    Missing,
}

/// The sizes of `oids` in the user's repository (`None`: not there), or
/// all `None` when it cannot be read safely: not a repository, or a
/// partial clone with a git older than 2.47, whose `cat-file` would fetch
/// a missing object on its own (`GIT_NO_LAZY_FETCH` came later), which
/// would write to it.
pub fn clone_sizes(git: &CacheGit, oids: &[String]) -> Vec<Option<u64>> {
    let none = || vec![None; oids.len()];
    if oids.is_empty() {
        return Vec::new();
    }
    if !crate::git::missing_lookups_safe() && is_partial_clone(git) {
        return none();
    }
    let mut cmd = git.user_git();
    cmd.args([
        "cat-file",
        "--batch-check=%(objectname) %(objecttype) %(objectsize)",
    ]);
    let input: String = oids.iter().map(|o| format!("{o}\n")).collect();
    let Ok(out) = run_with_input(&mut cmd, input.into_bytes()) else {
        return none();
    };
    let text = String::from_utf8_lossy(&out);
    let sizes: Vec<Option<u64>> = text
        .lines()
        .map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
            [_, "blob", size] => size.parse().ok(),
            _ => None,
        })
        .collect();
    if sizes.len() == oids.len() {
        sizes
    } else {
        none()
    }
}

fn is_partial_clone(git: &CacheGit) -> bool {
    let out = git
        .user_git()
        .args(["config", "--get", "extensions.partialClone"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output();
    // Unreadable: assume the worst.
    out.map_or(true, |o| o.status.success())
}

/// Runs `cmd` with `input` on its stdin (written from a thread, so that a
/// command answering as it reads cannot stall); its stdout if it succeeded.
fn run_with_input(cmd: &mut std::process::Command, input: Vec<u8>) -> Result<Vec<u8>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("running git cat-file in the repository")?;
    let mut stdin = child.stdin.take().expect("piped");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output()?;
    let _ = writer.join();
    if !out.status.success() {
        return Err(anyhow!("git cat-file --batch-check failed"));
    }
    Ok(out.stdout)
}

/// Where each chunk of a plan is: `oids` with their declared `sizes` and
/// digests (`None` for a legacy part, which only cache.git or a fetch can
/// give). `in_git` are the sizes cache.git has (`CacheGit::blob_sizes`).
pub fn find(
    git: &CacheGit,
    store: &Store,
    oids: &[String],
    sizes: &[u64],
    digests: &[Option<[u8; 32]>],
    in_git: &[Option<u64>],
) -> Vec<Found> {
    let mut found: Vec<Found> = (0..oids.len())
        .map(|i| match (in_git[i], digests[i]) {
            (Some(_), _) => Found::Git,
            (None, Some(d)) if store.size(&d) == Some(sizes[i]) => Found::Store,
            _ => Found::Missing,
        })
        .collect();
    let ask: Vec<usize> = (0..oids.len())
        .filter(|&i| found[i] == Found::Missing && digests[i].is_some())
        .collect();
    let asked: Vec<String> = ask.iter().map(|&i| oids[i].clone()).collect();
    for (&i, size) in ask.iter().zip(clone_sizes(git, &asked)) {
        if size == Some(sizes[i]) {
            found[i] = Found::Clone;
        }
    }
    found
}

/// A `git cat-file --batch` in the user's repository, kept running while
/// chunks are copied out of it.
pub struct Clone {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Clone {
    pub fn open(git: &CacheGit) -> Result<Clone> {
        let mut child = git
            .user_git()
            .args(["cat-file", "--batch"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("running git cat-file --batch in the repository")?;
        let stdin = child.stdin.take().expect("piped");
        let stdout = BufReader::with_capacity(1 << 20, child.stdout.take().expect("piped"));
        Ok(Clone {
            child,
            stdin,
            stdout,
        })
    }

    /// Hashes blob `oid` of the user's repository: `Ok(true)` when it is
    /// there with `size` bytes and the sha256 `warmstart.json` gives the
    /// chunk. Nothing is copied: the restore reads the blob from the
    /// repository again (`open_blob`), and `verify` hashes it once more
    /// before a byte of it is decoded.
    pub fn check(&mut self, oid: &str, size: u64, sha256: &[u8; 32]) -> Result<bool> {
        writeln!(self.stdin, "{oid}").context("asking git cat-file --batch")?;
        self.stdin.flush().context("asking git cat-file --batch")?;
        let mut header = String::new();
        self.stdout
            .read_line(&mut header)
            .context("reading git cat-file --batch")?;
        let f: Vec<&str> = header.split_whitespace().collect();
        let (kind, len) = match f[..] {
            [_, kind, len] => match len.parse::<u64>() {
                Ok(n) => (kind, n),
                Err(_) => return Ok(false),
            },
            // `<oid> missing`: no content follows.
            _ => return Ok(false),
        };
        // The whole object is read (hashed or not), then its newline: the
        // next answer starts after them.
        let mut hasher = Sha256::new();
        let read = std::io::copy(&mut (&mut self.stdout).take(len), &mut hasher)?;
        if read != len {
            return Err(anyhow!("git cat-file --batch ended inside object {oid}"));
        }
        let mut nl = [0u8; 1];
        self.stdout
            .read_exact(&mut nl)
            .context("reading git cat-file --batch")?;
        let got: [u8; 32] = hasher.finalize().into();
        Ok(kind == "blob" && len == size && got == *sha256)
    }
}

/// A blob of the user's repository, streamed (`git cat-file blob`): the
/// reader fails rather than ending early if git fails.
pub fn open_blob(git: &CacheGit, oid: &str) -> Result<CloneBlob> {
    let mut child = git
        .user_git()
        .args(["cat-file", "blob", oid])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("running git cat-file in the repository")?;
    let stdout = child.stdout.take().expect("piped");
    Ok(CloneBlob {
        child: Some(child),
        stdout,
        oid: oid.to_string(),
    })
}

/// See `open_blob`.
pub struct CloneBlob {
    child: Option<Child>,
    stdout: ChildStdout,
    oid: String,
}

impl Read for CloneBlob {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stdout.read(buf)?;
        if n == 0
            && !buf.is_empty()
            && let Some(mut child) = self.child.take()
            && !child.wait()?.success()
        {
            return Err(std::io::Error::other(format!(
                "git cat-file blob {} failed in the repository",
                self.oid
            )));
        }
        Ok(n)
    }
}

impl Drop for CloneBlob {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Clone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
