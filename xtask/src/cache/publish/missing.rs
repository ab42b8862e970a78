//! `cache publish --missing`: publish a key only when its remote lacks it,
//! so that a CI run after a landing that changed nothing costs a branch
//! fetch and a signature check, not a build and a pack.
//!
//! "Lacks" is judged as a restore judges it: the branch holds the key AND
//! HEAD's trust policy accepts it (`trust::check_key`, the very check
//! `cache restore` makes before its first chunk). A key present by name but
//! refused (unsigned under `require`, signed by nobody allowed_signers
//! lists) is missing, and its publish replaces it even when the bytes are
//! the same. So is a key whose chunks a restore would refuse (a blob
//! swapped behind its signed digest): a present key's chunks are streamed
//! through the restore's verification, which costs a fetch of what the
//! chunk store lacks and a decode, never a build. Never: walk the pack
//! root, build, pack or push for a key that is present; decide from a name
//! or a signature alone.

use anyhow::Result;
use serde::Serialize;
use xshell::Shell;

use crate::cache::format::manifest::{CacheManifest, Key};
use crate::cache::publish::branch::BranchState;
use crate::cache::publish::report::Reporter;
use crate::cache::restore::branch::Branch;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote};
use crate::repo::Repo;
use crate::trust::Gate;

/// What `--missing` found, for `--json` (`missing`).
#[derive(Clone, Debug, Serialize)]
pub struct MissingJson {
    /// True when the remote holds the key and HEAD's trust policy accepts
    /// it: then nothing was built, packed or pushed.
    pub present: bool,
    /// The trust policy the key was judged by (`off`, `warn`, `require`);
    /// null when the branch does not hold the key.
    pub policy: Option<&'static str>,
    /// The key's verdict when one was made (`trusted`, `unsigned`, ...);
    /// null with policy `off` or when the branch does not hold the key.
    pub verdict: Option<&'static str>,
    /// Why the key counts as missing, in words (null when present).
    pub why: Option<String>,
}

/// The standing of the key on its remote.
pub(crate) struct Standing {
    pub(crate) json: MissingJson,
    /// The one line the publish says.
    pub(crate) line: String,
    /// The branch holds the key but the policy refuses it: publish anew
    /// even when the bytes are the same (an "unchanged" would leave it
    /// refused).
    pub(crate) replace: bool,
}

/// Whether the branch at `state` (as just fetched from `remote`) holds `key`
/// of `m` in a form HEAD's trust policy accepts.
pub(crate) fn standing(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    (git, remote): (&CacheGit, &Remote),
    state: Option<&BranchState>,
) -> Result<Standing> {
    let absent = |why: String| Standing {
        line: format!("missing: {why}; publishing it"),
        json: MissingJson {
            present: false,
            policy: None,
            verdict: None,
            why: Some(why),
        },
        replace: false,
    };
    let Some(state) = state else {
        return Ok(absent(format!(
            "{} does not exist on {} yet",
            m.branch,
            remote.shown_name()
        )));
    };
    if !state.manifest.keys.contains_key(&key.value) {
        return Ok(absent(format!(
            "{} on {} holds no key {}",
            m.branch,
            remote.shown_name(),
            key.value
        )));
    }
    // A branch whose files do not cross-check is one a restore refuses
    // before any key of it: the key is missing, and its publish replaces it.
    let branch = match Branch::read(git, remote.clone(), &m.branch, state.commit.clone()) {
        Ok(b) => b,
        Err(e) if crate::exit::code_of(&e) == crate::exit::Code::Verify => {
            let why = format!("{e:#}");
            return Ok(Standing {
                line: format!("missing: {why}; a restore refuses it, so publishing it anew"),
                json: MissingJson {
                    present: false,
                    policy: None,
                    verdict: None,
                    why: Some(why),
                },
                replace: true,
            });
        }
        Err(e) => return Err(e),
    };
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let checked =
        match crate::trust::check_key(sh, repo, &mut checker, m, git, &branch, &key.value)? {
            Gate::Pass(checked) => checked,
            Gate::Refused { verdict, line } => {
                return Ok(Standing {
                    line: format!("missing: {line}; so it counts as missing: publishing it anew"),
                    json: MissingJson {
                        present: false,
                        policy: Some("require"),
                        verdict: Some(verdict.verdict),
                        why: Some(line),
                    },
                    replace: true,
                });
            }
        };
    // The statement signs the digests warmstart.json lists, not the blobs
    // the tree holds: a pusher can swap a chunk's bytes and keep every
    // signature. The key is present only when its bytes are what a restore
    // accepts, so every chunk is streamed through the restore's verified
    // stream (fetched, hashed, decoded, the tar digest checked; nothing is
    // written).
    let policy = checked.policy;
    let verdict = checked.key.as_ref().map(|k| k.verdict);
    if let Some(why) = damaged(repo, m, git, &branch, &key.value)? {
        return Ok(Standing {
            line: format!("missing: {why}; a restore refuses it, so publishing it anew"),
            json: MissingJson {
                present: false,
                policy: Some(policy),
                verdict,
                why: Some(why),
            },
            replace: true,
        });
    }
    Ok(Standing {
        line: format!(
            "present: {} on {} holds key {} and HEAD's trust policy ({policy}) accepts it, every chunk verified; nothing built, packed or pushed",
            m.branch,
            remote.shown_name(),
            key.value,
        ),
        json: MissingJson {
            present: true,
            policy: Some(policy),
            verdict,
            why: None,
        },
        replace: false,
    })
}

