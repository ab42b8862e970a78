//! The delta's write phases: entries written from the decoded tar (each
//! checked against the index), hardlinks, and directory modes. Any
//! disagreement is a `Fallback`, never a partial install.

use super::*;

impl Builder<'_> {
    /// Decodes the chunks that hold `writes` and writes those entries.
    pub(super) fn write_phase(
        &mut self,
        new: &Index,
        entry: &KeyEntry,
        writes: &[usize],
        decode: &mut Decode<'_>,
    ) -> Result<()> {
        let entries: Vec<&Entry> = writes.iter().map(|&i| &new.entries[i]).collect();
        let (chunks, spans) = if entries.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            select(entry, &entries)?
        };
        self.report.chunks_decoded = chunks.len() as u64;
        self.report.chunks_total = entry.chunks.len() as u64;
        let (stage, buf, report) = (&mut self.stage, &mut self.buf, &mut self.report);
        decode(&chunks, &mut |r| {
            let mut pos = Positioned::new(r, &spans);
            for e in &entries {
                write_entry(stage, &mut pos, e, buf)?;
                report.files_written += 1;
                report.stats.files += 1;
                report.stats.bytes += e.size;
            }
            Ok(())
        })
    }
}

/// Writes the file entry `e` from its bytes in the decoded stream, after
/// checking that its header and data are what the index says.
pub(super) fn write_entry(
    stage: &mut Tree,
    pos: &mut Positioned<'_>,
    e: &Entry,
    buf: &mut [u8],
) -> Result<()> {
    pos.skip_to(e.offset)
        .with_context(|| format!("reading up to {}", shown(&e.path)))?;
    let mut take = Read::take(&mut *pos, e.end - e.offset);
    {
        let mut ar = tar::Archive::new(&mut take);
        let mut it = ar.entries().context("reading the tar stream")?;
        let mut te = match it.next() {
            Some(Ok(te)) => te,
            Some(Err(err)) => {
                return Err(fallback(format!(
                    "no tar entry at offset {} where the index has {} ({err})",
                    e.offset,
                    shown(&e.path)
                )));
            }
            None => return Err(fallback(format!("the tar ends before {}", shown(&e.path)))),
        };
        check_header(&te, e)?;
        let rel = entry_rel(e)?;
        let (dir, name) = stage.parent_made(&rel)?;
        write_file(dir, name, &mut te, e, buf)?;
    }
    io::copy(&mut take, &mut io::sink()).context("reading the tar padding")?;
    Ok(())
}

/// The tar header agrees with the index line.
pub(super) fn check_header<R: Read>(te: &tar::Entry<'_, R>, e: &Entry) -> Result<()> {
    let h = te.header();
    let differs = |what: &str| {
        fallback(format!(
            "the tar's entry at offset {} differs from the index ({what})",
            e.offset
        ))
    };
    if te.path_bytes().as_ref() != e.path.as_slice() {
        return Err(differs(&format!(
            "{} against {}",
            shown(&te.path_bytes()),
            shown(&e.path)
        )));
    }
    if !h.entry_type().is_file() || te.size() != e.size {
        return Err(differs("kind or size"));
    }
    if h.mode().map_err(|_| differs("mode"))? & 0o777 != e.mode & 0o777 {
        return Err(differs("mode"));
    }
    if h.mtime().map_err(|_| differs("mtime"))? != FIXED_MTIME {
        return Err(fallback(
            "the tar keeps real mtimes, which the file index does not record",
        ));
    }
    Ok(())
}

pub(super) fn write_file(
    dir: &Dir,
    name: &OsStr,
    src: &mut dyn Read,
    e: &Entry,
    buf: &mut [u8],
) -> Result<()> {
    let out = create_entry_file(dir, name, e)?;
    let (size, digest) = copy_hashed(src, &out, e, buf, "tar entry")?;
    if !same_content((size, digest), e) {
        return Err(fallback(format!(
            "{} in the tar has sha256 {} but the file index says another",
            shown(&e.path),
            hex::encode(&digest)
        )));
    }
    finish_file(&out, e)
}

impl Builder<'_> {
    /// Hardlink entries, to earlier file entries now in staging.
    pub(super) fn hardlink_phase(&mut self, new: &Index, hardlinks: &[usize]) -> Result<()> {
        let files: HashMap<&[u8], usize> = new
            .entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.kind == Kind::File)
            .map(|(i, e)| (e.path.as_slice(), i))
            .collect();
        for &i in hardlinks {
            let e = &new.entries[i];
            let to = e.target.as_deref().unwrap_or_default();
            if files.get(to).is_none_or(|&t| t >= i) {
                return Err(fallback(format!(
                    "hardlink {} is not to an earlier file entry",
                    shown(&e.path)
                )));
            }
            let rel = entry_rel(e)?;
            let trel = unpack::safe_relative(to)
                .map_err(|why| fallback(format!("hardlink {}: {why}", shown(&e.path))))?;
            let tparent = trel.parent().unwrap_or(Path::new(""));
            let src = unpack::open_beneath(&self.stage.root, tparent, Links::None)
                .map_err(|err| fallback(format!("hardlink {}: {err}", shown(&e.path))))?;
            let tname = trel.file_name().expect("a file entry has a name");
            let (dir, name) = self.stage.parent_made(&rel)?;
            match src.link_at(tname, dir, name) {
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
                }
                r => r.with_context(|| format!("creating the hardlink {}", shown(&e.path)))?,
            }
            self.report.stats.hardlinks += 1;
        }
        Ok(())
    }

    /// Directory modes and mtimes, deepest first, once their children exist.
    pub(super) fn finish_dirs(&mut self, mut dirs: Vec<(PathBuf, u32)>) -> Result<()> {
        dirs.sort_by_key(|(rel, _)| std::cmp::Reverse(rel.components().count()));
        for (rel, mode) in dirs {
            let (dir, name) = self
                .stage
                .parent(&rel)
                .with_context(|| format!("opening the parent of `{}`", rel.display()))?;
            dir.chmod_dir_at(name, mode & 0o777)
                .with_context(|| format!("setting the mode of `{}`", rel.display()))?;
            dir.set_mtime_at(name, FIXED_MTIME)
                .with_context(|| format!("setting the mtime of `{}`", rel.display()))?;
        }
        Ok(())
    }
}
