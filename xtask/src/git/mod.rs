//! Git plumbing for cache branches, shared by publish and restore.
//!
//! Cache objects never enter the user's object store: every object lives in
//! a private bare repository, `<git-dir>/warmstart/cache.git`, and the remote
//! is addressed by URL (resolved from the user's remote name once). A branch
//! is fetched shallow into `refs/warmstart/<branch>` of that repository,
//! without its big blobs (a partial clone: git records the URL as a promisor
//! remote in cache.git's config); the chunks a restore reads are fetched by
//! id (`fetch_blob`), and git never fetches one on its own
//! (`GIT_NO_LAZY_FETCH`).
//!
//! Why the git CLI and not libgit2: git2 is not a dependency (it would add a
//! C build and OpenSSL/libssh2 to every cold compile), and the CLI is the
//! best transport there is: it honours the user's credential helpers,
//! `insteadOf` rewrites, proxies and ssh configuration, speaks protocol v2,
//! and streams big blobs through bulk check-in without holding them in memory.
//!
//! This module never writes to the user's repository: it only reads its
//! remote URLs and transport settings (`git -C <root> config`).

use anyhow::{Context, Result, anyhow, bail};
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use xshell::{Shell, cmd};

pub mod ssh;

use crate::exit::{Code, fail};
use crate::net::{self, ManifestNetwork, NetworkSettings};
use crate::repo::Repo;

/// Settings written into `cache.git/config` when it is created, and passed
/// again on the commands where they matter (a cache.git made by hand may
/// lack them).
///
/// - Chunks are already zstd-compressed: zlib over them (git's default) costs
///   seconds per 100 MB and saves nothing, so objects are stored at level 0.
/// - `core.bigFileThreshold` below the chunk size makes `hash-object` stream
///   each chunk straight into a pack (bulk check-in) instead of a loose
///   object, and makes `pack-objects` skip delta search on chunks (a delta
///   window over 99 MiB random blobs costs a GiB of memory for nothing).
/// - No automatic gc: a repack of a multi-GB cache in the middle of a restore
///   is a surprise nobody wants.
/// - No delta search (`pack.window=0`): chunks are zstd and never delta.
///   It also keeps a push from looking up the blobs of the remote's trees
///   as delta bases of a thin pack: a restore that read its chunks straight
///   from the server (`cache::fetch::direct`) left them out of cache.git, and
///   such a lookup fails (`GIT_NO_LAZY_FETCH`).
/// - Small pack windows: git maps packs in windows of 1 GiB by default, so a
///   push of a 250 MB artifact showed 250 MB of resident memory (measured);
///   16 MiB windows within 64 MiB keep it bounded whatever the size.
const CONFIG: [(&str, &str); 9] = [
    ("core.compression", "0"),
    ("pack.compression", "0"),
    ("core.bigFileThreshold", "1m"),
    ("core.packedGitWindowSize", "16m"),
    ("core.packedGitLimit", "64m"),
    ("gc.auto", "0"),
    ("maintenance.auto", "false"),
    ("receive.autogc", "false"),
    ("pack.window", "0"),
];

/// The name cache.git knows every remote by, for one command at a time
/// (see `CacheGit::fetch_from`).
const PROMISOR: &str = "warmstart";

/// The local transport settings of the user's repository that a fetch or a
/// push from cache.git must see too. CI checkouts keep the access token in
/// the repository's own config (e.g. actions/checkout writes
/// `http.https://github.com/.extraheader`), which cache.git would not read.
const FORWARDED_CONFIG: &str = r"^(http|credential|url|protocol)\.|^core\.(sshcommand|askpass)$";

/// A resolved remote: what the user called it, and the URL git talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The configured remote name, or the URL itself when given directly.
    pub name: String,
    /// A URL or an absolute path, usable from any directory.
    pub url: String,
}

/// What users read: the name and the URL, without credentials
/// (`crate::redact`). Never format `url` or `name` into a message directly.
impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name == self.url {
            write!(f, "{}", self.shown_url())
        } else {
            write!(f, "{} ({})", self.name, self.shown_url())
        }
    }
}

impl Remote {
    /// The URL as it may be printed or written down (`crate::redact::url`).
    pub fn shown_url(&self) -> String {
        crate::redact::url(&self.url)
    }

    /// The name as it may be printed: the remote name, or the redacted URL
    /// when the remote was given as a URL.
    pub fn shown_name(&self) -> String {
        crate::redact::url(&self.name)
    }
}

/// One line of `git ls-tree -l`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeEntry {
    /// `100644`, `100755`, `040000`, `120000`, `160000`.
    pub mode: String,
    /// `blob`, `tree` or `commit`.
    pub kind: String,
    pub oid: String,
    /// Blob size in bytes (`None` for trees and submodules).
    pub size: Option<u64>,
    pub name: String,
}

/// The private object store of one clone.
#[derive(Clone, Debug)]
pub struct CacheGit {
    /// `<git-dir>/warmstart/cache.git`.
    pub dir: PathBuf,
    /// Transport settings forwarded from the user's repository.
    forwarded: Vec<(String, String)>,
    /// The user's work-tree root (to resolve remotes).
    root: PathBuf,
    /// How long a fetch or ref update waits for the store's lock
    /// (`StoreLock`) before giving up busy (exit 3).
    lock_wait: Duration,
    /// The deadlines of every fetch and push (`set_network`).
    net: NetworkSettings,
}

/// How long a command waits for another process's fetch into the same
/// private store, unless the caller says otherwise (`with_lock_wait`):
/// as long as a restorer waits for another restorer of its target.
pub const STORE_LOCK_WAIT: Duration = Duration::from_secs(1800);

/// The ref a fetched branch is kept under in cache.git (for a full ref
/// `refs/x/y`: `refs/warmstart/refs/x/y`; no branch name starts with
/// `refs/`, so the two never meet).
pub fn local_ref(branch: &str) -> String {
    format!("refs/warmstart/{branch}")
}

/// The ref a cache lives at on the remote: a branch name means
/// `refs/heads/<name>`; a manifest's `cache.ref` is a full `refs/...` ref
/// (e.g. `refs/warmstart/cache/<name>`), which default refspecs of
/// `git clone` and `git fetch` (`refs/heads/*`) never fetch.
pub fn remote_ref(branch: &str) -> String {
    if branch.starts_with("refs/") {
        branch.to_string()
    } else {
        format!("refs/heads/{branch}")
    }
}

impl CacheGit {
    /// Opens cache.git of `repo`, creating it on first use.
    pub fn open(sh: &Shell, repo: &Repo) -> Result<CacheGit> {
        CacheGit::open_at(sh, repo, "cache.git")
    }

    /// Opens the metadata store of `repo`, `<git-dir>/warmstart/cache-meta.git`,
    /// where `cache list` and `cache status` fetch branches. Its fetches are
    /// filtered like cache.git's (trees and small blobs only) and nothing
    /// there ever reads a chunk, so it never holds one. Kept apart from
    /// cache.git so that listing never waits for a restore's fetch lock and
    /// never changes what a restore finds.
    pub fn open_meta(sh: &Shell, repo: &Repo) -> Result<CacheGit> {
        CacheGit::open_at(sh, repo, "cache-meta.git")
    }

    fn open_at(sh: &Shell, repo: &Repo, name: &str) -> Result<CacheGit> {
        let dir = repo.state_dir().join(name);
        if !dir.join("HEAD").is_file() {
            create(sh, &dir)?;
        }
        let forwarded = forwarded_config(sh, &repo.root)?;
        Ok(CacheGit {
            dir,
            forwarded,
            root: repo.root.clone(),
            lock_wait: STORE_LOCK_WAIT,
            net: net::settings(&ManifestNetwork::default())?,
        })
    }

    /// Takes the deadlines from this command's flags, the environment and
    /// a manifest's `[network]` table (see `crate::net`).
    pub fn set_network(&mut self, manifest: &ManifestNetwork) -> Result<()> {
        self.net = net::settings(manifest)?;
        Ok(())
    }

    /// The deadlines fetches and pushes run under.
    pub fn network(&self) -> NetworkSettings {
        self.net
    }

    /// Where `index-pack` grows a pack while git receives it: the
    /// watchdog's sign of progress.
    fn pack_dir(&self) -> net::PackDir {
        net::PackDir(self.dir.join("objects").join("pack"))
    }

    /// git's and ssh's own timeouts, as belts under the watchdog (which
    /// alone bounds a server that accepts and says nothing), a little
    /// longer than the watchdog's so that its clearer message wins: curl's
    /// low-speed limit for HTTP, and for ssh `BatchMode` (never a prompt),
    /// `ConnectTimeout` and keep-alives, through `GIT_SSH_COMMAND` only
    /// when the user has no ssh command of their own (`GIT_SSH_COMMAND`,
    /// `GIT_SSH`, `core.sshCommand`, `ssh.variant`): theirs stays as it is.
    /// Must be applied before the git subcommand.
    pub(crate) fn belts(&self, c: &mut Command, url: &str) {
        let slack = |d: std::time::Duration| d.as_secs() + 3;
        if url.starts_with("http://") || url.starts_with("https://") {
            c.args(["-c", "http.lowSpeedLimit=1"])
                .arg("-c")
                .arg(format!("http.lowSpeedTime={}", slack(self.net.stall)));
        } else if is_ssh(url) && !self.user_has_ssh_command() {
            let alive = (self.net.stall.as_secs() / 3).max(1);
            c.env(
                "GIT_SSH_COMMAND",
                format!(
                    "ssh -o BatchMode=yes -o ConnectTimeout={} -o ServerAliveInterval={alive} -o ServerAliveCountMax=3",
                    slack(self.net.connect)
                ),
            );
        }
    }

