//! Packing a plan into chunk blobs in cache.git: chunk files in a scratch
//! directory next to the objects, each stored as a blob and deleted as soon
//! as git has it, and this key's entry for `warmstart.json`.
//!
//! A chunk whose raw sha256 some key on the branch lists (packed with
//! today's `frames`) is not compressed again when its frame is in
//! cache.git: the publisher's own clone made it, and a fresh clone fetches
//! the previous key's frames by id first when compressing costs more (the
//! level is `FETCH_FROM_LEVEL` or above). Every such frame is checked
//! (`chunks::check_reused`) before use. A blob the branch names for a
//! chunk stands for it only when its git id is the id of the bytes this
//! publish made: `warmstart.json` is a pusher's word, and a CI signature
//! over it must be over bytes that are there.
//!
//! Never holds more than a few chunk files on disk.

use anyhow::{Context, Result, anyhow};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::format::manifest::Key;
use crate::cache::format::{
    BranchManifest, Chunk, Frames, IndexFile, KeyEntry, archive_name, chunk_name, index_name,
    index_part_name,
};
use crate::cache::publish::pack::{self, ChunkFile, PackOptions, Plan};
use crate::cache::publish::report::Reporter;
use crate::cache::publish::unchanged;
use crate::git::{CacheGit, Remote};

/// The packed key, the blob ids of its files (chunks and index) by name,
/// and which chunks were already on the branch.
pub(super) struct PackedKey {
    pub(super) entry: KeyEntry,
    pub(super) oids: BTreeMap<String, String>,
    pub(super) reused: Vec<bool>,
    /// Chunks whose earlier frame was used instead of compressing again.
    pub(super) frames_reused: usize,
    /// Frames of the previous key fetched by id before packing.
    pub(super) frames_fetched: usize,
    /// Chunks taken from this clone's record (module `unchanged`).
    pub(super) frames_known: usize,
}

/// From this zstd level up, a fresh clone fetches the previous key's
/// frames by id rather than compress their chunks again. Measured on the
/// 2-core test machine, 515 MB of a toolchain's `lib` (99 chunks, 170 MB
/// of frames): a fetch of all 99 frames by id from a local bare remote
/// took 9.3 CPU s (git upload-pack and index-pack), compressing the whole
/// tar at level 3 about 6 CPU s of zstd; zstd's cost per byte grows about
/// 1.6x from level 3 to 4 and 2x to 5 (`zstd -b3 -e9` on a 48 MB sample).
/// Through a real network the fetch only costs more.
pub(super) const FETCH_FROM_LEVEL: i32 = 5;

/// What the branch as fetched offers a publish of `key`: its manifest and
/// the blob ids of its files, and the remote to fetch frames from.
pub(super) struct Prior<'a> {
    pub(super) branch: Option<&'a BranchManifest>,
    pub(super) oids: &'a BTreeMap<String, String>,
    pub(super) remote: &'a Remote,
    /// Where this clone keeps the record of its last pack of the cache
    /// (module `unchanged`), and when today's plan began.
    pub(super) record: &'a Path,
    pub(super) planned_at_ns: i64,
}

