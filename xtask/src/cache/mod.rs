//! Cache branches: publish an artifact to an orphan branch, restore it, verify it.
//!
//! `format` is the branch layout (pure data), `manifest` the validated
//! `cache-manifests/<name>.toml` plan and key computation.

pub mod format;
pub mod manifest;
