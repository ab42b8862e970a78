//! The publishing side of trust: which signing key, signing one key's
//! statement, and checking the statements a publish keeps.
//!
//! A publish signs only the key it publishes. The other keys' statements and
//! signatures are kept byte for byte; they are checked first and each one
//! that does not hold is named in a warning (a publish never re-signs, and so
//! never launders, another publisher's key; restores refuse it by themselves).

use anyhow::Result;
use std::path::{Path, PathBuf};
use xshell::Shell;

use crate::cache::format::manifest::CacheManifest;
use crate::cache::format::{BranchManifest, KeyEntry};
use crate::exit::{Code, fail};
use crate::trust::policy::Policy;
use crate::trust::statement::Statement;
use crate::trust::{Checker, KeyFiles, KeyTrust, armor, sshsig};

/// The variable that names the signing key when `--signing-key` is not given.
pub const KEY_VAR: &str = "WARMSTART_SIGNING_KEY";

/// A key's new statement and its signature.
#[derive(Clone, Debug)]
pub struct Signed {
    pub statement: Vec<u8>,
    pub sig: Vec<u8>,
    /// Who signed, as the allowed signers name them (or the fingerprint).
    pub signer: Option<String>,
}

/// `--signing-key`, else `WARMSTART_SIGNING_KEY`, else none.
pub fn signing_key(flag: Option<&Path>) -> Option<PathBuf> {
    flag.map(Path::to_path_buf).or_else(|| {
        std::env::var_os(KEY_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    })
}

/// Signs the statement of `key` (entry `entry`) of cache `m` when a signing
/// key is set, and checks the signature against the allowed signers at
/// HEAD: with `require`, an unset key or a signer they do not allow is
/// refused before anything is pushed; with `warn`, it is a warning.
#[allow(clippy::too_many_arguments)]
pub fn sign_key(
    sh: &Shell,
    checker: &mut Checker,
    m: &CacheManifest,
    key: &str,
    entry: &KeyEntry,
    flag: Option<&Path>,
    warn: &dyn Fn(String),
) -> Result<Option<Signed>> {
    let (policy, _) = checker.root.effective(&m.trust);
    let Some(signing_key) = signing_key(flag) else {
        let why = format!(
            "no signing key: key {key} of cache {} is published unsigned (give --signing-key or {KEY_VAR})",
            m.name
        );
        match policy {
            Policy::Require => {
                return Err(fail(
                    Code::Config,
                    format!("{why}; policy require would refuse it on every restore"),
                ));
            }
            Policy::Warn => warn(why),
            Policy::Off => {}
        }
        return Ok(None);
    };
    let statement = Statement::from_entry(&m.name, key, entry)
        .render()
        .into_bytes();
    check_size(key, statement.len(), entry.chunks.len())?;
    let sig = sshsig::sign(sh, &signing_key, &statement)?;
    let files = KeyFiles {
        statement: Some(statement.clone()),
        sig: Some(sig.clone()),
    };
    // The signature was just made here: whether its key is an allowed
    // signer of this cache is a lookup, no process. Anything the lookup
    // cannot settle goes through the full check, which also words the refusal.
    if let Some(signer) = listed_signer(checker, m, &sig) {
        return Ok(Some(Signed {
            statement,
            sig,
            signer: Some(signer),
        }));
    }
    let verdict = checker.judge(sh, m, key, entry, &files, None)?;
    if !verdict.trusted() && verdict.verdict != "ungated" {
        let line = format!(
            "the signing key {} is not trusted for cache {}: {}; signer seen: {}; add its public key to {} (and commit it) first",
            signing_key.display(),
            m.name,
            verdict.reason.as_deref().unwrap_or("not trusted"),
            verdict.signer.as_deref().unwrap_or("none"),
            checker.root.signers_where()
        );
        if policy == Policy::Require {
            return Err(fail(Code::Untrusted, format!("{line}; nothing was pushed")));
        }
        warn(line);
    }
    Ok(Some(Signed {
        statement,
        sig,
        signer: verdict.signer,
    }))
}

/// Refuses to replace key `key`'s trusted signed statement on the branch
/// (`old`, its files among the branch's `entries`) with an unsigned one, or one signed by
/// nobody allowed, when the remote's default branch (as last fetched)
/// requires signed caches, whatever this clone's HEAD says: a clone with a
/// `policy = "off"` committed but never pushed would otherwise swap a key
/// every fresh machine trusts for one every fresh machine refuses.
#[allow(clippy::too_many_arguments)]
pub fn guard_replacement(
    sh: &Shell,
    repo: &crate::repo::Repo,
    checker: &mut Checker,
    m: &CacheManifest,
    (git, entries): (&crate::git::CacheGit, &[crate::git::TreeEntry]),
    key: &str,
    old: &KeyEntry,
    new: Option<&Signed>,
) -> Result<()> {
    if new.is_some_and(|s| s.signer.is_some()) {
        return Ok(());
    }
    let Some((branch, Policy::Require)) =
        super::policy::remote_default_policy(sh, &repo.root, &m.remote, &m.name)
    else {
        return Ok(());
    };
    let files = super::files_of_keys(git, entries, std::slice::from_ref(&key.to_string()))?;
    let Some(old_files) = files.get(key) else {
        return Ok(());
    };
    let was = checker.judge(sh, m, key, old, old_files, None)?;
    if !was.trusted() {
        return Ok(());
    }
    let now = match new {
        None => "an unsigned one".to_string(),
        Some(_) => "one signed by nobody allowed_signers at HEAD lists".to_string(),
    };
    Err(fail(
        Code::Untrusted,
        format!(
            "refusing to replace key {key} of cache {}, signed by {}, with {now}: {branch} (the remote's default branch) requires signed caches, whatever this clone's HEAD says; sign it (--signing-key or {KEY_VAR}), or push the policy change to {branch} first; nothing was pushed",
            m.name,
            was.signer.as_deref().unwrap_or("an allowed signer"),
        ),
    ))
}

/// A statement larger than a restore reads (`MAX_STATEMENT_BYTES`) could
/// never be verified: refused before anything is signed or pushed. A
/// version 2 statement takes about 190 bytes per chunk, so this is a key
/// of more than about 5,000 chunks.
pub fn check_size(key: &str, bytes: usize, chunks: usize) -> Result<()> {
    if bytes as u64 > super::MAX_STATEMENT_BYTES {
        return Err(fail(
            Code::Config,
            format!(
                "the signed statement of key {key} would be {bytes} bytes ({chunks} chunks), more than the {} a restore reads: publish it in fewer, larger chunks; nothing was pushed",
                crate::size::human(super::MAX_STATEMENT_BYTES)
            ),
        ));
    }
    Ok(())
}

/// `principal (SHA256:...)` when the key of `sig` is listed in the allowed
/// signers under a principal this cache accepts.
fn listed_signer(checker: &Checker, m: &CacheManifest, sig: &[u8]) -> Option<String> {
    let key = armor::sig_public_key(sig)?;
    let keys = armor::allowed_keys(checker.root.allowed_signers.as_ref()?)?;
    let principal = keys
        .iter()
        .filter(|(_, k)| *k == key)
        .flat_map(|(p, _)| p.iter())
        .find(|p| m.trust.principals.is_empty() || m.trust.principals.contains(p))?;
    Some(format!("{principal} ({})", armor::fingerprint(&key)))
}

/// The verdicts on the keys of `manifest` other than `except` (their
/// statements and signatures in `files`); a warning for each one that does not hold.
pub fn check_kept(
    sh: &Shell,
    checker: &mut Checker,
    m: &CacheManifest,
    manifest: &BranchManifest,
    except: Option<&str>,
    files: &std::collections::BTreeMap<String, KeyFiles>,
    warn: &dyn Fn(String),
) -> Result<Vec<KeyTrust>> {
    let mut out = Vec::new();
    if checker.root.effective(&m.trust).0 == Policy::Off {
        return Ok(out);
    }
    for (k, e) in &manifest.keys {
        if Some(k.as_str()) == except {
            continue;
        }
        let Some(f) = files.get(k) else { continue };
        let v = checker.judge(sh, m, k, e, f, None)?;
        if !v.trusted() {
            warn(format!(
                "kept key {k} of {} as it is, but restores will refuse it ({}: {}; signer seen: {})",
                m.branch,
                v.verdict,
                v.reason.as_deref().unwrap_or("not trusted"),
                v.signer.as_deref().unwrap_or("none")
            ));
        }
        out.push(v);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_statement_a_restore_would_not_read_is_refused() {
        let max = crate::trust::MAX_STATEMENT_BYTES as usize;
        assert!(check_size("k", max, 5000).is_ok());
        let err = check_size("k", max + 1, 5500).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Config);
        let text = format!("{err:#}");
        assert!(
            text.contains("key k would be 1048577 bytes (5500 chunks)"),
            "{text}"
        );
        assert!(!text.contains('\n'), "{text}");
    }
}
