//! The contract with scripts: `--json` prints exactly one JSON document on
//! stdout, success or failure, and `--quiet` silences everything but errors.
//!
//! Parsing the command line records which command runs and whether `--json`
//! and `--quiet` were given (`begin`); from then on a command prints its
//! result through `document` (or `finish`), and the top-level error handler
//! in `lib.rs` prints the failure envelope through `failure`. No command
//! prints a JSON document of its own, so the envelope fields (`schema`,
//! `command`, `ok`, and on failure `error` and `code`) are the same
//! everywhere, and a failure never prints two documents or none. docs/reference/json.md
//! is the schema. The one exception is `resume lookup`, whose output the
//! JavaScript tool fixes (the entry or `null`, as it prints; docs/resume.md).

use serde::Serialize;
use serde_json::{Map, Value};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// The version of the `--json` shapes. Adding a field keeps it; renaming or
/// removing one, or changing its type, bumps it (README.md "JSON output").
pub const SCHEMA: u64 = 1;

static COMMAND: Mutex<String> = Mutex::new(String::new());
static JSON: AtomicBool = AtomicBool::new(false);
static PRINTED: AtomicBool = AtomicBool::new(false);
/// Fields a failing command adds to its failure envelope (`fail_with`).
static DETAILS: Mutex<Option<Map<String, Value>>> = Mutex::new(None);

/// Records what the command line asked for: the command as the user names
/// it (`cache restore`, `restore status`), `--json` and `--quiet`.
pub fn begin(command: &str, json: bool, quiet: bool) {
    *COMMAND.lock().unwrap_or_else(|e| e.into_inner()) = command.to_string();
    JSON.store(json, Ordering::Relaxed);
    crate::out::set_quiet(quiet);
    PRINTED.store(false, Ordering::Relaxed);
    *DETAILS.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The command path, flag `--json` and flag `--quiet` of parsed arguments:
/// the names of the nested subcommands, and the flags of the innermost one
/// (where clap puts a `global` flag too).
pub fn from_matches(m: &clap::ArgMatches) -> (String, bool, bool) {
    let mut words = Vec::new();
    let mut m = m;
    while let Some((name, sub)) = m.subcommand() {
        words.push(name.to_string());
        m = sub;
    }
    let flag = |id: &str| matches!(m.try_get_one::<bool>(id), Ok(Some(true)));
    (words.join(" "), flag("json"), flag("quiet"))
}

/// The running command, as `begin` recorded it (`cache restore`).
pub fn command() -> String {
    COMMAND.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Whether `--json` was given.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// The envelope fields that open every document, success or failure.
fn header(ok: bool) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("schema".into(), SCHEMA.into());
    m.insert("command".into(), command().into());
    m.insert("ok".into(), ok.into());
    m
}

/// `value`'s fields after `head`: `value` must serialize to an object.
/// The envelope's own fields win, so a body can never contradict them.
fn merged(mut head: Map<String, Value>, value: Value) -> Value {
    match value {
        Value::Object(body) => {
            for (k, v) in body {
                head.entry(k).or_insert(v);
            }
        }
        other => panic!("a --json body must be an object, not {other}"),
    }
    Value::Object(head)
}

fn print(doc: &Value) {
    PRINTED.store(true, Ordering::Relaxed);
    let text = serde_json::to_string_pretty(doc).expect("JSON values serialize");
    // The last line of defence for secrets, as on stderr (`crate::redact`).
    println!("{}", crate::redact::text(&text));
}

/// Prints the success document of the running command: the envelope
/// (`schema`, `command`, `ok: true`) and `value`'s fields.
pub fn document(value: impl Serialize) {
    let value = serde_json::to_value(value).expect("a --json body serializes");
    print(&merged(header(true), value));
}

/// Marks that a command printed its document by other means (the resume
/// index's own JSON writer, which keeps lone surrogates), with the same
/// envelope fields first.
pub fn printed_elsewhere() {
    PRINTED.store(true, Ordering::Relaxed);
}

/// Adds `value`'s fields to the failure envelope, if the command then fails
/// (e.g. the report of the keys `cache verify` checked before one failed).
pub fn fail_with(value: impl Serialize) {
    if let Value::Object(m) = serde_json::to_value(value).expect("a --json body serializes") {
        let mut d = DETAILS.lock().unwrap_or_else(|e| e.into_inner());
        d.get_or_insert_with(Map::new).extend(m);
    }
}

/// The end of a command that has a report either way: with `--json`, the
/// report is the success document, or is added to the failure envelope.
pub fn finish(value: impl Serialize, result: anyhow::Result<()>) -> anyhow::Result<()> {
    if json() {
        match &result {
            Ok(()) => document(value),
            Err(_) => fail_with(value),
        }
    }
    result
}

/// The failure envelope for `err` (exit `code`), printed by the top-level
/// error handler when `--json` was given and nothing was printed yet.
pub fn failure(err: &anyhow::Error, code: i32) {
    if !json() || PRINTED.load(Ordering::Relaxed) {
        return;
    }
    let mut head = header(false);
    head.insert(
        "error".into(),
        crate::redact::text(&format!("{err:#}")).into(),
    );
    head.insert("code".into(), code.into());
    let details = DETAILS.lock().unwrap_or_else(|e| e.into_inner()).take();
    print(&merged(head, Value::Object(details.unwrap_or_default())));
}

/// The failure envelope of a command line that did not parse (exit 2),
/// when its words ask for `--json`: the command is the longest run of
/// leading words that name a subcommand.
pub fn usage_failure(cmd: &clap::Command, args: &[String], message: &str) {
    if !args.iter().skip(1).any(|a| a == "--json") {
        return;
    }
    let mut words = Vec::new();
    let mut at = cmd;
    for a in args.iter().skip(1) {
        match at.find_subcommand(a) {
            Some(sub) => {
                words.push(a.clone());
                at = sub;
            }
            None => break,
        }
    }
    begin(&words.join(" "), true, false);
    failure(
        &anyhow::anyhow!("{message}"),
        crate::exit::Code::Usage.as_i32(),
    );
}

/// A remote in every `--json` document: `{name, url}`, the URL without
/// credentials (`crate::redact`); for a remote given as a URL, `name` is
/// that URL too (redacted).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Remote {
    pub name: String,
    pub url: String,
}

