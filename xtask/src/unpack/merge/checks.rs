//! The checks the merge's preflight and its apply step both make on one
//! staged entry: where its parent is in the prefix, what a symlink of the
//! prefix on the way leads to, whether a staged symlink leaves the prefix,
//! and the refusals that name both paths. It also holds the one-handle
//! cache of the directory the last entry was in.
//!
//! Nothing here moves or creates anything in the prefix; it only opens and
//! reads through directory handles found beneath the prefix root.

use anyhow::{Context, Result};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::exit::{Code, fail};
use crate::unpack::beneath::{Dir, Links, escapes, is_link, open_beneath};
use crate::unpack::journal::Journal;

/// A staged path's parent (empty for the root) and final name.
pub(super) fn split(rel: &Path) -> Result<(&Path, &OsStr)> {
    match (rel.parent(), rel.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => anyhow::bail!("`{}` is not a path inside the package", rel.display()),
    }
}

pub(super) fn file_meets_dir(plan: &Journal, rel: &Path) -> anyhow::Error {
    fail(
        Code::Unsafe,
        format!(
            "cannot merge into {}: {} is a file but the package has a directory `{}/` there; move it away, then run again",
            plan.prefix.display(),
            plan.prefix.join(rel).display(),
            rel.display()
        ),
    )
}

pub(super) fn dir_meets_file(plan: &Journal, rel: &Path) -> anyhow::Error {
    fail(
        Code::Unsafe,
        format!(
            "cannot merge into {}: {} is a directory but the package has a file `{}` there; move it away, then run again",
            plan.prefix.display(),
            plan.prefix.join(rel).display(),
            rel.display()
        ),
    )
}

/// The parent directory of a staged entry in the prefix (placed by
/// `preflight`, so an error here means the prefix changed under the lock).
pub(super) fn open_parent(root: &Dir, plan: &Journal, parent_rel: &Path) -> Result<Dir> {
    open_beneath(root, parent_rel, Links::Beneath).map_err(|e| {
        let at = plan.prefix.join(parent_rel);
        if escapes(&e) {
            fail(
                Code::Unsafe,
                format!(
                    "cannot merge into {}: {} leads outside it through a symlink; move the link away, then run again",
                    plan.prefix.display(),
                    at.display()
                ),
            )
        } else {
            anyhow::Error::new(e).context(format!("opening {}", at.display()))
        }
    })
}

/// The directory a staged directory `rel` reaches through the symlink
/// `name` of the prefix (in `dst`), if that link resolves to a directory
/// beneath the prefix; otherwise the refusal naming both paths.
pub(super) fn through_link(
    root: &Dir,
    plan: &Journal,
    rel: &Path,
    dst: &Dir,
    name: &OsStr,
) -> Result<Dir> {
    let err = match open_beneath(root, rel, Links::Beneath) {
        Ok(d) => return Ok(d),
        Err(e) => e,
    };
    let target = dst
        .read_link_at(name)
        .map(|t| t.to_string_lossy().into_owned())
        .unwrap_or_default();
    let why = if escapes(&err) {
        format!("which leads outside {}", plan.prefix.display())
    } else if matches!(
        err.raw_os_error(),
        Some(libc::ENOTDIR | libc::ENOENT | libc::ELOOP)
    ) {
        format!("which is not a directory inside {}", plan.prefix.display())
    } else {
        return Err(err).with_context(|| format!("opening {}", plan.prefix.join(rel).display()));
    };
    Err(fail(
        Code::Unsafe,
        format!(
            "cannot merge into {}: the package has a directory `{}/` but {} is a symlink to `{target}`, {why}; nothing was installed: move the link away, then run again",
            plan.prefix.display(),
            rel.display(),
            plan.prefix.join(rel).display()
        ),
    ))
}

