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
//! merge is redone on the new value (the packed chunks are kept). With
//! `--missing` (module `missing`) the branch is fetched first, and a key it
//! holds that HEAD's trust policy accepts ends the publish there.
//!
//! Never: commit with a parent, push without a lease, replace a branch that
//! is not a cache branch, or push when this key's bytes are already there.

pub mod blobs;
pub mod branch;
pub mod chunks;
pub mod commit;
pub mod lease;
pub mod migrate;
pub mod missing;
pub mod oci;
pub mod pack;
pub mod packed;
pub mod prune;
pub mod push;
pub mod pushed;
pub mod report;
pub mod resign;
pub mod summary;
pub mod unchanged;
pub mod walk;
use anyhow::{Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xshell::{Shell, cmd};

use crate::cache::format::KeyEntry;
use crate::cache::format::manifest::{CacheManifest, Key};
use crate::cache::human_bytes;
use crate::cache::manifests;
use crate::cache::publish::blobs::pack_into_git;
use crate::cache::publish::branch::BranchState;
use crate::cache::publish::commit::build_commit;
use crate::cache::publish::lease::{Lease, lease_deadline};
use crate::cache::publish::pack::{PackOptions, Plan};
use crate::cache::publish::report::{Reporter, plural};
use crate::cli::cache::PublishArgs;
use crate::clock;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, healing, is_stale_lease};
use crate::repo::Repo;

pub use resign::run as resign_run;
pub use summary::{ChunkJson, RemoteJson, Summary};

/// What to publish (the parsed command line, or the demo's request).
#[derive(Clone, Debug, Default)]
pub struct Request {
    pub name: String,
    pub key_only: bool,
    pub dry_run: bool,
    pub allow_ungated: bool,
    /// `--allow-unpushed`: publish from a HEAD the remote does not have.
    pub allow_unpushed: bool,
    pub remote: Option<String>,
    /// `--signing-key` (else `WARMSTART_SIGNING_KEY`, else unsigned).
    pub signing_key: Option<PathBuf>,
    /// `--missing`: publish only when the remote lacks a key HEAD's trust
    /// policy accepts (module `missing`).
    pub missing: bool,
    /// The key the artifact was built for (a write-back's): the publish is
    /// refused when today's pins give another, so a commit that lands
    /// between the build and the publish cannot give it the wrong key.
    pub expect_key: Option<String>,
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
            allow_unpushed: a.allow_unpushed,
            remote: a.remote,
            signing_key: a.signing_key,
            missing: a.missing,
            expect_key: None,
            json: a.out.json,
            quiet: a.out.quiet(),
        }
    }
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
    let m = manifests::load(repo, &req.name)?;
    let deadline = lease_deadline(&m)?;
    let key = manifests::compute_key(sh, repo, &m)?;
    built_for(req, &m, &key)?;
    let mut summary = Summary::new(&m, &key);
    if req.key_only {
        out.say(&key.value);
        for p in &key.parts {
            out.say(format!("  {} = {}", p.name, p.value));
        }
        return Ok(summary);
    }
    if let Some(registry) = &m.registry {
        missing::registry(req.missing, &m, registry, &out)?;
        return oci::publish(sh, repo, req, &m, registry, &key, summary, &out, started);
    }

    let remote_name = req.remote.clone().unwrap_or_else(|| m.remote.clone());
    let remote = crate::git::resolve_remote(sh, &repo.root, &remote_name)?;
    summary.remote = Some(RemoteJson::of(&remote));
    // `--missing` looks at the remote before the pack root: a present key
    // costs the branch fetch and its trust check, nothing else.
    let mut fetched = None;
    let mut replace = false;
    let mut checked = None;
    if req.missing {
        let (git, state) = open_and_fetch(sh, repo, &m, &remote, deadline, &out, &mut summary)?;
        let t = Instant::now();
        let found = missing::standing(sh, repo, &m, &key, (&git, &remote), state.as_ref())?;
        summary.timings_ms.insert("verify", ms(t.elapsed()));
        out.say(&found.line);
        summary.missing = Some(found.json.clone());
        if found.json.present {
            summary.status = "present";
            summary.previous_commit = state.as_ref().map(|s| s.commit.clone());
            summary.commit = summary.previous_commit.clone();
            summary.keys_on_branch = state
                .as_ref()
                .map(|s| s.manifest.keys.keys().cloned().collect())
                .unwrap_or_default();
            summary.duration_ms = Some(ms(started.elapsed()));
            return Ok(summary);
        }
        replace = found.replace;
        if m.build.is_some() && !req.dry_run {
            // A build may take an hour: what would refuse its publish is
            // asked before it, not after.
            pushed::check(sh, &repo.root, &remote, req.allow_unpushed, &out)?;
            checked = Some(gate_record(sh, repo, &m, req.allow_ungated, &out)?);
            missing::build_missing(sh, repo, &m, &key, &out)?;
        }
        fetched = Some((git, state));
    }
    let (plan, planned_at_ns) = walk(&m, &mut summary)?;
    if req.dry_run {
        summary.status = "dry-run";
        print_plan(&out, &m, &key, &plan, &remote);
        return Ok(summary);
    }
    let (gate_record, ungated) = match checked {
        Some(checked) => checked,
        None => {
            pushed::check(sh, &repo.root, &remote, req.allow_unpushed, &out)?;
            gate_record(sh, repo, &m, req.allow_ungated, &out)?
        }
    };
    let stamped = stamp(&plan, planned_at_ns, &mut summary);
    summary.ungated = ungated;

    out.say(format!(
        "publishing {} (key {}) to {} on {remote}",
        m.name, key.value, m.branch
    ));
    let (git, state) = match fetched {
        Some(f) => f,
        None => open_and_fetch(sh, repo, &m, &remote, deadline, &out, &mut summary)?,
    };
    summary.previous_commit = state.as_ref().map(|s| s.commit.clone());

    let cx = Cx {
        sh,
        repo,
        m: &m,
        key: &key,
        remote: &remote,
        git: &git,
        out: &out,
        replace,
    };
    let gates = (gate_record, ungated);
    cx.publish_plan(state, &plan, stamped, gates, req, deadline, &mut summary)?;
    summary.duration_ms = Some(ms(started.elapsed()));
    Ok(summary)
}

