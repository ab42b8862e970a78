//! Containment by construction: directory handles, and paths resolved
//! beneath them that can never leave them.
//!
//! Every create, rename and removal that an install makes in a target (a
//! prefix being merged into, the parent of a directory being swapped) goes
//! through a `Dir`, an open handle, with a single name relative to it
//! (`mkdirat`, `renameat`, `unlinkat`, `openat` with `O_NOFOLLOW`). A `Dir`
//! below the target root is found by `open_beneath`, which resolves a
//! relative path the way the kernel would, but refuses (with `EXDEV`) any
//! resolution that leaves the root, whatever symlinks the target already
//! holds and whoever made them:
//! - `openat2(2)` with `RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS` where the
//!   kernel has it (Linux 5.6 and later; it also rejects rename races);
//! - otherwise a walk, one component at a time, with `O_NOFOLLOW |
//!   O_DIRECTORY`, reading each symlink met and splicing its target in,
//!   keeping a stack of handles so that `..` pops a handle (never opens
//!   `..`) and refuses to pop the root. `WARMSTART_TEST_FORCE_WALK=1` (or
//!   `force_walk` in-process) makes every resolution take this path, so
//!   tests run both.
//!
//! The choice about symlinked directories (`Links::Beneath`): a symlink
//! already in the target whose target resolves beneath the root is followed
//! (real prefixes have `lib64 -> lib`, Debian's `/usr/local/man ->
//! share/man`; refusing them, or replacing them by directories, would break
//! the machine's layout). A symlink that leaves the root, by `..` or by an
//! absolute target (even one that names a path inside the root: where it
//! lands depends on where the root is mounted, not on the root), is never
//! followed: the write is refused. `Links::None` (`RESOLVE_NO_SYMLINKS`)
//! is for trees warmstart made itself, such as staging directories, where a
//! symlinked directory can only be an archive's and is never followed.
//!
//! This module never opens a path relative to the current directory, and
//! never follows a symlink in the last component of anything it creates,
//! renames or removes.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Most symlinks one resolution follows before it is `ELOOP` (the kernel's
/// own limit is 40).
const MAX_LINKS: usize = 40;

/// Whether a resolution may pass through symlinks found on the way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Links {
    /// Follow those that resolve beneath the root; refuse the others.
    Beneath,
    /// Refuse every symlink (`ELOOP`).
    None,
}

