//! Cache manifests as read from the repository: `cache-manifests/<name>.toml`
//! loaded and listed, and a manifest's key computed from its pins (pin
//! files read, `git_tree` ids asked of git).
//!
//! The reading half of `cache::format::manifest`, which parses and never
//! reads: this module never writes, and runs nothing but `git rev-parse`.

use anyhow::{Context, Result, anyhow};
use std::path::Path;

use crate::cache::format::KeyPart;
use crate::cache::format::manifest::{self, CacheManifest, Key, Pin, PinSource};
use crate::exit::{Code, fail};
use crate::repo::Repo;

/// Loads and validates `cache-manifests/<name>.toml`.
pub fn load(repo: &Repo, name: &str) -> Result<CacheManifest> {
    let file = manifest::path_of(repo, name);
    if manifest::RESERVED.contains(&name) {
        return Err(fail(
            Code::Config,
            format!(
                "{name} is reserved for {}, not a cache manifest",
                file.display()
            ),
        ));
    }
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let cmd = crate::invocation::command();
            let hint = match nearest(name, &names(repo).unwrap_or_default()) {
                Some(n) => format!("did you mean {n}? (`{cmd} cache list` lists them)"),
                None => {
                    format!(
                        "create it, or see `{cmd} cache list` for the caches this repository has"
                    )
                }
            };
            return Err(fail(
                Code::NotFound,
                format!("no cache manifest {}: {hint}", file.display()),
            ));
        }
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", file.display()))),
    };
    manifest::parse(repo, name, &file, &text)
        .map_err(|e| fail(Code::Config, format!("{}: {e:#}", file.display())))
}

/// `load`, for a command that reads caches on git branches only: a
/// registry cache (`cache.registry`) is refused, exit 10, naming the
/// command, rather than looked for on a branch it never had. `cache
/// publish` and `cache restore` are the commands that reach a registry.
pub fn load_git(repo: &Repo, name: &str, command: &str) -> Result<CacheManifest> {
    let m = load(repo, name)?;
    if let Some(r) = &m.registry {
        return Err(fail(
            Code::Config,
            format!(
                "cache {name} lives in registry {r} ({}), and `{} {command}` reads git branches only so far: `cache publish` and `cache restore` reach a registry",
                m.file.display(),
                crate::invocation::command()
            ),
        ));
    }
    Ok(m)
}

/// The cache name `name` is most likely a typo of: the closest by edit
/// distance, when within a third of its length (rounded up).
fn nearest(name: &str, known: &[String]) -> Option<String> {
    known
        .iter()
        .map(|k| (crate::settings::edit_distance(name, k), k))
        .min()
        .filter(|(d, _)| *d <= name.chars().count().div_ceil(3))
        .map(|(_, k)| k.clone())
}

/// Names of every cache manifest in `repo` (sorted), without loading them.
pub fn names(repo: &Repo) -> Result<Vec<String>> {
    let dir = repo.manifests_dir();
    let mut names = Vec::new();
    let rd = match std::fs::read_dir(&dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(names),
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", dir.display()))),
    };
    for entry in rd {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "toml")
            && let Some(stem) = path.file_stem().and_then(|s| s.to_str())
            && !manifest::RESERVED.contains(&stem)
        {
            names.push(stem.to_string());
        }
    }
    names.sort();
    Ok(names)
}

/// Computes the key: each pin's value, sanitised to file-name characters,
/// joined with `-` after the manifest name. `git_tree` pins run git.
pub fn compute_key(sh: &xshell::Shell, repo: &Repo, m: &CacheManifest) -> Result<Key> {
    let mut parts = Vec::new();
    for pin in &m.pins {
        let value = pin_value(sh, repo, pin)
            .with_context(|| format!("key pin {:?} of {}", pin.name, m.file.display()))?;
        parts.push(KeyPart {
            name: pin.name.clone(),
            value,
        });
    }
    Ok(manifest::key_from_parts(&m.name, parts))
}

fn pin_value(sh: &xshell::Shell, repo: &Repo, pin: &Pin) -> Result<String> {
    match &pin.source {
        PinSource::Literal(s) => Ok(s.clone()),
        PinSource::Platform => Ok(manifest::platform()),
        PinSource::Json { file, pointer } => manifest::json_pin(file, &read(file)?, pointer),
        PinSource::Regex { file, pattern } => manifest::regex_pin(file, &read(file)?, pattern),
        PinSource::GitTree(paths) => git_tree_digest(sh, repo, paths),
        PinSource::File(file) => manifest::one_line(file, &read(file)?),
    }
}

/// The text of a pin's file. A missing one is a plan error (exit 10), as
/// any other wrong manifest value is: the manifest names a file that is not
/// there.
fn read(file: &Path) -> Result<String> {
    match std::fs::read_to_string(file) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(fail(
            Code::Config,
            format!(
                "pin file {} does not exist: create it, or point the pin's `file` at the file that holds the version",
                file.display()
            ),
        )),
        r => r.with_context(|| format!("reading {}", file.display())),
    }
}

/// A `git_tree` pin's value: `git rev-parse HEAD:<path>...` in `repo`,
/// digested by `manifest::tree_digest`.
pub fn git_tree_digest(sh: &xshell::Shell, repo: &Repo, paths: &[String]) -> Result<String> {
    let revs: Vec<String> = paths.iter().map(|p| format!("HEAD:{p}")).collect();
    let root = &repo.root;
    let out = xshell::cmd!(sh, "git -C {root} rev-parse {revs...}")
        .quiet()
        .read()
        .with_context(|| format!("asking git for the tree ids of {}", paths.join(", ")))?;
    Ok(manifest::tree_digest(&out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(dir: &Path) -> Repo {
        Repo {
            root: dir.to_path_buf(),
            git_dir: dir.join(".git"),
        }
    }

    #[test]
    fn a_cache_name_typo_is_told_the_nearest_name() {
        let known = ["small".to_string(), "fstar".to_string(), "z3".to_string()];
        assert_eq!(nearest("smal", &known).as_deref(), Some("small"));
        assert_eq!(nearest("fstra", &known).as_deref(), Some("fstar"));
        assert_eq!(nearest("z4", &known).as_deref(), Some("z3"));
        assert_eq!(nearest("nosuch", &known), None);
    }

    #[test]
    fn pins_build_the_key() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(
            tmp.path().join("build-info.json"),
            r#"{"llvm": {"version": "19.1"}}"#,
        )
        .unwrap();
        std::fs::write(
            tmp.path().join("rust-toolchain.toml"),
            "channel = \"1.95.0\"\n",
        )
        .unwrap();
        let text = r#"
[[key]]
name = "v"
literal = "2"
[[key]]
name = "llvm"
json = { file = "build-info.json", pointer = "/llvm/version" }
[[key]]
name = "rust"
regex = { file = "rust-toolchain.toml", pattern = 'channel = "([^"]+)"' }
[[key]]
name = "platform"
platform = true
[pack]
root = "out"
[restore]
path = "dest"
"#;
        let m =
            manifest::parse(&repo(tmp.path()), "tc", &tmp.path().join("tc.toml"), text).unwrap();
        let sh = xshell::Shell::new().unwrap();
        let key = compute_key(&sh, &repo(tmp.path()), &m).unwrap();
        assert_eq!(
            key.value,
            format!(
                "tc-2-19.1-1.95.0-{}",
                manifest::platform().replace('-', "_")
            )
        );
        assert_eq!(key.parts[1].value, "19.1");
        crate::cache::format::check_key(&key.value).unwrap();
    }
}
