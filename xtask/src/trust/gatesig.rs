//! Signed gate records: a gate entry vouched for by an allowed signer.
//!
//! A green record is a ref anyone with push access can write, so on its own
//! it proves nothing. `gates run --sign` adds to each entry it records a
//! `signature` field: an SSHSIG (namespace `warmstart-cache`) over the
//! attestation text `warmstart-gate 1`, `tree`, `gate`, `digest` (what the
//! entry claims: this gate definition passed on this tree). Merges keep an
//! entry whole, signature included. Where `signed_gates` is set (trust.toml,
//! or a cache manifest's `[trust]` table), and for `gates check
//! --require-signed`, an entry counts only when its signature verifies
//! against allowed_signers at HEAD ([`Judge`]); `crate::gates::evidence`
//! applies that rule to skips and publishes.

use anyhow::Result;
use serde_json::Value;
use std::path::Path;
use xshell::Shell;

use crate::exit::{Code, fail};
use crate::gates::record::Entry;
use crate::repo::Repo;
use crate::trust::sshsig::{self, Verdict, Verifier};
use crate::trust::{policy, policy::Root, sign};

/// The entry field that holds the signature.
pub const FIELD: &str = "signature";

/// The text a gate entry's signature is over.
pub fn attestation(tree: &str, gate: &str, digest: &str) -> String {
    format!("warmstart-gate 1\ntree {tree}\ngate {gate}\ndigest {digest}\n")
}

/// The signing key of `gates run --sign` / `--signing-key`, or an error.
pub fn key_for_run(flag: Option<&Path>) -> Result<std::path::PathBuf> {
    sign::signing_key(flag).ok_or_else(|| {
        fail(
            Code::Config,
            format!(
                "gates run --sign needs a signing key: give --signing-key or {}",
                sign::KEY_VAR
            ),
        )
    })
}

/// Signs `entry` (gate `gate` of tree `tree`) in place.
pub fn sign_entry(sh: &Shell, key: &Path, tree: &str, gate: &str, entry: &mut Entry) -> Result<()> {
    let text = attestation(tree, gate, &entry.digest);
    let sig = sshsig::sign(sh, key, text.as_bytes())?;
    entry.extra.insert(
        FIELD.into(),
        Value::String(String::from_utf8_lossy(&sig).into_owned()),
    );
    Ok(())
}

/// What a gate entry's signature is worth, against allowed_signers at HEAD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signed {
    /// Over this tree, gate and the entry's digest, by an allowed signer.
    Trusted { principal: String },
    /// No signature.
    Unsigned,
    /// A valid signature by a key allowed_signers does not list.
    Stranger { fingerprint: String },
    /// Not a signature over this tree, gate and digest (made for another
    /// one, or not a signature at all).
    Invalid,
    /// There is no allowed_signers at HEAD, so nobody may sign.
    NoSigners,
}

impl Signed {
    pub fn trusted(&self) -> bool {
        matches!(self, Signed::Trusted { .. })
    }

    /// Why an entry is not trusted, for messages (empty when it is).
    pub fn why_not(&self) -> String {
        match self {
            Signed::Trusted { .. } => String::new(),
            Signed::Unsigned => "its entry is not signed (run `gates run --sign`)".into(),
            Signed::Stranger { .. } => "its signing key is not an allowed signer".into(),
            Signed::Invalid => "its signature does not verify over this tree and gate".into(),
            Signed::NoSigners => "no allowed_signers file, so nobody may sign".into(),
        }
    }

    /// The signer to name in messages, if one was seen.
    pub fn seen(&self) -> Option<&str> {
        match self {
            Signed::Trusted { principal } => Some(principal),
            Signed::Stranger { fingerprint } => Some(fingerprint),
            _ => None,
        }
    }
}

/// Judges gate entries against the trust root at HEAD; ssh-keygen runs only
/// for an entry that carries a signature.
pub struct Judge {
    pub root: Root,
    verifier: Option<Verifier>,
    state_dir: std::path::PathBuf,
}

impl Judge {
    /// Reads the trust root at HEAD of `repo` (trust.toml and allowed_signers).
    pub fn new(sh: &Shell, repo: &Repo) -> Result<Judge> {
        Ok(Judge {
            root: policy::load_root(sh, repo)?,
            verifier: None,
            state_dir: repo.state_dir(),
        })
    }

    /// The worth of `entry` as gate `gate` of tree `tree`: its signature
    /// is checked over the attestation of exactly these and its digest.
    pub fn judge(&mut self, sh: &Shell, tree: &str, gate: &str, entry: &Entry) -> Result<Signed> {
        let Some(sig) = entry.extra.get(FIELD).and_then(Value::as_str) else {
            return Ok(Signed::Unsigned);
        };
        let Some(allowed) = &self.root.allowed_signers else {
            return Ok(Signed::NoSigners);
        };
        if self.verifier.is_none() {
            let dir = sshsig::scratch_dir(&self.state_dir, "gates");
            self.verifier = Some(Verifier::new(dir, allowed)?);
        }
        let verifier = self.verifier.as_mut().expect("made above");
        let text = attestation(tree, gate, &entry.digest);
        sshsig::count_check();
        Ok(
            match verifier.verify(sh, sig.as_bytes(), text.as_bytes(), &[])? {
                Verdict::Trusted { principal, .. } => Signed::Trusted { principal },
                Verdict::Untrusted { fingerprint, .. } => Signed::Stranger { fingerprint },
                Verdict::Invalid => Signed::Invalid,
            },
        )
    }

    /// The refusal (exit 12) of gate `gate` of the record for `tree`.
    pub fn refusal(&self, tree: &str, gate: &str, why: &str, seen: Option<&str>) -> anyhow::Error {
        fail(
            Code::Untrusted,
            format!(
                "untrusted: gate {gate} of the record for tree {tree}: {why}; signer seen: {}; who may sign is listed in {}",
                seen.unwrap_or("none"),
                self.root.signers_where()
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attestation_binds_tree_gate_and_digest() {
        let a = attestation("t1", "test", "sha256:aa");
        assert_eq!(
            a,
            "warmstart-gate 1\ntree t1\ngate test\ndigest sha256:aa\n"
        );
        assert_ne!(a, attestation("t2", "test", "sha256:aa"));
        assert_ne!(a, attestation("t1", "fmt", "sha256:aa"));
        assert_ne!(a, attestation("t1", "test", "sha256:ab"));
    }
}
