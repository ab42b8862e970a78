//! The cold path: recover, fetch, stage, compare, install, stamp. Nothing
//! reaches the target before every check passed, and the stamp is written
//! only for a complete install.

use super::*;

/// Removes a staging directory unless it was handed on (swapped or merged).
pub(super) struct Staging(Option<PathBuf>);

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = unpack::remove_tree(&p);
        }
    }
}

/// When the stand-in chosen again is the very install the stamp describes
/// (same key and tar, here, ready), nothing is fetched or unpacked: only
/// the stamp's `checked_at_ms` moves, so the next recheck is a full
/// interval away.
pub(super) fn same_stand_in(
    m: &CacheManifest,
    stamp_file: &Path,
    branch: &Branch,
    key: &Key,
    partial: &stamp::Partial,
    start: Instant,
    phases: &Phases,
) -> Result<Option<RestoreOutcome>> {
    let Loaded::Found(mut s) = stamp::load(stamp_file) else {
        return Ok(None);
    };
    let tar = match &branch.content {
        Content::V1(bm) => bm.keys.get(&key.value).map(|e| e.tar_sha256.as_str()),
        Content::Legacy { .. } => None,
    };
    if s.key != key.value
        || tar != Some(s.tar_sha256.as_str())
        || s.matches(&key.value, &key.parts, &m.restore_path, m.mode)
            .is_err()
        || ready(m).is_err()
    {
        return Ok(None);
    }
    s.partial = Some(partial.clone());
    stamp::store(stamp_file, &s)?;
    let mut o = from_stamp(m, &s, State::Partial, start, phases.clone());
    o.commit = branch.commit.clone();
    Ok(Some(o))
}

/// Where a cold restore puts what it staged.
pub(super) struct Installed<'a> {
    m: &'a CacheManifest,
    state_dir: &'a Path,
    stamp_file: &'a Path,
    journal: &'a Path,
    overlay_file: &'a Path,
}

/// What the record of a replace-mode install says (`delta::remember`).
pub(super) struct ToRecord<'a> {
    key: &'a str,
    tar_sha256: &'a str,
    index: &'a delta::NewIndex,
    /// Every file was checked against the index (`delta::Record::verified`).
    verified: bool,
    /// A delta: the tree before keeps the names of the inodes it shares
    /// with this one, as the shadow (`unpack::Retire::Shadow`).
    delta: bool,
}

impl Installed<'_> {
    /// Swaps `dest` in (replace) or merges it (merge, overlay). In replace
    /// mode the record is taken first, of `dest` (`record`).
    pub(super) fn swap_or_merge(
        &self,
        dest: &Path,
        overlay_plan: Option<&overlay::Plan>,
        record: Option<ToRecord<'_>>,
    ) -> Result<()> {
        let (m, target) = (self.m, &self.m.restore_path);
        // No stamp (nor delta record) while the target is being replaced: a
        // crash between the swap and the new stamp must not leave the old
        // stamp describing the new tree.
        stamp::remove(self.stamp_file)?;
        delta::forget(self.state_dir, &m.name)?;
        // The shadow of the tree before is not the installed tree: it goes
        // before the record, so the links it drops move no recorded stat.
        unpack::remove_shadow(target)?;
        let merge = unpack::MergeOptions {
            absolute_symlinks: m.absolute_symlinks.clone(),
            ..unpack::MergeOptions::default()
        };
        match m.mode {
            Mode::Replace => {
                let kept = record.as_ref().and_then(|r| {
                    let kept = delta::remember_or_warn(
                        self.state_dir,
                        &m.name,
                        dest,
                        r.key,
                        r.tar_sha256,
                        r.index,
                        r.verified,
                    );
                    kept.filter(|_| r.delta)
                });
                match &kept {
                    Some(keep) => {
                        unpack::swap_dir_then(dest, target, unpack::Retire::Shadow(keep))?
                    }
                    None => unpack::swap_dir(dest, target)?,
                }
            }
            Mode::Merge => {
                unpack::merge_into_with(dest, target, self.journal, merge)?;
            }
            Mode::Overlay => {
                let plan = overlay_plan.expect("overlay has a plan");
                // Before the merge, so that a merge completed by the next
                // run's journal replay leaves files the record knows.
                overlay::save(self.overlay_file, &plan.record)?;
                unpack::merge_into_with(dest, target, self.journal, merge)?;
                overlay::save(self.overlay_file, &overlay::settle(target, plan)?)?;
            }
        }
        Ok(())
    }
}

