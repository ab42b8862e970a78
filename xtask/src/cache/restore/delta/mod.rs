//! The delta install: a replace-mode restore of a new key into a
//! target that holds an older key warmstart installed builds the staging
//! tree from the installed one, so that an unchanged file is not written.
//!
//! What it relies on, and where each piece comes from:
//! - the new key's per-file index (`cache::format::files`, `<key>.files.zst` on the
//!   branch, or its parts `<key>.files.zst.part*` joined), trusted only once
//!   its size and sha256 match the key's entry in `warmstart.json` and it
//!   agrees with the key (entry count, tar size);
//! - the record this module wrote of the previous install's staging tree
//!   just before it was swapped in (`<state>/cache/installed/<name>.record`):
//!   each installed file's stat (dev, inode, size, mode, links, mtime,
//!   ctime), beside a copy of that key's index (`<name>.files.zst`), both
//!   bound to the stamp's key and tar. A full install's record is verified
//!   when its tar agreed with the index as it was unpacked (`vouch`).
//!
//! Why the record holds, from one delta to the next. The swap renames
//! directories only, so the stats taken before it are the installed
//! files', and any change made after it (through the target) moves a
//! ctime past the record (`record::settled_stats` keeps the coarse clock's
//! tick out of the way). What moves a recorded stat is then only this
//! module's own work, and all of it happens before the next record: the
//! link into staging (checked against the record just before it is made),
//! and the removal of the shadow (`unpack::Retire::Shadow`), the old tree's
//! names of the inodes the new tree shares, which the previous delta kept
//! instead of removing them after its record. So a linked file's link
//! count is 2 (the target's name and the shadow's) both when recorded and
//! when the next delta checks it, and its ctime has not moved since.
//!
//! A new file entry is hardlinked from the installed tree when an installed
//! file has the same content digest and its stat still equals the record
//! (so the user did not change it: content, mode, a rename, a symlink or a
//! directory in its place, a hardlink made to it, a `touch` with the mtime
//! put back, which moves the ctime); reflinked or copied where a hardlink
//! fails (another file system, too many links, another mode); else written
//! from the tar. Directories and symlinks are made from the index. Only the
//! chunks that hold an entry to write are decoded (with `frames` each chunk
//! is its own zstd frame at a known tar offset; without, the whole stream
//! is decoded and only those entries are written), each still hashed before
//! its first byte is decoded (`verify::stream`). Every entry written from
//! the tar is checked against the index (path, kind, size, mode, mtime,
//! sha256 of its bytes): any disagreement, and any entry a full install
//! would have to judge (`..`, a symlink leaving the tree, a duplicate),
//! stops the delta with a `Fallback`, and the caller installs in full.
//!
//! The index records no mtimes: a delta is tried only when the manifest
//! keeps the fixed mtime (`pack::FIXED_MTIME`), and every decoded header
//! must carry it. Every create goes through directory handles
//! (`unpack::Dir`), never following a symlink; the installed tree is only
//! read (`O_PATH` handles, then a link to that very inode). The staging
//! directory is swapped in by the caller, as for a full install.
//!
//! Left open: a write into an installed file in the moment between its
//! check and its link reaches the new tree (the same inode).

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::cache::fetch::prefetch;
use crate::cache::format::KeyEntry;
use crate::cache::format::files::{Entry, Index, Kind};
use crate::cache::publish::pack::FIXED_MTIME;
use crate::cache::restore::branch::{Branch, Content, KeyPlan};
use crate::cache::restore::stamp::{self, Loaded};
use crate::cache::restore::{self, verify};
use crate::git::CacheGit;
use crate::hex;
use crate::unpack::{self, Dir, Links};

mod build;
mod index;
mod record;
mod select;
#[cfg(test)]
mod tests;
mod tree;
mod vouch;
mod write;

pub use build::*;
pub use index::*;
pub use record::*;
use select::*;
use tree::*;

/// Why a delta install gave way to a full one: one line, no exit code (the
/// full install that follows decides).
#[derive(Debug)]
pub struct Fallback(pub String);

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fallback {}

fn fallback(why: impl std::fmt::Display) -> anyhow::Error {
    anyhow!(Fallback(why.to_string()))
}

/// The reason, when `e` is (or wraps) a `Fallback`.
pub fn fallback_reason(e: &anyhow::Error) -> Option<String> {
    e.chain()
        .find_map(|x| x.downcast_ref::<Fallback>())
        .map(|f| f.0.clone())
}