/// Refuses a publish whose artifact was built for another key than HEAD's
/// pins give now (`Request::expect_key`).
fn built_for(req: &Request, m: &CacheManifest, key: &Key) -> Result<()> {
    if let Some(want) = req.expect_key.as_ref().filter(|w| **w != key.value) {
        return Err(fail(
            Code::NotGreen,
            format!(
                "cache {} was built for key {want}, but HEAD's pins now give {}: HEAD moved after the build, so it is not published (build and publish again at the new HEAD)",
                m.name, key.value
            ),
        ));
    }
    Ok(())
}

/// cache.git (waiting for its lock up to `deadline`) and the branch as
/// fetched from `remote` now, timed as `fetch`.
fn open_and_fetch(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    remote: &Remote,
    deadline: Duration,
    out: &Reporter,
    summary: &mut Summary,
) -> Result<(CacheGit, Option<BranchState>)> {
    let mut git = CacheGit::open(sh, repo)?.with_lock_wait(deadline);
    git.set_network(&m.network)?;
    let t = Instant::now();
    let state = healing(|| BranchState::load(&git, remote, &m.branch, out))?;
    summary.timings_ms.insert("fetch", ms(t.elapsed()));
    Ok((git, state))
}

/// The walk of the pack root, timed as `plan`, and when it began.
fn walk(m: &CacheManifest, summary: &mut Summary) -> Result<(Plan, i64)> {
    let t = Instant::now();
    let planned_at_ns = clock::now_ns();
    let plan = pack::plan(m)?;
    summary.timings_ms.insert("plan", ms(t.elapsed()));
    summary.files = Some(plan.items.len() as u64);
    summary.file_bytes = Some(plan.file_bytes);
    Ok((plan, planned_at_ns))
}

