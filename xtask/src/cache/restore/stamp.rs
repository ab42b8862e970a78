//! The restore stamp: what a cache's last completed restore installed, and where.
//!
//! A stamp is written (atomically) only after an install was verified and
//! swapped in, so its presence says "this key is installed at this target".
//! The warm path compares a stamp with the current key and plan and runs the
//! manifest's cheap ready-probe: it hashes nothing and touches no network.
//! This module is the format and its file I/O only; it never decides whether
//! to restore (that is `restore`).

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::cache::format::KeyPart;
use crate::cache::format::manifest::Mode;

/// The `format` field of stamps this build writes and reads.
pub const STAMP_FORMAT: u32 = 1;

/// One cache's stamp: `<state>/cache/stamps/<name>.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub format: u32,
    /// The cache manifest name.
    pub name: String,
    /// The key that was installed, and the pin values that built it.
    pub key: String,
    #[serde(default)]
    pub key_parts: Vec<KeyPart>,
    /// Where it was installed (absolute, after `~`/`$VAR` expansion).
    pub target: PathBuf,
    /// `replace` or `merge`.
    pub mode: String,
    /// The branch and the remote it came from, and the branch commit.
    pub branch: String,
    pub source: String,
    pub commit: String,
    /// `v1`, `legacy-gzip` or `legacy-zstd`.
    pub layout: String,
    /// sha256 of the branch manifest the install was checked against:
    /// `warmstart.json` for v1, `SHA256SUMS` for legacy branches.
    pub manifest_sha256: String,
    /// sha256 and size of the uncompressed tar that was unpacked.
    pub tar_sha256: String,
    pub tar_size: u64,
    /// Entries unpacked.
    pub files: u64,
    /// When the install completed: RFC 3339 UTC and epoch milliseconds.
    pub restored_at: String,
    pub restored_at_ms: u64,
    /// Set when `key` stands in for the exact key the branch lacked
    /// (`[[restore.fallback]]`): warm only until `restore.recheck` after
    /// `checked_at_ms`. Older stamps have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<Partial>,
    /// Set when this machine built `key` itself (`[build]`, on a miss) and
    /// did not publish it: warm only until `build.recheck` after
    /// `checked_at_ms`, then the branch is looked at again. Older stamps
    /// have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub built: Option<Built>,
}

/// A key this machine built and installed without publishing it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Built {
    /// Why it was not published, and what to run where to publish it.
    pub unpublished: String,
    /// When the branch was last seen without the key (epoch ms).
    pub checked_at_ms: u64,
}

/// What a fallback install stands in for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partial {
    /// The exact key today's pins gave, and its parts.
    pub wanted: String,
    pub wanted_parts: Vec<KeyPart>,
    /// The fallback that matched (`drop src`, `prefix vc-`).
    pub fallback: String,
    /// When the branch was last seen without `wanted` (epoch ms).
    pub checked_at_ms: u64,
}

/// Why a stamp does not make the current restore warm.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No stamp: never restored here (or the last restore did not finish).
    NoStamp,
    /// The key differs; `parts` names each pin whose value changed.
    Key {
        installed: String,
        parts: Vec<PartChange>,
    },
    /// Same key, but the manifest now restores elsewhere or in another mode.
    Target {
        installed: PathBuf,
    },
    Mode {
        installed: String,
    },
    /// The stamp matches but the manifest's ready-probe fails.
    NotReady(String),
    /// A stand-in key is installed and `restore.recheck` has passed since
    /// the branch was last seen without the exact key.
    Recheck {
        installed: String,
        wanted: String,
    },
    /// The key was built here and not published, and `build.recheck` has
    /// passed since the branch was last seen without it.
    BuiltRecheck {
        key: String,
    },
    /// The stamp cannot be read (the message says why).
    Corrupt(String),
}

/// One pin whose value differs between the stamp and the current key.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartChange {
    pub name: String,
    /// `None` when the pin did not exist on that side.
    pub installed: Option<String>,
    pub current: Option<String>,
}

impl std::fmt::Display for Miss {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Miss::NoStamp => f.write_str("not restored here yet"),
            Miss::Key { installed, parts } => {
                write!(f, "installed key {installed} differs")?;
                if !parts.is_empty() {
                    f.write_str(": ")?;
                    for (i, p) in parts.iter().enumerate() {
                        if i > 0 {
                            f.write_str(", ")?;
                        }
                        write!(
                            f,
                            "{} {} -> {}",
                            p.name,
                            p.installed.as_deref().unwrap_or("(none)"),
                            p.current.as_deref().unwrap_or("(none)")
                        )?;
                    }
                }
                Ok(())
            }
            Miss::Target { installed } => {
                write!(f, "installed at {} instead", installed.display())
            }
            Miss::Mode { installed } => write!(f, "installed in {installed} mode instead"),
            Miss::NotReady(why) => write!(f, "installed, but the ready-probe fails: {why}"),
            Miss::Recheck { installed, wanted } => write!(
                f,
                "{installed} stands in for {wanted} and restore.recheck has passed: looking for {wanted}"
            ),
            Miss::BuiltRecheck { key } => write!(
                f,
                "{key} was built here and not published, and build.recheck has passed: looking for it on the branch"
            ),
            Miss::Corrupt(why) => f.write_str(why),
        }
    }
}

