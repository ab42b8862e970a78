//! `service`: a long-running process (a language server, a daemon) that
//! restore keeps running, and the signal `restore stop` (`restore/stop.rs`) ends it with.
//!
//! "Running" is decided without a race and without trusting a bare pid. The
//! pidfile records the pid, the process's start time (field 22 of
//! `/proc/<pid>/stat`) and the boot id; the process is ours only while that
//! pid is alive and not exiting (state `Z` or `X` is not alive), has the same
//! start time in the same boot, and still leads the session it was started
//! in (it was started with `setsid`). A `kill -0` probe says "alive" for a
//! zombie and for any program that got the pid since; this never does.
//!
//! The warm probe reads the pidfile, `/proc/<pid>/stat` and the boot id, and
//! stats the command's executable and the `watch` paths: it never spawns a
//! process and never connects anywhere, so the whole plan stays within the
//! warm budget of `tools/bench-restore.sh`. Readiness is checked only when
//! the service is started.
//!
//! This module never signals a process the pidfile does not prove to be the
//! service: a pidfile that does not parse, names pid 0, 1 or this process,
//! is not owned by this user or is writable by others, or names a process
//! whose identity differs, means "not running", and only the file is
//! removed.

use crate::cache::format::manifest::expand_path;
use crate::clock::DurationSpec;
use crate::repo::Repo;
use crate::restore::fields::{dur, timeout};
use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::common::{Ctx, Outcome, Probe};
use crate::restore::proc::{self, Log};
use crate::restore::steps::command::Cmdline;

/// A long-running process kept alive by restore (`steps/service.rs`).
#[derive(Debug)]
pub struct Service {
    /// Stays in the foreground: it is the process the pidfile names.
    pub run: Cmdline,
    pub pidfile: PathBuf,
    /// Its stdout and stderr (appended).
    pub log: PathBuf,
    pub ready: Option<Ready>,
    /// How long a start may take to become ready.
    pub ready_timeout: Duration,
    /// A change to one of these (device, inode, size, mtime) restarts it.
    pub watch: Vec<PathBuf>,
    pub cwd: PathBuf,
    /// `restore stop`: SIGTERM, then SIGKILL after this long.
    pub kill_grace: Duration,
}

/// When a started service counts as ready.
#[derive(Debug)]
pub enum Ready {
    /// Something accepts TCP connections on 127.0.0.1:port.
    Port(u16),
    /// The command exits 0.
    Cmd(Cmdline),
}

impl Service {
    pub fn describe(&self) -> Value {
        json!({
            "run": self.run.display(), "pidfile": self.pidfile, "log": self.log,
            "ready_port": match &self.ready { Some(Ready::Port(p)) => json!(p), _ => Value::Null },
            "ready_cmd": match &self.ready { Some(Ready::Cmd(c)) => json!(c.display()), _ => Value::Null },
            "ready_timeout_ms": self.ready_timeout.as_millis() as u64,
            "watch": self.watch, "cwd": self.cwd,
            "kill_grace_ms": self.kill_grace.as_millis() as u64,
        })
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawService {
    run: Cmdline,
    pidfile: Option<String>,
    log: Option<String>,
    /// Taken as any value, so that a wrong type is refused naming the field.
    ready_port: Option<toml::Value>,
    ready_cmd: Option<Cmdline>,
    ready_timeout: Option<DurationSpec>,
    #[serde(default)]
    watch: Vec<String>,
    cwd: Option<String>,
    kill_grace: Option<DurationSpec>,
}

pub fn resolve_service(repo: &Repo, name: &str, r: RawService) -> Result<Service> {
    r.run.check("run")?;
    let ready = match (r.ready_port, r.ready_cmd) {
        (Some(_), Some(_)) => {
            bail!("`ready_port` and `ready_cmd` are two probes: keep one")
        }
        (Some(p), None) => match p.as_integer().map(u16::try_from) {
            Some(Ok(n)) if n > 0 => Some(Ready::Port(n)),
            _ => bail!(
                "`ready_port` = {} is not a TCP port (a number from 1 to 65535)",
                p.as_integer()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| format!("a {}", p.type_str()))
            ),
        },
        (None, Some(c)) => {
            c.check("ready_cmd")?;
            Some(Ready::Cmd(c))
        }
        (None, None) => None,
    };
    let state = repo.state_dir();
    let path_or = |raw: Option<String>, default: PathBuf| match raw {
        Some(p) if p.is_empty() => bail!("a path of the service is empty"),
        Some(p) => expand_path(repo, &p),
        None => Ok(default),
    };
    let pidfile = path_or(
        r.pidfile,
        state.join("restore/services").join(format!("{name}.pid")),
    )?;
    let log = path_or(
        r.log,
        state.join("logs").join(format!("{name}.service.log")),
    )?;
    if pidfile == log {
        bail!("`pidfile` and `log` are the same file: give each its own path");
    }
    let watch = r
        .watch
        .iter()
        .map(|w| {
            if w.is_empty() {
                bail!("`watch` holds an empty path");
            }
            expand_path(repo, w)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Service {
        run: r.run,
        pidfile,
        log,
        ready,
        ready_timeout: timeout(&r.ready_timeout, "ready_timeout", Duration::from_secs(10))?,
        watch,
        cwd: match r.cwd {
            Some(c) => expand_path(repo, &c)?,
            None => repo.root.clone(),
        },
        kill_grace: dur(&r.kill_grace, "kill_grace", Duration::from_secs(5))?,
    })
}

/// The format of the pidfile's second line (the first is the bare pid).
const FORMAT: u32 = 1;
/// A pidfile longer than this is not one warmstart wrote.
const MAX_PIDFILE: u64 = 64 * 1024;
/// Without a readiness probe, a start counts once the process lived this long.
const SETTLE: Duration = Duration::from_millis(200);
/// After SIGKILL, how long the group may take to be gone.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// What identifies a file's content without reading it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileId {
    fn of(path: &Path) -> Option<FileId> {
        let m = std::fs::metadata(path).ok()?;
        Some(FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        })
    }
}

