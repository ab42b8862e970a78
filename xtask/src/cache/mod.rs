//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation, `git` the plumbing
//! both halves share (a private cache.git, shallow fetch, blobs, trees, push).
//! The restore half: `branch` reads and cross-checks a fetched branch,
//! `verify` streams it (no unverified byte reaches the decoder), `restore`
//! installs it, `stamp` makes the next run warm, `compare` checks an
//! installed copy, `check` is `cache verify`, `status` is `cache list` and
//! `cache status`.

pub mod branch;
pub mod check;
pub mod compare;
pub mod format;
pub mod git;
pub mod manifest;
pub mod restore;
pub mod stamp;
pub mod status;
pub mod verify;