/// The stamp of what a cold restore installed.
pub(super) fn new_stamp(
    m: &CacheManifest,
    key: &Key,
    branch: &Branch,
    kp: &KeyPlan,
    vstats: &verify::Stats,
    files: u64,
    partial: Option<stamp::Partial>,
) -> Stamp {
    Stamp {
        branch: branch.name.clone(),
        source: branch.remote.to_string(),
        commit: branch.commit.clone(),
        layout: kp.layout.to_string(),
        manifest_sha256: branch.manifest_sha256.clone(),
        tar_sha256: vstats.tar_sha256.clone(),
        // The key's (a delta decodes only part of it).
        tar_size: kp.plan.tar_size.unwrap_or(vstats.tar_bytes),
        files,
        partial,
        ..Stamp::of(m, key, clock::now_ms())
    }
}

/// Finishes (or undoes) whatever a killed run left, before anything else:
/// even if the fetch after fails, the target is whole again. Returns the
/// state directory and the merge journal's path.
pub(super) fn recover_first(repo: &Repo, m: &CacheManifest) -> Result<(PathBuf, PathBuf)> {
    let state_dir = records_dir(repo, m)?;
    let journal = journal_path(&state_dir, &m.name);
    match m.mode {
        Mode::Replace => unpack::recover_swap(&m.restore_path)?,
        Mode::Merge | Mode::Overlay => unpack::recover(&journal, &m.restore_path)?,
    }
    Ok((state_dir, journal))
}

/// With `--verify` over an installed copy: `Verified` when staging and the
/// target agree, else `Repaired` and the first difference.
pub(super) fn compared(
    opts: &RestoreOptions,
    m: &CacheManifest,
    dest: &Path,
) -> Result<(State, Option<String>)> {
    let target = &m.restore_path;
    if !opts.verify || std::fs::symlink_metadata(target).is_err() {
        return Ok((State::Restored, None));
    }
    let (diff, _) = compare::first_difference(dest, target, m.mode == Mode::Replace)?;
    Ok(match diff {
        None => (State::Verified, None),
        Some(d) => (State::Repaired, Some(d)),
    })
}

/// The ready-probe after an install: a cache that installed but still is
/// not ready means the probe checks something else (exit 10).
pub(super) fn ready_after_install(m: &CacheManifest, key: &Key) -> Result<()> {
    ready(m).map_err(|why| {
        fail(
            Code::Config,
            format!(
                "installed {} at {}, but the ready-probe of {} still fails ({why}): fix [ready] so that it checks something the cache contains",
                key.value,
                m.restore_path.display(),
                m.file.display()
            ),
        )
    })
}

/// What every step of a cold restore reads.
pub(super) struct Cold<'a> {
    pub(super) sh: &'a Shell,
    pub(super) repo: &'a Repo,
    pub(super) m: &'a CacheManifest,
    pub(super) stamp_file: &'a Path,
    pub(super) opts: &'a RestoreOptions,
    pub(super) start: Instant,
}

/// The key a cold restore installs, chosen and trusted after the branch
/// fetch, before any chunk of it is read.
struct Chosen {
    git: CacheGit,
    branch: Branch,
    kp: KeyPlan,
    key: Key,
    partial: Option<stamp::Partial>,
    trust: crate::trust::Checked,
}

