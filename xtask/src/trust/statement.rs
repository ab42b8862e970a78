//! The signed statement of one cache key: `<key>.statement` on a cache branch.
//!
//! Pure text, line-oriented, so that a shell bootstrap can check it with
//! `ssh-keygen -Y verify` and coreutils alone: `field value` lines, then the
//! `SHA256SUMS` lines of the key's chunks in chunk order (`grep` them out and
//! `sha256sum -c` them). It is derived from the key's `warmstart.json` entry
//! and nothing else, so "warmstart.json agrees with the statement" is one
//! comparison of `from_entry(..)` with the parsed signed file. This module
//! never touches git, a file or a process.
//!
//! Two versions (`Version`). Version 1 (`Version::Entry`) binds the fields
//! every entry has. Version 2 (`Version::Reuse`) is written exactly when an
//! entry has one of the fields a restore reuses what is on disk by
//! (`frames`, the chunks' `raw_size`/`raw_sha256`, the per-file `index`),
//! and binds those too, and the key's `key_parts`: a restore trusts the
//! raw digests to reuse chunks and the index to link files instead of
//! writing them, so an unsigned one would let a pusher who cannot sign keep
//! an old file in place. Version 2 adds lines between `files` and the chunk
//! lines and changes none of version 1's, so an entry without the new
//! fields renders the version 1 bytes it always did and every branch signed
//! before still verifies. See README "Trust" for the layout.

use anyhow::{Result, bail};
use sha2::{Digest, Sha256};

use crate::cache::format::{Frames, IndexFile, KeyEntry, check_file_name, check_key};
use crate::hex;

/// The first line of a version 1 statement (`Version::Entry`).
pub const MAGIC: &str = "warmstart-statement 1";

/// The first line of a version 2 statement (`Version::Reuse`).
pub const MAGIC_V2: &str = "warmstart-statement 2";

/// A statement's version: which of its entry's fields it binds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    /// Version 1: the fields every entry has, and its chunks' digests.
    Entry,
    /// Version 2: also the fields a restore trusts to reuse and link what is
    /// already on disk instead of writing it: the frames (how the chunks
    /// were cut and compressed), each chunk's raw size and digest, the
    /// per-file index, and the key's parts.
    Reuse,
}

impl Version {
    /// The statement's first line.
    pub fn magic(self) -> &'static str {
        match self {
            Version::Entry => MAGIC,
            Version::Reuse => MAGIC_V2,
        }
    }
}

/// What every statement's first line starts with, before its version.
const MAGIC_PREFIX: &str = "warmstart-statement ";

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
    /// `Reuse` exactly when one of `frames`, `raw` or `index` is set.
    pub version: Version,
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
    /// `Version::Reuse`: each pin's `(name, value)`, in order (empty in
    /// `Version::Entry`, which binds them only through the key's name).
    pub key_parts: Vec<(String, String)>,
    /// `Version::Reuse`: how the chunks were cut and compressed.
    pub frames: Option<Frames>,
    /// `Version::Reuse`: the per-file index file, its size and sha256.
    pub index: Option<IndexFile>,
    /// `Version::Reuse`: each chunk's `(raw_size, raw_sha256)` in chunk order, or
    /// empty when no chunk has either.
    pub raw: Vec<(Option<u64>, Option<String>)>,
    /// `(sha256, file)` of each chunk, in chunk order.
    pub chunks: Vec<(String, String)>,
}

/// sha256 of a gate record as the statement binds it (`None` for null).
pub fn gates_digest(gates: &serde_json::Value) -> Option<String> {
    if gates.is_null() {
        return None;
    }
    let text = serde_json::to_string(gates).expect("a json value serializes");
    Some(hex::encode(&Sha256::digest(text.as_bytes())))
}

