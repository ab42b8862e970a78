//! Remotes: a user's remote name or URL resolved once to the URL git talks to,
//! the transport settings forwarded from the user's repository, the refs a cache
//! lives at, and the hint for a host that refuses a ref. Never writes the user's repository.

use crate::exit::{Code, fail};
use anyhow::{Context, Result};

use std::path::Path;
use xshell::{Shell, cmd};

use super::*;

/// The name cache.git knows every remote by, for one command at a time
/// (see `CacheGit::fetch_from`).
pub(super) const PROMISOR: &str = "warmstart";

/// The local transport settings of the user's repository that a fetch or a
/// push from cache.git must see too. CI checkouts keep the access token in
/// the repository's own config (e.g. actions/checkout writes
/// `http.https://github.com/.extraheader`), which cache.git would not read.
pub(super) const FORWARDED_CONFIG: &str =
    r"^(http|credential|url|protocol)\.|^core\.(sshcommand|askpass)$";

/// A resolved remote: what the user called it, and the URL git talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    /// The configured remote name, or the URL itself when given directly.
    pub name: String,
    /// A URL or an absolute path, usable from any directory.
    pub url: String,
}

/// What users read: the name and the URL, without credentials
/// (`crate::redact`). Never format `url` or `name` into a message directly.
impl std::fmt::Display for Remote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.name == self.url {
            write!(f, "{}", self.shown_url())
        } else {
            write!(f, "{} ({})", self.name, self.shown_url())
        }
    }
}

impl Remote {
    /// The URL as it may be printed or written down (`crate::redact::url`).
    pub fn shown_url(&self) -> String {
        crate::redact::url(&self.url)
    }

    /// The name as it may be printed: the remote name, or the redacted URL
    /// when the remote was given as a URL.
    pub fn shown_name(&self) -> String {
        crate::redact::url(&self.name)
    }
}

/// The ref a fetched branch is kept under in cache.git (for a full ref
/// `refs/x/y`: `refs/warmstart/refs/x/y`; no branch name starts with
/// `refs/`, so the two never meet).
pub fn local_ref(branch: &str) -> String {
    format!("refs/warmstart/{branch}")
}

/// The ref a cache lives at on the remote: a branch name means
/// `refs/heads/<name>`; a manifest's `cache.ref` is a full `refs/...` ref
/// (e.g. `refs/warmstart/cache/<name>`), which default refspecs of
/// `git clone` and `git fetch` (`refs/heads/*`) never fetch.
pub fn remote_ref(branch: &str) -> String {
    if branch.starts_with("refs/") {
        branch.to_string()
    } else {
        format!("refs/heads/{branch}")
    }
}

impl CacheGit {
    /// Resolves a remote name (`origin`) or a URL/path to a URL git can use
    /// from cache.git. A relative path is taken from the repository root.
    pub fn resolve_remote(&self, sh: &Shell, remote: &str) -> Result<Remote> {
        resolve_remote(sh, &self.root, remote)
    }
}

/// What to do about a push of `dst` that the server's rules refused
/// (`said`: git's stdout and stderr), or `None` for other failures. Hosts
/// refuse refs outside `refs/heads/` and `refs/tags/` in a pre-receive hook,
/// and branch protection (GitHub rulesets, GitLab protected branches,
/// `receive.denyNonFastForwards`) refuses the force push every publish is.
pub fn refusal_hint(dst: &str, said: &str) -> Option<String> {
    let lower = said.to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    // A rule's words; for a ref outside refs/heads/, any rejection by the
    // server (hidden or reserved namespaces are refused that way too).
    let rule = [
        "hook declined",
        "protected",
        "gh006",
        "gh013",
        "non-fast-forward",
        "force push",
        "force-push",
        "denying",
        "not allowed",
    ];
    let refused = if dst.starts_with("refs/heads/") {
        any(&rule)
    } else {
        any(&rule) || any(&["remote rejected", "refusing", "denied"])
    };
    if !refused {
        return None;
    }
    // A publish's temporary refs (`cache::publish::push`) name their cache.
    if let Some(rest) = dst.strip_prefix("refs/heads/warmstart-tmp/") {
        let name = rest.split('/').next().unwrap_or(rest);
        return Some(format!(
            "the host refuses the branches under warmstart-tmp/ where a publish over the push limit puts its batches: exempt warmstart-tmp/** from the rule, or raise [publish] push_limit in cache {name}'s manifest if the host takes bigger pushes"
        ));
    }
    let last = match dst.strip_prefix("refs/warmstart/tmp/") {
        Some(rest) => rest.split('/').next().unwrap_or(rest),
        // The cache's likely name, for a copyable suggestion.
        None => dst.rsplit('/').next().unwrap_or(dst),
    };
    Some(if dst.starts_with("refs/heads/") {
        let name = last.strip_suffix("-cache").unwrap_or(last);
        format!(
            "the host protects {dst} against force pushes or deletions, and every publish replaces the branch's one commit: exempt it from the rule, or move the cache off branches with cache.ref = \"refs/warmstart/cache/{name}\" in its manifest (`{cmd} cache migrate {name}`)",
            cmd = crate::invocation::command()
        )
    } else {
        format!(
            "this host may accept only branches and tags: set cache.branch (e.g. \"{last}-cache\") instead of cache.ref in the cache's manifest"
        )
    })
}

