//! The environment a plan exports: the `path = [...]` prepends and
//! `env = {...}` values of restore steps and of the top-level `[env]` table,
//! checked when the plan loads.
//!
//! Pure validation of manifest values: it never reads state, runs nothing
//! and writes nothing (`restore env`, in `env.rs`, is what renders them).

use anyhow::{Context, Result, anyhow, bail};
use serde_json::json;
use std::collections::BTreeMap;

use crate::repo::Repo;

/// What one step (or `[env]`) exports: directories to put in front of PATH,
/// in order, and variables to set.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Exports {
    /// Absolute directories, expanded like every path of the plan.
    pub path: Vec<String>,
    pub env: BTreeMap<String, String>,
}

impl Exports {
    pub fn is_empty(&self) -> bool {
        self.path.is_empty() && self.env.is_empty()
    }

    /// For `--dry-run`: `{ "path": [...], "env": {...} }`.
    pub fn describe(&self) -> serde_json::Value {
        json!({ "path": self.path, "env": self.env })
    }
}

/// Takes `path` and `env` out of a step's table (the kind's own fields stay
/// for its strict parser) and validates them.
pub fn take(repo: &Repo, t: &mut toml::Table) -> Result<Exports> {
    let mut out = Exports::default();
    match t.remove("path") {
        None => {}
        Some(toml::Value::Array(items)) => {
            for item in items {
                let toml::Value::String(raw) = item else {
                    bail!("`path` must be a list of directories, such as [\"~/.local/z3/bin\"]");
                };
                out.path.push(path_entry(repo, &raw)?);
            }
        }
        Some(_) => bail!("`path` must be a list of directories, such as [\"~/.local/z3/bin\"]"),
    }
    match t.remove("env") {
        None => {}
        Some(toml::Value::Table(vars)) => {
            for (name, value) in vars {
                check_var_name(&name)?;
                let toml::Value::String(value) = value else {
                    bail!("`env.{name}` must be a string (write it in quotes)");
                };
                if value.contains('\0') {
                    bail!("`env.{name}` holds a NUL byte, which no environment variable can hold");
                }
                out.env.insert(name, value);
            }
        }
        Some(_) => {
            bail!("`env` must be a table of names to strings, such as {{ Z3_HOME = \"/opt/z3\" }}")
        }
    }
    Ok(out)
}

/// The top-level `[env]` table: the same two keys, nothing else.
pub fn top_level(repo: &Repo, value: toml::Value) -> Result<Exports> {
    let toml::Value::Table(mut t) = value else {
        bail!(
            "`env` at the top level must be a table: write `[env]` with `path = [...]` and `env = {{...}}`"
        );
    };
    let exports = take(repo, &mut t).context("[env]")?;
    if let Some(key) = t.keys().next() {
        bail!(
            "[env]: unknown key `{key}`: only `path = [...]` and `env = {{ NAME = \"value\" }}` belong here"
        );
    }
    Ok(exports)
}

fn path_entry(repo: &Repo, raw: &str) -> Result<String> {
    if raw.is_empty() {
        bail!("`path` has an empty entry (it would put the current directory on PATH)");
    }
    let expanded = crate::cache::format::manifest::expand_path(repo, raw)?;
    let s = expanded
        .to_str()
        .ok_or_else(|| anyhow!("`path` entry {raw:?} is not valid UTF-8 once expanded"))?;
    if let Some(c) = s.chars().find(|c| matches!(c, ':' | '\n' | '\r' | '\0')) {
        bail!(
            "`path` entry {raw:?} holds {c:?}, which PATH and $GITHUB_PATH cannot carry: list each directory on its own"
        );
    }
    // `/opt/z3/bin/` and `/opt/z3/bin` are one directory: the guard against a
    // second prepend compares text.
    match s.trim_end_matches('/') {
        "" => Ok("/".into()),
        t => Ok(t.to_string()),
    }
}

