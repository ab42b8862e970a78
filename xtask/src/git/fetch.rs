//! Fetches into the private stores: branches (shallow, blobs of 1 MiB or more
//! left out), chunks by id, trees, shallow marks; the server's filter support.
//! Every fetch runs under the network watchdog (`crate::net`).

use crate::exit::{Code, fail};
use anyhow::{Result, anyhow};
use std::fs::File;
use std::io::Write;
use std::process::{Command, Stdio};

use super::*;

impl CacheGit {
    /// `git fetch` from `remote`, named `PROMISOR` for this command only:
    /// a filtered fetch records its remote as a promisor in cache.git's
    /// config (`remote.warmstart.promisor`, `partialclonefilter`), which git
    /// refuses for a remote named by a path, so the URL is given as
    /// `remote.warmstart.url` on the command line and never written down.
    /// What arrives is kept as the received pack (no loose copy of a 99 MiB
    /// chunk). Quiet, no tags, no FETCH_HEAD, no auto-gc, no submodules.
    pub(super) fn fetch_from(&self, remote: &Remote, no_negotiation: bool) -> Command {
        let mut c = self.git();
        self.belts(&mut c, &remote.url);
        c.arg("-c")
            .arg(format!("remote.{PROMISOR}.url={}", remote.url));
        if no_negotiation {
            c.args(["-c", "fetch.negotiationAlgorithm=noop"]);
        }
        // `--progress` despite `--quiet`: the server's progress is how the
        // watchdog sees a fetch that is alive before the pack flows.
        c.args(["-c", "fetch.unpackLimit=1"]).arg("fetch").args([
            "--quiet",
            "--progress",
            "--no-tags",
            "--no-write-fetch-head",
            "--no-auto-gc",
            "--no-recurse-submodules",
        ]);
        c
    }

