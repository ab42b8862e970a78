//! The new key's file index, trusted only once its size and sha256 match
//! `warmstart.json` and it agrees with the key, and an index in parts
//! joined from the parts the installed copy holds and those it lacks. It
//! never reads the tar.

use super::*;

/// A key's index, checked against its entry.
#[derive(Clone, Debug)]
pub struct NewIndex {
    /// The file as on the branch (zstd of the text), kept for the record.
    pub bytes: Vec<u8>,
    pub index: Index,
}

/// The most index text accepted per entry: a long path escaped (`%XX`)
/// twice over (a hardlink's target) and the numbers.
pub(super) const INDEX_BYTES_PER_ENTRY: u64 = 2 * 3 * 4096 + 256;

/// Decompresses and parses an index of a key with `files` entries.
pub(super) fn decode_index(bytes: &[u8], files: u64) -> Result<Index, String> {
    let cap = files
        .saturating_add(1)
        .saturating_mul(INDEX_BYTES_PER_ENTRY);
    let mut text = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .and_then(|d| d.take(cap + 1).read_to_end(&mut text))
        .map_err(|e| format!("it does not decompress ({e})"))?;
    if text.len() as u64 > cap {
        return Err(format!("it decompresses to more than {cap} bytes"));
    }
    let text = String::from_utf8(text).map_err(|_| "it is not UTF-8 text".to_string())?;
    Index::parse(&text).map_err(|e| format!("{e:#}"))
}

/// Checks a fetched index against its key: its size and sha256 as
/// `warmstart.json` gives them, then that it agrees with the key.
pub fn check_index(bytes: Vec<u8>, entry: &KeyEntry) -> Result<NewIndex, String> {
    let Some(i) = &entry.index else {
        return Err("the key has no file index".into());
    };
    if bytes.len() as u64 != i.size {
        return Err(format!(
            "{} is {} bytes but warmstart.json says {}",
            i.file,
            bytes.len(),
            i.size
        ));
    }
    let got = hex::encode(&Sha256::digest(&bytes));
    if !got.eq_ignore_ascii_case(&i.sha256) {
        return Err(format!(
            "{} has sha256 {got} but warmstart.json says {}",
            i.file, i.sha256
        ));
    }
    let index = decode_index(&bytes, entry.files).map_err(|e| format!("{}: {e}", i.file))?;
    agree(&index, entry).map_err(|e| format!("{}: {e}", i.file))?;
    Ok(NewIndex { bytes, index })
}

/// The index covers the key's tar: one line per entry, from offset 0 to
/// the end-of-archive blocks.
pub(super) fn agree(index: &Index, entry: &KeyEntry) -> Result<(), String> {
    if index.entries.len() as u64 != entry.files {
        return Err(format!(
            "it lists {} entries but the key has {}",
            index.entries.len(),
            entry.files
        ));
    }
    let (Some(first), Some(last)) = (index.entries.first(), index.entries.last()) else {
        return Ok(());
    };
    if first.offset != 0 || last.end.saturating_add(1024) > entry.tar_size {
        return Err(format!(
            "its entries span {}..{} but the tar is {} bytes",
            first.offset, last.end, entry.tar_size
        ));
    }
    Ok(())
}

