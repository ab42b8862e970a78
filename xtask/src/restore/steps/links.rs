//! `links`: regenerate a symlink farm from a directory scan.
//!
//! One relative symlink in `farm` per entry of `source` (dot-names skipped),
//! dangling symlinks in `farm` removed, and a warning for each entry that the
//! `index` file does not mention by name. It only ever creates, replaces or
//! removes symlinks: a regular file or directory in the farm is left alone
//! with a warning. The probe is a directory scan and a few `readlink` calls.

use anyhow::{Context, Result};
use std::path::{Component, Path, PathBuf};

use super::{Ctx, Outcome, Probe};
use crate::restore::plan::{Entries, Links};
use crate::restore::proc::Log;

/// Entry names of `source` that belong in the farm, sorted.
fn scan(l: &Links) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let dir =
        std::fs::read_dir(&l.source).with_context(|| format!("scanning {}", l.source.display()))?;
    for entry in dir {
        let entry = entry.with_context(|| format!("scanning {}", l.source.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        let is_dir = std::fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
        let keep = match l.entries {
            Entries::All => true,
            Entries::Dirs => is_dir,
            Entries::Files => !is_dir,
        };
        if keep {
            names.push(name);
        }
    }
    names.sort();
    Ok(names)
}

/// `to` as seen from directory `from`, lexically (both absolute).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let f: Vec<Component> = from.components().collect();
    let t: Vec<Component> = to.components().collect();
    let common = f.iter().zip(&t).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..f.len() {
        rel.push("..");
    }
    for c in &t[common..] {
        rel.push(c);
    }
    rel
}

/// Whether the farm entry already points at the source entry.
fn points_right(link: &Path, want: &Path, entry: &Path) -> bool {
    match std::fs::read_link(link) {
        Ok(t) if t == want => true,
        Ok(_) => match (std::fs::canonicalize(link), std::fs::canonicalize(entry)) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        },
        Err(_) => false,
    }
}

/// Symlinks in the farm whose target is gone.
fn dangling(farm: &Path) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(farm) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .filter(|e| std::fs::metadata(e.path()).is_err())
        .map(|e| e.path())
        .collect()
}

/// Whether `text` mentions `name` as a whole word (not inside a longer name).
fn mentions(text: &str, name: &str) -> bool {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-' || c == '_');
    text.match_indices(name).any(|(i, _)| {
        !word(text[..i].chars().next_back()) && !word(text[i + name.len()..].chars().next())
    })
}

fn index_warnings(l: &Links, names: &[String]) -> Vec<String> {
    let Some(index) = &l.index else {
        return Vec::new();
    };
    match std::fs::read_to_string(index) {
        Ok(text) => names
            .iter()
            .filter(|n| !mentions(&text, n))
            .map(|n| {
                format!(
                    "WARNING: {} does not mention {n} (linked from {})",
                    index.display(),
                    l.source.join(n).display()
                )
            })
            .collect(),
        Err(e) => vec![format!(
            "WARNING: cannot read the index {}: {e}",
            index.display()
        )],
    }
}

pub fn probe(_ctx: &Ctx, l: &Links) -> Probe {
    let names = match scan(l) {
        Ok(n) => n,
        Err(e) => return Probe::Needed(format!("{e:#}")),
    };
    if let Some(n) = names.iter().find(|n| {
        let entry = l.source.join(n);
        !points_right(&l.farm.join(n), &relative(&l.farm, &entry), &entry)
    }) {
        return Probe::Needed(format!("{n} is not linked"));
    }
    if let Some(d) = dangling(&l.farm).first() {
        return Probe::Needed(format!("{} is dangling", d.display()));
    }
    Probe::Warm {
        what: format!("{} links current", names.len()),
        warnings: index_warnings(l, &names),
    }
}

pub fn run(_ctx: &Ctx, l: &Links, log: &mut Log) -> Result<Outcome> {
    let names = scan(l)?;
    std::fs::create_dir_all(&l.farm).with_context(|| format!("creating {}", l.farm.display()))?;
    let mut warnings = Vec::new();
    let removed = dangling(&l.farm);
    for d in &removed {
        std::fs::remove_file(d).with_context(|| format!("removing {}", d.display()))?;
        log.line(&format!("removed dangling {}", d.display()));
    }
    let (mut linked, mut current) = (0, 0);
    for n in &names {
        let link = l.farm.join(n);
        let entry = l.source.join(n);
        let want = relative(&l.farm, &entry);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => {
                if points_right(&link, &want, &entry) {
                    current += 1;
                    continue;
                }
            }
            Ok(_) => {
                warnings.push(format!(
                    "WARNING: {} exists and is not a symlink: left alone (move it away to link {n})",
                    link.display()
                ));
                continue;
            }
            Err(_) => {}
        }
        // A temp link renamed into place: readers never see a missing entry.
        let tmp = l
            .farm
            .join(format!(".{n}.warmstart-{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&want, &tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        std::fs::rename(&tmp, &link)
            .with_context(|| format!("renaming onto {}", link.display()))?;
        log.line(&format!("linked {} -> {}", link.display(), want.display()));
        linked += 1;
    }
    warnings.extend(index_warnings(l, &names));
    for w in &warnings {
        log.line(w);
    }
    Ok(Outcome::done(format!(
        "{linked} linked, {} dangling removed, {current} current",
        removed.len()
    ))
    .with_warnings(warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_out_of_the_farm() {
        assert_eq!(
            relative(Path::new("/r/.claude/skills"), Path::new("/r/skills/a")),
            Path::new("../../skills/a")
        );
        assert_eq!(relative(Path::new("/r"), Path::new("/r/a")), Path::new("a"));
    }

    #[test]
    fn mentions_whole_names_only() {
        assert!(mentions("- [pdf](pdf/SKILL.md)", "pdf"));
        assert!(!mentions("- pdf-tools", "pdf"));
        assert!(!mentions("apdf", "pdf"));
        assert!(mentions("pdf", "pdf"));
    }
}
