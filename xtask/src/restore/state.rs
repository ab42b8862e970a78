//! Restore's per-clone state: the progress file, the per-step stamps, locks and logs.
//!
//! Layout under `<git-dir>/warmstart/`:
//! - `restore/state.json`: per step, the last state, what it did, when, the
//!   time of this run and of the last cold run, and the pid of a background
//!   worker. Read by `restore status` and for the "last cold" column.
//! - `restore/stamps/<step>.json`: what a step's warm probe compares against
//!   (the pin of a download, the identity of a pinned tool, the time of the
//!   last freshness check). A stamp is a cache of a fact: an unreadable one
//!   only means "not warm", and the next run rewrites it.
//! - `restore/locks/<step>.lock`: one runner per step at a time.
//! - `logs/<step>.log`: the output of the last run of the step that did work.
//!
//! Writes are atomic (temp file, then rename). `update` holds an flock on
//! `state.lock` around its read-modify-write; each call opens the lock file
//! anew, so threads of one process (a parallel plan) exclude each other as
//! two processes do. This module never runs a step.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::exit::{Code, fail};
use crate::repo::Repo;

pub const VERSION: u32 = 1;

/// Every path restore keeps state in.
#[derive(Clone, Debug)]
pub struct Paths {
    pub dir: PathBuf,
    pub state: PathBuf,
    pub stamps: PathBuf,
    pub locks: PathBuf,
    pub logs: PathBuf,
}

impl Paths {
    pub fn new(repo: &Repo) -> Paths {
        let dir = repo.state_dir().join("restore");
        Paths {
            state: dir.join("state.json"),
            stamps: dir.join("stamps"),
            locks: dir.join("locks"),
            logs: repo.state_dir().join("logs"),
            dir,
        }
    }

    pub fn log(&self, step: &str) -> PathBuf {
        self.logs.join(format!("{step}.log"))
    }

    pub fn worker_log(&self) -> PathBuf {
        self.logs.join("restore-worker.log")
    }
}

