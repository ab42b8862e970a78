//! `cache-manifests/gates.toml`: the named gate commands, parsed into a validated plan.
//!
//! Parsing is separate from running: this module reads TOML and returns
//! [`Plan`], with every gate's command, working directory, environment,
//! timeout and the digest that a record stores. It never spawns a process or
//! runs git, so plans are tested here without touching disk.
//!
//! ```toml
//! ignore = ["scratch", "**/*.log"]   # globs (`crate::glob`, read by git's `:(glob)` magic) that do not make the worktree dirty
//! kill_grace = "5s"                  # SIGTERM -> SIGKILL grace when a gate times out
//!
//! [[gate]]
//! name = "test"
//! command = ["cargo", "nextest", "run"]   # argv, or a string run by `sh -c`
//! cwd = "."                               # relative to the repository root
//! timeout = "40m"
//! env = { RUST_BACKTRACE = "1" }
//! ```

use anyhow::Result;
use serde::Deserialize;

use crate::clock::DurationSpec;
pub use crate::clock::parse_positive_duration as parse_duration;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Component, Path};
use std::time::Duration;

use crate::exit::{Code, fail};

/// Where the gates live, relative to the repository root.
pub const PATH: &str = "cache-manifests/gates.toml";

const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60 * 60);
const DEFAULT_GRACE: Duration = Duration::from_secs(5);

/// The validated contents of gates.toml.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Pathspecs whose changes and untracked files do not make the worktree dirty.
    pub ignore: Vec<String>,
    /// How long a gate past its timeout gets between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// The gates, in file order (the order `gates run` runs them).
    pub gates: Vec<Gate>,
    /// Where records live on the remote (`records = "refs" | "branches"`).
    pub records: Records,
    /// The `[network]` table: deadlines of record pushes and fetches.
    pub network: crate::net::ManifestNetwork,
}

/// Where gate records live on the remote. `Refs` (the default) keeps them
/// under `refs/warmstart/gates/<tree>`, which plain clones never fetch;
/// `Branches` is for hosts that refuse every ref outside `refs/heads/` and
/// `refs/tags/`: `refs/heads/warmstart-gates/<tree>`, one small branch per
/// recorded tree. Locally they are always under `refs/warmstart/gates/`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Records {
    #[default]
    Refs,
    Branches,
}

impl Records {
    /// The prefix of a record's ref on the remote.
    pub fn remote_prefix(self) -> &'static str {
        match self {
            Records::Refs => "refs/warmstart/gates/",
            Records::Branches => "refs/heads/warmstart-gates/",
        }
    }
}

/// One gate, ready to run.
#[derive(Clone, Debug, PartialEq)]
pub struct Gate {
    pub name: String,
    pub command: GateCommand,
    /// Relative to the repository root; `.` when absent.
    pub cwd: String,
    /// Added to the inherited environment; sorted, so the digest is stable.
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    /// `sha256:<hex>` of the command, cwd and env: what a record proves ran.
    pub digest: String,
}

/// A gate's command: an argv run directly, or a string run by `sh -c`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum GateCommand {
    Shell(String),
    Argv(Vec<String>),
}

impl GateCommand {
    /// The argv to execute.
    pub fn argv(&self) -> Vec<String> {
        match self {
            GateCommand::Shell(s) => vec!["sh".into(), "-c".into(), s.clone()],
            GateCommand::Argv(v) => v.clone(),
        }
    }

    /// How a person would type it, for headers and records.
    pub fn display(&self) -> String {
        match self {
            GateCommand::Shell(s) => s.clone(),
            GateCommand::Argv(v) => v
                .iter()
                .map(|a| {
                    if !a.is_empty()
                        && a.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c))
                    {
                        a.clone()
                    } else {
                        format!("'{}'", a.replace('\'', r"'\''"))
                    }
                })
                .collect::<Vec<_>>()
                .join(" "),
        }
    }
}

impl Plan {
    /// The gate called `name`.
    pub fn gate(&self, name: &str) -> Option<&Gate> {
        self.gates.iter().find(|g| g.name == name)
    }

    /// Every gate name, in file order.
    pub fn names(&self) -> Vec<String> {
        self.gates.iter().map(|g| g.name.clone()).collect()
    }

