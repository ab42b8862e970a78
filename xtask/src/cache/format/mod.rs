//! Cache branch format v1: `warmstart.json`, `SHA256SUMS` and chunk names.
//!
//! Pure data and text: this module parses and renders the files of a cache
//! branch and never touches git, the network or the file system. See
//! docs/format.md, "`warmstart.json`, format 1" and "Legacy branches".

pub mod bootstrap;
pub mod build;
pub mod build_fits;
pub mod chunk_sizes;
pub mod fallback;
pub mod files;
pub mod key;
pub mod manifest;
pub mod oci;
pub mod place;
pub mod readme;
pub mod trust;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The `format` field of `warmstart.json` this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// The largest chunk a publisher may write. GitHub rejects files of 100 MiB
/// (its "100 MB" is binary); the shell recipe's `split -b 99m` and our default
/// stay a MiB below that.
pub const MAX_CHUNK_BYTES: u64 = 100 * 1024 * 1024 - 1;

/// Default chunk size: 99 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 99 * 1024 * 1024;

/// `warmstart.json`: the machine manifest at the root of a cache branch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BranchManifest {
    /// Always `FORMAT_VERSION` for files this build writes.
    pub format: u32,
    /// One entry per key held on the branch (e.g. one per platform).
    pub keys: BTreeMap<String, KeyEntry>,
}

/// One published key: its chunks and what they decode to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// `<key>.tar.zst`: the name of the (virtual) whole archive.
    pub archive: String,
    /// `zstd` for v1 (legacy branches may be gzip, but have no warmstart.json).
    pub compression: String,
    /// The chunk files, in order; their concatenation is the compressed stream.
    pub chunks: Vec<Chunk>,
    /// sha256 of the uncompressed tar stream.
    pub tar_sha256: String,
    /// Size in bytes of the uncompressed tar stream (also the unpack cap).
    pub tar_size: u64,
    /// Number of entries (files, directories, links) in the tar.
    pub files: u64,
    /// How the key was built: each pin's name and value, in order.
    #[serde(default)]
    pub key_parts: Vec<KeyPart>,
    /// The commit and tree the artifact was published from.
    #[serde(default)]
    pub source_commit: Option<String>,
    #[serde(default)]
    pub source_tree: Option<String>,
    /// The green gate record the publish relied on (null when none was required).
    #[serde(default)]
    pub gates: serde_json::Value,
    /// True when published with `--allow-ungated`.
    #[serde(default)]
    pub ungated: bool,
    /// RFC 3339 UTC time of the publish.
    pub created_at: String,
    /// `warmstart <version>` that published it.
    pub tool_version: String,
    /// How the chunks were cut and compressed when each chunk is its own
    /// zstd frame, cut at content-defined boundaries of the tar.
    /// Absent on branches published before: one zstd stream cut at fixed
    /// sizes. Either way the concatenation of the chunks is one valid zstd
    /// stream, so restorers that ignore this field still read the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frames: Option<Frames>,
    /// The key's per-file index (`cache::format::files`): the zstd stream
    /// `file`, of `size` bytes and digest `sha256`, which `SHA256SUMS` does
    /// not list (older restorers require SHA256SUMS to name exactly the
    /// chunks). Stored whole as the blob `file` when `index_parts` is
    /// empty, else as those parts and not under its own name. Absent on
    /// older branches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexFile>,
    /// The index cut at content-defined boundaries of its text, each part
    /// one zstd frame on the branch (`<key>.files.zst.part000`, ...): their
    /// concatenation in order is `index.file`, so a part that did not
    /// change is the same blob as the previous key's and is neither pushed
    /// nor fetched again. Not signed: each part is checked by its sha256,
    /// and their concatenation by `index`'s, which the statement binds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub index_parts: Vec<IndexFile>,
}

/// The one chunker this build writes and reads.
pub const CHUNKER: &str = "fastcdc-2020";

