//! The one place warmstart handles signals, in its two modes.
//!
//! - **Noted** (`catch_interrupts`, the gate runner's): from the first gate on,
//!   SIGINT, SIGTERM and SIGHUP never kill warmstart; they are noted
//!   (`interrupted`), and whoever runs a child forwards them to its group and
//!   stops. Always installed, since a child in its own process group does not
//!   receive the terminal's Ctrl-C.
//! - **Ending** (`register_group`, `register_temp`, the network watchdog's):
//!   installed only where the disposition is still the default (a handler
//!   installed by the noted mode, or an ignored signal of a `nohup`ed worker,
//!   stays as it was); on SIGTERM or SIGINT it ends every registered process
//!   group, removes every registered temporary file and exits 128 + the signal.
//!
//! The handlers only call async-signal-safe functions and touch atomics.

use std::ffi::CString;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};

static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// Whether stderr was a terminal when the ending handler was installed:
/// its message then clears a half-drawn progress line first.
static STDERR_IS_TERMINAL: AtomicBool = AtomicBool::new(false);
/// Set first thing by the ending handler: the process is on its way out.
static ENDING: AtomicI32 = AtomicI32::new(0);

/// The signal the ending handler is acting on, if it is: threads that run
/// on meanwhile must start nothing new (a process started then would
/// outlive warmstart).
pub fn ending() -> Option<i32> {
    match ENDING.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

extern "C" fn note_signal(sig: libc::c_int) {
    INTERRUPTED.store(sig, Ordering::SeqCst);
}

/// From the first `run` on, SIGINT, SIGTERM and SIGHUP do not kill warmstart:
/// they are noted, and the running command's group is sent the same signal,
/// then killed after the grace period, and `run` reports `Interrupted`
/// (callers stop there). Needed because a command in its own process group
/// does not receive the terminal's Ctrl-C.
pub fn catch_interrupts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the handler only stores into an atomic, which is
            // async-signal-safe.
            unsafe {
                libc::signal(sig, note_signal as *const () as libc::sighandler_t);
            }
        }
    });
}

/// The signal received since `catch_interrupts`, if any.
pub fn interrupted() -> Option<i32> {
    match INTERRUPTED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// The name of a signal number, for messages.
pub fn signal_name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        libc::SIGSEGV => "SIGSEGV".into(),
        libc::SIGABRT => "SIGABRT".into(),
        n => format!("signal {n}"),
    }
}

const SLOTS: usize = 64;
#[allow(clippy::declare_interior_mutable_const)]
const NO_GROUP: AtomicI32 = AtomicI32::new(0);
#[allow(clippy::declare_interior_mutable_const)]
const NO_PATH: AtomicPtr<libc::c_char> = AtomicPtr::new(std::ptr::null_mut());
static GROUPS: [AtomicI32; SLOTS] = [NO_GROUP; SLOTS];
static TEMPS: [AtomicPtr<libc::c_char>; SLOTS] = [NO_PATH; SLOTS];
static TEMP_DIRS: [AtomicPtr<libc::c_char>; 8] = [NO_PATH; 8];

/// While alive, SIGTERM or SIGINT to warmstart ends this process group too.
pub struct GroupGuard(Option<usize>);

/// Registers the process group `pgid` (a child that leads its own group).
pub fn register_group(pgid: u32) -> GroupGuard {
    install_handler();
    let Ok(pgid) = i32::try_from(pgid) else {
        return GroupGuard(None);
    };
    GroupGuard(GROUPS.iter().position(|s| {
        s.compare_exchange(0, pgid, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }))
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(i) = self.0 {
            GROUPS[i].store(0, Ordering::SeqCst);
        }
    }
}

/// While alive, SIGTERM or SIGINT to warmstart removes this file (or this
/// directory and the files in it).
pub struct TempGuard(Option<(&'static [AtomicPtr<libc::c_char>], usize)>);

/// Registers a temporary file of this process (e.g. a partial chunk).
pub fn register_temp(path: &Path) -> TempGuard {
    TempGuard(register_path(&TEMPS, path))
}

/// Registers a scratch directory of this process (a publish's chunks, a
/// quarantine its push child made in a local remote): the handler removes
/// what it holds, two levels down, then the directory.
pub fn register_temp_dir(path: &Path) -> TempGuard {
    TempGuard(register_path(&TEMP_DIRS, path))
}

fn register_path(
    slots: &'static [AtomicPtr<libc::c_char>],
    path: &Path,
) -> Option<(&'static [AtomicPtr<libc::c_char>], usize)> {
    use std::os::unix::ffi::OsStrExt;
    install_handler();
    let c = CString::new(path.as_os_str().as_bytes()).ok()?;
    let p = c.into_raw();
    for (i, slot) in slots.iter().enumerate() {
        if slot
            .compare_exchange(std::ptr::null_mut(), p, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            return Some((slots, i));
        }
    }
    // SAFETY: `p` came from `into_raw` just above and was never shared.
    drop(unsafe { CString::from_raw(p) });
    None
}

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some((slots, i)) = self.0 {
            // Whoever swaps the pointer out owns it: the handler never frees.
            let p = slots[i].swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !p.is_null() {
                // SAFETY: only `register_path` stores pointers, from `into_raw`.
                drop(unsafe { CString::from_raw(p) });
            }
        }
    }
}

