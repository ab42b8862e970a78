//! The conda package formats, as pure parsers over bytes: `info/index.json`,
//! `info/paths.json`, `info/has_prefix`, `.conda` member names, the zip end
//! of central directory and its file names (to catch duplicate members,
//! which the zip crate silently merges), and zstd frame headers (to name the
//! window a frame needs before decoding it).
//!
//! Nothing here touches the disk or decodes archives; `package.rs` does.

use serde::{Deserialize, Serialize};

/// The placeholder conda uses when `info/has_prefix` names only a path.
pub const LEGACY_PLACEHOLDER: &str = "/opt/anaconda1anaconda2anaconda3";

/// `.conda` format version this reader understands (`metadata.json`).
pub const CONDA_FORMAT_VERSION: u64 = 2;

/// `info/index.json`: who the package is. Other fields are kept for `--json`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Index {
    pub name: String,
    pub version: String,
    pub build: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_number: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subdir: Option<String>,
}

pub fn parse_index(bytes: &[u8]) -> Result<Index, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("info/index.json is not valid: {e}"))
}

/// How a placeholder is rewritten.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileMode {
    /// Every occurrence replaced by the new prefix; the file may change size.
    Text,
    /// Each C string holding the placeholder is rewritten in place and padded
    /// with NULs, so the file keeps its size and offsets.
    Binary,
}

/// One file that carries a prefix placeholder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Placeholder {
    pub path: String,
    pub placeholder: String,
    pub mode: FileMode,
}

/// What `info/paths.json` says about the package.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Paths {
    pub count: u64,
    /// Sum of `size_in_bytes`, when the entries give it.
    pub bytes: Option<u64>,
    pub placeholders: Vec<Placeholder>,
}

#[derive(Deserialize)]
struct PathsJson {
    paths: Vec<PathEntry>,
}

#[derive(Deserialize)]
struct PathEntry {
    #[serde(rename = "_path")]
    path: String,
    #[serde(default)]
    prefix_placeholder: Option<String>,
    #[serde(default)]
    file_mode: Option<FileMode>,
    #[serde(default)]
    size_in_bytes: Option<u64>,
}

pub fn parse_paths_json(bytes: &[u8]) -> Result<Paths, String> {
    let parsed: PathsJson =
        serde_json::from_slice(bytes).map_err(|e| format!("info/paths.json is not valid: {e}"))?;
    let mut out = Paths::default();
    for entry in parsed.paths {
        out.count += 1;
        if let Some(size) = entry.size_in_bytes {
            out.bytes = Some(out.bytes.unwrap_or(0) + size);
        }
        if let Some(placeholder) = entry.prefix_placeholder {
            if placeholder.is_empty() {
                return Err(format!(
                    "info/paths.json gives `{}` an empty prefix_placeholder",
                    entry.path
                ));
            }
            out.placeholders.push(Placeholder {
                path: entry.path,
                placeholder,
                // conda's default when a placeholder has no mode.
                mode: entry.file_mode.unwrap_or(FileMode::Text),
            });
        }
    }
    Ok(out)
}

/// `info/has_prefix`: one file per line, either `path` (the legacy
/// placeholder, text mode) or `placeholder mode path`; fields may be quoted.
pub fn parse_has_prefix(text: &str) -> Result<Vec<Placeholder>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields = split_quoted(line);
        let (placeholder, mode, path) = match fields.as_slice() {
            [path] => (LEGACY_PLACEHOLDER.to_string(), FileMode::Text, path.clone()),
            [placeholder, mode, path] => {
                let mode = match mode.as_str() {
                    "text" => FileMode::Text,
                    "binary" => FileMode::Binary,
                    other => {
                        return Err(format!(
                            "info/has_prefix line {}: unknown mode `{other}` (expected text or binary)",
                            n + 1
                        ));
                    }
                };
                (placeholder.clone(), mode, path.clone())
            }
            _ => {
                return Err(format!(
                    "info/has_prefix line {}: expected `path` or `placeholder mode path`, got `{line}`",
                    n + 1
                ));
            }
        };
        if placeholder.is_empty() {
            return Err(format!("info/has_prefix line {}: empty placeholder", n + 1));
        }
        out.push(Placeholder {
            path,
            placeholder,
            mode,
        });
    }
    Ok(out)
}

