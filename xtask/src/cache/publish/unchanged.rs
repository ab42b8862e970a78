//! What this clone's last pack of a cache read and made, entry by entry
//! and chunk by chunk, so that the next publish from this clone takes the
//! chunks of every unchanged run of entries as they are: not cut, hashed
//! or compressed again, not even written to cache.git (`chunks::Skips`).
//!
//! An entry counts as unchanged the way git's index counts a file clean:
//! the same lstat (device, inode, mode, size, mtime and ctime in ns) as
//! when that pack planned it, and neither time later than
//! `packed::RACY_WINDOW_NS` before that plan began (a write in the plan's
//! own timestamp tick could keep both times). A write, truncate, rename or
//! chmod since sets ctime, which user space cannot set back. A run of
//! unchanged entries that lay side by side in that tar is the same bytes
//! in today's, so the chunks that lay wholly inside it are today's chunks
//! wherever today's cuts reach one of their starts: a cut depends only on
//! the bytes since the previous cut.
//!
//! The tar's sha256 is still computed over every byte: it is signed, and
//! SHA-256 has no shortcut over unchanged spans. So an unchanged file is
//! read once, for that digest alone (its content digest comes from here).
//!
//! The record, `<state>/cache/packed/<name>.files`, is this clone's own
//! word: no pusher writes it, and nothing from the branch is trusted here.
//! A chunk is used only while its blob is in cache.git at the recorded
//! size. A missing, unreadable or other-parameter record means "pack in
//! full"; this module never decides what to publish.

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::cache::format::files;
use crate::cache::publish::chunks::{KnownFrame, Skips};
use crate::cache::publish::pack::{self, Item, Kind, Known, Packed, Plan, Stat};
use crate::cache::publish::packed::RACY_WINDOW_NS;
use crate::hex;

const FORMAT: u32 = 1;

/// Where the record of cache `name` lives, beside `packed::path`'s.
pub fn path(state_dir: &Path, name: &str) -> PathBuf {
    state_dir
        .join("cache")
        .join("packed")
        .join(format!("{name}.files"))
}

/// The first line of the record.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
struct Header {
    format: u32,
    /// `packed::pack_params` of the pack.
    pack: String,
    /// The pack root, hex of its bytes.
    root: String,
    keep_mtime: bool,
    planned_at_ns: i64,
    tar_size: u64,
    entries: usize,
    chunks: usize,
}

/// A record read back.
pub struct Record {
    header: Header,
    chunks: Vec<KnownFrame>,
    stats: Vec<Stat>,
    index: files::Index,
}

/// Writes the record of `packed`, made from `plan` (planned from
/// `planned_at_ns`) with `params`, its chunks' blobs being `oids` by chunk
/// index. A pack whose chunks were split to fit the limit leaves none
/// (its chunks are not cuts).
pub fn save(
    path: &Path,
    plan: &Plan,
    planned_at_ns: i64,
    params: &str,
    packed: &Packed,
    oids: &BTreeMap<usize, String>,
) -> Result<()> {
    if packed.split || packed.index.entries.len() != plan.items.len() {
        let _ = std::fs::remove_file(path);
        return Ok(());
    }
    let header = Header {
        format: FORMAT,
        pack: params.to_string(),
        root: hex::encode(plan.root.as_os_str().as_bytes()),
        keep_mtime: plan.keep_mtime,
        planned_at_ns,
        tar_size: packed.tar.size,
        entries: plan.items.len(),
        chunks: packed.chunks.len(),
    };
    let mut text = serde_json::to_string(&header).expect("a header serializes");
    text.push('\n');
    for c in &packed.chunks {
        let oid = oids
            .get(&c.index)
            .ok_or_else(|| anyhow!("chunk {} has no blob", c.index))?;
        text.push_str(&format!(
            "{} {} {} {} {oid}\n",
            c.raw_size, c.raw_sha256, c.size, c.sha256
        ));
    }
    for item in &plan.items {
        let s = &item.stat;
        text.push_str(&format!(
            "{} {} {} {} {} {}\n",
            s.dev, s.ino, s.mode, s.size, s.mtime_ns, s.ctime_ns
        ));
    }
    text.push_str(&packed.index.render());
    crate::fsio::write_atomic(path, text.as_bytes())
}

/// The record at `path`, or `None` when it is absent or unreadable.
pub fn load(path: &Path) -> Option<Record> {
    let text = std::fs::read_to_string(path).ok()?;
    parse(&text).ok()
}

fn parse(text: &str) -> Result<Record> {
    let (first, mut rest) = text.split_once('\n').context("no header")?;
    let header: Header = serde_json::from_str(first)?;
    if header.format != FORMAT {
        bail!("format {}", header.format);
    }
    let mut line = || -> Result<&str> {
        let (l, r) = rest.split_once('\n').context("truncated")?;
        rest = r;
        Ok(l)
    };
    let mut chunks = Vec::with_capacity(header.chunks);
    for _ in 0..header.chunks {
        let f: Vec<&str> = line()?.split(' ').collect();
        let [raw_size, raw_sha256, size, sha256, oid] = f[..] else {
            bail!("a chunk line");
        };
        chunks.push(KnownFrame {
            raw_size: raw_size.parse()?,
            raw_sha256: raw_sha256.to_string(),
            size: size.parse()?,
            sha256: sha256.to_string(),
            oid: oid.to_string(),
        });
    }
    let mut stats = Vec::with_capacity(header.entries);
    for _ in 0..header.entries {
        let f: Vec<&str> = line()?.split(' ').collect();
        let [dev, ino, mode, size, mtime_ns, ctime_ns] = f[..] else {
            bail!("a stat line");
        };
        stats.push(Stat {
            dev: dev.parse()?,
            ino: ino.parse()?,
            mode: mode.parse()?,
            size: size.parse()?,
            mtime_ns: mtime_ns.parse()?,
            ctime_ns: ctime_ns.parse()?,
        });
    }
    let index = files::Index::parse(rest)?;
    if index.entries.len() != header.entries {
        bail!(
            "{} index entries for {}",
            index.entries.len(),
            header.entries
        );
    }
    Ok(Record {
        header,
        chunks,
        stats,
        index,
    })
}

