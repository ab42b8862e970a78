//! The local record of the last publish of a cache: which branch commit holds
//! which tar, packed with which zstd parameters.
//!
//! `cache publish` writes `<state>/cache/packed/<name>.json` after every
//! publish that ended with the branch holding this clone's bytes (published,
//! or found unchanged). The next publish of the same key reads it: when the
//! branch still points at the recorded commit, and the recorded pack
//! parameters (zstd version, level, chunk size) are today's, the chunks on
//! the branch are exactly what packing the same tar again would produce. So
//! publish only has to compute the tar's sha256 (no zstd, no git objects) to
//! know whether the artifact changed: that is the same test the full path
//! makes (`same_artifact`), on the same bytes, only cheaper.
//!
//! The record is a cache of a fact, never a source of truth: a missing,
//! unreadable or stale record means "pack in full". This module is the
//! format and its file I/O only; it never decides what to publish.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The `format` field of records this build writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// One cache's record: `<state>/cache/packed/<name>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub format: u32,
    pub name: String,
    pub key: String,
    pub branch: String,
    /// The branch commit whose `warmstart.json` entry for `key` holds this tar.
    pub commit: String,
    pub tar_sha256: String,
    pub tar_size: u64,
    /// `pack_params(level, chunk_bytes)` when the chunks were made.
    pub pack: String,
}

/// Everything besides the tar that decides the chunk bytes: the zstd
/// library version (another version may compress differently), the level
/// and the chunk sizes (`chunk_bytes` and the ramp of the first chunks).
pub fn pack_params(level: i32, chunk_bytes: u64) -> String {
    let ramp = crate::cache::pack::RAMP.map(|r| r.to_string()).join(",");
    format!(
        "zstd {} level {level} chunk_bytes {chunk_bytes} ramp {ramp}",
        zstd::zstd_safe::version_string()
    )
}

/// Where the record of cache `name` lives.
pub fn path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("packed")
        .join(format!("{name}.json"))
}

/// The record at `path`, or `None` when it is absent, unreadable or of
/// another format (all mean: pack in full).
pub fn load(path: &Path) -> Option<Record> {
    let bytes = std::fs::read(path).ok()?;
    let r: Record = serde_json::from_slice(&bytes).ok()?;
    (r.format == RECORD_FORMAT).then_some(r)
}

/// Writes the record atomically (temp file, rename), creating its directory.
pub fn save(path: &Path, r: &Record) -> Result<()> {
    let dir = path.parent().context("a record path has a parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let mut text = serde_json::to_string_pretty(r).expect("a record serializes");
    text.push('\n');
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming onto {}", path.display()))
}

impl Record {
    /// True when this record vouches for `commit`'s entry of `key`, whose
    /// tar is `tar_sha256`/`tar_size`, packed with today's `pack` params.
    pub fn vouches_for(
        &self,
        key: &str,
        commit: &str,
        tar_sha256: &str,
        tar_size: u64,
        pack: &str,
    ) -> bool {
        self.format == RECORD_FORMAT
            && self.key == key
            && self.commit == commit
            && self.tar_sha256 == tar_sha256
            && self.tar_size == tar_size
            && self.pack == pack
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            format: RECORD_FORMAT,
            name: "sdk".into(),
            key: "linux-1".into(),
            branch: "sdk-cache".into(),
            commit: "c".repeat(40),
            tar_sha256: "a".repeat(64),
            tar_size: 10240,
            pack: pack_params(3, 99 << 20),
        }
    }

    #[test]
    fn records_round_trip_and_vouch_only_for_their_exact_state() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "sdk");
        assert_eq!(load(&p), None);
        let r = record();
        save(&p, &r).unwrap();
        let back = load(&p).unwrap();
        assert_eq!(back, r);
        let (c, t, params) = ("c".repeat(40), "a".repeat(64), pack_params(3, 99 << 20));
        assert!(back.vouches_for("linux-1", &c, &t, 10240, &params));
        assert!(!back.vouches_for("linux-2", &c, &t, 10240, &params));
        assert!(!back.vouches_for("linux-1", &"d".repeat(40), &t, 10240, &params));
        assert!(!back.vouches_for("linux-1", &c, &"b".repeat(64), 10240, &params));
        assert!(!back.vouches_for("linux-1", &c, &t, 10752, &params));
        assert!(!back.vouches_for("linux-1", &c, &t, 10240, &pack_params(4, 99 << 20)));
        assert!(!back.vouches_for("linux-1", &c, &t, 10240, &pack_params(3, 50 << 20)));
    }

    #[test]
    fn unreadable_or_foreign_records_mean_pack_in_full() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "sdk");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, "{ not json").unwrap();
        assert_eq!(load(&p), None);
        let mut r = record();
        r.format = RECORD_FORMAT + 1;
        std::fs::write(&p, serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(load(&p), None);
    }
}
