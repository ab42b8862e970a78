//! `cargo xtask cache resign <name>`: new signatures for the statements of
//! the keys trusted at HEAD, in one new root commit pushed with a lease.
//!
//! Never changes a chunk, a file index or `warmstart.json`, and never
//! re-signs a key that is not trusted at HEAD.

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use xshell::Shell;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::manifests;
use crate::cache::publish::branch::BranchState;
use crate::cache::publish::commit::write_root_commit;
use crate::cache::publish::lease::{Lease, lease_deadline};
use crate::cache::publish::report::Reporter;
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, healing, is_stale_lease};
use crate::repo::Repo;
use crate::trust::statement;

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
pub fn run(sh: &Shell, args: crate::cli::cache::ResignArgs) -> Result<()> {
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
    let m = manifests::load_git(repo, &args.name, "cache resign")?;
    let deadline = lease_deadline(&m)?;
    let remote_name = args.remote.clone().unwrap_or_else(|| m.remote.clone());
    let remote = crate::git::resolve_remote(sh, &repo.root, &remote_name)?;
    let key_file = signing_key(&m, args)?;
    let git = CacheGit::open(sh, repo)?.with_lock_wait(deadline);
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let mut lease = Lease::new(deadline);
    loop {
        let state = fetch(&git, &remote, &m, out)?;
        let mut summary = ResignSummary::new(&m);
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

/// The signing key a re-sign needs: `--signing-key`, else
/// `WARMSTART_SIGNING_KEY` (exit 10 when neither is given).
fn signing_key(m: &CacheManifest, args: &crate::cli::cache::ResignArgs) -> Result<PathBuf> {
    crate::trust::sign::signing_key(args.signing_key.as_deref()).ok_or_else(|| {
        fail(
            Code::Config,
            format!(
                "cache resign {} needs a signing key: give --signing-key or {}",
                m.name,
                crate::trust::sign::KEY_VAR
            ),
        )
    })
}

/// The branch as it is on `remote` (exit 4 when it does not exist).
fn fetch(
    git: &CacheGit,
    remote: &Remote,
    m: &CacheManifest,
    out: &Reporter,
) -> Result<BranchState> {
    healing(|| BranchState::load(git, remote, &m.branch, out))?.ok_or_else(|| {
        fail(
            Code::NotFound,
            format!(
                "{} does not exist on {remote}: nothing to re-sign",
                m.branch
            ),
        )
    })
}

impl ResignSummary {
    /// Nothing re-signed yet.
    fn new(m: &CacheManifest) -> ResignSummary {
        ResignSummary {
            name: m.name.clone(),
            branch: m.branch.clone(),
            commit: None,
            signed_by: None,
            resigned: Vec::new(),
            skipped: Vec::new(),
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
