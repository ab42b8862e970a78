//! A fetched cache branch, read and cross-checked before a byte of it is used.
//!
//! Reads the root tree of the fetched commit, detects v1 or legacy layout,
//! checks that `SHA256SUMS` and `warmstart.json` agree, and turns one key
//! into a `verify::Plan` (chunk blobs in order, their digests and sizes, the
//! tar digest and caps). Missing chunks, and truncated or oversized ones that
//! are already in cache.git, are refused here, from the tree listing alone,
//! before any chunk is read (a chunk the branch fetch left out is checked by
//! `prefetch` once it arrives). This module reads cache.git only; it never
//! writes and never touches the network.

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};

use crate::cache::format::{self, BranchManifest, Compression, Layout};
use crate::cache::restore::verify::{self, Check, Codec, Piece, Plan};
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, TreeEntry};
use crate::hex;
use crate::unpack::Limits;

/// What a cache branch holds, after the cross-checks.
#[derive(Clone, Debug)]
pub enum Content {
    /// `warmstart.json` (already checked against `SHA256SUMS`).
    V1(BranchManifest),
    /// A branch made by the old shell recipe: one archive in parts.
    Legacy {
        archive: String,
        sha256: String,
        compression: Compression,
        parts: Vec<String>,
    },
}

/// A fetched branch: where it came from and what it holds.
#[derive(Clone, Debug)]
pub struct Branch {
    pub name: String,
    pub remote: Remote,
    pub commit: String,
    pub entries: Vec<TreeEntry>,
    pub content: Content,
    /// sha256 of `warmstart.json` (v1) or of `SHA256SUMS` (legacy): which
    /// branch manifest an install was checked against.
    pub manifest_sha256: String,
    /// Blobs the branch fetch of this run brought into cache.git (chunks
    /// under the fetch's size limit come with it): fetched, not reused.
    pub fresh: std::collections::HashSet<String>,
    /// The registry client a registry key was read with, mirrors and all
    /// (`cache::fetch::oci`), which `prefetch` fetches its chunks with;
    /// `None` for a git branch.
    pub registry: Option<crate::oci::Client>,
}

/// One key, ready to stream.
#[derive(Clone, Debug)]
pub struct KeyPlan {
    pub key: String,
    pub plan: Plan,
    /// The blob of each piece, in plan order.
    pub oids: Vec<String>,
    /// Caps for the extractor.
    pub limits: Limits,
    /// `v1`, `legacy-gzip`, `legacy-zstd`.
    pub layout: &'static str,
    /// Entries declared by warmstart.json (v1 only).
    pub files: Option<u64>,
}

fn corrupt(branch: &str, commit: &str, what: impl std::fmt::Display) -> anyhow::Error {
    fail(
        Code::Verify,
        format!(
            "branch {branch} (commit {}): {what}",
            &commit[..commit.len().min(12)]
        ),
    )
}

impl Branch {
    /// Reads and cross-checks the branch at `commit` in cache.git.
    pub fn read(git: &CacheGit, remote: Remote, branch: &str, commit: String) -> Result<Branch> {
        let entries = git
            .ls_tree(&commit)
            .with_context(|| format!("listing branch {branch}"))?;
        let find = |name: &str| entries.iter().find(|e| e.name == name && e.kind == "blob");
        let sums_entry = find("SHA256SUMS").ok_or_else(|| {
            corrupt(
                branch,
                &commit,
                format!("has no SHA256SUMS, so it is not a cache branch: publish it with `{cmd} cache publish`", cmd = crate::invocation::command()),
            )
        })?;
        let sums_bytes = git
            .read_blob_bytes(&sums_entry.oid)
            .with_context(|| format!("reading SHA256SUMS of {branch}"))?;
        let sums = String::from_utf8(sums_bytes.clone())
            .map_err(|_| corrupt(branch, &commit, "SHA256SUMS is not UTF-8 text"))?;
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        let layout = format::detect_layout(&names, &sums)
            .map_err(|e| corrupt(branch, &commit, format!("{e:#}")))?;
        let (content, manifest_sha256) = match layout {
            Layout::V1 => {
                let entry = find("warmstart.json")
                    .ok_or_else(|| corrupt(branch, &commit, "warmstart.json is not a file"))?;
                read_v1(git, branch, &commit, &entry.oid, &sums)?
            }
            Layout::Legacy {
                archive,
                sha256,
                compression,
                parts,
            } => (
                Content::Legacy {
                    archive,
                    sha256,
                    compression,
                    parts,
                },
                hex::encode(&Sha256::digest(&sums_bytes)),
            ),
        };
        Ok(Branch {
            name: branch.to_string(),
            remote,
            commit,
            entries,
            content,
            manifest_sha256,
            fresh: Default::default(),
            registry: None,
        })
    }

