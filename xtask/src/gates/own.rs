//! This clone's own gate runs: each entry `gates run` recorded here, kept
//! under `<state>/gates/own/<tree>/<gate>.json` beside the shared record.
//!
//! Anyone who can push refs can write a record, and a fetch merges it in;
//! nobody but this clone writes here (the state directory is never fetched
//! or pushed). So without a trust policy these are the only entries `gates
//! run --skip-green` skips on. Kept per gate as written, they survive any
//! merge of the shared record, even one that replaced this clone's entry
//! with another machine's.
//!
//! Must never: hold an entry that this clone's `gates run` did not record.

use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::record::Entry;
use crate::repo::Repo;

fn dir(repo: &Repo, tree: &str) -> PathBuf {
    repo.state_dir().join("gates").join("own").join(tree)
}

/// Keeps `entry`, just recorded for gate `gate` of tree `tree` by this clone.
pub fn keep(repo: &Repo, tree: &str, gate: &str, entry: &Entry) -> Result<()> {
    let path = dir(repo, tree).join(format!("{gate}.json"));
    let bytes = serde_json::to_vec_pretty(entry).context("an entry always serializes")?;
    crate::fsio::write_atomic(&path, &bytes)
        .with_context(|| format!("keeping this clone's run of gate {gate}"))
}

/// The entries this clone recorded for `tree`, by gate. A file that does not
/// read as an entry is left out (the gate then runs again).
pub fn read(repo: &Repo, tree: &str) -> Result<BTreeMap<String, Entry>> {
    let dir = dir(repo, tree);
    let mut out = BTreeMap::new();
    let listing = match std::fs::read_dir(&dir) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
    };
    for file in listing {
        let path = file
            .with_context(|| format!("reading {}", dir.display()))?
            .path();
        let Some(gate) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        let entry = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Entry>(&b).ok());
        if let Some(entry) = entry {
            out.insert(gate.to_string(), entry);
        }
    }
    Ok(out)
}
