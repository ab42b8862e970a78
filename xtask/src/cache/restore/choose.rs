//! Which key a restore installs: the exact one, or a `[[restore.fallback]]`
//! stand-in, each trusted before any chunk of it is fetched.

use super::*;

/// The keys to try from `branch`, in order: the exact one alone, or (on an
/// exact miss, without `--key`) every key the `[[restore.fallback]]`
/// entries allow (`fallback::candidates`), each with the `Partial` its
/// stamp would record. A returned key has the parts the branch recorded
/// for it.
pub(super) fn choose_keys(
    m: &CacheManifest,
    key: &Key,
    opts: &RestoreOptions,
    branch: &Branch,
) -> Result<Vec<(Key, Option<stamp::Partial>)>> {
    let fix = republish_fix(&m.name);
    let recorded = |k: &str| match &branch.content {
        Content::V1(bm) => bm.keys.get(k).map(|e| e.key_parts.clone()),
        Content::Legacy { .. } => None,
    };
    if let Content::Legacy { archive, .. } = &branch.content {
        legacy_matches(m, key, archive, &branch.name)?;
    }
    match branch.plan(&key.value, &fix) {
        Ok(_) => {
            // A key named by `--key` has the parts the branch recorded for it.
            let parts = match &opts.key {
                Some(_) => recorded(&key.value).unwrap_or_default(),
                None => key.parts.clone(),
            };
            let value = key.value.clone();
            Ok(vec![(Key { value, parts }, None)])
        }
        Err(e)
            if opts.key.is_none()
                && !m.fallbacks.is_empty()
                && crate::exit::code_of(&e) == Code::NotFound =>
        {
            let Content::V1(bm) = &branch.content else {
                return Err(e);
            };
            let found = crate::cache::format::fallback::candidates(&m.fallbacks, key, bm);
            if found.is_empty() {
                return Err(fail(
                    Code::NotFound,
                    format!(
                        "{e:#}; no [[restore.fallback]] of {} matches a key either",
                        m.file.display()
                    ),
                ));
            }
            let now = clock::now_ms();
            Ok(found
                .into_iter()
                .map(|c| {
                    let partial = stamp::Partial {
                        wanted: key.value.clone(),
                        wanted_parts: key.parts.clone(),
                        fallback: c.fallback.to_string(),
                        checked_at_ms: now,
                    };
                    let parts = recorded(&c.key).unwrap_or_default();
                    (
                        Key {
                            value: c.key,
                            parts,
                        },
                        Some(partial),
                    )
                })
                .collect())
        }
        Err(e) => Err(e),
    }
}

/// A legacy branch holds one archive for whatever version it was made
/// from: one whose name carries a version is installed only for a key that
/// pins that version, or whose pinned value `[restore] legacy_versions` maps
/// to it, so a key bump never installs the old tree silently (exit 4).
fn legacy_matches(m: &CacheManifest, key: &Key, archive: &str, branch: &str) -> Result<()> {
    // `--key` gives no parts for a legacy branch: the key text is its pin.
    let pinned: Vec<&str> = if key.parts.is_empty() {
        vec![key.value.as_str()]
    } else {
        key.parts.iter().map(|p| p.value.as_str()).collect()
    };
    let Some(version) =
        crate::cache::format::key::legacy_mismatch(archive, &pinned, &m.legacy_versions)
    else {
        return Ok(());
    };
    let first = pinned.first().copied().unwrap_or("");
    Err(fail(
        Code::NotFound,
        format!(
            "legacy branch {branch} holds {archive} (version {version}), but key {} pins {}: publish this key (`{} cache publish {}`), or, if that archive is right for it, map them in {}: `[restore] legacy_versions = {{ \"{first}\" = \"{version}\" }}`",
            key.value,
            pinned.join(", "),
            crate::invocation::command(),
            m.name,
            m.file.display()
        ),
    ))
}

/// The key to install and its trust check, before any chunk is fetched
/// (docs/format.md, restore invariant 9). The exact key is installed or refused (exit 12
/// under `require`). Fallback candidates the policy refuses are skipped
/// with a warning and the next one is tried; when every one is
/// refused, exit 12 names each with its verdict. Nothing is installed then.
pub(super) fn choose_trusted(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    opts: &RestoreOptions,
    git: &CacheGit,
    branch: &Branch,
) -> Result<(KeyPlan, Key, Option<stamp::Partial>, crate::trust::Checked)> {
    use crate::trust::Gate;
    let fix = republish_fix(&m.name);
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let mut skipped: Vec<String> = Vec::new();
    for (k, partial) in choose_keys(m, key, opts, branch)? {
        let kp = branch.plan(&k.value, &fix)?;
        match crate::trust::check_key(sh, repo, &mut checker, m, git, branch, &k.value)? {
            Gate::Pass(checked) => return Ok((kp, k, partial, checked)),
            Gate::Refused { line, .. } if partial.is_none() => {
                return Err(fail(
                    Code::Untrusted,
                    format!("{line}; {}", crate::trust::untouched(git)),
                ));
            }
            Gate::Refused { verdict, line } => {
                eprintln!("warning: {line}; skipping this fallback key, trying the next");
                skipped.push(format!(
                    "{} ({}; signer seen: {})",
                    k.value,
                    verdict.verdict,
                    verdict.signer.as_deref().unwrap_or("none")
                ));
            }
        }
    }
    Err(fail(
        Code::Untrusted,
        format!(
            "untrusted: cache {} on branch {} has no key {} and no fallback key passes the trust policy: skipped {}; who may sign is listed in {}; {}",
            m.name,
            branch.name,
            key.value,
            skipped.join(", "),
            checker.root.signers_where(),
            crate::trust::untouched(git)
        ),
    ))
}
