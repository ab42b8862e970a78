//! The per-clone record of the newest signed statement seen per cache key:
//! `<state>/trust/seen`, one `<cache> <key> <created_at>` line each (and
//! `#` comments), so that the shell bootstrap (`tools/warmstart-bootstrap.sh`,
//! which has no JSON reader) reads and extends the same record with awk.
//!
//! A restore refuses a validly signed statement older than the one recorded
//! here (a rollback). A fresh clone has no record and accepts the newest.
//! Only ever moves forward; written to a temp file and renamed. An older
//! build kept the record as `seen.json` (`{"format": 1, "seen": {"<cache>
//! <key>": created_at}}`): it is still read, merged in, and removed once the
//! line file holds its entries.

use anyhow::Result;
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

    /// Keeps the newer of the recorded and `created_at`; true if it moved.
    fn advance(&mut self, entry: String, created_at: &str) -> bool {
        let slot = self.seen.entry(entry).or_default();
        if slot.as_str() >= created_at {
            return false;
        }
        *slot = created_at.to_string();
        true
    }
}

/// The record's file (the one the bootstrap script reads too).
pub fn path(state_dir: &Path) -> PathBuf {
    state_dir.join("trust").join("seen")
}

/// The record as an older build kept it, beside `file`.
fn legacy_path(file: &Path) -> PathBuf {
    file.with_file_name("seen.json")
}

fn corrupt(file: &Path) -> anyhow::Error {
    fail(
        Code::Corrupt,
        format!(
            "{} is corrupt: it records the newest signed statement seen per cache key; delete it to trust the newest on the branch again",
            file.display()
        ),
    )
}

fn read_optional(file: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(file) {
        Ok(t) => Ok(Some(t)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(anyhow::Error::new(e).context(format!("reading {}", file.display()))),
    }
}

/// `<cache> <key>`: two non-empty words, nothing the shell bootstrap's awk
/// would split differently.
fn is_entry(entry: &str) -> bool {
    let mut words = entry.split(' ');
    let word = |w: Option<&str>| {
        w.is_some_and(|w| !w.is_empty() && !w.contains(|c: char| c.is_whitespace()))
    };
    word(words.next()) && word(words.next()) && words.next().is_none()
}

/// Loads the record (empty when absent), the legacy `seen.json` merged in.
/// A corrupt one is exit 5, left in place: forgetting it silently would
/// re-open rollbacks.
pub fn load(file: &Path) -> Result<Seen> {
    let mut s = Seen {
        format: 1,
        seen: BTreeMap::new(),
    };
    let legacy = legacy_path(file);
    if let Some(text) = read_optional(&legacy)? {
        let old = serde_json::from_str::<Seen>(&text)
            .ok()
            .filter(|s| s.format == 1)
            .ok_or_else(|| corrupt(&legacy))?;
        for (k, v) in old.seen {
            // Each entry becomes a line of the line file: a name or a time
            // with a line break or another space would write other lines.
            if !is_entry(&k) || super::statement::check_timestamp(&v).is_err() {
                return Err(corrupt(&legacy));
            }
            s.advance(k, &v);
        }
    }
    for line in read_optional(file)?.unwrap_or_default().lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let f: Vec<&str> = line.split(' ').collect();
        let [cache, key, at] = f[..] else {
            return Err(corrupt(file));
        };
        if cache.is_empty() || key.is_empty() || super::statement::check_timestamp(at).is_err() {
            return Err(corrupt(file));
        }
        s.advance(format!("{cache} {key}"), at);
    }
    Ok(s)
}

/// Records `created_at` for `key` of `cache` if it is newer than the record.
pub fn record(file: &Path, cache: &str, key: &str, created_at: &str) -> Result<()> {
    if cache.contains([' ', '\n']) || key.contains([' ', '\n']) {
        anyhow::bail!(
            "cache {cache:?} key {key:?}: a name with a space cannot be recorded in {}",
            file.display()
        );
    }
    let mut s = load(file)?;
    let legacy = legacy_path(file);
    if !s.advance(format!("{cache} {key}"), created_at) && !legacy.exists() {
        return Ok(());
    }
    let mut text = String::from(
        "# the newest signed created_at this clone has seen per cache key: <cache> <key> <created_at>\n",
    );
    for (entry, at) in &s.seen {
        text.push_str(&format!("{entry} {at}\n"));
    }
    crate::fsio::write_atomic(file, text.as_bytes())?;
    // Its entries are in the line file now.
    match std::fs::remove_file(&legacy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::Error::new(e).context(format!("removing {}", legacy.display())))
        }
        _ => Ok(()),
    }
}

