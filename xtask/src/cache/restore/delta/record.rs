//! The record an install leaves for the next delta: each installed file's
//! stat beside a copy of its key's index, written once the install is final
//! and read back only when it still names the stamp's key and tar. It never
//! vouches for a file whose stat moved.

use super::*;

/// One installed file's stat, as recorded just before the swap (a link
/// made into it and the removal of the shadow before move its ctime, and
/// both come before the record; the swap itself moves no file's stat).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStat {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// `st_mode`, file-type bits included.
    pub mode: u32,
    /// Links to the inode: a hardlink someone made to it (from outside the
    /// tree too) changes it, whatever the clock.
    pub nlink: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

impl FileStat {
    pub fn of(st: &libc::stat) -> FileStat {
        FileStat {
            dev: st.st_dev,
            ino: st.st_ino,
            size: st.st_size as u64,
            mode: st.st_mode,
            nlink: st.st_nlink,
            mtime_ns: st.st_mtime * 1_000_000_000 + st.st_mtime_nsec,
            ctime_ns: st.st_ctime * 1_000_000_000 + st.st_ctime_nsec,
        }
    }

    pub(super) fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
}

/// The first line of every record this build writes and reads.
pub const RECORD_MAGIC: &str = "warmstart-installed 1";

/// `<state>/cache/installed/<name>.record`: what an install left, file by
/// file (one stat per `File` entry of the index, in index order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub key: String,
    pub tar_sha256: String,
    /// sha256 of the index file kept beside the record.
    pub index_sha256: String,
    /// The clock (ns since the epoch) before the stats were read: a file whose
    /// ctime is within `RACY_NS` of it could be changed again within the
    /// same tick of the file system's coarse clock, unseen by its ctime, so
    /// its bytes are hashed before it is linked (git's "racily clean").
    pub clock_ns: i64,
    /// Whether every recorded file was checked against the index's digest
    /// on this machine: a delta checks what it writes, hashes or inherits
    /// what it links, so its record is; a full install is when its tar
    /// agreed with the index entry for entry (`vouch`, hashed as it was
    /// unpacked), else (a pusher's index may lie about its own tar) the
    /// next delta hashes each file of its record before linking it.
    pub verified: bool,
    pub stats: Vec<FileStat>,
}

/// More than a coarse clock tick (at most 10 ms, at HZ=100).
pub const RACY_NS: i64 = 20_000_000;

impl Record {
    pub fn render(&self) -> String {
        let mut s = format!(
            "{RECORD_MAGIC}\nkey {}\ntar {}\nindex {}\nclock {}\nverified {}\nfiles {}\n",
            self.key,
            self.tar_sha256,
            self.index_sha256,
            self.clock_ns,
            if self.verified { "yes" } else { "no" },
            self.stats.len()
        );
        for st in &self.stats {
            s.push_str(&format!(
                "{} {} {} {:o} {} {} {}\n",
                st.dev, st.ino, st.size, st.mode, st.nlink, st.mtime_ns, st.ctime_ns
            ));
        }
        s
    }

    pub fn parse(text: &str) -> Result<Record> {
        let mut lines = text.split_terminator('\n');
        anyhow::ensure!(lines.next() == Some(RECORD_MAGIC), "not a {RECORD_MAGIC:?}");
        let mut field = |name: &str| -> Result<String> {
            lines
                .next()
                .and_then(|l| l.strip_prefix(name))
                .and_then(|l| l.strip_prefix(' '))
                .map(str::to_string)
                .ok_or_else(|| anyhow!("no {name} line"))
        };
        let key = field("key")?;
        let tar_sha256 = field("tar")?;
        let index_sha256 = field("index")?;
        let clock_ns: i64 = field("clock")?.parse().context("clock")?;
        let verified = match field("verified")?.as_str() {
            "yes" => true,
            "no" => false,
            other => anyhow::bail!("verified is {other:?}, not yes or no"),
        };
        let count: usize = field("files")?.parse().context("files")?;
        let stats = lines.map(parse_stat).collect::<Result<Vec<_>>>()?;
        anyhow::ensure!(
            stats.len() == count,
            "{} stats for {count} files",
            stats.len()
        );
        Ok(Record {
            key,
            tar_sha256,
            index_sha256,
            clock_ns,
            verified,
            stats,
        })
    }
}