/// Splits on whitespace, keeping quoted runs together and dropping the
/// quotes (conda reads the file with `shlex.split(posix=False)`).
fn split_quoted(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None if c == '"' || c == '\'' => {
                quote = Some(c);
                any = true;
            }
            None if c.is_whitespace() => {
                if any || !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                    any = false;
                }
            }
            None => cur.push(c),
        }
    }
    if any || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// What a `.conda` member is, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberKind {
    Metadata,
    Info,
    Pkg,
    Other,
}

/// Checks a `.conda` member name (a plain file name: no directories, no
/// `..`) and says what it is.
pub fn classify_member(name: &[u8]) -> Result<MemberKind, String> {
    let shown = String::from_utf8_lossy(name);
    if name.is_empty() {
        return Err("a zip member has an empty name".into());
    }
    if name.split(|&b| b == b'/' || b == b'\\').any(|c| c == b"..") {
        return Err(format!(
            "zip member `{shown}` contains `..`; .conda members are plain file names"
        ));
    }
    if name.contains(&b'/') || name.contains(&b'\\') || name.contains(&0) {
        return Err(format!(
            "zip member `{shown}` is a path; .conda members are plain file names"
        ));
    }
    Ok(if name == b"metadata.json" {
        MemberKind::Metadata
    } else if name.starts_with(b"info-") && name.ends_with(b".tar.zst") {
        MemberKind::Info
    } else if name.starts_with(b"pkg-") && name.ends_with(b".tar.zst") {
        MemberKind::Pkg
    } else {
        MemberKind::Other
    })
}

/// `metadata.json` of a `.conda`: the format version.
pub fn parse_metadata(bytes: &[u8]) -> Result<u64, String> {
    #[derive(Deserialize)]
    struct Meta {
        conda_pkg_format_version: u64,
    }
    serde_json::from_slice::<Meta>(bytes)
        .map(|m| m.conda_pkg_format_version)
        .map_err(|e| format!("metadata.json is not valid: {e}"))
}

/// Where the central directory is, from the end of a zip file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Eocd {
    pub entries: u64,
    pub cd_size: u64,
    pub cd_offset: u64,
    /// Offset (within the tail given) of the EOCD record, so the caller
    /// can look for a zip64 locator just before it.
    pub at: usize,
    /// True when a field is saturated and the zip64 record must be read.
    pub needs_zip64: bool,
}

const EOCD_SIG: [u8; 4] = [0x50, 0x4b, 0x05, 0x06];
const ZIP64_LOCATOR_SIG: [u8; 4] = [0x50, 0x4b, 0x06, 0x07];
const ZIP64_EOCD_SIG: [u8; 4] = [0x50, 0x4b, 0x06, 0x06];
const CD_SIG: [u8; 4] = [0x50, 0x4b, 0x01, 0x02];

fn u16_at(b: &[u8], at: usize) -> u64 {
    u16::from_le_bytes([b[at], b[at + 1]]) as u64
}
fn u32_at(b: &[u8], at: usize) -> u64 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap()) as u64
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Finds the end-of-central-directory record in the last bytes of a file
/// (at most 65557: the record plus the longest comment).
pub fn parse_eocd(tail: &[u8]) -> Result<Eocd, String> {
    if tail.len() < 22 {
        return Err(
            "too short to be a zip file: it is truncated (an interrupted download?) or not a .conda; download it again"
                .into(),
        );
    }
    let at = (0..=tail.len() - 22)
        .rev()
        .find(|&i| tail[i..i + 4] == EOCD_SIG)
        .ok_or(
            "no zip end-of-central-directory record: the file is truncated (an interrupted download?) or not a .conda; download it again",
        )?;
    let r = &tail[at..];
    let entries = u16_at(r, 10);
    let cd_size = u32_at(r, 12);
    let cd_offset = u32_at(r, 16);
    Ok(Eocd {
        entries,
        cd_size,
        cd_offset,
        at,
        needs_zip64: entries == 0xffff || cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff,
    })
}

