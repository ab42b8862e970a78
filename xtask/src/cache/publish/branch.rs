//! The cache branch as a publish, prune or re-sign fetched it: its commit,
//! its files and its `warmstart.json`.
//!
//! Never accepts a branch with history, or one that is neither a cache
//! branch nor a legacy one: such a branch is not replaced.

use anyhow::Result;
use std::collections::BTreeMap;

use crate::cache::format::{self, BranchManifest, Layout};
use crate::cache::publish::report::Reporter;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, TreeEntry};

/// The cache branch as fetched: its commit, files and manifest.
pub(crate) struct BranchState {
    pub(crate) commit: String,
    pub(crate) entries: Vec<TreeEntry>,
    pub(crate) manifest: BranchManifest,
}

impl BranchState {
    /// Fetches the branch; `None` when the remote does not have it yet.
    pub(crate) fn load(
        git: &CacheGit,
        remote: &Remote,
        branch: &str,
        out: &Reporter,
    ) -> Result<Option<BranchState>> {
        let Some(commit) = git.try_fetch_branch(remote, branch)? else {
            out.say(format!(
                "{branch} does not exist on {remote} yet: this is its first publish"
            ));
            return Ok(None);
        };
        let parents = git.commit_parents(&commit)?;
        if !parents.is_empty() {
            return Err(fail(
                Code::Config,
                format!(
                    "{branch} on {remote} has history (commit {} has a parent), so it is not a cache branch: refusing to replace it; set cache.branch to a branch of its own",
                    &commit[..12]
                ),
            ));
        }
        let entries = git.ls_tree(&commit)?;
        let blob = |name: &str| entries.iter().find(|e| e.name == name && e.kind == "blob");
        let names: Vec<String> = entries.iter().map(|e| e.name.clone()).collect();
        let manifest = if let Some(e) = blob("warmstart.json") {
            let bytes = git.read_blob_bytes(&e.oid)?;
            let text = String::from_utf8_lossy(&bytes);
            let mut manifest = BranchManifest::parse(&text).map_err(|err| {
                fail(
                    Code::Corrupt,
                    format!(
                        "warmstart.json on {branch} of {remote} cannot be read ({err:#}): fix it, or delete the branch (`git push {} --delete {branch}`) to start over",
                        remote.shown_name()
                    ),
                )
            })?;
            drop_broken_keys(&mut manifest, &entries, branch, out);
            manifest
        } else if let Some(e) = blob("SHA256SUMS") {
            let sums = String::from_utf8_lossy(&git.read_blob_bytes(&e.oid)?).into_owned();
            match format::detect_layout(&names, &sums) {
                Ok(Layout::Legacy { archive, .. }) => {
                    out.say(format!(
                        "{branch} holds a legacy cache ({archive}, made by the shell recipe): this publish replaces it with format v1"
                    ));
                    BranchManifest::new()
                }
                _ => return Err(not_a_cache(branch, remote)),
            }
        } else if entries.is_empty() {
            BranchManifest::new()
        } else {
            return Err(not_a_cache(branch, remote));
        };
        Ok(Some(BranchState {
            commit,
            entries,
            manifest,
        }))
    }

    /// The statement and signature of `key` on the branch.
    pub(crate) fn key_files(&self, git: &CacheGit, key: &str) -> Result<crate::trust::KeyFiles> {
        let mut all = crate::trust::files_of_keys(git, &self.entries, &[key.to_string()])?;
        Ok(all.remove(key).expect("asked for"))
    }

    /// Blob ids by file name.
    pub(crate) fn oids(&self) -> BTreeMap<String, String> {
        self.entries
            .iter()
            .filter(|e| e.kind == "blob")
            .map(|e| (e.name.clone(), e.oid.clone()))
            .collect()
    }
}

fn not_a_cache(branch: &str, remote: &Remote) -> anyhow::Error {
    fail(
        Code::Config,
        format!(
            "{branch} on {remote} is not a cache branch (no warmstart.json, no legacy SHA256SUMS): refusing to replace it; set cache.branch to a branch of its own"
        ),
    )
}

/// Another key whose chunks (or file index) are not all on the branch cannot be restored;
/// keeping it would write a SHA256SUMS that fails. It is dropped, loudly.
pub(super) fn drop_broken_keys(
    m: &mut BranchManifest,
    entries: &[TreeEntry],
    branch: &str,
    out: &Reporter,
) {
    let sizes: BTreeMap<&str, Option<u64>> = entries
        .iter()
        .filter(|e| e.kind == "blob")
        .map(|e| (e.name.as_str(), e.size))
        .collect();
    m.keys.retain(|key, e| {
        // A size of `None` is a chunk the (filtered) branch fetch left on
        // the remote: it is on the branch, and its size is the one its id
        // was made with; only chunks missing from the tree, or here with
        // another size, are broken.
        let broken = |file: &str, want: u64| match sizes.get(file) {
            None => true,
            Some(None) => false,
            Some(Some(size)) => *size != want,
        };
        let missing = e.chunks.iter().find(|c| broken(&c.file, c.size));
        if let Some(c) = missing {
            out.warn(format!(
                "dropping key {key} from {branch}: its chunk {} is missing or has the wrong size",
                c.file
            ));
            return false;
        }
        // The index is part of the key (a signed statement covers it).
        if let Some(i) = e.index_files().find(|i| broken(&i.file, i.size)) {
            out.warn(format!(
                "dropping key {key} from {branch}: its file index {} is missing or has the wrong size",
                i.file
            ));
            return false;
        }
        true
    });
}