    fn user_has_ssh_command(&self) -> bool {
        if ["GIT_SSH_COMMAND", "GIT_SSH", "GIT_SSH_VARIANT"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        {
            return true;
        }
        let out = self
            .git()
            .args([
                "config",
                "--get-regexp",
                r"^(core\.sshcommand|ssh\.variant)$",
            ])
            .stdin(Stdio::null())
            .output();
        // Unknown is "theirs": better no belt than overriding a setting.
        !matches!(out, Ok(o) if o.status.code() == Some(1))
    }

    /// The same store, waiting at most `wait` for its lock (a publisher
    /// bounds every wait by its lease deadline).
    pub fn with_lock_wait(mut self, wait: Duration) -> CacheGit {
        self.lock_wait = wait;
        self
    }

    /// A `git` command run in cache.git, with the forwarded transport
    /// settings and messages in English (errors are classified by their text).
    pub fn git(&self) -> Command {
        let mut c = Command::new("git");
        c.arg("--git-dir").arg(&self.dir);
        for (k, v) in CONFIG {
            c.arg("-c").arg(format!("{k}={v}"));
        }
        self.apply_env(&mut c);
        c
    }

    /// `git fetch` from `remote`, named `PROMISOR` for this command only:
    /// a filtered fetch records its remote as a promisor in cache.git's
    /// config (`remote.warmstart.promisor`, `partialclonefilter`), which git
    /// refuses for a remote named by a path, so the URL is given as
    /// `remote.warmstart.url` on the command line and never written down.
    /// What arrives is kept as the received pack (no loose copy of a 99 MiB
    /// chunk). Quiet, no tags, no FETCH_HEAD, no auto-gc, no submodules.
    fn fetch_from(&self, remote: &Remote, no_negotiation: bool) -> Command {
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

    /// The `url.*` and `protocol.*` settings git sees in cache.git:
    /// system, global and the ones forwarded from the user's repository
    /// (lower-case names, as git prints them).
    pub fn transport_settings(&self) -> Result<Vec<(String, String)>> {
        let out = self
            .git()
            .args(["config", "--get-regexp", r"^(url|protocol)\."])
            .stdin(Stdio::null())
            .output()
            .context("running git config")?;
        // Exit 1: no such setting.
        if !out.status.success() && out.status.code() != Some(1) {
            check_status(&out, "git config --get-regexp", None)?;
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| match l.split_once(' ') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (l.to_string(), String::new()),
            })
            .collect())
    }

    /// git's remote helper for `url` (`git remote-http` or
    /// `git remote-https`), run in cache.git as `git fetch` runs it, with
    /// the forwarded transport settings. See `cache::fetch::direct`.
    pub fn remote_helper(&self, url: &str) -> Command {
        let scheme = url.split("://").next().unwrap_or("https");
        let mut c = Command::new("git");
        self.apply_env(&mut c);
        self.belts(&mut c, url);
        c.env("GIT_DIR", &self.dir)
            .env("GIT_PROTOCOL", "version=2")
            .arg(format!("remote-{scheme}"))
            .arg(PROMISOR)
            .arg(url);
        c
    }

    /// `git upload-pack` serving the repository at `repo` (on this
    /// machine) in protocol v2, as a local `git fetch` would run it, with
    /// the same memory-bounding pack windows (see `CONFIG`) for the
    /// `pack-objects` it starts. See `cache::fetch::direct`.
    pub fn upload_pack(&self, repo: &Path) -> Command {
        let mut c = Command::new("git");
        for (k, v) in CONFIG {
            if k.starts_with("core.packedGit") {
                c.arg("-c").arg(format!("{k}={v}"));
            }
        }
        self.apply_env(&mut c);
        c.env("GIT_PROTOCOL", "version=2")
            .arg("upload-pack")
            .arg(repo);
        c
    }

    /// `git` run in the user's own repository (the work tree this store
    /// belongs to), to read objects it already has (`cache::fetch::reuse`):
    /// never a lazy fetch, messages in English. Callers only read.
    pub fn user_git(&self) -> Command {
        let mut c = Command::new("git");
        self.apply_env(&mut c);
        // The objects themselves, not what a `git replace` stands in.
        c.env("GIT_NO_REPLACE_OBJECTS", "1");
        c.arg("-C").arg(&self.root);
        c
    }

    fn apply_env(&self, c: &mut Command) {
        c.env("LC_ALL", "C").env("LANGUAGE", "C");
        // A session-start hook has nobody to answer a username prompt: git
        // fails instead (exit 13). An askpass helper the user set up is
        // theirs, and the watchdog bounds it.
        c.env("GIT_TERMINAL_PROMPT", "0");
        // Branch fetches leave big chunks out (see `try_fetch_branch`), which
        // makes the remote a promisor. Git would then download a missing
        // chunk on its own, one by one, from any command that touches it
        // (`ls-tree -l` asks for sizes): never. Chunks are fetched by id, on
        // purpose (`fetch_blob`); anything else fails instead.
        c.env("GIT_NO_LAZY_FETCH", "1");
        c.env_remove("GIT_DIR").env_remove("GIT_WORK_TREE");
        c.env_remove("GIT_INDEX_FILE")
            .env_remove("GIT_OBJECT_DIRECTORY");
        if !self.forwarded.is_empty() {
            // GIT_CONFIG_COUNT keeps secrets (extraheader tokens) out of argv.
            let base: usize = std::env::var("GIT_CONFIG_COUNT")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            for (i, (k, v)) in self.forwarded.iter().enumerate() {
                c.env(format!("GIT_CONFIG_KEY_{}", base + i), k);
                c.env(format!("GIT_CONFIG_VALUE_{}", base + i), v);
            }
            c.env(
                "GIT_CONFIG_COUNT",
                (base + self.forwarded.len()).to_string(),
            );
        }
    }