/// From the 20-byte zip64 locator (just before the EOCD), the offset of the
/// zip64 end-of-central-directory record.
pub fn parse_zip64_locator(b: &[u8]) -> Result<u64, String> {
    if b.len() < 20 || b[..4] != ZIP64_LOCATOR_SIG {
        return Err("zip64 fields are saturated but there is no zip64 locator".into());
    }
    Ok(u64_at(b, 8))
}

/// The zip64 end-of-central-directory record (56 bytes at least).
pub fn parse_zip64_eocd(b: &[u8]) -> Result<(u64, u64, u64), String> {
    if b.len() < 56 || b[..4] != ZIP64_EOCD_SIG {
        return Err("the zip64 locator points at no zip64 end-of-central-directory record".into());
    }
    Ok((u64_at(b, 32), u64_at(b, 40), u64_at(b, 48)))
}

/// The file names of every central-directory record, in order.
pub fn central_directory_names(cd: &[u8], entries: u64) -> Result<Vec<Vec<u8>>, String> {
    let mut names = Vec::new();
    let mut at = 0usize;
    for n in 0..entries {
        if cd.len() < at + 46 || cd[at..at + 4] != CD_SIG {
            return Err(format!("central directory record {n} is malformed"));
        }
        let name_len = u16_at(cd, at + 28) as usize;
        let extra_len = u16_at(cd, at + 30) as usize;
        let comment_len = u16_at(cd, at + 32) as usize;
        let end = at + 46 + name_len;
        if cd.len() < end + extra_len + comment_len {
            return Err(format!("central directory record {n} is truncated"));
        }
        names.push(cd[at + 46..end].to_vec());
        at = end + extra_len + comment_len;
    }
    Ok(names)
}

/// The first name that occurs twice, if any.
pub fn first_duplicate(names: &[Vec<u8>]) -> Option<&[u8]> {
    let mut seen = std::collections::HashSet::new();
    names
        .iter()
        .find(|n| !seen.insert(n.as_slice()))
        .map(|n| n.as_slice())
}

/// The window a zstd frame declares (bytes), from its first bytes (18 are
/// always enough). `None` for skippable frames or too few bytes.
pub fn zstd_window(header: &[u8]) -> Option<u64> {
    if header.len() < 6 || header[..4] != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let fhd = header[4];
    let single_segment = fhd & 0x20 != 0;
    if !single_segment {
        let wd = header[5];
        let exponent = (wd >> 3) as u32;
        let mantissa = (wd & 7) as u64;
        let base = 1u64 << (10 + exponent);
        return Some(base + (base / 8) * mantissa);
    }
    // Single segment: the window is the content size.
    let dict_len = [0usize, 1, 2, 4][(fhd & 3) as usize];
    let fcs_len = [1usize, 2, 4, 8][(fhd >> 6) as usize];
    let at = 5 + dict_len;
    let f = header.get(at..at + fcs_len)?;
    Some(match fcs_len {
        1 => f[0] as u64,
        2 => u16::from_le_bytes([f[0], f[1]]) as u64 + 256,
        4 => u32::from_le_bytes(f.try_into().ok()?) as u64,
        _ => u64::from_le_bytes(f.try_into().ok()?),
    })
}

