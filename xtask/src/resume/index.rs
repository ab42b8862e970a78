//! The crash-resume index file format: parsing, the edits `record`, `touch`
//! and `prune` make, and serialising to the exact bytes of JavaScript's
//! `JSON.stringify(index, null, 2) + "\n"`.
//!
//! This module is pure: it never touches the file system or a lock (that is
//! `resume::store` and `resume::lock`). It keeps every field it does not know
//! (top level and inside entries) so that the JavaScript tool and newer
//! versions of either tool lose nothing when warmstart rewrites the file.
//! Values are `resume::json`'s, which hold what JavaScript holds (lone
//! surrogates included), so what the JavaScript tool wrote is written back
//! byte for byte.

use super::json::{self, Object, ParseError, Str, Value};

/// The only format version this code reads and writes.
pub const VERSION: u64 = 1;

/// Why bytes are not a usable index.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("is not valid JSON ({0})")]
    Json(#[from] ParseError),
    #[error("{0}")]
    Shape(String),
    #[error("has version {0}, this tool reads version 1 only")]
    Version(String),
}

/// A parsed index. Fields and key order are kept as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Index {
    root: Object,
}

impl Default for Index {
    fn default() -> Self {
        let mut root = Object::new();
        root.insert("version".into(), Value::Number(VERSION as f64));
        root.insert("entries".into(), Value::Object(Object::new()));
        Index { root }
    }
}

/// What `record` stores for one surface.
#[derive(Clone, Debug)]
pub struct Record<'a> {
    pub surface: &'a str,
    pub session: &'a str,
    pub repo: &'a str,
    pub role: Option<&'a str>,
    pub cwd: Option<&'a str>,
}

fn key(name: &str) -> Str {
    Str::from(name)
}

impl Index {
    /// Parses an index, refusing anything that is not a version-1 object
    /// with an `entries` object of objects.
    pub fn parse(bytes: &[u8]) -> Result<Index, FormatError> {
        let Value::Object(root) = json::parse(bytes)? else {
            return Err(FormatError::Shape("is not a JSON object".into()));
        };
        match root.get(&key("version")) {
            Some(Value::Number(n)) if *n == VERSION as f64 => {}
            Some(other) => {
                // Shown escaped: the value is the file's, and could hold
                // text that drives the terminal.
                let shown = Str::from(json::to_compact(other).as_str()).for_display();
                return Err(FormatError::Version(shown));
            }
            None => return Err(FormatError::Shape("has no \"version\" field".into())),
        }
        match root.get(&key("entries")) {
            Some(Value::Object(entries)) => {
                if let Some((key, _)) = entries.iter().find(|(_, v)| v.as_object().is_none()) {
                    return Err(FormatError::Shape(format!(
                        "has an entry {key:?} that is not a JSON object"
                    )));
                }
            }
            _ => {
                return Err(FormatError::Shape("has no \"entries\" object".into()));
            }
        }
        Ok(Index { root })
    }

    /// The file's bytes, exactly as `JSON.stringify(index, null, 2) + "\n"`.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = json::object_to_pretty(&self.root);
        out.push('\n');
        out.into_bytes()
    }

    pub fn entries(&self) -> &Object {
        self.root[&key("entries")]
            .as_object()
            .expect("checked by parse")
    }

    fn entries_mut(&mut self) -> &mut Object {
        self.root
            .get_mut(&key("entries"))
            .and_then(Value::as_object_mut)
            .expect("checked by parse")
    }

    pub fn get(&self, surface: &str) -> Option<&Object> {
        self.entries().get(&key(surface)).and_then(Value::as_object)
    }

    /// Records a session for a surface. A known surface keeps its
    /// `captured_at` and unknown fields; `cwd` is replaced when given, and
    /// dropped when the session changed (it belonged to the old session).
    pub fn record(&mut self, rec: &Record, now_ms: i64) {
        let entries = self.entries_mut();
        let mut entry = match entries.get(&key(rec.surface)) {
            Some(Value::Object(old)) => old.clone(),
            _ => Object::new(),
        };
        let same_session = entry
            .get(&key("sessionId"))
            .and_then(Value::as_str)
            .is_some_and(|s| *s == *rec.session);
        let captured = entry
            .get(&key("captured_at"))
            .filter(|v| v.as_f64().is_some())
            .cloned()
            .unwrap_or(Value::Number(now_ms as f64));
        let now = Value::Number(now_ms as f64);
        entry.insert(key("surfaceId"), rec.surface.into());
        entry.insert(key("sessionId"), rec.session.into());
        entry.insert(key("repo"), rec.repo.into());
        entry.insert(key("role"), rec.role.map_or(Value::Null, Value::from));
        entry.insert(key("captured_at"), captured);
        entry.insert(key("last_active"), now);
        match rec.cwd {
            Some(cwd) => {
                entry.insert(key("cwd"), cwd.into());
            }
            None if !same_session => {
                entry.shift_remove(&key("cwd"));
            }
            None => {}
        }
        entries.insert(key(rec.surface), Value::Object(entry));
    }

    /// Bumps `last_active` of a known surface; false when it is unknown.
    pub fn touch(&mut self, surface: &str, now_ms: i64) -> bool {
        match self.entries_mut().get_mut(&key(surface)) {
            Some(Value::Object(entry)) => {
                entry.insert(key("last_active"), Value::Number(now_ms as f64));
                true
            }
            _ => false,
        }
    }

    /// Removes the entries older than `max_age_ms`; returns their surfaces.
    pub fn prune(&mut self, max_age_ms: u64, now_ms: i64) -> Vec<Str> {
        let old: Vec<Str> = self
            .entries()
            .iter()
            .filter(|(_, e)| is_older(e.as_object().expect("checked"), max_age_ms, now_ms))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &old {
            self.entries_mut().shift_remove(key);
        }
        old
    }
}

