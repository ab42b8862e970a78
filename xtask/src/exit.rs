//! Exit codes and the typed failure that carries one.
//!
//! Every error that a script or a person must tell apart gets its own code
//! here, and the table in README.md lists exactly these. Codes are stable:
//! never renumber one, only add.

use std::fmt;

/// The process exit codes of `cargo xtask`. README.md's table mirrors this.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    /// Success.
    Ok = 0,
    /// A failure not classified below (an I/O error, a tool that failed).
    Failed = 1,
    /// Bad arguments or flags.
    Usage = 2,
    /// A lock (index lock, restore lock, cache.git lock) or a publish's
    /// lease on its branch could not be taken in time.
    Busy = 3,
    /// Nothing to act on: nothing resumable, no such cache branch or key.
    NotFound = 4,
    /// A state file (index, stamp, journal, record) is corrupt, truncated,
    /// unreadable or of an unknown version; it was left in place or set aside.
    Corrupt = 5,
    /// Verification failed: a checksum, size, missing or extra chunk, or
    /// SHA256SUMS disagreeing with warmstart.json.
    Verify = 6,
    /// An archive entry was refused as unsafe (escapes the target, device
    /// node, link outside) or a size, count or window limit was exceeded.
    Unsafe = 7,
    /// The remote could not be reached (fetch or push failed).
    Remote = 8,
    /// Publishing was refused because the tree is not one others can
    /// check: its required gates are not green, or HEAD is a commit the
    /// remote does not have. Both are fixed the same way, by landing the
    /// tree (push it, let CI make it green), so they share one code.
    NotGreen = 9,
    /// A manifest or configuration file is invalid.
    Config = 10,
    /// A gate or a restore step failed (gates run, restore --strict).
    StepFailed = 11,
    /// A cache key was refused by the trust policy: unsigned, signed by a
    /// signer the repository does not allow, not matching its statement,
    /// a rollback, or ungated.
    Untrusted = 12,
    /// The remote refused who we are: wrong password or token (HTTP 401),
    /// wrong ssh key, a proxy's 407, a server certificate that does not
    /// verify. Retrying will not help; the credentials must change.
    AuthRefused = 13,
}

impl Code {
    pub fn as_i32(self) -> i32 {
        self as u8 as i32
    }

    /// Every code with its one-line meaning, in order: the README's table.
    pub const ALL: [(Code, &'static str); 14] = [
        (Code::Ok, "success"),
        (
            Code::Failed,
            "failure not classified below (I/O error, a tool that failed)",
        ),
        (Code::Usage, "usage: bad arguments or flags"),
        (
            Code::Busy,
            "busy: a lock or lease could not be taken in time",
        ),
        (
            Code::NotFound,
            "not found: nothing resumable, no such cache branch or key",
        ),
        (
            Code::Corrupt,
            "corrupt state file (index, stamp, journal): left in place or set aside",
        ),
        (
            Code::Verify,
            "verification failed: checksum, size, missing chunk, sums/manifest mismatch",
        ),
        (
            Code::Unsafe,
            "unsafe archive entry refused, or a size/count/window limit exceeded",
        ),
        (
            Code::Remote,
            "remote unreachable or timed out: fetch or push failed",
        ),
        (
            Code::NotGreen,
            "publish refused: required gates are not green for this tree, or HEAD is not on the remote",
        ),
        (Code::Config, "invalid manifest or configuration"),
        (Code::StepFailed, "a gate or a restore step failed"),
        (
            Code::Untrusted,
            "untrusted: a cache key's signature is missing, not allowed or does not match",
        ),
        (
            Code::AuthRefused,
            "authentication refused: password, token, ssh key, proxy 407 or server certificate",
        ),
    ];
}

/// An error that decides the exit code. Wrap it in anyhow with `.context()`
/// as usual; `code_of` finds it anywhere in the chain.
#[derive(Debug)]
pub struct Failure {
    pub code: Code,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {}

/// Builds an error with an exit code: `return Err(fail(Code::Verify, format!(..)))`.
pub fn fail(code: Code, message: impl Into<String>) -> anyhow::Error {
    anyhow::Error::new(Failure {
        code,
        message: message.into(),
    })
}

/// The exit code for an error: the outermost `Failure` in its chain, else 1.
pub fn code_of(err: &anyhow::Error) -> Code {
    err.chain()
        .find_map(|e| e.downcast_ref::<Failure>())
        .map(|f| f.code)
        .unwrap_or(Code::Failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn code_survives_context() {
        let err = Err::<(), _>(fail(Code::Verify, "chunk 3 differs"))
            .context("restoring cache x")
            .unwrap_err();
        assert_eq!(code_of(&err), Code::Verify);
        assert_eq!(format!("{err:#}"), "restoring cache x: chunk 3 differs");
    }

    #[test]
    fn unclassified_is_one() {
        assert_eq!(code_of(&anyhow::anyhow!("boom")), Code::Failed);
    }

    #[test]
    fn table_is_in_order() {
        // Strictly increasing: a code waiting for its issue (12) may be a gap.
        for w in Code::ALL.windows(2) {
            assert!(w[0].0.as_i32() < w[1].0.as_i32(), "{:?}", w[1].0);
        }
        assert_eq!(Code::ALL[0].0, Code::Ok);
    }
}