/// log2 of the smallest power of two at least `window` (for messages).
pub fn window_log(window: u64) -> u32 {
    window.max(1).next_power_of_two().trailing_zeros()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_json_lists_placeholders_with_modes() {
        let json = br#"{"paths": [
            {"_path": "bin/a", "path_type": "hardlink", "prefix_placeholder": "/opt/p", "file_mode": "text", "size_in_bytes": 10},
            {"_path": "lib/b.so", "prefix_placeholder": "/opt/p", "file_mode": "binary", "size_in_bytes": 5},
            {"_path": "lib/c.so", "path_type": "softlink"},
            {"_path": "share/d", "prefix_placeholder": "/opt/p"}
        ], "paths_version": 1}"#;
        let p = parse_paths_json(json).unwrap();
        assert_eq!((p.count, p.bytes), (4, Some(15)));
        let modes: Vec<_> = p
            .placeholders
            .iter()
            .map(|x| (x.path.as_str(), x.mode))
            .collect();
        assert_eq!(
            modes,
            [
                ("bin/a", FileMode::Text),
                ("lib/b.so", FileMode::Binary),
                ("share/d", FileMode::Text)
            ]
        );
        assert!(parse_paths_json(b"{").unwrap_err().contains("paths.json"));
    }

    #[test]
    fn has_prefix_both_shapes_and_quotes() {
        let text =
            "bin/old-style\n/opt/p binary lib/x.so\n\"/opt/with space\" text \"etc/a b.conf\"\n\n";
        let p = parse_has_prefix(text).unwrap();
        assert_eq!(p[0].placeholder, LEGACY_PLACEHOLDER);
        assert_eq!(
            (p[0].mode, p[0].path.as_str()),
            (FileMode::Text, "bin/old-style")
        );
        assert_eq!(
            (p[1].mode, p[1].path.as_str()),
            (FileMode::Binary, "lib/x.so")
        );
        assert_eq!(p[2].placeholder, "/opt/with space");
        assert_eq!(p[2].path, "etc/a b.conf");
        assert!(parse_has_prefix("a b\n").unwrap_err().contains("line 1"));
        assert!(
            parse_has_prefix("/p weird x\n")
                .unwrap_err()
                .contains("unknown mode")
        );
    }

    #[test]
    fn member_names_are_plain() {
        assert_eq!(
            classify_member(b"metadata.json").unwrap(),
            MemberKind::Metadata
        );
        assert_eq!(
            classify_member(b"pkg-a-1-0.tar.zst").unwrap(),
            MemberKind::Pkg
        );
        assert_eq!(
            classify_member(b"info-a-1-0.tar.zst").unwrap(),
            MemberKind::Info
        );
        assert_eq!(classify_member(b"README").unwrap(), MemberKind::Other);
        assert!(
            classify_member(b"../pkg-a.tar.zst")
                .unwrap_err()
                .contains("`..`")
        );
        assert!(
            classify_member(b"sub/pkg-a.tar.zst")
                .unwrap_err()
                .contains("path")
        );
        assert!(classify_member(b"/abs").unwrap_err().contains("path"));
    }

    #[test]
    fn zstd_window_from_frame_headers() {
        // Window descriptor 0x88: exponent 17 -> 2^27, mantissa 0.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x88]),
            Some(1 << 27)
        );
        // 0xa0: exponent 20 -> 2^30.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xa0]),
            Some(1 << 30)
        );
        // Mantissa 4 adds half: 2^10 + 2^9.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x04]),
            Some(1536)
        );
        // Single segment, 2-byte content size 0x0100 + 256.
        assert_eq!(
            zstd_window(&[0x28, 0xb5, 0x2f, 0xfd, 0x60, 0x00, 0x01]),
            Some(512)
        );
        assert_eq!(zstd_window(b"PK\x03\x04xx"), None);
        assert_eq!(window_log(1 << 27), 27);
        assert_eq!(window_log(1536), 11);
    }

    #[test]
    fn eocd_and_central_directory_names() {
        // A minimal zip: two central records named "a" and "a", then EOCD.
        let mut cd = Vec::new();
        for name in [b"a", b"a"] {
            let mut rec = vec![0u8; 46];
            rec[..4].copy_from_slice(&CD_SIG);
            rec[28] = 1;
            cd.extend_from_slice(&rec);
            cd.extend_from_slice(name);
        }
        let mut eocd = vec![0u8; 22];
        eocd[..4].copy_from_slice(&EOCD_SIG);
        eocd[10] = 2;
        eocd[12] = cd.len() as u8;
        let mut tail = b"junk".to_vec();
        tail.extend_from_slice(&eocd);
        let e = parse_eocd(&tail).unwrap();
        assert_eq!(
            (e.entries, e.cd_size, e.at, e.needs_zip64),
            (2, 94, 4, false)
        );
        let names = central_directory_names(&cd, 2).unwrap();
        assert_eq!(first_duplicate(&names), Some(&b"a"[..]));
        assert!(central_directory_names(&cd[..50], 2).is_err());
        assert!(parse_eocd(b"not a zip at all, really not").is_err());
    }
}
