//! `links`: regenerate a symlink farm from a directory scan.
//!
//! One relative symlink in `farm` per entry of `source` (dot-names skipped),
//! dangling symlinks in `farm` removed, and a warning for each entry that the
//! `index` file does not mention by name. `include` globs narrow the entries
//! to the paths under `source` they match (`bin/*` reaches one level down;
//! the farm stays flat, named by the last component), and `entries` then
//! keeps dirs, files or both of those: an entry is linked when it passes
//! both. A link of this farm into `source` whose entry is no longer
//! selected is removed. It only ever creates, replaces or
//! removes symlinks: a regular file or directory in the farm is left alone
//! with a warning. The probe is a directory scan and a few `readlink` calls.

use crate::cache::format::manifest::expand_path;
use crate::repo::Repo;
use crate::restore::fields::field;
use anyhow::{Context, Result};
use anyhow::{anyhow, bail};
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};

use super::common::{Ctx, Outcome, Probe};
use crate::cache::format::manifest::Glob;
use crate::restore::proc::Log;

/// A symlink farm: one link in `farm` per entry of `source`.
#[derive(Debug)]
pub struct Links {
    pub source: PathBuf,
    pub farm: PathBuf,
    /// A file that should mention every entry by name (e.g. an INDEX.md).
    pub index: Option<PathBuf>,
    pub entries: Entries,
    /// Only entries whose path under `source` matches one of these globs
    /// are linked (all of them when empty); see `steps::links`.
    pub include: Vec<LinkGlob>,
}