/// The index of a key stored in parts (`KeyEntry::index_parts`), joined:
/// each part is taken from the copy of the installed key's index at
/// `local` when one of its zstd frames has the part's sha256 (a part that
/// did not change is the same frame), else read from cache.git, fetched by
/// id first only if the branch fetch left it out. Every part is checked
/// against its size and sha256 before any is decoded; the joined bytes
/// are what `check_index` checks against the (signed) whole.
pub(super) fn join_parts(
    git: &CacheGit,
    branch: &Branch,
    entry: &KeyEntry,
    local: &Path,
) -> Result<Result<Vec<u8>, String>> {
    let mut blobs = Vec::with_capacity(entry.index_parts.len());
    for p in &entry.index_parts {
        match branch
            .entries
            .iter()
            .find(|e| e.name == p.file && e.kind == "blob")
        {
            Some(b) => blobs.push(b),
            None => {
                return Ok(Err(format!(
                    "{} is named in warmstart.json but not on branch {}",
                    p.file, branch.name
                )));
            }
        }
    }
    let kept = std::fs::read(local).unwrap_or_default();
    let frames = frames_by_digest(&kept);
    let wanted: Vec<usize> = (0..blobs.len())
        .filter(|&i| !frames.contains_key(entry.index_parts[i].sha256.as_str()))
        .collect();
    let absent: Vec<String> = wanted
        .iter()
        .filter(|&&i| blobs[i].size.is_none())
        .map(|&i| blobs[i].oid.clone())
        .collect();
    if !absent.is_empty() {
        prefetch::fetch_all(git, &branch.remote, &branch.name, &absent)
            .with_context(|| format!("fetching the file index parts of branch {}", branch.name))?;
    }
    let oids: Vec<&str> = wanted.iter().map(|&i| blobs[i].oid.as_str()).collect();
    let limits: Vec<u64> = wanted.iter().map(|&i| entry.index_parts[i].size).collect();
    let mut read = read_blobs(git, &oids, &limits)
        .with_context(|| format!("reading the file index parts of branch {}", branch.name))?
        .into_iter();
    let mut joined = Vec::new();
    for p in &entry.index_parts {
        let bytes = match frames.get(p.sha256.as_str()) {
            Some(frame) => frame.to_vec(),
            None => read.next().context("git cat-file answered too few parts")?,
        };
        let got = hex::encode(&Sha256::digest(&bytes));
        if bytes.len() as u64 != p.size || !got.eq_ignore_ascii_case(&p.sha256) {
            return Ok(Err(format!(
                "{} is {} bytes with sha256 {got} but warmstart.json says {} bytes with sha256 {}",
                p.file,
                bytes.len(),
                p.size,
                p.sha256
            )));
        }
        joined.extend_from_slice(&bytes);
    }
    Ok(Ok(joined))
}

/// Each whole zstd frame of `bytes` by its sha256 (a damaged tail ends the
/// list: those parts are read from the branch instead).
fn frames_by_digest(bytes: &[u8]) -> HashMap<String, &[u8]> {
    let mut out = HashMap::new();
    let mut at = 0;
    while at < bytes.len() {
        let Ok(n) = zstd::zstd_safe::find_frame_compressed_size(&bytes[at..]) else {
            break;
        };
        if n == 0 || at + n > bytes.len() {
            break;
        }
        let frame = &bytes[at..at + n];
        out.insert(hex::encode(&Sha256::digest(frame)), frame);
        at += n;
    }
    out
}

/// The blobs `oids`, all in cache.git, through one `git cat-file --batch`
/// (a process per part would cost more than the parts): each at most
/// `limits[i] + 1` bytes are kept, so a wrong size shows, never a flood.
fn read_blobs(git: &CacheGit, oids: &[&str], limits: &[u64]) -> Result<Vec<Vec<u8>>> {
    if oids.is_empty() {
        return Ok(Vec::new());
    }
    let mut cmd = git.git();
    cmd.args(["cat-file", "--batch"]);
    crate::process::group::die_with_parent(&mut cmd);
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .context("running git cat-file --batch")?;
    let input: String = oids.iter().map(|o| format!("{o}\n")).collect();
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let mut out = io::BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut blobs = Vec::with_capacity(oids.len());
    for (oid, limit) in oids.iter().zip(limits) {
        let mut header = String::new();
        io::BufRead::read_line(&mut out, &mut header)?;
        let size = match header.trim_end().split(' ').collect::<Vec<_>>()[..] {
            [o, "blob", size] if o == *oid => size.parse::<u64>().ok(),
            _ => None,
        }
        .ok_or_else(|| anyhow!("git cat-file --batch answered {header:?} for {oid}"))?;
        let keep = size.min(limit + 1);
        let mut blob = Vec::with_capacity(keep as usize);
        (&mut out).take(keep).read_to_end(&mut blob)?;
        io::copy(&mut (&mut out).take(size - keep + 1), &mut io::sink())?;
        blobs.push(blob);
    }
    drop(out);
    let _ = writer.join();
    let _ = child.wait();
    Ok(blobs)
}
