//! `cargo xtask conda`: inspect and unpack conda packages without conda.
//!
//! `info` reads metadata only. `unpack` extracts into a staging directory
//! beside the prefix through `unpack::extract_tar_select` (every entry
//! checked, hostile ones refused), rewrites prefix placeholders there, then
//! hands the tree to `unpack::merge_into_with` (one rename per file,
//! journaled, each relative to a handle on the prefix, so that no symlink an
//! earlier package left there can lead a write outside it).
//! This module never writes into the prefix itself and never writes outside
//! the staging directory before the merge.

pub mod format;
pub mod package;
pub mod placeholder;

use anyhow::{Context, Result};
use serde::Serialize;
use std::fs::{self, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use crate::cli::conda::{CondaArgs, CondaCommand, InfoArgs, UnpackArgs};
use crate::exit::{Code, fail};
use crate::progress::{bytes_bar as bar, hidden};
use crate::unpack::{self, Limits, Options, Select};
use format::{FileMode, Index, MemberKind, Paths, Placeholder};
use package::{CondaFile, Format, Member};

pub fn run(_sh: &xshell::Shell, args: CondaArgs) -> Result<()> {
    match args.command {
        CondaCommand::Info(args) => info(args),
        CondaCommand::Unpack(args) => unpack_cmd(args),
    }
}

/// The three metadata files read from `info/`, as captured bytes.
#[derive(Default)]
struct Captured {
    index: Option<Vec<u8>>,
    paths: Option<Vec<u8>>,
    has_prefix: Option<Vec<u8>>,
}

impl Captured {
    fn wants(rel: &Path) -> bool {
        matches!(
            rel.to_str(),
            Some("info/index.json" | "info/paths.json" | "info/has_prefix")
        )
    }

    fn take(&mut self, rel: &Path, data: Vec<u8>) {
        match rel.to_str() {
            Some("info/index.json") => self.index = Some(data),
            Some("info/paths.json") => self.paths = Some(data),
            Some("info/has_prefix") => self.has_prefix = Some(data),
            _ => {}
        }
    }
}

/// What the metadata says, parsed and checked.
#[derive(Debug, Serialize)]
struct Metadata {
    #[serde(flatten)]
    index: Index,
    /// `info/paths.json` or `info/has_prefix`, whichever gave placeholders.
    placeholder_source: Option<&'static str>,
    placeholders: Vec<Placeholder>,
    #[serde(skip)]
    paths: Option<Paths>,
}

fn parse_metadata(file: &Path, c: Captured) -> Result<Metadata> {
    let bad = |why: String| fail(Code::Unsafe, format!("refusing {}: {why}", file.display()));
    let index = c
        .index
        .ok_or_else(|| bad("it has no info/index.json: not a conda package".into()))?;
    let index = format::parse_index(&index).map_err(bad)?;
    let paths = c
        .paths
        .map(|p| format::parse_paths_json(&p))
        .transpose()
        .map_err(bad)?;
    let (placeholders, source) = match (&paths, c.has_prefix) {
        (Some(p), _) => (p.placeholders.clone(), Some("info/paths.json")),
        (None, Some(text)) => (
            format::parse_has_prefix(&String::from_utf8_lossy(&text)).map_err(bad)?,
            Some("info/has_prefix"),
        ),
        (None, None) => (Vec::new(), None),
    };
    for p in &placeholders {
        if relative_path(&p.path).is_none() {
            return Err(bad(format!(
                "{} names `{}` for a prefix placeholder: not a plain relative path",
                source.unwrap_or("metadata"),
                p.path
            )));
        }
    }
    Ok(Metadata {
        index,
        placeholder_source: source.filter(|_| !placeholders.is_empty()),
        placeholders,
        paths,
    })
}

/// `a/b` as a relative path of normal components, or None for `..`,
/// absolute or empty paths.
fn relative_path(s: &str) -> Option<PathBuf> {
    let p = Path::new(s);
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

/// Reads the metadata of a `.conda` (from its info member).
fn conda_metadata(pkg: &mut CondaFile, limits: &Limits) -> Result<Metadata> {
    let mut captured = Captured::default();
    pkg.with_tar(MemberKind::Info, &hidden(), |r| {
        capture_metadata(r, limits, &mut captured)
    })?;
    parse_metadata(&pkg.path, captured)
}

/// Reads a package's metadata files (`Captured::wants`) out of a tar stream
/// without writing anything: the shared step of `info` for both formats.
fn capture_metadata<R: std::io::Read>(
    r: R,
    limits: &Limits,
    captured: &mut Captured,
) -> Result<unpack::Stats> {
    unpack::extract_tar_select(
        r,
        None,
        limits,
        &Options {
            allow_external_symlinks: true,
            ..Options::default()
        },
        &mut |rel| {
            if Captured::wants(rel) {
                Select::Capture
            } else {
                Select::Skip
            }
        },
        &mut |rel, data| {
            captured.take(rel, data);
            Ok(())
        },
    )
}

#[derive(Serialize)]
struct InfoReport {
    file: PathBuf,
    /// The package file's own size.
    #[serde(rename = "package_bytes")]
    file_size: u64,
    format: Format,
    #[serde(flatten)]
    metadata: Metadata,
    /// Paths and bytes from info/paths.json, when present.
    paths: Option<u64>,
    #[serde(rename = "file_bytes")]
    bytes: Option<u64>,
    members: Vec<Member>,
}

fn info(args: InfoArgs) -> Result<()> {
    let file_size = fs::metadata(&args.file).map(|m| m.len()).ok();
    let format = package::detect(&args.file)?;
    let limits = Limits::GENEROUS;
    let (metadata, members) = match format {
        Format::Conda => {
            let mut pkg = CondaFile::open(&args.file)?;
            let meta = conda_metadata(&mut pkg, &limits)?;
            (meta, pkg.members.clone())
        }
        Format::TarBz2 => {
            let mut captured = Captured::default();
            package::with_bz2_tar(&args.file, &hidden(), |r| {
                capture_metadata(r, &limits, &mut captured)
            })?;
            (parse_metadata(&args.file, captured)?, Vec::new())
        }
    };
    let report = InfoReport {
        file: args.file.clone(),
        file_size: file_size.unwrap_or(0),
        format,
        paths: metadata.paths.as_ref().map(|p| p.count),
        bytes: metadata.paths.as_ref().and_then(|p| p.bytes),
        metadata,
        members,
    };
    if args.json {
        crate::contract::document(&report);
        return Ok(());
    }
    print!("{}", render_info(&report));
    Ok(())
}

fn render_info(r: &InfoReport) -> String {
    use std::fmt::Write;
    let m = &r.metadata;
    let mut out = String::new();
    let _ = writeln!(out, "name      {}", m.index.name);
    let _ = writeln!(out, "version   {}", m.index.version);
    let mut build = m.index.build.clone();
    if let Some(n) = m.index.build_number {
        let _ = write!(build, " (number {n})");
    }
    if let Some(s) = &m.index.subdir {
        let _ = write!(build, ", {s}");
    }
    let _ = writeln!(out, "build     {build}");
    let kind = match r.format {
        Format::Conda => ".conda (zip of zstd tarballs)",
        Format::TarBz2 => ".tar.bz2 (legacy, bzip2 tarball)",
    };
    let _ = writeln!(
        out,
        "file      {} ({} bytes, {kind})",
        r.file.display(),
        r.file_size
    );
    match (r.paths, r.bytes) {
        (Some(p), Some(b)) => {
            let _ = writeln!(out, "contents  {p} paths, {b} bytes (info/paths.json)");
        }
        (Some(p), None) => {
            let _ = writeln!(out, "contents  {p} paths (info/paths.json)");
        }
        _ => {}
    }
    render_members(&mut out, &r.members);
    render_placeholders(&mut out, m);
    out
}

/// The zip members of a `.conda`, one line each (nothing for a `.tar.bz2`).
fn render_members(out: &mut String, members: &[Member]) {
    use std::fmt::Write;
    if !members.is_empty() {
        let _ = writeln!(out, "members");
        for mem in members {
            let compression = match mem.zstd_window {
                Some(w) => format!("zstd, window {w} bytes (2^{})", format::window_log(w)),
                None => "stored".to_string(),
            };
            let _ = writeln!(
                out,
                "  {:<48} {:>12} bytes  {compression}",
                mem.name, mem.size
            );
        }
    }
}

/// Which files hold a prefix placeholder, and in which mode.
fn render_placeholders(out: &mut String, m: &Metadata) {
    use std::fmt::Write;
    match m.placeholder_source {
        None => {
            let _ = writeln!(out, "prefix placeholders: none");
        }
        Some(src) => {
            let _ = writeln!(
                out,
                "prefix placeholders ({} files, from {src})",
                m.placeholders.len()
            );
            let shared = m
                .placeholders
                .iter()
                .all(|p| p.placeholder == m.placeholders[0].placeholder);
            if shared {
                let ph = &m.placeholders[0].placeholder;
                let _ = writeln!(out, "  placeholder {ph} ({} bytes)", ph.len());
            }
            for p in &m.placeholders {
                let mode = match p.mode {
                    FileMode::Text => "text",
                    FileMode::Binary => "binary",
                };
                if shared {
                    let _ = writeln!(out, "  {mode:<6}  {}", p.path);
                } else {
                    let _ = writeln!(out, "  {mode:<6}  {}  ({})", p.path, p.placeholder);
                }
            }
        }
    }
}

/// What `unpack_package` installed (`conda unpack --json` prints it).
#[derive(Debug, Serialize)]
pub struct UnpackReport {
    pub name: String,
    pub version: String,
    pub build: String,
    pub format: Format,
    pub prefix: PathBuf,
    pub files: u64,
    pub dirs: u64,
    pub symlinks: u64,
    pub hardlinks: u64,
    /// Bytes of regular files installed (`file_bytes`, as publish says).
    #[serde(rename = "file_bytes")]
    pub bytes: u64,
    /// Files whose prefix placeholder was rewritten to the prefix.
    pub rewritten: Vec<String>,
}

/// Removes the staging directory on every exit path until disarmed (right
/// before the merge, whose journal then owns it).
struct StagingGuard(Option<PathBuf>);

impl Drop for StagingGuard {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = unpack::remove_staging(&dir);
        }
    }
}

