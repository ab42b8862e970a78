//! The network's bounds: connect and stall deadlines for every child process
//! that talks to a remote, and the signal handler that ends those children
//! with warmstart. What git's error text means is `git::errors`.
//!
//! Settings: `--connect-timeout` / `--stall-timeout` (set once per command
//! with `set_flags`), else `WARMSTART_CONNECT_TIMEOUT` /
//! `WARMSTART_STALL_TIMEOUT`, else a manifest's `[network]` table, else 10 s
//! to connect and 30 s without progress. A value that does not parse is exit
//! 10 naming the setting, whichever layer it is in.
//!
//! The watchdog (`Watch`) is the guarantee: git's own `http.lowSpeedTime`
//! and ssh's `ConnectTimeout` are passed too (`CacheGit` does), but neither
//! bounds a proxy or a server that accepts a connection and says nothing.
//! A child runs as the leader of its own process group; the watchdog counts
//! the bytes it produces (its pipes, and the pack file git writes while it
//! receives) and ends the whole group (SIGTERM, then SIGKILL) when nothing
//! arrived within the connect deadline, or nothing moved for the stall
//! timeout once something had.
//!
//! This module never decides what a command means; it only bounds it and
//! names why it was stopped.

use anyhow::Result;
use serde::Deserialize;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::clock::DurationSpec;
use crate::exit::{Code, fail};

/// Default time to get the first byte from a remote.
pub const DEFAULT_CONNECT: Duration = Duration::from_secs(10);
/// Default time a transfer may go without a byte once it started.
pub const DEFAULT_STALL: Duration = Duration::from_secs(30);
pub const CONNECT_ENV: &str = "WARMSTART_CONNECT_TIMEOUT";
pub const STALL_ENV: &str = "WARMSTART_STALL_TIMEOUT";

/// The two deadlines of every network operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkSettings {
    /// From the start until the remote's first byte.
    pub connect: Duration,
    /// The longest time without progress once the remote answered.
    pub stall: Duration,
}

impl Default for NetworkSettings {
    fn default() -> NetworkSettings {
        NetworkSettings {
            connect: DEFAULT_CONNECT,
            stall: DEFAULT_STALL,
        }
    }
}

/// The `[network]` table of a manifest, as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetwork {
    connect_timeout: Option<DurationSpec>,
    stall_timeout: Option<DurationSpec>,
}

/// A manifest's `[network]` table, checked: what it sets, if anything.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManifestNetwork {
    pub connect: Option<Duration>,
    pub stall: Option<Duration>,
}

impl RawNetwork {
    /// The checked table; an error names the field (the caller adds the file).
    pub fn resolve(&self) -> Result<ManifestNetwork> {
        let one = |spec: &Option<DurationSpec>, field: &str| -> Result<Option<Duration>> {
            spec.as_ref()
                .map(|s| match s {
                    DurationSpec::Seconds(n) => positive(&n.to_string(), field),
                    DurationSpec::Text(t) => positive(t, field),
                })
                .transpose()
        };
        Ok(ManifestNetwork {
            connect: one(&self.connect_timeout, "[network] connect_timeout")?,
            stall: one(&self.stall_timeout, "[network] stall_timeout")?,
        })
    }
}

/// The flags as typed (`--connect-timeout`, `--stall-timeout`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkFlags {
    pub connect: Option<String>,
    pub stall: Option<String>,
}

static FLAGS: Mutex<Option<NetworkFlags>> = Mutex::new(None);

/// Records this command's flags for every later `settings` call, after
/// checking them and the environment (exit 10 naming the flag or the
/// variable), so that a bad value fails even a run that turns out warm.
pub fn set_flags(flags: NetworkFlags) -> Result<()> {
    resolve(
        &flags,
        &|k| std::env::var(k).ok(),
        &ManifestNetwork::default(),
    )?;
    *FLAGS.lock().unwrap_or_else(|p| p.into_inner()) = Some(flags);
    Ok(())
}

