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
//! A record may also hold the stamp of the plan the tar was made from
//! (`tree`: `pack::Plan::stamp`, a digest of every entry's path, kind,
//! link target, mode, size, mtime and ctime in ns, inode and device) and
//! when that plan started. When today's plan has the same stamp and no
//! entry's mtime or ctime is later than `RACY_WINDOW_NS` before the
//! recorded plan, the files are the very ones that made the recorded tar,
//! so publish does not even hash it. This is git's index check, with its
//! "racily clean" rule. Two guards, each enough alone on a sane clock:
//! any write, truncate, rename, chmod or link after the recorded plan
//! sets the entry's ctime (user space cannot set it back) to at least
//! the plan's start, which the window rejects; and the stamp differs
//! (ctime, inode, size...), which also holds if the clock went back. An
//! edit in the very timestamp tick of the recorded plan could keep ctime
//! equal: the window, wider than any file system's tick, rejects those
//! entries too.
//!
//! `tree` is optional and older builds ignore unknown fields, so the
//! format stays 1 both ways: a record without it (an older build's) means
//! "hash the tar" as before, and the hash that finds the tar unchanged
//! writes the record again with today's stamp.
//!
//! The record is a cache of a fact, never a source of truth: a missing,
//! unreadable or stale record means "pack in full". This module is the
//! format and its file I/O only; it never decides what to publish.

use anyhow::Result;

use crate::cache::publish::pack::TreeStamp;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The `format` field of records this build writes and reads.
pub const RECORD_FORMAT: u32 = 1;

/// An entry whose mtime or ctime is this close to (or after) the start of
/// the recorded plan may have changed again within the same timestamp
/// tick after it was read, so it is not trusted (git's "racily clean").
/// Two seconds cover file systems with timestamps of up to 2 s (FAT's
/// mtime) and the coarse kernel clock of the others (a few ms).
pub const RACY_WINDOW_NS: i64 = 2_000_000_000;

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
    /// `pack_params(frames)` when the chunks were made.
    pub pack: String,
    /// The tree the tar was made from (absent in records of older builds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tree: Option<TreeRecord>,
}

/// The plan a recorded tar was made from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeRecord {
    /// `pack::TreeStamp::digest` of that plan.
    pub stamp: String,
    /// When that plan started, in ns since the epoch (before its first lstat).
    pub planned_at_ns: i64,
}

/// Everything besides the tar that decides the chunk bytes: the chunker
/// and its sizes, the zstd library version (another version may compress
/// differently) and its parameters, as `warmstart.json` records them, and
/// the file index beside the chunks (a record of an older build, which
/// wrote none, vouches for nothing).
pub fn pack_params(frames: &crate::cache::format::Frames) -> String {
    let f = frames;
    format!(
        "{} sizes {},{},{} zstd {} level {} window {:?} checksum {} index {} level {}",
        f.chunker,
        f.min_size,
        f.avg_size,
        f.max_size,
        f.zstd,
        f.level,
        f.window_log,
        f.checksum,
        crate::cache::format::files::MAGIC,
        crate::cache::publish::pack::INDEX_LEVEL
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

/// Writes the record atomically, creating its directory.
pub fn save(path: &Path, r: &Record) -> Result<()> {
    let mut text = serde_json::to_string_pretty(r).expect("a record serializes");
    text.push('\n');
    crate::fsio::write_atomic(path, text.as_bytes())
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

    /// True when a plan stamped `today` packs the recorded tar without a
    /// byte being read: the recorded plan had the same stamp, and no entry
    /// changed within `RACY_WINDOW_NS` before (or after) it was taken.
    /// Only meaningful together with `vouches_for`.
    pub fn same_tree(&self, today: &TreeStamp) -> bool {
        self.tree.as_ref().is_some_and(|t| {
            t.stamp == today.digest
                && today.newest_ns < t.planned_at_ns.saturating_sub(RACY_WINDOW_NS)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::chunk_sizes::Sizes;
    use crate::cache::publish::chunks::Params;

    fn pack_params(level: i32, avg: u64) -> String {
        let params = Params {
            level,
            window_log: None,
        };
        super::pack_params(&params.frames(Sizes::from_avg(avg)))
    }

    fn record() -> Record {
        Record {
            format: RECORD_FORMAT,
            name: "sdk".into(),
            key: "linux-1".into(),
            branch: "sdk-cache".into(),
            commit: "c".repeat(40),
            tar_sha256: "a".repeat(64),
            tar_size: 10240,
            pack: pack_params(3, 4 << 20),
            tree: Some(TreeRecord {
                stamp: "d".repeat(64),
                planned_at_ns: 1_800_000_000_000_000_000,
            }),
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
        let (c, t, params) = ("c".repeat(40), "a".repeat(64), pack_params(3, 4 << 20));
        assert!(back.vouches_for("linux-1", &c, &t, 10240, &params));
        assert!(!back.vouches_for("linux-2", &c, &t, 10240, &params));
        assert!(!back.vouches_for("linux-1", &"d".repeat(40), &t, 10240, &params));
        assert!(!back.vouches_for("linux-1", &c, &"b".repeat(64), 10240, &params));
        assert!(!back.vouches_for("linux-1", &c, &t, 10752, &params));
        assert!(!back.vouches_for("linux-1", &c, &t, 10240, &pack_params(4, 4 << 20)));
        assert!(!back.vouches_for("linux-1", &c, &t, 10240, &pack_params(3, 2 << 20)));
    }

    /// Same stamp and every entry older than the window: trusted. A change
    /// at the window's edge or later, another stamp, or no tree: not.
    #[test]
    fn the_tree_is_trusted_only_when_same_and_not_racy() {
        let r = record();
        let at = r.tree.as_ref().unwrap().planned_at_ns;
        let stamp = |digest: &str, newest_ns: i64| TreeStamp {
            digest: digest.into(),
            newest_ns,
        };
        let d = "d".repeat(64);
        assert!(r.same_tree(&stamp(&d, at - RACY_WINDOW_NS - 1)));
        assert!(r.same_tree(&stamp(&d, i64::MIN)));
        assert!(!r.same_tree(&stamp(&d, at - RACY_WINDOW_NS)));
        assert!(!r.same_tree(&stamp(&d, at - 1)));
        assert!(!r.same_tree(&stamp(&d, at + 1)));
        assert!(!r.same_tree(&stamp(&"e".repeat(64), at - RACY_WINDOW_NS - 1)));
        let old = Record { tree: None, ..r };
        assert!(!old.same_tree(&stamp(&d, at - RACY_WINDOW_NS - 1)));
    }

    /// A record written before `tree` existed still loads (and vouches for
    /// its commit): it just never spares the hash. The field is left out
    /// when absent, so such a record round-trips unchanged.
    #[test]
    fn records_without_a_tree_still_vouch() {
        let dir = tempfile::tempdir().unwrap();
        let p = path(dir.path(), "sdk");
        let params = pack_params(3, 4 << 20);
        let text = format!(
            r#"{{"format": 1, "name": "sdk", "key": "linux-1", "branch": "sdk-cache", "commit": "{}", "tar_sha256": "{}", "tar_size": 10240, "pack": "{params}"}}"#,
            "c".repeat(40),
            "a".repeat(64)
        );
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        let r = load(&p).unwrap();
        assert_eq!(r.tree, None);
        assert!(r.vouches_for("linux-1", &"c".repeat(40), &"a".repeat(64), 10240, &params));
        save(&p, &r).unwrap();
        assert!(!std::fs::read_to_string(&p).unwrap().contains("tree"));
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
