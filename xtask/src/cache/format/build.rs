//! The `[build]` table of a cache manifest: how the artifact a key names is
//! made from source, when no branch holds it yet.
//!
//! A source build exists only to produce a new cache entry: `cache build`
//! runs `command` at the repository root with `WARMSTART_BUILD_OUT` naming
//! an empty staging directory beside `[pack] root`, under `timeout`, and
//! moves the staging directory into the pack root whole once it exited 0
//! (`cache::build`). The `inputs` it reads must all be covered by a key pin,
//! so that a change to any of them changes the key: a build whose inputs the
//! key does not see would publish an entry that lies about what it was made
//! from. Pure: the parser takes the table and the resolved pins, and never
//! reads a file. What `[build]` demands of the rest of the manifest (a pack
//! root the build owns outright, no `[pack] include`/`exclude`, `on_miss`
//! only under `restore.mode = "replace"`) is checked by `manifest::parse`,
//! which knows the repository and reads through symlinks.
//!
//! `[bootstrap] build` is not this mechanism: it is the bootstrap script's
//! compile fallback, run in shell before any warmstart binary exists, and it
//! leaves one executable for this machine, in the tree cargo owns. `[build]`
//! is run by warmstart, makes the whole pack root, and is published.

use anyhow::{Result, bail};
use serde::Deserialize;
use std::path::{Component, Path};
use std::time::Duration;

/// The environment variable naming the staging directory a build writes.
pub const OUT_VAR: &str = "WARMSTART_BUILD_OUT";

/// How long a built-but-not-published install stays warm before a restore
/// looks for the key on the branch again, when `build.recheck` is unset.
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(3600);

/// `[build]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawBuild {
    /// The build's argv, run at the repository root.
    command: Vec<String>,
    /// The paths it reads, relative to the repository root.
    inputs: Vec<String>,
    /// How long it may run before its process group is ended.
    timeout: crate::clock::DurationSpec,
    /// Whether a restore's `cache` step builds the key on a miss.
    #[serde(default)]
    on_miss: bool,
    /// The `platform` values (`x86_64-linux`) where a build may run.
    platforms: Option<Vec<String>>,
    /// How long a built-not-published install stays warm.
    recheck: Option<crate::clock::DurationSpec>,
}

/// `[build]`, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Build {
    pub command: Vec<String>,
    pub inputs: Vec<String>,
    pub timeout: Duration,
    /// A restore builds a missing key (from a background step only).
    pub on_miss: bool,
    /// `None`: any platform.
    pub platforms: Option<Vec<String>>,
    pub recheck: Duration,
}

impl Build {
    /// `Err` names why this machine may not build (its platform is not
    /// listed in `build.platforms`).
    pub fn allowed_here(&self, platform: &str, file: &Path) -> Result<(), String> {
        match &self.platforms {
            Some(list) if !list.iter().any(|p| p == platform) => Err(format!(
                "{} says this cache is built only on {} (build.platforms), and this machine is {platform}",
                file.display(),
                list.join(", ")
            )),
            _ => Ok(()),
        }
    }
}

/// What a manifest's key pins read: the paths of its `git_tree` pins, and
/// the files of its `file`, `json` and `regex` pins (absolute, as resolved).
#[derive(Debug, Default)]
pub struct PinReads<'a> {
    pub trees: Vec<&'a str>,
    pub files: Vec<&'a Path>,
}