/// The plan's stamp (timed as `stamp`) and the record of it that a
/// publish leaves in this clone (module `packed`).
fn stamp(
    plan: &Plan,
    planned_at_ns: i64,
    summary: &mut Summary,
) -> (pack::TreeStamp, packed::TreeRecord) {
    let t = Instant::now();
    let stamp = plan.stamp();
    let tree = packed::TreeRecord {
        stamp: stamp.digest.clone(),
        planned_at_ns,
    };
    summary.timings_ms.insert("stamp", ms(t.elapsed()));
    (stamp, tree)
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

/// What one publish works with, once the branch is fetched.
struct Cx<'a> {
    sh: &'a Shell,
    repo: &'a Repo,
    m: &'a CacheManifest,
    key: &'a Key,
    remote: &'a Remote,
    git: &'a CacheGit,
    out: &'a Reporter,
    /// `--missing` found the key refused by HEAD's trust policy: land it
    /// anew even when the branch holds the same bytes.
    replace: bool,
}

/// The key this publish lands: its entry, the blob ids of its new files
/// by name, and its signed statement (none when unsigned).
struct NewKey<'a> {
    entry: &'a KeyEntry,
    oids: &'a BTreeMap<String, String>,
    signed: Option<&'a crate::trust::sign::Signed>,
}

