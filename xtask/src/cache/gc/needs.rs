//! The record of what each install needs from the chunk store
//! (`<state>/cache/needs/<name>.json`), written after the stamp, and how gc
//! tells a stamp's chunks when that record is missing. It never removes a
//! file: choosing what goes is `chunks`'.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::SystemTime;

use crate::cache::format::BranchManifest;
use crate::cache::restore::branch::{Branch, Content};
use crate::cache::restore::stamp::Stamp;
use crate::git::CacheGit;

pub(super) const NEEDS_FORMAT: u32 = 1;

/// What one install needs from the chunk store: `<state>/cache/needs/<name>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Needs {
    pub format: u32,
    pub name: String,
    /// The installed key and tar, as the stamp says (a record that does
    /// not match the stamp is stale).
    pub key: String,
    pub tar_sha256: String,
    pub commit: String,
    pub chunks: Vec<Need>,
}

/// One chunk: the digest its store file is named by, and its raw digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Need {
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_sha256: Option<String>,
    pub size: u64,
}

/// Where the record of cache `name`'s install lives.
pub fn needs_path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("needs")
        .join(format!("{name}.json"))
}

/// After a completed install (the stamp is written): records which chunks
/// it needs and marks them used now. Never fails the restore: a record not
/// written only makes gc look the key up in cache.git, or keep every chunk.
pub fn installed(state_dir: &Path, s: &Stamp, branch: &Branch) {
    if let Err(e) = record(state_dir, s, branch) {
        eprintln!("warning: {e:#}; `cache gc` will keep every chunk it cannot account for");
    }
}

fn record(state_dir: &Path, s: &Stamp, branch: &Branch) -> Result<()> {
    let chunks = match &branch.content {
        Content::V1(bm) => needs_of(bm, &s.key),
        Content::Legacy { .. } => Vec::new(),
    };
    let chunk_dir = state_dir.join("cache.git").join("chunks");
    let now = SystemTime::now();
    for c in &chunks {
        // An mtime is how gc tells a recently used chunk: refresh it.
        if let Ok(f) = File::open(chunk_dir.join(&c.sha256)) {
            let _ = f.set_modified(now);
        }
    }
    let n = Needs {
        format: NEEDS_FORMAT,
        name: s.name.clone(),
        key: s.key.clone(),
        tar_sha256: s.tar_sha256.clone(),
        commit: s.commit.clone(),
        chunks,
    };
    let path = needs_path(state_dir, &s.name);
    let text = serde_json::to_string_pretty(&n).expect("needs serialize") + "\n";
    crate::fsio::write_atomic(&path, text.as_bytes())
        .with_context(|| format!("recording the chunks of {} in {}", s.key, path.display()))
}

fn needs_of(bm: &BranchManifest, key: &str) -> Vec<Need> {
    bm.keys
        .get(key)
        .map(|e| {
            e.chunks
                .iter()
                .map(|c| Need {
                    sha256: c.sha256.clone(),
                    raw_sha256: c.raw_sha256.clone(),
                    size: c.size,
                })
                .collect()
        })
        .unwrap_or_default()
}
/// The chunks stamp `s`'s install needs: its record when it matches the
/// stamp, else the `warmstart.json` of its commit in cache.git.
pub(super) fn needs_for(state_dir: &Path, s: &Stamp, git: Option<&CacheGit>) -> Option<Vec<Need>> {
    if s.layout != "v1" {
        // Legacy archives are read from cache.git's objects, never the store.
        return Some(Vec::new());
    }
    let recorded = std::fs::read_to_string(needs_path(state_dir, &s.name))
        .ok()
        .and_then(|t| serde_json::from_str::<Needs>(&t).ok())
        .filter(|n| n.format == NEEDS_FORMAT && n.key == s.key && n.tar_sha256 == s.tar_sha256);
    if let Some(n) = recorded {
        return Some(n.chunks);
    }
    let out = git?
        .git()
        .args(["cat-file", "blob", &format!("{}:warmstart.json", s.commit)])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    let bm = BranchManifest::parse(&String::from_utf8_lossy(&out.stdout)).ok()?;
    // The tar's digest ties the entry to the install the stamp describes.
    bm.keys
        .get(&s.key)
        .filter(|e| e.tar_sha256 == s.tar_sha256)?;
    Some(needs_of(&bm, &s.key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needs_records_round_trip() {
        let n = Needs {
            format: NEEDS_FORMAT,
            name: "art".into(),
            key: "art-1".into(),
            tar_sha256: "a".repeat(64),
            commit: "c".repeat(40),
            chunks: vec![Need {
                sha256: "b".repeat(64),
                raw_sha256: None,
                size: 3,
            }],
        };
        let text = serde_json::to_string(&n).unwrap();
        assert!(!text.contains("raw_sha256"), "{text}");
        assert_eq!(serde_json::from_str::<Needs>(&text).unwrap(), n);
    }
}