/// How a key's chunks were made: which content-defined chunker with which
/// sizes (of the uncompressed tar), and which zstd with which parameters.
/// Identical tar bytes give identical chunk blobs only for one zstd version
/// and one set of parameters, so both are recorded: a publisher reuses an
/// earlier compressed chunk only when they match, and indexes chunks by the
/// sha256 of their uncompressed bytes (`Chunk::raw_sha256`), so a change of
/// zstd costs a recompression, never a wrong reuse.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frames {
    /// `fastcdc-2020`: the only one this build knows.
    pub chunker: String,
    /// Bytes of uncompressed tar per chunk: minimum, average (the target),
    /// maximum. The maximum keeps every compressed chunk under the limit.
    pub min_size: u64,
    pub avg_size: u64,
    pub max_size: u64,
    /// The zstd library version that compressed (`zstd_safe::version_string`).
    pub zstd: String,
    /// The zstd compression level.
    pub level: i32,
    /// `window_log` when set explicitly (long-distance matching); absent
    /// when the level's default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_log: Option<u32>,
    /// Whether each frame carries zstd's content checksum.
    pub checksum: bool,
}

/// A file on the branch named by the key's entry, with its digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexFile {
    pub file: String,
    pub size: u64,
    pub sha256: String,
}

/// One chunk file of a key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    pub file: String,
    pub size: u64,
    pub sha256: String,
    /// Size of the chunk's uncompressed bytes (a slice of the tar) and
    /// their sha256: present exactly when the key has `frames`. The slice's
    /// offset in the tar is the sum of the earlier chunks' `raw_size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_sha256: Option<String>,
}

/// One pin of a cache key, as recorded on the branch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyPart {
    pub name: String,
    pub value: String,
}

impl BranchManifest {
    pub fn new() -> BranchManifest {
        BranchManifest {
            format: FORMAT_VERSION,
            keys: BTreeMap::new(),
        }
    }

    /// Parses `warmstart.json`, refusing unknown format versions.
    pub fn parse(text: &str) -> Result<BranchManifest> {
        #[derive(Deserialize)]
        struct Version {
            format: u32,
        }
        let v: Version = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("warmstart.json is not valid: {e}"))?;
        if v.format != FORMAT_VERSION {
            bail!(
                "warmstart.json has format {} but {} reads format {FORMAT_VERSION} only: upgrade to a warmstart that reads format {}",
                v.format,
                concat!("warmstart ", env!("CARGO_PKG_VERSION")),
                v.format
            );
        }
        let m: BranchManifest = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("warmstart.json is not valid: {e}"))?;
        for (key, entry) in &m.keys {
            entry.validate(key)?;
        }
        Ok(m)
    }

    /// Renders `warmstart.json` (pretty, trailing newline, stable order).
    pub fn render(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("manifest serializes");
        s.push('\n');
        s
    }

    /// The SHA256SUMS lines for every chunk of every key, sorted by file name.
    pub fn sums(&self) -> Vec<SumLine> {
        let mut lines: Vec<SumLine> = self
            .keys
            .values()
            .flat_map(|e| e.chunks.iter())
            .map(|c| SumLine {
                sha256: c.sha256.clone(),
                file: c.file.clone(),
            })
            .collect();
        lines.sort_by(|a, b| a.file.cmp(&b.file));
        lines
    }
}

impl Default for BranchManifest {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyEntry {
    /// Checks what a restorer relies on: safe chunk names, hex digests.
    pub fn validate(&self, key: &str) -> Result<()> {
        check_key(key)?;
        if self.chunks.is_empty() {
            bail!("key {key} lists no chunks");
        }
        for c in &self.chunks {
            check_file_name(&c.file)?;
            check_hex(&c.sha256, &c.file)?;
            if let Some(raw) = &c.raw_sha256 {
                check_hex(raw, &c.file)?;
            }
        }
        check_hex(&self.tar_sha256, &self.archive)?;
        if let Some(f) = &self.frames {
            if f.chunker != CHUNKER {
                bail!(
                    "key {key} was cut by chunker {:?} but {} knows only {CHUNKER}: upgrade to a warmstart that reads chunker {:?}",
                    f.chunker,
                    concat!("warmstart ", env!("CARGO_PKG_VERSION")),
                    f.chunker
                );
            }
            let raw: Option<u64> = self
                .chunks
                .iter()
                .map(|c| c.raw_sha256.as_ref().and(c.raw_size))
                .sum();
            if raw != Some(self.tar_size) {
                bail!(
                    "key {key} has frames but its chunks' raw_size and raw_sha256 do not cover the {} tar bytes",
                    self.tar_size
                );
            }
        } else if self
            .chunks
            .iter()
            .any(|c| c.raw_size.is_some() || c.raw_sha256.is_some())
        {
            bail!("key {key} gives chunks raw sizes but has no frames");
        }
        if let Some(i) = &self.index {
            check_file_name(&i.file)?;
            check_hex(&i.sha256, &i.file)?;
            if self.chunks.iter().any(|c| c.file == i.file) {
                bail!("key {key} names {} as both a chunk and its index", i.file);
            }
        }
        self.validate_index_parts(key)
    }

