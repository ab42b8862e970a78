//! The per-file index of a key's tar: `<key>.files.zst` on its branch.
//!
//! One line per tar entry, in tar order: where the entry's bytes lie in the
//! uncompressed tar (its first header block, GNU long-name records included,
//! to the end of its data padding), what it is, and for a regular file the
//! sha256 of its content. A restore of a new key into a target that holds
//! an older one compares the two indexes: a file whose digest did not change
//! (and whose stat still matches what the install recorded) is linked from
//! the installed tree instead of written, and only the chunks that hold what
//! changed are decoded. Pure text and data: this module never touches git,
//! a file or a process.
//!
//! ```text
//! warmstart-files 1
//! <offset> <end> <kind> <mode> <size> <sha256|-> <path>[ <target>]
//! ```
//! `kind` is `d`, `f`, `l` (symlink) or `h` (hardlink; `target` is the path
//! of the earlier entry). `mode` is octal permission bits, `size` the data
//! size (0 but for `f`). Paths and targets are the tar's bytes, with every
//! byte outside `!`..`~` and `%` itself written `%XX` (hex), so any name
//! fits on one line. Offsets strictly increase and entries do not overlap.
//!
//! On the branch the text is cut into parts (`parts`) at content-defined
//! boundaries, each part one zstd frame: an edit of a few lines changes the
//! parts that hold them, and the others are the same bytes, and so the same
//! blobs, as the previous key's.

use anyhow::{Result, bail};

use crate::cache::format::chunk_sizes::Sizes;

/// The first line of every index this build writes and reads.
pub const MAGIC: &str = "warmstart-files 1";

/// What kind of tar entry a line describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Hardlink,
}

impl Kind {
    fn letter(self) -> char {
        match self {
            Kind::Dir => 'd',
            Kind::File => 'f',
            Kind::Symlink => 'l',
            Kind::Hardlink => 'h',
        }
    }

    fn from_letter(s: &str) -> Option<Kind> {
        Some(match s {
            "d" => Kind::Dir,
            "f" => Kind::File,
            "l" => Kind::Symlink,
            "h" => Kind::Hardlink,
            _ => return None,
        })
    }
}

/// One tar entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Offset in the uncompressed tar of the entry's first header block.
    pub offset: u64,
    /// Offset just past its data padding (the next entry's `offset`).
    pub end: u64,
    pub kind: Kind,
    /// Permission bits.
    pub mode: u32,
    /// Data size: the file's length for `File`, else 0.
    pub size: u64,
    /// sha256 of the content, for `File` only.
    pub sha256: Option<[u8; 32]>,
    /// The path as the tar names it (no trailing `/` for directories).
    pub path: Vec<u8>,
    /// The link target for `Symlink` and `Hardlink`.
    pub target: Option<Vec<u8>>,
}

/// A key's index: its entries in tar order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Index {
    pub entries: Vec<Entry>,
}

/// The average part of the index text. A 1% edit of 24,000 files in three
/// runs of the path order changed 3 of 84 parts, 5.2% of the index's bytes
/// (tests/it/cache_files_parts.rs); smaller parts cost more entries in
/// `warmstart.json`, which is sent whole with every key.
pub const PART_AVG: u64 = 32 << 10;

/// The lengths of the parts `text` is cut into: FastCDC (the 2020 variant,
/// as the tar's chunks) with an average of `PART_AVG` bytes, so that a cut
/// depends only on the bytes around it. Empty text is one empty part.
pub fn parts(text: &[u8]) -> Vec<usize> {
    let s = Sizes::from_avg(PART_AVG);
    let (min, avg, max) = (s.min as usize, s.avg as usize, s.max as usize);
    let cuts: Vec<usize> = fastcdc::v2020::FastCDC::new(text, min, avg, max)
        .map(|c| c.length)
        .collect();
    if cuts.is_empty() { vec![0] } else { cuts }
}

fn escape(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        if (b'!'..=b'~').contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
}

fn unescape(text: &str, line: usize) -> Result<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            let Some(b) = hex else {
                bail!("index line {line}: a bad %-escape in {text:?}");
            };
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    if out.is_empty() {
        bail!("index line {line}: an empty path");
    }
    Ok(out)
}