/// What the restore's staging directory was built from.
pub struct Staged {
    pub unpacked: unpack::Stats,
    pub verified: verify::Stats,
    pub fetched: prefetch::Stats,
    /// Set when it was a delta of the installed tree.
    pub delta: Option<Report>,
    /// Why a delta was tried and gave way to a full install.
    pub fallback: Option<String>,
    /// A full install whose tar agreed with the key's index, file for file
    /// (`vouch`): its record is as good as a delta's.
    pub vouched: bool,
}

/// What `stage` needs from the restore.
pub struct Ctx<'a> {
    pub git: &'a CacheGit,
    pub branch: &'a Branch,
    pub kp: &'a KeyPlan,
    pub name: &'a str,
    pub target: &'a Path,
    pub state_dir: &'a Path,
    pub stamp_file: &'a Path,
    /// The new key's index (`fetch_index`), when it has one.
    pub index: Option<&'a Result<NewIndex, String>>,
    /// Replace mode, no `--verify`, and the manifest keeps the fixed mtime.
    pub allowed: bool,
    pub progress: bool,
    /// The manifest's `pack.absolute_symlinks`, honoured as at pack time.
    pub absolute_symlinks: &'a [crate::glob::Pattern],
}

/// Builds the empty staging directory `dest`: as a delta of the installed
/// tree where `try_delta` can, else (after one line saying why, when a
/// delta was possible but refused) by a full unpack.
pub fn stage(ctx: &Ctx<'_>, dest: &Path) -> Result<Staged> {
    let why = match try_delta(ctx, dest) {
        Ok(Some(staged)) => return Ok(staged),
        Ok(None) => None,
        Err(e) => Some(fallback_reason(&e).ok_or(e)?),
    };
    if let Some(why) = &why {
        eprintln!("warning: {why}: installing {} in full", ctx.kp.key);
        // What the delta made so far goes; the same empty directory again.
        let again = unpack::staging_dir_for(ctx.target)?;
        anyhow::ensure!(again == dest, "staging moved to {}", again.display());
    }
    let index = match ctx.index {
        Some(Ok(new)) => Some(&new.index),
        _ => None,
    };
    let (unpacked, verified, fetched, vouched) = vouch::unpack_vouched(ctx, dest, index)?;
    Ok(Staged {
        unpacked,
        verified,
        fetched,
        delta: None,
        fallback: why,
        vouched,
    })
}

/// The delta, if the stamp, the record and the new index allow one:
/// `Ok(None)` when there is nothing to build from, `Err(Fallback)` when
/// something disagrees.
fn try_delta(ctx: &Ctx<'_>, dest: &Path) -> Result<Option<Staged>> {
    let (true, Some(new)) = (ctx.allowed, ctx.index) else {
        return Ok(None);
    };
    let key = &ctx.kp.key;
    let new = new
        .as_ref()
        .map_err(|why| fallback(format!("the file index of {key} cannot be used ({why})")))?;
    let Loaded::Found(s) = stamp::load(ctx.stamp_file) else {
        return Ok(None);
    };
    if s.mode != "replace" || s.target != ctx.target {
        return Ok(None);
    }
    let load = || installed(ctx.state_dir, ctx.name, &s.key, &s.tar_sha256, s.files);
    let busy = busy_path(ctx.state_dir, ctx.name);
    let old = match load() {
        // A delta was killed while it linked: its staging is gone
        // (`unpack::recover_swap`), the ctimes it moved are healed.
        Ok(Some(old)) if busy.exists() => match heal(ctx.state_dir, ctx.name, ctx.target, &old) {
            Ok(0) => old,
            Ok(_) => load().ok().flatten().unwrap_or(old),
            Err(e) => {
                eprintln!(
                    "warning: {e:#}; this restore of {} writes the files a killed one linked",
                    ctx.name
                );
                old
            }
        },
        Ok(Some(old)) => old,
        Ok(None) => return Ok(None),
        Err(why) => {
            return Err(fallback(format!(
                "the record of the installed {} cannot be used ({why})",
                s.key
            )));
        }
    };
    let Content::V1(bm) = &ctx.branch.content else {
        return Ok(None);
    };
    let entry = bm.keys.get(key).context("the key is on the branch")?;
    let mut got = None;
    let mut decode = |chunks: &[usize], consume: &mut dyn FnMut(&mut dyn Read) -> Result<()>| {
        let sub = sub_plan(ctx.kp, entry, chunks);
        let ((), v, f) = restore::stream_key(ctx.git, ctx.branch, &sub, ctx.progress, consume)?;
        got = Some((v, f));
        Ok(())
    };
    // Without it a kill costs the next delta its links, nothing else.
    let _ = std::fs::write(&busy, std::process::id().to_string());
    let report = build(
        dest,
        ctx.target,
        &new.index,
        entry,
        &old,
        &mut decode,
        ctx.absolute_symlinks,
    )
    .inspect_err(|e| {
        if fallback_reason(e).is_none() {
            // A failure (a full disk): the install stays as it is, and the
            // record true of it, so that a retry links again.
            heal_after_failure(ctx, dest, &old);
        }
    })?;
    let (mut verified, fetched) = got.context("the delta decoded nothing")?;
    verified.tar_sha256 = entry.tar_sha256.clone();
    Ok(Some(Staged {
        unpacked: report.stats,
        verified,
        fetched,
        delta: Some(report),
        fallback: None,
        vouched: false,
    }))
}

