//! Signed gate records: a gate entry vouched for by an allowed signer.
//!
//! A green record is a ref anyone with push access can write, so on its own
//! it proves nothing. `gates run --sign` adds to each entry it records a
//! `signature` field: an SSHSIG (namespace `warmstart-cache`) over the
//! attestation text `warmstart-gate 1`, `tree`, `gate`, `digest` (what the
//! entry claims: this gate definition passed on this tree). Merges keep an
//! entry whole, signature included. `gates check --require-signed` and a
//! publish whose manifest sets `[trust] signed_gates = true` accept only
//! entries whose signature verifies against allowed_signers at HEAD.

use anyhow::Result;
use serde_json::Value;
use std::path::Path;
use xshell::Shell;

use crate::exit::{Code, fail};
use crate::gates::record::{Entry, Record};
use crate::repo::Repo;
use crate::trust::sshsig::{self, Verdict, Verifier};
use crate::trust::{Checker, sign};

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

/// Refuses (exit 12) unless every gate of `names` in `record` is signed by
/// an allowed signer of HEAD; names the first that is not, and its signer.
pub fn require_signed(sh: &Shell, repo: &Repo, record: &Record, names: &[String]) -> Result<()> {
    let checker = Checker::new(sh, repo)?;
    let where_ = checker.root.signers_where();
    let refuse = |gate: &str, why: String, signer: Option<String>| {
        fail(
            Code::Untrusted,
            format!(
                "untrusted: gate {gate} of the record for tree {}: {why}; signer seen: {}; who may sign is listed in {where_}",
                record.tree,
                signer.as_deref().unwrap_or("none")
            ),
        )
    };
    let Some(allowed) = &checker.root.allowed_signers else {
        let first = names.first().map(String::as_str).unwrap_or("(none)");
        return Err(refuse(
            first,
            "no allowed_signers file, so nobody may sign".into(),
            None,
        ));
    };
    let mut verifier = Verifier::new(sshsig::scratch_dir(&repo.state_dir(), "gates"), allowed)?;
    for name in names {
        let Some(entry) = record.gates.get(name) else {
            return Err(refuse(name, "it is not in the record".into(), None));
        };
        let Some(sig) = entry.extra.get(FIELD).and_then(Value::as_str) else {
            return Err(refuse(
                name,
                "its entry is not signed (run `gates run --sign`)".into(),
                None,
            ));
        };
        let text = attestation(&record.tree, name, &entry.digest);
        sshsig::count_check();
        match verifier.verify(sh, sig.as_bytes(), text.as_bytes(), &[])? {
            Verdict::Trusted { .. } => {}
            Verdict::Untrusted { fingerprint, .. } => {
                return Err(refuse(
                    name,
                    "its signing key is not an allowed signer".into(),
                    Some(fingerprint),
                ));
            }
            Verdict::Invalid => {
                return Err(refuse(
                    name,
                    "its signature does not verify over this tree and gate".into(),
                    None,
                ));
            }
        }
    }
    Ok(())
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
