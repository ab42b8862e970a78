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