fn hex32(text: &str, line: usize) -> Result<[u8; 32]> {
    let mut out = [0u8; 32];
    if text.len() != 64 {
        bail!("index line {line}: sha256 is not 64 hex digits");
    }
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16)
            .map_err(|_| anyhow::anyhow!("index line {line}: sha256 is not hex"))?;
    }
    Ok(out)
}

impl Index {
    /// The index as text (see the module comment), ending in a newline.
    pub fn render(&self) -> String {
        let mut s = String::with_capacity(64 + self.entries.len() * 120);
        s.push_str(MAGIC);
        s.push('\n');
        for e in &self.entries {
            s.push_str(&format!(
                "{} {} {} {:o} {} ",
                e.offset,
                e.end,
                e.kind.letter(),
                e.mode,
                e.size
            ));
            match &e.sha256 {
                Some(d) => d.iter().for_each(|b| s.push_str(&format!("{b:02x}"))),
                None => s.push('-'),
            }
            s.push(' ');
            escape(&e.path, &mut s);
            if let Some(t) = &e.target {
                s.push(' ');
                escape(t, &mut s);
            }
            s.push('\n');
        }
        s
    }

    /// Parses an index, refusing anything `render` would not have written:
    /// a restore decides from it which bytes it may skip.
    pub fn parse(text: &str) -> Result<Index> {
        let mut lines = text.split_terminator('\n');
        match lines.next() {
            Some(MAGIC) => {}
            Some(other)
                if other
                    .strip_prefix("warmstart-files ")
                    .is_some_and(|v| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit())) =>
            {
                bail!(
                    "the file index is version {} but {} reads version 1 only: upgrade to a warmstart that reads file index version {}",
                    &other["warmstart-files ".len()..],
                    concat!("warmstart ", env!("CARGO_PKG_VERSION")),
                    &other["warmstart-files ".len()..]
                )
            }
            _ => bail!("the file index does not start with {MAGIC:?}"),
        }
        let mut entries: Vec<Entry> = Vec::new();
        for (n, line) in lines.enumerate() {
            let entry = parse_line(line, n + 2)?;
            if let Some(prev) = entries.last()
                && entry.offset != prev.end
            {
                bail!(
                    "index line {}: entry starts at {} but the one before ends at {}",
                    n + 2,
                    entry.offset,
                    prev.end
                );
            }
            entries.push(entry);
        }
        Ok(Index { entries })
    }
}

