//! The signed statement of one cache key: `<key>.statement` on a cache branch.
//!
//! Pure text, line-oriented, so that a shell bootstrap can check it with
//! `ssh-keygen -Y verify` and coreutils alone: `field value` lines, then the
//! `SHA256SUMS` lines of the key's chunks in chunk order (`grep` them out and
//! `sha256sum -c` them). It is derived from the key's `warmstart.json` entry
//! and nothing else, so "warmstart.json agrees with the statement" is one
//! byte comparison of `render(from_entry(..))` with the signed file. This
//! module never touches git, a file or a process.

use anyhow::{Result, bail};
use sha2::{Digest, Sha256};

use crate::cache::format::{KeyEntry, check_file_name, check_key};
use crate::cache::manifest::hex;

/// The first line of every statement this build writes and reads.
pub const MAGIC: &str = "warmstart-statement 1";

/// The file a key's statement lives in on its branch.
pub fn file_name(key: &str) -> String {
    format!("{key}.statement")
}

/// The file of the statement's SSH signature (`ssh-keygen -Y sign` output).
pub fn sig_name(key: &str) -> String {
    format!("{key}.statement.sig")
}

/// What a signer vouches for about one cache key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Statement {
    /// The cache (manifest name): a statement of one cache never vouches for another.
    pub cache: String,
    pub key: String,
    /// RFC 3339 UTC, second precision, fixed width: compares as text.
    pub created_at: String,
    pub source_commit: Option<String>,
    pub source_tree: Option<String>,
    /// sha256 of the gate record as written in warmstart.json (compact JSON).
    pub gates_sha256: Option<String>,
    pub ungated: bool,
    pub compression: String,
    pub tar_sha256: String,
    pub tar_size: u64,
    pub files: u64,
    /// `(sha256, file)` of each chunk, in chunk order.
    pub chunks: Vec<(String, String)>,
}

/// sha256 of a gate record as the statement binds it (`None` for null).
pub fn gates_digest(gates: &serde_json::Value) -> Option<String> {
    if gates.is_null() {
        return None;
    }
    let text = serde_json::to_string(gates).expect("a json value serializes");
    Some(hex(&Sha256::digest(text.as_bytes())))
}

impl Statement {
    /// The statement of `key` of cache `cache`, as its entry says.
    pub fn from_entry(cache: &str, key: &str, e: &KeyEntry) -> Statement {
        Statement {
            cache: cache.to_string(),
            key: key.to_string(),
            created_at: e.created_at.clone(),
            source_commit: e.source_commit.clone(),
            source_tree: e.source_tree.clone(),
            gates_sha256: gates_digest(&e.gates),
            ungated: e.ungated,
            compression: e.compression.clone(),
            tar_sha256: e.tar_sha256.to_ascii_lowercase(),
            tar_size: e.tar_size,
            files: e.files,
            chunks: e
                .chunks
                .iter()
                .map(|c| (c.sha256.to_ascii_lowercase(), c.file.clone()))
                .collect(),
        }
    }

    /// The bytes that are signed.
    pub fn render(&self) -> String {
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let mut s = format!(
            "{MAGIC}\ncache {}\nkey {}\ncreated_at {}\nsource_commit {}\nsource_tree {}\ngates_sha256 {}\nungated {}\ncompression {}\ntar_sha256 {}\ntar_size {}\nfiles {}\n",
            self.cache,
            self.key,
            self.created_at,
            opt(&self.source_commit),
            opt(&self.source_tree),
            opt(&self.gates_sha256),
            self.ungated,
            self.compression,
            self.tar_sha256,
            self.tar_size,
            self.files,
        );
        for (sha, file) in &self.chunks {
            s.push_str(&format!("{sha}  {file}\n"));
        }
        s
    }