/// The `--only` filters as relative paths.
fn only_filters(only: &[String]) -> Result<Vec<PathBuf>> {
    only.iter()
        .map(|o| {
            relative_path(o).ok_or_else(|| {
                fail(
                    Code::Usage,
                    format!(
                        "--only {o}: give a directory inside the package, such as bin/ or lib/"
                    ),
                )
            })
        })
        .collect()
}

fn included(only: &[PathBuf], rel: &Path) -> bool {
    only.is_empty() || only.iter().any(|o| rel.starts_with(o))
}

fn unpack_cmd(args: UnpackArgs) -> Result<()> {
    let report = unpack_package(&args)?;
    if args.json {
        crate::contract::document(&report);
    } else {
        println!(
            "unpacked {} {} ({}) into {}: {} files, {} symlinks, {} hardlinks, {} bytes; prefix rewritten in {} files",
            report.name,
            report.version,
            report.build,
            report.prefix.display(),
            report.files,
            report.symlinks,
            report.hardlinks,
            report.bytes,
            report.rewritten.len()
        );
    }
    Ok(())
}

/// The normalised absolute prefix and its merge journal (beside it, so the
/// command needs no repository).
fn prefix_and_journal(into: &Path) -> Result<(PathBuf, PathBuf)> {
    let abs = std::path::absolute(into).with_context(|| format!("resolving {}", into.display()))?;
    let mut prefix = PathBuf::from("/");
    for c in abs.components() {
        match c {
            Component::Normal(n) => prefix.push(n),
            Component::ParentDir => {
                prefix.pop();
            }
            _ => {}
        }
    }
    let (Some(parent), Some(name)) = (prefix.parent(), prefix.file_name()) else {
        return Err(fail(
            Code::Usage,
            "--into /: unpacking into the root is not supported; choose a prefix such as /usr/local",
        ));
    };
    let journal = parent.join(format!(".{}.warmstart-merge", name.to_string_lossy()));
    Ok((prefix, journal))
}

