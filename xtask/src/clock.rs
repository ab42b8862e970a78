//! Time helpers: epoch milliseconds, RFC 3339 UTC timestamps, and the
//! duration syntax every manifest and flag shares (`500ms`, `90s`, `30m`).
//!
//! Small enough to own rather than pull in a date crate; never used for
//! measuring durations (that is `Instant`).

use serde::Deserialize;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Nanoseconds since the Unix epoch, now (the unit of file timestamps).
pub fn now_ns() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// `2026-11-30T02:26:20Z` for an epoch-milliseconds instant (second precision).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parses `500ms`, `90s`, `1.5s`, `30m`, `2h` or a bare number of seconds
/// (zero allowed, e.g. an interval of `0s` meaning "every time").
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let scale = match unit.trim() {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => f64::NAN,
    };
    match num.parse::<f64>() {
        Ok(n) if scale.is_finite() && n.is_finite() && n >= 0.0 => {
            Ok(Duration::from_secs_f64(n * scale))
        }
        _ => Err(format!(
            "`{text}` is not a duration: use e.g. `500ms`, `90s`, `30m` or `2h`"
        )),
    }
}

/// Like `parse_duration`, but zero is refused (timeouts, grace periods).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("`{text}` must be more than zero")),
        d => Ok(d),
    }
}

/// A duration as written in a TOML manifest: `"5s"`, or a bare number of seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum DurationSpec {
    Seconds(u64),
    Text(String),
}

impl DurationSpec {
    /// The duration (zero allowed), or an error naming `field`.
    pub fn resolve(&self, field: &str) -> anyhow::Result<Duration> {
        match self {
            DurationSpec::Seconds(s) => Ok(Duration::from_secs(*s)),
            DurationSpec::Text(t) => parse_duration(t).map_err(|e| anyhow::anyhow!("{field}: {e}")),
        }
    }

    /// The duration, refusing zero, or an error naming `field`.
    pub fn resolve_positive(&self, field: &str) -> anyhow::Result<Duration> {
        match self.resolve(field)? {
            d if d.is_zero() => Err(anyhow::anyhow!("{field}: must be more than zero")),
            d => Ok(d),
        }
    }
}

/// Howard Hinnant's days-to-civil algorithm (proleptic Gregorian calendar).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_durations() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        for bad in ["", "-1s", "5x", "1d", "s", "1.5.2s", "inf"] {
            assert!(parse_duration(bad).is_err(), "{bad} parsed");
        }
        assert!(parse_positive_duration("0").is_err());
        assert_eq!(
            DurationSpec::Seconds(3).resolve("t").unwrap(),
            Duration::from_secs(3)
        );
        assert!(DurationSpec::Seconds(0).resolve_positive("t").is_err());
    }

    #[test]
    fn formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        // `date -u -d @1796005580` = Mon Nov 30 02:26:20 UTC 2026
        assert_eq!(rfc3339(1_796_005_580_123), "2026-11-30T02:26:20Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_709_251_199_000), "2024-02-29T23:59:59Z");
        assert_eq!(rfc3339(4_102_444_800_000), "2100-01-01T00:00:00Z");
    }
}