/// A path and what it was when the service started (`None`: missing).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watched {
    pub path: PathBuf,
    pub id: Option<FileId>,
}

/// The pidfile's second line: who the service is and what it runs.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub step: String,
    pub pid: u32,
    /// Field 22 of `/proc/<pid>/stat`: clock ticks after boot.
    pub start_time: u64,
    pub boot_id: String,
    pub started_at_ms: u64,
    /// Written false before the readiness wait and true after it.
    pub ready: bool,
    /// The program and arguments as spawned (`sh -c ...` for a string).
    pub command: Vec<String>,
    pub cwd: PathBuf,
    /// The resolved executable of the command (canonical path).
    pub exe: Option<Watched>,
    pub watch: Vec<Watched>,
}

/// The fields of `/proc/<pid>/stat` that say who a process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcStat {
    pub state: char,
    pub pgrp: i64,
    pub session: i64,
    pub start_time: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses
/// and may itself hold spaces and `)`, so the fields are counted from the
/// last `)`: state is field 3, pgrp 5, session 6, starttime 22.
pub fn parse_stat(text: &str) -> Option<ProcStat> {
    let close = text.rfind(')')?;
    text[..close].find('(')?;
    let rest: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let field = |n: usize| rest.get(n - 3).copied();
    let mut state = field(3)?.chars();
    let (Some(s), None) = (state.next(), state.next()) else {
        return None;
    };
    Some(ProcStat {
        state: s,
        pgrp: field(5)?.parse().ok()?,
        session: field(6)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
    })
}

fn proc_stat(pid: u32) -> Option<ProcStat> {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// The verdict on a pidfile.
#[derive(Debug)]
pub enum Liveness {
    Running(Box<Record>),
    /// Not running, and why (for the table and `restore stop`).
    NotRunning(String),
    /// No pidfile at all.
    Absent,
}

/// Reads a pidfile's text into a record; `Err` says why it is not one.
pub fn parse_pidfile(text: &str) -> std::result::Result<Record, String> {
    let (first, second) = text.split_once('\n').ok_or("one line only")?;
    if first.is_empty() || first.len() > 10 || !first.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("first line {:?} is not a pid", cut(first)));
    }
    let pid: u32 = first.parse().map_err(|_| "the pid is out of range")?;
    let rec: Record = serde_json::from_str(second.trim_end_matches('\n'))
        .map_err(|e| format!("second line: {e}"))?;
    if rec.format != FORMAT {
        return Err(format!(
            "format {} (this build writes {FORMAT})",
            rec.format
        ));
    }
    if rec.pid != pid {
        return Err(format!("the lines disagree ({pid} and {})", rec.pid));
    }
    if pid <= 1 || pid > i32::MAX as u32 {
        return Err(format!("pid {pid} can never be a service"));
    }
    Ok(rec)
}

