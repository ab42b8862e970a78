//! Time helpers: epoch milliseconds, RFC 3339 UTC timestamps, and the
//! duration syntax every manifest, flag and variable shares (`500ms`, `90s`,
//! `1h30m`).
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

/// Milliseconds since the epoch of `2026-11-30T02:26:20Z` (fractions of a
/// second and `+00:00` accepted); `None` for anything else.
pub fn parse_rfc3339_ms(s: &str) -> Option<u64> {
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        t.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| t.parse().ok())?
    };
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if b[13] != b':' || b[16] != b':' || !(1..=12).contains(&mo) || !(1..=31).contains(&d) {
        return None;
    }
    let mut rest = &s[19..];
    let mut ms = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let f = &frac[..digits.min(3)];
        ms = f.parse::<i64>().ok()? * 10i64.pow(3 - f.len() as u32);
        rest = &frac[digits..];
    }
    if rest != "Z" && rest != "+00:00" {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let total = ((days * 24 + h) * 60 + mi) * 60 + sec;
    u64::try_from(total * 1000 + ms).ok()
}

/// The forms every duration accepts, for error messages and the README.
pub const DURATION_FORMS: &str = "a number with a unit (`500ms`, `90s`, `1.5s`, `2min`, `30m`, `2h`, `1d`, `2w`), units combined largest first (`1h30m`, `1m30s`), or a bare number of seconds";

/// Units a duration may use, each with its length in seconds. Lowercase only:
/// `M` (months elsewhere) and `S` are refused rather than guessed.
const UNITS: &[(&[&str], f64)] = &[
    // Years and weeks as `human` prints them (indicatif's 365 and 7 days),
    // so that a printed `2w` reads back.
    (&["y", "year", "years"], 31_536_000.0),
    (&["w", "week", "weeks"], 604_800.0),
    (&["d", "day", "days"], 86_400.0),
    (&["h", "hr", "hrs", "hour", "hours"], 3_600.0),
    (&["m", "min", "mins", "minute", "minutes"], 60.0),
    (&["s", "sec", "secs", "second", "seconds"], 1.0),
    (
        &["ms", "msec", "millis", "millisecond", "milliseconds"],
        0.001,
    ),
    (&["us", "µs", "micros", "microsecond", "microseconds"], 1e-6),
    (&["ns", "nanos", "nanosecond", "nanoseconds"], 1e-9),
];

/// Parses a duration: `500ms`, `90s`, `1.5s`, `2min`, `30m`, `2h`, `1d`,
/// compounds largest unit first (`1h30m`, `1m 30s`), or a bare number of
/// seconds (zero allowed, e.g. an interval of `0s` meaning "every time").
/// Anything else, including a unit twice or out of order, is an error that
/// lists the accepted forms.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("`{text}` is not a duration: use {DURATION_FORMS}");
    let t = text.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return seconds(t, 1.0).ok_or_else(bad);
    }
    let mut rest = t;
    let mut total = 0f64;
    let mut last_unit = usize::MAX;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_end);
        let after = after.trim_start();
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_end);
        let idx = UNITS
            .iter()
            .position(|(names, _)| names.contains(&unit))
            .ok_or_else(bad)?;
        // Largest unit first, each once: `30s1m` or `1m1m` is a typo.
        if num.is_empty() || (last_unit != usize::MAX && idx <= last_unit) {
            return Err(bad());
        }
        last_unit = idx;
        total += seconds(num, UNITS[idx].1).ok_or_else(bad)?.as_secs_f64();
        rest = after.trim_start();
    }
    if last_unit == usize::MAX {
        return Err(bad());
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `num` (digits with at most one `.`) times `scale` seconds, if finite.
fn seconds(num: &str, scale: f64) -> Option<Duration> {
    if num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1 {
        return None;
    }
    let n: f64 = num.parse().ok()?;
    Duration::try_from_secs_f64(n * scale).ok()
}

/// Like `parse_duration`, but zero is refused (timeouts, grace periods).
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("`{text}` must be more than zero")),
        d => Ok(d),
    }
}

/// A duration for people, the same wherever it is printed (messages,
/// tables, progress bars): indicatif's `HumanDuration` in its short form
/// (`45s`, `89s`, `2m`, `3h`), as the bars' `{elapsed}` and `{eta}` show it,
/// with the precision it drops below 10 s kept (`0.4ms`, `12ms`, `1.3s`):
/// a warm restore takes milliseconds and must not read `0s`. Every output
/// is also a valid `parse_duration` input.
pub fn human(d: Duration) -> String {
    let us = d.as_micros();
    if us < 10_000 {
        format!("{:.1}ms", us as f64 / 1000.0)
    } else if us < 1_000_000 {
        format!("{}ms", us / 1000)
    } else if us < 10_000_000 {
        format!("{:.1}s", us as f64 / 1e6)
    } else {
        format!("{:#}", indicatif::HumanDuration(d))
    }
}

