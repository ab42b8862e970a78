//! Which chunk files of `cache.git/chunks` go: `choose` (pure) over the
//! store's files and the digests installed keys need, then the removal.
//! It never removes a chunk an installed key needs, nor any chunk while an
//! install's needs cannot be told.

use anyhow::{Result, anyhow};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use super::needs::needs_for;
use super::{ChunkReport, Options, Report, read_dir_or_empty, remove_file, store_size};
use crate::cache::restore::stamp::{self, Loaded};
use crate::git::CacheGit;

/// One chunk file of the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkFile {
    pub name: String,
    pub size: u64,
    /// Last fetched or used (mtime), epoch ms.
    pub used_ms: u64,
}

/// What `choose` needs to know.
#[derive(Clone, Debug)]
pub struct Budget {
    pub now_ms: u64,
    pub keep_ms: u64,
    /// The stores' size limit.
    pub max_bytes: u64,
    /// Bytes of the stores that are not chunk files.
    pub other_bytes: u64,
}

/// The chunks to remove (indices into `chunks`), pure: every one not in
/// `protected` that was not used within `keep_ms`, then, while the stores
/// are over `max_bytes`, the unprotected rest least recently used first
/// (by name on a tie). A protected chunk is never chosen.
pub fn choose(chunks: &[ChunkFile], protected: &HashSet<String>, b: &Budget) -> Vec<usize> {
    let mut total = b.other_bytes + chunks.iter().map(|c| c.size).sum::<u64>();
    let mut out = Vec::new();
    let mut rest = Vec::new();
    for (i, c) in chunks.iter().enumerate() {
        if protected.contains(&c.name) {
            continue;
        }
        if b.now_ms.saturating_sub(c.used_ms) > b.keep_ms {
            total -= c.size;
            out.push(i);
        } else {
            rest.push(i);
        }
    }
    rest.sort_by(|&x, &y| {
        (chunks[x].used_ms, &chunks[x].name).cmp(&(chunks[y].used_ms, &chunks[y].name))
    });
    for i in rest {
        if total <= b.max_bytes {
            break;
        }
        total -= chunks[i].size;
        out.push(i);
    }
    out.sort_unstable();
    out
}