/// An open directory. Dropping it closes the handle.
#[derive(Debug)]
pub(crate) struct Dir {
    file: File,
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` contains a NUL byte", name.to_string_lossy()),
        )
    })
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// A single name (no `/`, not `.` or `..`): what every `*at` call here
/// takes, so that nothing but the handle decides where it lands.
fn single(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not a single file name", name.to_string_lossy()),
        ));
    }
    cstr(name)
}

/// The file-type bits of a `stat`.
pub(crate) fn kind(st: &libc::stat) -> libc::mode_t {
    st.st_mode & libc::S_IFMT
}

pub(crate) fn is_dir(st: &libc::stat) -> bool {
    kind(st) == libc::S_IFDIR
}

pub(crate) fn is_link(st: &libc::stat) -> bool {
    kind(st) == libc::S_IFLNK
}

/// Whether an error is the "this resolution leaves the root" refusal.
pub(crate) fn escapes(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EXDEV)
}

impl Dir {
    /// Opens the directory at `path` as given: the caller's chosen location
    /// (a prefix, a target's parent), whose own symlinks are the caller's.
    pub fn open_path(path: &Path) -> io::Result<Dir> {
        let c = cstr(path.as_os_str())?;
        // SAFETY: `c` is a valid NUL-terminated string.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        Self::from_fd(fd)
    }

    fn from_fd(fd: libc::c_int) -> io::Result<Dir> {
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
        Ok(Dir {
            file: unsafe { File::from_raw_fd(fd) },
        })
    }

    fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    /// Another handle on the same directory.
    pub fn try_clone(&self) -> io::Result<Dir> {
        Ok(Dir {
            file: self.file.try_clone()?,
        })
    }

    pub fn stat(&self) -> io::Result<libc::stat> {
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: the fd is open and `st` is a valid out-pointer.
        check(unsafe { libc::fstat(self.fd(), &mut st) })?;
        Ok(st)
    }

    /// `lstat` of `name` in this directory; `None` when there is nothing.
    pub fn lstat_at(&self, name: &OsStr) -> io::Result<Option<libc::stat>> {
        let c = single(name)?;
        // SAFETY: as in `stat`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid fd, NUL-terminated name, valid out-pointer.
        let rc =
            unsafe { libc::fstatat(self.fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) };
        match check(rc) {
            Ok(()) => Ok(Some(st)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The real directory `name` in this one (`ELOOP` for a symlink,
    /// `ENOTDIR` for anything else).
    pub fn open_dir_at(&self, name: &OsStr) -> io::Result<Dir> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        Self::from_fd(fd)
    }

    pub fn mkdir_at(&self, name: &OsStr, mode: libc::mode_t) -> io::Result<()> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::mkdirat(self.fd(), c.as_ptr(), mode) })
    }

    /// Renames `name` here to `to_name` in `to` (replacing a file or
    /// symlink there, never following one).
    pub fn rename_at(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let (a, b) = (single(name)?, single(to_name)?);
        // SAFETY: valid fds and NUL-terminated names.
        check(unsafe { libc::renameat(self.fd(), a.as_ptr(), to.fd(), b.as_ptr()) })
    }

    /// `renameat2(RENAME_EXCHANGE)` of two names in this directory.
    pub fn exchange_at(&self, a: &OsStr, b: &OsStr) -> io::Result<()> {
        let (a, b) = (single(a)?, single(b)?);
        // SAFETY: valid fd and NUL-terminated names; the raw syscall avoids
        // depending on the libc wrapper.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_renameat2,
                self.fd(),
                a.as_ptr(),
                self.fd(),
                b.as_ptr(),
                libc::RENAME_EXCHANGE,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Removes the file or symlink `name` (`EISDIR` for a directory).
    pub fn unlink_at(&self, name: &OsStr) -> io::Result<()> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd(), c.as_ptr(), 0) })
    }

    /// `unlink_at`, where nothing there is fine.
    pub fn unlink_if_exists(&self, name: &OsStr) -> io::Result<()> {
        match self.unlink_at(name) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }

    pub fn rmdir_at(&self, name: &OsStr) -> io::Result<()> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        check(unsafe { libc::unlinkat(self.fd(), c.as_ptr(), libc::AT_REMOVEDIR) })
    }

    pub fn symlink_at(&self, target: &OsStr, name: &OsStr) -> io::Result<()> {
        let (t, c) = (cstr(target)?, single(name)?);
        // SAFETY: valid fd and NUL-terminated strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.fd(), c.as_ptr()) })
    }

    pub fn read_link_at(&self, name: &OsStr) -> io::Result<OsString> {
        let c = single(name)?;
        read_link_raw(self.fd(), &c)
    }

    /// Creates a new file `name` for writing, mode 0600: never an existing
    /// path, never through a symlink.
    pub fn create_file_at(&self, name: &OsStr) -> io::Result<File> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        self.owned(fd)
    }

    /// Opens the regular file `name` for reading, never through a symlink.
    pub fn open_file_at(&self, name: &OsStr) -> io::Result<File> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        self.owned(fd)
    }

    fn owned(&self, fd: libc::c_int) -> io::Result<File> {
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is freshly opened and owned by nothing else.
        Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// An `O_PATH` handle on `name` itself, never what a symlink there
    /// points to (a symlink gives a handle on the link): what a delta
    /// install checks (`fstat`) and then links or reads, so that the inode
    /// it checked is the one it uses, whoever renames things meanwhile.
    pub fn open_inode_at(&self, name: &OsStr) -> io::Result<File> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        self.owned(fd)
    }

    /// Creates `name` here as a new hardlink to the inode `inode` holds
    /// open (from `open_inode_at`), through its `/proc/self/fd` entry: the
    /// link names exactly that inode, never a path someone swapped since.
    pub fn link_inode_at(&self, inode: &File, name: &OsStr) -> io::Result<()> {
        let c = single(name)?;
        let at = cstr(OsStr::new(&format!("/proc/self/fd/{}", inode.as_raw_fd())))?;
        // SAFETY: valid fds and NUL-terminated strings.
        check(unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                at.as_ptr(),
                self.fd(),
                c.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        })
    }

    /// Creates `to_name` in `to` as a hardlink to `name` here (never to
    /// what a symlink at `name` points to).
    pub fn link_at(&self, name: &OsStr, to: &Dir, to_name: &OsStr) -> io::Result<()> {
        let (a, b) = (single(name)?, single(to_name)?);
        // SAFETY: valid fds and NUL-terminated names; flags 0 never follows.
        check(unsafe { libc::linkat(self.fd(), a.as_ptr(), to.fd(), b.as_ptr(), 0) })
    }

    /// Sets the mtime of `name` itself (a symlink's own, never its target's).
    pub fn set_mtime_at(&self, name: &OsStr, secs: u64) -> io::Result<()> {
        let c = single(name)?;
        let times = [
            libc::timespec {
                tv_sec: 0,
                tv_nsec: libc::UTIME_OMIT,
            },
            libc::timespec {
                tv_sec: secs.min(i64::MAX as u64) as libc::time_t,
                tv_nsec: 0,
            },
        ];
        // SAFETY: valid fd, NUL-terminated name, two timespecs.
        check(unsafe {
            libc::utimensat(
                self.fd(),
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        })
    }

    /// Sets the permission bits of the directory `name` in this one, never
    /// through a symlink (`ELOOP`, `ENOTDIR`): a directory without read
    /// permission cannot be opened to `fchmod` it, and `fchmodat` follows
    /// a symlink, so another process swapping the directory for a link
    /// (`x -> /etc`) between our look and the chmod would change the mode
    /// of whatever it pointed to. An `O_PATH` handle pins the directory
    /// itself; its `/proc/self/fd` entry names exactly that inode.
    pub fn chmod_dir_at(&self, name: &OsStr, mode: libc::mode_t) -> io::Result<()> {
        let c = single(name)?;
        // SAFETY: valid fd and NUL-terminated name.
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        let pinned = self.owned(fd)?;
        let at = cstr(OsStr::new(&format!("/proc/self/fd/{}", pinned.as_raw_fd())))?;
        // SAFETY: a NUL-terminated path.
        check(unsafe { libc::chmod(at.as_ptr(), mode) })
    }

    /// Sets this directory's permission bits (`fchmod`).
    pub fn chmod(&self, mode: libc::mode_t) -> io::Result<()> {
        // SAFETY: valid fd.
        check(unsafe { libc::fchmod(self.fd(), mode) })
    }

    /// The names in this directory (not `.` and `..`), in no order.
    pub fn names(&self) -> io::Result<Vec<OsString>> {
        // fdopendir takes ownership of its descriptor: give it a duplicate,
        // opened afresh so that its offset is its own.
        // SAFETY: valid fd and a NUL-terminated ".".
        let fd = unsafe {
            libc::openat(
                self.fd(),
                c".".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is an open directory descriptor we own.
        let dir = unsafe { libc::fdopendir(fd) };
        if dir.is_null() {
            let e = io::Error::last_os_error();
            // SAFETY: fdopendir failed, so `fd` is still ours to close.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let mut out = Vec::new();
        let result = loop {
            // readdir reports an error only through errno.
            // SAFETY: errno is thread-local.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: `dir` is a valid DIR stream until closedir below.
            let ent = unsafe { libc::readdir(dir) };
            if ent.is_null() {
                let e = io::Error::last_os_error();
                break if e.raw_os_error() == Some(0) {
                    Ok(())
                } else {
                    Err(e)
                };
            }
            // SAFETY: d_name is NUL-terminated within the entry.
            let name = unsafe { CStr::from_ptr((*ent).d_name.as_ptr()) }.to_bytes();
            if name != b"." && name != b".." {
                out.push(OsString::from_vec(name.to_vec()));
            }
        };
        // SAFETY: `dir` is valid and closed once; this also closes `fd`.
        unsafe { libc::closedir(dir) };
        result.map(|()| out)
    }

    /// An exclusive `flock` on this directory, held until the handle closes
    /// (or the process dies).
    pub fn lock(&self) -> io::Result<()> {
        self.file.lock()
    }

    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// Where this directory is now, for messages only (`/proc/self/fd`).
    pub fn shown(&self) -> Option<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", self.fd())).ok()
    }
}

/// `fstat` of an open file (an `O_PATH` handle too).
pub(crate) fn fstat(file: &File) -> io::Result<libc::stat> {
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: the fd is open and `st` is a valid out-pointer.
    check(unsafe { libc::fstat(file.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// Opens the inode an `O_PATH` handle holds for reading, through its
/// `/proc/self/fd` entry (the same inode, never a path looked up again).
pub(crate) fn reopen_for_reading(inode: &File) -> io::Result<File> {
    let at = cstr(OsStr::new(&format!("/proc/self/fd/{}", inode.as_raw_fd())))?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(at.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is freshly opened and owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn read_link_raw(dirfd: RawFd, name: &CStr) -> io::Result<OsString> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: valid fd, NUL-terminated name, `buf` has `buf.len()` bytes.
        let n = unsafe {
            libc::readlinkat(
                dirfd,
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len() as libc::size_t,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let n = n as usize;
        if n < buf.len() {
            buf.truncate(n);
            return Ok(OsString::from_vec(buf));
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// How resolutions are done in this process: 0 not decided yet, then one
/// of the constants below.
static MODE: AtomicU8 = AtomicU8::new(0);
const MODE_OPENAT2: u8 = 1;
const MODE_WALK: u8 = 2;
const MODE_BAD_ENV: u8 = 3;

static OPENAT2_CALLS: AtomicU64 = AtomicU64::new(0);
static WALK_CALLS: AtomicU64 = AtomicU64::new(0);

/// The test switch that forces the component walk.
pub const FORCE_WALK_ENV: &str = "WARMSTART_TEST_FORCE_WALK";

fn mode() -> u8 {
    match MODE.load(Ordering::Relaxed) {
        0 => {
            let m = match std::env::var_os(FORCE_WALK_ENV) {
                None => MODE_OPENAT2,
                Some(v) if v.is_empty() || v == "0" => MODE_OPENAT2,
                Some(v) if v == "1" => MODE_WALK,
                Some(_) => MODE_BAD_ENV,
            };
            // A concurrent first call decides the same way.
            let _ = MODE.compare_exchange(0, m, Ordering::Relaxed, Ordering::Relaxed);
            MODE.load(Ordering::Relaxed)
        }
        m => m,
    }
}

/// Refuses a `WARMSTART_TEST_FORCE_WALK` that is not understood (exit 10)
/// before an install starts, rather than deep inside it.
pub(crate) fn check_setting() -> anyhow::Result<()> {
    if mode() == MODE_BAD_ENV {
        let v = std::env::var_os(FORCE_WALK_ENV).unwrap_or_default();
        return Err(crate::exit::fail(
            crate::exit::Code::Config,
            format!(
                "{FORCE_WALK_ENV}={:?} is not understood: set it to 1 (force the component walk), 0, or unset it",
                v.to_string_lossy()
            ),
        ));
    }
    Ok(())
}

/// Makes every later resolution in this process take the component walk
/// (`true`) or `openat2` where the kernel has it (`false`), whatever
/// `WARMSTART_TEST_FORCE_WALK` says: for tests that run both in-process.
pub fn force_walk(on: bool) {
    MODE.store(if on { MODE_WALK } else { MODE_OPENAT2 }, Ordering::Relaxed);
}

/// How many resolutions this process made by `openat2` and by the walk
/// (tests check that the path they meant to test was taken).
pub fn resolutions() -> (u64, u64) {
    (
        OPENAT2_CALLS.load(Ordering::Relaxed),
        WALK_CALLS.load(Ordering::Relaxed),
    )
}

/// The normal components of `rel`; anything else (`..`, a root) is refused:
/// callers pass paths they checked, so this is a second line.
fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    rel.components()
        .filter(|c| *c != Component::CurDir)
        .map(|c| match c {
            Component::Normal(n) => Ok(n),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("`{}` is not a plain relative path", rel.display()),
            )),
        })
        .collect()
}

/// Opens the directory `rel` (relative, normal components) beneath `root`,
/// never leaving it: `EXDEV` when the resolution would (through `..` in a
/// symlink, or an absolute symlink), `ELOOP` for a symlink under
/// `Links::None` (or too many), `ENOTDIR` / `ENOENT` as usual.
pub(crate) fn open_beneath(root: &Dir, rel: &Path, links: Links) -> io::Result<Dir> {
    let comps = components(rel)?;
    if comps.is_empty() {
        return root.try_clone();
    }
    match mode() {
        MODE_OPENAT2 => match openat2(root, rel, links) {
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
                MODE.store(MODE_WALK, Ordering::Relaxed);
                walk(root, &comps, links)
            }
            r => r,
        },
        MODE_WALK => walk(root, &comps, links),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{FORCE_WALK_ENV} must be 1, 0 or unset"),
        )),
    }
}

fn openat2(root: &Dir, rel: &Path, links: Links) -> io::Result<Dir> {
    OPENAT2_CALLS.fetch_add(1, Ordering::Relaxed);
    let c = cstr(rel.as_os_str())?;
    // SAFETY: open_how is plain data; all-zero is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    if links == Links::None {
        how.resolve |= libc::RESOLVE_NO_SYMLINKS;
    }
    // EAGAIN: a concurrent rename somewhere in the filesystem made the
    // kernel unsure the walk stayed beneath; it asks for a retry.
    for _ in 0..16 {
        // SAFETY: valid fd, NUL-terminated path, `how` and its size.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.fd(),
                c.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd >= 0 {
            return Dir::from_fd(fd as libc::c_int);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EAGAIN) {
            return Err(e);
        }
    }
    Err(io::Error::from_raw_os_error(libc::EAGAIN))
}

/// The fallback: one component at a time from `root`, each opened with
/// `O_NOFOLLOW | O_DIRECTORY`. A symlink met is read and its target spliced
/// in front of what is left; `..` pops the handle stack instead of opening
/// `..`, so it can never climb above `root`. The one race it does not close
/// (`openat2` does): someone else moving a directory out of the root while
/// the walk stands in it.
fn walk(root: &Dir, comps: &[&OsStr], links: Links) -> io::Result<Dir> {
    WALK_CALLS.fetch_add(1, Ordering::Relaxed);
    let mut todo: Vec<OsString> = comps.iter().rev().map(|c| c.to_os_string()).collect();
    let mut stack: Vec<Dir> = Vec::new();
    let mut followed = 0;
    while let Some(comp) = todo.pop() {
        match comp.as_bytes() {
            b"" | b"." => continue,
            b".." => {
                if stack.pop().is_none() {
                    return Err(io::Error::from_raw_os_error(libc::EXDEV));
                }
                continue;
            }
            _ => {}
        }
        let cur = stack.last().unwrap_or(root);
        match cur.open_dir_at(&comp) {
            Ok(d) => stack.push(d),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                let st = cur.lstat_at(&comp)?;
                if !st.as_ref().is_some_and(is_link) {
                    return Err(io::Error::from_raw_os_error(libc::ENOTDIR));
                }
                if links == Links::None {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                followed += 1;
                if followed > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(libc::ELOOP));
                }
                let target = cur.read_link_at(&comp)?;
                let bytes = target.as_bytes();
                if bytes.first() == Some(&b'/') {
                    // RESOLVE_BENEATH's rule: an absolute link always leaves.
                    return Err(io::Error::from_raw_os_error(libc::EXDEV));
                }
                for part in bytes.split(|&b| b == b'/').rev() {
                    todo.push(OsStr::from_bytes(part).to_os_string());
                }
            }
            Err(e) => return Err(e),
        }
    }
    match stack.pop() {
        Some(d) => Ok(d),
        None => root.try_clone(),
    }
}

/// How many levels `dir` (found beneath `root`) is below it, counted by
/// its real parents (`..` as the kernel resolves it from there): what a
/// symlink's `..` components climb from it. `EXDEV` if `root` is not met.
pub(crate) fn depth_below(root: &Dir, dir: &Dir) -> io::Result<usize> {
    let root_st = root.stat()?;
    let id = |st: &libc::stat| (st.st_dev, st.st_ino);
    let mut cur = dir.try_clone()?;
    for depth in 0..4096 {
        let st = cur.stat()?;
        if id(&st) == id(&root_st) {
            return Ok(depth);
        }
        // SAFETY: valid fd and NUL-terminated "..".
        let fd = unsafe {
            libc::openat(
                cur.fd(),
                c"..".as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        let up = Dir::from_fd(fd)?;
        if id(&up.stat()?) == id(&st) {
            break; // the filesystem's root: `root` was never met
        }
        cur = up;
    }
    Err(io::Error::from_raw_os_error(libc::EXDEV))
}

/// Removes `name` in `dir` and everything below it, never following a
/// symlink (a symlink is removed, not what it points to), making
/// directories writable first; nothing there is fine.
pub(crate) fn remove_tree_at(dir: &Dir, name: &OsStr) -> io::Result<()> {
    let child = match dir.open_dir_at(name) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
            return dir.unlink_if_exists(name);
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            // A directory without read permission: make it readable, then
            // open it again (a symlink would have been ELOOP above).
            dir.chmod_dir_at(name, 0o700)?;
            dir.open_dir_at(name)?
        }
        Err(e) => return Err(e),
    };
    let st = child.stat()?;
    if st.st_mode & 0o700 != 0o700 {
        child.chmod((st.st_mode & 0o7777) | 0o700)?;
    }
    for n in child.names()? {
        match child.unlink_at(&n) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.raw_os_error() == Some(libc::EISDIR) => remove_tree_at(&child, &n)?,
            Err(e) => return Err(e),
        }
    }
    drop(child);
    match dir.rmdir_at(name) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// root/{a/b, real/, lib64 -> lib, lib/, up -> .., abs -> /tmp,
    /// loop -> loop, file, to_file -> file, deep -> a/b/../..}
    fn setup() -> (tempfile::TempDir, Dir) {
        let t = tempfile::tempdir().unwrap();
        let r = t.path().join("root");
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        std::fs::create_dir_all(r.join("lib")).unwrap();
        symlink("lib", r.join("lib64")).unwrap();
        symlink("..", r.join("up")).unwrap();
        symlink("/tmp", r.join("abs")).unwrap();
        symlink("loop", r.join("loop")).unwrap();
        std::fs::write(r.join("file"), "x").unwrap();
        symlink("file", r.join("to_file")).unwrap();
        symlink("a/b/../..", r.join("deep")).unwrap();
        symlink("a/b/../../..", r.join("deeper")).unwrap();
        let root = Dir::open_path(&r).unwrap();
        (t, root)
    }

    fn errno(r: io::Result<Dir>) -> i32 {
        r.map(|_| ()).unwrap_err().raw_os_error().unwrap()
    }

    #[test]
    fn both_resolvers_agree_on_every_case() {
        let (_t, root) = setup();
        for walk_only in [false, true] {
            let open = |p: &str, l| {
                if walk_only {
                    walk(&root, &components(Path::new(p)).unwrap(), l)
                } else {
                    openat2(&root, Path::new(p), l)
                }
            };
            let depth = |p: &str| depth_below(&root, &open(p, Links::Beneath).unwrap()).unwrap();
            assert_eq!(depth("a/b"), 2, "walk {walk_only}");
            assert_eq!(depth("lib64"), 1);
            assert_eq!(depth("deep/lib64"), 1);
            assert_eq!(depth("deep"), 0, "a link back to the root is beneath");
            assert_eq!(errno(open("up", Links::Beneath)), libc::EXDEV);
            assert_eq!(errno(open("up/root", Links::Beneath)), libc::EXDEV);
            assert_eq!(errno(open("deeper", Links::Beneath)), libc::EXDEV);
            assert_eq!(errno(open("abs", Links::Beneath)), libc::EXDEV);
            assert_eq!(errno(open("loop", Links::Beneath)), libc::ELOOP);
            assert_eq!(errno(open("lib64", Links::None)), libc::ELOOP);
            assert_eq!(errno(open("to_file", Links::Beneath)), libc::ENOTDIR);
            assert_eq!(errno(open("file", Links::Beneath)), libc::ENOTDIR);
            assert_eq!(errno(open("nothing/x", Links::Beneath)), libc::ENOENT);
        }
    }

    #[test]
    fn the_walk_never_climbs_above_the_root_by_dotdot() {
        let (_t, root) = setup();
        let comps: Vec<&OsStr> = vec![OsStr::new("a"), OsStr::new(".."), OsStr::new("..")];
        assert_eq!(errno(walk(&root, &comps, Links::Beneath)), libc::EXDEV);
        assert!(open_beneath(&root, Path::new("../x"), Links::Beneath).is_err());
    }

    /// `chmod_dir_at` (used on a directory without read permission while
    /// removing a tree) followed a symlink found at the name: swapped in by
    /// another process, it changed the mode of a directory outside.
    #[test]
    fn chmod_dir_at_never_changes_what_a_symlink_points_to() {
        let (t, root) = setup();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(
            &outside,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        symlink(&outside, t.path().join("root/swapped")).unwrap();
        let err = root.chmod_dir_at(OsStr::new("swapped"), 0o700).unwrap_err();
        assert!(
            matches!(err.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{err}"
        );
        let mode = std::fs::metadata(&outside).unwrap().permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o755
        );
        // A real directory still gets its mode.
        root.chmod_dir_at(OsStr::new("lib"), 0o700).unwrap();
        let mode = std::fs::metadata(t.path().join("root/lib"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o700
        );
    }

    #[test]
    fn remove_tree_removes_links_not_their_targets() {
        let (t, root) = setup();
        let keep = t.path().join("keep");
        std::fs::create_dir(&keep).unwrap();
        std::fs::write(keep.join("f"), "kept").unwrap();
        std::fs::create_dir_all(t.path().join("root/a/b/c")).unwrap();
        symlink(&keep, t.path().join("root/a/b/out")).unwrap();
        std::fs::set_permissions(
            t.path().join("root/a/b"),
            std::os::unix::fs::PermissionsExt::from_mode(0o500),
        )
        .unwrap();
        remove_tree_at(&root, OsStr::new("a")).unwrap();
        remove_tree_at(&root, OsStr::new("lib64")).unwrap();
        assert!(!t.path().join("root/a").exists());
        assert!(t.path().join("root/lib").is_dir());
        assert_eq!(std::fs::read_to_string(keep.join("f")).unwrap(), "kept");
        assert!(single(OsStr::new("a/b")).is_err());
        assert!(single(OsStr::new("..")).is_err());
    }
}
