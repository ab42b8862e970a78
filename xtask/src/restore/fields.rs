//! The checks restore.toml's step kinds share for their field values:
//! durations and timeouts, paths inside the repository, retry counts, and a
//! field's own type error.
//!
//! Pure: they read the value they are given and nothing else.

use anyhow::{Result, anyhow, bail};
use std::path::Path;
use std::time::Duration;

use crate::clock::DurationSpec;

/// A value as a message shows it: numbers and strings as written, else its type.
pub fn shown(v: &toml::Value) -> String {
    match v {
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::String(s) => format!("{s:?}"),
        v => format!("a {}", v.type_str()),
    }
}

pub fn one_line(s: &str) -> String {
    s.trim()
        .split('\n')
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

pub fn dur(raw: &Option<DurationSpec>, field: &str, default: Duration) -> Result<Duration> {
    raw.as_ref()
        .map(|r| r.resolve(field))
        .transpose()
        .map(|d| d.unwrap_or(default))
}

/// A timeout: like `dur`, but zero is refused (it would end the step
/// before it starts, which nobody means).
pub fn timeout(raw: &Option<DurationSpec>, field: &str, default: Duration) -> Result<Duration> {
    raw.as_ref()
        .map(|r| r.resolve_positive(field))
        .transpose()
        .map(|d| d.unwrap_or(default))
}

/// A path inside the repository, written relative to its root.
pub fn repo_relative(field: &str, raw: &str) -> Result<String> {
    let p = Path::new(raw);
    if raw.is_empty()
        || p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        bail!("`{field}` = {raw:?} must be a path inside the repository, relative to its root");
    }
    Ok(raw.trim_end_matches('/').to_string())
}

/// `retries` and `backoff`, the same for every step kind that has them: a
/// whole number from 0 to 10 (a negative or fractional count is refused,
/// not rounded), and a duration (zero allowed: retry at once).
pub fn retry_policy(
    retries: Option<&toml::Value>,
    backoff: Option<toml::Value>,
    default_retries: u32,
) -> Result<crate::restore::retry::Policy> {
    let retries = match retries {
        None => default_retries,
        Some(toml::Value::Integer(n)) if (0..=10).contains(n) => *n as u32,
        Some(toml::Value::Integer(n)) if *n > 10 => {
            bail!("`retries` = {n} is too many (at most 10)")
        }
        Some(v) => {
            let shown = match v {
                toml::Value::Integer(n) => n.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::String(s) => format!("{s:?}"),
                other => format!("a {}", other.type_str()),
            };
            bail!(
                "`retries` = {shown} is not a number of retries: write a whole number from 0 to 10"
            )
        }
    };
    Ok(crate::restore::retry::Policy {
        retries,
        backoff: dur(
            &field::<DurationSpec>(backoff, "backoff")?,
            "backoff",
            Duration::from_secs(1),
        )?,
    })
}

/// Deserializes one field taken as a raw value, so that a value of the
/// wrong type is an error naming the field (serde's own error for a whole
/// step says "invalid type" without saying where).
pub fn field<T: serde::de::DeserializeOwned>(
    v: Option<toml::Value>,
    name: &str,
) -> Result<Option<T>> {
    v.map(|v| {
        v.try_into::<T>()
            .map_err(|e| anyhow!("`{name}`: {}", one_line(e.message())))
    })
    .transpose()
}