impl Statement {
    /// The statement of `key` of cache `cache`, as its entry says:
    /// `Version::Reuse` when the entry has any of the fields it binds, else
    /// `Version::Entry`.
    pub fn from_entry(cache: &str, key: &str, e: &KeyEntry) -> Statement {
        let mut raw: Vec<(Option<u64>, Option<String>)> = e
            .chunks
            .iter()
            .map(|c| {
                (
                    c.raw_size,
                    c.raw_sha256.as_ref().map(|s| s.to_ascii_lowercase()),
                )
            })
            .collect();
        if raw.iter().all(|r| *r == (None, None)) {
            raw.clear();
        }
        let reuse = e.frames.is_some() || e.index.is_some() || !raw.is_empty();
        Statement {
            version: if reuse {
                Version::Reuse
            } else {
                Version::Entry
            },
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
            key_parts: if reuse {
                e.key_parts
                    .iter()
                    .map(|p| (p.name.clone(), p.value.clone()))
                    .collect()
            } else {
                Vec::new()
            },
            frames: e.frames.clone(),
            index: e.index.as_ref().map(|i| IndexFile {
                sha256: i.sha256.to_ascii_lowercase(),
                ..i.clone()
            }),
            raw,
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
        let magic = self.version.magic();
        let mut s = format!(
            "{magic}\ncache {}\nkey {}\ncreated_at {}\nsource_commit {}\nsource_tree {}\ngates_sha256 {}\nungated {}\ncompression {}\ntar_sha256 {}\ntar_size {}\nfiles {}\n",
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
        if self.version == Version::Reuse {
            self.render_reuse(&mut s);
        }
        for (sha, file) in &self.chunks {
            s.push_str(&format!("{sha}  {file}\n"));
        }
        s
    }

    /// `Version::Reuse`'s lines between `files` and the chunk lines. None of them
    /// starts with 64 hex digits and two spaces, so `grep` of the chunk
    /// lines and the shell bootstrap's check see only the chunks.
    fn render_reuse(&self, s: &mut String) {
        let dash = |v: Option<String>| v.unwrap_or_else(|| "-".into());
        for (name, value) in &self.key_parts {
            s.push_str(&format!("key_part {} {}\n", word(name), word(value)));
        }
        match &self.frames {
            None => s.push_str("chunker -\n"),
            Some(f) => s.push_str(&format!(
                "chunker {}\nmin_size {}\navg_size {}\nmax_size {}\nzstd {}\nlevel {}\nwindow_log {}\nchecksum {}\n",
                word(&f.chunker),
                f.min_size,
                f.avg_size,
                f.max_size,
                word(&f.zstd),
                f.level,
                dash(f.window_log.map(|w| w.to_string())),
                f.checksum,
            )),
        }
        match &self.index {
            None => s.push_str("index -\n"),
            Some(i) => s.push_str(&format!("index {} {} {}\n", i.size, i.sha256, i.file)),
        }
        for ((size, sha), (_, file)) in self.raw.iter().zip(&self.chunks) {
            s.push_str(&format!(
                "raw {} {} {file}\n",
                dash(size.map(|n| n.to_string())),
                dash(sha.clone())
            ));
        }
    }

    /// Parses a statement strictly: every field once, in order, nothing
    /// else. A version this build does not know is refused with one line
    /// naming the version it needs.
    pub fn parse(text: &str) -> Result<Statement> {
        let mut lines = text.split('\n').peekable();
        let first = lines.next().unwrap_or_default();
        let version = match first {
            MAGIC => Version::Entry,
            MAGIC_V2 => Version::Reuse,
            _ => match first.strip_prefix(MAGIC_PREFIX) {
                Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => bail!(
                    "is statement version {v} but {} reads versions 1 and 2 only: upgrade to a warmstart that reads statement version {v}",
                    concat!("warmstart ", env!("CARGO_PKG_VERSION"))
                ),
                _ => bail!("does not start with `{MAGIC}` or `{MAGIC_V2}`"),
            },
        };
        let mut f = Fields(&mut lines);
        let mut s = Statement::parse_entry_head(&mut f, version)?;
        if version == Version::Reuse {
            s.parse_reuse_head(&mut f)?;
        }
        let rest: Vec<&str> = lines.collect();
        let Some((last, body)) = rest.split_last() else {
            bail!("ends without a newline");
        };
        if !last.is_empty() {
            bail!("does not end with a newline");
        }
        let (raw_lines, chunk_lines) =
            body.split_at(body.partition_point(|l| l.starts_with("raw ")));
        s.parse_chunks(chunk_lines)?;
        s.parse_raw(raw_lines)?;
        s.check_values()?;
        // Only one spelling of a statement is valid: what was signed is
        // what `render` gives, so two texts never mean the same thing.
        if s.render() != text {
            bail!("is not in canonical form");
        }
        Ok(s)
    }

    /// The `field value` lines every version has, from `cache` to `files`.
    fn parse_entry_head(f: &mut Fields, version: Version) -> Result<Statement> {
        let opt = |v: String| (v != "-").then_some(v);
        let cache = f.field("cache")?;
        let key = f.field("key")?;
        let created_at = f.field("created_at")?;
        let source_commit = opt(f.field("source_commit")?);
        let source_tree = opt(f.field("source_tree")?);
        let gates_sha256 = opt(f.field("gates_sha256")?);
        let ungated = boolean(&f.field("ungated")?, "ungated")?;
        let compression = f.field("compression")?;
        let tar_sha256 = f.field("tar_sha256")?;
        let tar_size = number(&f.field("tar_size")?, "tar_size")?;
        let files = number(&f.field("files")?, "files")?;
        Ok(Statement {
            version,
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
            key_parts: Vec::new(),
            frames: None,
            index: None,
            raw: Vec::new(),
            chunks: Vec::new(),
        })
    }

    /// The `<sha256>  <file>` lines, at least one.
    fn parse_chunks(&mut self, lines: &[&str]) -> Result<()> {
        for line in lines {
            let Some((sha, file)) = line.split_once("  ") else {
                bail!("chunk line {line:?} is not `<sha256>  <file>`");
            };
            check_sha(sha, file)?;
            check_file_name(file)?;
            self.chunks.push((sha.to_string(), file.to_string()));
        }
        if self.chunks.is_empty() {
            bail!("lists no chunks");
        }
        Ok(())
    }

    /// `Version::Reuse`'s `key_part`, frames and `index` lines.
    fn parse_reuse_head(&mut self, f: &mut Fields) -> Result<()> {
        while let Some(part) = f.prefixed("key_part ") {
            let Some((name, value)) = part.split_once(' ') else {
                bail!("key_part line {part:?} is not `key_part <name> <value>`");
            };
            self.key_parts.push((unword(name)?, unword(value)?));
        }
        let chunker = f.field("chunker")?;
        if chunker != "-" {
            let mut size = |name: &str| -> Result<u64> { number(&f.field(name)?, name) };
            let (min_size, avg_size, max_size) =
                (size("min_size")?, size("avg_size")?, size("max_size")?);
            let zstd = unword(&f.field("zstd")?)?;
            let level = f.field("level")?;
            let level: i32 = level
                .parse()
                .map_err(|_| anyhow::anyhow!("level {level:?} is not a whole number"))?;
            let window_log = match f.field("window_log")?.as_str() {
                "-" => None,
                w => Some(number(w, "window_log")?.try_into()?),
            };
            let checksum = boolean(&f.field("checksum")?, "checksum")?;
            self.frames = Some(Frames {
                chunker: unword(&chunker)?,
                min_size,
                avg_size,
                max_size,
                zstd,
                level,
                window_log,
                checksum,
            });
        }
        let index = f.prefixed("index ").unwrap_or_default();
        if index != "-" {
            let mut it = index.splitn(3, ' ');
            let (Some(size), Some(sha), Some(file)) = (it.next(), it.next(), it.next()) else {
                bail!("index line {index:?} is not `index <size> <sha256> <file>` or `index -`");
            };
            check_sha(sha, file)?;
            check_file_name(file)?;
            self.index = Some(IndexFile {
                file: file.to_string(),
                size: number(size, "index size")?,
                sha256: sha.to_string(),
            });
        }
        Ok(())
    }

    /// The `raw <size> <sha256> <file>` lines: none, or one per chunk, each
    /// naming its chunk's file.
    fn parse_raw(&mut self, lines: &[&str]) -> Result<()> {
        if lines.is_empty() {
            return Ok(());
        }
        if self.version != Version::Reuse || lines.len() != self.chunks.len() {
            bail!(
                "has {} raw lines for {} chunks",
                lines.len(),
                self.chunks.len()
            );
        }
        for (line, (_, chunk)) in lines.iter().zip(&self.chunks) {
            let mut it = line["raw ".len()..].splitn(3, ' ');
            let (Some(size), Some(sha), Some(file)) = (it.next(), it.next(), it.next()) else {
                bail!("raw line {line:?} is not `raw <size> <sha256> <file>`");
            };
            if file != chunk {
                bail!("raw line {line:?} does not name chunk {chunk}");
            }
            let size = (size != "-")
                .then(|| number(size, "raw size"))
                .transpose()?;
            let sha = (sha != "-").then(|| check_sha(sha, file).map(|()| sha.to_string()));
            self.raw.push((size, sha.transpose()?));
        }
        Ok(())
    }

    /// The checks of values that do not depend on their line.
    fn check_values(&self) -> Result<()> {
        check_key(&self.key)?;
        check_timestamp(&self.created_at)?;
        check_sha(&self.tar_sha256, "tar_sha256")?;
        for (v, what) in [
            (&self.source_commit, "source_commit"),
            (&self.source_tree, "source_tree"),
        ] {
            if let Some(v) = v
                && (v.len() < 40 || !v.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                bail!("{what} {v:?} is not an object id");
            }
        }
        if let Some(g) = &self.gates_sha256 {
            check_sha(g, "gates_sha256")?;
        }
        Ok(())
    }

    /// The first field where `self` (what was signed) and `other` (what the
    /// branch's warmstart.json says) differ, or `None` when they agree.
    pub fn first_difference(&self, other: &Statement) -> Option<&'static str> {
        let pairs: [(&'static str, bool); 17] = [
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
            ("key_parts", self.key_parts == other.key_parts),
            ("frames", self.frames == other.frames),
            ("index", self.index == other.index),
            ("raw", self.raw == other.raw),
            ("chunks", self.chunks == other.chunks),
            // Last: a difference in what the version adds is named first.
            ("version", self.version == other.version),
        ];
        pairs.iter().find(|(_, same)| !same).map(|(name, _)| *name)
    }
}

/// The `field value` lines of a statement, read in order.
struct Fields<'a, 'b>(&'b mut std::iter::Peekable<std::str::Split<'a, char>>);

impl Fields<'_, '_> {
    /// The value of the next line, which must be `name value` (one word).
    fn field(&mut self, name: &str) -> Result<String> {
        let line = self.0.next().unwrap_or_default();
        match line.split_once(' ') {
            Some((n, v)) if n == name && !v.is_empty() && !v.contains(' ') => Ok(v.to_string()),
            _ => bail!("expected `{name} <value>`, found {line:?}"),
        }
    }

    /// The rest of the next line when it starts with `prefix` (consumed),
    /// else `None` (not consumed).
    fn prefixed(&mut self, prefix: &str) -> Option<String> {
        let rest = self.0.peek()?.strip_prefix(prefix)?.to_string();
        self.0.next();
        Some(rest)
    }
}

/// Free text as one word: every byte outside `!`..`~`, and `%`, as `%XX`;
/// the empty text as `-` (and the text `-` as `%2D`).
fn word(text: &str) -> String {
    if text.is_empty() {
        return "-".into();
    }
    if text == "-" {
        return "%2D".into();
    }
    let mut out = String::new();
    for b in text.bytes() {
        if (b'!'..=b'~').contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The inverse of `word`; `render` then refuses every other spelling.
fn unword(w: &str) -> Result<String> {
    if w == "-" {
        return Ok(String::new());
    }
    let b = w.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let byte = w
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| anyhow::anyhow!("{w:?} has a bad %XX escape"))?;
            out.push(byte);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| anyhow::anyhow!("{w:?} is not UTF-8"))
}

fn boolean(v: &str, what: &str) -> Result<bool> {
    match v {
        "true" => Ok(true),
        "false" => Ok(false),
        other => bail!("{what} is {other:?}, not true or false"),
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
mod tests;