    /// The keys the branch holds (a legacy branch holds one unnamed archive).
    pub fn keys(&self) -> Vec<String> {
        match &self.content {
            Content::V1(m) => m.keys.keys().cloned().collect(),
            Content::Legacy { .. } => Vec::new(),
        }
    }

    /// `v1`, `legacy-gzip` or `legacy-zstd`: how the branch is laid out.
    pub fn layout(&self) -> &'static str {
        match &self.content {
            Content::V1(_) => "v1",
            Content::Legacy { compression, .. } => match compression {
                Compression::Gzip => "legacy-gzip",
                Compression::Zstd => "legacy-zstd",
            },
        }
    }

    pub fn short_commit(&self) -> &str {
        &self.commit[..self.commit.len().min(12)]
    }

    fn blob(&self, file: &str) -> Option<&TreeEntry> {
        self.entries
            .iter()
            .find(|e| e.name == file && e.kind == "blob")
    }

    /// The stream plan for `key`. `fix` says what to do about a damaged
    /// branch (e.g. which publish command to run). A legacy branch holds
    /// one archive, which is restored whatever the key.
    pub fn plan(&self, key: &str, fix: &str) -> Result<KeyPlan> {
        match &self.content {
            Content::V1(m) => {
                let Some(entry) = m.keys.get(key) else {
                    return Err(self.no_such_key(m, key));
                };
                self.plan_v1(key, entry, fix)
            }
            Content::Legacy {
                archive,
                sha256,
                compression,
                parts,
            } => self.plan_legacy(key, fix, archive, sha256, *compression, parts),
        }
    }

    /// Exit 4: the branch lacks `key`; the message lists the keys it has.
    fn no_such_key(&self, m: &BranchManifest, key: &str) -> anyhow::Error {
        let have = if m.keys.is_empty() {
            "no keys".to_string()
        } else {
            m.keys.keys().cloned().collect::<Vec<_>>().join(", ")
        };
        fail(
            Code::NotFound,
            format!(
                "branch {} from {} has no key {key} (it has {have}): publish it, or see which pin differs with `{cmd} cache status`",
                self.name,
                self.remote,
                cmd = crate::invocation::command(),
            ),
        )
    }

    /// The chunk `c` of `key` as a piece, with its blob; refused when the
    /// branch lacks it or it is not its declared size.
    fn piece(&self, key: &str, c: &format::Chunk, fix: &str) -> Result<(Piece, String)> {
        let Some(blob) = self.blob(&c.file) else {
            return Err(corrupt(
                &self.name,
                &self.commit,
                format!(
                    "chunk {} of key {key} is listed in warmstart.json but missing from the branch: {fix}",
                    c.file
                ),
            ));
        };
        // No size: the blob is not in cache.git (the branch fetch leaves
        // big chunks out); `prefetch` checks its size once fetched, and
        // `verify` checks every byte.
        let size = blob.size.unwrap_or(c.size);
        if size != c.size {
            let how = if size < c.size {
                "truncated"
            } else {
                "too long"
            };
            return Err(corrupt(
                &self.name,
                &self.commit,
                format!(
                    "chunk {} of key {key} is {size} bytes but warmstart.json says {} ({how}): {fix}",
                    c.file, c.size
                ),
            ));
        }
        let piece = Piece {
            file: c.file.clone(),
            size,
            sha256: Some(verify::parse_digest(&c.sha256)?),
        };
        Ok((piece, blob.oid.clone()))
    }

    fn plan_v1(&self, key: &str, entry: &format::KeyEntry, fix: &str) -> Result<KeyPlan> {
        if entry.compression != "zstd" {
            return Err(corrupt(
                &self.name,
                &self.commit,
                format!(
                    "key {key} uses compression {:?}; this warmstart reads zstd: upgrade warmstart",
                    entry.compression
                ),
            ));
        }
        let (pieces, oids): (Vec<Piece>, Vec<String>) = entry
            .chunks
            .iter()
            .map(|c| self.piece(key, c, fix))
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        // Each chunk its own frame (validated: every chunk has a raw size).
        let frames = entry
            .frames
            .as_ref()
            .and_then(|_| entry.chunks.iter().map(|c| c.raw_size).collect());
        Ok(KeyPlan {
            key: key.to_string(),
            plan: Plan {
                label: format!("key {key} on branch {}", self.name),
                fix: fix.to_string(),
                pieces,
                check: Check::PerPiece,
                codec: Codec::Zstd,
                tar_sha256: Some(verify::parse_digest(&entry.tar_sha256)?),
                tar_size: Some(entry.tar_size),
                tar_cap: entry.tar_size,
                hash_tar: true,
                frames,
            },
            oids,
            // Contents can never exceed the tar itself; one extra entry
            // allows for a `./` root the count may leave out.
            limits: Limits {
                max_bytes: entry.tar_size,
                max_entries: entry.files.saturating_add(1),
            },
            layout: self.layout(),
            files: Some(entry.files),
        })
    }

    fn plan_legacy(
        &self,
        key: &str,
        fix: &str,
        archive: &str,
        sha256: &str,
        compression: Compression,
        parts: &[String],
    ) -> Result<KeyPlan> {
        let mut pieces = Vec::new();
        let mut oids = Vec::new();
        for p in parts {
            let blob = self.blob(p).ok_or_else(|| {
                corrupt(&self.name, &self.commit, format!("part {p} is not a file"))
            })?;
            pieces.push(Piece {
                file: p.clone(),
                size: blob.size.unwrap_or(0),
                sha256: None,
            });
            oids.push(blob.oid.clone());
        }
        let limits = Limits::GENEROUS;
        Ok(KeyPlan {
            key: key.to_string(),
            plan: Plan {
                label: format!("legacy branch {}", self.name),
                fix: fix.to_string(),
                pieces,
                check: Check::Whole {
                    archive: archive.to_string(),
                    sha256: verify::parse_digest(sha256)?,
                },
                codec: match compression {
                    Compression::Gzip => Codec::Gzip,
                    Compression::Zstd => Codec::Zstd,
                },
                tar_sha256: None,
                tar_size: None,
                // Contents, plus at most three 512-byte blocks of headers
                // and padding per entry, plus the trailer.
                tar_cap: limits
                    .max_bytes
                    .saturating_add(limits.max_entries.saturating_mul(1536))
                    .saturating_add(20480),
                hash_tar: true,
                frames: None,
            },
            oids,
            limits,
            layout: self.layout(),
            files: None,
        })
    }
}