/// Unpacks the package `args.file` into `args.into` (every entry checked,
/// placeholders rewritten, one journaled rename per file): `conda unpack`
/// without the printing. `cargo xtask restore`'s package downloads call it.
pub fn unpack_package(args: &UnpackArgs) -> Result<UnpackReport> {
    let only = only_filters(&args.only)?;
    let (prefix, journal) = prefix_and_journal(&args.into)?;
    // First finish any merge a killed run left, before anything else (it
    // needs that run's staging directory, which staging_dir_for would clear).
    unpack::recover(&journal, &prefix)?;
    let format = package::detect(&args.file)?;
    let new_prefix = prefix.as_os_str().as_bytes().to_vec();
    let plan = Plan {
        file: &args.file,
        prefix: &prefix,
        only: &only,
        new_prefix: &new_prefix,
        limits: Limits {
            max_bytes: args.max_bytes,
            max_entries: args.max_entries,
        },
        opts: Options {
            allow_external_symlinks: args.allow_external_symlinks,
            ..Options::default()
        },
    };
    let Staged {
        meta,
        stats,
        staging,
        mut guard,
    } = match format {
        Format::Conda => plan.stage_conda()?,
        Format::TarBz2 => plan.stage_tar_bz2()?,
    };
    let rewritten = plan.rewrite_placeholders(&meta, &staging)?;
    guard.0 = None;
    let merge = unpack::MergeOptions {
        allow_external_symlinks: args.allow_external_symlinks,
        ..unpack::MergeOptions::default()
    };
    if let Err(err) = unpack::merge_into_with(&staging, &prefix, &journal, merge) {
        // Refused before its journal was written (e.g. a conflict in the
        // prefix): nothing moved, so the staging directory is ours to drop.
        // With a journal, the next run needs it to complete the merge.
        if !journal.exists() {
            let _ = unpack::remove_staging(&staging);
        }
        return Err(err.context(format!("installing into {}", prefix.display())));
    }
    Ok(UnpackReport {
        name: meta.index.name,
        version: meta.index.version,
        build: meta.index.build,
        format,
        prefix,
        files: stats.files,
        dirs: stats.dirs,
        symlinks: stats.symlinks,
        hardlinks: stats.hardlinks,
        bytes: stats.bytes,
        rewritten,
    })
}