fn cut(s: &str) -> String {
    s.chars().take(24).collect()
}

/// Whether the pidfile names a live process that is the service `step` started.
pub fn liveness(pidfile: &Path, step: &str) -> Liveness {
    let not = |why: String| Liveness::NotRunning(why);
    let mut file = match std::fs::File::open(pidfile) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Liveness::Absent,
        Err(e) => return not(format!("{} is unreadable ({e})", pidfile.display())),
    };
    let Ok(meta) = file.metadata() else {
        return not(format!("{} is unreadable", pidfile.display()));
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me || meta.mode() & 0o022 != 0 || !meta.is_file() {
        return not(format!(
            "{} is not a pidfile this user wrote (owner uid {}, mode {:o}): ignored",
            pidfile.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    if (&mut file)
        .take(MAX_PIDFILE + 1)
        .read_to_string(&mut text)
        .is_err()
        || text.len() as u64 > MAX_PIDFILE
    {
        return not(format!("{} is not a warmstart pidfile", pidfile.display()));
    }
    let rec = match parse_pidfile(&text) {
        Ok(r) => r,
        Err(why) => {
            return not(format!(
                "{} is not a warmstart pidfile ({why})",
                pidfile.display()
            ));
        }
    };
    match identify(&rec, step) {
        Ok(()) => Liveness::Running(Box::new(rec)),
        Err(why) => not(why),
    }
}

/// Checks that the record's pid is, right now, the process it recorded.
fn identify(rec: &Record, step: &str) -> std::result::Result<(), String> {
    let pid = rec.pid;
    if rec.step != step {
        return Err(format!("the pidfile belongs to step {:?}", rec.step));
    }
    if pid == std::process::id() {
        return Err(format!("pid {pid} is this restore itself"));
    }
    if rec.boot_id != boot_id() {
        return Err(format!("pid {pid} was recorded before the last reboot"));
    }
    let Some(st) = proc_stat(pid) else {
        return Err(format!("pid {pid} is gone"));
    };
    if matches!(st.state, 'Z' | 'X' | 'x') {
        return Err(format!("pid {pid} is exiting (state {})", st.state));
    }
    if st.start_time != rec.start_time {
        return Err(format!(
            "pid {pid} is another program now (its start time differs)"
        ));
    }
    if st.pgrp != pid as i64 || st.session != pid as i64 {
        return Err(format!(
            "pid {pid} no longer leads the session it was started in"
        ));
    }
    Ok(())
}

/// The program a command line runs: argv[0], or for a shell string its
/// first word after `exec` and `NAME=value` assignments when that word is
/// plain; else the shell itself.
fn program_of(run: &Cmdline) -> String {
    match run {
        Cmdline::Argv(v) => v[0].clone(),
        Cmdline::Shell(s) => {
            let is_assignment = |w: &str| {
                w.split_once('=').is_some_and(|(n, _)| {
                    !n.is_empty()
                        && !n.starts_with(|c: char| c.is_ascii_digit())
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
            };
            let plain = |w: &str| {
                w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._/+-@:,%".contains(c))
            };
            s.split_ascii_whitespace()
                .find(|w| *w != "exec" && !is_assignment(w))
                .filter(|w| plain(w))
                .unwrap_or("sh")
                .to_string()
        }
    }
}

/// The executable `program` names, as exec would find it (a path is taken
/// relative to `cwd`; a bare name is looked up in PATH), canonicalized so
/// that a symlink moved to a new version counts as a change.
fn resolve(program: &str, cwd: &Path) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let found = if program.contains('/') {
        Some(cwd.join(program))
    } else {
        let path = std::env::var_os("PATH")?;
        path.as_bytes().split(|&b| b == b':').find_map(|dir| {
            let dir = if dir.is_empty() {
                cwd.to_path_buf()
            } else {
                cwd.join(std::ffi::OsStr::from_bytes(dir))
            };
            let candidate = dir.join(program);
            let m = std::fs::metadata(&candidate).ok()?;
            (m.is_file() && m.permissions().mode() & 0o111 != 0).then_some(candidate)
        })
    }?;
    std::fs::canonicalize(found).ok()
}

fn exe_of(s: &Service) -> Option<Watched> {
    let path = resolve(&program_of(&s.run), &s.cwd)?;
    Some(Watched {
        id: FileId::of(&path),
        path,
    })
}

fn watched(s: &Service) -> Vec<Watched> {
    s.watch
        .iter()
        .map(|p| Watched {
            path: p.clone(),
            id: FileId::of(p),
        })
        .collect()
}

fn command_of(s: &Service) -> Vec<String> {
    let (program, args) = s.run.program_and_args();
    std::iter::once(program).chain(args).collect()
}

/// Why a running service must restart: what it runs is no longer what it
/// started with. `None`: unchanged.
fn changed(s: &Service, rec: &Record) -> Option<String> {
    if rec.command != command_of(s) || rec.cwd != s.cwd {
        return Some("its command line changed".into());
    }
    let exe = exe_of(s);
    if exe != rec.exe {
        let path = exe.as_ref().or(rec.exe.as_ref()).map(|w| w.path.display());
        return Some(match path {
            Some(p) => format!("its executable {p} changed"),
            None => "its executable changed".into(),
        });
    }
    let now = watched(s);
    if now.len() != rec.watch.len() {
        return Some("its watch list changed".into());
    }
    now.iter()
        .zip(&rec.watch)
        .find(|(a, b)| a != b)
        .map(|(a, _)| format!("{} changed", a.path.display()))
}

fn uptime(rec: &Record) -> String {
    let ms = crate::clock::now_ms().saturating_sub(rec.started_at_ms);
    crate::clock::human(Duration::from_millis(ms))
}

fn ready_text(s: &Service) -> String {
    match &s.ready {
        Some(Ready::Port(p)) => format!(", ready on 127.0.0.1:{p}"),
        Some(Ready::Cmd(_)) => ", ready".into(),
        None => String::new(),
    }
}

pub fn probe(_ctx: &Ctx, name: &str, s: &Service) -> Probe {
    match liveness(&s.pidfile, name) {
        Liveness::Absent => Probe::Needed("not running (no pidfile)".into()),
        Liveness::NotRunning(why) => Probe::Needed(format!("not running: {why}")),
        Liveness::Running(rec) if !rec.ready => Probe::Needed(format!(
            "pid {} was started but never confirmed ready",
            rec.pid
        )),
        Liveness::Running(rec) => match changed(s, &rec) {
            Some(what) => Probe::Needed(format!("pid {} must restart: {what}", rec.pid)),
            None => Probe::warm(format!(
                "pid {}, up {}{}",
                rec.pid,
                uptime(&rec),
                ready_text(s)
            )),
        },
    }
}

pub fn run(_ctx: &Ctx, name: &str, s: &Service, log: &mut Log) -> Result<Outcome> {
    let mut restarted = None;
    if let Liveness::Running(rec) = liveness(&s.pidfile, name) {
        log.line(&format!("stopping pid {} before the restart", rec.pid));
        let how = stop_group(rec.pid, s.kill_grace)
            .with_context(|| format!("stopping pid {} of service {name}", rec.pid))?;
        log.line(&format!("pid {} ended ({how})", rec.pid));
        restarted = Some(rec.pid);
    }
    if let Some(Ready::Port(p)) = &s.ready
        && port_accepts(*p, Duration::from_millis(200))
    {
        return Ok(Outcome::failed(format!(
            "127.0.0.1:{p} already accepts connections, from a process this service did not start: stop that process or change `ready_port`"
        )));
    }
    let started = Instant::now();
    let (mut child, mut rec) = match spawn(name, s, log) {
        Ok(x) => x,
        Err(e) => return Ok(Outcome::failed(format!("{e:#}"))),
    };
    if let Err(why) = wait_ready(s, &mut child) {
        log.line(&format!("not ready: {why}; stopping pid {}", rec.pid));
        // It was never ready: stop what was started, so nothing half-up stays.
        let _ = stop_group(rec.pid, s.kill_grace);
        let _ = child.wait();
        let _ = std::fs::remove_file(&s.pidfile);
        return Ok(Outcome::failed(format!(
            "service {name} {why} (its output: {})",
            s.log.display()
        )));
    }
    rec.ready = true;
    write_pidfile(&s.pidfile, &rec)?;
    let took = crate::clock::human(started.elapsed());
    log.line(&format!("pid {} ready after {took}", rec.pid));
    Ok(Outcome::done(match restarted {
        Some(old) => format!(
            "restarted: pid {old} -> {}{}, in {took}",
            rec.pid,
            ready_text(s)
        ),
        None => format!("started pid {}{}, in {took}", rec.pid, ready_text(s)),
    }))
}

/// Starts the service detached (its own session and process group, stdin
/// closed, output appended to its log) and writes its pidfile (not ready yet).
fn spawn(name: &str, s: &Service, log: &mut Log) -> Result<(Child, Record)> {
    for (field, p) in [("log", &s.log), ("pidfile", &s.pidfile)] {
        if let Some(dir) = p.parent() {
            std::fs::create_dir_all(dir).with_context(|| {
                format!(
                    "creating {}, the directory of `{field}`: choose a writable path",
                    dir.display()
                )
            })?;
        }
    }
    let mut out = crate::restore::state::open_append_own(&s.log)
        .with_context(|| format!("opening the service log {}", s.log.display()))?;
    let _ = writeln!(
        out,
        "[{}] warmstart: starting service {name}: {}",
        crate::clock::rfc3339(crate::clock::now_ms()),
        crate::redact::text(&s.run.display())
    );
    // Taken before the spawn: a change during the start restarts it next run.
    let exe = exe_of(s);
    let watch = watched(s);
    let (program, args) = s.run.program_and_args();
    let mut cmd = Command::new(&program);
    cmd.args(&args)
        .current_dir(&s.cwd)
        .stdin(Stdio::null())
        .stdout(out.try_clone().context("duplicating the service log")?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe and touches no memory of this process.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    log.line(&format!("$ {}", proc::show(&cmd)));
    let child = cmd
        .spawn()
        .with_context(|| format!("cannot start `{}` in {}", s.run.display(), s.cwd.display()))?;
    let pid = child.id();
    // Our own unreaped child: its stat exists even if it already exited.
    let start_time = proc_stat(pid)
        .map(|st| st.start_time)
        .with_context(|| format!("reading /proc/{pid}/stat of the service just started"))?;
    let rec = Record {
        format: FORMAT,
        step: name.to_string(),
        pid,
        start_time,
        boot_id: boot_id(),
        started_at_ms: crate::clock::now_ms(),
        ready: false,
        command: command_of(s),
        cwd: s.cwd.clone(),
        exe,
        watch,
    };
    write_pidfile(&s.pidfile, &rec)?;
    log.line(&format!(
        "started pid {pid}; pidfile {}",
        s.pidfile.display()
    ));
    Ok((child, rec))
}

/// Waits until the readiness probe passes; `Err` is the one-line reason.
fn wait_ready(s: &Service, child: &mut Child) -> std::result::Result<(), String> {
    let start = Instant::now();
    let mut nap = Duration::from_millis(10);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(format!(
                "exited before it was ready ({})",
                proc::Exit::Status(status).describe()
            ));
        }
        let left = s.ready_timeout.saturating_sub(start.elapsed());
        let ready = match &s.ready {
            None => start.elapsed() >= SETTLE.min(s.ready_timeout),
            Some(Ready::Port(p)) => port_accepts(
                *p,
                left.clamp(Duration::from_millis(10), Duration::from_secs(1)),
            ),
            Some(Ready::Cmd(c)) => ready_cmd_passes(c, &s.cwd, left.max(Duration::from_millis(10))),
        };
        if ready {
            return Ok(());
        }
        if start.elapsed() >= s.ready_timeout {
            let waited = crate::clock::human(s.ready_timeout);
            return Err(match &s.ready {
                Some(Ready::Port(p)) => {
                    format!(
                        "is not ready: nothing accepted a connection on 127.0.0.1:{p} within {waited} (`ready_timeout`)"
                    )
                }
                Some(Ready::Cmd(c)) => format!(
                    "is not ready: `{}` did not succeed within {waited} (`ready_timeout`)",
                    c.display()
                ),
                None => format!("did not stay up for {waited}"),
            });
        }
        std::thread::sleep(nap.min(left));
        nap = (nap * 2).min(Duration::from_millis(100));
    }
}

fn port_accepts(port: u16, within: Duration) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&addr, within).is_ok()
}

fn ready_cmd_passes(c: &Cmdline, cwd: &Path, within: Duration) -> bool {
    let (program, args) = c.program_and_args();
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(cwd);
    proc::capture(&mut cmd, Some(within)).is_ok_and(|(exit, _, _)| exit.success())
}

/// Writes the pidfile atomically, readable by all and writable by its owner
/// only (`liveness` ignores a pidfile that others could have written).
fn write_pidfile(path: &Path, rec: &Record) -> Result<()> {
    let text = format!("{}\n{}\n", rec.pid, serde_json::to_string(rec)?);
    crate::fsio::write_atomic_mode(path, text.as_bytes(), 0o644)
}

/// The live (not exiting) members of process group `pgid`, from /proc.
fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| {
            proc_stat(pid)
                .is_some_and(|st| st.pgrp == pgid as i64 && !matches!(st.state, 'Z' | 'X' | 'x'))
        })
        .collect()
}

