//! Creating one entry the same way on every thread: the refusal that names
//! the entry, the new-file open, and the mode and mtime set once its data is
//! in. The extractor and its writer pool both build on these.
//!
//! Nothing here decides whether an entry is safe; it never opens an existing
//! path or follows a symlink at the path it creates.

use anyhow::{Context, Result};
use std::fs::{File, Permissions};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use crate::exit::{Code, fail};

/// A refusal naming the entry.
pub(super) fn refuse(name: &str, reason: impl std::fmt::Display) -> anyhow::Error {
    fail(
        Code::Unsafe,
        format!("refusing tar entry `{name}`: {reason}"),
    )
}

/// Creates a new regular file (mode 0600 until `finish_file`), refusing an
/// existing path as a duplicate entry and never following a symlink.
pub(super) fn create_file(path: &Path, name: &str) -> Result<File> {
    match super::create_new_file(path) {
        Ok(f) => Ok(f),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            Err(refuse(name, "duplicate entry: the path exists already"))
        }
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

/// Sets the entry's mode and mtime on a file whose data is written.
pub(super) fn finish_file(file: &File, path: &Path, mode: u32, mtime: u64) -> Result<()> {
    file.set_permissions(Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    file.set_modified(epoch(mtime))
        .with_context(|| format!("setting the mtime of {}", path.display()))
}

fn epoch(secs: u64) -> SystemTime {
    // Clamped like `set_symlink_mtime`: a base-256 mtime beyond i64::MAX
    // seconds must not overflow (a panic); the kernel clamps what remains
    // to what the file system can store.
    let secs = secs.min(i64::MAX as u64);
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Sets the mtime of `path` itself (not what a symlink points to).
pub(super) fn set_symlink_mtime(path: &Path, mtime: u64) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .with_context(|| format!("{} contains a NUL byte", path.display()))?;
    let times = [
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        libc::timespec {
            tv_sec: mtime.min(i64::MAX as u64) as libc::time_t,
            tv_nsec: 0,
        },
    ];
    // SAFETY: `c` is a valid NUL-terminated path and `times` has two entries.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("setting the mtime of {}", path.display()));
    }
    Ok(())
}
