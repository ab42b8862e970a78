//! The delta's plan and its link phase: for each file entry, link, copy or
//! leave it to be written from the tar. It never links a file whose stat no
//! longer equals the record (the user changed it).

use super::*;

/// What a delta install did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// As a full unpack counts them; `bytes` is what was written.
    pub stats: unpack::Stats,
    /// Files hardlinked or reflinked from the installed tree, and their bytes.
    pub files_linked: u64,
    pub bytes_linked: u64,
    /// Files copied from the installed tree (a hardlink was not possible).
    pub files_copied: u64,
    /// Files written from the decoded tar.
    pub files_written: u64,
    /// Installed files whose bytes were read to check them before they were
    /// linked (their record was not verified, or their ctime was racy).
    pub files_hashed: u64,
    pub chunks_decoded: u64,
    pub chunks_total: u64,
}

impl Report {
    /// Adds what a link thread did.
    pub(super) fn add(&mut self, o: &Report) {
        self.stats.files += o.stats.files;
        self.stats.bytes += o.stats.bytes;
        self.files_linked += o.files_linked;
        self.bytes_linked += o.bytes_linked;
        self.files_copied += o.files_copied;
        self.files_hashed += o.files_hashed;
    }
}

/// What one link thread did: the entries it left to write, its counts, and
/// the installed inodes it linked.
struct Linked {
    writes: Vec<usize>,
    report: Report,
    used: HashMap<(u64, u64), PathBuf>,
}

/// Decodes the given chunks of the key (ascending indices) as one stream,
/// verified chunk by chunk, into the consumer.
pub type Decode<'a> =
    dyn FnMut(&[usize], &mut dyn FnMut(&mut dyn Read) -> Result<()>) -> Result<()> + 'a;

/// The entries left for the later phases.
#[derive(Default)]
pub(super) struct Plan {
    pub(super) writes: Vec<usize>,
    pub(super) hardlinks: Vec<usize>,
    pub(super) dirs: Vec<(PathBuf, u32)>,
}

pub(super) struct Builder<'a> {
    pub(super) stage: Tree,
    /// The installed tree (`None` when it is gone: nothing to link).
    pub(super) old_tree: Option<Tree>,
    pub(super) old: &'a Installed,
    pub(super) by_digest: HashMap<[u8; 32], Vec<usize>>,
    pub(super) by_path: HashMap<&'a [u8], usize>,
    /// Installed inodes linked already, and where in staging: a second
    /// entry with that content is a copy (a hardlink would join two paths
    /// the tar keeps apart).
    pub(super) used: HashMap<(u64, u64), PathBuf>,
    pub(super) buf: Vec<u8>,
    pub(super) report: Report,
    /// `pack.absolute_symlinks`: judged as the extractor judges them.
    pub(super) absolute: Vec<crate::glob::Pattern>,
    /// The staging and installed trees, for the link threads' own handles.
    pub(super) paths: (PathBuf, PathBuf),
}

/// Threads that check and link files at once (each its own handles): a
/// link is a few system calls on each side, which two threads overlap.
const LINK_THREADS: usize = 2;

/// Builds `staging` (empty, the caller's) as the key `entry` whose index is
/// `new`, from the installed tree at `target` that `old` describes, decoding
/// only the chunks that hold entries it must write.
pub fn build(
    staging: &Path,
    target: &Path,
    new: &Index,
    entry: &KeyEntry,
    old: &Installed,
    decode: &mut Decode<'_>,
    absolute: &[crate::glob::Pattern],
) -> Result<Report> {
    let mut b = Builder::new(staging, target, old)?;
    b.absolute = absolute.to_vec();
    let plan = b.link_phase(new)?;
    unpack::kill_point("delta:linked");
    b.write_phase(new, entry, &plan.writes, decode)?;
    unpack::kill_point("delta:written");
    b.hardlink_phase(new, &plan.hardlinks)?;
    b.finish_dirs(plan.dirs)?;
    Ok(b.report)
}