    /// The blobs on the branch that hold the index: its parts, else the
    /// whole file (none when the key has no index).
    pub fn index_files(&self) -> impl Iterator<Item = &IndexFile> {
        let whole = self.index.iter().filter(|_| self.index_parts.is_empty());
        whole.chain(self.index_parts.iter())
    }

    /// The parts of the index: safe names, hex digests, no name twice or
    /// shared with a chunk or the whole index, and sizes that add up to it.
    fn validate_index_parts(&self, key: &str) -> Result<()> {
        if self.index_parts.is_empty() {
            return Ok(());
        }
        let Some(i) = &self.index else {
            bail!("key {key} has index_parts but no index");
        };
        let mut names = std::collections::BTreeSet::new();
        names.insert(i.file.as_str());
        names.extend(self.chunks.iter().map(|c| c.file.as_str()));
        for p in &self.index_parts {
            check_file_name(&p.file)?;
            check_hex(&p.sha256, &p.file)?;
            if !names.insert(p.file.as_str()) {
                bail!("key {key} names {} twice", p.file);
            }
        }
        let sum = self
            .index_parts
            .iter()
            .try_fold(0u64, |n, p| n.checked_add(p.size));
        if sum != Some(i.size) {
            bail!(
                "key {key}: the parts of {} do not add up to its {} bytes",
                i.file,
                i.size
            );
        }
        Ok(())
    }
}

/// The name of chunk `index` of a key with `count` chunks:
/// `<key>.tar.zst.part000`. The number is zero-padded to the width of the
/// last index (at least 3 digits), so the names of one key sort in chunk
/// order as text for any count (`cat <key>.tar.zst.part*` in the coreutils
/// path relies on it).
pub fn chunk_name(key: &str, index: usize, count: usize) -> String {
    let width = count.saturating_sub(1).max(1).to_string().len().max(3);
    format!("{key}.tar.zst.part{index:0width$}")
}

/// The name of a key's per-file index on its branch.
pub fn index_name(key: &str) -> String {
    format!("{key}.files.zst")
}

/// The name of part `index` of a key's index in `count` parts:
/// `<key>.files.zst.part000`, numbered as `chunk_name` numbers chunks, so
/// that `cat <key>.files.zst.part* | zstd -d` is the index's text.
pub fn index_part_name(key: &str, index: usize, count: usize) -> String {
    let width = count.saturating_sub(1).max(1).to_string().len().max(3);
    format!("{}.part{index:0width$}", index_name(key))
}

/// The whole-archive name of a key: `<key>.tar.zst`.
pub fn archive_name(key: &str) -> String {
    format!("{key}.tar.zst")
}

/// Keys become file names on the branch: letters, digits, `.`, `_`, `+`, `-` only.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty()
        || key.starts_with('.')
        || !key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b))
    {
        bail!(
            "cache key {key:?} is not a safe file name (use letters, digits, '.', '_', '+', '-')"
        );
    }
    Ok(())
}

/// A file named on a branch must be a plain name in the branch's root.
pub fn check_file_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.contains('\n')
    {
        bail!("file name {name:?} on the branch is not a plain file name");
    }
    Ok(())
}

fn check_hex(hex: &str, what: &str) -> Result<()> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("sha256 of {what} is not 64 hex digits: {hex:?}");
    }
    Ok(())
}

/// One line of `SHA256SUMS`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SumLine {
    pub sha256: String,
    pub file: String,
}

/// Renders lines `sha256sum -c` accepts: `<hex>  <file>` (text mode).
pub fn render_sums(lines: &[SumLine]) -> String {
    lines
        .iter()
        .map(|l| format!("{}  {}\n", l.sha256, l.file))
        .collect()
}

