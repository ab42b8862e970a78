//! What a file in a target is now (kind, size, mtime, inode), read through
//! directory handles beneath the target root: the overlay mode's record of
//! what an install wrote, and its test of what the user changed since.
//!
//! Reads only (`fstatat` with `AT_SYMLINK_NOFOLLOW` under a handle from
//! `beneath::open_beneath`), so a symlink the target holds can never make
//! it look outside; a path whose parent is missing, not a directory, or
//! leaves the root reads as absent. Never writes.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io;
use std::path::{Component, Path, PathBuf};

use super::beneath::{Dir, Links, kind, open_beneath};

/// A file's identity as an install saw it. Archive mtimes are fixed, so
/// "newer" says nothing: any difference means someone else wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ident {
    /// File-type bits (`S_IFREG`, `S_IFLNK`, ...).
    pub kind: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub ino: u64,
    pub dev: u64,
}

/// The identity of each of `rels` (relative paths) beneath `root`; `None`
/// where there is nothing (or nothing reachable beneath the root).
pub fn identities(root: &Path, rels: &[PathBuf]) -> Result<Vec<Option<Ident>>> {
    let dir = match Dir::open_path(root) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(vec![None; rels.len()]),
        Err(e) => return Err(e).with_context(|| format!("opening {}", root.display())),
    };
    rels.iter()
        .map(|rel| one(&dir, rel).with_context(|| format!("reading {}", root.join(rel).display())))
        .collect()
}

fn one(root: &Dir, rel: &Path) -> io::Result<Option<Ident>> {
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{}` is not a plain relative path", rel.display()),
        ));
    }
    let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
        return Ok(None);
    };
    let dir = match open_beneath(root, parent, Links::Beneath) {
        Ok(d) => d,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOENT | libc::ENOTDIR | libc::EXDEV | libc::ELOOP)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(dir.lstat_at(name)?.map(|st| Ident {
        kind: kind(&st),
        size: st.st_size as u64,
        mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
        ino: st.st_ino,
        dev: st.st_dev,
    }))
}
