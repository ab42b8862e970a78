//! SSH signatures (SSHSIG) through `ssh-keygen -Y sign|find-principals|verify`.
//!
//! Why the OpenSSH tool and not a Rust crate: the shell bootstrap must check
//! the same signatures with `ssh-keygen` anyway, so using it here keeps one
//! implementation of the format; it signs with keys held by ssh-agent or a
//! hardware token as well as key files; and `ssh-key` with `ed25519` adds
//! about 20 crates and 17 s to a cold build (measured in a scratch crate),
//! while the process costs 2 to 10 ms a call, far under the 50 ms budget.
//! Signed data goes through stdin; signature and allowed-signers files live
//! in a scratch directory this module removes. Never reads a trust root by
//! itself: the caller hands it the allowed-signers bytes.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use xshell::{Shell, cmd};

use crate::exit::{Code, fail};
use crate::trust::armor;

/// The SSHSIG namespace of every cache statement and gate record.
pub const NAMESPACE: &str = "warmstart-cache";

/// What checking one signature found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// A valid signature by `principal` of the allowed signers.
    Trusted {
        principal: String,
        fingerprint: String,
    },
    /// A valid signature by a key the allowed signers do not list (or list
    /// only under principals this cache does not allow).
    Untrusted {
        fingerprint: String,
        principals: Vec<String>,
    },
    /// The signature does not verify over these bytes (or is not a signature).
    Invalid,
}

/// Counts signature checks in this process, for `--json` (`signature_checks`).
static CHECKS: AtomicU64 = AtomicU64::new(0);

/// Signatures judged by this process so far (verified by ssh-keygen, or
/// found in the memo of ones this clone verified before).
pub fn checks() -> u64 {
    CHECKS.load(Ordering::Relaxed)
}

/// Counts one signature judged.
pub fn count_check() {
    CHECKS.fetch_add(1, Ordering::Relaxed);
}