/// A v1 branch's `warmstart.json` (blob `oid`), parsed and checked against
/// its `SHA256SUMS`, with its sha256.
fn read_v1(
    git: &CacheGit,
    branch: &str,
    commit: &str,
    oid: &str,
    sums: &str,
) -> Result<(Content, String)> {
    let bytes = git
        .read_blob_bytes(oid)
        .with_context(|| format!("reading warmstart.json of {branch}"))?;
    let text = String::from_utf8(bytes.clone())
        .map_err(|_| corrupt(branch, commit, "warmstart.json is not UTF-8"))?;
    let manifest = BranchManifest::parse(&text).map_err(|e| {
        corrupt(
            branch,
            commit,
            format!(
                "{e:#}: republish with `{} cache publish`",
                crate::invocation::command()
            ),
        )
    })?;
    check_sums_agree(&manifest, sums).map_err(|e| {
        corrupt(
            branch,
            commit,
            format!("{e}: the branch was edited by hand or damaged; republish it"),
        )
    })?;
    Ok((Content::V1(manifest), hex::encode(&Sha256::digest(&bytes))))
}

/// `SHA256SUMS` must list exactly the chunks of `warmstart.json`, with the
/// same digests: the coreutils path trusts one, warmstart the other.
pub fn check_sums_agree(m: &BranchManifest, sums: &str) -> Result<()> {
    let listed = format::parse_sums(sums)?;
    let expected = m.sums();
    for e in &expected {
        match listed.iter().find(|l| l.file == e.file) {
            None => return Err(anyhow!("SHA256SUMS does not list {}", e.file)),
            Some(l) if !l.sha256.eq_ignore_ascii_case(&e.sha256) => {
                return Err(anyhow!(
                    "SHA256SUMS says {} has sha256 {} but warmstart.json says {}",
                    e.file,
                    l.sha256,
                    e.sha256
                ));
            }
            Some(_) => {}
        }
    }
    for l in &listed {
        if !expected.iter().any(|e| e.file == l.file) {
            return Err(anyhow!(
                "SHA256SUMS lists {}, which warmstart.json does not",
                l.file
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, KeyEntry, SumLine, render_sums};

    fn manifest() -> BranchManifest {
        let mut m = BranchManifest::new();
        m.keys.insert(
            "k".into(),
            KeyEntry {
                archive: "k.tar.zst".into(),
                compression: "zstd".into(),
                chunks: vec![
                    Chunk {
                        file: "k.tar.zst.part000".into(),
                        size: 5,
                        sha256: "a".repeat(64),
                        raw_size: None,
                        raw_sha256: None,
                    },
                    Chunk {
                        file: "k.tar.zst.part001".into(),
                        size: 5,
                        sha256: "b".repeat(64),
                        raw_size: None,
                        raw_sha256: None,
                    },
                ],
                tar_sha256: "c".repeat(64),
                tar_size: 10240,
                files: 2,
                key_parts: vec![],
                source_commit: None,
                source_tree: None,
                gates: serde_json::Value::Null,
                ungated: false,
                created_at: "2026-11-30T00:00:00Z".into(),
                tool_version: "warmstart 0.1.0".into(),
                frames: None,
                index: None,
                index_parts: Vec::new(),
            },
        );
        m
    }

    #[test]
    fn sums_must_agree_with_the_manifest() {
        let m = manifest();
        let good = render_sums(&m.sums());
        check_sums_agree(&m, &good).unwrap();
        // Uppercase hex is the same digest.
        check_sums_agree(
            &m,
            &good
                .to_uppercase()
                .replace("K.TAR.ZST.PART", "k.tar.zst.part"),
        )
        .unwrap();
        let mut lines = m.sums();
        lines[1].sha256 = "d".repeat(64);
        let e = check_sums_agree(&m, &render_sums(&lines)).unwrap_err();
        assert!(e.to_string().contains("k.tar.zst.part001"), "{e}");
        let mut lines = m.sums();
        lines.pop();
        assert!(check_sums_agree(&m, &render_sums(&lines)).is_err());
        let mut lines = m.sums();
        lines.push(SumLine {
            sha256: "e".repeat(64),
            file: "extra".into(),
        });
        let e = check_sums_agree(&m, &render_sums(&lines)).unwrap_err();
        assert!(e.to_string().contains("extra"), "{e}");
    }
}
