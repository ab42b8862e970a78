//! The trust root: `cache-manifests/trust.toml` (the policy) and
//! `cache-manifests/allowed_signers` (who may sign), read from the commit
//! being restored for, plus a cache manifest's `[trust]` table.
//!
//! Both files are read with `git cat-file` from `HEAD`, never from the work
//! tree (an uncommitted edit is not reviewed) and never from a cache branch
//! (whoever can push one would name their own signers). Parsing is pure;
//! `load_root` is the one place that runs git.

use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use xshell::{Shell, cmd};

use crate::exit::{Code, fail};
use crate::repo::Repo;

/// The repository-wide policy file, relative to the repository root.
pub const TRUST_FILE: &str = "cache-manifests/trust.toml";
/// The allowed signers (OpenSSH `allowed_signers` format).
pub const SIGNERS_FILE: &str = "cache-manifests/allowed_signers";

pub use crate::cache::format::trust::{CacheTrust, Policy};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTrustFile {
    policy: Policy,
}

/// Parses trust.toml's text (errors are one line, naming the field).
pub fn parse_trust_file(text: &str) -> Result<Policy> {
    let raw: RawTrustFile = toml::from_str(text)
        .map_err(|e| anyhow!("{}", crate::settings::toml_error_line(text, &e)))?;
    Ok(raw.policy)
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
    let policy = match objects.next().flatten() {
        None => None,
        Some((_, bytes)) => {
            let text = String::from_utf8_lossy(&bytes);
            Some(parse_trust_file(&text).map_err(|e| {
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
        policy,
        allowed_signers,
    })
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

/// `RawTrustFile`'s `Deserialize`, for the field reference made from it
/// (`docs/reference/manifests.md`, tests/it/docs.rs); nothing else calls it.
#[doc(hidden)]
pub fn describe<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<(), D::Error> {
    RawTrustFile::deserialize(d).map(|_| ())
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
        for bad in [
            "policy = \"strict\"",
            "",
            "policy = \"off\"\nextra = 1",
            "policy = 1",
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