impl Cold<'_> {
    /// Recover, fetch, choose, stage, compare, install, stamp.
    pub(super) fn run(&self, key: &Key, mut phases: Phases) -> Result<RestoreOutcome> {
        let (m, target) = (self.m, &self.m.restore_path);
        let (state_dir, journal) = recover_first(self.repo, m)?;
        let c = match self.fetch_and_choose(key, &mut phases)? {
            Ok(chosen) => chosen,
            Err(same) => return Ok(same),
        };

        let t = Instant::now();
        let mut staging = Staging(Some(unpack::staging_dir_for(target)?));
        let dest = staging.0.clone().expect("staging is set");
        let (index, staged) = self.stage(&c, &state_dir, &dest)?;
        phases.unpack_ms = t.elapsed().as_millis() as u64;
        phases.chunk_fetch_ms = staged.fetched.fetch_ms;
        phases.chunk_wait_ms = staged.fetched.wait_ms;
        unpack::kill_point("restore:unpacked");

        let overlay_file = overlay::path(&state_dir, &m.name);
        let overlay_plan = held_back(m, &dest, &overlay_file)?;
        let compared = compared(self.opts, m, &dest)?;

        let t = Instant::now();
        if compared.0 != State::Verified {
            let installed = Installed {
                m,
                state_dir: &state_dir,
                stamp_file: self.stamp_file,
                journal: &journal,
                overlay_file: &overlay_file,
            };
            let record = match &index {
                Some(Ok(new)) => Some(ToRecord {
                    key: &c.key.value,
                    tar_sha256: &staged.verified.tar_sha256,
                    index: new,
                    verified: staged.delta.is_some() || staged.vouched,
                    delta: staged.delta.is_some(),
                }),
                _ => None,
            };
            installed.swap_or_merge(&dest, overlay_plan.as_ref(), record)?;
            staging.0 = None;
            unpack::kill_point("restore:installed");
        }
        drop(staging);
        let u = &staged.unpacked;
        let files = u.files + u.dirs + u.symlinks + u.hardlinks;
        let partial = c.partial.clone();
        let s = new_stamp(
            m,
            &c.key,
            &c.branch,
            &c.kp,
            &staged.verified,
            files,
            partial,
        );
        stamp::store(self.stamp_file, &s)?;
        // What the install needs from the chunk store: kept beside that store.
        crate::cache::gc::installed(&self.repo.state_dir(), &s, &c.branch);
        phases.install_ms = t.elapsed().as_millis() as u64;
        ready_after_install(m, &c.key)?;
        let kept = overlay_plan.map(|p| p.kept.len() as u64);
        Ok(self.outcome(c, staged, &s, compared, kept, phases))
    }

    /// Fetches the branch and chooses the key to install, trusted before any
    /// chunk is read (docs/format.md, restore invariant 9). `Err(outcome)` when the
    /// stand-in chosen is the very install the stamp describes.
    fn fetch_and_choose(
        &self,
        key: &Key,
        phases: &mut Phases,
    ) -> Result<Result<Chosen, RestoreOutcome>> {
        let (sh, repo, m, opts) = (self.sh, self.repo, self.m, self.opts);
        let t = Instant::now();
        // A registry holds one artifact per key: the key's is fetched and
        // read as a one-key branch (`cache::fetch::oci`).
        let (git, branch) = match &m.registry {
            Some(r) if opts.remote.is_some() => {
                return Err(fail(
                    Code::Usage,
                    format!(
                        "--remote names a git remote, and cache {} lives in registry {r}",
                        m.name
                    ),
                ));
            }
            Some(r) => crate::cache::fetch::oci::fetch(sh, repo, m, r, &key.value, opts.progress)?,
            None => fetch(sh, repo, m, opts.remote.as_deref(), opts.progress)?,
        };
        // Trusted before read, for the key chosen (the exact one or the
        // first fallback candidate the policy lets through): exit 12 here
        // leaves the install as it is and fetches no chunk.
        let t_trust = Instant::now();
        let (mut kp, key, partial, trust) = choose_trusted(sh, repo, m, key, opts, &git, &branch)?;
        let trust_us = t_trust.elapsed().as_micros() as u64;
        if let Some(p) = &partial
            && !opts.verify
            && let Some(outcome) =
                same_stand_in(m, self.stamp_file, &branch, &key, p, self.start, phases)?
        {
            return Ok(Err(outcome));
        }
        // Every compressed byte of a v1 branch is authenticated by its chunk's
        // digest before it is decoded, and zstd checks its frames' content
        // checksums: hashing the whole tar again would only check the decoder
        // (`verify::Plan::hash_tar`). `--verify` still does.
        if kp.plan.check == verify::Check::PerPiece && !opts.verify {
            kp.plan.hash_tar = false;
        }
        phases.fetch_ms = (t.elapsed().as_millis() as u64).saturating_sub(trust_us / 1000);
        phases.trust_us = trust_us;
        unpack::kill_point("restore:fetched");
        Ok(Ok(Chosen {
            git,
            branch,
            kp,
            key,
            partial,
            trust,
        }))
    }

    /// Fetches the key's file index (replace mode keeps it for the next delta
    /// install) and builds staging `dest`: a delta of the installed tree where
    /// it can be, else a full unpack.
    fn stage(
        &self,
        c: &Chosen,
        state_dir: &Path,
        dest: &Path,
    ) -> Result<(Option<Result<delta::NewIndex, String>>, delta::Staged)> {
        let (m, opts) = (self.m, self.opts);
        let index = match m.mode {
            Mode::Replace => {
                let local = delta::index_path(state_dir, &m.name);
                delta::fetch_index(&c.git, &c.branch, &c.key.value, &local)?
            }
            _ => None,
        };
        let ctx = delta::Ctx {
            git: &c.git,
            branch: &c.branch,
            kp: &c.kp,
            name: &m.name,
            target: &m.restore_path,
            state_dir,
            stamp_file: self.stamp_file,
            index: index.as_ref(),
            allowed: m.mode == Mode::Replace && !opts.verify && !m.keep_mtime,
            progress: opts.progress,
            absolute_symlinks: &m.absolute_symlinks,
        };
        let staged = delta::stage(&ctx, dest)?;
        Ok((index, staged))
    }

    /// What a cold restore that installed (or verified) the key reports.
    fn outcome(
        &self,
        c: Chosen,
        staged: delta::Staged,
        s: &Stamp,
        (state, difference): (State, Option<String>),
        kept: Option<u64>,
        phases: Phases,
    ) -> RestoreOutcome {
        let m = self.m;
        let state = match state {
            State::Restored if c.partial.is_some() => State::Partial,
            other => other,
        };
        let (v, fetched) = (&staged.verified, &staged.fetched);
        let duration = self.start.elapsed();
        RestoreOutcome {
            name: m.name.clone(),
            state,
            key: c.key.value.clone(),
            target: m.restore_path.clone(),
            mode: stamp::mode_name(m.mode),
            branch: c.branch.name.clone(),
            source: c.branch.remote.to_string(),
            commit: c.branch.commit.clone(),
            layout: c.kp.layout.to_string(),
            bytes: v.tar_bytes,
            compressed_bytes: v.compressed_bytes,
            chunk_source: Some(fetched.source),
            reuse: fetched.reuse,
            chunks_direct: fetched.direct,
            direct_fallback: fetched.direct_fallback.clone(),
            files: s.files,
            bytes_hashed: v.bytes_hashed,
            signature_checks: crate::trust::sshsig::checks(),
            trust: Some(c.trust),
            duration_ms: duration.as_millis() as u64,
            duration,
            phases,
            difference,
            reason: None,
            partial: partial_info(m, s),
            kept,
            delta: DeltaInfo::of(&staged.delta, staged.fallback),
        }
    }
}

/// Overlay: the files the user changed since they were installed leave
/// staging here, so neither `--verify`'s comparison nor the merge sees
/// them.
fn held_back(m: &CacheManifest, dest: &Path, overlay_file: &Path) -> Result<Option<overlay::Plan>> {
    let target = &m.restore_path;
    Ok(match m.mode {
        Mode::Overlay => Some(overlay::hold_back(
            dest,
            target,
            &overlay::load(overlay_file, target),
        )?),
        _ => None,
    })
}
