//! Opening conda packages and streaming their tarballs: the `.conda` zip
//! read through its central directory (STORED members only, duplicates and
//! path-like names refused), inner zstd streams with a capped window, and
//! legacy `.tar.bz2` packages.
//!
//! Everything here hands out `Read` streams; checks on what the tarballs
//! contain are `unpack::extract_tar_select`'s job.

use anyhow::{Context, Result};
use std::cell::Cell;
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use super::format::{self, MemberKind};
use crate::exit::{Code, fail};

/// Largest zstd window decoded: 2^27 bytes (128 MiB), zstd's own default
/// limit and what conda-forge packages use at most (`--long` up to 27).
pub const MAX_WINDOW_LOG: u32 = 27;

/// More members than this is not a conda package (real ones have three).
const MAX_MEMBERS: u64 = 64;

/// Largest `metadata.json` read.
const MAX_METADATA: u64 = 64 << 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Format {
    #[serde(rename = "conda")]
    Conda,
    #[serde(rename = "tar.bz2")]
    TarBz2,
}

/// Tells the format from the first bytes, not the file name.
pub fn detect(path: &Path) -> Result<Format> {
    let mut file = open(path)?;
    let mut magic = [0u8; 4];
    let n =
        read_up_to(&mut file, &mut magic).with_context(|| format!("reading {}", path.display()))?;
    match &magic[..n] {
        [b'P', b'K', 3, 4] | [b'P', b'K', 5, 6] => Ok(Format::Conda),
        [b'B', b'Z', b'h', _] => Ok(Format::TarBz2),
        // Fewer than 4 bytes that start like a package: a cut download.
        short if n < 4 && (b"PK\x03\x04".starts_with(short) || b"BZh".starts_with(short)) => {
            Err(fail(
                Code::Unsafe,
                format!(
                    "{} is {n} bytes long: the package is truncated (an interrupted download?); download it again",
                    path.display()
                ),
            ))
        }
        _ => Err(fail(
            Code::Unsafe,
            format!(
                "{} is neither a .conda (zip) nor a .tar.bz2 package (it starts with {:02x?})",
                path.display(),
                &magic[..n]
            ),
        )),
    }
}

fn open(path: &Path) -> Result<File> {
    File::open(path).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            fail(
                Code::NotFound,
                format!("{} does not exist: check the path", path.display()),
            )
        } else {
            anyhow::Error::new(e).context(format!("opening {}", path.display()))
        }
    })
}

fn read_up_to<R: Read>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One member of a `.conda` zip.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Member {
    pub name: String,
    pub kind: MemberKind,
    #[serde(skip)]
    pub index: usize,
    /// Stored size in bytes (STORED: equal to its uncompressed size).
    pub size: u64,
    /// Where its data starts in the file.
    pub offset: u64,
    /// For zstd members: the window the first frame declares.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zstd_window: Option<u64>,
}

impl Member {
    pub fn compression(&self) -> &'static str {
        match self.kind {
            MemberKind::Info | MemberKind::Pkg => "zstd",
            _ => "none",
        }
    }
}

/// An opened and checked `.conda` file.
pub struct CondaFile {
    pub path: PathBuf,
    zip: zip::ZipArchive<File>,
    pub members: Vec<Member>,
    pub format_version: u64,
}

/// Reads and checks one zip member's record: a plain name of a known kind,
/// STORED, unencrypted, sizes that agree, and for the tarballs a zstd header.
fn check_member(zip: &mut zip::ZipArchive<File>, index: usize, path: &Path) -> Result<Member> {
    let mut raw = zip
        .by_index_raw(index)
        .map_err(|e| refuse(path, format!("zip member {index}: {e}")))?;
    let name_raw = raw.name_raw().to_vec();
    let kind = format::classify_member(&name_raw).map_err(|why| refuse(path, why))?;
    let name = String::from_utf8_lossy(&name_raw).into_owned();
    let method = raw.compression();
    if method != zip::CompressionMethod::Stored {
        return Err(refuse(
            path,
            format!(
                "zip member `{name}` is compressed with {}; .conda members must be STORED (was the package re-zipped?)",
                method_name(method)
            ),
        ));
    }
    if raw.encrypted() {
        return Err(refuse(path, format!("zip member `{name}` is encrypted")));
    }
    if raw.compressed_size() != raw.size() {
        return Err(refuse(
            path,
            format!(
                "zip member `{name}` is STORED but its sizes disagree ({} stored, {} declared)",
                raw.compressed_size(),
                raw.size()
            ),
        ));
    }
    let (size, offset) = (raw.size(), raw.data_start());
    let zstd_window = if matches!(kind, MemberKind::Info | MemberKind::Pkg) {
        let mut head = [0u8; 18];
        let n = read_up_to(&mut raw, &mut head)
            .with_context(|| format!("reading zip member `{name}` of {}", path.display()))?;
        let window = format::zstd_window(&head[..n])
            .ok_or_else(|| refuse(path, format!("zip member `{name}` is not a zstd stream")))?;
        Some(window)
    } else {
        None
    };
    Ok(Member {
        name,
        kind,
        index,
        size,
        offset,
        zstd_window,
    })
}