impl<'a> Builder<'a> {
    pub(super) fn new(staging: &Path, target: &Path, old: &'a Installed) -> Result<Builder<'a>> {
        let mut by_digest: HashMap<[u8; 32], Vec<usize>> = HashMap::new();
        let mut by_path = HashMap::new();
        for (i, e) in old.index.entries.iter().enumerate() {
            if let (Some(d), Some(_)) = (e.sha256, old.stats[i]) {
                by_digest.entry(d).or_default().push(i);
                by_path.insert(e.path.as_slice(), i);
            }
        }
        Ok(Builder {
            stage: Tree::open(staging)?,
            old_tree: Tree::open(target).ok(),
            old,
            by_digest,
            by_path,
            used: HashMap::new(),
            buf: vec![0; 1 << 20],
            report: Report::default(),
            absolute: Vec::new(),
            paths: (staging.to_path_buf(), target.to_path_buf()),
        })
    }

    /// Directories, symlinks and reused files, in index order; returns what
    /// is left to write, to hardlink and to finish.
    pub(super) fn link_phase(&mut self, new: &Index) -> Result<Plan> {
        let mut plan = Plan::default();
        let mut seen = HashSet::new();
        let mut files = Vec::new();
        for (i, e) in new.entries.iter().enumerate() {
            let rel = entry_rel(e)?;
            if rel.as_os_str().is_empty() {
                continue;
            }
            if !seen.insert(rel.clone()) {
                return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
            }
            match e.kind {
                Kind::Dir => {
                    self.mkdir(&rel)?;
                    plan.dirs.push((rel, e.mode));
                }
                Kind::Symlink => self.symlink(&rel, e)?,
                Kind::Hardlink => plan.hardlinks.push(i),
                Kind::File => files.push((i, rel)),
            }
        }
        plan.writes = self.link_files(new, files)?;
        Ok(plan)
    }

    /// Reuses what it can of the file entries `files` (index order), on
    /// `LINK_THREADS` threads; returns the entries left to write, ascending.
    /// A file whose digest another new entry shares is left to this thread
    /// afterwards: only such entries can want the same installed inode,
    /// which the first one links and the others copy (`used`).
    pub(super) fn link_files(
        &mut self,
        new: &Index,
        files: Vec<(usize, PathBuf)>,
    ) -> Result<Vec<usize>> {
        let mut count: HashMap<[u8; 32], usize> = HashMap::new();
        for (i, _) in &files {
            if let Some(d) = new.entries[*i].sha256 {
                *count.entry(d).or_default() += 1;
            }
        }
        let (alone, shared): (Vec<_>, Vec<_>) = files
            .into_iter()
            .partition(|(i, _)| new.entries[*i].sha256.is_none_or(|d| count[&d] == 1));
        let per = alone.len().div_ceil(LINK_THREADS).max(1);
        let this = &*self;
        let results: Vec<Result<Linked>> = std::thread::scope(|s| {
            let threads: Vec<_> = alone
                .chunks(per)
                .map(|part| s.spawn(move || this.link_part(new, part)))
                .collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(anyhow!("a link thread panicked")))
                })
                .collect()
        });
        let mut writes = Vec::new();
        for linked in results {
            let linked = linked?;
            writes.extend(linked.writes);
            self.report.add(&linked.report);
            for (inode, at) in linked.used {
                if self.used.insert(inode, at).is_some() {
                    return Err(fallback("two files of the installed tree are one inode"));
                }
            }
        }
        for (i, rel) in shared {
            if !self.reuse(&rel, &new.entries[i])? {
                writes.push(i);
            }
        }
        writes.sort_unstable();
        Ok(writes)
    }

    /// One link thread: its own handles on both trees, the same checks.
    fn link_part(&self, new: &Index, part: &[(usize, PathBuf)]) -> Result<Linked> {
        let mut b = Builder::new(&self.paths.0, &self.paths.1, self.old)?;
        b.absolute = self.absolute.clone();
        let mut writes = Vec::new();
        for (i, rel) in part {
            if !b.reuse(rel, &new.entries[*i])? {
                writes.push(*i);
            }
        }
        Ok(Linked {
            writes,
            report: b.report,
            used: b.used,
        })
    }

    pub(super) fn mkdir(&mut self, rel: &Path) -> Result<()> {
        let (dir, name) = self.stage.parent_made(rel)?;
        match dir.mkdir_at(name, 0o777) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if !dir.lstat_at(name)?.as_ref().is_some_and(unpack_is_dir) {
                    return Err(fallback(format!("duplicate entry `{}`", rel.display())));
                }
            }
            Err(e) => return Err(e).with_context(|| format!("creating `{}`", rel.display())),
        }
        self.report.stats.dirs += 1;
        Ok(())
    }

    pub(super) fn symlink(&mut self, rel: &Path, e: &Entry) -> Result<()> {
        let target = e.target.as_deref().unwrap_or_default();
        unpack::check_symlink_target_with(rel, target, &self.absolute)
            .map_err(|why| fallback(format!("entry {}: {why}", shown(&e.path))))?;
        let (dir, name) = self.stage.parent_made(rel)?;
        match dir.symlink_at(OsStr::from_bytes(target), name) {
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
            }
            r => r.with_context(|| format!("creating the symlink `{}`", rel.display()))?,
        }
        dir.set_mtime_at(name, FIXED_MTIME)
            .with_context(|| format!("setting the mtime of `{}`", rel.display()))?;
        self.report.stats.symlinks += 1;
        Ok(())
    }
}

