//! `cargo xtask cache publish <name>`: pack an artifact and make it the single
//! root commit of its cache branch.
//!
//! Steps: load the manifest and compute the key; walk the pack root (the
//! plan: `--dry-run` stops here); check gates; fetch the branch as it is
//! now; pack (tar -> zstd -> chunk files) while a second thread turns each
//! finished chunk into a blob in cache.git and deletes the file; merge this
//! key into the branch's `warmstart.json` (other keys are kept); write a
//! fresh root commit and push it with a lease on the fetched value. If the
//! lease fails because another publisher moved the branch meanwhile, the
//! merge is redone on the new value (the packed chunks are kept).
//!
//! Never: commit with a parent, push without a lease, replace a branch that
//! is not a cache branch, or push when this key's bytes are already there.

#![warn(clippy::too_many_lines)]

pub mod chunks;
pub mod migrate;
pub mod pack;
pub mod packed;
pub mod prune;
pub mod push;
use anyhow::{Context, Result, anyhow};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use xshell::{Shell, cmd};

use crate::cache::format::manifest::{self, CacheManifest, Key};
use crate::cache::format::readme::{self, ReadmeContext};
use crate::cache::format::{
    self, BranchManifest, Chunk, IndexFile, KeyEntry, KeyPart, Layout, archive_name, chunk_name,
    index_name, render_sums,
};
use crate::cache::human_bytes;
use crate::cache::publish::pack::{ChunkFile, PackOptions, Plan};
use crate::cli::cache::PublishArgs;
use crate::clock;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, TreeEntry, healing, is_stale_lease};
use crate::repo::Repo;
use crate::trust::statement;

/// How long a publish keeps rebuilding its commit after other publishers
/// moved the branch between its fetch and its push (and how long it waits
/// for cache.git's lock), unless `[publish] lease_deadline` or
/// `WARMSTART_PUBLISH_LEASE_DEADLINE` says otherwise. A deadline, not a
/// count: with many publishers on one branch, each round lets one of them
/// land, so the last one may lose as many times as there are others.
pub const DEFAULT_LEASE_DEADLINE: Duration = Duration::from_secs(120);

/// The first pause after a lost lease, and the longest: the pause doubles
/// each time, and a random part of it (jitter) keeps publishers that lost
/// together from coming back together.
const LEASE_PAUSE: (Duration, Duration) = (Duration::from_millis(50), Duration::from_secs(2));

/// What to publish (the parsed command line, or the demo's request).
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub name: String,
    pub key_only: bool,
    pub dry_run: bool,
    pub allow_ungated: bool,
    pub remote: Option<String>,
    /// `--signing-key` (else `WARMSTART_SIGNING_KEY`, else unsigned).
    pub signing_key: Option<PathBuf>,
    pub json: bool,
    pub quiet: bool,
}

impl From<PublishArgs> for Request {
    fn from(a: PublishArgs) -> Request {
        Request {
            name: a.name,
            key_only: a.key_only,
            dry_run: a.dry_run,
            allow_ungated: a.allow_ungated,
            remote: a.remote,
            signing_key: a.signing_key,
            json: a.out.json,
            quiet: a.out.quiet(),
        }
    }
}

/// What a publish did: the `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// `published`, `unchanged`, `dry-run` or `key-only`.
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

/// `cargo xtask cache publish`.
pub fn run(sh: &Shell, args: PublishArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let req = Request::from(args);
    crate::contract::fail_with(serde_json::json!({ "name": req.name }));
    let summary = publish(sh, &repo, &req)?;
    if req.json {
        crate::contract::document(&summary);
    }
    Ok(())
}

/// Publishes `req.name` from `repo` and says what happened (to stdout
/// unless `json` or `quiet`; progress bars only on a terminal).
pub fn publish(sh: &Shell, repo: &Repo, req: &Request) -> Result<Summary> {
    let out = Reporter::new(req.quiet, req.json);
    let started = Instant::now();
    let m = manifest::load(repo, &req.name)?;
    let deadline = lease_deadline(&m)?;
    let key = manifest::compute_key(sh, repo, &m)?;
    let mut summary = Summary::new(&m, &key);
    if req.key_only {
        out.say(&key.value);
        for p in &key.parts {
            out.say(format!("  {} = {}", p.name, p.value));
        }
        return Ok(summary);
    }

    let remote_name = req.remote.clone().unwrap_or_else(|| m.remote.clone());
    let remote = crate::git::resolve_remote(sh, &repo.root, &remote_name)?;
    summary.remote = Some(RemoteJson::of(&remote));
    let t = Instant::now();
    let planned_at_ns = clock::now_ns();
    let plan = pack::plan(&m)?;
    summary.timings_ms.insert("plan", ms(t.elapsed()));
    summary.files = Some(plan.items.len() as u64);
    summary.file_bytes = Some(plan.file_bytes);

    if req.dry_run {
        summary.status = "dry-run";
        print_plan(&out, &m, &key, &plan, &remote);
        return Ok(summary);
    }

    let t = Instant::now();
    let stamp = plan.stamp();
    let tree = packed::TreeRecord {
        stamp: stamp.digest.clone(),
        planned_at_ns,
    };
    summary.timings_ms.insert("stamp", ms(t.elapsed()));

    let (gate_record, ungated) = gate_record(sh, repo, &m, req.allow_ungated, &out)?;
    summary.ungated = ungated;

    out.say(format!(
        "publishing {} (key {}) to {} on {remote}",
        m.name, key.value, m.branch
    ));
    let mut git = CacheGit::open(sh, repo)?.with_lock_wait(deadline);
    git.set_network(&m.network)?;
    let t = Instant::now();
    let state = healing(|| BranchState::load(&git, &remote, &m.branch, &out))?;
    summary.timings_ms.insert("fetch", ms(t.elapsed()));
    summary.previous_commit = state.as_ref().map(|s| s.commit.clone());

    let cx = Cx {
        sh,
        repo,
        m: &m,
        key: &key,
        remote: &remote,
        git: &git,
        out: &out,
    };
    let opts = PackOptions::new(m.level, m.chunk_sizes, m.chunk_bytes);
    let params = packed::pack_params(&opts.params.frames(opts.sizes));
    let record_path = packed::path(&repo.state_dir(), &m.name);
    if cx.unchanged_by_record(
        state.as_ref(),
        ungated,
        &plan,
        &stamp,
        &tree,
        &params,
        &mut summary,
    )? {
        summary.duration_ms = Some(ms(started.elapsed()));
        return Ok(summary);
    }
    let (entry, oids) = cx.pack(state.as_ref(), &plan, gate_record, ungated, &mut summary)?;
    let t = Instant::now();
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let warn = |line: String| out.warn(line);
    let signed = crate::trust::sign::sign_key(
        sh,
        &mut checker,
        &m,
        &key.value,
        &entry,
        req.signing_key.as_deref(),
        &warn,
    )?;
    summary.signed_by = signed.as_ref().and_then(|s| s.signer.clone());
    summary.timings_ms.insert("sign", ms(t.elapsed()));

    let new = NewKey {
        entry: &entry,
        oids: &oids,
        signed: signed.as_ref(),
    };
    cx.land(state, &new, &mut checker, deadline, &mut summary)?;
    if let Some(commit) = &summary.commit {
        save_record(&record_path, &m, &key, commit, &entry, params, tree, &out);
    }
    summary.duration_ms = Some(ms(started.elapsed()));
    Ok(summary)
}