    /// Parses a statement strictly: every field once, in order, nothing else.
    pub fn parse(text: &str) -> Result<Statement> {
        let mut lines = text.split('\n');
        if lines.next() != Some(MAGIC) {
            bail!("does not start with `{MAGIC}`");
        }
        let mut field = |name: &str| -> Result<String> {
            let line = lines.next().unwrap_or_default();
            match line.split_once(' ') {
                Some((n, v)) if n == name && !v.is_empty() && !v.contains(' ') => Ok(v.to_string()),
                _ => bail!("expected `{name} <value>`, found {line:?}"),
            }
        };
        let opt = |v: String| (v != "-").then_some(v);
        let cache = field("cache")?;
        let key = field("key")?;
        let created_at = field("created_at")?;
        let source_commit = opt(field("source_commit")?);
        let source_tree = opt(field("source_tree")?);
        let gates_sha256 = opt(field("gates_sha256")?);
        let ungated = match field("ungated")?.as_str() {
            "true" => true,
            "false" => false,
            other => bail!("ungated is {other:?}, not true or false"),
        };
        let compression = field("compression")?;
        let tar_sha256 = field("tar_sha256")?;
        let tar_size = number(&field("tar_size")?, "tar_size")?;
        let files = number(&field("files")?, "files")?;
        let mut chunks = Vec::new();
        let rest: Vec<&str> = lines.collect();
        let Some((last, body)) = rest.split_last() else {
            bail!("ends without a newline");
        };
        if !last.is_empty() {
            bail!("does not end with a newline");
        }
        for line in body {
            let Some((sha, file)) = line.split_once("  ") else {
                bail!("chunk line {line:?} is not `<sha256>  <file>`");
            };
            check_sha(sha, file)?;
            check_file_name(file)?;
            chunks.push((sha.to_string(), file.to_string()));
        }
        if chunks.is_empty() {
            bail!("lists no chunks");
        }
        check_key(&key)?;
        check_timestamp(&created_at)?;
        check_sha(&tar_sha256, "tar_sha256")?;
        for (v, what) in [
            (&source_commit, "source_commit"),
            (&source_tree, "source_tree"),
        ] {
            if let Some(v) = v
                && (v.len() < 40 || !v.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                bail!("{what} {v:?} is not an object id");
            }
        }
        if let Some(g) = &gates_sha256 {
            check_sha(g, "gates_sha256")?;
        }
        let s = Statement {
            cache,
            key,
            created_at,
            source_commit,
            source_tree,
            gates_sha256,
            ungated,
            compression,
            tar_sha256,
            tar_size,
            files,
            chunks,
        };
        // Only one spelling of a statement is valid: what was signed is
        // what `render` gives, so two texts never mean the same thing.
        if s.render() != text {
            bail!("is not in canonical form");
        }
        Ok(s)
    }

    /// The first field where `self` (what was signed) and `other` (what the
    /// branch's warmstart.json says) differ, or `None` when they agree.
    pub fn first_difference(&self, other: &Statement) -> Option<&'static str> {
        let pairs: [(&'static str, bool); 12] = [
            ("cache", self.cache == other.cache),
            ("key", self.key == other.key),
            ("created_at", self.created_at == other.created_at),
            ("source_commit", self.source_commit == other.source_commit),
            ("source_tree", self.source_tree == other.source_tree),
            ("gates_sha256", self.gates_sha256 == other.gates_sha256),
            ("ungated", self.ungated == other.ungated),
            ("compression", self.compression == other.compression),
            ("tar_sha256", self.tar_sha256 == other.tar_sha256),
            ("tar_size", self.tar_size == other.tar_size),
            ("files", self.files == other.files),
            ("chunks", self.chunks == other.chunks),
        ];
        pairs.iter().find(|(_, same)| !same).map(|(name, _)| *name)
    }
}

fn number(v: &str, what: &str) -> Result<u64> {
    if v.len() > 1 && v.starts_with('0') {
        bail!("{what} {v:?} has a leading zero");
    }
    v.parse()
        .map_err(|_| anyhow::anyhow!("{what} {v:?} is not a whole number"))
}