/// This command's flags as the environment of a process that continues its
/// work (the background restore worker): there they still beat manifests.
pub fn flags_as_env() -> Vec<(&'static str, String)> {
    let flags = FLAGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    [(CONNECT_ENV, flags.connect), (STALL_ENV, flags.stall)]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect()
}

/// The settings for an operation under `manifest`'s `[network]` table:
/// this command's flags, then the environment, then the table.
pub fn settings(manifest: &ManifestNetwork) -> Result<NetworkSettings> {
    let flags = FLAGS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .unwrap_or_default();
    resolve(&flags, &|k| std::env::var(k).ok(), manifest)
}

/// flag > env > manifest > default, each layer that is set checked.
pub fn resolve(
    flags: &NetworkFlags,
    env: &dyn Fn(&str) -> Option<String>,
    manifest: &ManifestNetwork,
) -> Result<NetworkSettings> {
    let pick = |flag: &Option<String>,
                flag_name: &str,
                var: &str,
                from_manifest: Option<Duration>,
                default: Duration|
     -> Result<Duration> {
        let flag = flag
            .as_deref()
            .map(|v| positive(v, flag_name))
            .transpose()?;
        let env = env(var).map(|v| positive(&v, var)).transpose()?;
        Ok(flag.or(env).or(from_manifest).unwrap_or(default))
    };
    Ok(NetworkSettings {
        connect: pick(
            &flags.connect,
            "--connect-timeout",
            CONNECT_ENV,
            manifest.connect,
            DEFAULT_CONNECT,
        )?,
        stall: pick(
            &flags.stall,
            "--stall-timeout",
            STALL_ENV,
            manifest.stall,
            DEFAULT_STALL,
        )?,
    })
}

fn positive(value: &str, setting: &str) -> Result<Duration> {
    match crate::clock::parse_duration(value) {
        Ok(d) if !d.is_zero() => Ok(d),
        _ => Err(fail(
            Code::Config,
            format!(
                "{setting} = {value:?} is not a duration: give more than zero as a number with ms, s, m or h (e.g. 500ms, 10s, 2m), or a bare number of seconds"
            ),
        )),
    }
}

