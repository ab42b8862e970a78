//! The green record: which gates passed for one tree, as JSON.
//!
//! A record is bound to a tree id (never a commit id), lists each green gate
//! with the digest of its command, duration, host, tool version and time, and
//! merges with another record of the same tree by keeping, per gate, the most
//! recent entry. Unknown fields are kept, so a newer warmstart's additions
//! survive a merge made by an older one. This module is pure: no git, no
//! processes, no clock except where a caller passes one in.
//!
//! ```json
//! {
//!   "format": "warmstart-gates/1",
//!   "tree": "<tree id>",
//!   "gates": {
//!     "test": {
//!       "digest": "sha256:...", "command": "cargo nextest run", "cwd": ".",
//!       "duration_ms": 81234, "host": "ci-runner-7", "tool": "warmstart 0.1.0",
//!       "finished_at": "2026-11-30T02:31:07Z", "commit": "<HEAD when it ran>"
//!     }
//!   }
//! }
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// The value of `format` this build writes and reads.
pub const FORMAT: &str = "warmstart-gates/1";

/// All green gates of one tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub format: String,
    pub tree: String,
    /// Sorted by gate name, so the same record always gives the same bytes.
    pub gates: BTreeMap<String, Entry>,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One gate that passed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// `sha256:<hex>` of command, cwd and env (manifest::digest).
    pub digest: String,
    /// The command as a person would type it (informative; the digest decides).
    pub command: String,
    pub cwd: String,
    pub duration_ms: u64,
    pub host: String,
    /// `warmstart <version>` of the binary that ran the gate.
    pub tool: String,
    /// RFC 3339 UTC, second precision: `YYYY-MM-DDTHH:MM:SSZ`.
    pub finished_at: String,
    /// HEAD's commit when the gate ran: which commit the tree came from.
    pub commit: String,
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Whether a gate is green in a record, judged against the current digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Green,
    /// No entry for the gate.
    Missing,
    /// An entry exists, but the gate's command, cwd or env changed since.
    Stale,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Green => "green",
            State::Missing => "missing",
            State::Stale => "stale",
        }
    }
}

/// Why bytes are not a record for the expected tree.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("not a gate record: {0}")]
    Json(String),
    #[error("format `{0}` is not `{FORMAT}` (written by a newer warmstart?)")]
    Format(String),
    #[error("it is for tree {found}, not {expected}")]
    Tree { expected: String, found: String },
}

impl Record {
    pub fn new(tree: &str) -> Record {
        Record {
            format: FORMAT.to_string(),
            tree: tree.to_string(),
            gates: BTreeMap::new(),
            extra: Map::new(),
        }
    }

