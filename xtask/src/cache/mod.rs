//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation, `git` the plumbing
//! both halves share (a private cache.git, shallow fetch, blobs, trees, push).

pub mod format;
pub mod git;
pub mod manifest;
pub mod stamp;
pub mod verify;

/// Test-only kill point (temporary until unpack's is merged).
pub(crate) fn kill_point(name: &str) {
    if let Some(at) = std::env::var_os("WARMSTART_TEST_KILL_AT")
        && at == name
    {
        // SAFETY: raise(3) with a valid signal number has no preconditions.
        unsafe {
            libc::raise(libc::SIGKILL);
        }
    }
}