/// A duration as written in a TOML manifest: `"5s"`, `"1h30m"`, or a bare
/// whole number of seconds. Anything else (a float, a negative number, a
/// boolean) is refused by serde with the accepted forms.
#[derive(Clone, Debug)]
pub enum DurationSpec {
    Seconds(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for DurationSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = DurationSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "a duration: a string such as \"90s\" or \"1h30m\", or a whole number of seconds"
                )
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<DurationSpec, E> {
                Ok(DurationSpec::Seconds(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<DurationSpec, E> {
                u64::try_from(n)
                    .map(DurationSpec::Seconds)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<DurationSpec, E> {
                Ok(DurationSpec::Text(t.to_string()))
            }
        }
        d.deserialize_any(V)
    }
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
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("2min"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration(" 2 h "), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("1s500ms"), Ok(Duration::from_millis(1500)));
        for bad in [
            "",
            "-1s",
            "5x",
            "s",
            "1.5.2s",
            "inf",
            "garbage",
            "1h30",
            "30s1m",
            "1m1m",
            "5M",
            "1e3s",
            ".5s",
            "5.s",
            "1h-30m",
            "99999999999999999999999h",
            "1,5s",
            "5 s s",
            "NaN",
        ] {
            let err = parse_duration(bad).expect_err(bad);
            assert!(err.contains("1h30m"), "{bad}: {err}");
        }
        assert!(parse_positive_duration("0").is_err());
        assert_eq!(
            DurationSpec::Seconds(3).resolve("t").unwrap(),
            Duration::from_secs(3)
        );
        assert!(DurationSpec::Seconds(0).resolve_positive("t").is_err());
    }

    use crate::test_rng::Rng;

    /// Whatever `human` prints, `parse_duration` reads, as about the same
    /// length (`human` rounds): gc printed `2w` and refused `--keep-for 2w`.
    #[test]
    fn every_printed_duration_reads_back() {
        let mut r = Rng(0x5eed_d0d0);
        for case in 0..20_000 {
            let scale = 10u64.pow(r.below(12) as u32);
            let d = Duration::from_micros(r.below(scale.max(2)) * r.below(1000));
            let shown = human(d);
            let back = parse_duration(&shown)
                .unwrap_or_else(|e| panic!("case {case}: {d:?} printed {shown:?}: {e}"));
            let (a, b) = (d.as_secs_f64(), back.as_secs_f64());
            assert!(
                (a - b).abs() <= a.max(b) * 0.5 + 0.001,
                "case {case}: {d:?} printed {shown:?} reads {back:?}"
            );
        }
        assert_eq!(parse_duration("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(human(Duration::from_secs(14 * 86_400)), "2w");
    }

    #[test]
    fn duration_parser_never_panics_nor_guesses() {
        let mut r = Rng(0x5eed);
        let alphabet: Vec<char> = "0123456789.hmsdnu µ-+eE_,xMSH\t".chars().collect();
        for _ in 0..20_000 {
            let len = r.below(12) as usize;
            let text: String = (0..len)
                .map(|_| alphabet[r.below(alphabet.len() as u64) as usize])
                .collect();
            // Whatever it is, it parses or is refused with the accepted forms.
            match parse_duration(&text) {
                Ok(_) => assert!(text.chars().any(|c| c.is_ascii_digit()), "{text:?}"),
                Err(e) => assert!(e.contains("1h30m"), "{text:?}: {e}"),
            }
        }
        // Generated compounds, largest unit first, add up exactly.
        for _ in 0..5_000 {
            let (mut text, mut want) = (String::new(), 0u64);
            for (names, secs) in &UNITS[..6] {
                if r.below(2) == 0 {
                    let n = r.below(1000);
                    text.push_str(&format!(
                        "{n}{}",
                        names[r.below(names.len() as u64) as usize]
                    ));
                    want += n * *secs as u64;
                }
            }
            if text.is_empty() {
                continue;
            }
            assert_eq!(
                parse_duration(&text),
                Ok(Duration::from_secs(want)),
                "{text}"
            );
        }
    }

    #[test]
    fn durations_read_like_the_bars() {
        let ms = Duration::from_millis;
        for (d, want) in [
            (Duration::ZERO, "0.0ms"),
            (Duration::from_micros(400), "0.4ms"),
            (ms(12), "12ms"),
            (ms(1300), "1.3s"),
            (ms(45_000), "45s"),
            (ms(300_000), "5m"),
            (ms(7_200_000), "2h"),
        ] {
            assert_eq!(human(d), want);
            assert!(parse_duration(want).is_ok(), "{want} parses back");
        }
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

    #[test]
    fn timestamps_parse_as_clock_writes_them() {
        for ms in [0u64, 1_764_469_580_000, 951_782_400_000, 4_102_444_800_000] {
            assert_eq!(parse_rfc3339_ms(&rfc3339(ms)), Some(ms));
        }
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T02:26:20.5Z"),
            Some(parse_rfc3339_ms("2026-11-30T02:26:20Z").unwrap() + 500)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T02:26:20+00:00"),
            parse_rfc3339_ms("2026-11-30T02:26:20Z")
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-11-30 02:26:20Z",
            "2026-11-30T02:26:20+01:00",
            "2026-11-30T02:26:2xZ",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
