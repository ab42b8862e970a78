//! The per-clone record of the newest signed statement seen per cache key:
//! `<state>/trust/seen.json`, `{"format": 1, "seen": {"<cache> <key>": created_at}}`.
//!
//! A restore refuses a validly signed statement older than the one recorded
//! here (a rollback). A fresh clone has no record and accepts the newest.
//! Only ever moves forward; written to a temp file and renamed.

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::exit::{Code, fail};

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    format: u32,
    seen: BTreeMap<String, String>,
}

impl Seen {
    /// The newest created_at seen for `key` of `cache`.
    pub fn get(&self, cache: &str, key: &str) -> Option<&str> {
        self.seen.get(&format!("{cache} {key}")).map(String::as_str)
    }
}

pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("trust").join("seen.json")
}

/// Loads the record (empty when absent). A corrupt one is exit 5, left in
/// place: forgetting it silently would re-open rollbacks.
pub fn load(file: &Path) -> Result<Seen> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Seen::default()),
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {}", file.display()))),
    };
    serde_json::from_str::<Seen>(&text)
        .ok()
        .filter(|s| s.format == 1)
        .ok_or_else(|| {
            fail(
                Code::Corrupt,
                format!(
                    "{} is corrupt: it records the newest signed statement seen per cache key; delete it to trust the newest on the branch again",
                    file.display()
                ),
            )
        })
}

/// Records `created_at` for `key` of `cache` if it is newer than the record.
pub fn record(file: &Path, cache: &str, key: &str, created_at: &str) -> Result<()> {
    let mut s = load(file)?;
    s.format = 1;
    let slot = s.seen.entry(format!("{cache} {key}")).or_default();
    if slot.as_str() >= created_at {
        return Ok(());
    }
    *slot = created_at.to_string();
    let dir = file.parent().expect("seen.json has a parent");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!("seen.json.tmp-{}", std::process::id()));
    let text = serde_json::to_string_pretty(&s).expect("seen serializes") + "\n";
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, file).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_moves_forward_and_corrupt_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let f = path(tmp.path());
        assert_eq!(load(&f).unwrap().get("c", "k"), None);
        record(&f, "c", "k", "2026-12-01T10:00:05Z").unwrap();
        record(&f, "c", "k", "2026-12-01T10:00:01Z").unwrap();
        record(&f, "c", "j", "2026-12-01T09:00:00Z").unwrap();
        let s = load(&f).unwrap();
        assert_eq!(s.get("c", "k"), Some("2026-12-01T10:00:05Z"));
        assert_eq!(s.get("c", "j"), Some("2026-12-01T09:00:00Z"));
        std::fs::write(&f, "{").unwrap();
        assert_eq!(crate::exit::code_of(&load(&f).unwrap_err()), Code::Corrupt);
    }
}