pub(super) fn unpack_is_dir(st: &libc::stat) -> bool {
    st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// How a file came from the installed tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Reused {
    Linked,
    Copied,
    /// Its bytes were not the digest after all: written from the tar.
    No,
}

impl Builder<'_> {
    /// Links (or copies) `e` from an installed file with its digest whose
    /// stat still matches the record, the same path first. False when
    /// there is none: the entry is written from the tar.
    pub(super) fn reuse(&mut self, rel: &Path, e: &Entry) -> Result<bool> {
        let Some(cands) = e.sha256.and_then(|d| self.by_digest.get(&d)) else {
            return Ok(false);
        };
        let mut order = cands.clone();
        if let Some(&same) = self.by_path.get(e.path.as_slice())
            && let Some(pos) = order.iter().position(|&x| x == same)
        {
            order.swap(0, pos);
        }
        for oi in order {
            let stat = self.old.stats[oi].expect("candidates have stats");
            if stat.size != e.size || stat.mtime_ns != FIXED_MTIME as i64 * 1_000_000_000 {
                continue;
            }
            let how = if let Some(first) = self.used.get(&(stat.dev, stat.ino)).cloned() {
                self.copy_staged(rel, &first, e)?
            } else if let Some(inode) = self.checked_inode(oi, &stat, e) {
                self.link_or_copy(rel, &inode, &stat, e)?
            } else {
                Reused::No
            };
            match how {
                Reused::No => continue,
                Reused::Linked => {
                    self.used.insert((stat.dev, stat.ino), rel.to_path_buf());
                }
                Reused::Copied => {}
            }
            self.report.stats.files += 1;
            return Ok(true);
        }
        Ok(false)
    }

    /// A handle on installed entry `oi` if it is still the file the record
    /// describes (same dev, inode, size, mode, links, mtime and ctime), and,
    /// when its ctime is racy (`Record::clock_ns`), still has `e`'s digest.
    pub(super) fn checked_inode(&mut self, oi: usize, stat: &FileStat, e: &Entry) -> Option<File> {
        let tree = self.old_tree.as_mut()?;
        let rel = unpack::safe_relative(&self.old.index.entries[oi].path).ok()?;
        let (dir, name) = tree.parent(&rel).ok()?;
        let inode = dir.open_inode_at(name).ok()?;
        let now = FileStat::of(&unpack::fstat(&inode).ok()?);
        if now != *stat || !now.is_file() {
            return None;
        }
        if stat.ctime_ns > self.old.racy_after_ns {
            self.report.files_hashed += 1;
            let mut f = unpack::reopen_for_reading(&inode).ok()?;
            let mut h = Sha256::new();
            io::copy(&mut f, &mut h).ok()?;
            if Some(<[u8; 32]>::from(h.finalize())) != e.sha256 {
                return None;
            }
        }
        Some(inode)
    }

    pub(super) fn link_or_copy(
        &mut self,
        rel: &Path,
        inode: &File,
        stat: &FileStat,
        e: &Entry,
    ) -> Result<Reused> {
        let (dir, name) = self.stage.parent_made(rel)?;
        if stat.mode & 0o777 == e.mode & 0o777 {
            match dir.link_inode_at(inode, name) {
                Ok(()) => {
                    self.report.files_linked += 1;
                    self.report.bytes_linked += e.size;
                    return Ok(Reused::Linked);
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                    return Err(fallback(format!("duplicate entry {}", shown(&e.path))));
                }
                // Another file system, too many links, no /proc: copy.
                Err(_) => {}
            }
        }
        let Ok(src) = unpack::reopen_for_reading(inode) else {
            return Ok(Reused::No);
        };
        copy_into(dir, name, &src, e, &mut self.buf, &mut self.report)
    }

    /// A copy of what this install already linked at `first` in staging.
    pub(super) fn copy_staged(&mut self, rel: &Path, first: &Path, e: &Entry) -> Result<Reused> {
        let parent = first.parent().unwrap_or(Path::new(""));
        let src_dir = unpack::open_beneath(&self.stage.root, parent, Links::None)
            .with_context(|| format!("opening `{}` in staging", parent.display()))?;
        let name = first.file_name().expect("a staged file has a name");
        let src = src_dir
            .open_file_at(name)
            .with_context(|| format!("opening `{}` in staging", first.display()))?;
        let (dir, name) = self.stage.parent_made(rel)?;
        copy_into(dir, name, &src, e, &mut self.buf, &mut self.report)
    }
}

