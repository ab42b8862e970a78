//! The `WARMSTART_*` environment variables: the one list of known names,
//! what each is for and what values it takes, and the startup check that
//! refuses a typo or a value that does not parse (exit 10).
//!
//! Every variable the binary or its tools read is listed in `KNOWN`; a tidy
//! test (`tests/it/strict.rs`) fails when a `WARMSTART_` name used in
//! `xtask/src`, `tools/` or `tests/` is missing here. Never read a
//! `WARMSTART_*` variable without listing it: an unknown one is an error.

use crate::clock;
use crate::exit::{Code, fail};
use crate::size;
use anyhow::Result;
use std::time::Duration;

/// What a variable's value must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `clock::parse_duration`: `90s`, `1h30m`, ...
    Duration,
    /// `size::parse_size`, more than zero: `512k`, `16G`, `1MiB`, ...
    Size,
    /// A whole number of milliseconds (test knobs named `*_MS`).
    Millis,
    /// Free text, checked where it is used (a name, a path, a remote).
    Text,
}

/// Every `WARMSTART_*` variable: name, kind, what it is for. Extend it when a
/// new one is read anywhere (README.md "Settings" lists the user-facing ones).
pub const KNOWN: &[(&str, Kind, &str)] = &[
    (
        "WARMSTART_BUILD_OUT",
        Kind::Text,
        "set by `cache build` for a manifest's `[build] command`: the empty staging directory it writes the artifact into (moved into `[pack] root` once it exits 0)",
    ),
    (
        "WARMSTART_LOCK_TIMEOUT",
        Kind::Duration,
        "how long `cache restore` waits for another restore of the same target (default 30m)",
    ),
    (
        "WARMSTART_FETCH_BLOB_LIMIT",
        Kind::Size,
        "blobs of this size or more are left out of branch fetches and fetched by id (default 1M)",
    ),
    (
        "WARMSTART_CONNECT_TIMEOUT",
        Kind::Duration,
        "deadline to connect to a remote (default 10s; `--connect-timeout` wins)",
    ),
    (
        "WARMSTART_STALL_TIMEOUT",
        Kind::Duration,
        "a transfer that moves no byte for this long is ended (default 30s; `--stall-timeout` wins)",
    ),
    (
        "WARMSTART_PUBLISH_LEASE_DEADLINE",
        Kind::Duration,
        "how long `cache publish` keeps retrying a push whose lease went stale",
    ),
    (
        "WARMSTART_PUSH_LIMIT",
        Kind::Size,
        "the most bytes of new blobs one push of `cache publish` sends; more go in batches through temporary refs (default 1.5GiB)",
    ),
    (
        "WARMSTART_SIGNING_KEY",
        Kind::Text,
        "the ssh private key `cache publish`, `cache resign` and `gates run --sign` sign with (`--signing-key` wins)",
    ),
    (
        "WARMSTART_REGISTRY_TOKEN",
        Kind::Text,
        "the token (or password) sent to a cache's OCI registry: a bearer token, or basic auth with WARMSTART_REGISTRY_USER (else docker's config.json)",
    ),
    (
        "WARMSTART_REGISTRY_USER",
        Kind::Text,
        "the user name sent with WARMSTART_REGISTRY_TOKEN as basic auth to a cache's OCI registry",
    ),
    (
        "WARMSTART_REGISTRY_MIRRORS",
        Kind::Text,
        "this machine's registry mirrors, asked for blobs before a cache's registry and its manifest's `mirrors`: `ORIGIN=MIRROR[,MIRROR...]` entries separated by spaces, e.g. `ghcr.io=mirror.internal:5000` (checked at startup; docs/mirrors.md)",
    ),
    (
        "WARMSTART_COMMAND",
        Kind::Text,
        "the command messages name (default: `cargo xtask` under `cargo run`, else the binary as it was run: its name when PATH finds it, else its path)",
    ),
    (
        "WARMSTART_BOOTSTRAP_REMOTE",
        Kind::Text,
        "tools/warmstart-bootstrap.sh: the remote to fetch the prebuilt binary from (default origin)",
    ),
    (
        "WARMSTART_BOOTSTRAP_FETCH_TIMEOUT",
        Kind::Text,
        "tools/warmstart-bootstrap.sh: seconds (as `timeout` reads them) to fetch the prebuilt binary (default 60)",
    ),
    (
        "WARMSTART_REMOTE",
        Kind::Text,
        "tools/ci-gates.sh: the remote gate records and caches are pushed to (default origin)",
    ),
    (
        "WARMSTART_BENCH_DEST",
        Kind::Text,
        "tools/bench-cache.py: the restore path its benchmark manifest expands",
    ),
    (
        "WARMSTART_RESUME_LOCK_WAIT_MS",
        Kind::Millis,
        "tests: how long `resume` waits for the index lock (default 4000)",
    ),
    (
        "WARMSTART_RESUME_LOCK_STALE_MS",
        Kind::Millis,
        "tests: age after which `resume` takes over an index lock (default 15000)",
    ),
    (
        "WARMSTART_GC_SIZE",
        Kind::Size,
        "a restore runs `cache gc` when the private stores pass this size; gc's budget (default 4G)",
    ),
    (
        "WARMSTART_GC_KEEP",
        Kind::Duration,
        "`cache gc` keeps chunks no installed key needs for this long after their last use (default 14d)",
    ),
    (
        "WARMSTART_TEST_GC_PAUSE_MS",
        Kind::Millis,
        "tests: pause of `cache gc` while it holds the store's use lock",
    ),
    (
        "WARMSTART_TEST_WRITE_DELAY_MS",
        Kind::Millis,
        "tests: pause in the middle of writing the resume index",
    ),
    (
        "WARMSTART_TEST_KILL_AT",
        Kind::Text,
        "tests: the kill point at which the process SIGKILLs itself",
    ),
    (
        "WARMSTART_TEST_FORCE_WALK",
        Kind::Text,
        "tests: take the containment walk even where a faster path exists",
    ),
    (
        "WARMSTART_TEST_CONCURRENT_ROUNDS",
        Kind::Text,
        "tests: rounds of the concurrent-publish test, each way (tools/test.sh sets 2)",
    ),
    (
        "WARMSTART_TEST_WHEEL",
        Kind::Text,
        "tests: the built wheel (tools/build-wheel.sh) that tools/test.sh hands to the tests",
    ),
    (
        "WARMSTART_COMPAT_BIN",
        Kind::Text,
        "tests: the released warmstart (tools/compat-bin.sh) that tools/test.sh hands to the compatibility tests",
    ),
    (
        "WARMSTART_CONTAINMENT_SEQUENCES",
        Kind::Text,
        "tests: hostile archive sequences per resolver in the containment property test",
    ),
    (
        "WARMSTART_CONTAINMENT_SEED",
        Kind::Text,
        "tests: the seed of the containment property test",
    ),
];