    /// The gates called `names`, in the order given (deduplicated); all gates
    /// when `names` is empty. An unknown name is a configuration error that
    /// lists the gates that exist.
    pub fn select(&self, names: &[String]) -> Result<Vec<&Gate>> {
        if names.is_empty() {
            return Ok(self.gates.iter().collect());
        }
        let mut out: Vec<&Gate> = Vec::new();
        let mut unknown = Vec::new();
        for name in names {
            match self.gate(name) {
                Some(g) if !out.iter().any(|o| o.name == g.name) => out.push(g),
                Some(_) => {}
                None => unknown.push(name.as_str()),
            }
        }
        if !unknown.is_empty() {
            return Err(fail(
                Code::Config,
                format!(
                    "no gate named {} in {PATH} (defined: {}): add it there or fix the name",
                    unknown
                        .iter()
                        .map(|n| format!("`{n}`"))
                        .collect::<Vec<_>>()
                        .join(", "),
                    if self.gates.is_empty() {
                        "none".to_string()
                    } else {
                        self.names().join(", ")
                    }
                ),
            ));
        }
        Ok(out)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    #[serde(default)]
    ignore: Vec<String>,
    kill_grace: Option<DurationSpec>,
    /// Deadlines of `gates push`/`fetch` (see `crate::net`).
    #[serde(default)]
    network: crate::net::RawNetwork,
    #[serde(default)]
    records: Records,
    #[serde(default)]
    gate: Vec<RawGate>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGate {
    name: String,
    command: GateCommand,
    cwd: Option<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    timeout: Option<DurationSpec>,
}

fn valid_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

/// The digest a record stores for a gate: sha256 of a canonical JSON of
/// command, cwd and env. The timeout is left out on purpose: giving a gate
/// more time does not change what its success proves.
pub fn digest(command: &GateCommand, cwd: &str, env: &BTreeMap<String, String>) -> String {
    let command = match command {
        GateCommand::Shell(s) => serde_json::json!({ "shell": s }),
        GateCommand::Argv(v) => serde_json::json!({ "argv": v }),
    };
    // BTreeMap iteration is sorted, so the env object's key order is stable
    // even with serde_json's preserve_order.
    let canonical = serde_json::json!({ "command": command, "cwd": cwd, "env": env });
    format!(
        "sha256:{:x}",
        Sha256::digest(canonical.to_string().as_bytes())
    )
}

/// Parses and validates the text of gates.toml.
pub fn parse(text: &str) -> Result<Plan> {
    let raw: RawPlan = toml::from_str(text).map_err(|e| {
        fail(
            Code::Config,
            format!(
                "{PATH} is not valid: {}",
                crate::settings::toml_error_line(text, &e)
            ),
        )
    })?;
    let kill_grace = match &raw.kill_grace {
        Some(d) => d
            .resolve_positive("kill_grace")
            .map_err(|e| fail(Code::Config, format!("{PATH}: {e:#}")))?,
        None => DEFAULT_GRACE,
    };
    check_ignore(&raw.ignore)?;
    let mut gates: Vec<Gate> = Vec::new();
    for g in raw.gate {
        let gate = check_gate(g, &gates)?;
        gates.push(gate);
    }
    let network = raw
        .network
        .resolve()
        .map_err(|e| fail(Code::Config, format!("{PATH}: {e:#}")))?;
    Ok(Plan {
        ignore: raw.ignore,
        kill_grace,
        gates,
        records: raw.records,
        network,
    })
}

/// `ignore` entries are paths or globs of the cache manifests' dialect,
/// never `:` pathspec magic.
fn check_ignore(ignore: &[String]) -> Result<()> {
    for pattern in ignore {
        if pattern.starts_with(':') {
            return Err(fail(
                Code::Config,
                format!(
                    "{PATH}: ignore entry `{pattern}` must be a path or glob relative to the repository root (no `:` pathspec magic)"
                ),
            ));
        }
        // The same dialect as cache manifests' globs, which git's `:(glob)`
        // magic reads the same way (see `crate::glob`).
        crate::glob::check(pattern)
            .map_err(|e| fail(Code::Config, format!("{PATH}: ignore entry: {e}")))?;
    }
    Ok(())
}

/// Validates one `[[gate]]` table against the gates before it: its name,
/// a command, a cwd inside the repository, and a positive timeout.
fn check_gate(g: RawGate, earlier: &[Gate]) -> Result<Gate> {
    let name = g.name;
    let what = |s: &str| format!("{PATH}: gate `{name}`: {s}");
    if !valid_name(&name) {
        return Err(fail(
            Code::Config,
            format!(
                "{PATH}: gate name `{name}` is not valid: use letters, digits, `.`, `_` and `-`, starting with a letter or digit"
            ),
        ));
    }
    if earlier.iter().any(|o| o.name == name) {
        return Err(fail(
            Code::Config,
            what("is defined twice: rename or remove one"),
        ));
    }
    let empty = match &g.command {
        GateCommand::Shell(s) => s.trim().is_empty(),
        GateCommand::Argv(v) => v.first().is_none_or(|p| p.is_empty()),
    };
    if empty {
        return Err(fail(Code::Config, what("command is empty")));
    }
    let cwd = g.cwd.unwrap_or_else(|| ".".into());
    let escapes = Path::new(&cwd)
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if cwd.is_empty() || escapes {
        return Err(fail(
            Code::Config,
            what(&format!(
                "cwd `{cwd}` must be a path inside the repository, relative to its root (no `..`, not absolute)"
            )),
        ));
    }
    let timeout = match &g.timeout {
        Some(d) => d
            .resolve_positive(&format!("gate `{name}`: timeout"))
            .map_err(|e| fail(Code::Config, format!("{PATH}: {e:#}")))?,
        None => DEFAULT_TIMEOUT,
    };
    let digest = digest(&g.command, &cwd, &g.env);
    Ok(Gate {
        name,
        command: g.command,
        cwd,
        env: g.env,
        timeout,
        digest,
    })
}

/// Reads and parses `<root>/cache-manifests/gates.toml`.
pub fn load(root: &Path) -> Result<Plan> {
    let path = root.join(PATH);
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail(
                Code::Config,
                format!(
                    "{} not found: create it with one `[[gate]]` table per gate (name, command; see docs/gates.md)",
                    path.display()
                ),
            ));
        }
        Err(e) => {
            return Err(fail(
                Code::Config,
                format!("reading {}: {e}", path.display()),
            ));
        }
    };
    parse(&text)
}