/// Packs the plan into chunk blobs in cache.git. Chunk files live in a
/// scratch directory inside cache.git (same file system as the objects) and
/// are deleted as soon as git has them; a chunk identical to the one the
/// branch already holds at that place is not written again.
pub(super) fn pack_into_git(
    git: &CacheGit,
    m: &CacheManifest,
    key: &Key,
    plan: &Plan,
    prior: Prior,
    out: &Reporter,
) -> Result<PackedKey> {
    let opts = PackOptions::new(m.level, m.chunk_sizes, m.chunk_bytes);
    let (old_oids, today) = (prior.oids, opts.params.frames(opts.sizes));
    let keys: Vec<&KeyEntry> = prior.branch.iter().flat_map(|b| b.keys.values()).collect();
    let frames_fetched = match previous_key(prior.branch, key, &today) {
        Some(prev) if m.level >= FETCH_FROM_LEVEL => {
            fetch_frames(git, prior.remote, prev, old_oids, out)
        }
        _ => 0,
    };
    let key = key.value.as_str();
    remove_dead_scratch(&git.dir);
    let scratch = Scratch::new(
        git.dir
            .join(format!("warmstart-publish-{}", std::process::id())),
    )?;
    // One chunk queued while git stores another and zstd fills a third:
    // disk use stays at a few chunks whatever the artifact's size.
    let (tx, rx) = mpsc::sync_channel::<ChunkFile>(1);
    let writer = spawn_blob_writer(git.clone(), rx);
    let mut reused = BTreeMap::new();
    let bar = out.bar(plan.file_bytes, "pack");
    // A chunk the branch holds already, at any place (content-defined cuts
    // move chunks, they do not change them): same bytes, same blob.
    let on_branch: BTreeMap<&str, &String> = keys
        .iter()
        .flat_map(|o| o.chunks.iter())
        .filter_map(|c| Some((c.sha256.as_str(), old_oids.get(&c.file)?)))
        .collect();
    let earlier = earlier_frames(&keys, old_oids, &today);
    let reuse = |raw_sha256: &str| local_blob(git, earlier.get(raw_sha256)?);
    let params = super::packed::pack_params(&today);
    let record = known_chunks(git, prior.record, plan, &params);
    let mut known = BTreeMap::new();
    let (mut frames_reused, mut frames_known) = (0, 0);
    let mut hasher = None;
    let mut tx = Some(tx);
    let result = pack::pack(
        plan,
        opts,
        &reuse,
        record.as_ref(),
        &scratch.path,
        // Scratch names only: the count, and so the width of the names on
        // the branch, is known once packing ends.
        &|i| format!("chunk-{i}"),
        &mut |c: ChunkFile| {
            frames_reused += usize::from(c.reused_frame);
            if let Some(oid) = &c.blob {
                frames_known += 1;
                // Reused as the branch means it only where the branch holds it.
                if on_branch.get(c.sha256.as_str()) == Some(&oid) {
                    reused.insert(c.index, oid.clone());
                } else {
                    known.insert(c.index, oid.clone());
                }
                return Ok(());
            }
            if let Some(oid) = on_branch.get(c.sha256.as_str()) {
                let h = match &mut hasher {
                    Some(h) => h,
                    None => hasher.insert(git.blob_hasher()?),
                };
                c.write()?;
                if h.write_file(&c.path)? == **oid {
                    std::fs::remove_file(&c.path)
                        .with_context(|| format!("removing {}", c.path.display()))?;
                    reused.insert(c.index, (*oid).clone());
                    return Ok(());
                }
                out.loud(format!(
                    "the branch's blob {oid} for chunk {} of {key} is not the bytes warmstart.json names (sha256 {}): storing and pushing this publish's own",
                    c.index, c.sha256
                ));
            }
            tx.as_ref()
                .expect("sender lives until packing ends")
                .send(c)
                .map_err(|_| anyhow!("the git writer stopped"))
        },
        &mut |done| bar.set_position(done),
    );
    bar.finish_and_clear();
    drop(tx.take());
    if let Some(h) = hasher {
        h.finish()?;
    }
    let (packed, mut oids) = joined(result, writer, git, key)?;
    let n = packed.chunks.len();
    let is_reused: Vec<bool> = (0..n).map(|i| reused.contains_key(&i)).collect();
    oids.extend(reused);
    oids.extend(known);
    save_record(&prior, plan, &params, &packed, &oids, out);
    let (entry, files) = key_entry(git, key, &packed, oids, opts, &scratch.path)?;
    Ok(PackedKey {
        entry,
        oids: files,
        reused: is_reused,
        frames_reused,
        frames_fetched,
        frames_known,
    })
}

/// Writes this pack's record for the next publish from this clone. Only
/// an optimisation is lost without it (the next publish reads and cuts
/// every file): a warning.
fn save_record(
    prior: &Prior,
    plan: &Plan,
    params: &str,
    packed: &pack::Packed,
    oids: &BTreeMap<usize, String>,
    out: &Reporter,
) {
    let saved = unchanged::save(
        prior.record,
        plan,
        prior.planned_at_ns,
        params,
        packed,
        oids,
    );
    if let Err(e) = saved {
        out.warn(format!("{e:#} (the next publish packs every file again)"));
    }
}

/// What this clone's record of its last pack knows of `plan`: nothing when
/// there is no record, or its blobs cannot be looked up.
fn known_chunks(git: &CacheGit, record: &Path, plan: &Plan, params: &str) -> Option<pack::Known> {
    let record = unchanged::load(record)?;
    let sizes = git.blob_sizes(&record.blobs()).ok()?;
    record.known(plan, params, &sizes)
}