/// Signs `data` with the private key at `key` (or the public key of a key
/// in ssh-agent), namespace `NAMESPACE`; the armored signature.
pub fn sign(sh: &Shell, key: &Path, data: &[u8]) -> Result<Vec<u8>> {
    if !key.exists() {
        return Err(fail(
            Code::Config,
            format!(
                "signing key {} does not exist: give an ssh private key with --signing-key or WARMSTART_SIGNING_KEY",
                key.display()
            ),
        ));
    }
    let out = cmd!(sh, "ssh-keygen -Y sign -q -f {key} -n {NAMESPACE}").quiet();
    let out = with_stdin(out, data).map_err(|e| missing_tool(e.into()))?;
    if !out.status.success() || !out.stdout.starts_with(b"-----BEGIN SSH SIGNATURE-----") {
        return Err(fail(
            Code::Config,
            format!(
                "ssh-keygen could not sign with {} ({}): give an unencrypted ed25519 private key, or load it into ssh-agent",
                key.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ));
    }
    Ok(out.stdout)
}

/// Runs `cmd` with `data` on its stdin and its output captured, whatever
/// its exit status. ssh-keygen reads the signature file first and exits
/// on one it cannot parse (a hostile or broken signature) before reading
/// its stdin: the broken pipe that leaves us is its verdict, which the exit
/// status carries, not a failure to run it.
fn with_stdin(cmd: xshell::Cmd<'_>, data: &[u8]) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    use std::process::Stdio;
    let mut c = std::process::Command::from(cmd);
    c.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn()?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // ssh-keygen reads all of its stdin before it writes a word (it hashes
    // the message first), so writing it whole before reading cannot block.
    let written = stdin.write_all(data);
    drop(stdin);
    match written {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
        _ => child.wait_with_output(),
    }
}

fn missing_tool(e: anyhow::Error) -> anyhow::Error {
    fail(
        Code::Untrusted,
        format!(
            "cannot check or make signatures: running ssh-keygen failed ({e:#}); install openssh-client"
        ),
    )
}

/// Checks signatures against one allowed-signers file.
pub struct Verifier {
    dir: PathBuf,
    allowed: PathBuf,
    /// The file's keys, when `armor` understands every line of it.
    keys: Option<Vec<(Vec<String>, Vec<u8>)>>,
    n: u64,
}

impl Verifier {
    /// Writes `allowed_signers` into a fresh scratch directory `dir`.
    pub fn new(dir: PathBuf, allowed_signers: &[u8]) -> Result<Verifier> {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let allowed = dir.join("allowed_signers");
        std::fs::write(&allowed, allowed_signers)
            .with_context(|| format!("writing {}", allowed.display()))?;
        Ok(Verifier {
            dir,
            allowed,
            keys: armor::allowed_keys(allowed_signers),
            n: 0,
        })
    }

    /// Checks `sig` over `data`. `only`, when not empty, are the principals
    /// this cache accepts among the allowed signers.
    pub fn verify(
        &mut self,
        sh: &Shell,
        sig: &[u8],
        data: &[u8],
        only: &[String],
    ) -> Result<Verdict> {
        self.n += 1;
        let sig_file = self.dir.join(format!("{}.sig", self.n));
        std::fs::write(&sig_file, sig)
            .with_context(|| format!("writing {}", sig_file.display()))?;
        // One process instead of two or three when the signer's key and the
        // allowed keys can be read here: verify as the principals that list
        // that very key, and name an unlisted key without asking.
        let verdict = match (armor::sig_public_key(sig), &self.keys) {
            (Some(key), Some(keys)) => self.verify_known_key(sh, &sig_file, data, only, &key, keys),
            _ => self.verify_by_ssh_keygen(sh, &sig_file, data, only),
        };
        let _ = std::fs::remove_file(&sig_file);
        verdict
    }

    /// The signer's `key` is among the readable allowed `keys`: verifies as
    /// each principal listed with it that `only` accepts.
    fn verify_known_key(
        &self,
        sh: &Shell,
        sig_file: &Path,
        data: &[u8],
        only: &[String],
        key: &[u8],
        keys: &[(Vec<String>, Vec<u8>)],
    ) -> Result<Verdict> {
        let fingerprint = armor::fingerprint(key);
        let principals: Vec<String> = keys
            .iter()
            .filter(|(_, k)| *k == key)
            .flat_map(|(p, _)| p.iter().cloned())
            .collect();
        let candidates: Vec<&String> = principals
            .iter()
            .filter(|p| only.is_empty() || only.contains(p))
            .collect();
        if candidates.is_empty() {
            return Ok(Verdict::Untrusted {
                fingerprint,
                principals,
            });
        }
        for p in candidates {
            if self.verify_as(sh, sig_file, data, p)? {
                return Ok(Verdict::Trusted {
                    principal: p.clone(),
                    fingerprint,
                });
            }
        }
        Ok(Verdict::Invalid)
    }

    /// Asks `ssh-keygen` who may have signed, verifies as each, and else
    /// who signed at all.
    fn verify_by_ssh_keygen(
        &self,
        sh: &Shell,
        sig_file: &Path,
        data: &[u8],
        only: &[String],
    ) -> Result<Verdict> {
        let allowed = &self.allowed;
        let found = cmd!(
            sh,
            "ssh-keygen -Y find-principals -s {sig_file} -f {allowed}"
        )
        .quiet()
        .ignore_status()
        .ignore_stderr()
        .output()
        .map_err(|e| missing_tool(e.into()))?;
        let principals: Vec<String> = if found.status.success() {
            String::from_utf8_lossy(&found.stdout)
                .lines()
                .map(|l| l.trim().to_string())
                .filter(|l| !l.is_empty())
                .collect()
        } else {
            Vec::new()
        };
        for p in principals
            .iter()
            .filter(|p| only.is_empty() || only.contains(p))
        {
            let out = cmd!(
                sh,
                "ssh-keygen -Y verify -f {allowed} -I {p} -n {NAMESPACE} -s {sig_file}"
            )
            .quiet();
            let out = with_stdin(out, data).map_err(|e| missing_tool(e.into()))?;
            if out.status.success() {
                return Ok(Verdict::Trusted {
                    principal: p.clone(),
                    fingerprint: fingerprint_in(&out.stdout).unwrap_or_default(),
                });
            }
        }
        // Not trusted: who signed it, if it is a valid signature at all.
        let out = cmd!(
            sh,
            "ssh-keygen -Y check-novalidate -n {NAMESPACE} -s {sig_file}"
        )
        .quiet();
        let out = with_stdin(out, data).map_err(|e| missing_tool(e.into()))?;
        match fingerprint_in(&out.stdout).filter(|_| out.status.success()) {
            Some(fingerprint) => Ok(Verdict::Untrusted {
                fingerprint,
                principals,
            }),
            None => Ok(Verdict::Invalid),
        }
    }
}

impl Verifier {
    /// `ssh-keygen -Y verify` as principal `p`.
    fn verify_as(&self, sh: &Shell, sig_file: &Path, data: &[u8], p: &str) -> Result<bool> {
        let allowed = &self.allowed;
        let out = cmd!(
            sh,
            "ssh-keygen -Y verify -f {allowed} -I {p} -n {NAMESPACE} -s {sig_file}"
        )
        .quiet();
        let out = with_stdin(out, data).map_err(|e| missing_tool(e.into()))?;
        Ok(out.status.success())
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `SHA256:...` in ssh-keygen's "Good ... signature ... key SHA256:..." line.
fn fingerprint_in(out: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(out);
    let at = text.find("SHA256:")?;
    Some(
        text[at..]
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string(),
    )
}

/// A scratch directory name unique to this process and call.
pub fn scratch_dir(state_dir: &Path, what: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    state_dir.join("trust").join(format!(
        "tmp-{what}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// Reads an allowed-signers file for error messages: `Err` never, the
/// principals listed (first field of each line).
pub fn principals_listed(allowed_signers: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(allowed_signers)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_are_read_from_good_lines() {
        let line = b"Good \"warmstart-cache\" signature for ci with ED25519 key SHA256:1tHJX2IV\n";
        assert_eq!(fingerprint_in(line).as_deref(), Some("SHA256:1tHJX2IV"));
        assert_eq!(fingerprint_in(b"Could not verify signature."), None);
    }

    #[test]
    fn principals_skip_comments() {
        let file = b"# team\nci ssh-ed25519 AAAA\n\nalice@x,bob ssh-ed25519 BBBB\n";
        assert_eq!(principals_listed(file), ["ci", "alice@x,bob"]);
    }

    /// Real keys made by ssh-keygen: trusted, signed by a stranger, a
    /// principal this cache does not allow, and bytes that were changed.
    #[test]
    fn real_signatures_get_each_verdict() {
        let tmp = tempfile::tempdir().unwrap();
        let sh = Shell::new().unwrap();
        let empty = "";
        let keygen = |name: &str| {
            let f = tmp.path().join(name);
            cmd!(sh, "ssh-keygen -q -t ed25519 -N {empty} -C {name} -f {f}")
                .quiet()
                .run()
                .unwrap();
            (
                f.clone(),
                std::fs::read_to_string(f.with_extension("pub")).unwrap(),
            )
        };
        let (ci, ci_pub) = keygen("ci");
        let (evil, _) = keygen("evil");
        let ci_pubfile = ci.with_extension("pub");
        let listed = cmd!(sh, "ssh-keygen -lf {ci_pubfile}")
            .quiet()
            .read()
            .unwrap();
        // The fast path (keys read here) and the fallback (a quoted option
        // this module leaves to ssh-keygen) must give the same verdicts.
        for allowed in [
            format!("ci {ci_pub}"),
            format!("ci namespaces=\"warmstart-cache\" {ci_pub}"),
        ] {
            let dir = tmp.path().join(format!("scratch-{}", allowed.len()));
            let mut v = Verifier::new(dir, allowed.as_bytes()).unwrap();
            let data = b"warmstart-statement 1\n";
            let sig = sign(&sh, &ci, data).unwrap();
            match v.verify(&sh, &sig, data, &[]).unwrap() {
                Verdict::Trusted {
                    principal,
                    fingerprint,
                } => {
                    assert_eq!(principal, "ci");
                    assert!(listed.contains(&fingerprint), "{fingerprint} vs {listed}");
                }
                other => panic!("{allowed}: {other:?}"),
            }
            let only = vec!["release".to_string()];
            assert!(matches!(
                v.verify(&sh, &sig, data, &only).unwrap(),
                Verdict::Untrusted { principals, .. } if principals == ["ci"]
            ));
            assert_eq!(
                v.verify(&sh, &sig, b"other bytes", &[]).unwrap(),
                Verdict::Invalid
            );
            assert_eq!(
                v.verify(&sh, b"not a signature", data, &[]).unwrap(),
                Verdict::Invalid
            );
            let stranger = sign(&sh, &evil, data).unwrap();
            assert!(matches!(
                v.verify(&sh, &stranger, data, &[]).unwrap(),
                Verdict::Untrusted { principals, fingerprint } if principals.is_empty() && fingerprint.starts_with("SHA256:")
            ));
        }
        let data = b"x";
        let err = sign(&sh, &tmp.path().join("absent"), data).unwrap_err();
        assert_eq!(crate::exit::code_of(&err), Code::Config);
    }
}