/// The chunk files of the store (64 lower-case hex digits; partial files
/// and anything else are not gc's).
fn list_chunks(dir: &Path) -> Result<Vec<ChunkFile>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let is_digest = name.len() == 64
            && name
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        let Ok(m) = e.metadata() else { continue };
        if !is_digest || !m.is_file() {
            continue;
        }
        let used_ms = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_millis() as u64);
        out.push(ChunkFile {
            name,
            size: m.len(),
            used_ms,
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// What the installed keys need: digests, or why it cannot be told.
struct Protected {
    digests: HashSet<String>,
    /// Installs whose chunks could not be told (gc then removes no chunk).
    unknown: Vec<String>,
    /// Records of installs that no stamp describes any more.
    stale: Vec<PathBuf>,
}

fn protected(state_dir: &Path, git: Option<&CacheGit>) -> Result<Protected> {
    let mut p = Protected {
        digests: HashSet::new(),
        unknown: Vec::new(),
        stale: Vec::new(),
    };
    let mut names = BTreeSet::new();
    let stamps = stamp::dir(state_dir);
    for e in read_dir_or_empty(&stamps)? {
        let path = e.path();
        let file = e.file_name().to_string_lossy().into_owned();
        let Some(name) = file.strip_suffix(".json") else {
            continue;
        };
        names.insert(name.to_string());
        let s = match stamp::load(&path) {
            Loaded::Found(s) => s,
            Loaded::Missing => continue,
            Loaded::Corrupt(_) => {
                p.unknown.push(format!("{name} (its stamp does not read)"));
                continue;
            }
        };
        match needs_for(state_dir, &s, git) {
            Some(needs) => {
                for n in needs {
                    p.digests.extend(n.raw_sha256);
                    p.digests.insert(n.sha256);
                }
            }
            None => p.unknown.push(format!(
                "{name} (key {}: no record of its chunks, and commit {} is not in cache.git; restore it once with `{} cache restore {name} --verify`)",
                s.key,
                &s.commit[..s.commit.len().min(12)],
                crate::invocation::command()
            )),
        }
    }
    let needs_dir = state_dir.join("cache").join("needs");
    for e in read_dir_or_empty(&needs_dir)? {
        let file = e.file_name().to_string_lossy().into_owned();
        if let Some(name) = file.strip_suffix(".json")
            && !names.contains(name)
        {
            p.stale.push(e.path());
        }
    }
    Ok(p)
}
pub(super) fn collect_chunks(
    state_dir: &Path,
    git: Option<&CacheGit>,
    opts: &Options,
    r: &Report,
) -> Result<ChunkReport> {
    let dir = state_dir.join("cache.git").join("chunks");
    let chunks = list_chunks(&dir)?;
    let p = protected(state_dir, git)?;
    let chunk_bytes: u64 = chunks.iter().map(|c| c.size).sum();
    let stores_now = if opts.dry_run {
        r.before_bytes
    } else {
        store_size(state_dir)
    };
    let budget = Budget {
        now_ms: crate::clock::now_ms(),
        keep_ms: opts.keep.as_millis() as u64,
        max_bytes: opts.max_bytes,
        other_bytes: stores_now.saturating_sub(chunk_bytes),
    };
    let gone = if p.unknown.is_empty() {
        choose(&chunks, &p.digests, &budget)
    } else {
        Vec::new()
    };
    let mut out = ChunkReport {
        unknown_installs: p.unknown,
        ..ChunkReport::default()
    };
    let gone_set: HashSet<usize> = gone.iter().copied().collect();
    for (i, c) in chunks.iter().enumerate() {
        if gone_set.contains(&i) {
            if !opts.dry_run {
                remove_file(&dir.join(&c.name))?;
            }
            out.removed += 1;
            out.removed_bytes += c.size;
        } else {
            out.kept += 1;
            out.kept_bytes += c.size;
            if p.digests.contains(&c.name) {
                out.protected += 1;
                out.protected_bytes += c.size;
            }
        }
    }
    if !opts.dry_run {
        for f in p.stale {
            remove_file(&f)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_rng::Rng;

    #[test]
    fn choose_never_picks_a_protected_chunk_and_meets_the_budget_when_it_can() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..2000 {
            let n = rng.below(30) as usize;
            let chunks: Vec<ChunkFile> = (0..n)
                .map(|i| ChunkFile {
                    name: format!("{i:064x}"),
                    size: 1 + rng.below(1000),
                    used_ms: rng.below(100_000),
                })
                .collect();
            let protected: HashSet<String> = chunks
                .iter()
                .filter(|_| rng.below(3) == 0)
                .map(|c| c.name.clone())
                .collect();
            let b = Budget {
                now_ms: 100_000,
                keep_ms: rng.below(120_000),
                max_bytes: rng.below(20_000),
                other_bytes: rng.below(2_000),
            };
            let gone = choose(&chunks, &protected, &b);
            let gone_set: HashSet<usize> = gone.iter().copied().collect();
            let mut left = b.other_bytes;
            let mut floor = b.other_bytes;
            for (i, c) in chunks.iter().enumerate() {
                let old = b.now_ms - c.used_ms > b.keep_ms;
                if protected.contains(&c.name) {
                    assert!(!gone_set.contains(&i), "a protected chunk was chosen");
                    floor += c.size;
                }
                if old && !protected.contains(&c.name) {
                    assert!(gone_set.contains(&i), "an old unneeded chunk stayed");
                }
                if !gone_set.contains(&i) {
                    left += c.size;
                }
            }
            if floor <= b.max_bytes {
                assert!(
                    left <= b.max_bytes,
                    "{left} > {} with floor {floor}",
                    b.max_bytes
                );
            }
            // Least recently used first: no kept unprotected chunk is older
            // than a recent one that went for the budget.
            let kept_oldest = chunks
                .iter()
                .enumerate()
                .filter(|(i, c)| !gone_set.contains(i) && !protected.contains(&c.name))
                .map(|(_, c)| c.used_ms)
                .min();
            for &i in &gone {
                let c = &chunks[i];
                if b.now_ms - c.used_ms <= b.keep_ms
                    && let Some(k) = kept_oldest
                {
                    assert!(c.used_ms <= k, "went {} kept {k}", c.used_ms);
                }
            }
        }
    }
}