/// What staging one package needs, resolved from `conda unpack`'s arguments.
struct Plan<'a> {
    file: &'a Path,
    prefix: &'a Path,
    only: &'a [PathBuf],
    new_prefix: &'a [u8],
    limits: Limits,
    opts: Options,
}

/// A package extracted into its staging directory, not yet merged.
struct Staged {
    meta: Metadata,
    stats: unpack::Stats,
    staging: PathBuf,
    /// Removes the staging directory unless the merge takes it over.
    guard: StagingGuard,
}

impl Plan<'_> {
    /// Package files outside `info/` that `--only` keeps are extracted.
    fn select(&self, rel: &Path) -> Select {
        if rel.starts_with("info") || !included(self.only, rel) {
            Select::Skip
        } else {
            Select::Extract
        }
    }

    /// A `.conda`: its metadata comes from the info tarball, read first.
    fn stage_conda(&self) -> Result<Staged> {
        let mut pkg = CondaFile::open(self.file)?;
        let meta = conda_metadata(&mut pkg, &self.limits)?;
        // Refuse an impossible binary rewrite before writing anything.
        check_binary_fit(self.file, &meta, self.only, self.new_prefix)?;
        let staging = unpack::staging_dir_for(self.prefix)?;
        let guard = StagingGuard(Some(staging.clone()));
        let size = pkg.member(MemberKind::Pkg).size;
        let pb = bar(size, "unpack");
        let stats = pkg.with_tar(MemberKind::Pkg, &pb, |r| {
            unpack::extract_tar_select(
                r,
                Some(&staging),
                &self.limits,
                &self.opts,
                &mut |rel| self.select(rel),
                &mut |_, _| Ok(()),
            )
        })?;
        pb.finish_and_clear();
        Ok(Staged {
            meta,
            stats,
            staging,
            guard,
        })
    }

    /// A `.tar.bz2`: one stream, so its metadata is captured on the way.
    fn stage_tar_bz2(&self) -> Result<Staged> {
        let staging = unpack::staging_dir_for(self.prefix)?;
        let guard = StagingGuard(Some(staging.clone()));
        let mut captured = Captured::default();
        let size = fs::metadata(self.file).map(|m| m.len()).unwrap_or(0);
        let pb = bar(size, "unpack");
        let stats = package::with_bz2_tar(self.file, &pb, |r| {
            unpack::extract_tar_select(
                r,
                Some(&staging),
                &self.limits,
                &self.opts,
                &mut |rel| {
                    if Captured::wants(rel) {
                        Select::Capture
                    } else {
                        self.select(rel)
                    }
                },
                &mut |rel, data| {
                    captured.take(rel, data);
                    Ok(())
                },
            )
        })?;
        pb.finish_and_clear();
        let meta = parse_metadata(self.file, captured)?;
        check_binary_fit(self.file, &meta, self.only, self.new_prefix)?;
        Ok(Staged {
            meta,
            stats,
            staging,
            guard,
        })
    }

    /// Rewrites the placeholder in every listed file `--only` keeps; returns
    /// the paths where one was replaced.
    fn rewrite_placeholders(&self, meta: &Metadata, staging: &Path) -> Result<Vec<String>> {
        let mut rewritten = Vec::new();
        for p in &meta.placeholders {
            let rel = relative_path(&p.path).expect("checked by parse_metadata");
            if !included(self.only, &rel) {
                continue;
            }
            if rewrite_in_staging(staging, &rel, p, self.new_prefix)
                .with_context(|| format!("rewriting the prefix placeholder in `{}`", p.path))?
            {
                rewritten.push(p.path.clone());
            }
        }
        Ok(rewritten)
    }
}