fn wait_group_gone(pgid: u32, within: Duration) -> bool {
    let start = Instant::now();
    let mut nap = Duration::from_millis(5);
    loop {
        if group_members(pgid).is_empty() {
            return true;
        }
        if start.elapsed() >= within {
            return false;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(100));
    }
}

/// Ends the process group `pgid` (a pid `liveness` just proved to be the
/// service): SIGTERM, then SIGKILL after `grace`. Returns which one did it.
pub fn stop_group(pgid: u32, grace: Duration) -> Result<&'static str> {
    // Never a group that is not a service's: pid 0 and 1 are refused by
    // `parse_pidfile`, and the pid led its own session a moment ago.
    if pgid <= 1 || pgid > i32::MAX as u32 {
        bail!("refusing to signal process group {pgid}");
    }
    let signal = |sig| {
        // SAFETY: kill(2) on the service's own process group; no memory is involved.
        unsafe { libc::kill(-(pgid as libc::pid_t), sig) }
    };
    signal(libc::SIGTERM);
    if wait_group_gone(pgid, grace) {
        return Ok("SIGTERM");
    }
    signal(libc::SIGKILL);
    if wait_group_gone(pgid, KILL_WAIT) {
        return Ok("SIGKILL");
    }
    bail!(
        "process group {pgid} is still alive {} after SIGKILL (members: {:?})",
        crate::clock::human(KILL_WAIT),
        group_members(pgid)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_count_from_the_last_paren() {
        let tail = "S 1 4242 4242 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 98765 0 0";
        for comm in ["sleep", "a b", "x) S 9 9 9 (y", ")", "((", ""] {
            let st = parse_stat(&format!("4242 ({comm}) {tail}")).unwrap();
            assert_eq!(
                st,
                ProcStat {
                    state: 'S',
                    pgrp: 4242,
                    session: 4242,
                    start_time: 98765
                },
                "{comm}"
            );
        }
        for bad in [
            "",
            "4242",
            "4242 (x",
            "4242 (x) S 1 2",
            "4242 x) S 1 2 3",
            "4242 (x) SS 1 2 3",
        ] {
            assert_eq!(parse_stat(bad), None, "{bad}");
        }
        let own = proc_stat(std::process::id()).unwrap();
        assert!(matches!(own.state, 'R' | 'S'), "{own:?}");
    }

    #[test]
    fn the_program_of_a_shell_line_is_its_first_plain_word() {
        let sh = |s: &str| program_of(&Cmdline::Shell(s.into()));
        assert_eq!(sh("exec python3 -m http.server"), "python3");
        assert_eq!(sh("PORT=1 A_B=2 ./bin/lsp --stdio"), "./bin/lsp");
        assert_eq!(sh("\"$HOME/bin/x\""), "sh");
        assert_eq!(sh("cd x && y"), "cd");
        assert_eq!(
            program_of(&Cmdline::Argv(vec!["/bin/sleep".into()])),
            "/bin/sleep"
        );
        assert!(resolve("sh", Path::new("/")).is_some());
        assert_eq!(resolve("no-such-program-here", Path::new("/")), None);
    }
}