/// One `include` pattern of a `links` step, split into its components
/// (the scan walks exactly that deep, so a warm probe stays a few
/// `readdir` calls).
#[derive(Debug)]
pub struct LinkGlob {
    pub text: String,
    pub components: Vec<crate::cache::format::manifest::Glob>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Entries {
    Dirs,
    Files,
    All,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLinks {
    source: String,
    farm: String,
    index: Option<String>,
    entries: Option<Entries>,
    include: Option<toml::Value>,
}

pub fn resolve_links(repo: &Repo, r: RawLinks) -> Result<Links> {
    let source = expand_path(repo, &r.source)?;
    let farm = expand_path(repo, &r.farm)?;
    if source == farm || farm.starts_with(&source) {
        bail!("`farm` must not be `source` or inside it (the scan would see the links)");
    }
    Ok(Links {
        source,
        farm,
        index: r.index.map(|i| expand_path(repo, &i)).transpose()?,
        entries: r.entries.unwrap_or(Entries::All),
        include: field::<Vec<String>>(r.include, "include")?
            .unwrap_or_default()
            .iter()
            .map(|g| link_glob(g))
            .collect::<Result<_>>()?,
    })
}

/// A links `include` glob: the one dialect (`crate::glob`), without `**`,
/// which would make every warm probe walk the whole source tree.
fn link_glob(text: &str) -> Result<LinkGlob> {
    crate::glob::check(text).map_err(|e| anyhow!("`include`: {e}"))?;
    if text.split('/').any(|c| c == "**") {
        bail!(
            "`include`: glob `{text}` uses `**`, which links do not support (the farm is flat and the scan stays shallow): name each level, e.g. `bin/*`"
        );
    }
    let components = text
        .split('/')
        .map(crate::cache::format::manifest::Glob::new)
        .collect::<Result<_>>()?;
    Ok(LinkGlob {
        text: text.to_string(),
        components,
    })
}

/// One entry to link: `farm/<name>` -> `source/<rel>`.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    name: String,
    rel: PathBuf,
}

/// Whether `kind` (the manifest's `entries`) keeps this path.
fn kind_keeps(kind: Entries, path: &Path) -> bool {
    let is_dir = std::fs::metadata(path).is_ok_and(|m| m.is_dir());
    match kind {
        Entries::All => true,
        Entries::Dirs => is_dir,
        Entries::Files => !is_dir,
    }
}

/// The names in `dir` a pattern component may match: dot-names only when
/// the component itself starts with a dot (as in a shell).
fn names_in(dir: &Path, component: &Glob) -> Result<Vec<String>> {
    let mut names = Vec::new();
    let read = std::fs::read_dir(dir).with_context(|| format!("scanning {}", dir.display()))?;
    for entry in read {
        let entry = entry.with_context(|| format!("scanning {}", dir.display()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && !component.text.starts_with('.') {
            continue;
        }
        if component.matches(&name) {
            names.push(name);
        }
    }
    Ok(names)
}

/// The paths under `source` that match `components`, walking exactly as
/// deep as the pattern (only directories are descended into).
fn expand(source: &Path, rel: &Path, components: &[Glob], out: &mut Vec<PathBuf>) -> Result<()> {
    let Some((first, rest)) = components.split_first() else {
        return Ok(());
    };
    for name in names_in(&source.join(rel), first)? {
        let child = rel.join(&name);
        if rest.is_empty() {
            out.push(child);
        } else if source.join(&child).is_dir() {
            expand(source, &child, rest, out)?;
        }
    }
    Ok(())
}

/// The entries that belong in the farm, sorted by link name, and a warning
/// for each entry left out because another took its link name (the farm
/// is flat: `bin/x` and `libexec/x` cannot both be `farm/x`).
fn scan(l: &Links) -> Result<(Vec<Entry>, Vec<String>)> {
    let mut found: Vec<PathBuf> = Vec::new();
    if l.include.is_empty() {
        let all = Glob::new("*")?;
        expand(
            &l.source,
            Path::new(""),
            std::slice::from_ref(&all),
            &mut found,
        )?;
    } else {
        // A missing source is an error even when no pattern reaches into it.
        std::fs::read_dir(&l.source).with_context(|| format!("scanning {}", l.source.display()))?;
        for g in &l.include {
            expand(&l.source, Path::new(""), &g.components, &mut found)?;
        }
    }
    found.sort();
    found.dedup();
    let mut entries: Vec<Entry> = Vec::new();
    let mut warnings = Vec::new();
    for rel in found {
        if !kind_keeps(l.entries, &l.source.join(&rel)) {
            continue;
        }
        let name = rel
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        if let Some(first) = entries.iter().find(|e| e.name == name) {
            warnings.push(format!(
                "WARNING: {} and {} would both be linked as {}: linked the first; narrow `include`",
                l.source.join(&first.rel).display(),
                l.source.join(&rel).display(),
                l.farm.join(&name).display()
            ));
            continue;
        }
        entries.push(Entry { name, rel });
    }
    entries.sort();
    Ok((entries, warnings))
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

/// Symlinks in the farm that point into `source` but whose entry is no
/// longer selected (`include` or `entries` changed, e.g. to stop linking
/// `build-info.json`): the farm is regenerated, so they go. Links to
/// anywhere else are not this step's and stay.
fn unselected(l: &Links, entries: &[Entry]) -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(&l.farm) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ours = std::fs::read_link(e.path())
                .is_ok_and(|t| crate::fsio::lexical(&l.farm.join(t)).starts_with(&l.source));
            ours && !name.starts_with('.') && !entries.iter().any(|x| x.name == name)
        })
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

fn index_warnings(l: &Links, entries: &[Entry]) -> Vec<String> {
    let Some(index) = &l.index else {
        return Vec::new();
    };
    match std::fs::read_to_string(index) {
        Ok(text) => entries
            .iter()
            .filter(|e| !mentions(&text, &e.name))
            .map(|e| {
                format!(
                    "WARNING: {} does not mention {} (linked from {})",
                    index.display(),
                    e.name,
                    l.source.join(&e.rel).display()
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
    let (entries, mut warnings) = match scan(l) {
        Ok(n) => n,
        Err(e) => return Probe::Needed(format!("{e:#}")),
    };
    if let Some(e) = entries.iter().find(|e| {
        let entry = l.source.join(&e.rel);
        !points_right(&l.farm.join(&e.name), &relative(&l.farm, &entry), &entry)
    }) {
        return Probe::Needed(format!("{} is not linked", e.name));
    }
    if let Some(d) = dangling(&l.farm).first() {
        return Probe::Needed(format!("{} is dangling", d.display()));
    }
    if let Some(u) = unselected(l, &entries).first() {
        return Probe::Needed(format!("{} links an entry not selected", u.display()));
    }
    warnings.extend(index_warnings(l, &entries));
    Probe::Warm {
        what: format!("{} links current", entries.len()),
        warnings,
    }
}

pub fn run(_ctx: &Ctx, l: &Links, log: &mut Log) -> Result<Outcome> {
    let (entries, mut warnings) = scan(l)?;
    std::fs::create_dir_all(&l.farm).with_context(|| format!("creating {}", l.farm.display()))?;
    let removed = dangling(&l.farm);
    for d in &removed {
        std::fs::remove_file(d).with_context(|| format!("removing {}", d.display()))?;
        log.line(&format!("removed dangling {}", d.display()));
    }
    let dropped = unselected(l, &entries);
    for u in &dropped {
        std::fs::remove_file(u).with_context(|| format!("removing {}", u.display()))?;
        log.line(&format!(
            "removed {} (its entry is not selected)",
            u.display()
        ));
    }
    let (mut linked, mut current) = (0, 0);
    for e in &entries {
        let n = &e.name;
        let link = l.farm.join(n);
        let entry = l.source.join(&e.rel);
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
    warnings.extend(index_warnings(l, &entries));
    for w in &warnings {
        log.line(w);
    }
    let unlinked = if dropped.is_empty() {
        String::new()
    } else {
        format!(", {} unselected removed", dropped.len())
    };
    Ok(Outcome::done(format!(
        "{linked} linked, {} dangling removed{unlinked}, {current} current",
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

    use crate::test_rng::Rng;

    /// Every path of the tree under `dir`, `/`-separated, at any depth.
    fn all_paths(dir: &Path, rel: &str, out: &mut Vec<(String, bool)>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let is_dir = e.path().is_dir();
            out.push((r.clone(), is_dir));
            if is_dir {
                all_paths(&e.path(), &r, out);
            }
        }
    }

    /// The shallow walk selects exactly what the whole-path matcher of the
    /// one glob dialect selects (dot-names aside), for many random trees
    /// and patterns: no entry outside `include` is ever linked, none inside
    /// is missed, and `entries` narrows the result.
    #[test]
    fn include_selects_exactly_what_the_glob_dialect_matches() {
        let names = [
            "a",
            "b",
            "ab",
            "bin",
            "lib",
            "x.so",
            ".h",
            "build-info.json",
        ];
        let parts = [
            "*", "a*", "?b", "bin", "lib", "*.so", "b?n", "*-info.*", "x.so",
        ];
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for case in 0..200 {
            let tmp = tempfile::tempdir().unwrap();
            let source = tmp.path().join("src");
            std::fs::create_dir(&source).unwrap();
            for _ in 0..(rng.next() % 12) {
                let depth = 1 + rng.next() % 3;
                let rel: Vec<&str> = (0..depth).map(|_| rng.pick(&names)).collect();
                let path = source.join(rel.join("/"));
                // A name already taken by a file cannot become a directory.
                if path.ancestors().any(|a| a.is_file()) || path.exists() {
                    continue;
                }
                std::fs::create_dir_all(path.parent().unwrap()).unwrap();
                if rng.next().is_multiple_of(3) {
                    std::fs::create_dir(&path).unwrap();
                } else {
                    std::fs::write(&path, "x").unwrap();
                }
            }
            let include: Vec<LinkGlob> = (0..1 + rng.next() % 2)
                .map(|_| {
                    let depth = 1 + rng.next() % 3;
                    let text: Vec<&str> = (0..depth).map(|_| rng.pick(&parts)).collect();
                    let text = text.join("/");
                    LinkGlob {
                        components: text.split('/').map(|c| Glob::new(c).unwrap()).collect(),
                        text,
                    }
                })
                .collect();
            let entries = [Entries::All, Entries::Dirs, Entries::Files][(rng.next() % 3) as usize];
            let l = Links {
                source: source.clone(),
                farm: tmp.path().join("farm"),
                index: None,
                entries,
                include,
            };
            let whole: Vec<Glob> = l
                .include
                .iter()
                .map(|g| Glob::new(&g.text).unwrap())
                .collect();
            let mut tree = Vec::new();
            all_paths(&source, "", &mut tree);
            let mut want: Vec<String> = tree
                .into_iter()
                .filter(|(r, _)| !r.split('/').any(|c| c.starts_with('.')))
                .filter(|(r, _)| whole.iter().any(|g| g.matches(r)))
                .filter(|(_, is_dir)| match entries {
                    Entries::All => true,
                    Entries::Dirs => *is_dir,
                    Entries::Files => !*is_dir,
                })
                .map(|(r, _)| r)
                .collect();
            want.sort();
            let (got, warnings) = scan(&l).unwrap();
            // One link per name; the rest are the collision warnings.
            assert_eq!(got.len() + warnings.len(), want.len(), "case {case}");
            let mut got_rel: Vec<String> = got
                .iter()
                .map(|e| e.rel.to_string_lossy().into_owned())
                .collect();
            got_rel.sort();
            for g in &got_rel {
                assert!(
                    want.contains(g),
                    "case {case}: {g} linked, not selected: {want:?}"
                );
            }
            let mut linked_names: Vec<&str> = got.iter().map(|e| e.name.as_str()).collect();
            linked_names.dedup();
            assert_eq!(
                linked_names.len(),
                got.len(),
                "case {case}: names are unique"
            );
        }
    }
}