/// `10s`, `1.5s`, `500ms`, as the settings are written.
pub fn show(d: Duration) -> String {
    if d.as_millis().is_multiple_of(1000) {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

fn show_bytes(n: u64) -> String {
    if n < 10 << 10 {
        format!("{n} bytes")
    } else if n < 10 << 20 {
        format!("{:.1} KiB", n as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
    }
}

// ---------------------------------------------------------------------------
// The watchdog.

/// Why a watched child was stopped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing arrived within the connect deadline.
    Connect(Duration),
    /// Something had arrived, then nothing for the stall timeout.
    Stall {
        after: Duration,
        bytes: u64,
        /// git's last progress line, when it printed one.
        last: Option<String>,
    },
    /// Past an overall limit (`Watch::total`).
    Total(Duration),
    /// warmstart was told to stop (the gate runner's handler noted it).
    Interrupted(i32),
}

impl Verdict {
    /// The one line for this stop: `what` is the transfer (`fetch of x`),
    /// `remote` where it talks to. Exit 8.
    pub fn error(&self, what: &str, remote: &str) -> anyhow::Error {
        let message = match self {
            Verdict::Connect(d) => format!(
                "timed out connecting to {remote} after {} ({what}; set [network] connect_timeout or {CONNECT_ENV})",
                show(*d)
            ),
            Verdict::Stall { after, bytes, last } => {
                let arrived = match bytes {
                    0 => "nothing had arrived".to_string(),
                    n => format!("{} had arrived", show_bytes(*n)),
                };
                let got = match last {
                    Some(l) => format!("{arrived}; git's last progress: {l}"),
                    None => arrived,
                };
                format!(
                    "{what} stalled: nothing moved for {} on the connection to {remote} ({got}); stopped (set [network] stall_timeout or {STALL_ENV})",
                    show(*after)
                )
            }
            Verdict::Total(d) => format!(
                "{what} with {remote} took longer than {} and was stopped",
                show(*d)
            ),
            Verdict::Interrupted(sig) => format!(
                "{what} with {remote} was stopped: warmstart received {}",
                crate::process::signals::signal_name(*sig)
            ),
        };
        fail(Code::Remote, message)
    }
}

/// Counts what a child produces; cheap to clone into reader threads.
#[derive(Clone, Debug, Default)]
pub struct Progress(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    /// Payload bytes (a pack on stdout, the direct reader's stream).
    data: AtomicU64,
    /// Other output (git's progress and messages on stderr).
    chatter: AtomicU64,
    last: Mutex<Option<String>>,
}

impl Progress {
    pub fn data(&self, n: usize) {
        self.0.data.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub fn chatter(&self, bytes: &[u8]) {
        self.0
            .chatter
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        let text = String::from_utf8_lossy(bytes);
        if let Some(line) = text
            .split(['\r', '\n'])
            .map(str::trim)
            .rfind(|l| is_progress(l))
        {
            *self.0.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(line.to_string());
        }
    }
}

/// A reader that counts what passes through it as payload.
pub struct Counted<R> {
    pub inner: R,
    pub progress: Progress,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.data(n);
        Ok(n)
    }
}

/// Where else progress shows: files a child grows (git's `tmp_pack_*`
/// while `index-pack` receives), summed.
#[derive(Clone, Debug)]
pub struct PackDir(pub PathBuf);

impl PackDir {
    fn bytes(&self) -> u64 {
        self.scan().0
    }

    /// The summed size of the partial files, and their paths.
    fn scan(&self) -> (u64, Vec<PathBuf>) {
        let Ok(rd) = std::fs::read_dir(&self.0) else {
            return (0, Vec::new());
        };
        let mut total = 0;
        let mut paths = Vec::new();
        for e in rd.flatten() {
            if e.file_name().to_string_lossy().starts_with("tmp_") {
                total += e.metadata().map(|m| m.len()).unwrap_or(0);
                paths.push(e.path());
            }
        }
        (total, paths)
    }
}

struct WatchShared {
    done: Mutex<bool>,
    wake: Condvar,
    verdict: Mutex<Option<Verdict>>,
}

/// A watchdog on one process group (see the module doc).
pub struct Watch {
    shared: Arc<WatchShared>,
    progress: Progress,
    thread: Option<std::thread::JoinHandle<()>>,
    _group: crate::process::signals::GroupGuard,
}

/// How often the watchdog looks.
const TICK: Duration = Duration::from_millis(100);
/// Between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_millis(1000);

impl Watch {
    /// Starts watching the group `pgid` leads, under `net`, with an
    /// optional overall limit and a pack directory whose growth counts.
    pub fn start(
        pgid: u32,
        net: NetworkSettings,
        total: Option<Duration>,
        pack_dir: Option<PackDir>,
    ) -> Watch {
        let shared = Arc::new(WatchShared {
            done: Mutex::new(false),
            wake: Condvar::new(),
            verdict: Mutex::new(None),
        });
        let progress = Progress::default();
        let group = crate::process::signals::register_group(pgid);
        let thread = {
            let shared = shared.clone();
            let progress = progress.clone();
            std::thread::spawn(move || watch(pgid, net, total, pack_dir, &shared, &progress))
        };
        Watch {
            shared,
            progress,
            thread: Some(thread),
            _group: group,
        }
    }

    /// The counters the child's readers feed.
    pub fn progress(&self) -> Progress {
        self.progress.clone()
    }

    /// Stops watching (call once the child was reaped); why it was
    /// stopped, if it was.
    pub fn finish(mut self) -> Option<Verdict> {
        self.stop();
        self.shared
            .verdict
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    fn stop(&mut self) {
        *self.shared.done.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

fn watch(
    pgid: u32,
    net: NetworkSettings,
    total: Option<Duration>,
    pack_dir: Option<PackDir>,
    shared: &WatchShared,
    progress: &Progress,
) {
    let start = Instant::now();
    let base = pack_dir.as_ref().map_or(0, PackDir::bytes);
    // The partial packs of this group, registered so that a signal removes
    // them too: a killed index-pack leaves its tmp_pack_* behind.
    // A name is looked up once: index-pack holds its file open from the
    // moment it exists, and another process's stays another's.
    let mut partial: Vec<crate::process::signals::TempGuard> = Vec::new();
    let mut checked: std::collections::HashSet<PathBuf> = Default::default();
    // The quarantines a local push's `git receive-pack` works in: removed
    // by a signal, and when the watch ends, if git left them (it does when
    // it is stopped or refused; a push that lands removes its own).
    let mut quarantines = Quarantines::default();
    let mut sample = || {
        quarantines.note(pgid);
        let (pack, names) = pack_dir.as_ref().map(PackDir::scan).unwrap_or_default();
        let new: Vec<PathBuf> = names.into_iter().filter(|n| !checked.contains(n)).collect();
        if !new.is_empty() {
            // By name: /proc shows the resolved path, ours may hold a symlink.
            let ours: Vec<_> = crate::process::group::group_temp_files(pgid as i32)
                .into_iter()
                .filter_map(|f| f.file_name().map(|n| n.to_owned()))
                .collect();
            partial.extend(
                new.iter()
                    .filter(|n| n.file_name().is_some_and(|f| ours.iter().any(|o| o == f)))
                    .map(|n| crate::process::signals::register_temp(n)),
            );
            checked.extend(new);
        }
        (
            progress.0.data.load(Ordering::Relaxed),
            progress.0.chatter.load(Ordering::Relaxed),
            pack,
        )
    };
    let mut seen = (0, 0, base);
    let mut pack_max = 0u64;
    let mut moved_at: Option<Instant> = None;
    let mut done = shared.done.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        done = shared
            .wake
            .wait_timeout(done, TICK)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        if *done {
            return;
        }
        let now = sample();
        if now != seen {
            seen = now;
            moved_at = Some(Instant::now());
            pack_max = pack_max.max(now.2.saturating_sub(base));
        }
        let verdict = if let Some(sig) = crate::process::signals::interrupted() {
            Some(Verdict::Interrupted(sig))
        } else if total.is_some_and(|t| start.elapsed() >= t) {
            total.map(Verdict::Total)
        } else {
            match moved_at {
                None if start.elapsed() >= net.connect => Some(Verdict::Connect(net.connect)),
                Some(t) if t.elapsed() >= net.stall => Some(Verdict::Stall {
                    after: net.stall,
                    bytes: seen.0 + pack_max,
                    last: progress
                        .0
                        .last
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .clone(),
                }),
                _ => None,
            }
        };
        if let Some(v) = verdict {
            *shared.verdict.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
            drop(done);
            crate::process::group::end_group(pgid, GRACE);
            return;
        }
    }
}

/// The quarantines of a watched group (`process::group::group_quarantines`),
/// each registered with the signal handler, and removed when dropped if
/// still there (the group is gone by then: its leader was reaped or
/// `end_group` ended it).
#[derive(Default)]
struct Quarantines(Vec<(PathBuf, crate::process::signals::TempGuard)>);

impl Quarantines {
    fn note(&mut self, pgid: u32) {
        for q in crate::process::group::group_quarantines(pgid as i32) {
            if !self.0.iter().any(|(p, _)| *p == q) {
                let guard = crate::process::signals::register_temp_dir(&q);
                self.0.push((q, guard));
            }
        }
    }
}

impl Drop for Quarantines {
    fn drop(&mut self) {
        for (q, _) in &self.0 {
            let _ = std::fs::remove_dir_all(q);
        }
    }
}

/// What a watched command left.
#[derive(Debug)]
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Why the watchdog stopped it, if it did.
    pub stopped: Option<Verdict>,
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) as the leader of
/// a new process group under a watchdog. `stderr_seen` gets stderr as it
/// comes (git's progress); `pid` the group while it runs, `None` after.
///
/// Processes of the group that outlive the leader (an ssh control master,
/// a helper that forked) are ended with it, and their pipes are waited on
/// for `DRAIN_WAIT` at most: a process that left the group could hold
/// them forever, and the command is over.
pub fn run(
    cmd: &mut Command,
    net: NetworkSettings,
    total: Option<Duration>,
    pack_dir: Option<PackDir>,
    stderr_seen: &mut dyn FnMut(&[u8]),
    pid: &mut dyn FnMut(Option<u32>),
) -> std::io::Result<Ran> {
    use std::os::unix::process::CommandExt;
    use std::sync::mpsc;
    // The command leads a group of its own (so that the watchdog ends its
    // helpers with it), which a kill of warmstart's group does not reach:
    // it dies with warmstart instead.
    crate::process::group::die_with_parent(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()?;
    let watch = Watch::start(child.id(), net, total, pack_dir);
    pid(Some(child.id()));
    let progress = watch.progress();
    // Both pipes are read by threads that hand what they read to this
    // one, which also polls the leader: `stderr_seen` needs no `Send`.
    let (tx, rx) = mpsc::channel::<(bool, Vec<u8>)>();
    let pipe = |mut r: Box<dyn Read + Send>, is_err: bool, tx: mpsc::Sender<(bool, Vec<u8>)>| {
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 8192];
            while let Ok(n) = r.read(&mut buf) {
                if n == 0 || tx.send((is_err, buf[..n].to_vec())).is_err() {
                    break;
                }
            }
        })
    };
    pipe(
        Box::new(child.stdout.take().expect("piped")),
        false,
        tx.clone(),
    );
    pipe(Box::new(child.stderr.take().expect("piped")), true, tx);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut take = |(is_err, bytes): (bool, Vec<u8>)| {
        if is_err {
            progress.chatter(&bytes);
            stderr_seen(&bytes);
            err.extend_from_slice(&bytes);
            // Progress lines repeat; keep the tail bounded.
            if err.len() > 1 << 20 {
                err.drain(..err.len() - (256 << 10));
            }
        } else {
            progress.data(bytes.len());
            out.extend_from_slice(&bytes);
        }
    };
    let mut nap = Duration::from_millis(1);
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) => {}
            Err(e) => break Err(e),
        }
        match rx.recv_timeout(nap) {
            Ok(msg) => take(msg),
            Err(e) => {
                if e == mpsc::RecvTimeoutError::Disconnected {
                    // Both pipes closed before the leader exited.
                    std::thread::sleep(nap);
                }
                nap = (nap * 2).min(Duration::from_millis(20));
            }
        }
    };
    // The leader is gone: so are the rest of its group.
    // SAFETY: kill(2) on the group our child led; no memory involved.
    unsafe {
        libc::kill(-(child.id() as libc::pid_t), libc::SIGTERM);
    }
    let until = Instant::now() + DRAIN_WAIT;
    loop {
        let left = until.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(msg) => take(msg),
            Err(_) => break,
        }
    }
    pid(None);
    let stopped = watch.finish();
    Ok(Ran {
        status: status?,
        stdout: out,
        stderr: err,
        stopped,
    })
}

/// Whether a line is git's (or the server's) progress, not a message.
pub fn is_progress(line: &str) -> bool {
    let l = line.trim_start_matches("remote: ");
    l.contains("objects:") || l.contains("deltas:") || l.starts_with("Delta compression")
}

/// How long a command's pipes may stay open after its group was ended.
const DRAIN_WAIT: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests;