/// The state of one step, as the table and `restore status` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    /// It ran and did its job.
    Done,
    /// Its probe said it was already done; nothing ran.
    Warm,
    /// Done or warm, but something needs a person's attention.
    Warned,
    /// It failed; the restore went on.
    FailedOpen,
    /// It failed and stopped the restore (`--strict`, or `fail_open = false`).
    Failed,
    /// Handed to a detached worker; see `restore status`.
    Background,
    /// Not run because an earlier step failed fatally.
    Skipped,
    /// A worker is running it now.
    Running,
    /// Done or warm with a stand-in: a cache's fallback key is installed
    /// because the branch lacks the exact one (the row's `partial` says
    /// which key and how it differs).
    Partial,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Done => "done",
            State::Warm => "warm",
            State::Warned => "warned",
            State::FailedOpen => "failed-open",
            State::Failed => "failed",
            State::Background => "background",
            State::Skipped => "skipped",
            State::Running => "running",
            State::Partial => "partial",
        }
    }

    pub fn is_failure(self) -> bool {
        matches!(self, State::FailedOpen | State::Failed)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateFile {
    pub version: u32,
    pub steps: BTreeMap<String, StepRecord>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepRecord {
    pub state: State,
    pub what: String,
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Epoch ms when the last run began and ended.
    pub started_at: Option<u64>,
    pub finished_at: Option<u64>,
    /// How long the last run took.
    pub ms: Option<u64>,
    /// How long the last successful run that did work (cold) took, and when.
    pub last_cold_ms: Option<u64>,
    pub last_cold_at: Option<u64>,
    /// The process running it, while `state` is `running` or `background`.
    pub pid: Option<u32>,
    pub log: Option<PathBuf>,
}

impl StepRecord {
    pub fn new(state: State, what: impl Into<String>) -> StepRecord {
        StepRecord {
            state,
            what: what.into(),
            warnings: Vec::new(),
            started_at: None,
            finished_at: None,
            ms: None,
            last_cold_ms: None,
            last_cold_at: None,
            pid: None,
            log: None,
        }
    }
}

/// Parses a state file; `Err` names what is wrong.
pub fn parse(text: &str) -> std::result::Result<StateFile, String> {
    let file: StateFile = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if file.version != VERSION {
        return Err(format!(
            "version {} (this build reads version {VERSION})",
            file.version
        ));
    }
    Ok(file)
}

/// Reads the state file for `restore status`: missing is empty, corrupt is a
/// `Code::Corrupt` error that leaves the file where it is.
pub fn read(paths: &Paths) -> Result<StateFile> {
    match std::fs::read_to_string(&paths.state) {
        Ok(text) => parse(&text).map_err(|why| {
            fail(
                Code::Corrupt,
                format!(
                    "{} is corrupt ({why}): run `{cmd} restore`, which sets it aside and starts a new one",
                    paths.state.display(),
                    cmd = crate::invocation::command(),
                ),
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(StateFile {
            version: VERSION,
            ..StateFile::default()
        }),
        Err(e) => Err(e).with_context(|| format!("reading {}", paths.state.display())),
    }
}

/// Reads the state file for a restore run: a corrupt file only holds
/// timings, so it is set aside (never overwritten) with a warning, and the
/// run goes on with an empty one.
pub fn read_for_restore(paths: &Paths) -> StateFile {
    match read(paths) {
        Ok(f) => f,
        Err(e) => {
            let aside = paths
                .state
                .with_extension(format!("json.corrupt-{}", crate::clock::now_ms()));
            match std::fs::rename(&paths.state, &aside) {
                Ok(()) => eprintln!(
                    "warning: {e:#}; kept it as {} and started a new one",
                    aside.display()
                ),
                Err(_) => eprintln!("warning: {e:#}"),
            }
            StateFile {
                version: VERSION,
                ..StateFile::default()
            }
        }
    }
}

/// Read-modify-write of the state file under its lock, so the foreground run
/// and a background worker never lose each other's rows.
pub fn update(paths: &Paths, f: impl FnOnce(&mut StateFile)) -> Result<()> {
    std::fs::create_dir_all(&paths.dir)
        .with_context(|| format!("creating {}", paths.dir.display()))?;
    let lock_path = paths.dir.join("state.lock");
    let lock =
        File::create(&lock_path).with_context(|| format!("opening {}", lock_path.display()))?;
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let mut file = read_for_restore(paths);
    f(&mut file);
    file.version = VERSION;
    let mut text = serde_json::to_string_pretty(&file)?;
    text.push('\n');
    write_atomic(&paths.state, text.as_bytes())
}

pub use crate::fsio::write_atomic;

/// Opens `path` to append, creating it (mode 0644), but never through a
/// symlink in its last component, never a FIFO or device (`O_NONBLOCK` makes
/// a FIFO without a reader fail instead of hanging) and never a file another
/// user owns: in /tmp, another local user could plant any of those to make
/// warmstart write into a file of theirs choosing or into one they can edit
/// later.
pub fn open_append_own(path: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::File::options()
        .create(true)
        .append(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => anyhow!("it is a symlink: give the real path"),
            _ => anyhow!(e),
        })?;
    let meta = f.metadata()?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if !meta.is_file() {
        bail!("it is not a regular file: give a path to a file");
    }
    if meta.uid() != me {
        bail!(
            "it is owned by uid {}, not this user: remove it or choose another path",
            meta.uid()
        );
    }
    Ok(f)
}

fn stamp_path(paths: &Paths, step: &str) -> PathBuf {
    paths.stamps.join(format!("{step}.json"))
}

/// The stamp of a step, or `None` when absent or unreadable (= not warm).
pub fn read_stamp<T: serde::de::DeserializeOwned>(paths: &Paths, step: &str) -> Option<T> {
    let text = std::fs::read(stamp_path(paths, step)).ok()?;
    serde_json::from_slice(&text).ok()
}

pub fn write_stamp<T: Serialize>(paths: &Paths, step: &str, stamp: &T) -> Result<()> {
    write_atomic(&stamp_path(paths, step), &serde_json::to_vec(stamp)?)
}

pub fn clear_stamp(paths: &Paths, step: &str) {
    let _ = std::fs::remove_file(stamp_path(paths, step));
}

/// An exclusive lock on one step, held while it runs (released on drop).
pub struct StepLock {
    _file: File,
}

/// Takes the step's lock; `Ok(None)` when `wait` is false and someone holds it.
pub fn lock_step(paths: &Paths, step: &str, wait: bool) -> Result<Option<StepLock>> {
    std::fs::create_dir_all(&paths.locks)
        .with_context(|| format!("creating {}", paths.locks.display()))?;
    let path = paths.locks.join(format!("{step}.lock"));
    let file = File::create(&path).with_context(|| format!("opening {}", path.display()))?;
    if wait {
        file.lock()
            .with_context(|| format!("locking {}", path.display()))?;
    } else {
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(e)) => {
                return Err(e).with_context(|| format!("locking {}", path.display()));
            }
        }
    }
    Ok(Some(StepLock { _file: file }))
}

/// Whether a process is alive (signal 0 probes without signalling).
pub fn pid_alive(pid: u32) -> bool {
    // SAFETY: kill with signal 0 sends nothing; it only checks the pid.
    unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_other_versions() {
        let mut f = StateFile {
            version: VERSION,
            ..Default::default()
        };
        let mut r = StepRecord::new(State::FailedOpen, "exit 3");
        r.last_cold_ms = Some(1200);
        f.steps.insert("deps".into(), r);
        let text = serde_json::to_string_pretty(&f).unwrap();
        assert!(text.contains("\"failed-open\""), "{text}");
        let back = parse(&text).unwrap();
        assert_eq!(back.steps["deps"].last_cold_ms, Some(1200));
        assert!(parse(&text.replace("\"version\": 1", "\"version\": 9")).is_err());
        assert!(parse("{\"version\": 1, \"steps\": ").is_err());
    }

    #[test]
    fn corrupt_state_is_set_aside_never_overwritten() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repo {
            root: tmp.path().into(),
            git_dir: tmp.path().join(".git"),
        };
        let paths = Paths::new(&repo);
        std::fs::create_dir_all(&paths.dir).unwrap();
        std::fs::write(&paths.state, "garbage").unwrap();
        let e = read(&paths).unwrap_err();
        assert_eq!(crate::exit::code_of(&e), Code::Corrupt);
        assert_eq!(std::fs::read_to_string(&paths.state).unwrap(), "garbage");
        update(&paths, |f| {
            f.steps
                .insert("x".into(), StepRecord::new(State::Done, "ok"));
        })
        .unwrap();
        assert_eq!(read(&paths).unwrap().steps["x"].what, "ok");
        let kept: Vec<_> = std::fs::read_dir(&paths.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("corrupt"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(
            std::fs::read_to_string(paths.dir.join(&kept[0])).unwrap(),
            "garbage"
        );
    }

    /// Steps of a parallel plan update the state file from several threads:
    /// the lock must exclude threads of one process, so no row is lost.
    #[test]
    fn updates_from_many_threads_lose_no_row() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repo {
            root: tmp.path().into(),
            git_dir: tmp.path().join(".git"),
        };
        let paths = Paths::new(&repo);
        std::thread::scope(|s| {
            for t in 0..8 {
                let paths = &paths;
                s.spawn(move || {
                    for i in 0..25 {
                        update(paths, |f| {
                            f.steps.insert(
                                format!("t{t}-{i}"),
                                StepRecord::new(State::Done, format!("{t} {i}")),
                            );
                        })
                        .unwrap();
                    }
                });
            }
        });
        let f = read(&paths).unwrap();
        assert_eq!(f.steps.len(), 8 * 25);
        assert_eq!(f.steps["t7-24"].what, "7 24");
        let stray: Vec<_> = std::fs::read_dir(&paths.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".tmp-"))
            .collect();
        assert!(stray.is_empty(), "{stray:?}");
    }

    #[test]
    fn stamps_are_optional_facts() {
        let tmp = tempfile::tempdir().unwrap();
        let repo = Repo {
            root: tmp.path().into(),
            git_dir: tmp.path().join(".git"),
        };
        let paths = Paths::new(&repo);
        assert_eq!(read_stamp::<u32>(&paths, "s"), None);
        write_stamp(&paths, "s", &7u32).unwrap();
        assert_eq!(read_stamp::<u32>(&paths, "s"), Some(7));
        std::fs::write(paths.stamps.join("s.json"), "nope").unwrap();
        assert_eq!(read_stamp::<u32>(&paths, "s"), None);
        clear_stamp(&paths, "s");
        assert!(!paths.stamps.join("s.json").exists());
    }
}