/// The key on the branch a publish of `key` most likely shares chunks
/// with, among those packed with `today`'s frames: the same key, else the
/// one with the most pins of today's value, the newest of those.
fn previous_key<'a>(
    branch: Option<&'a BranchManifest>,
    key: &Key,
    today: &Frames,
) -> Option<&'a KeyEntry> {
    branch?
        .keys
        .iter()
        .filter(|(_, e)| e.frames.as_ref() == Some(today))
        .max_by_key(|(name, e)| {
            let same = e.key_parts.iter().filter(|p| key.parts.contains(p)).count();
            (**name == key.value, same, e.created_at.clone())
        })
        .map(|(_, e)| e)
}

/// Fetches by id the chunk blobs of `prev` that cache.git lacks (a fresh
/// clone's branch fetch leaves them on the remote), in one fetch; returns
/// how many it fetched. A failure only costs time: those chunks are
/// compressed again, with one warning.
fn fetch_frames(
    git: &CacheGit,
    remote: &Remote,
    prev: &KeyEntry,
    oids: &BTreeMap<String, String>,
    out: &Reporter,
) -> usize {
    let wanted: Vec<String> = prev
        .chunks
        .iter()
        .filter_map(|c| oids.get(&c.file).cloned())
        .collect();
    let Ok(sizes) = git.blob_sizes(&wanted) else {
        return 0;
    };
    let missing: Vec<String> = wanted
        .into_iter()
        .zip(sizes)
        .filter(|(_, size)| size.is_none())
        .map(|(oid, _)| oid)
        .collect();
    if missing.is_empty() {
        return 0;
    }
    match git.fetch_blobs(remote, &missing, &mut |_| {}) {
        Ok(()) => missing.len(),
        Err(e) => {
            use crate::git::BlobFetchError as E;
            let e = match e {
                E::Refused => "the server refuses a want by id".to_string(),
                E::NotOnRemote => "not on the remote".to_string(),
                E::Failed(m) | E::Network { message: m, .. } => m,
            };
            out.warn(format!(
                "fetching {} of the previous key's chunks from {} failed ({e}): compressing them again",
                missing.len(),
                remote.shown_name()
            ));
            0
        }
    }
}

/// The pack and the blob ids the writer thread stored, once it ended. A
/// git failure explains a pack failure better than "writer stopped".
fn joined(
    result: Result<pack::Packed>,
    writer: std::thread::JoinHandle<Result<BTreeMap<usize, String>>>,
    git: &CacheGit,
    key: &str,
) -> Result<(pack::Packed, BTreeMap<usize, String>)> {
    let written = writer
        .join()
        .map_err(|_| anyhow!("the git writer thread panicked"))?;
    match (result, written) {
        (Ok(p), Ok(o)) => Ok((p, o)),
        (_, Err(e)) => Err(e.context(format!(
            "writing chunks of {key} into {}",
            git.dir.display()
        ))),
        (Err(e), _) => Err(e),
    }
}

/// The blob ids of the branch's chunks by the sha256 of their raw bytes,
/// from every key whose frames were made exactly as today's would be (same
/// chunker sizes, zstd version and parameters): such a chunk of today's
/// tar need not be compressed again if its blob is in cache.git (read
/// with `local_blob`, checked by `chunks` before use).
fn earlier_frames(
    keys: &[&KeyEntry],
    old_oids: &BTreeMap<String, String>,
    today: &Frames,
) -> BTreeMap<String, String> {
    keys.iter()
        .filter(|o| o.frames.as_ref() == Some(today))
        .flat_map(|o| o.chunks.iter())
        .filter_map(|c| Some((c.raw_sha256.clone()?, old_oids.get(&c.file)?.clone())))
        .collect()
}

/// The bytes of blob `oid` when cache.git has it, never fetched (a chunk
/// the branch fetch left on the remote is compressed again instead).
fn local_blob(git: &CacheGit, oid: &str) -> Option<Vec<u8>> {
    let mut cmd = git.git();
    cmd.env("GIT_NO_LAZY_FETCH", "1")
        .args(["cat-file", "blob", oid])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let out = cmd.output().ok()?;
    out.status.success().then_some(out.stdout)
}

/// A thread that stores each chunk file it is sent as a blob in cache.git
/// and deletes the file; it returns the blob ids by chunk index.
fn spawn_blob_writer(
    git: CacheGit,
    rx: mpsc::Receiver<ChunkFile>,
) -> std::thread::JoinHandle<Result<BTreeMap<usize, String>>> {
    std::thread::spawn(move || -> Result<BTreeMap<usize, String>> {
        let mut oids = BTreeMap::new();
        let mut blobs = None;
        for c in rx {
            c.write()?;
            let w = match &mut blobs {
                Some(w) => w,
                None => blobs.insert(git.blob_writer()?),
            };
            let oid = w
                .write_file(&c.path)
                .with_context(|| format!("storing chunk {}", c.name))?;
            std::fs::remove_file(&c.path)
                .with_context(|| format!("removing {}", c.path.display()))?;
            oids.insert(c.index, oid);
        }
        if let Some(w) = blobs {
            w.finish()?;
        }
        Ok(oids)
    })
}