/// Records in this clone that the branch's `commit` holds `entry`'s tar
/// packed with `params`, from the plan `tree` (module `packed`).
#[allow(clippy::too_many_arguments)]
fn save_record(
    path: &Path,
    m: &CacheManifest,
    key: &Key,
    commit: &str,
    entry: &KeyEntry,
    params: String,
    tree: packed::TreeRecord,
    out: &Reporter,
) {
    let record = packed::Record {
        format: packed::RECORD_FORMAT,
        name: m.name.clone(),
        key: key.value.clone(),
        branch: m.branch.clone(),
        commit: commit.to_string(),
        tar_sha256: entry.tar_sha256.clone(),
        tar_size: entry.tar_size,
        pack: params,
        tree: Some(tree),
    };
    // Only an optimisation is lost without it: the next publish packs in full.
    if let Err(e) = packed::save(path, &record) {
        out.warn(format!("{e:#} (the next publish packs in full)"));
    }
}

impl Summary {
    /// What a publish of `key` says before it has done anything.
    fn new(m: &CacheManifest, key: &Key) -> Summary {
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
            keys_on_branch: Vec::new(),
            pruned: Vec::new(),
            gates_required: m.gates.clone(),
            ungated: false,
            signed_by: None,
            duration_ms: None,
            timings_ms: BTreeMap::new(),
            push: None,
        }
    }

    /// The tar and chunks of a packed key.
    fn fill_packed(&mut self, packed: &PackedKey) {
        self.tar_size = Some(packed.entry.tar_size);
        self.tar_sha256 = Some(packed.entry.tar_sha256.clone());
        self.compressed_size = Some(packed.entry.chunks.iter().map(|c| c.size).sum());
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
    fn fill_unchanged(&mut self, s: &BranchState, old: &KeyEntry, by: &'static str) {
        self.status = "unchanged";
        self.unchanged_by = Some(by);
        self.commit = Some(s.commit.clone());
        self.keys_on_branch = s.manifest.keys.keys().cloned().collect();
        self.tar_size = Some(old.tar_size);
        self.tar_sha256 = Some(old.tar_sha256.clone());
        self.compressed_size = Some(old.chunks.iter().map(|c| c.size).sum());
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

/// What one publish works with, once the branch is fetched.
struct Cx<'a> {
    sh: &'a Shell,
    repo: &'a Repo,
    m: &'a CacheManifest,
    key: &'a Key,
    remote: &'a Remote,
    git: &'a CacheGit,
    out: &'a Reporter,
}

/// The key this publish lands: its entry, the blob ids of its new files
/// by name, and its signed statement (none when unsigned).
struct NewKey<'a> {
    entry: &'a KeyEntry,
    oids: &'a BTreeMap<String, String>,
    signed: Option<&'a crate::trust::sign::Signed>,
}