impl Cx<'_> {
    /// Publishes `plan` (stamped as `tree`) onto the branch at `state`:
    /// nothing when this clone's record shows the branch holds it already,
    /// else pack, sign, land, and record what was packed.
    #[allow(clippy::too_many_arguments)]
    fn publish_plan(
        &self,
        state: Option<BranchState>,
        plan: &Plan,
        (stamp, tree): (pack::TreeStamp, packed::TreeRecord),
        (gate_record, ungated): (Value, bool),
        req: &Request,
        deadline: Duration,
        summary: &mut Summary,
    ) -> Result<()> {
        let (m, key) = (self.m, self.key);
        let opts = PackOptions::new(m.level, m.chunk_sizes, m.chunk_bytes);
        let params = packed::pack_params(&opts.params.frames(opts.sizes));
        let record_path = packed::path(&self.repo.state_dir(), &m.name);
        let (s, p) = (state.as_ref(), plan);
        if !self.replace
            && self.unchanged_by_record(s, ungated, p, &stamp, &tree, &params, summary)?
        {
            return Ok(());
        }
        let planned = (plan, tree.planned_at_ns);
        let (entry, oids) = self.pack(state.as_ref(), planned, gate_record, ungated, summary)?;
        let (mut checker, signed) = self.sign(&entry, req.signing_key.as_deref(), summary)?;
        let new = NewKey {
            entry: &entry,
            oids: &oids,
            signed: signed.as_ref(),
        };
        self.land(state, &new, &mut checker, deadline, summary)?;
        if let Some(commit) = &summary.commit {
            save_record(&record_path, m, key, commit, &entry, params, tree, self.out);
        }
        Ok(())
    }

    /// This key's statement signed with `signing_key` (else
    /// `WARMSTART_SIGNING_KEY`; none when neither is set), timed as `sign`,
    /// and the trust checker that landing the key checks the others with.
    fn sign(
        &self,
        entry: &KeyEntry,
        signing_key: Option<&Path>,
        summary: &mut Summary,
    ) -> Result<(crate::trust::Checker, Option<crate::trust::sign::Signed>)> {
        let t = Instant::now();
        let mut checker = crate::trust::Checker::new(self.sh, self.repo)?;
        let warn = |line: String| self.out.warn(line);
        let signed = crate::trust::sign::sign_key(
            self.sh,
            &mut checker,
            self.m,
            &self.key.value,
            entry,
            signing_key,
            &warn,
        )?;
        summary.signed_by = signed.as_ref().and_then(|s| s.signer.clone());
        summary.timings_ms.insert("sign", ms(t.elapsed()));
        Ok((checker, signed))
    }

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
        (plan, planned_at_ns): (&Plan, i64),
        gate_record: Value,
        ungated: bool,
        summary: &mut Summary,
    ) -> Result<(KeyEntry, BTreeMap<String, String>)> {
        let (sh, repo, m, key, out) = (self.sh, self.repo, self.m, self.key, self.out);
        let t = Instant::now();
        let old_oids = state.map(|s| s.oids()).unwrap_or_default();
        let prior = blobs::Prior {
            branch: state.map(|s| &s.manifest),
            oids: &old_oids,
            remote: self.remote,
            record: &unchanged::path(&repo.state_dir(), &m.name),
            planned_at_ns,
        };
        let packed = pack_into_git(self.git, m, key, plan, prior, out)?;
        summary.timings_ms.insert("pack", ms(t.elapsed()));
        summary.fill_packed(&packed);
        out.say(format!(
            "packed {} ({} of files): tar {} -> zstd {} in {} chunk(s){}, {}",
            plural(plan.items.len(), "entry", "entries"),
            human_bytes(plan.file_bytes),
            human_bytes(packed.entry.tar_size),
            human_bytes(summary.compressed_size.unwrap_or(0)),
            packed.entry.chunks.len(),
            match (packed.frames_reused, packed.frames_fetched) {
                (0, _) => String::new(),
                (n, 0) => format!(" ({n} not compressed again: their frames were in cache.git)"),
                (n, f) => format!(
                    " ({n} not compressed again: their frames were in cache.git, {f} fetched by id)"
                ),
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
                && !self.replace
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
            if let (Some(s), Some(old)) = (&state, old) {
                crate::trust::sign::guard_replacement(
                    self.sh,
                    self.repo,
                    checker,
                    m,
                    (git, &s.entries),
                    &key.value,
                    old,
                    new.signed,
                )?;
            }
            let (commit, keys, drops) = self.commit_on(state.as_ref(), new, checker, summary)?;
            let t = Instant::now();
            match self.push(state.as_ref(), &commit, summary) {
                Ok(report) => {
                    summary.push = Some(report);
                    summary.timings_ms.insert("push", ms(t.elapsed()));
                    return self.landed(&commit, keys, drops, t, summary);
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

    /// Records and says that `commit` (holding `keys`, without `drops`)
    /// is the branch now, pushed in the time since `pushed_from`.
    fn landed(
        &self,
        commit: &str,
        keys: Vec<String>,
        drops: Vec<String>,
        pushed_from: Instant,
        summary: &mut Summary,
    ) -> Result<()> {
        let (m, key, out, remote) = (self.m, self.key, self.out, self.remote);
        self.git.set_local_branch(&m.branch, commit)?;
        summary.status = "published";
        summary.commit = Some(commit.to_string());
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
            crate::clock::human(pushed_from.elapsed())
        ));
        Ok(())
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
        && old.index_parts == new.index_parts
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
    // records: `cargo xtask gates fetch` takes those pushed elsewhere); exit
    // 12 when only signed entries count (`[trust] signed_gates` here or in
    // trust.toml) and one is not: a record anyone could push is not enough.
    let signed = m
        .trust
        .signed_gates
        .then(|| format!("{} sets [trust] signed_gates = true", m.file.display()));
    let green = crate::gates::require_green(sh, repo, &m.gates, signed).with_context(|| {
        format!(
            "publishing {} requires gates [{}]",
            m.name,
            m.gates.join(", ")
        )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{BranchManifest, Chunk, IndexFile};
    use crate::cache::publish::branch::drop_broken_keys;
    use crate::git::TreeEntry;

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
            index_parts: Vec::new(),
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
