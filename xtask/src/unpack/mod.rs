//! Safe unpacking shared by `cache restore` and `conda unpack`: a checked tar
//! extractor, an atomic directory swap, and a journaled merge into a shared prefix.
//!
//! The three steps of every install (docs/format.md, restore invariants 2, 3, 6):
//! 1. `extract_tar` streams a tar into an empty staging directory the caller
//!    owns, refusing (never skipping) every entry that could land outside it.
//! 2. Either `swap_dir` replaces a directory the cache owns with the staging
//!    directory by rename, or `merge_into` moves each staged file into a
//!    shared prefix (such as `/usr/local`) by rename, with a journal.
//! 3. `recover` / `recover_swap` finish or undo what a killed run left behind;
//!    the functions above call them first, so callers rarely need to.
//!
//! This module never follows a symlink it did not find in place before the
//! run (it creates files with `O_NOFOLLOW | O_EXCL`), never writes outside the
//! destination it was given, and never holds a whole archive or a file over
//! 1 MiB in memory. Outside its own staging directories it never writes by
//! path: every create, rename and removal in a target goes through a
//! directory handle (`beneath.rs`), so no symlink the target holds can lead
//! it outside.

mod beneath;
mod create;
mod extract;
mod identity;
mod journal;
mod merge;
mod swap;
mod writers;

pub use beneath::{FORCE_WALK_ENV, force_walk, resolutions};
// The delta install (`cache::restore::delta`) builds staging from an installed tree
// through the same handles.
pub(crate) use beneath::{Dir, Links, fstat, open_beneath, reopen_for_reading};
pub use extract::{CAPTURE_MAX, Select, extract_tar, extract_tar_select};
pub(crate) use extract::{check_symlink_target_with, safe_relative};
pub use identity::{Ident, identities};
pub use merge::{MergeOptions, merge_into, merge_into_with, recover};
pub use swap::{
    Retire, recover_swap, remove_shadow, remove_tree, shadow_of, staging_dir_for, swap_dir,
    swap_dir_then,
};

/// Creates a new file at `path` for writing, mode 0600 until its real mode is
/// set: never an existing path (`AlreadyExists`), never through a symlink at
/// `path` itself. Every file unpacking or merging creates is opened here.
pub fn create_new_file(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Removes a staging directory (any tree), making read-only directories
/// writable first; a missing directory is fine.
pub fn remove_staging(dir: &std::path::Path) -> anyhow::Result<()> {
    swap::remove_tree(dir)
}

/// Caps on what one archive may unpack. Exceeding either is refused with
/// `exit::Code::Unsafe` before the entry that would cross it is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Sum of the declared sizes of all entries (file contents), in bytes.
    pub max_bytes: u64,
    /// Number of entries of any kind (files, directories, links).
    pub max_entries: u64,
}

impl Limits {
    /// Generous caps for archives whose size nobody declared (16 GiB, one
    /// million entries); callers that know the size should pass it instead.
    pub const GENEROUS: Limits = Limits {
        max_bytes: 16 << 30,
        max_entries: 1_000_000,
    };
}

/// Relaxations of the default (strict) behaviour.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Allow symlinks whose target leaves the destination (absolute targets
    /// such as `/usr/bin/env`, or relative ones climbing above it). Such a link
    /// is created but never written through.
    pub allow_external_symlinks: bool,
    /// Paths whose symlink may have an absolute target without `..` (the
    /// cache manifest's `pack.absolute_symlinks`); every other entry keeps
    /// every rule. Such a link is created but never written through.
    pub absolute_symlinks: Vec<crate::glob::Pattern>,
    /// Threads that create regular files of at most 1 MiB while the main
    /// thread keeps reading the archive (`None`: the measured default, 2;
    /// `Some(0)`: the main thread creates every file itself).
    pub writers: Option<usize>,
}

/// What an unpack or merge did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// Bytes of file content written.
    pub bytes: u64,
}

/// Test-only kill points: when the environment variable
/// `WARMSTART_TEST_KILL_AT` equals `name`, the process kills itself with
/// SIGKILL right there, leaving the disk exactly as a crash would. Unit tests
/// use a thread-local instead (see `tests`), which unwinds without cleanup.
pub(crate) fn kill_point(name: &str) {
    #[cfg(test)]
    {
        if test_hook::armed(name) {
            std::panic::panic_any(test_hook::Killed(name.to_string()));
        }
    }
    if let Some(at) = std::env::var_os("WARMSTART_TEST_KILL_AT")
        && at == name
    {
        // SAFETY: raise(3) with a valid signal number has no preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}

/// fsync a directory so that renames inside it survive a power cut.
pub(crate) fn fsync_dir(dir: &std::path::Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
pub(crate) mod test_hook {
    //! A per-thread kill point for unit tests: the code under test unwinds at
    //! the named point, skipping all later steps, as a SIGKILL would.
    use std::cell::RefCell;

    thread_local! {
        static ARMED: RefCell<Option<String>> = const { RefCell::new(None) };
    }

    #[derive(Debug)]
    pub struct Killed(pub String);

    pub fn armed(name: &str) -> bool {
        ARMED.with(|a| {
            let hit = a.borrow().as_deref() == Some(name);
            if hit {
                *a.borrow_mut() = None;
            }
            hit
        })
    }

    /// Runs `f` with a kill armed at `point`; returns true if `f` was killed there.
    pub fn run_killed_at<T>(point: &str, f: impl FnOnce() -> T) -> bool {
        ARMED.with(|a| *a.borrow_mut() = Some(point.to_string()));
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
        ARMED.with(|a| *a.borrow_mut() = None);
        match result {
            Ok(_) => false,
            Err(payload) => match payload.downcast::<Killed>() {
                Ok(k) => {
                    assert_eq!(k.0, point);
                    true
                }
                Err(other) => std::panic::resume_unwind(other),
            },
        }
    }
}
