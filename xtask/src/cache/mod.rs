//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation, `git` the plumbing
//! both halves share (a private cache.git, shallow fetch, blobs, trees, push).

pub mod format;
pub mod git;
pub mod manifest;
pub mod pack;
pub mod readme;