/// Names a supported shell keeps for itself: read-only, or set again by the
/// shell, so `eval` fails or leaves another value (found by exporting each
/// in sh, bash 5.2, zsh 5.9 and fish 3.6 and reading it back in a child).
/// `IFS` would also change how the user's own shell splits words.
const SHELL_OWNED: &[(&str, &str)] = &[
    (
        "bash",
        "BASHOPTS BASHPID BASH_COMMAND BASH_LINENO BASH_SUBSHELL BASH_VERSINFO DIRSTACK EPOCHREALTIME EPOCHSECONDS FUNCNAME GROUPS HISTCMD LINENO RANDOM SECONDS SHELLOPTS SRANDOM",
    ),
    ("bash and zsh", "UID EUID"),
    ("every shell", "PPID OPTIND IFS PWD SHLVL _"),
    (
        "zsh",
        "GID EGID ARGC ERRNO KEYBOARD_HACK TTYIDLE USERNAME ZSH_SUBSHELL argv path cdpath fpath manpath module_path mailpath psvar watch signals funcstack options parameters commands aliases functions builtins reswords dirstack jobtexts modules nameddirs userdirs",
    ),
    ("zsh and fish", "status pipestatus history"),
    ("fish", "fish_pid hostname version FISH_VERSION umask"),
];

fn check_var_name(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !ok {
        bail!(
            "`env` name {name:?} is not a variable name: use letters, digits and `_`, not starting with a digit"
        );
    }
    if name == "PATH" {
        bail!(
            "`env.PATH` would replace the whole PATH: list the directories in `path = [...]`, which prepends them"
        );
    }
    if let Some((shells, _)) = SHELL_OWNED
        .iter()
        .find(|(_, names)| names.split(' ').any(|n| n == name))
    {
        bail!(
            "`env` name {name:?} belongs to the shell ({shells} keeps it read-only or sets it itself), so eval cannot set it: choose another name"
        );
    }
    if name.starts_with("WARMSTART_") {
        bail!(
            "`env.{name}`: WARMSTART_* settings are warmstart's own and an unknown or bad one stops every command; set it where the command runs"
        );
    }
    Ok(())
}

/// One variable set to two different values in two places is refused: which
/// one wins would depend on the order nobody reads.
pub fn check_conflicts<'a>(sources: impl Iterator<Item = (String, &'a Exports)>) -> Result<()> {
    let mut seen: BTreeMap<&str, (String, &str)> = BTreeMap::new();
    for (who, e) in sources {
        for (name, value) in &e.env {
            match seen.get(name.as_str()) {
                Some((first, v)) if *v != value => bail!(
                    "env `{name}` is set to different values by {first} and {who}: set it in one place"
                ),
                Some(_) => {}
                None => {
                    seen.insert(name, (who.clone(), value));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
impl Exports {
    /// Exports from literals, for the tests of this file and of `restore env`.
    pub(crate) fn of(path: &[&str], env: &[(&str, &str)]) -> Exports {
        Exports {
            path: path.iter().map(|s| s.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exports(path: &[&str], env: &[(&str, &str)]) -> Exports {
        Exports::of(path, env)
    }

    #[test]
    fn names_and_conflicts_are_checked() {
        for bad in ["1X", "A-B", "", "A B", "É"] {
            assert!(check_var_name(bad).is_err(), "{bad}");
        }
        for owned in ["UID", "path", "_", "status", "FISH_VERSION", "IFS"] {
            let m = format!("{:#}", check_var_name(owned).unwrap_err());
            assert!(m.contains("belongs to the shell"), "{m}");
        }
        for good in ["__", "A1", "z3_HOME", "_X", "PATHS", "HOME", "LC_ALL"] {
            check_var_name(good).unwrap();
        }
        assert!(format!("{:#}", check_var_name("PATH").unwrap_err()).contains("path = [...]"));
        assert!(check_var_name("WARMSTART_COMMAND").is_err());
        let a = exports(&[], &[("X", "1")]);
        let b = exports(&[], &[("X", "2")]);
        check_conflicts([("[env]".to_string(), &a), ("step \"s\"".into(), &a)].into_iter())
            .unwrap();
        let m = format!(
            "{:#}",
            check_conflicts([("[env]".to_string(), &a), ("step \"s\"".into(), &b)].into_iter())
                .unwrap_err()
        );
        assert!(
            m.contains("`X` is set to different values by [env] and step \"s\""),
            "{m}"
        );
    }
}