    /// Resolves a remote name (`origin`) or a URL/path to a URL git can use
    /// from cache.git. A relative path is taken from the repository root.
    pub fn resolve_remote(&self, sh: &Shell, remote: &str) -> Result<Remote> {
        resolve_remote(sh, &self.root, remote)
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
        let _trace_guard = net::register_temp(&trace);
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
            return Err(net::remote_failure(
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

    /// The repository restores fetch into (`cache.git`) next to this one,
    /// if it exists: `cache list`/`status` read a branch from there when a
    /// restore already fetched it and the server cannot filter. Never
    /// creates it.
    pub fn restore_store(&self) -> Option<CacheGit> {
        let dir = self.dir.parent()?.join("cache.git");
        dir.join("HEAD").is_file().then(|| CacheGit {
            dir,
            forwarded: self.forwarded.clone(),
            root: self.root.clone(),
            lock_wait: self.lock_wait,
            net: self.net,
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
            } else if let Some((line, fix)) = net::auth_refused(&stderr) {
                BlobFetchError::Network {
                    code: Code::AuthRefused,
                    message: format!("authentication refused: {line}: {fix}"),
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
        Err(damaged_or(
            &self.dir,
            &stderr,
            net::remote_failure(
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
                        "cannot take {} ({e}): another git is updating it; try again",
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

    /// The pack files in cache.git now (names of their `.idx` files).
    pub fn pack_indexes(&self) -> std::collections::HashSet<String> {
        let dir = self.dir.join("objects").join("pack");
        std::fs::read_dir(dir)
            .map(|rd| {
                rd.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".idx"))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The objects of the packs whose `.idx` files are `names`
    /// (`git show-index`): what a fetch that made those packs brought.
    pub fn objects_in_packs<'a>(
        &self,
        names: impl Iterator<Item = &'a String>,
    ) -> Result<std::collections::HashSet<String>> {
        let mut out = std::collections::HashSet::new();
        for name in names {
            let path = self.dir.join("objects").join("pack").join(name);
            let idx = std::fs::File::open(&path)
                .with_context(|| format!("opening {}", path.display()))?;
            let listed = self
                .git()
                .arg("show-index")
                .stdin(idx)
                .output()
                .context("running git show-index")?;
            check_status(&listed, "git show-index", None)?;
            for line in String::from_utf8_lossy(&listed.stdout).lines() {
                if let Some(oid) = line.split_whitespace().nth(1) {
                    out.insert(oid.to_string());
                }
            }
        }
        Ok(out)
    }

    /// The size of each blob that is in cache.git (`None`: not here, e.g.
    /// left out by a filtered fetch), in the order given.
    pub fn blob_sizes(&self, oids: &[String]) -> Result<Vec<Option<u64>>> {
        if oids.is_empty() {
            return Ok(Vec::new());
        }
        if !missing_lookups_safe() {
            // Older git dies on the first missing id (see `ls_tree`).
            let sizes = self
                .local_blob_sizes()
                .with_context(|| format!("listing the blobs of {}", self.dir.display()))?;
            return Ok(oids.iter().map(|o| sizes.get(o).copied()).collect());
        }
        let input: String = oids.iter().map(|o| format!("{o}\n")).collect();
        let out = run_with_input(
            self.git().args([
                "cat-file",
                "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            ]),
            input.into_bytes(),
            "git cat-file --batch-check",
        )?;
        let text = String::from_utf8_lossy(&out);
        let sizes: Vec<Option<u64>> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                match f[..] {
                    [_, "blob", size] => size.parse().ok(),
                    _ => None,
                }
            })
            .collect();
        if sizes.len() != oids.len() {
            bail!(
                "git cat-file --batch-check answered {} of {} objects",
                sizes.len(),
                oids.len()
            );
        }
        Ok(sizes)
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

    /// The commit `refs/warmstart/<branch>` points at from the last fetch or
    /// publish in this clone, without contacting the remote.
    pub fn local_branch(&self, branch: &str) -> Result<Option<String>> {
        self.rev_parse(&local_ref(branch))
    }

    /// Points `refs/warmstart/<branch>` at `commit` (after a publish pushed it,
    /// so the next fetch of that commit downloads nothing).
    pub fn set_local_branch(&self, branch: &str, commit: &str) -> Result<()> {
        let _lock = self.lock()?;
        run(self.git().args(["update-ref", &local_ref(branch), commit]))
            .map(drop)
            .with_context(|| format!("recording {branch} at {commit} in {}", self.dir.display()))
    }

    fn rev_parse(&self, rev: &str) -> Result<Option<String>> {
        let out = self
            .git()
            .args([
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("{rev}^{{commit}}"),
            ])
            .output()
            .context("running git rev-parse")?;
        Ok(if out.status.success() {
            Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
        } else {
            None
        })
    }

    /// The parents a commit object names (a shallow fetch keeps them in the
    /// object even though the parents themselves are absent).
    pub fn commit_parents(&self, commit: &str) -> Result<Vec<String>> {
        let out = run(self.git().args(["cat-file", "commit", commit]))
            .with_context(|| format!("reading commit {commit}"))?;
        let text = String::from_utf8_lossy(&out);
        Ok(text
            .lines()
            .take_while(|l| !l.is_empty())
            .filter_map(|l| l.strip_prefix("parent "))
            .map(str::to_string)
            .collect())
    }

    /// The root tree of a commit (`git ls-tree -l -z`), in git's order. A
    /// blob the filtered fetch left out has no size. Git before 2.47 dies in
    /// `ls-tree -l` on such a blob (Debian 12's 2.39 fails its lazy fetch,
    /// which `GIT_NO_LAZY_FETCH` forbids), so there the tree is listed
    /// without sizes, and the sizes of the blobs this store holds come from
    /// `cat-file --batch-all-objects`, which never looks up a missing one.
    pub fn ls_tree(&self, rev: &str) -> Result<Vec<TreeEntry>> {
        let sized = missing_lookups_safe();
        let mut cmd = self.git();
        cmd.arg("ls-tree");
        if sized {
            cmd.arg("-l");
        }
        let out = run(cmd.args(["-z", "--full-tree", rev]))
            .with_context(|| format!("listing the tree of {rev}"))?;
        let mut entries = parse_ls_tree(&out)?;
        if !sized {
            let sizes = self
                .local_blob_sizes()
                .with_context(|| format!("listing the blobs of {}", self.dir.display()))?;
            for e in entries.iter_mut().filter(|e| e.kind == "blob") {
                e.size = sizes.get(&e.oid).copied();
            }
        }
        Ok(entries)
    }

    /// The size of every blob this store holds (packs and loose objects),
    /// by id: enumerated, so no missing object is ever looked up.
    fn local_blob_sizes(&self) -> Result<std::collections::HashMap<String, u64>> {
        let out = run(self.git().args([
            "cat-file",
            "--batch-check=%(objectname) %(objecttype) %(objectsize)",
            "--batch-all-objects",
            "--unordered",
        ]))?;
        Ok(parse_blob_sizes(&String::from_utf8_lossy(&out)))
    }

    /// Streams a blob: the reader fails (rather than ending early) if git
    /// exits with an error before the whole blob was read.
    pub fn read_blob(&self, oid: &str) -> Result<BlobReader> {
        let mut child = self
            .git()
            .args(["cat-file", "blob", oid])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running git cat-file")?;
        let stdout = child.stdout.take().expect("piped stdout");
        Ok(BlobReader {
            child: Some(child),
            stdout,
            oid: oid.to_string(),
            store: self.dir.clone(),
        })
    }

    /// A whole small blob (e.g. `warmstart.json`) as bytes.
    pub fn read_blob_bytes(&self, oid: &str) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        self.read_blob(oid)?
            .read_to_end(&mut buf)
            .with_context(|| format!("reading blob {oid}"))?;
        Ok(buf)
    }

    /// Writes a small blob from memory.
    pub fn write_blob_bytes(&self, bytes: &[u8]) -> Result<String> {
        let out = run_with_input(
            self.git().args(["hash-object", "-w", "--stdin"]),
            bytes.to_vec(),
            "git hash-object",
        )?;
        parse_oid(&out)
    }

    /// Starts a writer that turns files (big chunks) into blobs. Each file
    /// is streamed by git into its own pack, uncompressed (see `CONFIG`):
    /// no loose 99 MiB objects, no zlib, no copy through a pipe.
    pub fn blob_writer(&self) -> Result<BlobWriter> {
        let mut child = self
            .git()
            .args(["hash-object", "-w", "--no-filters", "--stdin-paths"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running git hash-object --stdin-paths")?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Ok(BlobWriter {
            child,
            stdin: Some(stdin),
            stdout,
        })
    }

    /// Builds a tree from entries (`mode`, `kind`, `oid`, `name`; sizes are
    /// ignored). Names must be unique; git sorts them.
    pub fn mktree(&self, entries: &[TreeEntry]) -> Result<String> {
        let mut input = Vec::new();
        for e in entries {
            if e.name.contains('\0') || e.name.contains('/') {
                bail!("tree entry name {:?} is not a plain file name", e.name);
            }
            write!(input, "{} {} {}\t{}\0", e.mode, e.kind, e.oid, e.name)?;
        }
        // `--missing`: a publish keeps the chunks of other keys, which a
        // filtered fetch left on the remote.
        let out = run_with_input(
            self.git().args(["mktree", "-z", "--missing"]),
            input,
            "git mktree",
        )?;
        parse_oid(&out)
    }

    /// A commit of `tree` with no parent (a cache branch is always one root
    /// commit). The identity is fixed: the commit is made by a machine, and
    /// a runner without `user.name` must still publish.
    pub fn commit_tree(&self, tree: &str, message: &str) -> Result<String> {
        let out = self
            .git()
            .args(["commit-tree", tree, "-m", message])
            .env("GIT_AUTHOR_NAME", "warmstart")
            .env("GIT_AUTHOR_EMAIL", "warmstart@localhost")
            .env("GIT_COMMITTER_NAME", "warmstart")
            .env("GIT_COMMITTER_EMAIL", "warmstart@localhost")
            .stdin(Stdio::null())
            .output()
            .context("running git commit-tree")?;
        check_status(&out, "git commit-tree", Some(&self.dir))?;
        parse_oid(&out.stdout)
    }

    /// Pushes `commit` to `remote_ref(branch)` with a lease: the remote ref
    /// must still be `expected` (`None`: must not exist). `progress` gets
    /// git's "Writing objects" percentage as it goes.
    pub fn push_branch(
        &self,
        remote: &Remote,
        branch: &str,
        commit: &str,
        expected: Option<&str>,
        progress: &mut dyn FnMut(PushProgress),
    ) -> Result<()> {
        check_branch(branch)?;
        let dst = remote_ref(branch);
        let lease = format!("--force-with-lease={dst}:{}", expected.unwrap_or(""));
        let mut cmd = self.git();
        self.belts(&mut cmd, &remote.url);
        cmd.args(["push", "--porcelain", "--progress", "--no-verify"])
            .arg(&lease)
            .arg("--")
            .arg(&remote.url)
            .arg(format!("{commit}:{dst}"));
        let mut parser = ProgressParser::default();
        let ran = net::run(
            &mut cmd,
            self.net,
            None,
            None,
            &mut |bytes| parser.feed(bytes, progress),
            &mut |_| {},
        )
        .context("running git push")?;
        if let Some(v) = ran.stopped {
            return Err(v.error(&format!("push of {branch}"), &remote.to_string()));
        }
        let stderr = final_lines(&ran.stderr);
        let stdout = String::from_utf8_lossy(&ran.stdout).into_owned();
        if ran.status.success() {
            return Ok(());
        }
        // The lease is checked twice: by us against the advertised value
        // (`[rejected] (stale info)`, or `(fetch first)` when the ref exists
        // and the lease said it must not), and by the server while it locks
        // the ref, which is how a push racing another one for the same ref
        // loses (`[remote rejected] (cannot lock ref ...: is at X but
        // expected Y)`). `--porcelain` puts the verdict on stdout, one
        // `!\t<src>:<dst>\t<why>` line per rejected ref: that line decides.
        // Only when git printed none (a transport that died early) is
        // stderr searched for the same words.
        let said = format!("{stdout}\n{stderr}");
        // Before the lease: a protected branch's refusal can read "fetch
        // first" too, and retrying it would only be refused again.
        if let Some(rule) = net::protected_refusal(&said) {
            return Err(fail(
                Code::Remote,
                format!(
                    "{remote} refuses to replace {dst} ({rule}): every publish force-pushes a new root commit, so a branch protection rule or ruleset on it (receive.denyNonFastForwards on a plain git server) stops every publish; allow force pushes to {dst} on the host, or set cache.branch in the manifest to a branch no rule covers"
                ),
            ));
        }
        if let Some(git_said) = lease_lost(&stdout, &stderr, &dst) {
            return Err(anyhow::Error::new(StaleLease {
                message: format!(
                    "{branch} on {remote} changed since it was fetched (another publish?): nothing was pushed; publish again to build on it"
                ),
                git: crate::exit::Failure {
                    code: Code::Busy,
                    message: format!("git said: {git_said}"),
                },
            }));
        }
        if let Some(hint) = refusal_hint(&dst, &said) {
            let git_said = last_lines(&said);
            return Err(fail(
                Code::Remote,
                format!("{remote} refused {dst} (git said: {git_said}): {hint}"),
            ));
        }
        let prefix = format!("cannot push {branch} to {remote}");
        let failure =
            if net::auth_refused(&stderr).is_some() || !net::cause_lines(&stderr).is_empty() {
                net::remote_failure(&prefix, &stderr)
            } else {
                net::remote_failure(&prefix, &stdout)
            };
        // `pack-objects` failing on an object cache.git lost says so.
        Err(damaged_or(&self.dir, &stderr, failure))
    }

    /// A fetch that lost a race for one of the store's own ref locks (a
    /// git run in the store by something that does not take `StoreLock`):
    /// contention here, exit 3, not an unreachable remote.
    /// Why a fetch of `branch` failed: another process's lock, a damaged
    /// store, or the remote's words (exit 8 or 13).
    fn fetch_failed(&self, stderr: &str, branch: &str, remote: &Remote) -> anyhow::Error {
        if let Some(e) = self.lock_contention(stderr, branch) {
            return e;
        }
        damaged_or(
            &self.dir,
            stderr,
            net::remote_failure(&format!("cannot fetch {branch} from {remote}"), stderr),
        )
    }

    fn lock_contention(&self, stderr: &str, branch: &str) -> Option<anyhow::Error> {
        says_locked(stderr).then(|| {
            fail(
                Code::Busy,
                format!(
                    "cannot update {branch} in {}: another process holds git's lock on it ({}); try again",
                    self.dir.display(),
                    last_lines(stderr)
                ),
            )
        })
    }

    /// The store's lock, for one fetch or ref update (see `StoreLock`).
    fn lock(&self) -> Result<StoreLock> {
        StoreLock::take(&self.dir, self.lock_wait)
    }
}

/// An exclusive OS file lock (`flock`) on one private store, held around
/// every command that writes its refs or its `shallow` file (fetches,
/// `update-ref`) and around a rebuild. Without it, processes of one clone
/// (several publishers, a publish and a restore) race on git's own ref
/// locks and fail with `cannot lock ref 'refs/warmstart/...'`. The lock file
/// is `<store>.lock` beside the store, not inside it, so that a rebuild can
/// replace the store while holding it. The kernel drops it with the process.
pub struct StoreLock {
    _file: File,
}

impl StoreLock {
    /// Waits at most `wait` for the lock of the store at `dir`; then exit 3
    /// (busy), naming the lock file.
    pub fn take(dir: &Path, wait: Duration) -> Result<StoreLock> {
        let path = lock_path(dir);
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(StoreLock { _file: file }),
                Err(std::fs::TryLockError::WouldBlock) if start.elapsed() < wait => {
                    std::thread::sleep(pause.min(wait.saturating_sub(start.elapsed())));
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(std::fs::TryLockError::WouldBlock) => {
                    return Err(fail(
                        Code::Busy,
                        format!(
                            "{} is held by another warmstart process of this clone after {:.1}s: try again when it is done",
                            path.display(),
                            start.elapsed().as_secs_f64()
                        ),
                    ));
                }
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(anyhow!(e).context(format!("locking {}", path.display())));
                }
            }
        }
    }
}

/// `<state>/cache.git.lock` for `<state>/cache.git`.
pub fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

/// The reason `git push --porcelain` gave for refusing `dst`, if it did:
/// the third field of a line `!\t<src>:<dst>\t[rejected] (stale info)`.
fn push_rejection(stdout: &str, dst: &str) -> Option<String> {
    stdout.lines().find_map(|l| {
        let mut fields = l.split('\t');
        let (flag, refs, why) = (fields.next()?, fields.next()?, fields.next()?);
        let to = refs.rsplit_once(':').map(|(_, to)| to)?;
        (flag == "!" && to == dst).then(|| why.trim().to_string())
    })
}

/// What git said when a failed push to `dst` lost its lease, or `None`
/// when it failed for another reason. The porcelain verdict on `dst`
/// decides; stderr only when there is none.
fn lease_lost(stdout: &str, stderr: &str, dst: &str) -> Option<String> {
    match push_rejection(stdout, dst) {
        Some(why) => is_lease_reason(&why).then_some(why),
        None => is_lease_reason(stderr).then(|| last_lines(stderr)),
    }
}

/// Words git uses when a ref moved under a push: the lease is lost, which
/// is contention (retry, then busy), never an unreachable remote.
fn is_lease_reason(why: &str) -> bool {
    [
        "stale info",
        "fetch first",
        "cannot lock ref",
        "failed to update ref",
        "but expected",
        "reference already exists",
    ]
    .iter()
    .any(|w| why.contains(w))
}

/// What to do about a push of `dst` that the server's rules refused
/// (`said`: git's stdout and stderr), or `None` for other failures. Hosts
/// refuse refs outside `refs/heads/` and `refs/tags/` in a pre-receive hook,
/// and branch protection (GitHub rulesets, GitLab protected branches,
/// `receive.denyNonFastForwards`) refuses the force push every publish is.
pub fn refusal_hint(dst: &str, said: &str) -> Option<String> {
    let lower = said.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    // A rule's words; for a ref outside refs/heads/, any rejection by the
    // server (hidden or reserved namespaces are refused that way too).
    let rule = [
        "hook declined",
        "protected",
        "gh006",
        "gh013",
        "non-fast-forward",
        "force push",
        "force-push",
        "denying",
        "not allowed",
    ];
    let refused = if dst.starts_with("refs/heads/") {
        any(&rule)
    } else {
        any(&rule) || any(&["remote rejected", "refusing", "denied"])
    };
    if !refused {
        return None;
    }
    // A publish's temporary refs (`cache::publish::push`) name their cache.
    if let Some(rest) = dst.strip_prefix("refs/heads/warmstart-tmp/") {
        let name = rest.split('/').next().unwrap_or(rest);
        return Some(format!(
            "the host refuses the branches under warmstart-tmp/ where a publish over the push limit puts its batches: exempt warmstart-tmp/** from the rule, or raise [publish] push_limit in cache {name}'s manifest if the host takes bigger pushes"
        ));
    }
    let last = match dst.strip_prefix("refs/warmstart/tmp/") {
        Some(rest) => rest.split('/').next().unwrap_or(rest),
        // The cache's likely name, for a copyable suggestion.
        None => dst.rsplit('/').next().unwrap_or(dst),
    };
    Some(if dst.starts_with("refs/heads/") {
        let name = last.strip_suffix("-cache").unwrap_or(last);
        format!(
            "the host protects {dst} against force pushes or deletions, and every publish replaces the branch's one commit: exempt it from the rule, or move the cache off branches with cache.ref = \"refs/warmstart/cache/{name}\" in its manifest (`{cmd} cache migrate {name}`)",
            cmd = crate::invocation::command()
        )
    } else {
        format!(
            "this host may accept only branches and tags: set cache.branch (e.g. \"{last}-cache\") instead of cache.ref in the cache's manifest"
        )
    })
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
fn advertises_filter(trace: &str) -> bool {
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

/// A push refused because the remote ref is no longer the value the lease
/// named: someone else pushed in between. Callers may fetch again and retry
/// (`is_stale_lease`); unhandled, it exits 3 (busy): contention for the
/// ref, not a remote that cannot be reached.
#[derive(Debug)]
pub struct StaleLease {
    pub message: String,
    /// What git said, carrying the exit code (3) for `exit::code_of`.
    pub git: crate::exit::Failure,
}

impl std::fmt::Display for StaleLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StaleLease {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.git)
    }
}

/// Whether `err` is a push that lost its lease (see `StaleLease`).
pub fn is_stale_lease(err: &anyhow::Error) -> bool {
    err.chain().any(|e| e.is::<StaleLease>())
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
    /// Stopped past a deadline (exit 8), or refused our credentials
    /// (exit 13): the message says which, and the code is kept.
    Network { code: Code, message: String },
}

/// Words git prints when an object store lacks an object it should have or
/// holds a damaged one (deleted or truncated packs, a corrupt or empty
/// loose object, a ref to an object that is not there). Lines from the
/// server (`remote: ...`) never count: a damaged remote is not ours to
/// rebuild.
const DAMAGE: [&str; 17] = [
    "bad object",
    "missing blob object",
    "missing tree object",
    "missing commit object",
    "did not send all necessary objects",
    "cannot be accessed",
    "object file",
    "is corrupt",
    "corrupt loose object",
    "inflate:",
    "unable to rename temporary",
    "does not match index",
    "bad packed object",
    "does not point to a valid object",
    "unable to read tree",
    "not a git repository",
    "index file",
];

/// Whether git (not the server) failed to take one of its own ref or
/// file locks in the store.
fn says_locked(stderr: &str) -> bool {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("remote:"))
        .any(|l| l.contains("cannot lock ref") || l.contains(".lock': File exists"))
}

fn says_damaged(stderr: &str) -> bool {
    stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("remote:"))
        .any(|l| DAMAGE.iter().any(|w| l.contains(w)))
}

/// A private store (cache.git, cache-meta.git) that failed in a way that
/// says it is damaged, found on the failure path only (from git's words):
/// `healing` rebuilds it once and runs the step again.
#[derive(Debug, Clone)]
pub struct StoreDamaged {
    pub dir: PathBuf,
    /// What git said.
    pub detail: String,
    /// The store's inode when the damage was seen: a store another process
    /// has rebuilt since then is not rebuilt again.
    inode: Option<u64>,
    /// Whether the message stands alone (inside an I/O error) or heads the
    /// error it is the context of (which already says what git said).
    standalone: bool,
}

impl StoreDamaged {
    /// `Some` when `stderr` (of git run in the store at `dir`) says damaged.
    fn of(dir: &Path, stderr: &str) -> Option<StoreDamaged> {
        says_damaged(stderr).then(|| StoreDamaged {
            dir: dir.to_path_buf(),
            detail: last_lines(stderr),
            inode: inode(dir),
            standalone: true,
        })
    }
}

impl std::fmt::Display for StoreDamaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} looks damaged", self.dir.display())?;
        if self.standalone {
            write!(f, ": {}", self.detail)?;
        }
        Ok(())
    }
}

impl std::error::Error for StoreDamaged {}

fn inode(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| m.ino())
}

/// `err`, marked as a damaged store when `stderr` says so (its exit code
/// is kept: if a rebuild does not help, the remote really is at fault).
fn damaged_or(dir: &Path, stderr: &str, err: anyhow::Error) -> anyhow::Error {
    match StoreDamaged::of(dir, stderr) {
        Some(d) => err.context(StoreDamaged {
            standalone: false,
            ..d
        }),
        None => err,
    }
}

/// The damaged store `err` reports, wherever it is in the chain (also
/// inside an I/O error from a `BlobReader`).
pub fn damage_of(err: &anyhow::Error) -> Option<StoreDamaged> {
    if let Some(d) = err.downcast_ref::<StoreDamaged>() {
        return Some(d.clone());
    }
    err.chain().find_map(|e| {
        e.downcast_ref::<StoreDamaged>().cloned().or_else(|| {
            e.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<StoreDamaged>())
                .cloned()
        })
    })
}

/// Runs `step`; if it failed because a private store is damaged, rebuilds
/// that store (once per store and process, with a one-line warning) and
/// runs `step` again. Nothing is checked unless `step` failed, so this
/// adds no I/O to any path that works; and only the store is rebuilt,
/// never anything installed. `step` must be safe to run again from the
/// start (it fetches again what the store lost).
pub fn healing<T>(mut step: impl FnMut() -> Result<T>) -> Result<T> {
    let err = match step() {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    match damage_of(&err) {
        Some(d) if rebuild_once(&d)? => step(),
        _ => Err(err),
    }
}

/// Rebuilds a damaged store empty, under its lock, unless this process
/// already did (then `false`: the damage is not the store's). The old
/// store is renamed aside first, so that no process ever sees half of one.
fn rebuild_once(d: &StoreDamaged) -> Result<bool> {
    static REBUILT: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
    let mut rebuilt = REBUILT.lock().unwrap_or_else(|p| p.into_inner());
    if rebuilt.contains(&d.dir) {
        return Ok(false);
    }
    rebuilt.push(d.dir.clone());
    let _lock = StoreLock::take(&d.dir, STORE_LOCK_WAIT)?;
    if d.inode.is_some() && inode(&d.dir) != d.inode {
        // Another process rebuilt it since we saw the damage.
        return Ok(true);
    }
    let name = d.dir.file_name().unwrap_or_default().to_string_lossy();
    let aside = d
        .dir
        .with_file_name(format!("{name}.damaged-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&aside);
    if d.dir.exists() {
        std::fs::rename(&d.dir, &aside).with_context(|| {
            format!(
                "moving the damaged {} aside to {}",
                d.dir.display(),
                aside.display()
            )
        })?;
    }
    let sh = Shell::new().context("starting a shell to rebuild a store")?;
    create(&sh, &d.dir)?;
    let _ = std::fs::remove_dir_all(&aside);
    eprintln!(
        "warning: {} was damaged ({}): rebuilt it empty, and what it held is fetched again",
        d.dir.display(),
        d.detail
    );
    Ok(true)
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

/// `git hash-object --stdin-paths`, kept running across chunks.
pub struct BlobWriter {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
}

impl BlobWriter {
    /// Writes the file at `path` (absolute) as a blob; returns its oid. The
    /// file may be deleted once this returns.
    pub fn write_file(&mut self, path: &Path) -> Result<String> {
        let text = path
            .to_str()
            .filter(|p| !p.contains('\n'))
            .ok_or_else(|| anyhow!("{} cannot be passed to git by name", path.display()))?;
        let stdin = self.stdin.as_mut().expect("writer is open");
        let sent = writeln!(stdin, "{text}").and_then(|()| stdin.flush());
        let mut line = String::new();
        let read = self.stdout.read_line(&mut line);
        if sent.is_err() || !matches!(read, Ok(n) if n > 0) {
            return Err(self.failure(&format!("writing {} to cache.git", path.display())));
        }
        parse_oid(line.as_bytes())
    }

    fn failure(&mut self, what: &str) -> anyhow::Error {
        drop(self.stdin.take());
        let mut err = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = self.child.wait();
        anyhow!("{what}: git hash-object failed: {}", last_lines(&err))
    }

    /// Closes the writer and checks git's exit status.
    pub fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let status = self.child.wait().context("waiting for git hash-object")?;
        if !status.success() {
            let mut err = String::new();
            if let Some(mut e) = self.child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            bail!("git hash-object failed: {}", last_lines(&err));
        }
        Ok(())
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        if self.stdin.take().is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A blob streamed from `git cat-file blob`. End of stream is only reported
/// after git exited successfully, so a failing git never looks like a short
/// blob.
pub struct BlobReader {
    child: Option<Child>,
    stdout: ChildStdout,
    oid: String,
    store: PathBuf,
}

impl Read for BlobReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stdout.read(buf)?;
        if n == 0
            && !buf.is_empty()
            && let Some(mut child) = self.child.take()
        {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            let status = child.wait()?;
            if !status.success() {
                let said = format!(
                    "git cat-file blob {} failed: {}",
                    self.oid,
                    last_lines(&err)
                );
                // A damaged store travels inside the I/O error, so that
                // `damage_of` finds it under whatever the reader's caller
                // wraps it in.
                return Err(match StoreDamaged::of(&self.store, &err) {
                    Some(d) => std::io::Error::other(d),
                    None => std::io::Error::other(said),
                });
            }
        }
        Ok(n)
    }
}

impl Drop for BlobReader {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn create(sh: &Shell, dir: &Path) -> Result<()> {
    // Made under a temporary name and renamed into place, so two processes
    // creating cache.git at once never see (or configure) a half-made one.
    let parent = dir.parent().expect("cache.git has a parent");
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    let tmp = parent.join(format!("cache.git.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    cmd!(sh, "git init --bare -q {tmp}")
        .env("LC_ALL", "C")
        .quiet()
        .ignore_stdout()
        .run()
        .with_context(|| format!("creating {}", dir.display()))?;
    for (k, v) in CONFIG {
        cmd!(sh, "git --git-dir {tmp} config {k} {v}")
            .quiet()
            .run()
            .with_context(|| format!("configuring {}", dir.display()))?;
    }
    if let Err(e) = std::fs::rename(&tmp, dir) {
        let _ = std::fs::remove_dir_all(&tmp);
        // Another process won the race: its cache.git is as good as ours.
        if !dir.join("HEAD").is_file() {
            return Err(anyhow!(e).context(format!("creating {}", dir.display())));
        }
    }
    Ok(())
}

fn forwarded_config(sh: &Shell, root: &Path) -> Result<Vec<(String, String)>> {
    let out = cmd!(
        sh,
        "git -C {root} config --local -z --get-regexp {FORWARDED_CONFIG}"
    )
    .quiet()
    .ignore_status()
    .ignore_stderr()
    .output()
    .context("reading the repository's transport settings")?;
    // Exit 1 means "no such settings"; anything else is not ours to judge
    // (e.g. a repository without config): forward nothing.
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split('\0')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('\n') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (r.to_string(), "true".to_string()),
        })
        .collect())
}

/// Resolves `remote` for the repository at `root`: a configured remote name
/// (`git remote get-url`), else a URL, an scp-like `host:path`, or a path.
pub fn resolve_remote(sh: &Shell, root: &Path, remote: &str) -> Result<Remote> {
    if remote.is_empty() || remote.starts_with('-') {
        return Err(fail(
            Code::Config,
            format!("{remote:?} is not a remote name or URL"),
        ));
    }
    if !looks_like_location(remote) {
        let out = cmd!(sh, "git -C {root} remote get-url {remote}")
            .quiet()
            .ignore_status()
            .output()
            .context("running git remote get-url")?;
        if !out.status.success() {
            return Err(fail(
                Code::Config,
                format!(
                    "remote {remote} is not configured in {}: add it (`git remote add {remote} URL`), or name a URL with --remote or cache.remote",
                    root.display()
                ),
            ));
        }
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        return Ok(Remote {
            name: remote.to_string(),
            url: absolutize(root, &url),
        });
    }
    let url = absolutize(root, remote);
    Ok(Remote {
        name: url.clone(),
        url,
    })
}

/// A URL (`scheme://`), scp-like (`host:path`, colon before any slash) or a path.
fn looks_like_location(s: &str) -> bool {
    s.contains("://") || is_scp_like(s) || s.contains('/') || s.starts_with('.')
}

fn is_scp_like(s: &str) -> bool {
    match (s.find(':'), s.find('/')) {
        (Some(c), Some(sl)) => c < sl && c > 0,
        (Some(c), None) => c > 0,
        _ => false,
    }
}

/// Relative local paths are taken from the repository root, because git
/// runs in cache.git, not there.
fn absolutize(root: &Path, url: &str) -> String {
    if url.contains("://") || is_scp_like(url) || Path::new(url).is_absolute() {
        url.to_string()
    } else {
        root.join(url).to_string_lossy().into_owned()
    }
}

/// Branch names go into refspecs: refuse what could change their meaning.
pub fn check_branch(branch: &str) -> Result<()> {
    if branch.is_empty()
        || branch.starts_with('-')
        || branch.contains("..")
        || branch
            .bytes()
            .any(|b| b <= b' ' || b":~^?*[\\".contains(&b))
    {
        return Err(fail(
            Code::Config,
            format!("{branch:?} is not a usable branch name"),
        ));
    }
    Ok(())
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

/// The blob lines of `cat-file --batch-check='%(objectname) %(objecttype)
/// %(objectsize)'`, as id to size.
fn parse_blob_sizes(text: &str) -> std::collections::HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (oid, kind, size) = (f.next()?, f.next()?, f.next()?);
            (kind == "blob").then(|| Some((oid.to_string(), size.parse().ok()?)))?
        })
        .collect()
}

/// Parses `git ls-tree -l -z` output (or, without `-l`, `ls-tree -z`'s:
/// every size `None`).
pub fn parse_ls_tree(out: &[u8]) -> Result<Vec<TreeEntry>> {
    let text = std::str::from_utf8(out).context("git ls-tree printed a non-UTF-8 name")?;
    let mut entries = Vec::new();
    for rec in text.split('\0').filter(|r| !r.is_empty()) {
        let (meta, name) = rec
            .split_once('\t')
            .ok_or_else(|| anyhow!("unexpected git ls-tree line {rec:?}"))?;
        let fields: Vec<&str> = meta.split_whitespace().collect();
        let (mode, kind, oid, size) = match fields[..] {
            [mode, kind, oid, size] => (mode, kind, oid, size),
            [mode, kind, oid] => (mode, kind, oid, "-"),
            _ => bail!("unexpected git ls-tree line {rec:?}"),
        };
        entries.push(TreeEntry {
            mode: mode.to_string(),
            kind: kind.to_string(),
            oid: oid.to_string(),
            size: size.parse().ok(),
            name: name.to_string(),
        });
    }
    Ok(entries)
}

/// Where a push is, from git's "Writing objects" line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushProgress {
    /// Of the objects.
    pub percent: u64,
    /// Bytes sent, once git printed its throughput (`, 1.00 MiB | ...`).
    pub bytes: Option<u64>,
}

impl PushProgress {
    /// Bytes sent: git's count, else `percent` of `total`.
    pub fn bytes_of(&self, total: u64) -> u64 {
        let share = u128::from(total) * u128::from(self.percent.min(100)) / 100;
        self.bytes.unwrap_or(share as u64)
    }
}

/// Reads git's progress output (lines ended by `\r` or `\n`) as it
/// comes, and reports the "Writing objects" lines.
#[derive(Default)]
struct ProgressParser {
    line: Vec<u8>,
}

impl ProgressParser {
    fn feed(&mut self, bytes: &[u8], progress: &mut dyn FnMut(PushProgress)) {
        for &b in bytes {
            if b == b'\r' || b == b'\n' {
                let l = String::from_utf8_lossy(&self.line);
                if let Some(p) = push_progress(&l) {
                    progress(p);
                }
                self.line.clear();
            } else {
                self.line.push(b);
            }
        }
    }
}

/// `Writing objects:  40% (2/5), 1.00 MiB | 2.00 MiB/s, done.` read.
fn push_progress(line: &str) -> Option<PushProgress> {
    let rest = line
        .trim_start_matches("remote: ")
        .strip_prefix("Writing objects:")?;
    let (pct, rest) = rest.split_once('%')?;
    let percent = pct.trim().parse::<u64>().ok()?;
    let bytes = rest
        .split_once("), ")
        .and_then(|(_, r)| git_size(r.split(['|', ',']).next()?.trim()));
    Some(PushProgress { percent, bytes })
}

/// A size as git's progress prints it (`strbuf_humanise_bytes`):
/// `512 bytes`, `1 byte`, `1.50 KiB`, `12.00 MiB`, `1.02 GiB`.
fn git_size(text: &str) -> Option<u64> {
    let (num, unit) = text.split_once(' ')?;
    let scale: u64 = match unit {
        "byte" | "bytes" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        _ => return None,
    };
    let n: f64 = num
        .parse()
        .ok()
        .filter(|n: &f64| n.is_finite() && *n >= 0.0)?;
    Some((n * scale as f64) as u64)
}

/// git's stderr without its progress updates: whole lines of the final state.
fn final_lines(stderr: &[u8]) -> String {
    String::from_utf8_lossy(stderr)
        .split(['\r', '\n'])
        .filter(|l| !l.contains("objects:") && !l.contains("Delta compression"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl CacheGit {
    /// Runs a git command that talks to `remote` (`what`: `fetch of x`)
    /// under the watchdog (`crate::net`), as the leader of a new process
    /// group, telling `pid` its id while it runs and `None` once it has
    /// exited. Killing the group (`kill(-pid, ...)`) stops git's helpers
    /// too (index-pack, remote-https, ssh), which hold stderr open. Past a
    /// deadline: exit 8 with one line saying which.
    pub(crate) fn run_network(
        &self,
        cmd: &mut Command,
        what: &str,
        remote: &Remote,
        pid: &mut dyn FnMut(Option<u32>),
    ) -> Result<std::process::Output> {
        let ran = net::run(cmd, self.net, None, Some(self.pack_dir()), &mut |_| {}, pid)
            .with_context(|| format!("running git for the {what}"))?;
        if let Some(v) = ran.stopped {
            return Err(v.error(what, &remote.to_string()));
        }
        Ok(std::process::Output {
            status: ran.status,
            stdout: ran.stdout,
            stderr: ran.stderr,
        })
    }
}

/// ssh URLs and scp-like `host:path` (what git reaches through ssh).
fn is_ssh(url: &str) -> bool {
    ["ssh://", "git+ssh://", "ssh+git://"]
        .iter()
        .any(|p| url.starts_with(p))
        || (!url.contains("://") && is_scp_like(url) && !Path::new(url).is_absolute())
}

/// Runs `cmd` with `input` on its stdin and returns its stdout, or an error
/// naming `what` with git's last lines. The input is written from a thread,
/// so a command that answers while it reads (`cat-file --batch-check`)
/// cannot fill its stdout pipe and stall.
fn run_with_input(cmd: &mut Command, input: Vec<u8>, what: &str) -> Result<Vec<u8>> {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {what}"))?;
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child
        .wait_with_output()
        .with_context(|| format!("running {what}"))?;
    let write = writer.join().expect("the stdin writer does not panic");
    check_status(&out, what, store_of(cmd).as_deref())?;
    write.with_context(|| format!("writing to {what}"))?;
    Ok(out.stdout)
}

fn run(cmd: &mut Command) -> Result<Vec<u8>> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {cmd:?}"))?;
    check_status(&out, "git", store_of(cmd).as_deref())?;
    Ok(out.stdout)
}

/// The store a command from `CacheGit::git` runs in (its `--git-dir`).
fn store_of(cmd: &Command) -> Option<PathBuf> {
    let mut args = cmd.get_args();
    (args.next()? == "--git-dir").then(|| args.next().map(PathBuf::from))?
}

/// An error naming `what` with git's last lines when it failed; marked as
/// a damaged `store` when git's words say so (see `damaged_or`).
fn check_status(out: &std::process::Output, what: &str, store: Option<&Path>) -> Result<()> {
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let err = anyhow!("{what} failed: {}", last_lines(&stderr));
        return Err(match store {
            Some(dir) => damaged_or(dir, &stderr, err),
            None => err,
        });
    }
    Ok(())
}

fn parse_oid(out: &[u8]) -> Result<String> {
    let s = String::from_utf8_lossy(out).trim().to_string();
    if !(s.len() == 40 || s.len() == 64) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("git printed {s:?} where an object id was expected");
    }
    Ok(s)
}

/// The last meaningful lines of a git error, joined on one line, without
/// progress, hints and boilerplate (`net::cause`).
fn last_lines(stderr: &str) -> String {
    // Git redacts URLs in its own messages, but not in every one (a hook's
    // output, a helper's), and this text is printed and put in JSON.
    crate::redact::text(&net::cause(stderr))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_versions_and_old_git_listings_parse() {
        assert_eq!(git_version("git version 2.39.5\n"), Some((2, 39)));
        assert_eq!(git_version("git version 2.47.3.windows.1"), Some((2, 47)));
        assert_eq!(git_version("git version 2.50.0-rc1"), Some((2, 50)));
        assert_eq!(git_version("hub version 2.14"), None);
        assert_eq!(git_version(""), None);
        // Without `-l`: three fields, no size.
        let e =
            parse_ls_tree(b"100644 blob 5716ca5987cbf97d6bb54920bea6adde242d87e6\ta b\0").unwrap();
        assert_eq!((e[0].name.as_str(), e[0].size), ("a b", None));
        let sizes = parse_blob_sizes("aa commit 3\nbb blob 12\ncc tree 40\ndd blob x\n");
        assert_eq!(sizes.len(), 1);
        assert_eq!(sizes["bb"], 12);
    }

    #[test]
    fn ls_tree_lines_parse() {
        let out = b"100644 blob 3b18e512dba79e4c8300dd08aeb37f8e728b8dad      12\tREADME.md\x00040000 tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904       -\tsub dir\0";
        let e = parse_ls_tree(out).unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].size, Some(12));
        assert_eq!(e[0].name, "README.md");
        assert_eq!(e[1].kind, "tree");
        assert_eq!(e[1].size, None);
        assert_eq!(e[1].name, "sub dir");
    }

    #[test]
    fn locations_are_told_from_names() {
        assert!(!looks_like_location("origin"));
        assert!(looks_like_location("https://example.com/x.git"));
        assert!(looks_like_location("git@github.com:o/r.git"));
        assert!(looks_like_location("../origin.git"));
        assert!(looks_like_location("/srv/origin.git"));
        let root = Path::new("/work/repo");
        assert_eq!(absolutize(root, "../o.git"), "/work/repo/../o.git");
        assert_eq!(absolutize(root, "git@h:o/r.git"), "git@h:o/r.git");
        assert_eq!(absolutize(root, "file:///srv/o.git"), "file:///srv/o.git");
    }

    #[test]
    fn branch_names_are_checked() {
        assert!(check_branch("xtask-bin-cache").is_ok());
        assert!(check_branch("caches/rust").is_ok());
        for bad in ["", "-x", "a..b", "a b", "a:b", "a^", "a~1"] {
            assert!(check_branch(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn progress_is_parsed_from_carriage_returns() {
        let text = b"Enumerating objects: 5, done.\rWriting objects:  40% (2/5)\rWriting objects: 100% (5/5), 1.00 MiB | 2 MiB/s, done.\nTotal 5\nerror: boom\n";
        let mut seen = Vec::new();
        let mut parser = ProgressParser::default();
        for piece in text.chunks(7) {
            parser.feed(piece, &mut |p| seen.push(p));
        }
        let rest = final_lines(text);
        let at = |percent, bytes| PushProgress { percent, bytes };
        assert_eq!(seen, [at(40, None), at(100, Some(1 << 20))]);
        assert!(rest.contains("error: boom"));
        assert!(!rest.contains("Writing objects"));
    }

    /// `push` shows bytes and a rate: git's throughput is read, in every
    /// unit git prints, and a line without it falls back to the percentage.
    #[test]
    fn push_progress_reads_the_bytes_git_sent() {
        for (line, want) in [
            ("Writing objects:  12% (1/8)", (12, None)),
            (
                "Writing objects:  50% (4/8), 512 bytes | 512.00 KiB/s",
                (50, Some(512)),
            ),
            (
                "Writing objects: 100% (1/1), 1 byte | 1 byte/s, done.",
                (100, Some(1)),
            ),
            (
                "Writing objects:  75% (3/4), 1.50 KiB | 1.00 MiB/s",
                (75, Some(1536)),
            ),
            (
                "Writing objects:  80% (4/5), 23.50 MiB | 11.75 MiB/s",
                (80, Some(47 << 19)),
            ),
            (
                "Writing objects: 100% (5/5), 1.25 GiB | 90.00 MiB/s, done.",
                (100, Some(5 << 28)),
            ),
            ("remote: Writing objects:  3% (1/30)", (3, None)),
        ] {
            let got = push_progress(line).unwrap_or_else(|| panic!("{line}"));
            assert_eq!((got.percent, got.bytes), want, "{line}");
        }
        for not in [
            "Counting objects: 40% (2/5)",
            "Writing objects: lots",
            "Writing objects:  40% (2/5), many MiB | 1 MiB/s",
            "",
        ] {
            assert!(
                push_progress(not).is_none_or(|p| p.bytes.is_none()),
                "{not}"
            );
        }
        let p = PushProgress {
            percent: 40,
            bytes: None,
        };
        assert_eq!(p.bytes_of(1000), 400);
        let p = PushProgress {
            percent: 40,
            bytes: Some(7),
        };
        assert_eq!(p.bytes_of(1000), 7);
    }

    #[test]
    fn porcelain_push_verdicts_are_read_for_our_ref_only() {
        let dst = "refs/heads/c-cache";
        let stale =
            "To git://127.0.0.1/o.git\n!\tabc:refs/heads/c-cache\t[rejected] (stale info)\nDone\n";
        assert_eq!(
            push_rejection(stale, dst).as_deref(),
            Some("[rejected] (stale info)")
        );
        let raced = "!\tabc:refs/heads/c-cache\t[remote rejected] (cannot lock ref 'refs/heads/c-cache': is at 1 but expected 2)\n";
        assert!(is_lease_reason(&push_rejection(raced, dst).unwrap()));
        let first = "!\tabc:refs/heads/c-cache\t[rejected] (fetch first)\n";
        assert!(is_lease_reason(&push_rejection(first, dst).unwrap()));
        // A hook's refusal is the remote's verdict, not contention.
        let hook = "!\tabc:refs/heads/c-cache\t[remote rejected] (pre-receive hook declined)\n";
        assert!(!is_lease_reason(&push_rejection(hook, dst).unwrap()));
        // Another ref's line, or an accepted push, is no verdict on ours.
        let other = "!\tabc:refs/heads/c-cache-2\t[rejected] (stale info)\n+\tabc:refs/heads/c-cache\t1...2 (forced update)\n";
        assert_eq!(push_rejection(other, dst), None);
    }

    /// A tiny deterministic generator for the property tests below.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
            from[(self.next() % from.len() as u64) as usize]
        }
    }

    /// Never: a push that lost its lease (on the client or on the server,
    /// whatever else git printed around it, other refs' verdicts included)
    /// is classified as anything but a lost lease (exit 3), and a push
    /// refused for another reason, or never answered, as one.
    #[test]
    fn a_lost_lease_is_never_taken_for_an_unreachable_remote() {
        let lease = [
            "[rejected] (stale info)",
            "[rejected] (fetch first)",
            "[remote rejected] (cannot lock ref 'refs/heads/b': is at 1 but expected 2)",
            "[remote rejected] (failed to update ref)",
            "[remote rejected] (cannot lock ref 'refs/heads/b': reference already exists)",
        ];
        let other = [
            "[remote rejected] (pre-receive hook declined)",
            "[remote rejected] (unpacker error)",
            "[remote rejected] (shallow update not allowed)",
            "[rejected] (non-fast-forward)",
        ];
        let noise_out = [
            "To git://127.0.0.1/o.git",
            "Done",
            "*\tabc:refs/heads/new\t[new branch]",
            "=\tabc:refs/heads/b2\t[up to date]",
            "!\tabc:refs/heads/b-other\t[rejected] (stale info)",
            "!\tabc:refs/heads/b-other\t[remote rejected] (pre-receive hook declined)",
        ];
        let network = [
            "fatal: unable to connect to 127.0.0.1:",
            "fatal: the remote end hung up unexpectedly",
            "fatal: Could not read from remote repository.",
            "error: RPC failed; HTTP 502",
            "fatal: unable to access 'https://h/o.git/': Failed to connect",
        ];
        let dst = "refs/heads/b";
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for case in 0..2000 {
            let mut out = Vec::new();
            for _ in 0..rng.next() % 4 {
                out.push(rng.pick(&noise_out).to_string());
            }
            let want_lease = rng.next().is_multiple_of(2);
            let why = if want_lease {
                rng.pick(&lease)
            } else {
                rng.pick(&other)
            };
            let ours = format!("!\tdeadbeef:{dst}\t{why}");
            out.insert((rng.next() % (out.len() as u64 + 1)) as usize, ours);
            let mut err: Vec<String> = (0..rng.next() % 3)
                .map(|_| rng.pick(&network).to_string())
                .collect();
            if rng.next().is_multiple_of(2) {
                // Servers echo their reasons on stderr too.
                err.push(format!("remote: error: {}", rng.pick(&lease)));
            }
            let (out, err) = (out.join("\n"), err.join("\n"));
            assert_eq!(
                lease_lost(&out, &err, dst).is_some(),
                want_lease,
                "case {case}:\n{out}\n--\n{err}"
            );
            // No porcelain verdict (the transport died first): stderr decides.
            let bare = format!("{err}\nerror: failed to push some refs");
            let from_stderr = lease_lost("", &bare, dst).is_some();
            assert_eq!(
                from_stderr,
                err.contains("remote: error:"),
                "case {case}: {bare}"
            );
            let unreachable = rng.pick(&network);
            assert!(lease_lost("", unreachable, dst).is_none(), "{unreachable}");
        }
    }

    #[test]
    fn damage_is_told_from_git_words_but_never_from_the_server() {
        for said in [
            "fatal: missing blob object 'c145610e257d7c774d4caf5614a89aa0b062a86c'\nerror: remote did not send all necessary objects",
            "fatal: bad object refs/warmstart/c-cache",
            "error: packfile .git/objects/pack/pack-1.pack cannot be accessed",
            "error: object file .git/objects/ab/cdef is empty",
            "fatal: loose object abc (stored in x) is corrupt",
            "fatal: unable to rename temporary '*.pack' file to 'x.pack'\nfatal: fetch-pack: invalid index-pack output",
        ] {
            assert!(says_damaged(said), "{said}");
        }
        assert!(says_locked(
            "error: cannot lock ref 'refs/warmstart/b': Unable to create '/x/refs/warmstart/b.lock': File exists."
        ));
        assert!(!says_locked(
            "remote: error: cannot lock ref 'refs/heads/b'"
        ));
        for said in [
            "fatal: unable to access 'https://h/o.git/': Could not resolve host: h",
            "fatal: Could not read from remote repository.",
            "fatal: couldn't find remote ref refs/heads/x",
            "remote: fatal: bad object 1234\nfatal: the remote end hung up unexpectedly",
            "",
        ] {
            assert!(!says_damaged(said), "{said}");
        }
        // Never from the server's lines, whatever they say; always from a
        // local line, wherever it falls among them.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let noise = [
            "fatal: the remote end hung up unexpectedly",
            "error: RPC failed; curl 18",
            "hint: see git help fetch",
            "",
        ];
        for case in 0..1000 {
            let mut lines: Vec<String> = (0..rng.next() % 5)
                .map(|_| {
                    let w = rng.pick(&DAMAGE);
                    format!("remote: fatal: {w} 0123abcd")
                })
                .collect();
            lines.extend((0..rng.next() % 3).map(|_| rng.pick(&noise).to_string()));
            let text = lines.join("\n");
            assert!(!says_damaged(&text), "case {case}: {text}");
            let local = format!("fatal: {} 0123abcd", rng.pick(&DAMAGE));
            lines.insert((rng.next() % (lines.len() as u64 + 1)) as usize, local);
            let text = lines.join("\n");
            assert!(says_damaged(&text), "case {case}: {text}");
        }
    }

    /// A failure whose words say damage carries the store, under any
    /// context a caller adds, and inside an I/O error too.
    #[test]
    fn damage_is_found_anywhere_in_the_chain() {
        let dir = Path::new("/nonexistent/cache.git");
        let e = damaged_or(
            dir,
            "fatal: bad object x",
            fail(Code::Remote, "cannot fetch"),
        )
        .context("restoring cache c");
        assert_eq!(damage_of(&e).unwrap().dir, dir);
        assert_eq!(crate::exit::code_of(&e), Code::Remote);
        let io = std::io::Error::other(StoreDamaged::of(dir, "fatal: bad object x").unwrap());
        let e = anyhow!(io).context("reading chunk 0");
        assert_eq!(damage_of(&e).unwrap().dir, dir);
        let plain = damaged_or(
            dir,
            "fatal: Could not read from remote repository.",
            anyhow!("x"),
        );
        assert!(damage_of(&plain).is_none());
    }

    #[test]
    fn filter_support_is_read_from_the_advertisement() {
        let v2 = "12:00 pkt-line.c:86 packet: ls-remote< version 2\n12:00 pkt-line.c:86 packet: ls-remote< fetch=shallow wait-for-done filter\n";
        assert!(advertises_filter(v2));
        assert!(!advertises_filter(&v2.replace(" filter", "")));
        assert!(!advertises_filter(&v2.replace(" filter", " filterx")));
        let v0 = "packet: ls-remote< e543 refs/heads/main\\0multi_ack thin-pack filter agent=git/2.47.3\n";
        assert!(advertises_filter(v0));
        assert!(!advertises_filter(&v0.replace(" filter", "")));
        // A ref named like the capability is not the capability.
        assert!(!advertises_filter(
            "packet: ls-remote< e543 refs/heads/filter\n"
        ));
        assert!(!advertises_filter(""));
    }

    #[test]
    fn refusals_by_host_rules_get_the_setting_to_change() {
        let hook = "remote: refusing ref\n ! [remote rejected] x -> x (pre-receive hook declined)";
        let h = refusal_hint("refs/warmstart/cache/rust", hook).unwrap();
        assert!(h.contains("cache.branch (e.g. \"rust-cache\")"), "{h}");
        let gh = "remote: error: GH006: Protected branch update failed for refs/heads/rust-cache.";
        let h = refusal_hint("refs/heads/rust-cache", gh).unwrap();
        assert!(h.contains("refs/warmstart/cache/rust"), "{h}");
        assert!(h.contains("cache migrate rust"), "{h}");
        // Not a rule: no advice about settings.
        let other = " ! [remote rejected] x -> x (missing necessary objects)";
        assert_eq!(refusal_hint("refs/heads/rust-cache", other), None);
        assert_eq!(
            refusal_hint("refs/heads/x", "fatal: unable to access"),
            None
        );
        assert!(refusal_hint("refs/warmstart/cache/x", other).is_some());
        // A batch's temporary ref names its cache, not its batch number.
        let h = refusal_hint("refs/warmstart/tmp/rust/1764590000-0a1b2c3d/001", hook).unwrap();
        assert!(h.contains("cache.branch (e.g. \"rust-cache\")"), "{h}");
        let h = refusal_hint(
            "refs/heads/warmstart-tmp/rust/1764590000-0a1b2c3d/001",
            hook,
        )
        .unwrap();
        assert!(
            h.contains("exempt warmstart-tmp/**") && h.contains("cache rust's"),
            "{h}"
        );
        assert_eq!(
            refusal_hint("refs/heads/warmstart-tmp/rust/1/001", other),
            None
        );
    }

    #[test]
    fn git_errors_keep_their_last_lines() {
        assert_eq!(
            last_lines("hint: x\nfatal: one\nfatal: two\n"),
            "fatal: one; fatal: two"
        );
        assert_eq!(last_lines(""), "no message from git");
    }

    /// The whole publish path against a real bare remote: blobs, a root
    /// tree and commit, a leased push, a shallow fetch back, a missing branch.
    #[test]
    fn publish_and_fetch_through_a_bare_remote() {
        let tmp = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        let root = tmp.path().join("work");
        let origin = tmp.path().join("origin.git");
        cmd!(sh, "git init -q {root}").run().unwrap();
        cmd!(sh, "git init -q --bare {origin}").run().unwrap();
        cmd!(sh, "git -C {root} remote add origin ../origin.git")
            .run()
            .unwrap();
        let repo = Repo::discover(&root).unwrap();
        let git = CacheGit::open(&sh, &repo).unwrap();
        assert!(repo.state_dir().join("cache.git/HEAD").is_file());
        let remote = git.resolve_remote(&sh, "origin").unwrap();
        assert_eq!(remote.url, root.join("../origin.git").to_string_lossy());
        assert_eq!(git.try_fetch_branch(&remote, "c-cache").unwrap(), None);
        let err = git.fetch_branch(&remote, "c-cache").unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::NotFound);

        let chunk = tmp.path().join("chunk");
        std::fs::write(&chunk, vec![7u8; 3 << 20]).unwrap();
        let mut w = git.blob_writer().unwrap();
        let big = w.write_file(&chunk).unwrap();
        w.finish().unwrap();
        let small = git.write_blob_bytes(b"hello\n").unwrap();
        let entry = |oid: &str, name: &str| TreeEntry {
            mode: "100644".into(),
            kind: "blob".into(),
            oid: oid.into(),
            size: None,
            name: name.into(),
        };
        let tree = git
            .mktree(&[entry(&small, "README.md"), entry(&big, "k.part000")])
            .unwrap();
        let commit = git.commit_tree(&tree, "cache").unwrap();
        let mut seen = Vec::new();
        git.push_branch(&remote, "c-cache", &commit, None, &mut |p| seen.push(p))
            .unwrap();
        // A lease on "absent" now fails: the branch exists.
        let other = git.commit_tree(&tree, "another").unwrap();
        let err = git
            .push_branch(&remote, "c-cache", &other, None, &mut |_| {})
            .unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Busy, "{err:#}");
        assert!(is_stale_lease(&err), "{err:#}");

        assert_eq!(git.fetch_branch(&remote, "c-cache").unwrap(), commit);
        let listed = git.ls_tree(&commit).unwrap();
        assert_eq!(listed.len(), 2);
        assert_eq!(listed[1].size, Some(3 << 20));
        assert_eq!(git.read_blob_bytes(&small).unwrap(), b"hello\n");
        let mut n = 0u64;
        let mut r = git.read_blob(&big).unwrap();
        n += std::io::copy(&mut r, &mut std::io::sink()).unwrap();
        assert_eq!(n, 3 << 20);
        // Reading a missing object is an error, not an empty blob.
        let mut r = git.read_blob(&"0".repeat(40)).unwrap();
        assert!(std::io::copy(&mut r, &mut std::io::sink()).is_err());
    }

    /// ssh gets BatchMode, a connect timeout and keep-alives only when the
    /// user has no ssh command of their own; HTTP gets curl's low-speed
    /// limit. (The machine's own ssh settings decide the first case.)
    #[test]
    fn ssh_and_http_belts_respect_the_users_own_ssh_command() {
        let tmp = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        let root = tmp.path().join("work");
        cmd!(sh, "git init -q {root}").run().unwrap();
        let repo = Repo::discover(&root).unwrap();
        let ssh_of = |git: &CacheGit, url: &str| {
            let mut c = Command::new("git");
            git.belts(&mut c, url);
            let args: Vec<String> = c
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            let env = c
                .get_envs()
                .find(|(k, _)| *k == "GIT_SSH_COMMAND")
                .and_then(|(_, v)| v)
                .map(|v| v.to_string_lossy().into_owned());
            (env, args)
        };
        let machine_has_one = ["GIT_SSH_COMMAND", "GIT_SSH", "GIT_SSH_VARIANT"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
            || cmd!(
                sh,
                "git config --get-regexp ^(core\\.sshcommand|ssh\\.variant)$"
            )
            .quiet()
            .ignore_status()
            .output()
            .unwrap()
            .status
            .success();
        let git = CacheGit::open(&sh, &repo).unwrap();
        for url in ["ssh://git@127.0.0.1/x.git", "git@127.0.0.1:x.git"] {
            let (env, args) = ssh_of(&git, url);
            assert!(args.is_empty(), "{args:?}");
            if machine_has_one {
                assert_eq!(env, None, "the machine's ssh command is left alone");
            } else {
                let env = env.expect("a GIT_SSH_COMMAND");
                assert!(
                    env.contains("BatchMode=yes") && env.contains("ConnectTimeout=13"),
                    "{env}"
                );
            }
        }
        let (env, args) = ssh_of(&git, "https://127.0.0.1/x.git");
        assert_eq!(env, None);
        assert!(
            args.contains(&"http.lowSpeedTime=33".to_string()),
            "{args:?}"
        );
        assert_eq!(ssh_of(&git, "/srv/x.git"), (None, vec![]));
        // The repository's own core.sshCommand (forwarded) wins.
        cmd!(
            sh,
            "git -C {root} config core.sshCommand 'ssh -i /nonexistent'"
        )
        .run()
        .unwrap();
        let git = CacheGit::open(&sh, &repo).unwrap();
        assert_eq!(ssh_of(&git, "ssh://git@127.0.0.1/x.git").0, None);
    }

    /// The shallow file gains and loses exactly the commits named, keeps
    /// the others (a branch fetch's), and goes when it would be empty; a
    /// `shallow.lock` another git holds is busy (exit 3), not overwritten.
    #[test]
    fn shallow_marks_come_and_go_without_touching_the_others() {
        let tmp = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        let root = tmp.path().join("work");
        cmd!(sh, "git init -q {root}").run().unwrap();
        let git = CacheGit::open(&sh, &Repo::discover(&root).unwrap()).unwrap();
        let shallow = git.dir.join("shallow");
        let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        git.set_shallow(std::slice::from_ref(&a), true).unwrap();
        git.set_shallow(&[b.clone(), c.clone(), a.clone()], true)
            .unwrap();
        let text = std::fs::read_to_string(&shallow).unwrap();
        assert_eq!(text, format!("{a}\n{b}\n{c}\n"));
        git.set_shallow(&[b.clone(), c.clone()], false).unwrap();
        assert_eq!(std::fs::read_to_string(&shallow).unwrap(), format!("{a}\n"));
        std::fs::write(git.dir.join("shallow.lock"), "").unwrap();
        let err = git.set_shallow(std::slice::from_ref(&b), true).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Busy, "{err:#}");
        assert_eq!(std::fs::read_to_string(&shallow).unwrap(), format!("{a}\n"));
        std::fs::remove_file(git.dir.join("shallow.lock")).unwrap();
        git.set_shallow(std::slice::from_ref(&a), false).unwrap();
        assert!(!shallow.exists());
        // Nothing to change: no file appears.
        git.set_shallow(&[], true).unwrap();
        assert!(!shallow.exists());
    }

    #[test]
    fn unknown_remote_names_are_config_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        let root = tmp.path();
        cmd!(sh, "git init -q {root}").run().unwrap();
        let err = resolve_remote(&sh, root, "upstream").unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Config);
        assert!(err.to_string().contains("git remote add upstream"), "{err}");
    }
}