    /// Fetches `branch` shallow into `refs/warmstart/<branch>`, without blobs
    /// of `blob_limit()` bytes or more: the commit, the tree and the small
    /// files (`warmstart.json`, `SHA256SUMS`, the README) arrive in one small
    /// fetch, and the chunks are fetched by id when they are read
    /// (`fetch_blob`, `cache::fetch::prefetch`). A server that ignores the filter
    /// (`uploadpack.allowFilter` off) simply sends everything. `Ok(None)`
    /// when the remote has no such branch. Unreachable remote: exit code 8.
    pub fn try_fetch_branch(&self, remote: &Remote, branch: &str) -> Result<Option<String>> {
        check_branch(branch)?;
        let _lock = self.lock()?;
        let refspec = format!("+{}:{}", remote_ref(branch), local_ref(branch));
        let mut cmd = self.fetch_from(remote, false);
        cmd.args(["--depth", "1"])
            .arg(format!("--filter=blob:limit={}", blob_limit()?))
            .arg("--")
            .arg(PROMISOR)
            .arg(&refspec);
        let out = self.run_network(&mut cmd, &format!("fetch of {branch}"), remote, &mut |_| {})?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            if stderr.contains("couldn't find remote ref") {
                return Ok(None);
            }
            return Err(self.fetch_failed(&stderr, branch, remote));
        }
        self.rev_parse(&local_ref(branch))?
            .map(Some)
            .ok_or_else(|| anyhow!("git fetch of {branch} from {remote} left no ref"))
    }

    /// Asks the remote (`git ls-remote`, no objects) where `branch` points
    /// and whether it supports filtered fetches. A server without
    /// `uploadpack.allowFilter` (self-hosted git's default) ignores
    /// `--filter` silently and sends every chunk, so a caller that must not
    /// download artifacts (`cache list`/`status`) asks first. The answer is
    /// the server's capability advertisement, read from git's packet trace
    /// (`GIT_TRACE_PACKET` to a file of our own; git has no other way to
    /// show it): protocol v2's `fetch=... filter` line, or protocol v0's
    /// capability list after the first ref. No advertisement (dumb HTTP)
    /// means no filter. Unreachable remote: exit code 8.
    pub fn probe_ref(&self, remote: &Remote, branch: &str) -> Result<RefProbe> {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        check_branch(branch)?;
        let trace = self.dir.join(format!(
            "warmstart-probe-{}-{}.trace",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        // Under the same deadlines as every fetch: a silent server must not
        // hang `cache status`.
        let mut cmd = self.git();
        self.belts(&mut cmd, &remote.url);
        cmd.env("GIT_TRACE_PACKET", &trace)
            .args(["ls-remote", "--"])
            .arg(&remote.url)
            .arg(remote_ref(branch));
        let _trace_guard = crate::process::signals::register_temp(&trace);
        let out = self.run_network(
            &mut cmd,
            &format!("look-up of {branch}"),
            remote,
            &mut |_| {},
        );
        let traced = std::fs::read(&trace).unwrap_or_default();
        let _ = std::fs::remove_file(&trace);
        let out = out?;
        if !out.status.success() {
            return Err(crate::git::remote_failure(
                &format!("cannot reach {remote} to look up {branch}"),
                &String::from_utf8_lossy(&out.stderr),
            ));
        }
        let want = remote_ref(branch);
        let commit = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .find(|(_, name)| *name == want)
            .map(|(oid, _)| oid.to_string());
        Ok(RefProbe {
            commit,
            filter: advertises_filter(&String::from_utf8_lossy(&traced)),
        })
    }

    /// Whether `commit` and its root tree are in this store (never fetched:
    /// `GIT_NO_LAZY_FETCH`).
    pub fn has_commit(&self, commit: &str) -> bool {
        self.git()
            .args(["cat-file", "-e", &format!("{commit}^{{tree}}")])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Fetches one blob by id (protocol v2 accepts a `want` of any object;
    /// v0 only with `uploadpack.allowAnySHA1InWant` or
    /// `allowReachableSHA1InWant`). Nothing is negotiated (a `have` of the
    /// branch commit would make the server send nothing), the pack is kept
    /// as received, and no ref changes. `pid` gets the id of the running
    /// git, which leads its own process group, so that a caller may stop it
    /// and its helpers (`kill(-pid)`; see `run_stoppable`).
    pub fn fetch_blob(
        &self,
        remote: &Remote,
        oid: &str,
        pid: &mut dyn FnMut(Option<u32>),
    ) -> std::result::Result<(), BlobFetchError> {
        self.fetch_blobs(remote, &[oid.to_string()], pid)
    }

    /// `fetch_blob` of several blobs in one `git fetch` (one request, one
    /// pack): the fallback for a batch of chunks `cache::fetch::direct` cannot read.
    pub fn fetch_blobs(
        &self,
        remote: &Remote,
        oids: &[String],
        pid: &mut dyn FnMut(Option<u32>),
    ) -> std::result::Result<(), BlobFetchError> {
        // No negotiation: a `have` of the branch commit would make the
        // server leave the chunk out.
        let mut cmd = self.fetch_from(remote, true);
        cmd.args(["--no-filter", "--", PROMISOR]).args(oids);
        let first = oids.first().map_or("", String::as_str);
        let short = &first[..first.len().min(12)];
        let what = match oids.len() {
            1 => format!("fetch of blob {short}"),
            n => format!("fetch of {n} blobs from {short}"),
        };
        let out = match self.run_network(&mut cmd, &what, remote, pid) {
            Ok(out) => out,
            Err(e) if crate::exit::code_of(&e) != Code::Failed => {
                return Err(BlobFetchError::Network {
                    code: crate::exit::code_of(&e),
                    message: format!("{e:#}"),
                });
            }
            Err(e) => return Err(BlobFetchError::Failed(format!("{e:#}"))),
        };
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        Err(
            if stderr.contains("does not allow request for unadvertised object") {
                BlobFetchError::Refused
            } else if stderr.contains("not our ref") {
                BlobFetchError::NotOnRemote
            } else if let Some((line, fix)) = crate::git::auth_refused(&stderr) {
                BlobFetchError::Network {
                    code: Code::AuthRefused,
                    message: format!("authentication refused: {line}: {fix}"),
                }
            } else if let Some(line) = crate::git::disk_full_line(&stderr) {
                // Not the network's fault, but its code is kept the same way.
                BlobFetchError::Network {
                    code: Code::Failed,
                    message: format!(
                        "{:#}",
                        crate::git::disk_full_error("fetching into the store", &self.dir, &line)
                    ),
                }
            } else {
                BlobFetchError::Failed(last_lines(&stderr))
            },
        )
    }

    /// Fetches the commits and trees of `refs` (full names or branch
    /// names) without any blob and without writing a ref: enough to know
    /// which blobs they hold, and for a push to leave those out (a
    /// publish's leftover temporary refs, see `cache::publish::push`).
    pub(crate) fn fetch_trees(&self, remote: &Remote, refs: &[String]) -> Result<()> {
        let _lock = self.lock()?;
        let mut cmd = self.fetch_from(remote, false);
        cmd.args(["--filter=blob:none", "--", PROMISOR])
            .args(refs.iter().map(|r| remote_ref(r)));
        let out = self.run_network(&mut cmd, "fetch of temporary refs", remote, &mut |_| {})?;
        if out.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if let Some(line) = crate::git::disk_full_line(&stderr) {
            return Err(crate::git::disk_full_error(
                &format!("cannot fetch {} temporary ref(s) from {remote}", refs.len()),
                &self.dir,
                &line,
            ));
        }
        Err(damaged_or(
            &self.dir,
            &stderr,
            crate::git::remote_failure(
                &format!("cannot fetch {} temporary ref(s) from {remote}", refs.len()),
                &stderr,
            ),
        ))
    }

    /// Adds (`add`) or removes parentless `commits` to or from the store's
    /// `shallow` file, under the store's lock and git's own `shallow.lock`.
    /// Why: `git push` leaves out the objects of the remote's refs by a
    /// walk that reaches the trees of unrelated root commits (every cache
    /// commit is one) only when the store is shallow (pack-objects'
    /// aggressive edges); a branch fetch makes its commit shallow that way,
    /// and a publish's temporary refs need the same to be left out of the
    /// root push. A parentless commit means the same shallow or not.
    pub(crate) fn set_shallow(&self, commits: &[String], add: bool) -> Result<()> {
        let _lock = self.lock()?;
        let path = self.dir.join("shallow");
        let old = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(anyhow!(e).context(format!("reading {}", path.display()))),
        };
        let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
        let before = lines.clone();
        if add {
            for c in commits {
                if !lines.contains(c) {
                    lines.push(c.clone());
                }
            }
        } else {
            lines.retain(|l| !commits.contains(l));
        }
        if lines == before {
            return Ok(());
        }
        let lock = self.dir.join("shallow.lock");
        let mut f = File::options()
            .write(true)
            .create_new(true)
            .open(&lock)
            .map_err(|e| {
                fail(
                    Code::Busy,
                    format!(
                        "cannot take {} ({e}): a git not run by warmstart is updating it; try again when it is done",
                        lock.display()
                    ),
                )
            })?;
        let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
        let written = f
            .write_all(text.as_bytes())
            .and_then(|()| f.sync_all())
            .and_then(|()| {
                if lines.is_empty() {
                    std::fs::remove_file(&lock)
                        .and_then(|()| std::fs::remove_file(&path).or(Ok(())))
                } else {
                    std::fs::rename(&lock, &path)
                }
            });
        if let Err(e) = written {
            let _ = std::fs::remove_file(&lock);
            return Err(anyhow!(e).context(format!("writing {}", path.display())));
        }
        Ok(())
    }

    /// Fetches `branch` again, whole and shallow, even objects already here
    /// (`--refetch`): the fallback for a server that refuses blobs by id.
    /// `pid` gets the process group of the running git, as in `fetch_blob`.
    pub fn refetch_branch(
        &self,
        remote: &Remote,
        branch: &str,
        pid: &mut dyn FnMut(Option<u32>),
    ) -> Result<String> {
        check_branch(branch)?;
        let _lock = self.lock()?;
        let refspec = format!("+{}:{}", remote_ref(branch), local_ref(branch));
        let mut cmd = self.fetch_from(remote, false);
        cmd.args(["--refetch", "--no-filter", "--depth", "1", "--", PROMISOR])
            .arg(&refspec);
        let out = self.run_network(&mut cmd, &format!("fetch of {branch}"), remote, pid)?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(self.fetch_failed(&stderr, branch, remote));
        }
        self.rev_parse(&local_ref(branch))?
            .ok_or_else(|| anyhow!("git fetch of {branch} from {remote} left no ref"))
    }

    /// Fetches `branch` shallow; a missing branch is exit code 4 (not found).
    pub fn fetch_branch(&self, remote: &Remote, branch: &str) -> Result<String> {
        self.try_fetch_branch(remote, branch)?.ok_or_else(|| {
            fail(
                Code::NotFound,
                match branch.strip_prefix("refs/") {
                    // A manifest moved to cache.ref before the cache was.
                    Some(_) => {
                        let name = branch.rsplit('/').next().unwrap_or(branch);
                        format!(
                            "{remote} has no ref {branch}: publish it first (`{cmd} cache publish`), or, if it still lives on its old branch, move it (`{cmd} cache migrate {name}`)",
                            cmd = crate::invocation::command(),
                        )
                    }
                    None => format!(
                        "{remote} has no branch {branch}: publish it first (`{cmd} cache publish`), or check cache.branch and cache.remote in the manifest",
                        cmd = crate::invocation::command(),
                    ),
                },
            )
        })
    }

    /// The commit `refs/warmstart/<branch>` points at (after a fetch that
    /// must have set it).
    pub fn fetch_branch_local(&self, branch: &str) -> Result<String> {
        self.local_branch(branch)?
            .ok_or_else(|| anyhow!("{} has no {}", self.dir.display(), local_ref(branch)))
    }

    /// A fetch that lost a race for one of the store's own ref locks (a
    /// git run in the store by something that does not take `StoreLock`):
    /// contention here, exit 3, not an unreachable remote.
    /// Why a fetch of `branch` failed: another process's lock, a damaged
    /// store, or the remote's words (exit 8 or 13).
    pub(super) fn fetch_failed(
        &self,
        stderr: &str,
        branch: &str,
        remote: &Remote,
    ) -> anyhow::Error {
        if let Some(e) = self.lock_contention(stderr, branch) {
            return e;
        }
        if let Some(line) = crate::git::disk_full_line(stderr) {
            return crate::git::disk_full_error(
                &format!("cannot fetch {branch} from {remote}"),
                &self.dir,
                &line,
            );
        }
        damaged_or(
            &self.dir,
            stderr,
            crate::git::remote_failure(&format!("cannot fetch {branch} from {remote}"), stderr),
        )
    }
}

/// What `CacheGit::probe_ref` learnt: where the ref points (`None`: no
/// such ref) and whether the server filters fetches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefProbe {
    pub commit: Option<String>,
    pub filter: bool,
}