/// Refuses an unknown `WARMSTART_*` variable (naming the nearest known one)
/// and a known one whose value does not parse. `lib::run` calls it once,
/// before any command, so no command ever runs on a silent default.
pub fn check_env() -> Result<()> {
    let mut names: Vec<String> = std::env::vars_os()
        .filter_map(|(k, _)| k.into_string().ok())
        .filter(|k| k.starts_with("WARMSTART_"))
        .collect();
    names.sort();
    for name in names {
        let Some(&(_, kind, _)) = KNOWN.iter().find(|(n, _, _)| *n == name) else {
            return Err(fail(
                Code::Config,
                format!(
                    "unknown environment variable {name}: {}; WARMSTART_* names are reserved for warmstart (docs/reference/environment.md lists them), so unset it or rename it",
                    nearest(&name).map_or("no known variable is close".into(), |n| format!(
                        "did you mean {n}?"
                    ))
                ),
            ));
        };
        let value = std::env::var(&name).map_err(|_| {
            fail(
                Code::Config,
                format!("{name} is not valid UTF-8: set it to {}", forms(kind)),
            )
        })?;
        parse(&name, kind, &value)?;
    }
    Ok(())
}

/// The known variable closest to `name` by edit distance, if it is close
/// enough to be a typo of it.
pub fn nearest(name: &str) -> Option<&'static str> {
    KNOWN
        .iter()
        .map(|(n, _, _)| (edit_distance(name, n), *n))
        .min()
        .filter(|(d, _)| *d <= 3.max(name.len() / 4))
        .map(|(_, n)| n)
}

