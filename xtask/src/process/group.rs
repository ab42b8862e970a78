//! Process groups: a child that leads a group of its own, and ending that
//! group with everything it started (SIGTERM, a grace period, SIGKILL),
//! reaping it, and removing the partial files git's processes of the group
//! held open. Used by the gate runner, the network watchdog and restore's
//! steps; nothing here decides what a result means.

use anyhow::{Context, Result};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(20);

/// How the command ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Exited(i32),
    Signaled(i32),
    /// Past its timeout; its group was killed.
    TimedOut,
    /// warmstart received this signal; the group was sent it, then killed.
    Interrupted(i32),
}

impl End {
    pub fn success(self) -> bool {
        self == End::Exited(0)
    }
}

/// Starts `cmd` as the leader of a process group of its own, so that ending
/// the group ends everything it starts (a shell's pipeline, git's helpers).
pub fn spawn_leader(cmd: &mut Command) -> Result<Child> {
    cmd.process_group(0);
    cmd.spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))
}

/// Makes the process `cmd` starts end with warmstart: SIGTERM when the
/// thread that started it dies, whatever killed it (SIGKILL, the OOM
/// killer), so that no git keeps running, and holding git's lock files in
/// a private store, after the warmstart that started it. SIGTERM, not
/// SIGKILL: git then removes its own lock files and ends the helpers it
/// started. For git only, and only where the starting thread waits for it
/// (the signal follows the thread, not the process): restore's service
/// steps must outlive the restore that started them and never come here.
pub fn die_with_parent(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        let parent = std::process::id() as libc::pid_t;
        // SAFETY: the closure runs in the forked child before exec and
        // calls only async-signal-safe functions (prctl, getppid).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // warmstart died between the fork and the prctl: no signal
                // will come, so do not start at all.
                if libc::getppid() != parent {
                    return Err(std::io::Error::other("warmstart exited"));
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// SIGKILL to the group `leader` leads, then reaps the leader.
pub fn kill_group(leader: &mut Child) {
    // SAFETY: kill(2) on the child's own process group (its pid, as
    // `spawn_leader` made it the leader); no memory is involved.
    unsafe {
        libc::kill(-(leader.id() as libc::pid_t), libc::SIGKILL);
    }
    let _ = leader.wait();
}

pub fn become_subreaper() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_CHILD_SUBREAPER only sets a flag on this process.
    unsafe {
        libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// The process group of one command, reaped with waitpid(-pgid).
pub struct Group {
    pub pgid: i32,
    pub status: Option<libc::c_int>,
}

impl Group {
    /// Reaps every finished member we are the parent of; notes the leader's status.
    pub fn reap(&mut self) {
        loop {
            let mut st: libc::c_int = 0;
            // SAFETY: plain waitpid on our own children, status into a local.
            let pid = unsafe { libc::waitpid(-self.pgid, &mut st, libc::WNOHANG) };
            if pid <= 0 {
                return;
            }
            if pid == self.pgid {
                self.status = Some(st);
            }
        }
    }

    /// Whether any process of the group still exists (zombies of processes
    /// we are not the parent of count: we cannot tell them apart).
    pub fn alive(&self) -> bool {
        // SAFETY: signal 0 only checks for existence and permission.
        let r = unsafe { libc::kill(-self.pgid, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child's process group.
        unsafe {
            libc::kill(-self.pgid, sig);
        }
    }

    /// `sig` to the group, up to `grace` for it to go, then SIGKILL; returns
    /// once the leader is reaped.
    pub fn terminate(&mut self, sig: i32, grace: Duration) {
        self.signal(sig);
        let until = Instant::now() + grace;
        loop {
            self.reap();
            if self.status.is_some() && !self.alive() {
                return;
            }
            if Instant::now() >= until {
                break;
            }
            std::thread::sleep(POLL);
        }
        self.signal(libc::SIGKILL);
        if self.status.is_none() {
            let mut st: libc::c_int = 0;
            // SAFETY: blocking wait for our own child, which was just SIGKILLed.
            let pid = unsafe { libc::waitpid(self.pgid, &mut st, 0) };
            if pid == self.pgid {
                self.status = Some(st);
            }
        }
        // Reap the rest of the group as SIGKILL lands, briefly.
        let until = Instant::now() + Duration::from_secs(1);
        while self.alive() && Instant::now() < until {
            self.reap();
            std::thread::sleep(POLL);
        }
    }

    pub fn end(&self) -> End {
        let st = self.status.unwrap_or(0);
        if libc::WIFSIGNALED(st) {
            End::Signaled(libc::WTERMSIG(st))
        } else {
            End::Exited(libc::WEXITSTATUS(st))
        }
    }
}

/// The `/proc/<pid>` directories of the processes in group `pgid`.
fn group_procs(pgid: i32) -> Vec<PathBuf> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .map(|p| p.path())
        .filter(|p| {
            let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
            // Fields after the command name (which may hold spaces): state, ppid, pgrp.
            let pgrp = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(2))
                .and_then(|f| f.parse::<i32>().ok());
            pgrp == Some(pgid)
        })
        .collect()
}

/// Partial files (`tmp_pack_*`, `tmp_idx_*`, ...) the processes of group
/// `pgid` hold open: what git leaves behind when it is killed mid-fetch.
/// Only files a process of the group has open count, so another
/// process's fetch into the same repository is never touched.
pub fn group_temp_files(pgid: i32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for p in group_procs(pgid) {
        let Ok(fds) = std::fs::read_dir(p.join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && target
                    .file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("tmp_"))
                && target.parent().is_some_and(|d| d.ends_with("objects/pack"))
            {
                found.push(target);
            }
        }
    }
    found
}

/// The quarantines (`tmp_objdir-incoming-*`) the processes of group `pgid`
/// work in: a push to a remote on this machine runs `git receive-pack`
/// in our group, and git names the quarantine in its children's
/// environment (`GIT_QUARANTINE_PATH`). git leaves one behind when it is
/// killed; only the ones a process of our group names are ours.
pub fn group_quarantines(pgid: i32) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for p in group_procs(pgid) {
        let env = std::fs::read(p.join("environ")).unwrap_or_default();
        for var in env.split(|&b| b == 0) {
            let Some(path) = var.strip_prefix(b"GIT_QUARANTINE_PATH=") else {
                continue;
            };
            use std::os::unix::ffi::OsStrExt;
            let path = PathBuf::from(std::ffi::OsStr::from_bytes(path));
            let named = path
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tmp_objdir-incoming-"));
            if named && path.is_absolute() && !found.contains(&path) {
                found.push(path);
            }
        }
    }
    found
}

/// Which files under `dir` any process this one can see holds open (by
/// `/proc/<pid>/fd`): a git that writes a `tmp_pack_*` holds it open from
/// its first byte to its rename, so one nobody holds belongs to a git that
/// died.
pub fn files_open_under(dir: &std::path::Path) -> std::collections::BTreeSet<PathBuf> {
    let mut found = std::collections::BTreeSet::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path())
                && target.starts_with(dir)
            {
                found.insert(target);
            }
        }
    }
    found
}

/// SIGTERM to the group, up to `grace` for it to go, then SIGKILL; then
/// removes the partial packs its git processes held open.
pub fn end_group(pgid: u32, grace: Duration) {
    let partial = group_temp_files(pgid as i32);
    let quarantines = group_quarantines(pgid as i32);
    let pg = -(pgid as libc::pid_t);
    // SAFETY: kill(2) on a group our child leads; no memory involved.
    unsafe {
        libc::kill(pg, libc::SIGTERM);
    }
    let until = Instant::now() + grace;
    // SAFETY: as above; signal 0 only checks.
    while Instant::now() < until && unsafe { libc::kill(pg, 0) } == 0 {
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above.
    unsafe {
        libc::kill(pg, libc::SIGKILL);
    }
    for f in partial {
        let _ = std::fs::remove_file(f);
    }
    for q in quarantines {
        let _ = std::fs::remove_dir_all(q);
    }
}
