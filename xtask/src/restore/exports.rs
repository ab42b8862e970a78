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
                let value = expand_value(&value, &|v| std::env::var(v).ok())
                    .map_err(|e| e.naming(&name, &value))?;
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

/// Why an `env` value could not be expanded.
#[derive(Debug, PartialEq, Eq)]
pub enum Unexpanded {
    /// `$NAME`, `${NAME}` or `~` (which reads HOME) names an unset variable.
    Unset(String),
    /// A `$` that starts no name and is no escape.
    Lone,
    /// `${` without its `}`, or braces around something that is no name.
    Braces,
}

impl Unexpanded {
    /// The one-line error, naming the key and what to write instead.
    fn naming(&self, key: &str, raw: &str) -> anyhow::Error {
        let msg = match self {
            Unexpanded::Unset(v) => format!(
                "`env.{key}` = {raw:?} uses ${v}, which is not set where restore runs: set {v}, or write `$$` for a literal `$`"
            ),
            Unexpanded::Lone => format!(
                "`env.{key}` = {raw:?} has a `$` that starts no variable name: write `$$` for a literal `$`"
            ),
            Unexpanded::Braces => format!(
                "`env.{key}` = {raw:?} has a `${{` without a variable name and its `}}`: write `${{NAME}}`, or `$$` for a literal `$`"
            ),
        };
        anyhow!(msg)
    }
}

/// Expands one `env` value as docs/restore.md documents it: a leading `~`
/// (alone or before `/`) is HOME, `$NAME` and `${NAME}` are variables of the
/// environment restore runs in, `$$` is a literal `$` and `$~` a literal `~`.
/// An unset variable is an error rather than empty text: a value such as
/// `$FSTAR_ROOT/bin` that silently became `/bin` would point a tool at the
/// wrong place. `lookup` is the environment (a parameter for the tests).
pub fn expand_value(
    raw: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<String, Unexpanded> {
    let get = |name: &str| lookup(name).ok_or_else(|| Unexpanded::Unset(name.to_string()));
    let mut out = String::new();
    let mut rest = raw;
    if rest == "~" || rest.starts_with("~/") {
        out.push_str(&get("HOME")?);
        rest = &rest[1..];
    }
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let name_len = |s: &str| {
            let mut chars = s.char_indices();
            match chars.next() {
                Some((_, c)) if c.is_ascii_alphabetic() || c == '_' => chars
                    .find(|(_, c)| !(c.is_ascii_alphanumeric() || *c == '_'))
                    .map_or(s.len(), |(j, _)| j),
                _ => 0,
            }
        };
        rest = if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            tail
        } else if let Some(tail) = after.strip_prefix('~') {
            out.push('~');
            tail
        } else if let Some(inner) = after.strip_prefix('{') {
            let n = name_len(inner);
            if n == 0 || !inner[n..].starts_with('}') {
                return Err(Unexpanded::Braces);
            }
            out.push_str(&get(&inner[..n])?);
            &inner[n + 1..]
        } else {
            let n = name_len(after);
            if n == 0 {
                return Err(Unexpanded::Lone);
            }
            out.push_str(&get(&after[..n])?);
            &after[n..]
        };
    }
    out.push_str(rest);
    Ok(out)
}

/// The text that `expand_value` reads back as exactly `literal`.
pub fn escape_value(literal: &str) -> String {
    let s = literal.replace('$', "$$");
    if s == "~" || s.starts_with("~/") {
        format!("$~{}", &s[1..])
    } else {
        s
    }
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

    fn env(name: &str) -> Option<String> {
        match name {
            "HOME" => Some("/home/u".into()),
            "FSTAR_ROOT" => Some("/opt/f $x ~".into()),
            "_1" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn env_values_expand_home_variables_and_escapes() {
        let cases = [
            ("~", "/home/u"),
            ("~/.local/fstar", "/home/u/.local/fstar"),
            ("$HOME/.local/fstar", "/home/u/.local/fstar"),
            ("${HOME}x", "/home/ux"),
            ("a~/b ~", "a~/b ~"),
            ("~user", "~user"),
            ("$$HOME", "$HOME"),
            ("$~/x", "~/x"),
            ("$FSTAR_ROOT/bin", "/opt/f $x ~/bin"),
            ("${_1}-$_1.", "-."),
            ("100$$", "100$"),
        ];
        for (raw, want) in cases {
            assert_eq!(expand_value(raw, &env).as_deref(), Ok(want), "{raw:?}");
        }
        let unset = expand_value("$NOPE/x", &env).unwrap_err();
        assert_eq!(unset, Unexpanded::Unset("NOPE".into()));
        let m = format!("{:#}", unset.naming("FSTAR_HOME", "$NOPE/x"));
        assert!(m.contains("`env.FSTAR_HOME`") && m.contains("$NOPE"), "{m}");
        assert_eq!(
            expand_value("~", &|_| None),
            Err(Unexpanded::Unset("HOME".into()))
        );
        for lone in ["$", "a$", "$ x", "$-", "$1"] {
            assert_eq!(expand_value(lone, &env), Err(Unexpanded::Lone), "{lone:?}");
        }
        for braces in ["${", "${HOME", "${}", "${1}", "${HO ME}"] {
            assert_eq!(
                expand_value(braces, &env),
                Err(Unexpanded::Braces),
                "{braces:?}"
            );
        }
    }

    /// Whatever a literal holds, its escaped form expands back to it, and a
    /// variable spliced between escaped pieces reads as its value there.
    #[test]
    fn escaped_env_values_round_trip_whatever_they_hold() {
        const PIECES: &[&str] = &[
            "$", "$$", "~", "~/", "/", "{", "}", "${", "$HOME", "${HOME}", "a", "_", "1", " ", "é",
            "\\", "'", "\"", "\n", "$~", "~user",
        ];
        let mut rng = crate::test_rng::Rng(0x5eed_e7a1);
        for case in 0..5000 {
            let n = rng.index(8);
            let literal: String = (0..n).map(|_| rng.pick(PIECES)).collect();
            let escaped = escape_value(&literal);
            assert_eq!(
                expand_value(&escaped, &env).as_deref(),
                Ok(literal.as_str()),
                "case {case}: {literal:?} escaped as {escaped:?}"
            );
            let tail: String = (0..rng.index(4)).map(|_| rng.pick(PIECES)).collect();
            let spliced = format!("{escaped}${{FSTAR_ROOT}}{}", escape_value(&tail));
            assert_eq!(
                expand_value(&spliced, &env),
                Ok(format!("{literal}/opt/f $x ~{tail}")),
                "case {case}: {spliced:?}"
            );
        }
    }
}