/// Levenshtein distance by characters: the one measure of "did you mean".
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (prev + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            prev = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

fn forms(kind: Kind) -> String {
    match kind {
        Kind::Duration => clock::DURATION_FORMS.to_string(),
        Kind::Size => format!("{}, more than zero", size::SIZE_FORMS),
        Kind::Millis => "a whole number of milliseconds, e.g. 300".to_string(),
        Kind::Text => "text".to_string(),
    }
}

/// A parsed value.
enum Value {
    Duration(Duration),
    Bytes(u64),
    Millis(u64),
    Text,
}

fn parse(name: &str, kind: Kind, value: &str) -> Result<Value> {
    let what = match kind {
        Kind::Duration => "a duration",
        Kind::Size => "a size",
        Kind::Millis => "a number of milliseconds",
        Kind::Text => return Ok(Value::Text),
    };
    let parsed = match kind {
        Kind::Duration => clock::parse_duration(value).ok().map(Value::Duration),
        Kind::Size => size::parse_size(value)
            .ok()
            .filter(|n| *n > 0)
            .map(Value::Bytes),
        Kind::Millis => value.parse().ok().map(Value::Millis),
        Kind::Text => None,
    };
    parsed.ok_or_else(|| {
        fail(
            Code::Config,
            format!(
                "{name}={value:?} is not {what}: use {}, or unset it",
                forms(kind)
            ),
        )
    })
}

fn lookup(name: &str, kind: Kind) -> Result<Option<Value>> {
    debug_assert!(
        KNOWN.iter().any(|(n, k, _)| *n == name && *k == kind),
        "{name} is not in settings::KNOWN as {kind:?}"
    );
    match std::env::var(name) {
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => Err(fail(
            Code::Config,
            format!("{name} is not valid UTF-8: set it to {}", forms(kind)),
        )),
        Ok(v) => parse(name, kind, &v).map(Some),
    }
}

/// A `Kind::Duration` variable: `None` when unset, an error (exit 10) when
/// it does not parse.
pub fn duration(name: &str) -> Result<Option<Duration>> {
    Ok(match lookup(name, Kind::Duration)? {
        Some(Value::Duration(d)) => Some(d),
        _ => None,
    })
}

/// A `Kind::Size` variable in bytes (more than zero).
pub fn size(name: &str) -> Result<Option<u64>> {
    Ok(match lookup(name, Kind::Size)? {
        Some(Value::Bytes(n)) => Some(n),
        _ => None,
    })
}

/// A `Kind::Millis` variable.
pub fn millis(name: &str) -> Result<Option<Duration>> {
    Ok(match lookup(name, Kind::Millis)? {
        Some(Value::Millis(ms)) => Some(Duration::from_millis(ms)),
        _ => None,
    })
}

/// One line for a TOML error in a manifest: toml's own Display draws the
/// source over several lines. It names the line and quotes it, so that a
/// value refused by its type (`lease_deadline = true`) names its field too.
pub fn toml_error_line(text: &str, e: &toml::de::Error) -> String {
    let at = e.span().map(|s| {
        let n = text[..s.start].matches('\n').count();
        let src = text.lines().nth(n).unwrap_or("").trim();
        format!("line {} (`{src}`): ", n + 1)
    });
    format!(
        "{}{}",
        at.unwrap_or_default(),
        e.message()
            .trim()
            .split('\n')
            .map(str::trim)
            .collect::<Vec<_>>()
            .join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_find_their_variable() {
        // Built at run time, so the tidy check of names used does not see typos.
        let typo = |rest: &str| format!("WARMSTART_{rest}");
        assert_eq!(
            nearest(&typo("LOCK_TIMOUT")),
            Some("WARMSTART_LOCK_TIMEOUT")
        );
        assert_eq!(
            nearest(&typo("FETCH_BLOB_LIMT")),
            Some("WARMSTART_FETCH_BLOB_LIMIT")
        );
        assert_eq!(nearest(&typo("SOMETHING_ELSE_ENTIRELY")), None);
    }

    #[test]
    fn known_names_are_unique_and_well_formed() {
        for (i, (name, _, what)) in KNOWN.iter().enumerate() {
            assert!(name.starts_with("WARMSTART_"), "{name}");
            assert!(
                name[10..]
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_'),
                "{name}"
            );
            assert!(!what.is_empty(), "{name} says what it is for");
            assert!(KNOWN[..i].iter().all(|(n, _, _)| n != name), "{name} twice");
        }
    }

    #[test]
    fn values_are_parsed_by_kind() {
        assert!(parse("X", Kind::Duration, "garbage").is_err());
        assert!(parse("X", Kind::Duration, "1h30m").is_ok());
        assert!(parse("X", Kind::Size, "0").is_err());
        assert!(parse("X", Kind::Size, "16G").is_ok());
        assert!(parse("X", Kind::Millis, "1.5").is_err());
        assert!(parse("X", Kind::Millis, "300").is_ok());
        let err = parse("WARMSTART_LOCK_TIMEOUT", Kind::Duration, "garbage")
            .err()
            .unwrap();
        let msg = format!("{err:#}");
        assert!(msg.contains("WARMSTART_LOCK_TIMEOUT=\"garbage\""), "{msg}");
        assert!(msg.contains("1h30m"), "{msg}");
        assert_eq!(crate::exit::code_of(&err), Code::Config);
    }
}
