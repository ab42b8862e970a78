//! `cargo xtask cache migrate NAME`: move a cache from its old branch
//! (`refs/heads/<name>-cache`) to the ref its manifest now names
//! (`cache.ref`, e.g. `refs/warmstart/cache/<name>`), so that plain clones
//! stop downloading it.
//!
//! One atomic push with a lease on both refs: the same commit goes to the
//! new ref and the old branch is deleted, or nothing changes. No object is
//! uploaded (the server already has the commit), nothing is repacked, and
//! the old branch is only deleted while it still holds the commit that was
//! copied. It never touches anything but those two refs.

use anyhow::Result;
use serde::Serialize;
use xshell::Shell;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::manifests;
use crate::cli::cache::MigrateArgs;
use crate::exit::{Code, fail};
use crate::git::{self, CacheGit, Remote};
use crate::repo::Repo;

/// What `--json` prints.
#[derive(Debug, Serialize)]
pub struct Migrated {
    pub name: String,
    pub from: String,
    #[serde(rename = "ref")]
    pub to: String,
    #[serde(serialize_with = "crate::contract::shown_remote")]
    pub remote: String,
    pub commit: String,
    /// `migrated`, or `already` (the ref holds the cache, the branch is gone).
    pub state: &'static str,
}

/// `cargo xtask cache migrate NAME [--from BRANCH] [--remote R]`.
pub fn run(sh: &Shell, args: MigrateArgs) -> Result<()> {
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let repo = Repo::from_cwd()?;
    let m = manifests::load_git(&repo, &args.name, "cache migrate")?;
    let from = old_branch(&m, args.from)?;
    git::check_branch(&from)?;
    let mut git = CacheGit::open(sh, &repo)?;
    git.set_network(&m.network)?;
    let remote = git.resolve_remote(sh, args.remote.as_deref().unwrap_or(&m.remote))?;
    let old = git.try_fetch_branch(&remote, &from)?;
    let new = git.try_fetch_branch(&remote, &m.branch)?;
    let done = |commit: String, state| Migrated {
        name: m.name.clone(),
        from: from.clone(),
        to: m.branch.clone(),
        remote: remote.to_string(),
        commit,
        state,
    };
    let result = match (old, new) {
        (None, Some(n)) => done(n, "already"),
        (None, None) => {
            return Err(fail(
                Code::NotFound,
                format!(
                    "{remote} has neither branch {from} nor {}: nothing to migrate (name the old branch with --from)",
                    m.branch
                ),
            ));
        }
        (Some(o), Some(n)) if o != n => {
            return Err(fail(
                Code::Config,
                format!(
                    "{remote} has both {from} (commit {}) and {} (commit {}): the ref was published since; check it, then delete the old branch (`git push {} --delete {from}`)",
                    &o[..12],
                    m.branch,
                    &n[..12],
                    remote.shown_name()
                ),
            ));
        }
        (Some(o), n) => {
            check_is_cache(&git, &remote, &from, &o)?;
            push_moved(&git, &remote, &from, &m.branch, &o, n.as_deref())?;
            git.set_local_branch(&m.branch, &o)?;
            done(o, "migrated")
        }
    };
    if args.out.json {
        crate::contract::document(&result);
    } else if !args.out.quiet() {
        say(&m, &result);
    }
    Ok(())
}

/// The branch to move (`--from`, else `<name>-cache`), once the manifest
/// names a ref to move it to.
fn old_branch(m: &CacheManifest, from: Option<String>) -> Result<String> {
    if !m.branch.starts_with("refs/") {
        return Err(fail(
            Code::Config,
            format!(
                "{} keeps the cache on branch {}: set `ref = \"refs/warmstart/cache/{}\"` under [cache] (and drop `branch`), then run the migration",
                m.file.display(),
                m.branch,
                m.name
            ),
        ));
    }
    let from = from.unwrap_or_else(|| format!("{}-cache", m.name));
    if from.starts_with("refs/") {
        return Err(fail(
            Code::Usage,
            format!(
                "--from takes a branch name (e.g. {}-cache), not a ref",
                m.name
            ),
        ));
    }
    Ok(from)
}

/// What a migration did, for people.
fn say(m: &CacheManifest, result: &Migrated) {
    let from = &result.from;
    match result.state {
        "already" => println!(
            "{} already lives at {} on {} (commit {}), and branch {from} is gone",
            m.name,
            m.branch,
            result.remote,
            &result.commit[..12]
        ),
        _ => println!(
            "moved {} from branch {from} to {} on {} (commit {}): plain clones no longer download it; other clones drop their copy with `git fetch --prune`",
            m.name,
            m.branch,
            result.remote,
            &result.commit[..12]
        ),
    }
}

/// Refuses to move a branch that is not a cache: history, or neither
/// `warmstart.json` nor a legacy `SHA256SUMS`.
fn check_is_cache(git: &CacheGit, remote: &Remote, from: &str, commit: &str) -> Result<()> {
    let has_meta = git
        .ls_tree(commit)?
        .iter()
        .any(|e| e.name == "warmstart.json" || e.name == "SHA256SUMS");
    if !git.commit_parents(commit)?.is_empty() || !has_meta {
        return Err(fail(
            Code::Config,
            format!(
                "{from} on {remote} is not a cache branch (history, or no warmstart.json): refusing to move it; name the cache's branch with --from"
            ),
        ));
    }
    Ok(())
}

/// One atomic push: `commit` to `to` (lease: `to` is still `to_was`) and
/// the deletion of `refs/heads/<from>` (lease: it still is `commit`).
fn push_moved(
    git: &CacheGit,
    remote: &Remote,
    from: &str,
    to: &str,
    commit: &str,
    to_was: Option<&str>,
) -> Result<()> {
    let old = git::remote_ref(from);
    // Under the network deadlines, as every push.
    let mut cmd = git.git();
    git.belts(&mut cmd, &remote.url);
    cmd.args(["push", "--atomic", "--porcelain", "--no-verify"])
        .arg(format!("--force-with-lease={to}:{}", to_was.unwrap_or("")))
        .arg(format!("--force-with-lease={old}:{commit}"))
        .arg("--")
        .arg(&remote.url)
        .arg(format!("{commit}:{to}"))
        .arg(format!(":{old}"));
    let out = git.run_network(&mut cmd, &format!("push of {to}"), remote, &mut |_| {})?;
    if out.status.success() {
        return Ok(());
    }
    let said = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let git_said = crate::redact::text(
        &said
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("hint:") && *l != "Done")
            .collect::<Vec<_>>()
            .join("; "),
    );
    if said.contains("stale info") {
        return Err(fail(
            Code::Busy,
            format!(
                "{from} or {to} on {remote} changed while migrating (a publish?): nothing was changed; run the migration again"
            ),
        ));
    }
    // An atomic push is refused whole: git's lines name both refs, and the
    // hook's own words say which rule it was. Both causes get their fix.
    let hint = git::refusal_hint(to, &said).map(|h| {
        format!("{h}; or, if the host protects branch {from} against deletion, allow that (nothing was changed)")
    });
    Err(fail(
        Code::Remote,
        match hint {
            Some(h) => format!(
                "{remote} refused the migration of {from} to {to} (git said: {git_said}): {h}"
            ),
            None => format!("cannot migrate {from} to {to} on {remote}: {git_said}"),
        },
    ))
}