fn parse_line(line: &str, n: usize) -> Result<Entry> {
    let f: Vec<&str> = line.split(' ').collect();
    if f.len() != 7 && f.len() != 8 {
        bail!("index line {n}: expected 7 or 8 fields, found {}", f.len());
    }
    let num = |s: &str, what: &str| -> Result<u64> {
        if s.is_empty()
            || !s.bytes().all(|b| b.is_ascii_digit())
            || (s.len() > 1 && s.starts_with('0'))
        {
            bail!("index line {n}: {what} {s:?} is not a number");
        }
        s.parse::<u64>()
            .map_err(|_| anyhow::anyhow!("index line {n}: {what} {s:?} is too large"))
    };
    let offset = num(f[0], "offset")?;
    let end = num(f[1], "end")?;
    let Some(kind) = Kind::from_letter(f[2]) else {
        bail!("index line {n}: unknown kind {:?}", f[2]);
    };
    let mode = u32::from_str_radix(f[3], 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| anyhow::anyhow!("index line {n}: mode {:?} is not octal bits", f[3]))?;
    let size = num(f[4], "size")?;
    let sha256 = match (kind, f[5]) {
        (Kind::File, d) => Some(hex32(d, n)?),
        (_, "-") => None,
        _ => bail!("index line {n}: only a regular file has a sha256"),
    };
    if kind != Kind::File && size != 0 {
        bail!("index line {n}: only a regular file has a size");
    }
    let path = unescape(f[6], n)?;
    let target = f.get(7).map(|t| unescape(t, n)).transpose()?;
    if matches!(kind, Kind::Symlink | Kind::Hardlink) != target.is_some() {
        bail!("index line {n}: a link needs a target, and only a link has one");
    }
    // The data is padded to 512-byte blocks after at least one header block.
    if end < offset.saturating_add(512).saturating_add(size) || (end - offset) % 512 != 0 {
        bail!("index line {n}: entry bytes {offset}..{end} cannot hold {size} bytes of data");
    }
    Ok(Entry {
        offset,
        end,
        kind,
        mode,
        size,
        sha256,
        path,
        target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Index {
        Index {
            entries: vec![
                Entry {
                    offset: 0,
                    end: 512,
                    kind: Kind::Dir,
                    mode: 0o755,
                    size: 0,
                    sha256: None,
                    path: b"bin".to_vec(),
                    target: None,
                },
                Entry {
                    offset: 512,
                    end: 2048,
                    kind: Kind::File,
                    mode: 0o644,
                    size: 1000,
                    sha256: Some([0xab; 32]),
                    path: b"bin/a file%\n\xff".to_vec(),
                    target: None,
                },
                Entry {
                    offset: 2048,
                    end: 2560,
                    kind: Kind::Symlink,
                    mode: 0o777,
                    size: 0,
                    sha256: None,
                    path: b"bin/l".to_vec(),
                    target: Some(b"a file%\n\xff".to_vec()),
                },
            ],
        }
    }

    #[test]
    fn round_trips_any_bytes_in_names() {
        let text = sample().render();
        assert!(text.starts_with("warmstart-files 1\n"));
        assert!(text.contains("bin/a%20file%25%0A%FF"), "{text}");
        assert_eq!(Index::parse(&text).unwrap(), sample());
    }

    #[test]
    fn refuses_what_render_would_not_write() {
        let good = sample().render();
        let cases = [
            good.replacen("warmstart-files 1", "warmstart-files 2", 1),
            good.replacen("512 2048 f", "512 2049 f", 1),
            good.replacen("512 2048 f", "600 2048 f", 1),
            good.replacen(" f 644 1000", " f 644 2000", 1),
            good.replacen(" f 644", " x 644", 1),
            good.replacen(" f 644", " f 999", 1),
            good.replacen("0 512 d 755 0 -", "0 512 d 755 0 ab", 1),
            good.replacen("bin/l a%20file", "bin/l", 1),
            good.replacen("%FF\n2048", "%F\n2048", 1),
            good.replacen("512 2048", "0512 2048", 1),
        ];
        for (i, bad) in cases.iter().enumerate() {
            assert_ne!(bad, &good, "case {i} changed nothing");
            assert!(Index::parse(bad).is_err(), "case {i} parsed:\n{bad}");
        }
    }

    #[test]
    fn parts_cover_the_text_and_an_edit_changes_only_the_parts_near_it() {
        let mut rng = crate::test_rng::Rng(7);
        let mut text = Vec::new();
        while text.len() < 1 << 20 {
            let line = format!("{} f 644 {:x}\n", text.len(), rng.next());
            text.extend_from_slice(line.as_bytes());
        }
        let lens = parts(&text);
        assert_eq!(lens.iter().sum::<usize>(), text.len());
        assert!(lens.len() > 8 && lens.iter().all(|&n| n as u64 <= 4 * PART_AVG));
        let pieces = |t: &[u8]| -> Vec<Vec<u8>> {
            let mut at = 0;
            parts(t)
                .into_iter()
                .map(|n| {
                    at += n;
                    t[at - n..at].to_vec()
                })
                .collect()
        };
        let before = pieces(&text);
        let mut edited = text.clone();
        let mid = edited.len() / 2;
        edited[mid..mid + 40].fill(b'z');
        let after = pieces(&edited);
        let new = after.iter().filter(|p| !before.contains(p)).count();
        assert!(
            (1..=3).contains(&new),
            "{new} of {} parts changed",
            after.len()
        );
        assert_eq!(parts(b""), [0]);
    }

    #[test]
    fn an_unknown_version_names_the_version_it_needs() {
        let text = sample()
            .render()
            .replacen("warmstart-files 1", "warmstart-files 7", 1);
        let err = format!("{:#}", Index::parse(&text).unwrap_err());
        assert!(
            err.contains("the file index is version 7 but warmstart ")
                && err.ends_with("upgrade to a warmstart that reads file index version 7"),
            "{err}"
        );
        assert!(!err.contains('\n'));
    }
}