pub fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Replace => "replace",
        Mode::Merge => "merge",
        Mode::Overlay => "overlay",
    }
}

impl Stamp {
    /// A stamp of `key` of `m` installed at `now` (epoch ms), with where it
    /// came from and what was unpacked left empty for the caller to fill:
    /// the one place that says which fields name the manifest, the key and
    /// the time (a cold restore's and a write-back's stamps differ only in
    /// the rest).
    pub fn of(
        m: &crate::cache::format::manifest::CacheManifest,
        key: &crate::cache::format::manifest::Key,
        now: u64,
    ) -> Stamp {
        Stamp {
            format: STAMP_FORMAT,
            name: m.name.clone(),
            key: key.value.clone(),
            key_parts: key.parts.clone(),
            target: m.restore_path.clone(),
            mode: mode_name(m.mode).to_string(),
            branch: m.branch.clone(),
            source: String::new(),
            commit: String::new(),
            layout: String::new(),
            manifest_sha256: String::new(),
            tar_sha256: String::new(),
            tar_size: 0,
            files: 0,
            restored_at: crate::clock::rfc3339(now),
            restored_at_ms: now,
            partial: None,
            built: None,
        }
    }

    /// Whether this stamp installed exactly `key` (with `parts`) at `target`
    /// in `mode`. Compares strings only: no hashing, no I/O.
    pub fn matches(
        &self,
        key: &str,
        parts: &[KeyPart],
        target: &Path,
        mode: Mode,
    ) -> Result<(), Miss> {
        if self.key != key {
            return Err(Miss::Key {
                installed: self.key.clone(),
                parts: diff_parts(&self.key_parts, parts),
            });
        }
        if self.target != target {
            return Err(Miss::Target {
                installed: self.target.clone(),
            });
        }
        if self.mode != mode_name(mode) {
            return Err(Miss::Mode {
                installed: self.mode.clone(),
            });
        }
        Ok(())
    }

    /// Parses a stamp, refusing unknown formats and missing fields.
    pub fn parse(text: &str) -> Result<Stamp> {
        let stamp: Stamp = serde_json::from_str(text).map_err(|e| anyhow!("not a stamp: {e}"))?;
        if stamp.format != STAMP_FORMAT {
            bail!(
                "stamp format {} is not {STAMP_FORMAT} (written by another warmstart version)",
                stamp.format
            );
        }
        Ok(stamp)
    }

    /// Pretty JSON with a trailing newline.
    pub fn render(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).expect("stamp serializes");
        s.push('\n');
        s
    }
}

/// Pins whose values differ, in the order of the current key, then pins that
/// only the installed key had.
pub fn diff_parts(installed: &[KeyPart], current: &[KeyPart]) -> Vec<PartChange> {
    let mut out = Vec::new();
    for c in current {
        let old = installed.iter().find(|p| p.name == c.name);
        if old.map(|p| &p.value) != Some(&c.value) {
            out.push(PartChange {
                name: c.name.clone(),
                installed: old.map(|p| p.value.clone()),
                current: Some(c.value.clone()),
            });
        }
    }
    for p in installed {
        if !current.iter().any(|c| c.name == p.name) {
            out.push(PartChange {
                name: p.name.clone(),
                installed: Some(p.value.clone()),
                current: None,
            });
        }
    }
    out
}

/// Where the stamps of a repository live.
pub fn dir(state_dir: &Path) -> PathBuf {
    state_dir.join("cache").join("stamps")
}

/// The stamp file of cache `name`.
pub fn path(state_dir: &Path, name: &str) -> PathBuf {
    dir(state_dir).join(format!("{name}.json"))
}

/// What reading a stamp found.
#[derive(Debug)]
pub enum Loaded {
    Missing,
    Found(Box<Stamp>),
    /// The file exists but is not a stamp this build reads.
    Corrupt(anyhow::Error),
}