/// Parses `SHA256SUMS` as written by us or by `sha256sum` (text `  ` or
/// binary ` *` separator). Lowercases the digests.
pub fn parse_sums(text: &str) -> Result<Vec<SumLine>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (hex, rest) = line
            .split_once(' ')
            .ok_or_else(|| anyhow::anyhow!("SHA256SUMS line {} has no file name", n + 1))?;
        let file = rest.strip_prefix(' ').or_else(|| rest.strip_prefix('*'));
        let Some(file) = file else {
            bail!("SHA256SUMS line {} is not `<sha256>  <file>`", n + 1);
        };
        check_hex(hex, file)?;
        check_file_name(file)?;
        out.push(SumLine {
            sha256: hex.to_ascii_lowercase(),
            file: file.to_string(),
        });
    }
    if out.is_empty() {
        bail!("SHA256SUMS is empty");
    }
    Ok(out)
}

/// How to read a branch: v1 (warmstart.json) or a legacy shell-recipe branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `warmstart.json` is present.
    V1,
    /// SHA256SUMS names one archive (`.tar.gz`, `.tgz`, `.tar.zst`): either
    /// absent from the tree, with `<archive>.partNN` pieces present whose
    /// concatenation is it (`parts` lists them in order), or stored whole
    /// (`parts` is just the archive).
    Legacy {
        archive: String,
        sha256: String,
        compression: Compression,
        parts: Vec<String>,
    },
}

/// Compression of a legacy archive, from its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Gzip,
    Zstd,
}