pub(super) fn parse_stat(line: &str) -> Result<FileStat> {
    let f: Vec<&str> = line.split(' ').collect();
    anyhow::ensure!(f.len() == 7, "a stat line has 7 fields: {line:?}");
    let n = |i: usize| f[i].parse::<u64>().with_context(|| format!("{line:?}"));
    let t = |i: usize| f[i].parse::<i64>().with_context(|| format!("{line:?}"));
    Ok(FileStat {
        dev: n(0)?,
        ino: n(1)?,
        size: n(2)?,
        mode: u32::from_str_radix(f[3], 8).with_context(|| format!("{line:?}"))?,
        nlink: n(4)?,
        mtime_ns: t(5)?,
        ctime_ns: t(6)?,
    })
}

/// Where the records live.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cache").join("installed")
}

pub fn record_path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.record"))
}

pub fn index_path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.files.zst"))
}

/// `<name>.delta`: a delta of cache `name` is linking installed files
/// into its staging tree, or was when it was killed. Each link moves the
/// linked file's ctime, and so does the removal of a killed delta's
/// staging, so the next delta heals the record first (`heal`) when it
/// finds this. `forget` removes it with the record it is about.
pub fn busy_path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.delta"))
}

/// Removes the record of cache `name` (and what a killed `remember` left):
/// called before the target is replaced, so no record outlives its tree.
pub fn forget(state_dir: &Path, name: &str) -> Result<()> {
    let d = dir(state_dir);
    let entries = match std::fs::read_dir(&d) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", d.display())),
    };
    let (record, index) = (format!("{name}.record"), format!("{name}.files.zst"));
    let busy = format!("{name}.delta");
    for e in entries {
        let e = e.with_context(|| format!("reading {}", d.display()))?;
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = [&record, &index, &busy]
            .iter()
            // `.<f>.tmp-*` is what `fsio::write_atomic` leaves when killed;
            // `<f>.tmp-*` what earlier versions left.
            .any(|f| {
                n == **f
                    || n.starts_with(&format!(".{f}.tmp-"))
                    || n.starts_with(&format!("{f}.tmp-"))
            });
        if ours {
            match std::fs::remove_file(e.path()) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(err).with_context(|| format!("removing {}", e.path().display()));
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// Before an install is swapped in (its staging tree complete, the shadow
/// of the tree before removed): records each file's stat in `root`, the
/// staging tree, with the key's index, for the next delta. The swap only
/// renames directories, so the stats are those of the installed files, and
/// nothing done after the swap can be mistaken for the install. Returns the
/// stats. `verified`: see `Record::verified`.
pub fn remember(
    state_dir: &Path,
    name: &str,
    root: &Path,
    key: &str,
    tar_sha256: &str,
    new: &NewIndex,
    verified: bool,
) -> Result<Vec<FileStat>> {
    let (clock_ns, stats) = settled_stats(root, &new.index)?;
    let record = Record {
        key: key.to_string(),
        tar_sha256: tar_sha256.to_string(),
        index_sha256: hex::encode(&Sha256::digest(&new.bytes)),
        clock_ns,
        verified,
        stats,
    };
    // The index first: the record names it by digest, so a kill between
    // the two leaves a record that does not match, never a wrong one.
    crate::fsio::write_atomic(&index_path(state_dir, name), &new.bytes)?;
    crate::fsio::write_atomic(&record_path(state_dir, name), record.render().as_bytes())?;
    Ok(record.stats)
}

/// The stats of `root`'s files and the clock the record keeps, such that a
/// file is not racy only because the install just made it: the clock is
/// read before the first stat (a file changed after its stat within the
/// same coarse tick as its ctime has a ctime no earlier than the clock less
/// a tick, however long the walk takes). When files are that new, it waits
/// until the newest is `RACY_NS` old (at most twice that), reads the clock
/// again and stats those files again: each stat then comes after a clock no
/// more than `RACY_NS` past its file's ctime, which is all `installed`
/// needs. One wait of about 20 ms per install, never a hash.
pub(super) fn settled_stats(root: &Path, index: &Index) -> Result<(i64, Vec<FileStat>)> {
    let clock = now_ns();
    let mut stats = stat_files_where(root, index, &|_| true)?;
    let racy = |st: &Option<FileStat>| st.is_some_and(|s| s.ctime_ns > clock - RACY_NS);
    let Some(newest) = stats.iter().flatten().map(|s| s.ctime_ns).max() else {
        return Ok((clock, stats.into_iter().flatten().collect()));
    };
    if newest <= clock - RACY_NS {
        return Ok((clock, stats.into_iter().flatten().collect()));
    }
    let wait = (newest + RACY_NS + 1_000_000 - now_ns()).clamp(0, 2 * RACY_NS);
    std::thread::sleep(std::time::Duration::from_nanos(wait as u64));
    let again_at = now_ns();
    let which: Vec<bool> = stats.iter().map(racy).collect();
    let again = stat_files_where(root, index, &|k| which[k])?;
    for (k, st) in again.into_iter().enumerate() {
        if st.is_some() {
            stats[k] = st;
        }
    }
    Ok((again_at, stats.into_iter().flatten().collect()))
}

/// After a delta failed and its staging tree was removed: the record of the
/// installed tree again, so that a retry can link what it linked. Each file
/// whose stat moved in its ctime alone (the link the delta made and the
/// unlink of its staging moved it; links, size, mode, mtime are as
/// recorded) gets its new stat, which is always racy against the record's
/// clock (kept, as the key, the index and `verified` are): the retry hashes
/// it before it links it, so an edit made while the delta ran (with the
/// mtime put back) is still never linked. Returns how many it renewed.
pub fn heal(state_dir: &Path, name: &str, target: &Path, old: &Installed) -> Result<u64> {
    let path = record_path(state_dir, name);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut record = Record::parse(&text).with_context(|| format!("{}", path.display()))?;
    anyhow::ensure!(record.key == old.key, "{} moved on", path.display());
    let racy_after = record.clock_ns.saturating_sub(RACY_NS);
    let mut tree = Tree::open(target)?;
    let files = old.index.entries.iter().filter(|e| e.kind == Kind::File);
    let mut renewed = 0;
    for (st, e) in record.stats.iter_mut().zip(files) {
        let Ok(rel) = entry_rel(e) else { continue };
        let Ok((dir, file)) = tree.parent(&rel) else {
            continue;
        };
        let Ok(Some(now)) = dir.lstat_at(file) else {
            continue;
        };
        let now = FileStat::of(&now);
        let ctime_only = FileStat {
            ctime_ns: st.ctime_ns,
            ..now
        } == *st;
        if now != *st && ctime_only && now.ctime_ns > racy_after {
            *st = now;
            renewed += 1;
        }
    }
    if renewed > 0 {
        crate::fsio::write_atomic(&path, record.render().as_bytes())?;
    }
    Ok(renewed)
}

/// The real-time clock in ns (the one file times are taken from; their
/// coarse ticks are never ahead of it).
pub(super) fn now_ns() -> i64 {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// `remember`, before the swap. A failure only costs the next restore its
/// delta: a warning, never an error (the install itself goes on). The
/// inodes of the recorded files, which the swap keeps names of (`unpack::
/// Retire::Shadow`); `None` when nothing was recorded.
pub fn remember_or_warn(
    state_dir: &Path,
    name: &str,
    root: &Path,
    key: &str,
    tar_sha256: &str,
    new: &NewIndex,
    verified: bool,
) -> Option<HashSet<(u64, u64)>> {
    let kept = match remember(state_dir, name, root, key, tar_sha256, new, verified) {
        Ok(stats) => Some(stats.iter().map(|s| (s.dev, s.ino)).collect()),
        Err(e) => {
            eprintln!("warning: {e:#}; the next restore of {name} installs in full");
            None
        }
    };
    unpack::kill_point("delta:recorded");
    kept
}

/// The stat of the `k`-th `File` entry of `index` in `target` (in index
/// order) for each `k` with `want(k)`, else `None`, read through directory
/// handles that never follow a symlink.
pub(super) fn stat_files_where(
    target: &Path,
    index: &Index,
    want: &dyn Fn(usize) -> bool,
) -> Result<Vec<Option<FileStat>>> {
    let mut tree = Tree::open(target)?;
    let mut out = Vec::new();
    for (k, e) in index
        .entries
        .iter()
        .filter(|e| e.kind == Kind::File)
        .enumerate()
    {
        if !want(k) {
            out.push(None);
            continue;
        }
        let rel = entry_rel(e)?;
        let shown = || target.join(&rel).display().to_string();
        let (dir, name) = tree
            .parent(&rel)
            .with_context(|| format!("reading {}", shown()))?;
        let st = dir
            .lstat_at(name)
            .with_context(|| format!("reading {}", shown()))?
            .ok_or_else(|| anyhow!("{} is missing after the install", shown()))?;
        out.push(Some(FileStat::of(&st)));
    }
    Ok(out)
}

/// What the installed tree is, by the record and its index.
#[derive(Clone, Debug)]
pub struct Installed {
    pub key: String,
    pub index: Index,
    /// One per index entry: the recorded stat of a `File`, else `None`.
    pub stats: Vec<Option<FileStat>>,
    /// Files whose recorded ctime is after this are hashed before use.
    pub racy_after_ns: i64,
}

/// The record of cache `name`, if it describes the install `stamp` names
/// (`key`, `tar_sha256`, `files`). `Ok(None)`: there is none (an older
/// warmstart installed it, or its key had no index). `Err`: it is there but
/// cannot be used (why, in words): our own state, so never an error.
pub fn installed(
    state_dir: &Path,
    name: &str,
    key: &str,
    tar_sha256: &str,
    files: u64,
) -> Result<Option<Installed>, String> {
    let path = record_path(state_dir, name);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let record = Record::parse(&text).map_err(|e| format!("{}: {e:#}", path.display()))?;
    if record.key != key || !record.tar_sha256.eq_ignore_ascii_case(tar_sha256) {
        return Err(format!(
            "{} describes key {}, not the installed {key}",
            path.display(),
            record.key
        ));
    }
    let ipath = index_path(state_dir, name);
    let bytes = std::fs::read(&ipath).map_err(|e| format!("{}: {e}", ipath.display()))?;
    if hex::encode(&Sha256::digest(&bytes)) != record.index_sha256 {
        return Err(format!(
            "{} is not the index its record names",
            ipath.display()
        ));
    }
    let index = decode_index(&bytes, files).map_err(|e| format!("{}: {e}", ipath.display()))?;
    // Unverified: every file counts as racy, so it is hashed before use.
    let clock_ns = if record.verified {
        record.clock_ns
    } else {
        i64::MIN.saturating_add(RACY_NS)
    };
    let mut stats = record.stats.into_iter();
    let aligned: Vec<Option<FileStat>> = index
        .entries
        .iter()
        .map(|e| {
            if e.kind == Kind::File {
                stats.next()
            } else {
                None
            }
        })
        .collect();
    let files_in_index = index
        .entries
        .iter()
        .filter(|e| e.kind == Kind::File)
        .count();
    if stats.next().is_some() || aligned.iter().flatten().count() != files_in_index {
        return Err(format!("{} does not match its index", path.display()));
    }
    Ok(Some(Installed {
        key: key.to_string(),
        index,
        stats: aligned,
        racy_after_ns: clock_ns.saturating_sub(RACY_NS),
    }))
}