/// Validates `[build]` against what the manifest's pins read (`pins`;
/// relative inputs are taken from `root`).
pub fn resolve(raw: RawBuild, pins: &PinReads, root: &Path) -> Result<Build> {
    if raw.command.is_empty() || raw.command[0].is_empty() {
        bail!("build.command is empty: give the build's argv, e.g. [\"make\", \"dist\"]");
    }
    let timeout = raw.timeout.resolve_positive("build.timeout")?;
    if raw.inputs.is_empty() {
        bail!(
            "build.inputs is empty: list the paths the build reads (relative to the repository root), each covered by a key pin"
        );
    }
    for input in &raw.inputs {
        let plain = !input.is_empty()
            && Path::new(input)
                .components()
                .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            bail!(
                "build.inputs {input:?} must be a path relative to the repository root, without `..`"
            );
        }
        if !covered(input, pins, root) {
            bail!(
                "build.inputs {input:?} is not covered by a key pin: add it to a `git_tree` pin (or pin it with a `file` pin), so that a change to it changes the key"
            );
        }
    }
    if let Some(list) = &raw.platforms
        && (list.is_empty() || list.iter().any(String::is_empty))
    {
        bail!(
            "build.platforms lists no platform: name at least one (this machine is {}), or drop the field to build anywhere",
            crate::cache::format::key::platform()
        );
    }
    let recheck = match &raw.recheck {
        Some(d) => d.resolve_positive("build.recheck")?,
        None => DEFAULT_RECHECK,
    };
    Ok(Build {
        command: raw.command,
        inputs: raw.inputs,
        timeout,
        on_miss: raw.on_miss,
        platforms: raw.platforms,
        recheck,
    })
}

/// Whether some pin reads `input`: a `git_tree` path that is it or one of
/// its parents, or the file of a `file`, `json` or `regex` pin.
fn covered(input: &str, pins: &PinReads, root: &Path) -> bool {
    let norm = |p: &str| -> String {
        Path::new(p)
            .components()
            .filter(|c| matches!(c, Component::Normal(_)))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/")
    };
    let input = norm(input);
    let tree = pins.trees.iter().any(|g| {
        let g = norm(g);
        g.is_empty() || input == g || input.starts_with(&format!("{g}/"))
    });
    tree || pins.files.iter().any(|f| *f == root.join(&input))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(inputs: &[&str]) -> RawBuild {
        RawBuild {
            command: vec!["make".into()],
            inputs: inputs.iter().map(|s| s.to_string()).collect(),
            timeout: crate::clock::DurationSpec::Seconds(60),
            on_miss: false,
            platforms: None,
            recheck: None,
        }
    }

    fn pins() -> PinReads<'static> {
        PinReads {
            trees: vec!["src", "Makefile"],
            files: vec![Path::new("/r/VERSION")],
        }
    }

    #[test]
    fn inputs_must_be_covered_by_a_pin() {
        let root = Path::new("/r");
        for ok in ["src", "src/a/b.c", "./src/x", "Makefile", "VERSION"] {
            assert!(resolve(raw(&[ok]), &pins(), root).is_ok(), "{ok:?}");
        }
        for bad in ["srcx", "docs", "Makefile.in", "", "../src", "/r/src"] {
            assert!(resolve(raw(&[bad]), &pins(), root).is_err(), "{bad:?}");
        }
        let e = resolve(raw(&["docs"]), &pins(), root).unwrap_err();
        assert!(e.to_string().contains("not covered by a key pin"), "{e}");
        assert!(resolve(raw(&[]), &pins(), root).is_err());
    }

    #[test]
    fn command_timeout_and_platforms_are_checked() {
        let root = Path::new("/r");
        let mut r = raw(&["src"]);
        r.command = vec![];
        assert!(resolve(r, &pins(), root).is_err());
        let mut r = raw(&["src"]);
        r.timeout = crate::clock::DurationSpec::Seconds(0);
        assert!(resolve(r, &pins(), root).is_err());
        let mut r = raw(&["src"]);
        r.platforms = Some(vec![]);
        assert!(resolve(r, &pins(), root).is_err());
        let mut r = raw(&["src"]);
        r.platforms = Some(vec!["riscv64-linux".into()]);
        let b = resolve(r, &pins(), root).unwrap();
        assert_eq!(b.recheck, DEFAULT_RECHECK);
        assert!(b.allowed_here("riscv64-linux", root).is_ok());
        let e = b.allowed_here("x86_64-linux", root).unwrap_err();
        assert!(e.contains("build.platforms"), "{e}");
    }
}
