//! The trust root: `cache-manifests/trust.toml` (the policy) and
//! `cache-manifests/allowed_signers` (who may sign), read from the commit
//! being restored for, plus a cache manifest's `[trust]` table.
//!
//! Both files are read with `git cat-file` from `HEAD`, never from the work
//! tree (an uncommitted edit is not reviewed) and never from a cache branch
//! (whoever can push one would name their own signers). Parsing is pure;
//! `load_root` is the one place that runs git.

use anyhow::{Context, Result, anyhow, bail};
use xshell::{Shell, cmd};

use crate::exit::{Code, fail};
use crate::repo::Repo;

/// The repository-wide policy file, relative to the repository root.
pub const TRUST_FILE: &str = "cache-manifests/trust.toml";
/// The allowed signers (OpenSSH `allowed_signers` format).
pub const SIGNERS_FILE: &str = "cache-manifests/allowed_signers";

pub use crate::cache::format::trust::{CacheTrust, Policy, TrustFile};

/// Parses trust.toml's text (errors are one line, naming the field).
pub fn parse_trust_file(text: &str) -> Result<Policy> {
    Ok(parse_trust_toml(text)?.policy)
}

/// Parses trust.toml's text into all its fields.
pub fn parse_trust_toml(text: &str) -> Result<TrustFile> {
    toml::from_str(text).map_err(|e| anyhow!("{}", crate::settings::toml_error_line(text, &e)))
}

/// The trust root of the commit being restored for.
#[derive(Clone, Debug)]
pub struct Root {
    /// `HEAD`'s commit id (`None` in a repository without commits).
    pub head: Option<String>,
    /// trust.toml's policy at HEAD (`None`: the file is not there).
    pub policy: Option<Policy>,
    /// allowed_signers at HEAD (`None`: the file is not there).
    pub allowed_signers: Option<Vec<u8>>,
    /// trust.toml's `signed_gates` at HEAD (false without the file).
    pub signed_gates: bool,
}

/// Where a cache's policy came from, for messages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Manifest,
    TrustFile,
    Unset,
}

impl Root {
    /// The policy for a cache: its manifest's `[trust] policy`, else
    /// trust.toml's, else `off`.
    pub fn effective(&self, c: &CacheTrust) -> (Policy, Source) {
        match (c.policy, self.policy) {
            (Some(p), _) => (p, Source::Manifest),
            (None, Some(p)) => (p, Source::TrustFile),
            (None, None) => (Policy::Off, Source::Unset),
        }
    }

    /// `cache-manifests/allowed_signers at HEAD (abc123456789)`, for messages.
    pub fn signers_where(&self) -> String {
        match &self.head {
            Some(h) => format!("{SIGNERS_FILE} at HEAD ({})", &h[..h.len().min(12)]),
            None => format!("{SIGNERS_FILE} (no commit yet)"),
        }
    }
}

/// Reads trust.toml and allowed_signers from `HEAD` of `repo` in one
/// `git cat-file --batch`. A trust.toml that does not parse is exit 10.
pub fn load_root(sh: &Shell, repo: &Repo) -> Result<Root> {
    let root = &repo.root;
    let input = format!("HEAD\nHEAD:./{TRUST_FILE}\nHEAD:./{SIGNERS_FILE}\n");
    let out = cmd!(sh, "git -C {root} cat-file --batch")
        .stdin(input.as_bytes())
        .quiet()
        .ignore_stderr()
        .output()
        .with_context(|| {
            format!(
                "reading {TRUST_FILE} and {SIGNERS_FILE} at HEAD of {}",
                root.display()
            )
        })?;
    let mut objects = parse_batch(&out.stdout, 3)
        .with_context(|| format!("reading the trust root at HEAD of {}", root.display()))?
        .into_iter();
    let head = objects.next().flatten().map(|(oid, _)| oid);
    let file = match objects.next().flatten() {
        None => None,
        Some((_, bytes)) => {
            let text = String::from_utf8_lossy(&bytes);
            Some(parse_trust_toml(&text).map_err(|e| {
                fail(
                    Code::Config,
                    format!(
                        "{TRUST_FILE} at HEAD: {e:#} (policy is \"require\", \"warn\" or \"off\")"
                    ),
                )
            })?)
        }
    };
    let allowed_signers = objects.next().flatten().map(|(_, b)| b);
    Ok(Root {
        head,
        policy: file.map(|f| f.policy),
        allowed_signers,
        signed_gates: file.is_some_and(|f| f.signed_gates),
    })
}

/// The `[trust]` table of `cache-manifests/<name>.toml` as committed at
/// HEAD of the repository at `root` (the default when the manifest or its
/// table is not there). A restore takes its trust settings from here and
/// never from the work tree, where an uncommitted `policy = "off"` would
/// switch the checks off. A committed table that does not parse is exit 10.
pub fn committed_cache_trust(sh: &Shell, root: &std::path::Path, name: &str) -> Result<CacheTrust> {
    cache_trust_at(sh, root, "HEAD", name)
}