impl Cx<'_> {
    /// An unchanged artifact, found without compressing anything: when
    /// this clone's record (module `packed`) says the branch's chunks are
    /// what today's packing of that very tar makes, the tar's sha256 alone
    /// decides, as `same_artifact` would after a full pack. Hashing the tar
    /// costs a read of the files and SHA-NI, a fraction of zstd and git.
    /// And when the record also says today's files are the very ones that
    /// made that tar (same stamp, not racy), not even the hash is needed.
    /// True (and `summary` says so) when the branch needs nothing.
    #[allow(clippy::too_many_arguments)]
    fn unchanged_by_record(
        &self,
        state: Option<&BranchState>,
        ungated: bool,
        plan: &Plan,
        stamp: &pack::TreeStamp,
        tree: &packed::TreeRecord,
        params: &str,
        summary: &mut Summary,
    ) -> Result<bool> {
        let (m, key, out) = (self.m, self.key, self.out);
        let Some(s) = state else { return Ok(false) };
        let Some(old) = s.manifest.keys.get(&key.value) else {
            return Ok(false);
        };
        let record_path = packed::path(&self.repo.state_dir(), &m.name);
        let record = packed::load(&record_path).filter(|r| {
            old.ungated == ungated
                && r.vouches_for(&key.value, &s.commit, &old.tar_sha256, old.tar_size, params)
        });
        let Some(record) = record else {
            return Ok(false);
        };
        let t = Instant::now();
        let (by, how) = if record.same_tree(stamp) {
            (
                "stat",
                format!(
                    "lstat of {} as at this clone's last publish, ctime included: nothing read, nothing compressed",
                    plural(plan.items.len(), "entry", "entries")
                ),
            )
        } else {
            let bar = out.bar(plan.file_bytes, "digest");
            let digest = pack::tar_digest(plan, &mut |d| bar.set_position(d))?;
            bar.finish_and_clear();
            summary.timings_ms.insert("digest", ms(t.elapsed()));
            if digest.sha256 != old.tar_sha256 || digest.size != old.tar_size {
                return Ok(false);
            }
            // The files hashed to the recorded tar: record today's stamp
            // so that the next publish need not read them.
            let record = packed::Record {
                tree: Some(tree.clone()),
                ..record
            };
            if let Err(e) = packed::save(&record_path, &record) {
                out.warn(format!("{e:#} (the next publish hashes the tar again)"));
            }
            (
                "digest",
                format!(
                    "hashed in {}, nothing compressed",
                    crate::clock::human(t.elapsed())
                ),
            )
        };
        self.git.set_local_branch(&m.branch, &s.commit)?;
        summary.fill_unchanged(s, old, by);
        out.say(format!(
            "unchanged: {} on {} already holds key {} with the same tar (sha256 {}; {how}); no commit, no push",
            m.branch,
            self.remote.shown_name(),
            key.value,
            &old.tar_sha256[..12],
        ));
        Ok(true)
    }

    /// Packs `plan` into chunk blobs in cache.git (reusing the chunks the
    /// branch at `state` holds) and makes this key's entry; returns it and
    /// the blob ids of its new files by name.
    fn pack(
        &self,
        state: Option<&BranchState>,
        plan: &Plan,
        gate_record: Value,
        ungated: bool,
        summary: &mut Summary,
    ) -> Result<(KeyEntry, BTreeMap<String, String>)> {
        let (sh, repo, m, key, out) = (self.sh, self.repo, self.m, self.key, self.out);
        let t = Instant::now();
        let old_entry = state.and_then(|s| s.manifest.keys.get(&key.value).cloned());
        let old_oids = state.map(|s| s.oids()).unwrap_or_default();
        let packed = pack_into_git(
            self.git,
            m,
            &key.value,
            plan,
            old_entry.as_ref(),
            &old_oids,
            out,
        )?;
        summary.timings_ms.insert("pack", ms(t.elapsed()));
        summary.fill_packed(&packed);
        out.say(format!(
            "packed {} ({} of files): tar {} -> zstd {} in {} chunk(s){}, {}",
            plural(plan.items.len(), "entry", "entries"),
            human_bytes(plan.file_bytes),
            human_bytes(packed.entry.tar_size),
            human_bytes(summary.compressed_size.unwrap_or(0)),
            packed.entry.chunks.len(),
            match packed.frames_reused {
                0 => String::new(),
                n => format!(" ({n} not compressed again: their frames were in cache.git)"),
            },
            crate::clock::human(t.elapsed())
        ));

        let mut entry = KeyEntry {
            gates: gate_record,
            ungated,
            source_commit: rev_parse(sh, &repo.root, "HEAD"),
            source_tree: rev_parse(sh, &repo.root, "HEAD^{tree}"),
            key_parts: key.parts.clone(),
            ..packed.entry
        };
        entry.created_at = clock::rfc3339(clock::now_ms());
        Ok((entry, packed.oids))
    }

    /// Merges `new` into the branch and pushes one root commit with a
    /// lease; on a lost lease, fetches, merges and pushes again until the
    /// deadline. Says what happened in `summary` (unchanged when the branch
    /// holds the same bytes already).
    fn land(
        &self,
        mut state: Option<BranchState>,
        new: &NewKey,
        checker: &mut crate::trust::Checker,
        deadline: Duration,
        summary: &mut Summary,
    ) -> Result<()> {
        let (m, key, out, git, remote) = (self.m, self.key, self.out, self.git, self.remote);
        let mut lease = Lease::new(deadline);
        loop {
            let old = state.as_ref().and_then(|s| s.manifest.keys.get(&key.value));
            if let (Some(s), Some(old)) = (&state, old)
                && same_artifact(old, new.entry)
            {
                git.set_local_branch(&m.branch, &s.commit)?;
                summary.status = "unchanged";
                summary.unchanged_by = Some("pack");
                summary.commit = Some(s.commit.clone());
                summary.keys_on_branch = s.manifest.keys.keys().cloned().collect();
                out.say(format!(
                    "unchanged: {} on {} already holds key {} with the same bytes (tar sha256 {}); no commit, no push",
                    m.branch,
                    remote.shown_name(),
                    key.value,
                    &new.entry.tar_sha256[..12]
                ));
                return Ok(());
            }
            let (commit, keys, drops) = self.commit_on(state.as_ref(), new, checker, summary)?;
            let t = Instant::now();
            match self.push(state.as_ref(), &commit, summary) {
                Ok(report) => {
                    summary.push = Some(report);
                    summary.timings_ms.insert("push", ms(t.elapsed()));
                    git.set_local_branch(&m.branch, &commit)?;
                    summary.status = "published";
                    summary.commit = Some(commit.clone());
                    summary.keys_on_branch = keys;
                    if !drops.is_empty() {
                        out.say(format!(
                            "pruned {} ([publish] keep = {}): {}",
                            plural(drops.len(), "key", "keys"),
                            m.keep.unwrap_or(0),
                            drops.join(", ")
                        ));
                    }
                    summary.pruned = drops;
                    out.say(format!(
                        "published {} to {} on {}: commit {} (one root commit), push {}",
                        key.value,
                        m.branch,
                        remote.shown_name(),
                        &commit[..12],
                        crate::clock::human(t.elapsed())
                    ));
                    return Ok(());
                }
                Err(e) if is_stale_lease(&e) => {
                    let Some(pause) = lease.lost() else {
                        return Err(fail(
                            Code::Busy,
                            format!(
                                "lease on {} lost {} in {:.0}s: other publishers kept moving it on {remote}; nothing of key {} was pushed; publish again, or allow more time with [publish] lease_deadline or WARMSTART_PUBLISH_LEASE_DEADLINE",
                                m.branch,
                                plural(lease.lost, "time", "times"),
                                lease.start.elapsed().as_secs_f64(),
                                key.value
                            ),
                        ));
                    };
                    out.say(format!(
                        "{} moved on {remote} while publishing (another publisher): merging again in {} ms",
                        m.branch,
                        pause.as_millis()
                    ));
                    std::thread::sleep(pause);
                    state = healing(|| BranchState::load(git, remote, &m.branch, out))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The root commit of the branch at `state` with `new` merged in and
    /// the keys `[publish] keep` drops (judged again on every attempt:
    /// another publisher may have added some) left out, after checking the
    /// keys it keeps. Returns the commit, its keys and the dropped keys.
    fn commit_on(
        &self,
        state: Option<&BranchState>,
        new: &NewKey,
        checker: &mut crate::trust::Checker,
        summary: &mut Summary,
    ) -> Result<(String, Vec<String>, Vec<String>)> {
        let (m, key, out) = (self.m, self.key, self.out);
        let drops = match m.keep {
            Some(n) => crate::cache::publish::prune::after_publish(
                m,
                key,
                state.map(|s| &s.manifest),
                new.entry,
                n,
            ),
            None => Vec::new(),
        };
        if let Some(s) = state {
            let t = Instant::now();
            let kept: Vec<String> = s
                .manifest
                .keys
                .keys()
                .filter(|k| **k != key.value && !drops.contains(*k))
                .cloned()
                .collect();
            let files = crate::trust::files_of_keys(self.git, &s.entries, &kept)?;
            let warn = |line: String| out.warn(line);
            crate::trust::sign::check_kept(
                self.sh,
                checker,
                m,
                &s.manifest,
                Some(&key.value),
                &files,
                &warn,
            )?;
            summary.timings_ms.insert("check_kept", ms(t.elapsed()));
        }
        let t = Instant::now();
        let (commit, keys) = build_commit(
            self.git,
            m,
            self.remote,
            state,
            &key.value,
            new.entry,
            new.oids,
            &drops,
            new.signed,
        )?;
        summary.timings_ms.insert("commit", ms(t.elapsed()));
        Ok((commit, keys, drops))
    }

    /// Pushes `commit` with a lease on the branch's value at `state`, with
    /// a bar of the new chunks' bytes.
    fn push(
        &self,
        state: Option<&BranchState>,
        commit: &str,
        summary: &Summary,
    ) -> Result<push::Report> {
        let (m, out, git, remote) = (self.m, self.out, self.git, self.remote);
        let new_bytes: u64 = summary
            .chunks
            .iter()
            .filter(|c| !c.reused)
            .map(|c| c.size)
            .sum();
        out.say(format!(
            "pushing {} to {} ({} of new chunks)",
            m.branch,
            remote.shown_name(),
            human_bytes(new_bytes)
        ));
        // The bar's total is the new chunks' bytes: git sends those (its
        // pack adds a few headers and the small files).
        let bar = out.bar(new_bytes, "push");
        let expected = state.map(|s| s.commit.as_str());
        let pushed = push::push(git, remote, m, commit, expected, out, &mut |p| {
            let done = p.bytes_of(new_bytes);
            if done > bar.length().unwrap_or(0) {
                bar.set_length(done);
            }
            bar.set_position(done)
        });
        bar.finish_and_clear();
        pushed
    }
}

/// What `cache resign` did: the `--json` output.
#[derive(Clone, Debug, Serialize)]
pub struct ResignSummary {
    pub name: String,
    pub branch: String,
    /// The branch's commit after (null when nothing was re-signed).
    pub commit: Option<String>,
    pub signed_by: Option<String>,
    pub resigned: Vec<String>,
    /// Keys left as they were, each with why (`[{key, reason}]` in JSON).
    #[serde(serialize_with = "skipped_json")]
    pub skipped: Vec<(String, String)>,
}

fn skipped_json<S: serde::Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(pairs.len()))?;
    for (key, reason) in pairs {
        seq.serialize_element(&serde_json::json!({ "key": key, "reason": reason }))?;
    }
    seq.end()
}

/// `cargo xtask cache resign`.
pub fn resign_run(sh: &Shell, args: crate::cli::cache::ResignArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let out = Reporter::new(args.out.quiet(), args.out.json);
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let s = resign(sh, &repo, &args, &out)?;
    if args.out.json {
        crate::contract::document(&s);
    }
    Ok(())
}

/// Re-signs the keys of cache `args.name` that are trusted at HEAD with
/// the given signing key: same statements, new signatures, one new root
/// commit pushed with a lease. Chunks and warmstart.json stay as they are.
fn resign(
    sh: &Shell,
    repo: &Repo,
    args: &crate::cli::cache::ResignArgs,
    out: &Reporter,
) -> Result<ResignSummary> {
    use crate::trust::sign::signing_key;
    let m = manifest::load(repo, &args.name)?;
    let deadline = lease_deadline(&m)?;
    let remote_name = args.remote.clone().unwrap_or_else(|| m.remote.clone());
    let remote = crate::git::resolve_remote(sh, &repo.root, &remote_name)?;
    let Some(key_file) = signing_key(args.signing_key.as_deref()) else {
        return Err(fail(
            Code::Config,
            format!(
                "cache resign {} needs a signing key: give --signing-key or {}",
                m.name,
                crate::trust::sign::KEY_VAR
            ),
        ));
    };
    let git = CacheGit::open(sh, repo)?.with_lock_wait(deadline);
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let mut lease = Lease::new(deadline);
    loop {
        let state =
            healing(|| BranchState::load(&git, &remote, &m.branch, out))?.ok_or_else(|| {
                fail(
                    Code::NotFound,
                    format!(
                        "{} does not exist on {remote}: nothing to re-sign",
                        m.branch
                    ),
                )
            })?;
        let mut summary = ResignSummary {
            name: m.name.clone(),
            branch: m.branch.clone(),
            commit: None,
            signed_by: None,
            resigned: Vec::new(),
            skipped: Vec::new(),
        };
        let signatures = sign_keys(
            sh,
            &mut checker,
            &m,
            &state,
            args,
            &key_file,
            (&git, &remote),
            out,
            &mut summary,
        )?;
        if signatures.is_empty() {
            out.say(format!("nothing re-signed on {}", m.branch));
            return Ok(summary);
        }
        // The keys `--key` left out go into the commit byte for byte,
        // checked first as a publish checks the keys it keeps.
        if !args.keys.is_empty() {
            check_others(sh, &mut checker, &m, &git, &state, &args.keys, out)?;
        }
        let commit = resign_commit(&git, &m, &remote, &state, &signatures, &summary)?;
        match git.push_branch(
            &remote,
            &m.branch,
            &commit,
            Some(&state.commit),
            &mut |_| {},
        ) {
            Ok(()) => {
                git.set_local_branch(&m.branch, &commit)?;
                out.say(format!(
                    "re-signed {} on {} as {}: commit {}",
                    summary.resigned.join(", "),
                    m.branch,
                    summary.signed_by.as_deref().unwrap_or("?"),
                    &commit[..12]
                ));
                summary.commit = Some(commit);
                return Ok(summary);
            }
            Err(e) if is_stale_lease(&e) => match lease.lost() {
                Some(pause) => std::thread::sleep(pause),
                None => {
                    return Err(fail(
                        Code::Busy,
                        format!(
                            "lease on {} lost {} times: re-sign again",
                            m.branch, lease.lost
                        ),
                    ));
                }
            },
            Err(e) => return Err(e),
        }
    }
}

/// Checks the keys of `state` that `--key` (`keys`) leaves out, as a
/// publish checks the keys it keeps.
fn check_others(
    sh: &Shell,
    checker: &mut crate::trust::Checker,
    m: &CacheManifest,
    git: &CacheGit,
    state: &BranchState,
    keys: &[String],
    out: &Reporter,
) -> Result<()> {
    let others: Vec<String> = state
        .manifest
        .keys
        .keys()
        .filter(|k| !keys.contains(k))
        .cloned()
        .collect();
    let files = crate::trust::files_of_keys(git, &state.entries, &others)?;
    let warn = |line: String| out.warn(line);
    crate::trust::sign::check_kept(sh, checker, m, &state.manifest, None, &files, &warn)?;
    Ok(())
}

/// The root commit of `state` with the new `signatures` (chunks and
/// warmstart.json as they are).
fn resign_commit(
    git: &CacheGit,
    m: &CacheManifest,
    remote: &Remote,
    state: &BranchState,
    signatures: &BTreeMap<String, crate::trust::sign::Signed>,
    summary: &ResignSummary,
) -> Result<String> {
    let refs: BTreeMap<String, &crate::trust::sign::Signed> =
        signatures.iter().map(|(k, s)| (k.clone(), s)).collect();
    let message = format!(
        "warmstart cache {}: re-sign {}\n\nRe-signed by warmstart {} (no chunk changed).\n",
        m.name,
        summary.resigned.join(", "),
        env!("CARGO_PKG_VERSION")
    );
    write_root_commit(
        git,
        m,
        remote,
        &state.manifest,
        &state.oids(),
        &refs,
        &message,
    )
}

/// Signs the statement of each key of `state` that `args` names (all
/// when none) and that is trusted at HEAD, with `key_file`; a key left out
/// goes into `summary.skipped` with why. Exit 12 when the new signature
/// would not be trusted itself, exit 4 for a `--key` the branch lacks.
#[allow(clippy::too_many_arguments)]
fn sign_keys(
    sh: &Shell,
    checker: &mut crate::trust::Checker,
    m: &CacheManifest,
    state: &BranchState,
    args: &crate::cli::cache::ResignArgs,
    key_file: &Path,
    (git, remote): (&CacheGit, &Remote),
    out: &Reporter,
    summary: &mut ResignSummary,
) -> Result<BTreeMap<String, crate::trust::sign::Signed>> {
    use crate::trust::sign::Signed;
    let mut signatures: BTreeMap<String, Signed> = BTreeMap::new();
    for (k, e) in &state.manifest.keys {
        if !args.keys.is_empty() && !args.keys.contains(k) {
            continue;
        }
        let files = state.key_files(git, k)?;
        let old = checker.judge(sh, m, k, e, &files, None)?;
        if !old.trusted() && old.verdict != "ungated" {
            let why = format!(
                "{}: {}; only keys trusted at HEAD are re-signed (republish it instead)",
                old.verdict,
                old.reason.as_deref().unwrap_or("not trusted")
            );
            out.warn(format!("not re-signing key {k}: {why}"));
            summary.skipped.push((k.clone(), why));
            continue;
        }
        let statement = statement::Statement::from_entry(&m.name, k, e)
            .render()
            .into_bytes();
        let sig = crate::trust::sshsig::sign(sh, key_file, &statement)?;
        let new = crate::trust::KeyFiles {
            statement: Some(statement.clone()),
            sig: Some(sig.clone()),
        };
        let v = checker.judge(sh, m, k, e, &new, None)?;
        if !v.trusted() && v.verdict != "ungated" {
            return Err(fail(
                Code::Untrusted,
                format!(
                    "the signing key {} is not trusted for cache {} ({}; signer seen: {}): add its public key to {} first; nothing was pushed",
                    key_file.display(),
                    m.name,
                    v.reason.as_deref().unwrap_or("not trusted"),
                    v.signer.as_deref().unwrap_or("none"),
                    checker.root.signers_where()
                ),
            ));
        }
        summary.signed_by = v.signer.clone();
        summary.resigned.push(k.clone());
        signatures.insert(
            k.clone(),
            Signed {
                statement,
                sig,
                signer: v.signer,
            },
        );
    }
    for k in &args.keys {
        if !state.manifest.keys.contains_key(k) {
            return Err(fail(
                Code::NotFound,
                format!("{} on {remote} has no key {k}", m.branch),
            ));
        }
    }
    Ok(signatures)
}

/// `WARMSTART_PUBLISH_LEASE_DEADLINE`, else `[publish] lease_deadline`,
/// else `DEFAULT_LEASE_DEADLINE`. A value that is not a positive duration
/// is an error (exit 10) naming it, never the default.
pub fn lease_deadline(m: &CacheManifest) -> Result<Duration> {
    const VAR: &str = "WARMSTART_PUBLISH_LEASE_DEADLINE";
    match std::env::var(VAR) {
        Ok(v) => clock::parse_positive_duration(&v).map_err(|e| {
            fail(
                Code::Config,
                format!("{VAR}={v:?}: {e} (how long a publish retries a lost lease), or unset it"),
            )
        }),
        Err(std::env::VarError::NotPresent) => {
            Ok(m.lease_deadline.unwrap_or(DEFAULT_LEASE_DEADLINE))
        }
        Err(std::env::VarError::NotUnicode(v)) => Err(fail(
            Code::Config,
            format!("{VAR}={v:?} is not text: give a duration such as 120s, or unset it"),
        )),
    }
}

/// The retry schedule of one publish's push: pauses that double from
/// `LEASE_PAUSE.0` to `LEASE_PAUSE.1`, each between half and all of its
/// nominal length, until the deadline.
pub(crate) struct Lease {
    pub(crate) start: Instant,
    deadline: Duration,
    pub(crate) lost: usize,
    rng: u64,
}

impl Lease {
    pub(crate) fn new(deadline: Duration) -> Lease {
        // Publishers that start together must not draw the same pauses:
        // seed from the process id and the clock.
        let seed = (u64::from(std::process::id()) << 32) ^ clock::now_ns() as u64;
        Lease {
            start: Instant::now(),
            deadline,
            lost: 0,
            rng: seed | 1,
        }
    }

    /// Records a lost lease; the pause before the next attempt, or `None`
    /// when that attempt would start past the deadline.
    pub(crate) fn lost(&mut self) -> Option<Duration> {
        self.lost += 1;
        let shift = (self.lost - 1).min(16) as u32;
        let nominal = LEASE_PAUSE.0.saturating_mul(1 << shift).min(LEASE_PAUSE.1);
        // xorshift64: jitter needs no quality, only variety.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let frac = (self.rng >> 11) as f64 / (1u64 << 53) as f64;
        let pause = nominal.mul_f64(0.5 + frac / 2.0);
        (self.start.elapsed() + pause < self.deadline).then_some(pause)
    }
}

pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The same artifact: same tar, same chunks, and the same gate standing (a
/// gated publish of bytes first published ungated records its gates).
fn same_artifact(old: &KeyEntry, new: &KeyEntry) -> bool {
    old.tar_sha256 == new.tar_sha256
        && old.tar_size == new.tar_size
        && old.chunks == new.chunks
        && old.frames == new.frames
        && old.index == new.index
        && old.compression == new.compression
        && old.ungated == new.ungated
}

fn print_plan(out: &Reporter, m: &CacheManifest, key: &Key, plan: &Plan, remote: &Remote) {
    out.say("dry run: nothing is packed, written or pushed");
    out.say(format!("cache    {} ({})", m.name, m.file.display()));
    out.say(format!("key      {}", key.value));
    for p in &key.parts {
        out.say(format!("  {} = {}", p.name, p.value));
    }
    out.say(format!(
        "files    {} entries ({} regular files, {}) from {}",
        plan.items.len(),
        plan.regular_files(),
        human_bytes(plan.file_bytes),
        m.pack_root.display()
    ));
    out.say(format!("branch   {}", m.branch));
    out.say(format!("remote   {remote}"));
    out.say(format!(
        "pack     zstd level {}, one frame per chunk of about {} of tar ({} to {}), at most {} compressed",
        m.level,
        human_bytes(m.chunk_sizes.avg),
        human_bytes(m.chunk_sizes.min),
        human_bytes(m.chunk_sizes.max),
        human_bytes(m.chunk_bytes)
    ));
    if m.gates.is_empty() {
        out.say("gates    none required");
    } else {
        out.say(format!("gates    {} (required)", m.gates.join(", ")));
    }
}

/// The gate record a publish relies on, and whether it bypassed gates.
fn gate_record(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    allow_ungated: bool,
    out: &Reporter,
) -> Result<(Value, bool)> {
    if m.gates.is_empty() {
        if allow_ungated {
            out.warn(format!(
                "--allow-ungated has no effect: {} requires no gates",
                m.file.display()
            ));
        }
        return Ok((Value::Null, false));
    }
    // Exit 9 naming the missing gate when HEAD's tree is not green (local
    // records: `cargo xtask gates fetch` takes those pushed elsewhere).
    let green = crate::gates::require_green(sh, repo, &m.gates).with_context(|| {
        format!(
            "publishing {} requires gates [{}]",
            m.name,
            m.gates.join(", ")
        )
    });
    // `[trust] signed_gates`: a green record anyone could push is not enough.
    let green = green.and_then(|record| {
        if m.trust.signed_gates {
            let parsed: crate::gates::record::Record =
                serde_json::from_value(record.clone()).context("reading the gate record again")?;
            crate::trust::gatesig::require_signed(sh, repo, &parsed, &m.gates).with_context(
                || format!("{} sets [trust] signed_gates = true", m.file.display()),
            )?;
        }
        Ok(record)
    });
    match green {
        Ok(record) => Ok((record, false)),
        // Green anyway: nothing was bypassed, so nothing is flagged.
        Err(e) if allow_ungated => {
            out.loud(format!(
                "PUBLISHING WITHOUT GATES ({e:#}): --allow-ungated publishes anyway and the branch records \"ungated\": true"
            ));
            Ok((Value::Null, true))
        }
        Err(e) => Err(e),
    }
}

fn rev_parse(sh: &Shell, root: &Path, rev: &str) -> Option<String> {
    cmd!(sh, "git -C {root} rev-parse --verify --quiet {rev}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()
        .filter(|s| !s.is_empty())
}

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
    fn key_files(&self, git: &CacheGit, key: &str) -> Result<crate::trust::KeyFiles> {
        let mut all = crate::trust::files_of_keys(git, &self.entries, &[key.to_string()])?;
        Ok(all.remove(key).expect("asked for"))
    }

    /// Blob ids by file name.
    fn oids(&self) -> BTreeMap<String, String> {
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
fn drop_broken_keys(m: &mut BranchManifest, entries: &[TreeEntry], branch: &str, out: &Reporter) {
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
        if let Some(i) = e.index.as_ref().filter(|i| broken(&i.file, i.size)) {
            out.warn(format!(
                "dropping key {key} from {branch}: its file index {} is missing or has the wrong size",
                i.file
            ));
            return false;
        }
        true
    });
}

/// The packed key, the blob ids of its files (chunks and index) by name,
/// and which chunks were already on the branch.
struct PackedKey {
    entry: KeyEntry,
    oids: BTreeMap<String, String>,
    reused: Vec<bool>,
    /// Chunks whose earlier frame was used instead of compressing again.
    frames_reused: usize,
}

/// Packs the plan into chunk blobs in cache.git. Chunk files live in a
/// scratch directory inside cache.git (same file system as the objects) and
/// are deleted as soon as git has them; a chunk identical to the one the
/// branch already holds at that place is not written again.
fn pack_into_git(
    git: &CacheGit,
    m: &CacheManifest,
    key: &str,
    plan: &Plan,
    old: Option<&KeyEntry>,
    old_oids: &BTreeMap<String, String>,
    out: &Reporter,
) -> Result<PackedKey> {
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
    let opts = PackOptions::new(m.level, m.chunk_sizes, m.chunk_bytes);
    // A chunk the branch holds already, at any place (content-defined cuts
    // move chunks, they do not change them): same bytes, same blob.
    let on_branch: BTreeMap<&str, &String> = old
        .iter()
        .flat_map(|o| o.chunks.iter())
        .filter_map(|c| Some((c.sha256.as_str(), old_oids.get(&c.file)?)))
        .collect();
    let earlier = earlier_frames(old, old_oids, &opts);
    let reuse = |raw_sha256: &str| local_blob(git, earlier.get(raw_sha256)?);
    let mut frames_reused = 0;
    let mut tx = Some(tx);
    let result = pack::pack(
        plan,
        opts,
        &reuse,
        &scratch.0,
        // Scratch names only: the count, and so the width of the names on
        // the branch, is known once packing ends.
        &|i| format!("chunk-{i}"),
        &mut |c: ChunkFile| {
            frames_reused += usize::from(c.reused_frame);
            if let Some(oid) = on_branch.get(c.sha256.as_str()) {
                std::fs::remove_file(&c.path)
                    .with_context(|| format!("removing {}", c.path.display()))?;
                reused.insert(c.index, (*oid).clone());
                return Ok(());
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
    let written = writer
        .join()
        .map_err(|_| anyhow!("the git writer thread panicked"))?;
    // A git failure explains a pack failure better than "writer stopped".
    let (packed, mut oids) = match (result, written) {
        (Ok(p), Ok(o)) => (p, o),
        (_, Err(e)) => {
            return Err(e.context(format!(
                "writing chunks of {key} into {}",
                git.dir.display()
            )));
        }
        (Err(e), _) => return Err(e),
    };
    let n = packed.chunks.len();
    let is_reused: Vec<bool> = (0..n).map(|i| reused.contains_key(&i)).collect();
    oids.extend(reused);
    let (entry, files) = key_entry(git, key, &packed, oids, opts)?;
    Ok(PackedKey {
        entry,
        oids: files,
        reused: is_reused,
        frames_reused,
    })
}

/// The blob ids of the old entry's chunks by the sha256 of their raw
/// bytes, when its frames were made exactly as today's would be (same
/// chunker sizes, zstd version and parameters): such a chunk of today's
/// tar need not be compressed again if its blob is in cache.git (read
/// with `local_blob`, checked by `chunks` before use).
fn earlier_frames(
    old: Option<&KeyEntry>,
    old_oids: &BTreeMap<String, String>,
    opts: &PackOptions,
) -> BTreeMap<String, String> {
    let today = opts.params.frames(opts.sizes);
    let Some(old) = old.filter(|o| o.frames.as_ref() == Some(&today)) else {
        return BTreeMap::new();
    };
    old.chunks
        .iter()
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
/// count is known, the file index stored as a blob), and the blob ids of
/// its files by name; `oids` holds the chunks' ids by index.
fn key_entry(
    git: &CacheGit,
    key: &str,
    packed: &pack::Packed,
    mut oids: BTreeMap<usize, String>,
    opts: PackOptions,
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
    let index_bytes = pack::index_file(&packed.index)?;
    let index = IndexFile {
        file: index_name(key),
        size: index_bytes.len() as u64,
        sha256: crate::hex::encode(&Sha256::digest(&index_bytes)),
    };
    let index_oid = git
        .write_blob_bytes(&index_bytes)
        .with_context(|| format!("storing {} in {}", index.file, git.dir.display()))?;
    files.insert(index.file.clone(), index_oid);
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
    };
    Ok((entry, files))
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

/// A scratch directory removed when dropped (also on error).
struct Scratch(PathBuf);

impl Scratch {
    fn new(path: PathBuf) -> Result<Scratch> {
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Scratch(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

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
fn build_commit(
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
fn write_root_commit(
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
        if let Some(i) = &e.index {
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

/// Where the words go: results on stdout, warnings on stderr, progress bars
/// on stderr only when it is a terminal.
pub(crate) struct Reporter {
    quiet: bool,
    json: bool,
    tty: bool,
}

impl Reporter {
    pub(crate) fn new(quiet: bool, json: bool) -> Reporter {
        Reporter {
            quiet,
            json,
            tty: std::io::stderr().is_terminal(),
        }
    }

    pub(crate) fn say(&self, msg: impl AsRef<str>) {
        if !self.quiet && !self.json {
            println!("{}", msg.as_ref());
        }
    }

    pub(crate) fn warn(&self, msg: impl AsRef<str>) {
        if !self.quiet {
            eprintln!("warning: {}", msg.as_ref());
        }
    }

    /// A warning nobody should miss: printed even with --quiet.
    fn loud(&self, msg: impl AsRef<str>) {
        eprintln!("warning: {}", msg.as_ref());
    }

    /// A byte bar (`crate::progress`) on a terminal, unless `--quiet`.
    pub(crate) fn bar(&self, len: u64, what: &str) -> indicatif::ProgressBar {
        if !self.tty || self.quiet {
            return crate::progress::hidden();
        }
        crate::progress::bytes_bar(len, what)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(sha: &str) -> KeyEntry {
        KeyEntry {
            archive: "k.tar.zst".into(),
            compression: "zstd".into(),
            chunks: vec![Chunk {
                file: "k.tar.zst.part000".into(),
                size: 10,
                sha256: sha.repeat(64),
                raw_size: None,
                raw_sha256: None,
            }],
            tar_sha256: "b".repeat(64),
            tar_size: 1024,
            files: 1,
            key_parts: vec![],
            source_commit: None,
            source_tree: None,
            gates: Value::Null,
            ungated: false,
            created_at: "2026-01-01T00:00:00Z".into(),
            tool_version: "warmstart 0".into(),
            frames: None,
            index: None,
        }
    }

    #[test]
    fn sameness_ignores_time_and_source_but_not_bytes_or_gates() {
        let a = entry("a");
        let mut b = entry("a");
        b.created_at = "2027-01-01T00:00:00Z".into();
        b.source_commit = Some("c".repeat(40));
        assert!(same_artifact(&a, &b));
        assert!(!same_artifact(&a, &entry("c")));
        b.ungated = true;
        assert!(!same_artifact(&a, &b));
    }

    #[test]
    fn lease_pauses_grow_with_jitter_and_stop_at_the_deadline() {
        let mut a = Lease::new(Duration::from_secs(3600));
        let mut b = Lease::new(Duration::from_secs(3600));
        b.rng = a.rng ^ 0x9e37_79b9_7f4a_7c15;
        let pa: Vec<Duration> = (0..12).map(|_| a.lost().unwrap()).collect();
        let pb: Vec<Duration> = (0..12).map(|_| b.lost().unwrap()).collect();
        for (i, p) in pa.iter().enumerate() {
            let nominal = (LEASE_PAUSE.0 * (1 << i.min(16))).min(LEASE_PAUSE.1);
            assert!(*p >= nominal / 2 && *p <= nominal, "pause {i}: {p:?}");
        }
        assert_ne!(pa, pb, "two publishers drew the same pauses");
        let mut short = Lease::new(Duration::ZERO);
        assert_eq!(short.lost(), None);
        assert_eq!(short.lost, 1);
    }

    #[test]
    fn broken_keys_are_dropped() {
        let mut m = BranchManifest::new();
        m.keys.insert("k".into(), entry("a"));
        m.keys.insert("j".into(), {
            let mut e = entry("a");
            e.chunks[0].file = "j.tar.zst.part000".into();
            e
        });
        let entries = vec![TreeEntry {
            mode: "100644".into(),
            kind: "blob".into(),
            oid: "0".repeat(40),
            size: Some(10),
            name: "k.tar.zst.part000".into(),
        }];
        drop_broken_keys(&mut m, &entries, "b", &Reporter::new(true, false));
        assert_eq!(m.keys.keys().collect::<Vec<_>>(), ["k"]);
        // A key whose file index is missing, or of another size, goes too.
        let index = |size| IndexFile {
            file: "k.files.zst".into(),
            size,
            sha256: "d".repeat(64),
        };
        let mut with_index = entries.clone();
        with_index.push(TreeEntry {
            size: Some(7),
            name: "k.files.zst".into(),
            ..entries[0].clone()
        });
        for (tree, size, kept) in [(&with_index, 7, 1), (&with_index, 8, 0), (&entries, 7, 0)] {
            let mut m = BranchManifest::new();
            let mut e = entry("a");
            e.index = Some(index(size));
            m.keys.insert("k".into(), e);
            drop_broken_keys(&mut m, tree, "b", &Reporter::new(true, false));
            assert_eq!(m.keys.len(), kept, "index size {size}");
        }
    }
}
