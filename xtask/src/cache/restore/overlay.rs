//! `restore.mode = "overlay"`: install into a target the user also writes
//! (a verification cache), never replacing a file the user changed.
//!
//! Overlay is merge mode (journaled, through `unpack::merge_into`, nothing
//! the snapshot lacks is removed) with one more rule: a staged file whose
//! path the target already holds is installed only if that file is still
//! exactly what warmstart installed there, by the identity this module
//! recorded per file (kind, size, mtime, inode, device) in
//! `<state>/cache/overlay/<name>.json`. Archive mtimes are fixed, so
//! "newer" cannot be told from them; any difference, or a file warmstart
//! never installed, means someone else wrote it, and it is kept (taken out
//! of staging before the merge, and counted). The record is written before
//! the merge with the staged files' identities (a rename keeps them), so a
//! merge a `kill -9` interrupted and the next run completed leaves files
//! the record knows; after the merge it is checked against the target.
//!
//! Left open: a file the user writes between `hold_back` and the merge's
//! rename of that file is replaced (a window of milliseconds, per run).
//! Reads the target only through `unpack::identities` (directory handles);
//! removes files only from its own staging directory.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::unpack::{self, Ident};

/// The `format` of records this build writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// What the overlay installs of one cache wrote, per file.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub target: PathBuf,
    /// Relative path (as text) -> identity right after it was installed.
    pub files: BTreeMap<String, Ident>,
}

/// `<state>/cache/overlay/<name>.json`.
pub fn path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("overlay")
        .join(format!("{name}.json"))
}

/// The record of `target`, or an empty one: none yet, another target, or
/// one that cannot be read (with a warning). Empty is the safe side: every
/// file already in the target counts as the user's and is kept.
pub fn load(file: &Path, target: &Path) -> Record {
    let empty = Record {
        format: RECORD_FORMAT,
        target: target.to_path_buf(),
        files: BTreeMap::new(),
    };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return empty,
        Err(e) => {
            eprintln!(
                "warning: cannot read {} ({e}): every file already in {} is kept as the user's",
                file.display(),
                target.display()
            );
            return empty;
        }
    };
    match serde_json::from_str::<Record>(&text) {
        Ok(r) if r.format == RECORD_FORMAT && r.target == target => r,
        Ok(_) => empty,
        Err(e) => {
            eprintln!(
                "warning: {} is not an overlay record ({e}): every file already in {} is kept as the user's",
                file.display(),
                target.display()
            );
            empty
        }
    }
}

/// Writes the record atomically.
pub fn save(file: &Path, record: &Record) -> Result<()> {
    let text = serde_json::to_string_pretty(record).expect("record serializes") + "\n";
    crate::fsio::write_atomic(file, text.as_bytes())
}

/// Every staged entry that is not a directory, relative, sorted. Staging is
/// this run's own directory, so it is walked by path.
fn staged_entries(staging: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = staging.join(&rel);
        for e in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let e = e.with_context(|| format!("reading {}", dir.display()))?;
            let rel = rel.join(e.file_name());
            if e.file_type()?.is_dir() {
                stack.push(rel);
            } else {
                out.push(rel);
            }
        }
    }
    out.sort();
    Ok(out)
}

fn key(rel: &Path) -> String {
    rel.to_string_lossy().into_owned()
}

/// What an overlay install will do.
#[derive(Clone, Debug, Default)]
pub struct Plan {
    /// Staged entries the target lacks, or holds exactly as installed.
    pub installs: Vec<PathBuf>,
    /// Entries the user changed or made: taken out of staging, kept.
    pub kept: Vec<PathBuf>,
    /// The record to write before the merge (installs with their staged
    /// identities, every other path as it was).
    pub record: Record,
}

/// Judges each staged entry against the target and the record, removes the
/// kept ones from staging, and returns the plan.
pub fn hold_back(staging: &Path, target: &Path, record: &Record) -> Result<Plan> {
    let entries = staged_entries(staging)?;
    let now = unpack::identities(target, &entries)?;
    let mut plan = Plan {
        record: record.clone(),
        ..Plan::default()
    };
    for (rel, cur) in entries.into_iter().zip(now) {
        let ours = match cur {
            None => true,
            Some(c) => record.files.get(&key(&rel)) == Some(&c),
        };
        if ours {
            plan.installs.push(rel);
        } else {
            let p = staging.join(&rel);
            std::fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
            plan.kept.push(rel);
        }
    }
    let staged = unpack::identities(staging, &plan.installs)?;
    for (rel, id) in plan.installs.iter().zip(staged) {
        if let Some(id) = id {
            plan.record.files.insert(key(rel), id);
        }
    }
    Ok(plan)
}

/// After the merge: the record with what the target really holds for each
/// installed path (the same as staged, unless the merge had to copy).
pub fn settle(target: &Path, plan: &Plan) -> Result<Record> {
    let mut record = plan.record.clone();
    let now = unpack::identities(target, &plan.installs)?;
    for (rel, id) in plan.installs.iter().zip(now) {
        match id {
            Some(id) => record.files.insert(key(rel), id),
            None => record.files.remove(&key(rel)),
        };
    }
    Ok(record)
}