impl Record {
    /// The blob ids this record's chunks need, with their sizes.
    pub fn blobs(&self) -> Vec<String> {
        self.chunks.iter().map(|c| c.oid.clone()).collect()
    }

    /// What this record knows of today's `plan` packed with `params`,
    /// given the size of each chunk's blob in cache.git (`None`: absent);
    /// `None` when it knows nothing.
    pub fn known(&self, plan: &Plan, params: &str, blob_sizes: &[Option<u64>]) -> Option<Known> {
        let h = &self.header;
        let same_pack = h.pack == params
            && h.keep_mtime == plan.keep_mtime
            && h.root == hex::encode(plan.root.as_os_str().as_bytes())
            && blob_sizes.len() == self.chunks.len();
        if !same_pack {
            return None;
        }
        let by_path: HashMap<&[u8], usize> = (self.index.entries.iter().enumerate())
            .map(|(j, e)| (e.path.as_slice(), j))
            .collect();
        let mut digests = vec![None; plan.items.len()];
        // Runs of unchanged entries that were side by side: (today's
        // offset, the old offset, length).
        let mut spans: Vec<(u64, u64, u64)> = Vec::new();
        let (mut at, mut prev) = (0u64, None::<usize>);
        for (i, item) in plan.items.iter().enumerate() {
            let len = pack::entry_len(item, plan.keep_mtime);
            let old = by_path.get(item.rel.as_slice()).copied();
            match old.filter(|&j| self.unchanged(item, j, len)) {
                Some(j) => {
                    digests[i] = self.index.entries[j].sha256;
                    let e = &self.index.entries[j];
                    match spans.last_mut() {
                        Some(s) if prev.is_some_and(|p| p + 1 == j) => s.2 += len,
                        _ => spans.push((at, e.offset, len)),
                    }
                    prev = Some(j);
                }
                None => prev = None,
            }
            at += len;
        }
        // Two zero blocks end both tars: they extend a run that ends both.
        let last = self.index.entries.len().checked_sub(1);
        if let (Some(s), Some(p)) = (spans.last_mut(), prev)
            && Some(p) == last
            && self.index.entries[p].end + 1024 == h.tar_size
        {
            s.2 += 1024;
        }
        let skips = self.skips(&spans, blob_sizes);
        Some(Known { digests, skips })
    }

    /// True when `item` is entry `j` of the recorded pack, unchanged, and
    /// its tar entry (`len` bytes today) is the bytes it was.
    fn unchanged(&self, item: &Item, j: usize, len: u64) -> bool {
        let (e, was) = (&self.index.entries[j], &self.stats[j]);
        let racy = self.header.planned_at_ns.saturating_sub(RACY_WINDOW_NS);
        let kind = match (&item.kind, e.kind) {
            (Kind::Dir, files::Kind::Dir) | (Kind::File, files::Kind::File) => true,
            (Kind::Symlink(t), files::Kind::Symlink)
            | (Kind::Hardlink(t), files::Kind::Hardlink) => {
                e.target.as_deref() == Some(t.as_slice())
            }
            _ => false,
        };
        kind && e.mode == item.mode
            && e.end - e.offset == len
            && *was == item.stat
            && item.stat.mtime_ns < racy
            && item.stat.ctime_ns < racy
            && (item.kind != Kind::File || (e.size == item.size && e.sha256.is_some()))
    }

    /// The runs of whole recorded chunks inside `spans`, keyed by where
    /// each chunk starts in today's tar; a chunk whose blob is not in
    /// cache.git at its size ends a run and starts none.
    fn skips(&self, spans: &[(u64, u64, u64)], blob_sizes: &[Option<u64>]) -> Skips {
        let mut starts = Vec::with_capacity(self.chunks.len() + 1);
        let mut off = 0u64;
        for c in &self.chunks {
            starts.push(off);
            off += c.raw_size;
        }
        starts.push(off);
        let here = |k: usize| blob_sizes[k] == Some(self.chunks[k].size);
        let mut at = BTreeMap::new();
        for &(new, old, len) in spans {
            let first = starts.partition_point(|&s| s < old);
            let mut end = first;
            while end < self.chunks.len() && starts[end + 1] <= old + len {
                end += 1;
            }
            // Runs end at a missing blob; each chunk start maps to the
            // rest of its run.
            let mut run_end = end;
            for k in (first..end).rev() {
                if !here(k) {
                    run_end = k;
                    continue;
                }
                at.insert(new + (starts[k] - old), (k, run_end));
            }
        }
        Skips {
            at,
            frames: self.chunks.clone(),
        }
    }
}
