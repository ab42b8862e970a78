//! The root commits of a cache branch: the generated files (README,
//! `warmstart.json`, SHA256SUMS), the tree of every key's files, and one
//! commit of it.
//!
//! Never makes a commit with a parent, and never pushes (the caller pushes
//! with a lease).

use anyhow::{Result, anyhow};
use std::collections::BTreeMap;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::format::readme::{self, ReadmeContext};
use crate::cache::format::{BranchManifest, KeyEntry, render_sums};
use crate::cache::publish::branch::BranchState;
use crate::git::{CacheGit, Remote, TreeEntry};
use crate::trust::statement;

/// The files every publish (and prune) writes anew from the branch's
/// manifest: `README.md`, `warmstart.json`, `SHA256SUMS`, as blobs in
/// cache.git.
pub(crate) fn generated_files(
    git: &CacheGit,
    m: &CacheManifest,
    remote: &Remote,
    manifest: &BranchManifest,
) -> Result<Vec<TreeEntry>> {
    let readme = readme::render(
        &ReadmeContext {
            name: &m.name,
            branch: &m.branch,
            // How a clone calls the cache's remote: its name, else the
            // manifest's remote (a name, or the URL of a dedicated cache
            // repository, without credentials).
            remote: &if remote.name == remote.url {
                crate::redact::url(&m.remote)
            } else {
                remote.name.clone()
            },
            description: &m.description,
            command: crate::invocation::command(),
        },
        manifest,
    );
    Ok(vec![
        blob_entry("README.md", git.write_blob_bytes(readme.as_bytes())?),
        blob_entry(
            "warmstart.json",
            git.write_blob_bytes(manifest.render().as_bytes())?,
        ),
        blob_entry(
            "SHA256SUMS",
            git.write_blob_bytes(render_sums(&manifest.sums()).as_bytes())?,
        ),
    ])
}

/// A plain file of a branch's root tree.
pub(crate) fn blob_entry(name: &str, oid: String) -> TreeEntry {
    TreeEntry {
        mode: "100644".into(),
        kind: "blob".into(),
        oid,
        size: None,
        name: name.to_string(),
    }
}

/// Merges this key into the branch state, drops the keys `drops` names
/// (`[publish] keep`), and writes the root commit. Returns the commit and
/// the keys it holds. This key's statement is `signed` (none when
/// unsigned); the other keys keep theirs as they are.
#[allow(clippy::too_many_arguments)]
pub(super) fn build_commit(
    git: &CacheGit,
    m: &CacheManifest,
    remote: &Remote,
    state: Option<&BranchState>,
    key: &str,
    entry: &KeyEntry,
    new_oids: &BTreeMap<String, String>,
    drops: &[String],
    signed: Option<&crate::trust::sign::Signed>,
) -> Result<(String, Vec<String>)> {
    let mut manifest = state.map(|s| s.manifest.clone()).unwrap_or_default();
    let replaced = manifest
        .keys
        .insert(key.to_string(), entry.clone())
        .is_some();
    for d in drops {
        if d != key {
            manifest.keys.remove(d);
        }
    }
    let mut oids = state.map(|s| s.oids()).unwrap_or_default();
    oids.extend(new_oids.iter().map(|(f, o)| (f.clone(), o.clone())));
    // The old statement of this key vouched for other bytes.
    oids.remove(&statement::file_name(key));
    oids.remove(&statement::sig_name(key));
    let mut signatures = BTreeMap::new();
    if let Some(s) = signed {
        signatures.insert(key.to_string(), s);
    }
    let message = format!(
        "warmstart cache {}: {} key {key}\n\nPublished by warmstart {}{}.\nKeys on this branch: {}.\n",
        m.name,
        if replaced { "replace" } else { "add" },
        env!("CARGO_PKG_VERSION"),
        entry
            .source_commit
            .as_deref()
            .map(|c| format!(" from commit {c}"))
            .unwrap_or_default(),
        manifest.keys.keys().cloned().collect::<Vec<_>>().join(", ")
    );
    let commit = write_root_commit(git, m, remote, &manifest, &oids, &signatures, &message)?;
    Ok((commit, manifest.keys.keys().cloned().collect()))
}

/// Writes the tree of `manifest` (README, warmstart.json, SHA256SUMS, the
/// chunks, the file indexes and the statements) and one root commit of it. A key's statement
/// is `signatures`' new one, else the one in `oids` (kept byte for byte).
pub(super) fn write_root_commit(
    git: &CacheGit,
    m: &CacheManifest,
    remote: &Remote,
    manifest: &BranchManifest,
    oids: &BTreeMap<String, String>,
    signatures: &BTreeMap<String, &crate::trust::sign::Signed>,
    message: &str,
) -> Result<String> {
    for (k, e) in &manifest.keys {
        e.validate(k)?;
    }
    let mut tree = generated_files(git, m, remote, manifest)?;
    for (k, e) in &manifest.keys {
        for c in &e.chunks {
            let oid = oids
                .get(&c.file)
                .ok_or_else(|| anyhow!("chunk {} is not in cache.git", c.file))?;
            tree.push(blob_entry(&c.file, oid.clone()));
        }
        for i in e.index_files() {
            let oid = oids
                .get(&i.file)
                .ok_or_else(|| anyhow!("file index {} is not in cache.git", i.file))?;
            tree.push(blob_entry(&i.file, oid.clone()));
        }
        let (stmt, sig) = (statement::file_name(k), statement::sig_name(k));
        if let Some(s) = signatures.get(k) {
            tree.push(blob_entry(&stmt, git.write_blob_bytes(&s.statement)?));
            tree.push(blob_entry(&sig, git.write_blob_bytes(&s.sig)?));
        } else {
            for name in [stmt, sig] {
                if let Some(oid) = oids.get(&name) {
                    tree.push(blob_entry(&name, oid.clone()));
                }
            }
        }
    }
    let tree_oid = git.mktree(&tree)?;
    git.commit_tree(&tree_oid, message)
}
