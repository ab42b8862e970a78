//! Whether the commit a publish describes is on the remote it publishes to:
//! a cache made from a commit nobody else can check out describes a tree no
//! other machine has, and its gate record names a tree nobody can rebuild.
//!
//! Judged from this clone's remote-tracking branches of that remote
//! (`refs/remotes/<remote>/*`, as last fetched or pushed) that share HEAD's
//! history, so it needs no network; a remote this clone tracks none of (a
//! URL given directly, a remote never fetched, one that holds only cache
//! branches) is not judged; in a shallow clone, whose cut history may hide
//! the link, it says so in one warning. It only reads the user's
//! repository, and never weakens a later refusal: `--allow-unpushed` lets
//! this check pass, nothing else (a signed key is still never replaced by
//! an unsigned one, `crate::trust::sign::guard_replacement`).

use anyhow::Result;
use std::path::Path;
use xshell::{Shell, cmd};

use crate::cache::publish::report::Reporter;
use crate::exit::{Code, fail};
use crate::git::Remote;

/// Refuses (exit 9, as for gates not green) a publish from a HEAD that no
/// remote-tracking branch of `remote` contains, naming both commits; with
/// `allow`, says so (even with --quiet, as --allow-ungated does) and goes on.
pub(crate) fn check(
    sh: &Shell,
    root: &Path,
    remote: &Remote,
    allow: bool,
    out: &Reporter,
) -> Result<()> {
    let Some(head) = git_line(sh, root, &["rev-parse", "--verify", "--quiet", "HEAD"]) else {
        return Ok(());
    };
    let prefix = format!("refs/remotes/{}/", remote.name);
    if remote.name == remote.url || !refs(sh, root, &["--contains", &head, &prefix])?.is_empty() {
        return Ok(());
    }
    // Only branches that share HEAD's history count: a cache branch (an
    // orphan commit) says nothing of whether the remote has this commit.
    let roots = git_line(sh, root, &["rev-list", "--max-parents=0", "HEAD"]).unwrap_or_default();
    let mut args: Vec<&str> = Vec::new();
    for r in roots.lines() {
        args.extend(["--contains", r]);
    }
    args.push(&prefix);
    let related = refs(sh, root, &args)?;
    if roots.is_empty() || related.is_empty() {
        // A shallow clone cuts the history that would connect HEAD with the
        // remote's branches: say it was not judged, rather than nothing.
        let shallow = git_line(sh, root, &["rev-parse", "--is-shallow-repository"]);
        if !allow && shallow.as_deref() == Some("true") {
            out.loud(format!(
                "cannot tell whether HEAD {} is on {1}: this clone is shallow and none of its branches of {1} reaches HEAD's history; publishing it as pushed (if it is not, push it first or pass --allow-unpushed; `git fetch --unshallow {1}` lets it be judged)",
                head.chars().take(12).collect::<String>(),
                remote.shown_name()
            ));
        }
        return Ok(());
    }
    let theirs = nearest(sh, root, &prefix, &related);
    let at = git_line(sh, root, &["rev-parse", "--verify", "--quiet", &theirs]).unwrap_or_default();
    let short = |c: &str| c.chars().take(12).collect::<String>();
    let shown = theirs.trim_start_matches("refs/remotes/");
    let what = format!(
        "HEAD {} is not on {} as this clone last fetched it: no branch of it contains this commit ({shown} is at {})",
        short(&head),
        remote.shown_name(),
        short(&at)
    );
    if allow {
        out.loud(format!(
            "{what}; publishing anyway (--allow-unpushed): the cache describes a tree other machines cannot check out until it is pushed"
        ));
        return Ok(());
    }
    Err(fail(
        Code::NotGreen,
        format!(
            "{what}: push it first (`git push {0} HEAD`; if it is pushed already, `git fetch {0}`), or publish with --allow-unpushed",
            remote.shown_name()
        ),
    ))
}

/// The remote-tracking branch to name, among `related` (those sharing
/// HEAD's history): HEAD's upstream, else the remote's default
/// (`<remote>/HEAD`), else the first.
fn nearest(sh: &Shell, root: &Path, prefix: &str, related: &[String]) -> String {
    let upstream = git_line(
        sh,
        root,
        &[
            "rev-parse",
            "--symbolic-full-name",
            "--verify",
            "--quiet",
            "@{upstream}",
        ],
    );
    if let Some(u) = upstream.filter(|u| related.contains(u)) {
        return u;
    }
    let default = git_line(
        sh,
        root,
        &["symbolic-ref", "--quiet", &format!("{prefix}HEAD")],
    );
    default
        .filter(|d| related.contains(d))
        .unwrap_or_else(|| related[0].clone())
}

/// `git for-each-ref` names (its `<remote>/HEAD` symref left out).
fn refs(sh: &Shell, root: &Path, args: &[&str]) -> Result<Vec<String>> {
    let text = cmd!(
        sh,
        "git -C {root} for-each-ref --format=%(refname) {args...}"
    )
    .quiet()
    .ignore_stderr()
    .read()?;
    Ok(text
        .lines()
        .filter(|l| !l.is_empty() && !l.ends_with("/HEAD"))
        .map(String::from)
        .collect())
}

/// One line of a git command's output, or none when it fails.
fn git_line(sh: &Shell, root: &Path, args: &[&str]) -> Option<String> {
    cmd!(sh, "git -C {root} {args...}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()
        .filter(|s| !s.is_empty())
}