/// Why key `k` of `branch` fails the verification a restore makes of its
/// bytes, or `None` when every chunk and the tar digest are right. Only a
/// verification failure (exit 6) is an answer; a network or store error
/// is the publish's error.
fn damaged(
    repo: &Repo,
    m: &CacheManifest,
    git: &CacheGit,
    branch: &Branch,
    k: &str,
) -> Result<Option<String>> {
    // `cache gc` removes no chunk while this reads them.
    let _reading = crate::cache::gc::Reading::take(
        &repo.state_dir(),
        crate::cache::restore::RestoreOptions::default().lock_timeout,
    )?;
    let fix = crate::cache::restore::republish_fix(&m.name);
    let streamed = branch.plan(k, &fix).and_then(|kp| {
        crate::cache::restore::stream_key(git, branch, &kp, false, |r| {
            std::io::copy(r, &mut std::io::sink())?;
            Ok(())
        })
    });
    match streamed {
        Ok(_) => Ok(None),
        Err(e) if crate::exit::code_of(&e) == crate::exit::Code::Verify => {
            Ok(Some(format!("{e:#}")))
        }
        Err(e) => Err(e),
    }
}

/// Builds a missing key whose manifest has `[build]` (`cache::build::run`)
/// before its pack root is walked, so that a CI run builds only the keys
/// its remote lacks. Called for missing keys only, after the checks that
/// would refuse the publish; a manifest without `[build]` publishes what
/// the pack root holds, as a plain publish does.
///
/// Pins read HEAD and the build reads the work tree, so the build is
/// published under `key` only when the inputs are HEAD's before and after
/// it and HEAD did not move (`cache::build::publishable`): a dirty tree is
/// refused before an hour of building, a moved HEAD after it (exit 9).
pub(crate) fn build_missing(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    out: &Reporter,
) -> Result<()> {
    if m.build.is_none() {
        return Ok(());
    }
    let before = crate::cache::build::Before::take(sh, repo, &key.value);
    let unpublishable = |why: String, built: &str| {
        fail(
            Code::NotGreen,
            format!(
                "{why}: cache {} {built}not published under key {}; commit the inputs and run `{} cache publish {} --missing` again",
                m.name,
                key.value,
                crate::invocation::command(),
                m.name
            ),
        )
    };
    crate::cache::build::publishable(sh, repo, m, &before)
        .map_err(|why| unpublishable(why, "was not built and is "))?;
    out.say(format!(
        "building {} ([build] in {})",
        m.name,
        m.file.display()
    ));
    let built = crate::cache::build::run(repo, m)?;
    out.say(format!(
        "built {} into {} in {} (log {})",
        m.name,
        m.pack_root.display(),
        crate::clock::human(built.duration),
        built.log.display()
    ));
    crate::cache::build::publishable(sh, repo, m, &before)
        .map_err(|why| unpublishable(why, "was built but is "))
}

/// What `--missing` does for a registry cache, which it cannot read yet:
/// with `[build]` it refuses (publishing the pack root as it is would pass
/// an old build off as the missing key's); without, it warns and the
/// publish goes on as without the flag.
pub(crate) fn registry(
    missing: bool,
    m: &CacheManifest,
    registry: &crate::oci::Registry,
    out: &Reporter,
) -> Result<()> {
    if missing && m.build.is_some() {
        // Publishing the pack root as it is would pass an old build off
        // as the missing key's.
        return Err(fail(
            Code::Config,
            format!(
                "--missing does not read OCI registries yet, so it cannot tell whether cache {} (in {registry}) needs its [build]: run `{cmd} cache build {}` and then `{cmd} cache publish {}` without --missing",
                m.name,
                m.name,
                m.name,
                cmd = crate::invocation::command()
            ),
        ));
    }
    if missing {
        out.warn(format!(
            "--missing does not read OCI registries yet: cache {} (in {registry}) is published as without it",
            m.name
        ));
    }
    Ok(())
}