/// The time an entry was last seen: `last_active`, else `captured_at`.
pub fn last_seen_ms(entry: &Object) -> Option<f64> {
    ["last_active", "captured_at"]
        .iter()
        .find_map(|k| entry.get(&key(k)).and_then(Value::as_f64))
}

/// True when an entry was last seen more than `max_age_ms` before `now_ms`.
/// An entry with no timestamp at all counts as old.
pub fn is_older(entry: &Object, max_age_ms: u64, now_ms: i64) -> bool {
    last_seen_ms(entry).is_none_or(|t| now_ms as f64 - t > max_age_ms as f64)
}

/// Serialises a value as `JSON.stringify(value, null, 2)` does.
pub fn to_js_string(value: &Value) -> String {
    json::to_pretty(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_refuses_what_is_not_a_version_1_index() {
        for bad in [
            &b""[..],
            b"{\"version\": 1, \"entries\": {",
            b"garbage",
            b"[]",
            b"{\"entries\": {}}",
            b"{\"version\": 1}",
            b"{\"version\": 1, \"entries\": {\"s\": 3}}",
        ] {
            assert!(
                Index::parse(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert!(matches!(
            Index::parse(br#"{"version": 2, "entries": {}}"#),
            Err(FormatError::Version(v)) if v == "2"
        ));
        assert!(Index::parse(br#"{"version": 1.0, "entries": {}}"#).is_ok());
    }

    #[test]
    fn empty_index_bytes() {
        assert_eq!(
            Index::default().to_bytes(),
            b"{\n  \"version\": 1,\n  \"entries\": {}\n}\n"
        );
    }

    fn rec<'a>(session: &'a str, cwd: Option<&'a str>) -> Record<'a> {
        Record {
            surface: "s1",
            session,
            repo: "warmstart",
            role: None,
            cwd,
        }
    }

    #[test]
    fn rerecord_keeps_captured_at_and_unknown_fields() {
        let mut idx = Index::parse(
            br#"{"version":1,"x":[1],"entries":{"s1":{"surfaceId":"s1","captured_at":5.5,"extra":"k"}}}"#,
        )
        .unwrap();
        idx.record(&rec("a", Some("/w")), 100);
        let e = idx.get("s1").unwrap();
        assert_eq!(e[&key("captured_at")], Value::Number(5.5));
        assert_eq!(e[&key("last_active")], Value::Number(100.0));
        assert_eq!(e[&key("extra")], Value::from("k"));
        assert_eq!(e[&key("role")], Value::Null);
        // Same session without --cwd keeps the cwd; a new session drops it.
        idx.record(&rec("a", None), 200);
        assert_eq!(idx.get("s1").unwrap()[&key("cwd")], Value::from("/w"));
        idx.record(&rec("b", None), 300);
        assert!(idx.get("s1").unwrap().get(&key("cwd")).is_none());
        assert_eq!(idx.root[&key("x")], Value::Array(vec![Value::Number(1.0)]));
    }

    #[test]
    fn touch_and_prune() {
        let mut idx = Index::default();
        idx.record(&rec("a", None), 1_000);
        assert!(!idx.touch("nope", 2_000));
        assert!(idx.touch("s1", 2_000));
        assert_eq!(
            idx.get("s1").unwrap()[&key("last_active")],
            Value::Number(2_000.0)
        );
        assert!(idx.prune(1_000, 3_000).is_empty());
        assert_eq!(idx.prune(999, 3_000), vec![key("s1")]);
        assert!(idx.entries().is_empty());
    }
}