/// Binary files keep their length, so the new prefix must fit in the
/// placeholder: refuse up front, naming the file and both lengths.
fn check_binary_fit(
    file: &Path,
    meta: &Metadata,
    only: &[PathBuf],
    new_prefix: &[u8],
) -> Result<()> {
    for p in &meta.placeholders {
        let rel = relative_path(&p.path).expect("checked by parse_metadata");
        if p.mode == FileMode::Binary
            && included(only, &rel)
            && new_prefix.len() > p.placeholder.len()
        {
            return Err(fail(
                Code::Usage,
                format!(
                    "cannot unpack {} into {}: binary file `{}` has a {}-byte prefix placeholder and the prefix is {} bytes; choose a prefix of at most {} bytes",
                    file.display(),
                    String::from_utf8_lossy(new_prefix),
                    p.path,
                    p.placeholder.len(),
                    new_prefix.len(),
                    p.placeholder.len()
                ),
            ));
        }
    }
    Ok(())
}

/// The staged file `rel` names, reached through real directories only;
/// `None` for a symlink, which is left alone.
fn file_to_rewrite(staging: &Path, rel: &Path, p: &Placeholder) -> Result<Option<PathBuf>> {
    let mut at = staging.to_path_buf();
    let comps: Vec<_> = rel.components().collect();
    for (i, c) in comps.iter().enumerate() {
        at.push(c);
        let meta = match fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(fail(
                    Code::Unsafe,
                    format!(
                        "the package lists `{}` with a prefix placeholder but has no such file",
                        p.path
                    ),
                ));
            }
            Err(e) => return Err(e).with_context(|| format!("reading {}", at.display())),
        };
        let last = i + 1 == comps.len();
        if meta.file_type().is_symlink() {
            if last {
                return Ok(None);
            }
            return Err(fail(
                Code::Unsafe,
                format!(
                    "refusing to rewrite `{}`: its parent is a symlink, and writing through symlinks is refused",
                    p.path
                ),
            ));
        }
        if last && !meta.is_file() {
            return Err(fail(
                Code::Unsafe,
                format!(
                    "`{}` has a prefix placeholder but is not a regular file",
                    p.path
                ),
            ));
        }
        if !last && !meta.is_dir() {
            return Err(fail(
                Code::Unsafe,
                format!("`{}`: a parent is not a directory", p.path),
            ));
        }
    }
    Ok(Some(at))
}

