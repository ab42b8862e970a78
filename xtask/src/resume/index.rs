//! The crash-resume index file format: parsing, the edits `record`, `touch`
//! and `prune` make, and serialising to the exact bytes of JavaScript's
//! `JSON.stringify(index, null, 2) + "\n"`.
//!
//! This module is pure: it never touches the file system or a lock (that is
//! `resume::store` and `resume::lock`). It keeps every field it does not know
//! (top level and inside entries) so that the JavaScript tool and newer
//! versions of either tool lose nothing when warmstart rewrites the file.

use serde_json::{Map, Number, Value};
use std::fmt::Write as _;

/// The only format version this code reads and writes.
pub const VERSION: u64 = 1;

/// Why bytes are not a usable index.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("is not valid JSON ({0})")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Shape(String),
    #[error("has version {0}, this tool reads version 1 only")]
    Version(String),
}

/// A parsed index. Fields and key order are kept as read.
#[derive(Clone, Debug, PartialEq)]
pub struct Index {
    root: Map<String, Value>,
}

impl Default for Index {
    fn default() -> Self {
        let mut root = Map::new();
        root.insert("version".into(), Value::from(VERSION));
        root.insert("entries".into(), Value::Object(Map::new()));
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

impl Index {
    /// Parses an index, refusing anything that is not a version-1 object
    /// with an `entries` object of objects.
    pub fn parse(bytes: &[u8]) -> Result<Index, FormatError> {
        let value: Value = serde_json::from_slice(bytes)?;
        let Value::Object(root) = value else {
            return Err(FormatError::Shape("is not a JSON object".into()));
        };
        match root.get("version") {
            Some(Value::Number(n)) if n.as_f64() == Some(VERSION as f64) => {}
            Some(other) => return Err(FormatError::Version(other.to_string())),
            None => return Err(FormatError::Shape("has no \"version\" field".into())),
        }
        match root.get("entries") {
            Some(Value::Object(entries)) => {
                if let Some((key, _)) = entries.iter().find(|(_, v)| !v.is_object()) {
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
        let mut out = String::with_capacity(256);
        write_map(&mut out, &self.root, 0);
        out.push('\n');
        out.into_bytes()
    }

    pub fn entries(&self) -> &Map<String, Value> {
        self.root["entries"].as_object().expect("checked by parse")
    }

    fn entries_mut(&mut self) -> &mut Map<String, Value> {
        self.root
            .get_mut("entries")
            .and_then(Value::as_object_mut)
            .expect("checked by parse")
    }

    pub fn get(&self, surface: &str) -> Option<&Map<String, Value>> {
        self.entries().get(surface).and_then(Value::as_object)
    }

    /// Records a session for a surface. A known surface keeps its
    /// `captured_at` and unknown fields; `cwd` is replaced when given, and
    /// dropped when the session changed (it belonged to the old session).
    pub fn record(&mut self, rec: &Record, now_ms: i64) {
        let entries = self.entries_mut();
        let mut entry = match entries.get(rec.surface) {
            Some(Value::Object(old)) => old.clone(),
            _ => Map::new(),
        };
        let same_session = entry.get("sessionId").and_then(Value::as_str) == Some(rec.session);
        let captured = entry
            .get("captured_at")
            .filter(|v| v.is_number())
            .cloned()
            .unwrap_or_else(|| Value::from(now_ms));
        entry.insert("surfaceId".into(), rec.surface.into());
        entry.insert("sessionId".into(), rec.session.into());
        entry.insert("repo".into(), rec.repo.into());
        entry.insert("role".into(), rec.role.map_or(Value::Null, Value::from));
        entry.insert("captured_at".into(), captured);
        entry.insert("last_active".into(), Value::from(now_ms));
        match rec.cwd {
            Some(cwd) => {
                entry.insert("cwd".into(), cwd.into());
            }
            None if !same_session => {
                entry.shift_remove("cwd");
            }
            None => {}
        }
        entries.insert(rec.surface.into(), Value::Object(entry));
    }

    /// Bumps `last_active` of a known surface; false when it is unknown.
    pub fn touch(&mut self, surface: &str, now_ms: i64) -> bool {
        match self.entries_mut().get_mut(surface) {
            Some(Value::Object(entry)) => {
                entry.insert("last_active".into(), Value::from(now_ms));
                true
            }
            _ => false,
        }
    }

    /// Removes the entries older than `max_age_ms`; returns their surfaces.
    pub fn prune(&mut self, max_age_ms: u64, now_ms: i64) -> Vec<String> {
        let old: Vec<String> = self
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
pub fn last_seen_ms(entry: &Map<String, Value>) -> Option<f64> {
    ["last_active", "captured_at"]
        .iter()
        .find_map(|k| entry.get(*k).and_then(Value::as_f64))
}

/// True when an entry was last seen more than `max_age_ms` before `now_ms`.
/// An entry with no timestamp at all counts as old.
pub fn is_older(entry: &Map<String, Value>, max_age_ms: u64, now_ms: i64) -> bool {
    last_seen_ms(entry).is_none_or(|t| now_ms as f64 - t > max_age_ms as f64)
}

/// Serialises a value as `JSON.stringify(value, null, 2)` does.
pub fn to_js_string(value: &Value) -> String {
    let mut out = String::new();
    write_js(&mut out, value, 0);
    out
}

fn indent(out: &mut String, depth: usize) {
    out.push('\n');
    for _ in 0..depth {
        out.push_str("  ");
    }
}

fn write_js(out: &mut String, value: &Value, depth: usize) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&js_number(n)),
        // serde_json escapes exactly the set JSON.stringify escapes (", \,
        // control characters, with \b \f \n \r \t short forms and lowercase
        // \u00xx) and writes everything else, non-ASCII included, verbatim.
        Value::String(s) => out.push_str(&serde_json::to_string(s).expect("a string serialises")),
        Value::Array(items) if items.is_empty() => out.push_str("[]"),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                indent(out, depth + 1);
                write_js(out, item, depth + 1);
            }
            indent(out, depth);
            out.push(']');
        }
        Value::Object(map) => write_map(out, map, depth),
    }
}

fn write_map(out: &mut String, map: &Map<String, Value>, depth: usize) {
    if map.is_empty() {
        out.push_str("{}");
        return;
    }
    out.push('{');
    for (i, (key, item)) in js_key_order(map).into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        indent(out, depth + 1);
        out.push_str(&serde_json::to_string(key).expect("a string serialises"));
        out.push_str(": ");
        write_js(out, item, depth + 1);
    }
    indent(out, depth);
    out.push('}');
}

/// JavaScript enumerates an object's array-index keys ("0" to "4294967294",
/// no leading zeros) first, in ascending numeric order, then the other keys
/// in insertion order. JSON.stringify follows that order.
fn js_key_order(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let index_of = |k: &str| -> Option<u32> {
        let canonical = k == "0" || (!k.starts_with('0') && k.bytes().all(|b| b.is_ascii_digit()));
        if !canonical || k.is_empty() {
            return None;
        }
        k.parse::<u32>().ok().filter(|&n| n != u32::MAX)
    };
    let mut indexed: Vec<_> = map
        .iter()
        .filter_map(|(k, v)| index_of(k).map(|n| (n, k, v)))
        .collect();
    indexed.sort_by_key(|(n, _, _)| *n);
    indexed
        .into_iter()
        .map(|(_, k, v)| (k, v))
        .chain(map.iter().filter(|(k, _)| index_of(k).is_none()))
        .collect()
}

/// A number as JavaScript prints it (Number::toString): every JSON number is
/// a double there, so integers print without a fraction, large or tiny
/// magnitudes use `e+NN` / `e-NN`, and -0 prints as 0.
fn js_number(n: &Number) -> String {
    if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() < 1 << 53) {
        return i.to_string();
    }
    let x = n.as_f64().unwrap_or(f64::NAN);
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    // Rust's `{:e}` gives the shortest digits that round-trip, like JS.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').expect("{:e} has an exponent");
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i64;
    let n = exp.parse::<i64>().expect("{:e} exponent is an integer") + 1;
    let mut out = String::new();
    if x < 0.0 {
        out.push('-');
    }
    if k <= n && n <= 21 {
        out.push_str(&digits);
        out.extend(std::iter::repeat_n('0', (n - k) as usize));
    } else if 0 < n && n <= 21 {
        out.push_str(&digits[..n as usize]);
        out.push('.');
        out.push_str(&digits[n as usize..]);
    } else if -6 < n && n <= 0 {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-n) as usize));
        out.push_str(&digits);
    } else {
        out.push_str(&digits[..1]);
        if k > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let e = n - 1;
        let _ = write!(out, "e{}{}", if e >= 0 { "+" } else { "-" }, e.abs());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(text: &str) -> String {
        let v: Value = serde_json::from_str(text).unwrap();
        to_js_string(&v)
    }

    #[test]
    fn numbers_print_as_javascript_does() {
        for (json, js) in [
            ("0", "0"),
            ("-0", "0"),
            ("-0.0", "0"),
            ("1.0", "1"),
            ("1E2", "100"),
            ("1.5", "1.5"),
            ("0.1", "0.1"),
            ("1732934400123.456", "1732934400123.456"),
            ("1e21", "1e+21"),
            ("1.5e300", "1.5e+300"),
            ("123456789012345680000", "123456789012345680000"),
            ("9007199254740993", "9007199254740992"),
            ("12345678901234567890", "12345678901234567000"),
            ("0.000001", "0.000001"),
            ("1e-7", "1e-7"),
            ("-2.5e-10", "-2.5e-10"),
            ("-42", "-42"),
        ] {
            assert_eq!(num(json), js, "JSON {json}");
        }
    }

    #[test]
    fn pretty_layout_and_key_order_match_json_stringify() {
        let v: Value = serde_json::from_str(
            r#"{"b":[],"10":{},"2":[1,{"x":null}],"01":true,"a":"é\u0001\"\\"}"#,
        )
        .unwrap();
        assert_eq!(
            to_js_string(&v),
            "{\n  \"2\": [\n    1,\n    {\n      \"x\": null\n    }\n  ],\n  \"10\": {},\n  \
             \"b\": [],\n  \"01\": true,\n  \"a\": \"é\\u0001\\\"\\\\\"\n}"
        );
    }

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
        assert_eq!(e["captured_at"], serde_json::json!(5.5));
        assert_eq!(e["last_active"], serde_json::json!(100));
        assert_eq!(e["extra"], "k");
        assert_eq!(e["role"], Value::Null);
        // Same session without --cwd keeps the cwd; a new session drops it.
        idx.record(&rec("a", None), 200);
        assert_eq!(idx.get("s1").unwrap()["cwd"], "/w");
        idx.record(&rec("b", None), 300);
        assert!(idx.get("s1").unwrap().get("cwd").is_none());
        assert_eq!(idx.root["x"], serde_json::json!([1]));
    }

    #[test]
    fn touch_and_prune() {
        let mut idx = Index::default();
        idx.record(&rec("a", None), 1_000);
        assert!(!idx.touch("nope", 2_000));
        assert!(idx.touch("s1", 2_000));
        assert_eq!(
            idx.get("s1").unwrap()["last_active"],
            serde_json::json!(2_000)
        );
        assert!(idx.prune(1_000, 3_000).is_empty());
        assert_eq!(idx.prune(999, 3_000), vec!["s1".to_string()]);
        assert!(idx.entries().is_empty());
    }
}