/// Creates `name` in `dir` with the bytes of `src`: a reflink where the
/// file system makes one, else a copy, hashed on the way and refused
/// (removed, `Reused::No`) unless it is the entry's digest.
pub(super) fn copy_into(
    dir: &Dir,
    name: &OsStr,
    src: &File,
    e: &Entry,
    buf: &mut [u8],
    report: &mut Report,
) -> Result<Reused> {
    let out = create_entry_file(dir, name, e)?;
    // SAFETY: two open fds; FICLONE only reads its argument.
    let cloned = unsafe { libc::ioctl(out.as_raw_fd(), libc::FICLONE, src.as_raw_fd()) } == 0;
    if !cloned && !same_content(copy_hashed(&mut &*src, &out, e, buf, "the installed")?, e) {
        dir.unlink_at(name)
            .with_context(|| format!("removing {}", shown(&e.path)))?;
        return Ok(Reused::No);
    }
    finish_file(&out, e)?;
    if cloned {
        report.files_linked += 1;
        report.bytes_linked += e.size;
    } else {
        report.files_copied += 1;
        report.stats.bytes += e.size;
    }
    Ok(if cloned {
        Reused::Linked
    } else {
        Reused::Copied
    })
}

/// Whether what was copied has the entry's size and digest.
pub(super) fn same_content((size, digest): (u64, [u8; 32]), e: &Entry) -> bool {
    size == e.size && Some(digest) == e.sha256
}

/// Copies `src` into `out`, hashing the bytes on the way: how many there
/// were and their sha256. `reading` names the source in an error (`the
/// installed`, `tar entry`). The one copy loop of the delta, for the files
/// it copies from the installed tree and those it writes from the tar.
pub(super) fn copy_hashed(
    src: &mut dyn Read,
    mut out: &File,
    e: &Entry,
    buf: &mut [u8],
    reading: &str,
) -> Result<(u64, [u8; 32])> {
    let mut h = Sha256::new();
    let mut done = 0u64;
    loop {
        let n = src
            .read(buf)
            .with_context(|| format!("reading {reading} {}", shown(&e.path)))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", shown(&e.path)))?;
        done += n as u64;
    }
    Ok((done, h.finalize().into()))
}

/// Creates the file of entry `e` as `name` in `dir`; one that is there
/// already is a duplicate entry, which a full install judges.
pub(super) fn create_entry_file(dir: &Dir, name: &OsStr, e: &Entry) -> Result<File> {
    match dir.create_file_at(name) {
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
            Err(fallback(format!("duplicate entry {}", shown(&e.path))))
        }
        r => r.with_context(|| format!("creating {}", shown(&e.path))),
    }
}

/// The entry's mode (permission bits, as the extractor keeps them) and the
/// fixed mtime.
pub(super) fn finish_file(out: &File, e: &Entry) -> Result<()> {
    out.set_permissions(std::fs::Permissions::from_mode(e.mode & 0o777))
        .with_context(|| format!("setting the mode of {}", shown(&e.path)))?;
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(FIXED_MTIME);
    out.set_modified(t)
        .with_context(|| format!("setting the mtime of {}", shown(&e.path)))
}