/// Whether the journal's `absolute_symlinks` allow this staged link: an
/// absolute target without `..`, at a matching path (the extractor's rule).
fn allowed_absolute(plan: &Journal, rel: &Path, target: &[u8]) -> bool {
    if target.first() != Some(&b'/') || plan.absolute_symlinks.is_empty() {
        return false;
    }
    let patterns: Vec<_> = plan
        .absolute_symlinks
        .iter()
        .filter_map(|g| crate::glob::Pattern::new(g).ok())
        .collect();
    crate::unpack::check_symlink_target_with(rel, target, &patterns).is_ok()
}

/// Refuses a staged symlink (in the staging directory `staged`) whose target
/// leaves the prefix from the directory it lands in, `depth` real levels
/// below the prefix root (unless the merge allows external symlinks).
pub(super) fn judge_link(
    plan: &Journal,
    staged: &Dir,
    rel: &Path,
    depth: usize,
    lands_in: Option<&Dir>,
) -> Result<()> {
    let (_, name) = split(rel)?;
    let Some(st) = staged
        .lstat_at(name)
        .with_context(|| format!("reading {}", plan.staging.join(rel).display()))?
    else {
        return Ok(()); // moved by an interrupted run
    };
    if plan.external_symlinks || !is_link(&st) {
        return Ok(());
    }
    let target = staged
        .read_link_at(name)
        .with_context(|| format!("reading the symlink {}", plan.staging.join(rel).display()))?;
    if !climbs_out(target.as_bytes(), depth) || allowed_absolute(plan, rel, target.as_bytes()) {
        return Ok(());
    }
    let at = lands_in
        .and_then(Dir::shown)
        .map(|d| d.join(name))
        .unwrap_or_else(|| plan.prefix.join(rel));
    Err(fail(
        Code::Unsafe,
        format!(
            "refusing symlink `{}` -> `{}`: it lands at {} (through symlinks of {}), from where it leads outside the prefix; nothing was installed",
            rel.display(),
            target.to_string_lossy(),
            at.display(),
            plan.prefix.display()
        ),
    ))
}

/// Whether a symlink target, read from a directory `depth` levels below the
/// root, can resolve outside it: absolute, more leading `..` than `depth`,
/// or a `..` after a name (which climbs from wherever that name leads).
pub(super) fn climbs_out(target: &[u8], depth: usize) -> bool {
    if target.first() == Some(&b'/') {
        return true;
    }
    let mut level = depth;
    let mut seen_name = false;
    for comp in target.split(|&b| b == b'/') {
        match comp {
            b"" | b"." => {}
            b".." if seen_name => return true,
            b".." => match level.checked_sub(1) {
                Some(l) => level = l,
                None => return true,
            },
            _ => seen_name = true,
        }
    }
    false
}

/// The handle on the directory the last entry was in. Entries come depth
/// first, so most reuse it, and at most one handle per side is open however
/// many directories the tree has (one per directory could exhaust the
/// process's descriptors). A directory something was renamed into is
/// fsynced when the slot moves on, and by `flush` at the end.
#[derive(Default)]
pub(super) struct Slot {
    at: Option<(PathBuf, Dir)>,
    pub(super) touched: bool,
}

impl Slot {
    pub(super) fn get(
        &mut self,
        rel: &Path,
        shown: &Path,
        open: impl FnOnce() -> Result<Dir>,
    ) -> Result<&Dir> {
        if self.at.as_ref().is_none_or(|(r, _)| r != rel) {
            self.flush(shown)?;
            self.at = None;
            self.at = Some((rel.to_path_buf(), open()?));
        }
        Ok(&self.at.as_ref().expect("set above").1)
    }

    /// Syncs the directory if something was renamed into it (`shown` is the
    /// root it is relative to, for messages).
    pub(super) fn flush(&mut self, shown: &Path) -> Result<()> {
        if self.touched
            && let Some((rel, dir)) = &self.at
        {
            dir.sync()
                .with_context(|| format!("syncing {}", shown.join(rel).display()))?;
        }
        self.touched = false;
        Ok(())
    }
}