/// Whether a `GIT_TRACE_PACKET` trace of a ls-remote shows the server
/// advertising `filter`: in protocol v2 as a feature of the `fetch`
/// command (`< fetch=shallow wait-for-done filter`), in v0 in the capability
/// list after the first ref (`< <oid> <ref>\0multi_ack ... filter ...`).
pub(super) fn advertises_filter(trace: &str) -> bool {
    trace.lines().any(|l| {
        let Some((_, said)) = l.split_once("< ") else {
            return false;
        };
        if let Some(features) = said.strip_prefix("fetch=") {
            return features.split_whitespace().any(|f| f == "filter");
        }
        // The trace shows NUL as the two characters `\0`.
        said.split_once("\\0")
            .is_some_and(|(_, caps)| caps.split_whitespace().any(|c| c == "filter"))
    })
}

/// Why `fetch_blob` failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobFetchError {
    /// The server does not accept a `want` of an object by id (protocol v0
    /// without `uploadpack.allow*SHA1InWant`): fetch the branch whole.
    Refused,
    /// The server does not have the object (`not our ref`).
    NotOnRemote,
    /// Anything else, with git's last lines.
    Failed(String),
    /// Stopped past a deadline (exit 8), refused our credentials (exit 13),
    /// or the local disk is full (exit 1, `No space left on device`): the
    /// message says which, and the code is kept.
    Network { code: Code, message: String },
}