/// `RawPlan`'s `Deserialize`, for the field reference made from it
/// (`docs/reference/manifests.md`, tests/it/docs.rs); nothing else calls it.
#[doc(hidden)]
pub fn describe<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<(), D::Error> {
    RawPlan::deserialize(d).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::code_of;

    fn err(text: &str) -> String {
        let e = parse(text).unwrap_err();
        assert_eq!(code_of(&e), Code::Config, "{e:#}");
        format!("{e:#}")
    }

    #[test]
    fn parses_a_full_manifest_in_order() {
        let plan = parse(
            r#"
ignore = ["scratch", "**/*.log"]
kill_grace = "250ms"

[[gate]]
name = "test"
command = ["cargo", "nextest", "run"]
timeout = "40m"
env = { RUST_BACKTRACE = "1" }

[[gate]]
name = "fmt"
command = "cargo fmt --check"
cwd = "xtask"
timeout = 30
"#,
        )
        .unwrap();
        assert_eq!(plan.ignore, ["scratch", "**/*.log"]);
        assert_eq!(plan.kill_grace, Duration::from_millis(250));
        assert_eq!(plan.names(), ["test", "fmt"]);
        let test = plan.gate("test").unwrap();
        assert_eq!(test.timeout, Duration::from_secs(2400));
        assert_eq!(test.cwd, ".");
        assert_eq!(test.command.argv(), ["cargo", "nextest", "run"]);
        let fmt = plan.gate("fmt").unwrap();
        assert_eq!(fmt.command.argv(), ["sh", "-c", "cargo fmt --check"]);
        assert_eq!(fmt.timeout, Duration::from_secs(30));
        assert!(fmt.digest.starts_with("sha256:") && fmt.digest.len() == 7 + 64);
    }

    #[test]
    fn defaults_apply() {
        let plan = parse("[[gate]]\nname = \"a\"\ncommand = \"true\"\n").unwrap();
        assert_eq!(plan.kill_grace, DEFAULT_GRACE);
        assert_eq!(plan.gates[0].timeout, DEFAULT_TIMEOUT);
        assert!(plan.ignore.is_empty());
    }

    #[test]
    fn digest_covers_command_cwd_and_env_but_not_timeout() {
        let base = "[[gate]]\nname = \"a\"\ncommand = \"make\"\n";
        let d = |extra: &str| {
            parse(&format!("{base}{extra}")).unwrap().gates[0]
                .digest
                .clone()
        };
        let plain = d("");
        assert_eq!(plain, d("timeout = \"5s\"\n"));
        assert_eq!(plain, d("cwd = \".\"\n"));
        assert_ne!(plain, d("cwd = \"sub\"\n"));
        assert_ne!(plain, d("env = { A = \"1\" }\n"));
        assert_ne!(d("env = { A = \"1\" }\n"), d("env = { A = \"2\" }\n"));
        // The same words as argv are a different command from a shell string.
        let argv = parse("[[gate]]\nname = \"a\"\ncommand = [\"make\"]\n").unwrap();
        assert_ne!(plain, argv.gates[0].digest);
        // Env order in the file does not matter.
        assert_eq!(
            d("env = { A = \"1\", B = \"2\" }\n"),
            d("env = { B = \"2\", A = \"1\" }\n")
        );
    }

    #[test]
    fn digest_is_pinned() {
        // A record made by an older build must stay green: the canonical form
        // of the digest is part of the record format.
        let env = BTreeMap::from([("K".to_string(), "v".to_string())]);
        let got = digest(&GateCommand::Argv(vec!["true".into()]), ".", &env);
        let canonical = r#"{"command":{"argv":["true"]},"cwd":".","env":{"K":"v"}}"#;
        assert_eq!(
            got,
            format!("sha256:{:x}", Sha256::digest(canonical.as_bytes()))
        );
    }

    #[test]
    fn bad_inputs_name_the_problem() {
        assert!(err("[[gate]]\nname = \"a\"\n").contains("gates.toml is not valid"));
        let typo = err("[[gate]]\nname = \"a\"\ncommand = \"x\"\ntimout = 3\n");
        assert!(
            typo.contains("is not valid: line 4 (`timout = 3`): unknown field `timout`"),
            "{typo}"
        );
        assert!(!typo.contains('\n'), "one line: {typo}");
        assert!(err("kill_grace = \"soon\"\n").contains("kill_grace: `soon` is not a duration"));
        assert!(
            err("[[gate]]\nname = \"a b\"\ncommand = \"x\"\n")
                .contains("gate name `a b` is not valid")
        );
        assert!(
            err(
                "[[gate]]\nname = \"a\"\ncommand = \"x\"\n[[gate]]\nname = \"a\"\ncommand = \"y\"\n"
            )
            .contains("gate `a`: is defined twice")
        );
        assert!(err("[[gate]]\nname = \"a\"\ncommand = []\n").contains("command is empty"));
        assert!(err("[[gate]]\nname = \"a\"\ncommand = \"  \"\n").contains("command is empty"));
        assert!(
            err("[[gate]]\nname = \"a\"\ncommand = \"x\"\ncwd = \"../up\"\n")
                .contains("cwd `../up`")
        );
        assert!(
            err("[[gate]]\nname = \"a\"\ncommand = \"x\"\ncwd = \"/abs\"\n").contains("cwd `/abs`")
        );
        assert!(
            err("[[gate]]\nname = \"a\"\ncommand = \"x\"\ntimeout = \"0s\"\n")
                .contains("gate `a`: timeout")
        );
        assert!(err("ignore = [\":(top)x\"]\n").contains("ignore entry"));
    }

    #[test]
    fn select_keeps_order_and_names_unknown_gates() {
        let plan = parse(
            "[[gate]]\nname = \"a\"\ncommand = \"x\"\n[[gate]]\nname = \"b\"\ncommand = \"y\"\n",
        )
        .unwrap();
        let names = |sel: Vec<&Gate>| sel.iter().map(|g| g.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(plan.select(&[]).unwrap()), ["a", "b"]);
        assert_eq!(
            names(plan.select(&["b".into(), "a".into(), "b".into()]).unwrap()),
            ["b", "a"]
        );
        let e = plan.select(&["c".into(), "a".into()]).unwrap_err();
        assert_eq!(code_of(&e), Code::Config);
        assert_eq!(
            e.to_string(),
            "no gate named `c` in cache-manifests/gates.toml (defined: a, b): add it there or fix the name"
        );
    }

    #[test]
    fn display_quotes_what_needs_it() {
        let c = GateCommand::Argv(vec!["cargo".into(), "-D warnings".into(), "it's".into()]);
        assert_eq!(c.display(), r"cargo '-D warnings' 'it'\''s'");
    }
}