/// Removes what a failed delta staged (its links first), then renews the
/// record (`heal`). Anything that goes wrong here only costs the retry its
/// links: a warning.
fn heal_after_failure(ctx: &Ctx<'_>, dest: &Path, old: &Installed) {
    let healed =
        unpack::remove_tree(dest).and_then(|()| heal(ctx.state_dir, ctx.name, ctx.target, old));
    if healed.is_ok() {
        let _ = std::fs::remove_file(busy_path(ctx.state_dir, ctx.name));
    }
    if let Err(e) = healed {
        eprintln!(
            "warning: {e:#}; the next restore of {} writes every file again",
            ctx.name
        );
    }
}

/// The plan of just the chosen chunks: their concatenation decodes to their
/// raw slices of the tar (each is a whole zstd frame), which only the
/// chunk digests authenticate. Without frames the chosen are all of them.
fn sub_plan(kp: &KeyPlan, entry: &KeyEntry, chunks: &[usize]) -> KeyPlan {
    let mut sub = kp.clone();
    if chunks.len() == kp.plan.pieces.len() && entry.frames.is_none() {
        return sub;
    }
    sub.plan.pieces = chunks.iter().map(|&i| kp.plan.pieces[i].clone()).collect();
    sub.oids = chunks.iter().map(|&i| kp.oids[i].clone()).collect();
    let raw: u64 = chunks
        .iter()
        .map(|&i| entry.chunks[i].raw_size.unwrap_or(0))
        .sum();
    sub.plan.tar_size = Some(raw);
    sub.plan.tar_cap = raw;
    sub.plan.tar_sha256 = None;
    sub.plan.hash_tar = false;
    sub
}

/// The index of `key` on `branch`, fetched by id if the branch fetch left
/// it out, and checked (`check_index`): `None` when the key has none. An
/// index in parts is joined first (`join_parts`), each part taken from
/// `local` (the installed key's copy, `index_path`) where it can be.
pub fn fetch_index(
    git: &CacheGit,
    branch: &Branch,
    key: &str,
    local: &Path,
) -> Result<Option<Result<NewIndex, String>>> {
    let Content::V1(bm) = &branch.content else {
        return Ok(None);
    };
    let Some(entry) = bm.keys.get(key) else {
        return Ok(None);
    };
    let Some(i) = &entry.index else {
        return Ok(None);
    };
    if !entry.index_parts.is_empty() {
        return Ok(Some(
            join_parts(git, branch, entry, local)?.and_then(|bytes| check_index(bytes, entry)),
        ));
    }
    let Some(blob) = branch
        .entries
        .iter()
        .find(|e| e.name == i.file && e.kind == "blob")
    else {
        return Ok(Some(Err(format!(
            "{} is named in warmstart.json but not on branch {}",
            i.file, branch.name
        ))));
    };
    if blob.size.is_none() {
        prefetch::fetch_all(
            git,
            &branch.remote,
            &branch.name,
            std::slice::from_ref(&blob.oid),
        )
        .with_context(|| format!("fetching {} of branch {}", i.file, branch.name))?;
    }
    let mut bytes = Vec::new();
    git.read_blob(&blob.oid)?
        .take(i.size + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {} of branch {}", i.file, branch.name))?;
    Ok(Some(check_index(bytes, entry)))
}