pub(super) fn forwarded_config(sh: &Shell, root: &Path) -> Result<Vec<(String, String)>> {
    let out = cmd!(
        sh,
        "git -C {root} config --local -z --get-regexp {FORWARDED_CONFIG}"
    )
    .quiet()
    .ignore_status()
    .ignore_stderr()
    .output()
    .context("reading the repository's transport settings")?;
    // Exit 1 means "no such settings"; anything else is not ours to judge
    // (e.g. a repository without config): forward nothing.
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split('\0')
        .filter(|r| !r.is_empty())
        .map(|r| match r.split_once('\n') {
            Some((k, v)) => (k.to_string(), v.to_string()),
            None => (r.to_string(), "true".to_string()),
        })
        .collect())
}

/// Resolves `remote` for the repository at `root`: a configured remote name
/// (`git remote get-url`), else a URL, an scp-like `host:path`, or a path.
pub fn resolve_remote(sh: &Shell, root: &Path, remote: &str) -> Result<Remote> {
    if remote.is_empty() || remote.starts_with('-') {
        return Err(fail(
            Code::Config,
            format!("{remote:?} is not a remote name or URL"),
        ));
    }
    if !looks_like_location(remote) {
        let out = cmd!(sh, "git -C {root} remote get-url {remote}")
            .quiet()
            .ignore_status()
            .output()
            .context("running git remote get-url")?;
        if !out.status.success() {
            return Err(fail(
                Code::Config,
                format!(
                    "remote {remote} is not configured in {}: add it (`git remote add {remote} URL`), or name a URL with --remote or cache.remote",
                    root.display()
                ),
            ));
        }
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        return Ok(Remote {
            name: remote.to_string(),
            url: absolutize(root, &url),
        });
    }
    let url = absolutize(root, remote);
    Ok(Remote {
        name: url.clone(),
        url,
    })
}

/// A URL (`scheme://`), scp-like (`host:path`, colon before any slash) or a path.
pub(super) fn looks_like_location(s: &str) -> bool {
    s.contains("://") || is_scp_like(s) || s.contains('/') || s.starts_with('.')
}

pub(super) fn is_scp_like(s: &str) -> bool {
    match (s.find(':'), s.find('/')) {
        (Some(c), Some(sl)) => c < sl && c > 0,
        (Some(c), None) => c > 0,
        _ => false,
    }
}

/// Relative local paths are taken from the repository root, because git
/// runs in cache.git, not there.
pub(super) fn absolutize(root: &Path, url: &str) -> String {
    if url.contains("://") || is_scp_like(url) || Path::new(url).is_absolute() {
        url.to_string()
    } else {
        root.join(url).to_string_lossy().into_owned()
    }
}

/// Branch names go into refspecs: refuse what could change their meaning.
pub fn check_branch(branch: &str) -> Result<()> {
    if branch.is_empty()
        || branch.starts_with('-')
        || branch.contains("..")
        || branch
            .bytes()
            .any(|b| b <= b' ' || b":~^?*[\\".contains(&b))
    {
        return Err(fail(
            Code::Config,
            format!("{branch:?} is not a usable branch name"),
        ));
    }
    Ok(())
}
