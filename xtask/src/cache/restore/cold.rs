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

impl Installed<'_> {
    /// Swaps `dest` in (replace) or merges it (merge, overlay).
    pub(super) fn swap_or_merge(
        &self,
        dest: &Path,
        overlay_plan: Option<&overlay::Plan>,
    ) -> Result<()> {
        let (m, target) = (self.m, &self.m.restore_path);
        // No stamp (nor delta record) while the target is being replaced: a
        // crash between the swap and the new stamp must not leave the old
        // stamp describing the new tree.
        stamp::remove(self.stamp_file)?;
        delta::forget(self.state_dir, &m.name)?;
        match m.mode {
            Mode::Replace => unpack::swap_dir(dest, target)?,
            Mode::Merge => {
                unpack::merge_into(dest, target, self.journal)?;
            }
            Mode::Overlay => {
                let plan = overlay_plan.expect("overlay has a plan");
                // Before the merge, so that a merge completed by the next
                // run's journal replay leaves files the record knows.
                overlay::save(self.overlay_file, &plan.record)?;
                unpack::merge_into(dest, target, self.journal)?;
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
    let now = clock::now_ms();
    Stamp {
        format: stamp::STAMP_FORMAT,
        name: m.name.clone(),
        key: key.value.clone(),
        key_parts: key.parts.clone(),
        target: m.restore_path.clone(),
        mode: stamp::mode_name(m.mode).to_string(),
        branch: branch.name.clone(),
        source: branch.remote.to_string(),
        commit: branch.commit.clone(),
        layout: kp.layout.to_string(),
        manifest_sha256: branch.manifest_sha256.clone(),
        tar_sha256: vstats.tar_sha256.clone(),
        // The key's (a delta decodes only part of it).
        tar_size: kp.plan.tar_size.unwrap_or(vstats.tar_bytes),
        files,
        restored_at: clock::rfc3339(now),
        restored_at_ms: now,
        partial,
    }
}

/// Finishes (or undoes) whatever a killed run left, before anything else:
/// even if the fetch after fails, the target is whole again. Returns the
/// state directory and the merge journal's path.
pub(super) fn recover_first(repo: &Repo, m: &CacheManifest) -> Result<(PathBuf, PathBuf)> {
    let state_dir = repo.state_dir();
    let journal = journal_path(&state_dir, &m.name);
    match m.mode {
        Mode::Replace => unpack::recover_swap(&m.restore_path)?,
        Mode::Merge | Mode::Overlay => unpack::recover(&journal, &m.restore_path)?,
    }
    Ok((state_dir, journal))
}

/// Fetches the key's file index (replace mode keeps it for the next delta
/// install) and builds staging `dest`: a delta of the installed tree where
/// it can be, else a full unpack.
#[allow(clippy::too_many_arguments)]
pub(super) fn stage(
    git: &CacheGit,
    branch: &Branch,
    kp: &KeyPlan,
    m: &CacheManifest,
    key: &Key,
    (state_dir, stamp_file): (&Path, &Path),
    opts: &RestoreOptions,
    dest: &Path,
) -> Result<(Option<Result<delta::NewIndex, String>>, delta::Staged)> {
    let index = match m.mode {
        Mode::Replace => delta::fetch_index(git, branch, &key.value)?,
        _ => None,
    };
    let ctx = delta::Ctx {
        git,
        branch,
        kp,
        name: &m.name,
        target: &m.restore_path,
        state_dir,
        stamp_file,
        index: index.as_ref(),
        allowed: m.mode == Mode::Replace && !opts.verify && !m.keep_mtime,
        progress: opts.progress,
    };
    let staged = delta::stage(&ctx, dest)?;
    Ok((index, staged))
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

#[allow(clippy::too_many_arguments)]
pub(super) fn cold(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    stamp_file: &Path,
    opts: &RestoreOptions,
    start: Instant,
    mut phases: Phases,
) -> Result<RestoreOutcome> {
    let target = &m.restore_path;
    let (state_dir, journal) = recover_first(repo, m)?;

    let t = Instant::now();
    let (git, branch) = fetch(sh, repo, m, opts.remote.as_deref(), opts.progress)?;
    // Trusted before read (DESIGN.md invariant 9), for the key chosen (the
    // exact one or the first fallback candidate the policy lets through):
    // exit 12 here leaves the install as it is and fetches no chunk.
    let t_trust = Instant::now();
    let (mut kp, key, partial, trust) = choose_trusted(sh, repo, m, key, opts, &git, &branch)?;
    let key = &key;
    let trust_us = t_trust.elapsed().as_micros() as u64;
    if let Some(p) = &partial
        && !opts.verify
        && let Some(outcome) = same_stand_in(m, stamp_file, &branch, key, p, start, &phases)?
    {
        return Ok(outcome);
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

    let t = Instant::now();
    let mut staging = Staging(Some(unpack::staging_dir_for(target)?));
    let dest = staging.0.clone().expect("staging is set");
    let files = (state_dir.as_path(), stamp_file);
    let (index, staged) = stage(&git, &branch, &kp, m, key, files, opts, &dest)?;
    let (ustats, vstats, fetched) = (staged.unpacked, &staged.verified, &staged.fetched);
    phases.unpack_ms = t.elapsed().as_millis() as u64;
    phases.chunk_fetch_ms = fetched.fetch_ms;
    phases.chunk_wait_ms = fetched.wait_ms;
    unpack::kill_point("restore:unpacked");

    let bytes_hashed = vstats.bytes_hashed;
    // Overlay: the files the user changed since they were installed leave
    // staging here, so neither `--verify`'s comparison nor the merge sees
    // them.
    let overlay_file = overlay::path(&state_dir, &m.name);
    let overlay_plan = match m.mode {
        Mode::Overlay => Some(overlay::hold_back(
            &dest,
            target,
            &overlay::load(&overlay_file, target),
        )?),
        _ => None,
    };
    let (mut state, difference) = compared(opts, m, &dest)?;

    let t = Instant::now();
    if state != State::Verified {
        let installed = Installed {
            m,
            state_dir: &state_dir,
            stamp_file,
            journal: &journal,
            overlay_file: &overlay_file,
        };
        installed.swap_or_merge(&dest, overlay_plan.as_ref())?;
        staging.0 = None;
        unpack::kill_point("restore:installed");
        if let Some(Ok(new)) = &index {
            let tar = &vstats.tar_sha256;
            let verified = staged.delta.is_some();
            delta::remember_or_warn(&state_dir, &m.name, target, &key.value, tar, new, verified);
        }
    }
    drop(staging);
    let files = ustats.files + ustats.dirs + ustats.symlinks + ustats.hardlinks;
    let s = new_stamp(m, key, &branch, &kp, vstats, files, partial.clone());
    stamp::store(stamp_file, &s)?;
    crate::cache::gc::installed(&state_dir, &s, &branch);
    phases.install_ms = t.elapsed().as_millis() as u64;
    ready_after_install(m, key)?;
    let duration = start.elapsed();
    if partial.is_some() && state == State::Restored {
        state = State::Partial;
    }
    Ok(RestoreOutcome {
        name: m.name.clone(),
        state,
        key: key.value.clone(),
        target: target.clone(),
        mode: stamp::mode_name(m.mode),
        branch: branch.name.clone(),
        source: branch.remote.to_string(),
        commit: branch.commit.clone(),
        layout: kp.layout.to_string(),
        bytes: vstats.tar_bytes,
        compressed_bytes: vstats.compressed_bytes,
        chunk_source: Some(fetched.source),
        reuse: fetched.reuse,
        chunks_direct: fetched.direct,
        direct_fallback: fetched.direct_fallback.clone(),
        files,
        bytes_hashed,
        signature_checks: crate::trust::sshsig::checks(),
        trust: Some(trust),
        duration_ms: duration.as_millis() as u64,
        duration,
        phases,
        difference,
        reason: None,
        partial: partial_info(m, &s),
        kept: overlay_plan.map(|p| p.kept.len() as u64),
        delta: DeltaInfo::of(&staged.delta, staged.fallback),
    })
}
