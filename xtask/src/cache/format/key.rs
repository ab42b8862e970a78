//! Cache keys from pin values: the value each file-reading pin takes from
//! its file's text, and the key string the values make.
//!
//! Pure: takes text the caller read (`cache::manifests` reads the files),
//! never reads a file, runs git or looks at the environment.

use anyhow::{Context, Result, anyhow};
use std::path::Path;

use crate::cache::format::{self, KeyPart};
use crate::exit::{Code, fail};

/// `x86_64-linux`, `aarch64-macos`, ...: the `platform` pin.
pub fn platform() -> String {
    format!("{}-{}", std::env::consts::ARCH, std::env::consts::OS)
}

/// A computed key and the values that built it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub value: String,
    pub parts: Vec<KeyPart>,
}

/// The key string for `name` and pin values (sanitised, joined with `-`).
pub fn key_from_parts(name: &str, parts: Vec<KeyPart>) -> Key {
    let mut value = sanitize(name);
    for p in &parts {
        value.push('-');
        value.push_str(&sanitize(&p.value));
    }
    debug_assert!(format::check_key(&value).is_ok());
    Key { value, parts }
}

fn sanitize(s: &str) -> String {
    let t: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if t.is_empty() || t.starts_with('.') {
        format!("_{t}")
    } else {
        t
    }
}

/// The versions a name carries: each run of dot-separated numbers with at
/// least one dot (`fstar-2025.10.06.tar.gz` carries 2025.10.06), as numbers,
/// so that `2025.10.6` and `2025.10.06` are one version.
pub fn versions_in(name: &str) -> Vec<Vec<u64>> {
    name.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .flat_map(|run| run.split(".."))
        .map(|run| run.trim_matches('.'))
        .filter_map(|run| {
            let nums: Option<Vec<u64>> = run.split('.').map(|n| n.parse().ok()).collect();
            nums.filter(|v| v.len() >= 2)
        })
        .collect()
}

/// Why a legacy archive may not be installed for a key: a version its name
/// carries that no pinned value carries and `[restore] legacy_versions` does
/// not map a pinned value to. `None` when every version is accounted for
/// (a name with none restores whatever the key, as a legacy branch always
/// did). `pinned` are the key's values; `map` is the manifest's field.
pub fn legacy_mismatch(
    archive: &str,
    pinned: &[&str],
    map: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    let mut allowed: Vec<Vec<u64>> = Vec::new();
    for p in pinned {
        allowed.extend(versions_in(p));
        if let Some(mapped) = map.get(*p) {
            allowed.extend(versions_in(mapped));
        }
    }
    let file = archive.rsplit('/').next().unwrap_or(archive);
    versions_in(file)
        .into_iter()
        .find(|v| !allowed.contains(v))
        .map(|v| v.iter().map(u64::to_string).collect::<Vec<_>>().join("."))
}

/// A `json` pin's value: the text of `file` read as JSON, at `pointer` (a
/// string as it is, anything else as JSON text).
pub fn json_pin(file: &Path, text: &str, pointer: &str) -> Result<String> {
    let v: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{} is not JSON", file.display()))?;
    let found = v
        .pointer(pointer)
        .ok_or_else(|| anyhow!("{} has nothing at {pointer}", file.display()))?;
    Ok(match found {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// A `regex` pin's value: the first capture group of `pattern`'s first
/// match in the text of `file` (empty when the group took no part).
pub fn regex_pin(file: &Path, text: &str, pattern: &regex_lite::Regex) -> Result<String> {
    let caps = pattern
        .captures(text)
        .ok_or_else(|| anyhow!("{} does not match /{}/", file.display(), pattern.as_str()))?;
    Ok(caps
        .get(1)
        .map(|m| m.as_str().to_string())
        .unwrap_or_default())
}

/// A `file` pin: the text of `file`, one line, without its newline. More
/// lines, or bytes outside printable ASCII, are refused, as the bootstrap
/// script refuses them (its `tr` works on bytes, not characters).
pub fn one_line(file: &Path, text: &str) -> Result<String> {
    let line = text.strip_suffix('\n').unwrap_or(text);
    // A bad pin file is configuration, as a bad manifest is (exit 10).
    if line.contains('\n') {
        return Err(fail(
            Code::Config,
            format!(
                "{} has more than one line: a `file` pin reads one line",
                file.display()
            ),
        ));
    }
    if !line.bytes().all(|b| (b' '..=b'~').contains(&b)) {
        return Err(fail(
            Code::Config,
            format!(
                "{} holds more than printable ASCII: a `file` pin reads a plain line",
                file.display()
            ),
        ));
    }
    Ok(line.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_legacy_archive_named_for_a_version_needs_that_version_pinned_or_mapped() {
        use std::collections::BTreeMap;
        assert_eq!(
            versions_in("checked-0123abc-fstar2025.10.06.tar.gz"),
            vec![vec![2025, 10, 6]]
        );
        assert_eq!(versions_in("cache.tar.gz"), Vec::<Vec<u64>>::new());
        assert_eq!(
            versions_in("z3-4.13.0..x-1.2"),
            vec![vec![4, 13, 0], vec![1, 2]]
        );
        let none = BTreeMap::new();
        let m = |a: &str, p: &[&str]| legacy_mismatch(a, p, &none);
        assert_eq!(
            m("fstar-2025.10.06.tar.gz", &["2025.12.01"]),
            Some("2025.10.6".into())
        );
        assert_eq!(m("fstar-2025.10.06.tar.gz", &["v2025.10.6"]), None);
        assert_eq!(
            m("fstar-2025.10.06.tar.gz", &["x", "fstar-2025.10.06"]),
            None
        );
        assert_eq!(m("cache.tar.gz", &["anything"]), None);
        assert_eq!(
            m("fstar-2025.10.06-z3-4.13.0.tgz", &["2025.10.06"]),
            Some("4.13.0".into())
        );
        let map = BTreeMap::from([("2025.12.01".to_string(), "2025.10.06".to_string())]);
        assert_eq!(
            legacy_mismatch("fstar-2025.10.06.tar.gz", &["2025.12.01"], &map),
            None
        );
        assert_eq!(
            legacy_mismatch("fstar-2025.09.01.tar.gz", &["2025.12.01"], &map),
            Some("2025.9.1".into())
        );
    }
}