/// A package has exactly one info tarball and one pkg tarball.
fn check_one_each(members: &[Member], path: &Path) -> Result<()> {
    for kind in [MemberKind::Info, MemberKind::Pkg] {
        let found: Vec<_> = members.iter().filter(|m| m.kind == kind).collect();
        match found.len() {
            1 => {}
            0 => {
                return Err(refuse(
                    path,
                    format!(
                        "no {}-*.tar.zst member: not a conda package",
                        kind_word(kind)
                    ),
                ));
            }
            _ => {
                return Err(refuse(
                    path,
                    format!(
                        "two {}-*.tar.zst members (`{}`, `{}`): which one is the package?",
                        kind_word(kind),
                        found[0].name,
                        found[1].name
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// A refusal about the package file as a whole or one member.
fn refuse(path: &Path, why: impl std::fmt::Display) -> anyhow::Error {
    fail(Code::Unsafe, format!("refusing {}: {why}", path.display()))
}

impl CondaFile {
    /// Opens the zip through its central directory and checks every member:
    /// a plain unique name, STORED, sizes that agree, at most one info and
    /// one pkg tarball, and a supported `metadata.json`.
    pub fn open(path: &Path) -> Result<CondaFile> {
        let mut file = open(path)?;
        check_unique_names(&mut file, path)?;
        let zip = zip::ZipArchive::new(file)
            .map_err(|e| refuse(path, format!("not a valid zip: {e}")))?;
        let mut this = CondaFile {
            path: path.to_path_buf(),
            zip,
            members: Vec::new(),
            format_version: 0,
        };
        for index in 0..this.zip.len() {
            let member = check_member(&mut this.zip, index, path)?;
            this.members.push(member);
        }
        check_one_each(&this.members, path)?;
        this.format_version = this.read_metadata()?;
        if this.format_version != format::CONDA_FORMAT_VERSION {
            return Err(refuse(
                path,
                format!(
                    "metadata.json says conda_pkg_format_version {}; this tool reads version {}",
                    this.format_version,
                    format::CONDA_FORMAT_VERSION
                ),
            ));
        }
        Ok(this)
    }

    fn read_metadata(&mut self) -> Result<u64> {
        let Some(m) = self.members.iter().find(|m| m.kind == MemberKind::Metadata) else {
            return Err(refuse(
                &self.path,
                "no metadata.json member: not a .conda package",
            ));
        };
        if m.size > MAX_METADATA {
            return Err(refuse(
                &self.path,
                format!(
                    "metadata.json is {} bytes; at most {MAX_METADATA} expected",
                    m.size
                ),
            ));
        }
        let mut bytes = Vec::new();
        self.zip
            .by_index(m.index)
            .map_err(|e| refuse(&self.path, format!("metadata.json: {e}")))?
            .read_to_end(&mut bytes)
            .map_err(|e| refuse(&self.path, format!("metadata.json: {e}")))?;
        format::parse_metadata(&bytes).map_err(|why| refuse(&self.path, why))
    }

    pub fn member(&self, kind: MemberKind) -> &Member {
        self.members
            .iter()
            .find(|m| m.kind == kind)
            .expect("checked by open")
    }

    /// Runs `f` over the decoded tar stream of a zstd member. The window is
    /// checked before decoding; a later frame with a larger window is
    /// caught by the decoder and reported the same way.
    pub fn with_tar<T>(
        &mut self,
        kind: MemberKind,
        progress: &indicatif::ProgressBar,
        f: impl FnOnce(&mut dyn Read) -> Result<T>,
    ) -> Result<T> {
        let member = self.member(kind).clone();
        let path = self.path.clone();
        if let Some(window) = member.zstd_window {
            check_window(&path, &member.name, window)?;
        }
        let raw = self
            .zip
            .by_index(member.index)
            .map_err(|e| refuse(&path, format!("zip member `{}`: {e}", member.name)))?;
        zstd_tar(progress.wrap_read(raw), &path, &member.name, f)
    }
}

/// The zip compression method's common name (the zip crate is built
/// without decoders, so it only knows their numbers).
fn method_name(method: zip::CompressionMethod) -> String {
    use zip::CompressionMethod as M;
    let known = [
        (M::DEFLATE, "DEFLATE"),
        (M::DEFLATE64, "Deflate64"),
        (M::BZIP2, "bzip2"),
        (M::LZMA, "LZMA"),
        (M::ZSTD, "zstd"),
        (M::XZ, "xz"),
        (M::AES, "AES encryption"),
    ];
    known
        .iter()
        .find(|(m, _)| *m == method)
        .map(|(_, name)| name.to_string())
        .unwrap_or_else(|| format!("{method:?}"))
}

fn kind_word(kind: MemberKind) -> &'static str {
    match kind {
        MemberKind::Info => "info",
        _ => "pkg",
    }
}

pub fn window_error(path: &Path, member: &str, window: Option<u64>) -> anyhow::Error {
    let declared = match window {
        Some(w) => format!("a window of {w} bytes (2^{})", format::window_log(w)),
        None => "a larger window".to_string(),
    };
    refuse(
        path,
        format!(
            "zip member `{member}` is a zstd stream that needs {declared}, over the limit of 2^{MAX_WINDOW_LOG} bytes (128 MiB); recompress it with a smaller window (zstd --long={MAX_WINDOW_LOG} or less)"
        ),
    )
}

fn check_window(path: &Path, member: &str, window: u64) -> Result<()> {
    if window > 1u64 << MAX_WINDOW_LOG {
        return Err(window_error(path, member, Some(window)));
    }
    Ok(())
}

/// Notes when the zstd decoder refused a frame's window, so the error can
/// say so (the tar reader only sees an I/O error).
struct WindowWatch<R> {
    inner: R,
    hit: Rc<Cell<bool>>,
}

impl<R: Read> Read for WindowWatch<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.read(buf).inspect_err(|e| {
            if e.to_string().contains("too much memory") {
                self.hit.set(true);
            }
        })
    }
}

fn zstd_tar<R: Read, T>(
    compressed: R,
    path: &Path,
    member: &str,
    f: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<T> {
    let mut decoder = zstd::stream::read::Decoder::new(compressed)
        .with_context(|| format!("starting the zstd decoder for `{member}`"))?;
    decoder
        .window_log_max(MAX_WINDOW_LOG)
        .context("setting the zstd window limit")?;
    let hit = Rc::new(Cell::new(false));
    let mut watched = WindowWatch {
        inner: decoder,
        hit: hit.clone(),
    };
    f(&mut watched).map_err(|e| {
        if hit.get() {
            window_error(path, member, None)
        } else {
            e.context(format!("zip member `{member}` of {}", path.display()))
        }
    })
}

/// Runs `f` over the tar stream of a legacy `.tar.bz2` package.
pub fn with_bz2_tar<T>(
    path: &Path,
    progress: &indicatif::ProgressBar,
    f: impl FnOnce(&mut dyn Read) -> Result<T>,
) -> Result<T> {
    let file = open(path)?;
    // Multi-stream: parallel bzip2 tools write several concatenated streams.
    let mut decoder = bzip2::read::MultiBzDecoder::new(BufReader::with_capacity(
        1 << 16,
        progress.wrap_read(file),
    ));
    f(&mut decoder).with_context(|| format!("reading {}", path.display()))
}

/// Refuses a zip whose central directory names a member twice: the zip
/// crate keeps only one of them, so this reads the names itself.
fn check_unique_names(file: &mut File, path: &Path) -> Result<()> {
    let len = file
        .seek(SeekFrom::End(0))
        .with_context(|| format!("reading {}", path.display()))?;
    let tail_len = len.min(65_557 + 20);
    let mut tail = vec![0u8; tail_len as usize];
    file.seek(SeekFrom::Start(len - tail_len))?;
    file.read_exact(&mut tail)
        .with_context(|| format!("reading {}", path.display()))?;
    let eocd = format::parse_eocd(&tail).map_err(|why| refuse(path, why))?;
    let (entries, cd_size, cd_offset) = if eocd.needs_zip64 {
        let loc_at = eocd
            .at
            .checked_sub(20)
            .ok_or_else(|| refuse(path, "zip64 locator missing"))?;
        let record =
            format::parse_zip64_locator(&tail[loc_at..eocd.at]).map_err(|why| refuse(path, why))?;
        let mut buf = vec![0u8; 56];
        file.seek(SeekFrom::Start(record))?;
        file.read_exact(&mut buf)
            .map_err(|e| refuse(path, format!("reading the zip64 record: {e}")))?;
        format::parse_zip64_eocd(&buf).map_err(|why| refuse(path, why))?
    } else {
        (eocd.entries, eocd.cd_size, eocd.cd_offset)
    };
    if entries > MAX_MEMBERS {
        return Err(refuse(
            path,
            format!("{entries} zip members; a conda package has a handful"),
        ));
    }
    if cd_size > MAX_MEMBERS * (46 + 3 * 65_535) || cd_offset.saturating_add(cd_size) > len {
        return Err(refuse(
            path,
            "the zip central directory lies outside the file",
        ));
    }
    let mut cd = vec![0u8; cd_size as usize];
    file.seek(SeekFrom::Start(cd_offset))?;
    file.read_exact(&mut cd)
        .map_err(|e| refuse(path, format!("reading the central directory: {e}")))?;
    let names = format::central_directory_names(&cd, entries).map_err(|why| refuse(path, why))?;
    if let Some(dup) = format::first_duplicate(&names) {
        return Err(refuse(
            path,
            format!(
                "zip member `{}` appears twice; a reader would pick one silently",
                String::from_utf8_lossy(dup)
            ),
        ));
    }
    file.seek(SeekFrom::Start(0))?;
    Ok(())
}