/// Blobs of this many bytes or more are left out of a branch fetch and
/// fetched by id when read. `WARMSTART_FETCH_BLOB_LIMIT` (a size, see
/// `size::parse_size`) changes it; the default keeps every metadata file in
/// the branch fetch and every full 99 MiB chunk out of it.
/// A value that is not a size is a configuration error (exit 10), not a
/// silent default. Returned in bytes, as git's `blob:limit=<n>` takes them.
pub fn blob_limit() -> Result<String> {
    const DEFAULT: u64 = 1 << 20;
    Ok(crate::settings::size("WARMSTART_FETCH_BLOB_LIMIT")?
        .unwrap_or(DEFAULT)
        .to_string())
}

/// Whether this git answers a lookup of a blob that is not in the store
/// (`ls-tree -l` prints size `BAD`, `cat-file --batch-check` prints
/// `missing`) instead of dying on the lazy fetch `GIT_NO_LAZY_FETCH`
/// forbids: git 2.47 and later, the oldest version the tests ran it on
/// (Debian 12's 2.39 dies). Asked once per process (`git
/// version`); a version that does not parse is taken as old, whose way
/// works on every git.
pub fn missing_lookups_safe() -> bool {
    static SAFE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAFE.get_or_init(|| {
        let out = Command::new("git")
            .arg("version")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        git_version(&text).is_some_and(|v| v >= (2, 47))
    })
}

/// `(major, minor)` of `git version 2.39.5` (vendor suffixes allowed).
pub fn git_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().strip_prefix("git version ")?;
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    Some((major, minor))
}