/// Removes directory `p` and what it holds, two levels down at most (a
/// publish's flat scratch, git's `tmp_objdir-incoming-*/pack/tmp_pack_*`),
/// with async-signal-safe system calls only (`openat`, `getdents64`,
/// `unlinkat`), never following a symbolic link. Other threads run on while
/// the handler does: a file one of them adds meanwhile makes the last
/// removal fail, and the directory is emptied again, a few times at most.
///
/// # Safety
/// `p` must be a valid NUL-terminated path.
unsafe fn remove_tree(p: *const libc::c_char) {
    // SAFETY: raw system calls on a path of our own.
    unsafe {
        for _ in 0..8 {
            let fd = libc::open(
                p,
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            );
            if fd < 0 {
                return;
            }
            empty_dir(fd, 2);
            libc::close(fd);
            if libc::rmdir(p) == 0 || *libc::__errno_location() == libc::ENOENT {
                return;
            }
        }
    }
}

/// Unlinks everything in the directory open as `fd`, descending `depth`
/// more levels into subdirectories.
///
/// # Safety
/// `fd` must be an open directory.
unsafe fn empty_dir(fd: libc::c_int, depth: u32) {
    let mut buf = [0u8; 4096];
    // SAFETY: the kernel bounds what it writes into `buf` by its length;
    // each record's name is NUL-terminated within its record.
    unsafe {
        loop {
            let n = libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len());
            if n <= 0 {
                return;
            }
            let mut off = 0usize;
            while off + 19 < n as usize {
                // linux_dirent64: ino (8), off (8), reclen (2), type (1), name.
                let reclen = u16::from_ne_bytes([buf[off + 16], buf[off + 17]]) as usize;
                let name = buf.as_ptr().add(off + 19);
                let dot = *name == b'.'
                    && (*name.add(1) == 0 || (*name.add(1) == b'.' && *name.add(2) == 0));
                if !dot && libc::unlinkat(fd, name.cast(), 0) != 0 && depth > 0 {
                    let sub = libc::openat(
                        fd,
                        name.cast(),
                        libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                    );
                    if sub >= 0 {
                        empty_dir(sub, depth - 1);
                        libc::close(sub);
                        libc::unlinkat(fd, name.cast(), libc::AT_REMOVEDIR);
                    }
                }
                if reclen == 0 {
                    break;
                }
                off += reclen;
            }
        }
    }
}

/// Installs `on_signal` for SIGTERM and SIGINT, once, and only where the
/// disposition is still the default: a handler someone else installed (the
/// gate runner's) or an ignored signal (a `nohup`ed worker) stays as it was.
fn install_handler() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // Asked here, not in the handler: isatty is not on the list of
        // async-signal-safe functions.
        // SAFETY: isatty only inspects the descriptor.
        STDERR_IS_TERMINAL.store(unsafe { libc::isatty(2) } == 1, Ordering::SeqCst);
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: sigaction with zeroed structs, our own handler, which
            // only calls async-signal-safe functions (kill, unlink, write,
            // nanosleep, _exit) and reads atomics.
            unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                    || old.sa_sigaction != libc::SIG_DFL
                {
                    continue;
                }
                let mut new: libc::sigaction = std::mem::zeroed();
                new.sa_sigaction = on_signal as *const () as libc::sighandler_t;
                libc::sigemptyset(&mut new.sa_mask);
                libc::sigaction(sig, &new, std::ptr::null_mut());
            }
        }
    });
}

/// SIGTERM to every registered group, registered temp files removed (the
/// watchdog registers the partial packs git's processes hold open, see
/// `Watch`), up to half a second for the groups to go, SIGKILL to what is
/// left, and exit with 128 + the signal, as the default action would have
/// reported it. It all happens here, in the handler, so that no other
/// thread of warmstart gets to exit first with another code.
extern "C" fn on_signal(sig: libc::c_int) {
    ENDING.store(sig, Ordering::SeqCst);
    // SAFETY: async-signal-safe calls only; pointers in TEMPS are valid
    // C strings owned by the registry, swapped out so nobody frees them.
    unsafe {
        for g in &GROUPS {
            let p = g.load(Ordering::SeqCst);
            if p > 0 {
                libc::kill(-p, libc::SIGTERM);
            }
        }
        for t in &TEMPS {
            let p = t.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !p.is_null() {
                libc::unlink(p);
            }
        }
        for _ in 0..25 {
            let alive = GROUPS.iter().any(|g| {
                let p = g.load(Ordering::SeqCst);
                p > 0 && libc::kill(-p, 0) == 0
            });
            if !alive {
                break;
            }
            let ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 20_000_000,
            };
            libc::nanosleep(&ts, std::ptr::null_mut());
        }
        for g in &GROUPS {
            let p = g.load(Ordering::SeqCst);
            if p > 0 {
                libc::kill(-p, libc::SIGKILL);
            }
        }
        // Directories last, once the groups that wrote into them are gone
        // (a killed process stops writing within a tick).
        let ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 20_000_000,
        };
        libc::nanosleep(&ts, std::ptr::null_mut());
        for t in &TEMP_DIRS {
            let p = t.swap(std::ptr::null_mut(), Ordering::SeqCst);
            if !p.is_null() {
                remove_tree(p);
            }
        }
        let msg: &[u8] = if sig == libc::SIGINT {
            b"\r\x1b[2Kwarmstart: interrupted (SIGINT): stopped its git processes and removed its partial files\n"
        } else {
            b"\r\x1b[2Kwarmstart: terminated (SIGTERM): stopped its git processes and removed its partial files\n"
        };
        // On a terminal, a progress bar may be half drawn on the current
        // line: the message first returns to its start and clears it (in
        // the same write, so no redraw of another thread comes between).
        // A pipe or a file gets the message alone.
        let clear = if STDERR_IS_TERMINAL.load(Ordering::SeqCst) {
            0
        } else {
            5
        };
        let msg = &msg[clear..];
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::_exit(128 + sig);
    }
}