/// Rewrites one file in staging into a new file beside it, then renames it
/// over. Never follows a symlink: parents must be real directories, and a
/// symlink listed with a placeholder is left alone (its target is a file of
/// its own). Returns whether anything was replaced.
fn rewrite_in_staging(
    staging: &Path,
    rel: &Path,
    p: &Placeholder,
    new_prefix: &[u8],
) -> Result<bool> {
    let Some(at) = file_to_rewrite(staging, rel, p)? else {
        return Ok(false);
    };
    let meta = fs::symlink_metadata(&at)?;
    let src = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&at)
        .with_context(|| format!("opening {}", at.display()))?;
    let name = at
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    let tmp = at.with_file_name(format!(".{name}.warmstart-rewrite"));
    let _ = fs::remove_file(&tmp);
    let out =
        unpack::create_new_file(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let reader = std::io::BufReader::with_capacity(1 << 16, src);
    let mut writer = std::io::BufWriter::with_capacity(1 << 16, out);
    let from = p.placeholder.as_bytes();
    let count = match p.mode {
        FileMode::Text => placeholder::rewrite_text(reader, &mut writer, from, new_prefix),
        FileMode::Binary => placeholder::rewrite_binary(reader, &mut writer, from, new_prefix),
    };
    let count = match count {
        Ok(n) => n,
        Err(e) => {
            let _ = fs::remove_file(&tmp);
            return Err(e).with_context(|| format!("rewriting {}", at.display()));
        }
    };
    let out = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", tmp.display()))?;
    if count == 0 {
        drop(out);
        fs::remove_file(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
        return Ok(false);
    }
    out.set_permissions(fs::Permissions::from_mode(
        meta.permissions().mode() & 0o777,
    ))
    .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    if let Ok(mtime) = meta.modified() {
        out.set_modified(mtime)
            .with_context(|| format!("setting the mtime of {}", tmp.display()))?;
    }
    drop(out);
    fs::rename(&tmp, &at).with_context(|| format!("replacing {}", at.display()))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_filters_and_prefix_normalisation() {
        let only = only_filters(&["bin/".into(), "./lib".into()]).unwrap();
        assert!(included(&only, Path::new("bin/tool")));
        assert!(included(&only, Path::new("lib/x/y.so")));
        assert!(!included(&only, Path::new("libexec/x")));
        assert!(!included(&only, Path::new("share/doc")));
        assert!(only_filters(&["../etc".into()]).is_err());
        assert!(only_filters(&["/".into()]).is_err());
        let (p, j) = prefix_and_journal(Path::new("/usr/local/")).unwrap();
        assert_eq!(p, Path::new("/usr/local"));
        assert_eq!(j, Path::new("/usr/.local.warmstart-merge"));
        let (p, _) = prefix_and_journal(Path::new("/a/b/../c")).unwrap();
        assert_eq!(p, Path::new("/a/c"));
        assert!(prefix_and_journal(Path::new("/")).is_err());
    }
}