    /// Reads a record and checks that it is one this build understands, for `tree`.
    pub fn parse(bytes: &[u8], tree: &str) -> Result<Record, ParseError> {
        // Check the format before the shape, so a future format with other
        // fields is reported as such, not as a missing field.
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| ParseError::Json(e.to_string()))?;
        match value.get("format").and_then(Value::as_str) {
            Some(FORMAT) => {}
            Some(other) => return Err(ParseError::Format(other.to_string())),
            None => return Err(ParseError::Json("no `format` field".into())),
        }
        let record: Record =
            serde_json::from_value(value).map_err(|e| ParseError::Json(e.to_string()))?;
        if record.tree != tree {
            return Err(ParseError::Tree {
                expected: tree.to_string(),
                found: record.tree,
            });
        }
        Ok(record)
    }

    /// Pretty JSON with a trailing newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("a record always serializes");
        out.push(b'\n');
        out
    }

    /// The gate's state against the digest of its current definition.
    pub fn state(&self, gate: &str, digest: &str) -> State {
        match self.gates.get(gate) {
            None => State::Missing,
            Some(e) if e.digest == digest => State::Green,
            Some(_) => State::Stale,
        }
    }

    /// Adds or replaces one gate's entry.
    pub fn insert(&mut self, gate: &str, entry: Entry) {
        self.gates.insert(gate.to_string(), entry);
    }

    /// The union of two records of the same tree. Per gate, the entry that
    /// finished later wins (ties go to the greater digest, then host, so the
    /// merge is the same whichever side runs it). Unknown top-level fields of
    /// `self` win over `other`'s.
    pub fn merge(&self, other: &Record) -> Record {
        let mut out = self.clone();
        for (name, theirs) in &other.gates {
            let keep_ours = out.gates.get(name).is_some_and(|ours| {
                (&ours.finished_at, &ours.digest, &ours.host)
                    >= (&theirs.finished_at, &theirs.digest, &theirs.host)
            });
            if !keep_ours {
                out.gates.insert(name.clone(), theirs.clone());
            }
        }
        for (k, v) in &other.extra {
            out.extra.entry(k.clone()).or_insert_with(|| v.clone());
        }
        out
    }

    /// The same record restricted to `names` (what a publish embeds).
    pub fn only(&self, names: &[String]) -> Record {
        let mut out = self.clone();
        out.gates.retain(|k, _| names.contains(k));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(digest: &str, at: &str, host: &str) -> Entry {
        Entry {
            digest: digest.into(),
            command: "make".into(),
            cwd: ".".into(),
            duration_ms: 12,
            host: host.into(),
            tool: "warmstart 0.1.0".into(),
            finished_at: at.into(),
            commit: "c0ffee".into(),
            extra: Map::new(),
        }
    }

    #[test]
    fn round_trips_and_keeps_unknown_fields() {
        let text = r#"{
  "format": "warmstart-gates/1",
  "tree": "t1",
  "gates": {
    "fmt": {
      "digest": "sha256:aa",
      "command": "cargo fmt",
      "cwd": ".",
      "duration_ms": 5,
      "host": "h",
      "tool": "warmstart 9.9.9",
      "finished_at": "2026-01-01T00:00:00Z",
      "commit": "c",
      "exit_signal_note": "future field"
    }
  },
  "signed_by": "future field"
}
"#;
        let r = Record::parse(text.as_bytes(), "t1").unwrap();
        assert_eq!(r.gates["fmt"].extra["exit_signal_note"], "future field");
        assert_eq!(String::from_utf8(r.to_bytes()).unwrap(), text);
    }

    #[test]
    fn refuses_what_it_cannot_trust() {
        let good = Record::new("t1").to_bytes();
        assert_eq!(
            Record::parse(&good, "t2"),
            Err(ParseError::Tree {
                expected: "t2".into(),
                found: "t1".into()
            })
        );
        assert!(matches!(
            Record::parse(br#"{"format":"warmstart-gates/2","x":1}"#, "t1"),
            Err(ParseError::Format(f)) if f == "warmstart-gates/2"
        ));
        assert!(matches!(
            Record::parse(b"{\"format\": \"warmstart-ga", "t1"),
            Err(ParseError::Json(_))
        ));
        assert!(matches!(
            Record::parse(br#"{"format":"warmstart-gates/1","tree":"t1"}"#, "t1"),
            Err(ParseError::Json(m)) if m.contains("gates")
        ));
    }

    #[test]
    fn state_compares_digests() {
        let mut r = Record::new("t");
        r.insert("fmt", entry("sha256:a", "2026-01-01T00:00:00Z", "h"));
        assert_eq!(r.state("fmt", "sha256:a"), State::Green);
        assert_eq!(r.state("fmt", "sha256:b"), State::Stale);
        assert_eq!(r.state("test", "sha256:a"), State::Missing);
    }

    #[test]
    fn merge_is_a_union_where_the_latest_entry_wins_from_either_side() {
        let mut a = Record::new("t");
        a.insert("fmt", entry("sha256:a", "2026-01-01T00:00:05Z", "alpha"));
        a.insert("test", entry("sha256:t", "2026-01-01T00:00:01Z", "alpha"));
        a.extra.insert("ours".into(), Value::from(1));
        let mut b = Record::new("t");
        b.insert("fmt", entry("sha256:a", "2026-01-01T00:00:03Z", "beta"));
        b.insert("test", entry("sha256:t", "2026-01-01T00:00:09Z", "beta"));
        b.insert("clippy", entry("sha256:c", "2026-01-01T00:00:00Z", "beta"));
        b.extra.insert("theirs".into(), Value::from(2));
        let m = a.merge(&b);
        assert_eq!(
            m.gates,
            b.merge(&a).gates,
            "merge must not depend on the side"
        );
        assert_eq!(m.gates.len(), 3);
        assert_eq!(m.gates["fmt"].host, "alpha");
        assert_eq!(m.gates["test"].host, "beta");
        assert_eq!(m.gates["clippy"].host, "beta");
        assert_eq!(m.extra["ours"], 1);
        assert_eq!(m.extra["theirs"], 2);
        // Merging what one already has changes nothing.
        assert_eq!(m.merge(&a), m);
        // Equal times: the tie-break is by digest, then host, not by side.
        let mut x = Record::new("t");
        x.insert("fmt", entry("sha256:a", "2026-01-01T00:00:00Z", "x"));
        let mut y = Record::new("t");
        y.insert("fmt", entry("sha256:a", "2026-01-01T00:00:00Z", "y"));
        assert_eq!(x.merge(&y).gates["fmt"].host, "y");
        assert_eq!(y.merge(&x).gates["fmt"].host, "y");
    }

    #[test]
    fn only_keeps_the_named_gates() {
        let mut r = Record::new("t");
        r.insert("fmt", entry("sha256:a", "2026-01-01T00:00:00Z", "h"));
        r.insert("test", entry("sha256:b", "2026-01-01T00:00:00Z", "h"));
        let o = r.only(&["test".into()]);
        assert_eq!(o.gates.keys().collect::<Vec<_>>(), ["test"]);
        assert_eq!(o.tree, "t");
    }
}