/// Reads the stamp at `file`. A missing file is `Missing`; an unreadable or
/// malformed one is `Corrupt` (the caller decides to set it aside).
pub fn load(file: &Path) -> Loaded {
    match std::fs::read_to_string(file) {
        Ok(text) => match Stamp::parse(&text) {
            Ok(s) => Loaded::Found(Box::new(s)),
            Err(e) => Loaded::Corrupt(e.context(format!("stamp {}", file.display()))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Loaded::Missing,
        Err(e) => Loaded::Corrupt(anyhow!(e).context(format!("reading stamp {}", file.display()))),
    }
}

/// Writes the stamp durably (`fsio::write_atomic`): a crash leaves the old
/// stamp or the new one, never a torn file.
pub fn store(file: &Path, stamp: &Stamp) -> Result<()> {
    crate::fsio::write_atomic(file, stamp.render().as_bytes())
        .with_context(|| format!("writing stamp {}", file.display()))
}

/// Moves a corrupt stamp aside to `<file>.corrupt-<ms>` and returns where.
pub fn set_aside(file: &Path, now_ms: u64) -> Result<PathBuf> {
    let aside = PathBuf::from(format!("{}.corrupt-{now_ms}", file.display()));
    match std::fs::rename(file, &aside) {
        Ok(()) => Ok(aside),
        // Another restorer moved it first: the same outcome.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(aside),
        Err(e) => Err(anyhow!(e).context(format!("moving corrupt stamp {} aside", file.display()))),
    }
}

/// Removes the stamp (before an install is replaced, so that a crash in the
/// middle never leaves a stamp that describes a half-replaced target).
pub fn remove(file: &Path) -> Result<()> {
    match std::fs::remove_file(file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(anyhow!(e).context(format!("removing stamp {}", file.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(name: &str, value: &str) -> KeyPart {
        KeyPart {
            name: name.into(),
            value: value.into(),
        }
    }

    fn stamp() -> Stamp {
        Stamp {
            format: STAMP_FORMAT,
            name: "tc".into(),
            key: "tc-1.95-x86_64_linux".into(),
            key_parts: vec![part("rust", "1.95"), part("platform", "x86_64-linux")],
            target: PathBuf::from("/opt/tc"),
            mode: "replace".into(),
            branch: "tc-cache".into(),
            source: "file:///srv/origin.git".into(),
            commit: "c".repeat(40),
            layout: "v1".into(),
            manifest_sha256: "a".repeat(64),
            tar_sha256: "b".repeat(64),
            tar_size: 10240,
            files: 3,
            restored_at: "2026-11-30T02:26:20Z".into(),
            restored_at_ms: 1_796_005_580_123,
            partial: None,
            built: None,
        }
    }

    #[test]
    fn round_trips_through_text() {
        let s = stamp();
        let text = s.render();
        assert!(text.ends_with("}\n"));
        assert_eq!(Stamp::parse(&text).unwrap(), s);
    }

    #[test]
    fn unknown_format_and_garbage_are_refused() {
        let mut s = stamp();
        s.format = 9;
        assert!(
            Stamp::parse(&s.render())
                .unwrap_err()
                .to_string()
                .contains("format 9")
        );
        assert!(Stamp::parse("{\"format\": 1}").is_err());
        assert!(Stamp::parse("").is_err());
        let text = stamp().render();
        assert!(Stamp::parse(&text[..text.len() / 2]).is_err());
    }

    #[test]
    fn matches_same_key_target_and_mode_only() {
        let s = stamp();
        let parts = s.key_parts.clone();
        let target = Path::new("/opt/tc");
        assert_eq!(s.matches(&s.key, &parts, target, Mode::Replace), Ok(()));
        assert_eq!(
            s.matches(&s.key, &parts, Path::new("/opt/other"), Mode::Replace),
            Err(Miss::Target {
                installed: target.to_path_buf()
            })
        );
        assert!(matches!(
            s.matches(&s.key, &parts, target, Mode::Merge),
            Err(Miss::Mode { .. })
        ));
    }

    #[test]
    fn key_miss_names_the_pin_that_moved() {
        let s = stamp();
        let current = vec![part("rust", "1.96"), part("platform", "x86_64-linux")];
        let miss = s
            .matches(
                "tc-1.96-x86_64_linux",
                &current,
                Path::new("/opt/tc"),
                Mode::Replace,
            )
            .unwrap_err();
        assert_eq!(
            miss.to_string(),
            "installed key tc-1.95-x86_64_linux differs: rust 1.95 -> 1.96"
        );
    }

    #[test]
    fn diff_reports_added_and_removed_pins() {
        let installed = vec![part("a", "1"), part("gone", "x")];
        let current = vec![part("a", "1"), part("new", "y")];
        let d = diff_parts(&installed, &current);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].name, "new");
        assert_eq!(d[0].installed, None);
        assert_eq!(d[1].name, "gone");
        assert_eq!(d[1].current, None);
    }

    #[test]
    fn store_load_and_set_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let file = path(tmp.path(), "tc");
        assert!(matches!(load(&file), Loaded::Missing));
        store(&file, &stamp()).unwrap();
        match load(&file) {
            Loaded::Found(s) => assert_eq!(*s, stamp()),
            other => panic!("{other:?}"),
        }
        std::fs::write(&file, "{ not json").unwrap();
        assert!(matches!(load(&file), Loaded::Corrupt(_)));
        let aside = set_aside(&file, 42).unwrap();
        assert!(aside.to_string_lossy().ends_with("tc.json.corrupt-42"));
        assert!(aside.exists());
        assert!(matches!(load(&file), Loaded::Missing));
        // No temp files are left next to the stamp.
        let names: Vec<_> = std::fs::read_dir(dir(tmp.path()))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        remove(&file).unwrap();
    }
}