/// `committed_cache_trust` at another commit of the repository (`rev`).
pub fn cache_trust_at(
    sh: &Shell,
    root: &std::path::Path,
    rev: &str,
    name: &str,
) -> Result<CacheTrust> {
    let spec = format!("{rev}:./cache-manifests/{name}.toml");
    let out = cmd!(sh, "git -C {root} cat-file blob {spec}")
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .output()
        .with_context(|| format!("reading cache-manifests/{name}.toml at {rev}"))?;
    if !out.status.success() {
        return Ok(CacheTrust::default());
    }
    let bad = |e: String| {
        fail(
            Code::Config,
            format!("cache-manifests/{name}.toml at {rev}: {e} (fix it and commit)"),
        )
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let table: toml::Table =
        toml::from_str(&text).map_err(|e| bad(crate::settings::toml_error_line(&text, &e)))?;
    match table.get("trust") {
        None => Ok(CacheTrust::default()),
        Some(t) => t
            .clone()
            .try_into()
            .map_err(|e: toml::de::Error| bad(format!("[trust]: {}", e.message()))),
    }
}

/// An object's id and bytes, as `git cat-file --batch` gives them.
pub type Object = (String, Vec<u8>);

/// Splits `git cat-file --batch` output into `n` answers: `(oid, bytes)`,
/// or `None` for a name that is missing.
pub fn parse_batch(mut out: &[u8], n: usize) -> Result<Vec<Option<Object>>> {
    let mut answers = Vec::new();
    for _ in 0..n {
        let nl = out
            .iter()
            .position(|&b| b == b'\n')
            .ok_or_else(|| anyhow!("git cat-file stopped early"))?;
        let header = String::from_utf8_lossy(&out[..nl]).into_owned();
        out = &out[nl + 1..];
        let fields: Vec<&str> = header.split(' ').collect();
        if fields
            .last()
            .is_some_and(|f| *f == "missing" || *f == "ambiguous")
        {
            answers.push(None);
            continue;
        }
        let [oid, _kind, size] = fields.as_slice() else {
            bail!("git cat-file said {header:?}");
        };
        let size: usize = size
            .parse()
            .map_err(|_| anyhow!("git cat-file said {header:?}"))?;
        if out.len() < size + 1 {
            bail!("git cat-file's answer for {oid} is cut short");
        }
        answers.push(Some((oid.to_string(), out[..size].to_vec())));
        out = &out[size + 1..];
    }
    Ok(answers)
}

/// The policy of cache `name` on the default branch of remote `remote` as
/// this clone last fetched it (`refs/remotes/<remote>/HEAD`): the branch
/// and its policy, or `None` when the clone has no such ref (a URL remote,
/// or `git remote set-head` never ran) or no policy is set there.
pub fn remote_default_policy(
    sh: &Shell,
    root: &std::path::Path,
    remote: &str,
    name: &str,
) -> Option<(String, Policy)> {
    if remote.is_empty() || remote.contains(['/', ':']) {
        return None;
    }
    let head_ref = format!("refs/remotes/{remote}/HEAD");
    let branch = cmd!(sh, "git -C {root} symbolic-ref -q --short {head_ref}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()
        .filter(|b| !b.is_empty())?;
    if let Some(p) = cache_trust_at(sh, root, &branch, name).ok()?.policy {
        return Some((branch, p));
    }
    let spec = format!("{branch}:./{TRUST_FILE}");
    let text = cmd!(sh, "git -C {root} cat-file blob {spec}")
        .quiet()
        .ignore_stderr()
        .read()
        .ok()?;
    Some((branch, parse_trust_file(&text).ok()?))
}

/// `TrustFile`'s `Deserialize`, for the field reference made from it
/// (`docs/reference/manifests.md`, tests/it/docs.rs); nothing else calls it.
#[doc(hidden)]
pub fn describe<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<(), D::Error> {
    <TrustFile as serde::Deserialize>::deserialize(d).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trust_file_takes_one_of_three_policies() {
        assert_eq!(
            parse_trust_file("policy = \"require\"\n").unwrap(),
            Policy::Require
        );
        assert_eq!(parse_trust_file("policy = \"warn\"").unwrap(), Policy::Warn);
        assert_eq!(parse_trust_file("policy = \"off\"").unwrap(), Policy::Off);
        let f = parse_trust_toml("policy = \"require\"\nsigned_gates = true\n").unwrap();
        assert!(f.signed_gates && f.policy == Policy::Require);
        assert!(
            !parse_trust_toml("policy = \"require\"")
                .unwrap()
                .signed_gates
        );
        for bad in [
            "policy = \"strict\"",
            "",
            "policy = \"off\"\nextra = 1",
            "policy = 1",
            "policy = \"off\"\nsigned_gates = \"yes\"",
        ] {
            let e = parse_trust_file(bad).unwrap_err();
            assert!(!format!("{e:#}").contains('\n'), "{bad:?}: {e:#}");
        }
    }

    #[test]
    fn manifest_wins_over_the_trust_file_and_unset_is_off() {
        let root = Root {
            head: None,
            policy: Some(Policy::Warn),
            allowed_signers: None,
            signed_gates: false,
        };
        let c = CacheTrust {
            policy: Some(Policy::Require),
            ..CacheTrust::default()
        };
        assert_eq!(root.effective(&c), (Policy::Require, Source::Manifest));
        assert_eq!(
            root.effective(&CacheTrust::default()),
            (Policy::Warn, Source::TrustFile)
        );
        let unset = Root {
            policy: None,
            ..root
        };
        assert_eq!(
            unset.effective(&CacheTrust::default()),
            (Policy::Off, Source::Unset)
        );
    }

    #[test]
    fn batch_answers_split_with_missing_names() {
        let out = b"aaaa commit 3\nabc\nHEAD:./x missing\nbbbb blob 0\n\n";
        let got = parse_batch(out, 3).unwrap();
        assert_eq!(got[0], Some(("aaaa".into(), b"abc".to_vec())));
        assert_eq!(got[1], None);
        assert_eq!(got[2], Some(("bbbb".into(), Vec::new())));
        assert!(parse_batch(b"aaaa blob 10\nshort\n", 1).is_err());
    }
}
