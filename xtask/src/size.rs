//! Sizes: the one parser for every size a flag, manifest or variable takes
//! (`512k`, `16G`, `1.5GiB`), and the one formatter for sizes people read.
//!
//! Units are binary and case-insensitive (`k` = `K` = `KiB` = 1024), as git
//! reads `512k` too. `kB`, `MB`, `GB` and `TB` are refused: they mean powers
//! of ten to some readers and of two to others, and a cap must not be guessed.

use serde::Deserialize;

/// The forms every size accepts, for error messages and the README.
pub const SIZE_FORMS: &str = "bytes (`1048576`), or a number with a binary unit, any case: `512k`, `16G`, `1.5GiB`, `2T` (k/K/KiB = 1024, M/MiB, G/GiB, T/TiB)";

/// Parses a size in bytes: a whole number, or a number (fractions allowed)
/// with `k`, `M`, `G`, `T` or `KiB`, `MiB`, `GiB`, `TiB` (any case; an
/// optional space before the unit). Zero is allowed; callers that cannot use
/// it refuse it.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let bad = |hint: &str| format!("`{text}` is not a size{hint}: use {SIZE_FORMS}");
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let unit = unit.trim_start().to_ascii_lowercase();
    let shift = match unit.as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        "t" | "tib" => 40,
        "kb" | "mb" | "gb" | "tb" => {
            return Err(bad(
                " (kB/MB/GB/TB are ambiguous: write `16G` or `16GiB` for 16 x 1024^3)",
            ));
        }
        _ => return Err(bad("")),
    };
    if num.is_empty() || num.starts_with('.') || num.ends_with('.') || num.matches('.').count() > 1
    {
        return Err(bad(""));
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| bad(" (too large)"));
    }
    // A fraction: exact in f64 up to 2^53 bytes, which no cap here reaches.
    let n: f64 = num.parse().map_err(|_| bad(""))?;
    let bytes = n * (1u64 << shift) as f64;
    if !(bytes.is_finite() && bytes < 2f64.powi(53)) {
        return Err(bad(" (too large)"));
    }
    if bytes.fract() != 0.0 {
        return Err(bad(" (it is not a whole number of bytes)"));
    }
    Ok(bytes as u64)
}

/// `parse_size` for clap's `value_parser`.
pub fn parse_size_arg(text: &str) -> Result<u64, String> {
    parse_size(text)
}

/// A size as written in a TOML manifest: a whole number of bytes, or a
/// string such as `"99MiB"`; anything else is refused with those forms.
#[derive(Clone, Debug)]
pub enum SizeSpec {
    Bytes(u64),
    Text(String),
}

impl<'de> Deserialize<'de> for SizeSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = SizeSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(
                    f,
                    "a size: a whole number of bytes, or a string such as \"512k\" or \"16GiB\""
                )
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<SizeSpec, E> {
                Ok(SizeSpec::Bytes(n))
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<SizeSpec, E> {
                u64::try_from(n)
                    .map(SizeSpec::Bytes)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(n), &self))
            }
            fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<SizeSpec, E> {
                Ok(SizeSpec::Text(t.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

impl SizeSpec {
    /// The size in bytes, or an error naming `field`.
    pub fn resolve(&self, field: &str) -> anyhow::Result<u64> {
        match self {
            SizeSpec::Bytes(n) => Ok(*n),
            SizeSpec::Text(t) => parse_size(t).map_err(|e| anyhow::anyhow!("{field}: {e}")),
        }
    }
}

/// A size for people, the same wherever it is printed (messages, tables,
/// progress bars): indicatif's binary units, `12 B`, `1.46 KiB`, `94.36 MiB`.
pub fn human(bytes: u64) -> String {
    indicatif::HumanBytes(bytes).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sizes() {
        for (text, want) in [
            ("0", 0),
            ("1048576", 1 << 20),
            ("512k", 512 << 10),
            ("512K", 512 << 10),
            ("512KiB", 512 << 10),
            ("512kib", 512 << 10),
            ("1m", 1 << 20),
            ("16G", 16 << 30),
            ("16 GiB", 16 << 30),
            ("2T", 2 << 40),
            ("1.5G", 3 << 29),
            ("10b", 10),
        ] {
            assert_eq!(parse_size(text), Ok(want), "{text}");
        }
        for bad in [
            "",
            "lots",
            "16GB",
            "1mb",
            "-1",
            "1.5",
            "0.1k",
            "1e3",
            "k",
            ".5G",
            "5.G",
            "1..5k",
            "99999999999999999999",
            "20000000T",
            "16 G B",
            "1 2k",
            "16Gi",
        ] {
            let err = parse_size(bad).expect_err(bad);
            assert!(err.contains("16G"), "{bad}: {err}");
        }
    }

    #[test]
    fn conda_default_cap_is_its_help_text() {
        assert_eq!(parse_size("16G"), Ok(crate::cli::conda::DEFAULT_MAX_BYTES));
    }

    #[test]
    fn size_parser_never_panics_nor_guesses() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut r = |n: u64| {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
        };
        let alphabet: Vec<char> = "0123456789.kKmMgGtTiIbB -+e_".chars().collect();
        for _ in 0..20_000 {
            let len = r(10) as usize;
            let text: String = (0..len)
                .map(|_| alphabet[r(alphabet.len() as u64) as usize])
                .collect();
            if let Ok(n) = parse_size(&text) {
                // Whatever it accepted, the digits say it: a value never
                // comes out of nothing.
                assert!(text.chars().any(|c| c.is_ascii_digit()), "{text:?}");
                assert!(n == 0 || text.chars().any(|c| c.is_ascii_digit() && c != '0'));
            }
        }
    }

    #[test]
    fn formats_like_the_progress_bars() {
        assert_eq!(human(12), "12 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(1_503_238_553), "1.40 GiB");
    }
}