/// Decides the layout from the branch's file names and SHA256SUMS text.
pub fn detect_layout(files: &[String], sums: &str) -> Result<Layout> {
    if files.iter().any(|f| f == "warmstart.json") {
        return Ok(Layout::V1);
    }
    let lines = parse_sums(sums)?;
    let [line] = lines.as_slice() else {
        bail!(
            "branch has no warmstart.json and SHA256SUMS names more than one file: not a legacy cache"
        );
    };
    let compression = if line.file.ends_with(".gz") || line.file.ends_with(".tgz") {
        Compression::Gzip
    } else if line.file.ends_with(".zst") {
        Compression::Zstd
    } else {
        bail!("legacy archive {} is neither .gz nor .zst", line.file);
    };
    let prefix = format!("{}.part", line.file);
    if files.contains(&line.file) {
        // Shape (b): the archive is small enough to be stored whole, and
        // `sha256sum -c SHA256SUMS` works in the tree. Pieces beside it
        // would leave it unclear which one is the cache.
        if let Some(p) = files.iter().find(|f| f.starts_with(&prefix)) {
            bail!(
                "legacy branch holds both {} and a piece {p} of it: keep one shape",
                line.file
            );
        }
        return Ok(Layout::Legacy {
            archive: line.file.clone(),
            sha256: line.sha256.clone(),
            compression,
            parts: vec![line.file.clone()],
        });
    }
    let mut parts: Vec<String> = files
        .iter()
        .filter(|f| {
            f.strip_prefix(&prefix)
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .cloned()
        .collect();
    if parts.is_empty() {
        bail!(
            "legacy archive {} has no {prefix}NN pieces on the branch",
            line.file
        );
    }
    // Zero-padded numbers of equal width sort correctly as text; sort by
    // number so that mixed widths (part9, part10) do too.
    parts.sort_by_key(|p| p[prefix.len()..].parse::<u64>().unwrap_or(u64::MAX));
    Ok(Layout::Legacy {
        archive: line.file.clone(),
        sha256: line.sha256.clone(),
        compression,
        parts,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(key: &str) -> KeyEntry {
        KeyEntry {
            archive: archive_name(key),
            compression: "zstd".into(),
            chunks: vec![Chunk {
                file: chunk_name(key, 0, 1),
                size: 3,
                sha256: "a".repeat(64),
                raw_size: None,
                raw_sha256: None,
            }],
            tar_sha256: "b".repeat(64),
            tar_size: 10240,
            files: 1,
            key_parts: vec![KeyPart {
                name: "platform".into(),
                value: "x86_64-linux".into(),
            }],
            source_commit: None,
            source_tree: None,
            gates: serde_json::Value::Null,
            ungated: false,
            created_at: "2026-11-30T00:00:00Z".into(),
            tool_version: "warmstart 0.1.0".into(),
            frames: None,
            index: None,
            index_parts: Vec::new(),
        }
    }

    #[test]
    fn manifest_round_trips() {
        let mut m = BranchManifest::new();
        m.keys.insert("k1".into(), entry("k1"));
        let text = m.render();
        assert!(text.ends_with("}\n"));
        assert_eq!(BranchManifest::parse(&text).unwrap(), m);
    }

    #[test]
    fn unknown_format_is_refused() {
        let err = BranchManifest::parse(r#"{"format": 2, "keys": {}}"#).unwrap_err();
        assert!(err.to_string().contains("format 2"), "{err}");
    }

    #[test]
    fn hostile_chunk_name_is_refused() {
        let mut m = BranchManifest::new();
        let mut e = entry("k1");
        e.chunks[0].file = "../x".into();
        m.keys.insert("k1".into(), e);
        assert!(BranchManifest::parse(&m.render()).is_err());
    }

    #[test]
    fn sums_render_and_parse() {
        let lines = vec![SumLine {
            sha256: "0".repeat(64),
            file: "k.tar.zst.part000".into(),
        }];
        let text = render_sums(&lines);
        assert_eq!(text, format!("{}  k.tar.zst.part000\n", "0".repeat(64)));
        assert_eq!(parse_sums(&text).unwrap(), lines);
        let binary = format!("{} *k.tar.zst.part000\n", "0".repeat(64));
        assert_eq!(parse_sums(&binary).unwrap(), lines);
        assert!(parse_sums("nonsense\n").is_err());
        assert!(parse_sums(&format!("{}  ../etc/passwd\n", "0".repeat(64))).is_err());
    }

    #[test]
    fn legacy_layout_is_detected() {
        let files: Vec<String> = ["SHA256SUMS", "cache.tar.gz.part01", "cache.tar.gz.part00"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let sums = format!("{}  cache.tar.gz\n", "c".repeat(64));
        match detect_layout(&files, &sums).unwrap() {
            Layout::Legacy {
                archive,
                compression,
                parts,
                ..
            } => {
                assert_eq!(archive, "cache.tar.gz");
                assert_eq!(compression, Compression::Gzip);
                assert_eq!(parts, ["cache.tar.gz.part00", "cache.tar.gz.part01"]);
            }
            other => panic!("{other:?}"),
        }
        // Stored whole: the archive itself is the one part.
        let whole: Vec<String> = vec!["SHA256SUMS".into(), "checked-ab-fstar2.tar.gz".into()];
        let sums_whole = format!("{}  checked-ab-fstar2.tar.gz\n", "d".repeat(64));
        match detect_layout(&whole, &sums_whole).unwrap() {
            Layout::Legacy {
                archive,
                parts,
                compression,
                ..
            } => {
                assert_eq!(archive, "checked-ab-fstar2.tar.gz");
                assert_eq!(parts, std::slice::from_ref(&archive));
                assert_eq!(compression, Compression::Gzip);
            }
            other => panic!("{other:?}"),
        }
        // Both shapes at once, or a name that is no archive: refused.
        let mut both = whole.clone();
        both.push("checked-ab-fstar2.tar.gz.part00".into());
        let e = detect_layout(&both, &sums_whole).unwrap_err();
        assert!(e.to_string().contains("keep one shape"), "{e}");
        let plain: Vec<String> = vec!["SHA256SUMS".into(), "notes.txt".into()];
        let sums_plain = format!("{}  notes.txt\n", "d".repeat(64));
        assert!(detect_layout(&plain, &sums_plain).is_err());
        let v1: Vec<String> = vec!["warmstart.json".into(), "SHA256SUMS".into()];
        assert_eq!(detect_layout(&v1, "").unwrap(), Layout::V1);
    }

    #[test]
    fn keys_must_be_safe_names() {
        assert!(check_key("rust-1.95.0-x86_64-linux").is_ok());
        assert!(check_key("a/b").is_err());
        assert!(check_key(".hidden").is_err());
        assert!(check_key("").is_err());
    }

    #[test]
    fn chunk_names_sort_in_order_for_any_count() {
        for count in [1usize, 2, 999, 1000, 1001, 12_345] {
            let names: Vec<String> = (0..count).map(|i| chunk_name("k", i, count)).collect();
            let mut sorted = names.clone();
            sorted.sort();
            assert_eq!(sorted, names, "count {count}");
        }
        assert_eq!(chunk_name("k", 7, 3), "k.tar.zst.part007");
        assert_eq!(chunk_name("k", 7, 1400), "k.tar.zst.part0007");
    }

    fn framed(key: &str) -> KeyEntry {
        let mut e = entry(key);
        e.chunks[0].raw_size = Some(e.tar_size);
        e.chunks[0].raw_sha256 = Some("c".repeat(64));
        e.frames = Some(Frames {
            chunker: CHUNKER.into(),
            min_size: 1 << 20,
            avg_size: 4 << 20,
            max_size: 16 << 20,
            zstd: "1.5.7".into(),
            level: 3,
            window_log: None,
            checksum: true,
        });
        e
    }

    #[test]
    fn index_parts_are_additive_and_checked() {
        let part = |file: &str, size| IndexFile {
            file: file.into(),
            size,
            sha256: "a".repeat(64),
        };
        let parted = || {
            let mut e = framed("k");
            e.index = Some(part("k.files.zst", 30));
            e.index_parts = vec![
                part("k.files.zst.part000", 10),
                part("k.files.zst.part001", 20),
            ];
            e
        };
        let mut m = BranchManifest::new();
        m.keys.insert("k".into(), parted());
        assert_eq!(BranchManifest::parse(&m.render()).unwrap(), m);
        assert_eq!(
            parted()
                .index_files()
                .map(|i| i.file.as_str())
                .collect::<Vec<_>>(),
            ["k.files.zst.part000", "k.files.zst.part001"]
        );
        assert!(
            !serde_json::to_string(&framed("k"))
                .unwrap()
                .contains("index_parts")
        );
        type Edit = dyn Fn(&mut KeyEntry);
        let cases: [(&Edit, &str); 6] = [
            (&|e| e.index = None, "no index"),
            (&|e| e.index_parts[1].size = 21, "do not add up"),
            (&|e| e.index_parts[1].size = u64::MAX, "do not add up"),
            (
                &|e| e.index_parts[1].file = "k.files.zst.part000".into(),
                "twice",
            ),
            (
                &|e| e.index_parts[0].file = e.chunks[0].file.clone(),
                "twice",
            ),
            (&|e| e.index_parts[0].file = "../x".into(), "plain"),
        ];
        for (f, what) in cases {
            let mut e = parted();
            f(&mut e);
            let err = format!("{:#}", e.validate("k").unwrap_err());
            assert!(err.contains(what), "{what}: {err}");
        }
    }

    #[test]
    fn frames_are_additive_and_checked() {
        let mut m = BranchManifest::new();
        m.keys.insert("k".into(), framed("k"));
        let text = m.render();
        assert_eq!(BranchManifest::parse(&text).unwrap(), m);
        // An entry without the new fields renders as before: no nulls.
        let mut old = BranchManifest::new();
        old.keys.insert("k".into(), entry("k"));
        assert!(!old.render().contains("frames") && !old.render().contains("raw_"));

        let refuse = |f: &dyn Fn(&mut KeyEntry), what: &str| {
            let mut e = framed("k");
            f(&mut e);
            let err = format!("{:#}", e.validate("k").unwrap_err());
            assert!(err.contains(what), "{err}");
            assert!(!err.contains('\n'), "{err}");
        };
        refuse(
            &|e| e.frames.as_mut().unwrap().chunker = "rabin-9".into(),
            "upgrade to a warmstart that reads chunker \"rabin-9\"",
        );
        refuse(&|e| e.chunks[0].raw_size = Some(1), "do not cover");
        refuse(&|e| e.chunks[0].raw_sha256 = None, "do not cover");
        refuse(&|e| e.frames = None, "has no frames");
        refuse(
            &|e| e.chunks[0].raw_sha256 = Some("x".into()),
            "64 hex digits",
        );
    }

    #[test]
    fn an_unknown_format_names_the_format_it_needs() {
        let err = BranchManifest::parse(r#"{"format": 2, "keys": {}}"#).unwrap_err();
        let err = format!("{err:#}");
        assert!(
            err.contains("upgrade to a warmstart that reads format 2"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }
}
