//! Gates: named commands whose success on a tree is recorded, so that a cache
//! is only published from a tree that passed them.
//!
//! `manifest` parses `cache-manifests/gates.toml` into a plan, `record` is the
//! JSON record format.

pub mod manifest;
pub mod record;
pub mod runner;