/// The memo of signatures verified as trusted: `<state>/trust/verified`,
/// one `<digest> <principal> <fingerprint>` line each.
pub fn verified_path(state_dir: &Path) -> PathBuf {
    state_dir.join("trust").join("verified")
}

/// What a verification depends on: the allowed signers' bytes, the
/// cache's principals, the signed bytes and the signature.
pub fn verified_digest(allowed: &[u8], principals: &[String], text: &[u8], sig: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for part in [allowed, principals.join(",").as_bytes(), text, sig] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part);
    }
    crate::hex::encode(&h.finalize())
}

/// The principal and fingerprint a digest was verified as, if it was.
pub fn verified(file: &Path, digest: &str) -> Option<(String, String)> {
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(' ');
        (f.next() == Some(digest)).then(|| {
            let p = f.next().unwrap_or_default().to_string();
            (p, f.next().unwrap_or_default().to_string())
        })
    })
}

/// Remembers a trusted verification. Best effort: losing it costs only a
/// process next time. Kept to the last 256 lines.
pub fn remember_verified(file: &Path, digest: &str, principal: &str, fingerprint: &str) {
    if principal.contains([' ', '\n']) || fingerprint.contains([' ', '\n']) {
        return;
    }
    let old = std::fs::read_to_string(file).unwrap_or_default();
    let mut lines: Vec<&str> = old.lines().collect();
    let new = format!("{digest} {principal} {fingerprint}");
    lines.push(&new);
    let keep = &lines[lines.len().saturating_sub(256)..];
    // A failed write removes its own temporary; the old memo stays.
    let _ = crate::fsio::write_atomic(file, (keep.join("\n") + "\n").as_bytes());
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
        let text = std::fs::read_to_string(&f).unwrap();
        assert!(text.contains("\nc k 2026-12-01T10:00:05Z\n"), "{text}");
        for bad in [
            "c k\n",
            "c k 2026-12-01 10:00:05Z\n",
            "c k yesterday\n",
            " k 2026-12-01T10:00:05Z\n",
        ] {
            std::fs::write(&f, bad).unwrap();
            assert_eq!(
                crate::exit::code_of(&load(&f).unwrap_err()),
                Code::Corrupt,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn the_legacy_json_record_is_merged_then_replaced() {
        let tmp = tempfile::tempdir().unwrap();
        let f = path(tmp.path());
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        let legacy = legacy_path(&f);
        std::fs::write(
            &legacy,
            r#"{"format": 1, "seen": {"c k": "2026-12-01T10:00:05Z"}}"#,
        )
        .unwrap();
        // What the shell bootstrap appends: another key, and an older k.
        std::fs::write(&f, "c j 2026-12-01T09:00:00Z\nc k 2026-12-01T10:00:01Z\n").unwrap();
        let s = load(&f).unwrap();
        assert_eq!(s.get("c", "k"), Some("2026-12-01T10:00:05Z"));
        assert_eq!(s.get("c", "j"), Some("2026-12-01T09:00:00Z"));
        record(&f, "c", "i", "2026-12-01T08:00:00Z").unwrap();
        assert!(!legacy.exists());
        let s = load(&f).unwrap();
        assert_eq!(s.get("c", "k"), Some("2026-12-01T10:00:05Z"));
        assert_eq!(s.get("c", "i"), Some("2026-12-01T08:00:00Z"));
        std::fs::write(&legacy, "{").unwrap();
        assert_eq!(crate::exit::code_of(&load(&f).unwrap_err()), Code::Corrupt);
    }

    #[test]
    fn verified_memo_depends_on_every_input() {
        let tmp = tempfile::tempdir().unwrap();
        let f = verified_path(tmp.path());
        let p = vec!["ci".to_string()];
        let d = verified_digest(b"ci key", &p, b"stmt", b"sig");
        assert_eq!(verified(&f, &d), None);
        remember_verified(&f, &d, "ci", "SHA256:x");
        assert_eq!(verified(&f, &d), Some(("ci".into(), "SHA256:x".into())));
        for other in [
            verified_digest(b"ci key2", &p, b"stmt", b"sig"),
            verified_digest(b"ci key", &[], b"stmt", b"sig"),
            verified_digest(b"ci key", &p, b"stmt2", b"sig"),
            verified_digest(b"ci key", &p, b"stmt", b"sig2"),
            // Boundaries are length-prefixed: moving a byte across is another input.
            verified_digest(b"ci ke", &p, b"ystmt", b"sig"),
        ] {
            assert_ne!(other, d);
            assert_eq!(verified(&f, &other), None);
        }
    }
}