fn check_sha(v: &str, what: &str) -> Result<()> {
    if v.len() != 64 || !v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        bail!("sha256 of {what} is not 64 lowercase hex digits: {v:?}");
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` exactly (what `clock::rfc3339` writes), so that
/// two timestamps compare as text in time order.
pub fn check_timestamp(v: &str) -> Result<()> {
    let b = v.as_bytes();
    let shape = b.len() == 20
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            10 => *c == b'T',
            13 | 16 => *c == b':',
            19 => *c == b'Z',
            _ => c.is_ascii_digit(),
        });
    if !shape {
        bail!("created_at {v:?} is not `YYYY-MM-DDTHH:MM:SSZ`");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::Chunk;

    fn entry() -> KeyEntry {
        KeyEntry {
            archive: "k.tar.zst".into(),
            compression: "zstd".into(),
            chunks: (0..3)
                .map(|i| Chunk {
                    file: format!("k.tar.zst.part{i:03}"),
                    size: 10 + i,
                    sha256: format!("{i}").repeat(64),
                    raw_size: None,
                    raw_sha256: None,
                })
                .collect(),
            tar_sha256: "b".repeat(64),
            tar_size: 10240,
            files: 7,
            key_parts: vec![],
            source_commit: Some("c".repeat(40)),
            source_tree: Some("d".repeat(40)),
            gates: serde_json::json!({"tree": "d", "gates": {"unit": "green"}}),
            ungated: false,
            created_at: "2026-12-01T10:00:00Z".into(),
            tool_version: "warmstart 0".into(),
            frames: None,
            index: None,
        }
    }

    #[test]
    fn round_trips_and_is_line_oriented() {
        let s = Statement::from_entry("art", "k", &entry());
        let text = s.render();
        assert!(text.starts_with("warmstart-statement 1\ncache art\nkey k\n"));
        assert!(text.contains(&format!("\n{}  k.tar.zst.part001\n", "1".repeat(64))));
        assert_eq!(Statement::parse(&text).unwrap(), s);
        let mut e = entry();
        e.gates = serde_json::Value::Null;
        e.source_commit = None;
        let s = Statement::from_entry("art", "k", &e);
        assert!(s.render().contains("\ngates_sha256 -\nungated false\n"));
        assert_eq!(Statement::parse(&s.render()).unwrap(), s);
    }

    #[test]
    fn every_field_of_the_entry_that_matters_is_bound() {
        let base = Statement::from_entry("art", "k", &entry());
        type Edit = Box<dyn Fn(&mut KeyEntry)>;
        let edits: Vec<(&str, Edit)> = vec![
            (
                "created_at",
                Box::new(|e| e.created_at = "2026-12-01T10:00:01Z".into()),
            ),
            ("source_commit", Box::new(|e| e.source_commit = None)),
            (
                "source_tree",
                Box::new(|e| e.source_tree = Some("e".repeat(40))),
            ),
            (
                "gates_sha256",
                Box::new(|e| e.gates = serde_json::json!({"forged": true})),
            ),
            ("ungated", Box::new(|e| e.ungated = true)),
            ("tar_sha256", Box::new(|e| e.tar_sha256 = "f".repeat(64))),
            ("tar_size", Box::new(|e| e.tar_size += 1)),
            ("files", Box::new(|e| e.files += 1)),
            ("chunks", Box::new(|e| e.chunks.swap(0, 1))),
            ("chunks", Box::new(|e| e.chunks[2].sha256 = "9".repeat(64))),
            ("chunks", Box::new(|e| drop(e.chunks.pop()))),
        ];
        for (field, edit) in edits {
            let mut e = entry();
            edit(&mut e);
            let other = Statement::from_entry("art", "k", &e);
            assert_eq!(base.first_difference(&other), Some(field));
        }
        let other = Statement::from_entry("other", "k", &entry());
        assert_eq!(base.first_difference(&other), Some("cache"));
        assert_eq!(base.first_difference(&base.clone()), None);
    }

    /// Never: a statement that is not exactly what `render` writes parses.
    /// Random single-byte edits of a valid statement either fail to parse
    /// or parse to a different statement (which the restore then compares
    /// with warmstart.json): none is silently the same one.
    #[test]
    fn random_edits_never_parse_to_the_same_statement() {
        let s = Statement::from_entry("art", "k", &entry());
        let text = s.render().into_bytes();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let alphabet = b"0123456789abcdefABCDEF -_:\nTZtruefals.";
        for _ in 0..3000 {
            let mut t = text.clone();
            let at = (next() % t.len() as u64) as usize;
            match next() % 3 {
                0 => t[at] = alphabet[(next() % alphabet.len() as u64) as usize],
                1 => drop(t.remove(at)),
                _ => t.insert(at, alphabet[(next() % alphabet.len() as u64) as usize]),
            }
            if t == text {
                continue;
            }
            if let Ok(text) = std::str::from_utf8(&t)
                && let Ok(parsed) = Statement::parse(text)
            {
                assert_ne!(parsed, s, "edited text parsed as the original: {text:?}");
                assert_eq!(parsed.render(), text);
            }
        }
    }

    #[test]
    fn hostile_statements_are_refused() {
        let good = Statement::from_entry("art", "k", &entry()).render();
        for bad in [
            String::new(),
            good.replacen("warmstart-statement 1", "warmstart-statement 2", 1),
            good.replacen("key k\n", "key ../k\n", 1),
            good.replacen(
                "created_at 2026-12-01T10:00:00Z",
                "created_at 2026-12-01",
                1,
            ),
            good.replacen("ungated false", "ungated no", 1),
            good.replacen("tar_size 10240", "tar_size 010240", 1),
            good.trim_end().to_string(),
            format!("{good}extra line\n"),
            good.replace("  k.tar.zst.part002", "  ../etc/passwd"),
            good.replacen("files 7\n", "files 7\nfiles 8\n", 1),
        ] {
            assert!(Statement::parse(&bad).is_err(), "parsed: {bad:?}");
        }
    }
}