impl Remote {
    pub fn of(r: &crate::git::Remote) -> Remote {
        Remote {
            name: r.shown_name(),
            url: r.shown_url(),
        }
    }

    /// From a remote as `cache::fetch::git::Remote`'s `Display` wrote it (and as a
    /// stamp records it): `name (url)`, or the URL alone.
    pub fn from_shown(shown: &str) -> Remote {
        let (name, url) = match shown.strip_suffix(')').and_then(|s| s.split_once(" (")) {
            Some((name, url)) => (name, url),
            None => (shown, shown),
        };
        Remote {
            name: crate::redact::url(name),
            url: crate::redact::url(url),
        }
    }
}

/// `serialize_with` for a field holding a remote as people read it.
pub fn shown_remote<S: serde::Serializer>(shown: &str, s: S) -> Result<S::Ok, S::Error> {
    Remote::from_shown(shown).serialize(s)
}

/// `serialize_with` for a time kept in microseconds: whole milliseconds,
/// the contract's one unit for times.
pub fn micros_as_ms<S: serde::Serializer>(us: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u64(us / 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_fields_come_first_and_win() {
        let v = merged(header(true), serde_json::json!({"ok": false, "name": "x"}));
        let keys: Vec<_> = v.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, ["schema", "command", "ok", "name"]);
        assert_eq!(v["ok"], true);
    }

    #[test]
    #[should_panic(expected = "must be an object")]
    fn an_array_body_is_refused() {
        merged(header(true), serde_json::json!([1]));
    }

    #[test]
    fn a_shown_remote_splits_into_name_and_url() {
        let r = Remote::from_shown("origin (https://u:p@example.test/x.git)");
        assert_eq!(r.name, "origin");
        assert_eq!(r.url, "https://example.test/x.git");
        let r = Remote::from_shown("/srv/origin.git");
        assert_eq!(
            (r.name.as_str(), r.url.as_str()),
            ("/srv/origin.git", "/srv/origin.git")
        );
    }
}