/// The entry of `key` packed as `packed` (chunks named now that their
/// count is known, the file index stored in parts), and the blob ids of
/// its files by name; `oids` holds the chunks' ids by index.
fn key_entry(
    git: &CacheGit,
    key: &str,
    packed: &pack::Packed,
    mut oids: BTreeMap<usize, String>,
    opts: PackOptions,
    scratch: &Path,
) -> Result<(KeyEntry, BTreeMap<String, String>)> {
    let n = packed.chunks.len();
    let mut files: BTreeMap<String, String> = (0..n)
        .map(|i| {
            let oid = oids
                .remove(&i)
                .ok_or_else(|| anyhow!("chunk {i} of {key} has no blob"))?;
            Ok((chunk_name(key, i, n), oid))
        })
        .collect::<Result<_>>()?;
    let (index, index_parts) = index_blobs(git, key, &packed.index, &mut files, scratch)?;
    let entry = KeyEntry {
        archive: archive_name(key),
        compression: "zstd".into(),
        chunks: packed
            .chunks
            .iter()
            .map(|c| Chunk {
                file: chunk_name(key, c.index, n),
                size: c.size,
                sha256: c.sha256.clone(),
                raw_size: Some(c.raw_size),
                raw_sha256: Some(c.raw_sha256.clone()),
            })
            .collect(),
        tar_sha256: packed.tar.sha256.clone(),
        tar_size: packed.tar.size,
        files: packed.tar.entries,
        key_parts: Vec::new(),
        source_commit: None,
        source_tree: None,
        gates: Value::Null,
        ungated: false,
        created_at: String::new(),
        tool_version: format!("warmstart {}", env!("CARGO_PKG_VERSION")),
        frames: Some(opts.params.frames(opts.sizes)),
        index: Some(index),
        index_parts,
    };
    Ok((entry, files))
}

/// Stores the parts of `key`'s index as blobs (their ids into `files` by
/// name) and describes them: the whole index as their concatenation, which
/// is not stored under its own name, and each part. One `git hash-object`
/// stores them all, each part a file in `scratch` for the moment git reads
/// it: a process per part cost a 50,000-file tree's publish about 250
/// processes.
fn index_blobs(
    git: &CacheGit,
    key: &str,
    index: &crate::cache::format::files::Index,
    files: &mut BTreeMap<String, String>,
    scratch: &Path,
) -> Result<(IndexFile, Vec<IndexFile>)> {
    let parts = pack::index_parts(index)?;
    let (n, mut whole, mut size) = (parts.len(), Sha256::new(), 0u64);
    let mut described = Vec::with_capacity(n);
    let mut writer = git.blob_writer()?;
    for (i, bytes) in parts.iter().enumerate() {
        whole.update(bytes);
        size += bytes.len() as u64;
        let part = IndexFile {
            file: index_part_name(key, i, n),
            size: bytes.len() as u64,
            sha256: crate::hex::encode(&Sha256::digest(bytes)),
        };
        let path = scratch.join(format!("index-part-{i}"));
        std::fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
        let oid = writer
            .write_file(&path)
            .with_context(|| format!("storing {} in {}", part.file, git.dir.display()))?;
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        files.insert(part.file.clone(), oid);
        described.push(part);
    }
    writer.finish()?;
    let index = IndexFile {
        file: index_name(key),
        size,
        sha256: crate::hex::encode(&whole.finalize()),
    };
    Ok((index, described))
}

/// Removes chunk directories left by publishes that were killed (their
/// process is gone): each can hold a few chunks' worth of disk.
fn remove_dead_scratch(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in rd.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("warmstart-publish-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: kill with signal 0 only checks whether the process exists.
        let alive = pid == std::process::id() as i32
            || unsafe { libc::kill(pid, 0) } == 0
            || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A scratch directory removed when dropped (also on error), and by the
/// signal handler on SIGINT or SIGTERM (it holds only chunk files).
struct Scratch {
    path: PathBuf,
    _guard: crate::process::signals::TempGuard,
}

impl Scratch {
    fn new(path: PathBuf) -> Result<Scratch> {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        let guard = crate::process::signals::register_temp_dir(&path);
        Ok(Scratch {
            path,
            _guard: guard,
        })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
