//! What `cache publish` says it did: the `--json` document and its parts.
//!
//! Only data and how a publish fills it in: never publishes, prints or
//! changes a field's name (the JSON shape is a contract).

use serde::Serialize;
use std::collections::BTreeMap;

use crate::cache::format::manifest::{CacheManifest, Key};
use crate::cache::format::{KeyEntry, KeyPart};
use crate::cache::publish::blobs::PackedKey;
use crate::cache::publish::branch::BranchState;
use crate::cache::publish::push;

/// What a publish did: the `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `published`, `unchanged`, `present` (`--missing`: the remote holds
    /// an accepted key), `dry-run` or `key-only`.
    pub status: &'static str,
    pub name: String,
    pub key: String,
    pub key_parts: Vec<KeyPart>,
    pub branch: String,
    pub remote: Option<RemoteJson>,
    /// The branch's commit after the publish (the new one, or the unchanged one).
    pub commit: Option<String>,
    /// The branch's commit before the publish (null on a first publish).
    pub previous_commit: Option<String>,
    /// Tar entries (planned entries for a dry run); null with `--key-only`,
    /// which counts nothing. `entries` in JSON, as verify and demo say.
    #[serde(rename = "entries")]
    pub files: Option<u64>,
    /// Bytes of regular files packed.
    pub file_bytes: Option<u64>,
    /// How an `unchanged` publish knew: `stat` (every file's lstat, ctime
    /// included, equals this clone's record of the last publish: nothing
    /// read), `digest` (the tar's sha256 equals the branch's: files read,
    /// nothing compressed) or `pack` (a full pack made the branch's chunks).
    /// Null for other statuses.
    pub unchanged_by: Option<&'static str>,
    #[serde(rename = "tar_bytes")]
    pub tar_size: Option<u64>,
    pub tar_sha256: Option<String>,
    #[serde(rename = "compressed_bytes")]
    pub compressed_size: Option<u64>,
    pub chunks: Vec<ChunkJson>,
    /// Chunks this publish did not compress: their frame was an earlier
    /// key's (checked to decode to the chunk), or nothing was packed
    /// (`unchanged` by `stat` or `digest`: every chunk). Null when no tar
    /// was made.
    pub chunks_reused: Option<u64>,
    /// Of those, frames fetched by id for this publish (a fresh clone at a
    /// slow level); null when no tar was made.
    pub frames_fetched: Option<u64>,
    /// Of those, chunks taken whole from this clone's record of its last
    /// pack (module `unchanged`): not cut, hashed or written, only read
    /// for the tar's digest. Null when no tar was made.
    pub chunks_unchanged: Option<u64>,
    /// Every key on the branch after the publish.
    pub keys_on_branch: Vec<String>,
    /// Keys this publish dropped (`[publish] keep`).
    pub pruned: Vec<String>,
    pub gates_required: Vec<String>,
    pub ungated: bool,
    /// Who signed this key's statement (principal and fingerprint, or the
    /// fingerprint of a key the allowed signers do not list); null when unsigned.
    pub signed_by: Option<String>,
    /// The whole publish (`timings_ms` is its phases, without a total).
    pub duration_ms: Option<u64>,
    pub timings_ms: BTreeMap<&'static str, u64>,
    /// How the push went (batches under the push limit); null without a push.
    pub push: Option<push::Report>,
    /// What `--missing` found on the remote; null without `--missing`.
    pub missing: Option<crate::cache::publish::missing::MissingJson>,
}

/// The contract's one remote shape, `{name, url}`.
pub type RemoteJson = crate::contract::Remote;

#[derive(Clone, Debug, Serialize)]
pub struct ChunkJson {
    pub file: String,
    pub size: u64,
    pub sha256: String,
    /// True when the branch already held this exact chunk (nothing written).
    pub reused: bool,
}

impl Summary {
    /// What a publish of `key` says before it has done anything.
    pub(super) fn new(m: &CacheManifest, key: &Key) -> Summary {
        Summary {
            status: "key-only",
            name: m.name.clone(),
            key: key.value.clone(),
            key_parts: key.parts.clone(),
            branch: m.branch.clone(),
            remote: None,
            commit: None,
            previous_commit: None,
            files: None,
            file_bytes: None,
            unchanged_by: None,
            tar_size: None,
            tar_sha256: None,
            compressed_size: None,
            chunks: Vec::new(),
            chunks_reused: None,
            frames_fetched: None,
            chunks_unchanged: None,
            keys_on_branch: Vec::new(),
            pruned: Vec::new(),
            gates_required: m.gates.clone(),
            ungated: false,
            signed_by: None,
            duration_ms: None,
            timings_ms: BTreeMap::new(),
            push: None,
            missing: None,
        }
    }

    /// The tar and chunks of a packed key.
    pub(super) fn fill_packed(&mut self, packed: &PackedKey) {
        self.tar_size = Some(packed.entry.tar_size);
        self.tar_sha256 = Some(packed.entry.tar_sha256.clone());
        self.compressed_size = Some(packed.entry.chunks.iter().map(|c| c.size).sum());
        self.chunks_reused = Some(packed.frames_reused as u64);
        self.frames_fetched = Some(packed.frames_fetched as u64);
        self.chunks_unchanged = Some(packed.frames_known as u64);
        self.chunks = packed
            .entry
            .chunks
            .iter()
            .zip(&packed.reused)
            .map(|(c, &reused)| ChunkJson {
                file: c.file.clone(),
                size: c.size,
                sha256: c.sha256.clone(),
                reused,
            })
            .collect();
    }

    /// `unchanged`: the branch at `s` already holds `old`, found out `by`.
    pub(super) fn fill_unchanged(&mut self, s: &BranchState, old: &KeyEntry, by: &'static str) {
        self.status = "unchanged";
        self.unchanged_by = Some(by);
        self.commit = Some(s.commit.clone());
        self.keys_on_branch = s.manifest.keys.keys().cloned().collect();
        self.tar_size = Some(old.tar_size);
        self.tar_sha256 = Some(old.tar_sha256.clone());
        self.compressed_size = Some(old.chunks.iter().map(|c| c.size).sum());
        self.chunks_reused = Some(old.chunks.len() as u64);
        self.frames_fetched = Some(0);
        self.chunks_unchanged = Some(0);
        self.chunks = old
            .chunks
            .iter()
            .map(|c| ChunkJson {
                file: c.file.clone(),
                size: c.size,
                sha256: c.sha256.clone(),
                reused: true,
            })
            .collect();
    }
}
