//! The private stores (`cache.git`, `cache-meta.git`): creating and opening them,
//! the environment every git command there runs with, and `StoreLock`, the flock
//! beside each store that its fetches and ref updates hold.

use crate::exit::{Code, fail};
use crate::net::{self, ManifestNetwork, NetworkSettings};
use crate::repo::Repo;
use anyhow::{Context, Result, anyhow};
use std::fs::File;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use xshell::{Shell, cmd};

use super::*;

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
pub(super) const CONFIG: [(&str, &str); 9] = [
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

/// The private object store of one clone.
#[derive(Clone, Debug)]
pub struct CacheGit {
    /// `<git-dir>/warmstart/cache.git`.
    pub dir: PathBuf,
    /// Transport settings forwarded from the user's repository.
    pub(super) forwarded: Vec<(String, String)>,
    /// The user's work-tree root (to resolve remotes).
    pub(super) root: PathBuf,
    /// How long a fetch or ref update waits for the store's lock
    /// (`StoreLock`) before giving up busy (exit 3).
    pub(super) lock_wait: Duration,
    /// The deadlines of every fetch and push (`set_network`).
    pub(super) net: NetworkSettings,
}

/// How long a command waits for another process's fetch into the same
/// private store, unless the caller says otherwise (`with_lock_wait`):
/// as long as a restorer waits for another restorer of its target.
pub const STORE_LOCK_WAIT: Duration = Duration::from_secs(1800);

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

    pub(super) fn open_at(sh: &Shell, repo: &Repo, name: &str) -> Result<CacheGit> {
        let dir = repo.state_dir().join(name);
        if !dir.join("HEAD").is_file() {
            // `create` puts a whole store in place at once, so anything else
            // at this path (a file, a directory without HEAD) is damage.
            match std::fs::symlink_metadata(&dir) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(sh, &dir)?,
                Err(e) => {
                    return Err(anyhow!(e).context(format!("opening {}", dir.display())));
                }
                Ok(m) if !m.is_dir() => super::heal::rebuild_unopenable(&dir, "not a directory")?,
                Ok(_) => super::heal::rebuild_unopenable(&dir, "no HEAD")?,
            }
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
    pub(super) fn pack_dir(&self) -> net::PackDir {
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

    pub(super) fn user_has_ssh_command(&self) -> bool {
        if ["GIT_SSH_COMMAND", "GIT_SSH", "GIT_SSH_VARIANT"]
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        {
            return true;
        }
        // Unknown is "theirs": better no belt than overriding a setting.
        self.config_matching(super::ssh::SSH_CONFIG)
            .map_or(true, |found| !found.is_empty())
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

    /// The `url.*` and `protocol.*` settings git sees in cache.git:
    /// system, global and the ones forwarded from the user's repository
    /// (lower-case names, as git prints them).
    pub fn transport_settings(&self) -> Result<Vec<(String, String)>> {
        self.config_matching(r"^(url|protocol)\.")
    }

    /// `git config --get-regexp PATTERN` as git sees it in cache.git: the
    /// (lower-case name, value) pairs in git's order, none when nothing
    /// matches (git's exit 1).
    pub fn config_matching(&self, pattern: &str) -> Result<Vec<(String, String)>> {
        let out = self
            .git()
            .args(["config", "--get-regexp", pattern])
            .stdin(Stdio::null())
            .output()
            .context("running git config")?;
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
        crate::process::group::die_with_parent(&mut c);
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
        crate::process::group::die_with_parent(&mut c);
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

    pub(super) fn apply_env(&self, c: &mut Command) {
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

    pub(super) fn lock_contention(&self, stderr: &str, branch: &str) -> Option<anyhow::Error> {
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
    pub(super) fn lock(&self) -> Result<StoreLock> {
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
///
/// Every git command of warmstart that can take one of git's lock files in
/// a store runs under this lock: branch, tree and whole fetches (`shallow.lock`,
/// ref locks, `packed-refs.lock`, `config.lock` for the promisor settings),
/// `update-ref`, `set_shallow`'s own `shallow.lock`, gc's repack and prune,
/// a rebuild. The rest (reads, `hash-object`, fetches of blobs by id, pushes)
/// take none. So a git lock file found once this lock is taken belongs to
/// nobody alive (a git killed with warmstart, by SIGKILL on the whole
/// container): `take` removes it, with one warning naming it, instead of
/// every later command failing busy on it for good.
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
                Ok(()) => {
                    remove_stale_git_locks(dir);
                    return Ok(StoreLock { _file: file });
                }
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

/// Removes git's lock files (`*.lock`) left in the store at `dir`, with one
/// warning each: at its top (`shallow.lock`, `packed-refs.lock`,
/// `config.lock`, `index.lock`, `HEAD.lock`), anywhere under `refs/`, and in
/// `objects/info/` and `objects/pack/`. Called only under the store's lock
/// (see `StoreLock`), and only for a private store: never the user's own
/// repository. A few directory reads; nothing else on a store without any.
fn remove_stale_git_locks(dir: &Path) {
    let mut found = Vec::new();
    for sub in ["", "objects/info", "objects/pack"] {
        lock_files(&dir.join(sub), false, &mut found);
    }
    lock_files(&dir.join("refs"), true, &mut found);
    for path in found {
        match std::fs::remove_file(&path) {
            Ok(()) => eprintln!(
                "warning: removed {}: git's lock file, left by a git that was killed with the warmstart that ran it (no warmstart holds {})",
                path.display(),
                lock_path(dir).display()
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "warning: cannot remove {}, git's lock file left by a killed git ({e}): git will fail on it until it is removed",
                path.display()
            ),
        }
    }
}

/// The files (and symbolic links) named `*.lock` in `dir`, and in its
/// subdirectories when `deep`.
fn lock_files(dir: &Path, deep: bool, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(kind) = e.file_type() else { continue };
        let path = e.path();
        if kind.is_dir() {
            if deep {
                lock_files(&path, true, found);
            }
        } else if path.extension().is_some_and(|x| x == "lock") {
            found.push(path);
        }
    }
}

/// `<state>/cache.git.lock` for `<state>/cache.git`.
pub fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    dir.with_file_name(name)
}

pub(super) fn create(sh: &Shell, dir: &Path) -> Result<()> {
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

/// ssh URLs and scp-like `host:path` (what git reaches through ssh).
pub(super) fn is_ssh(url: &str) -> bool {
    ["ssh://", "git+ssh://", "ssh+git://"]
        .iter()
        .any(|p| url.starts_with(p))
        || (!url.contains("://") && is_scp_like(url) && !Path::new(url).is_absolute())
}
