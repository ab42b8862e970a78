//! `cache-manifests/restore.toml`, parsed into a validated plan.
//!
//! Two stages, as in ripgrep's `lowargs`/`hiargs`: the `Raw*` types are what
//! the user wrote (serde, unknown fields refused per step kind), and `Plan` is
//! what will run (paths expanded, durations parsed, patterns compiled, names
//! checked). Building a plan reads the manifest and the environment only: it
//! never touches the network, runs nothing, and never writes, so `--dry-run`
//! and the unit tests below can check plans freely.

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::steps::cache::{self, CacheStep};
use super::steps::command::{self, Cmdline, CommandStep};
use super::steps::doctor::{self, Doctor};
use super::steps::download::{self, Download};
use super::steps::freshness::{self, Freshness};
use super::steps::links::{self, Links};
use super::steps::pin::{self, Fix, Pin};
use super::steps::service::{self, Service};
use super::steps::submodules::{self, Submodules};
use crate::exit::{Code, fail};
use crate::repo::Repo;
use crate::restore::fields::{one_line, shown};

/// The step kinds this build knows, as written in `kind = "..."`.
pub const KINDS: [&str; 9] = [
    "cache",
    "submodules",
    "links",
    "command",
    "download",
    "pin",
    "freshness",
    "service",
    "doctor",
];

/// The whole bootstrap: the steps in the order they run.
#[derive(Debug)]
pub struct Plan {
    pub file: PathBuf,
    pub steps: Vec<Step>,
    /// `parallel` at the top: at most this many steps at once, in the
    /// order `after` gives (`restore/schedule.rs`). `None`: file order.
    pub parallel: Option<usize>,
    /// The top-level `[env]`: exported whatever the steps' states.
    pub exports: super::exports::Exports,
    /// `slow_uncached`: a step whose cold run took longer, and whose result
    /// no cache holds, is flagged (`restore::slow`). `None`: `false`, off.
    pub slow_uncached: Option<Duration>,
}

/// One validated step.
#[derive(Debug)]
pub struct Step {
    pub name: String,
    /// Runs in a detached process when it has work to do.
    pub background: bool,
    /// A failure prints one line and the restore goes on (default true).
    pub fail_open: bool,
    /// With `parallel`: the steps this one waits for (else always empty).
    pub after: Vec<String>,
    /// `path = [...]` and `env = {...}`, for `restore env`.
    pub exports: super::exports::Exports,
    pub kind: Kind,
}

#[derive(Debug)]
pub enum Kind {
    Cache(CacheStep),
    Submodules(Submodules),
    Links(Links),
    Command(CommandStep),
    Download(Download),
    Pin(Pin),
    Freshness(Freshness),
    Service(Service),
    Doctor(Doctor),
}

impl Step {
    pub fn kind_name(&self) -> &'static str {
        match self.kind {
            Kind::Cache(_) => "cache",
            Kind::Submodules(_) => "submodules",
            Kind::Links(_) => "links",
            Kind::Command(_) => "command",
            Kind::Download(_) => "download",
            Kind::Pin(_) => "pin",
            Kind::Freshness(_) => "freshness",
            Kind::Service(_) => "service",
            Kind::Doctor(_) => "doctor",
        }
    }

    /// Whether the step writes this repository's own git state
    /// (`.git/config`, the index, refs): two such steps at once would fail
    /// on each other's lock files, so the scheduler never runs them together.
    pub fn writes_repo_git(&self) -> bool {
        matches!(self.kind, Kind::Submodules(_) | Kind::Freshness(_))
    }

    /// Where the step restores from, for the orientation table.
    pub fn source(&self, repo: &Repo) -> String {
        let rel = |p: &Path| {
            p.strip_prefix(&repo.root)
                .map(|r| r.display().to_string())
                .unwrap_or_else(|_| p.display().to_string())
        };
        match &self.kind {
            Kind::Cache(c) => cache_source(repo, c),
            Kind::Submodules(s) => s.paths.join(" "),
            Kind::Links(l) => format!("{} -> {}", rel(&l.source), rel(&l.farm)),
            Kind::Command(c) => c.run.display(),
            Kind::Download(d) => crate::redact::url(&d.url),
            Kind::Pin(p) => format!("{} {}", p.tool, p.args.join(" ")),
            // A remote given as a URL is shown without its userinfo.
            Kind::Freshness(f) => match (f.remote.as_deref().map(crate::redact::url), &f.branch) {
                (Some(r), Some(b)) => format!("{r}/{b}"),
                (Some(r), None) => format!("{r} (upstream)"),
                (None, Some(b)) => format!("upstream/{b}"),
                (None, None) => "upstream".into(),
            },
            Kind::Service(s) => s.run.display(),
            Kind::Doctor(d) => d.display(),
        }
    }

    /// Everything the step will do, for `--dry-run` (text and JSON).
    pub fn describe(&self, repo: &Repo) -> Value {
        let ms = |d: &Duration| d.as_millis() as u64;
        let detail = match &self.kind {
            Kind::Cache(c) => json!({
                "cache": c.cache,
                "manifest": crate::cache::format::manifest::path_of(repo, &c.cache),
                // As written (a name or a URL), not resolved: not a `remote`.
                "remote_name": c.remote.as_deref().map(crate::redact::url),
            }),
            Kind::Submodules(s) => json!({
                "paths": s.paths,
                "sentinels": s.sentinels.iter().map(|x| json!({
                    "suite": x.suite, "path": x.path, "breaks": x.breaks,
                })).collect::<Vec<_>>(),
                "allow_file_protocol": s.allow_file_protocol,
                "timeout_ms": ms(&s.timeout),
                "jobs": s.jobs,
                "shallow": s.shallow,
            }),
            Kind::Links(l) => json!({
                "source": l.source, "farm": l.farm, "index": l.index,
                "entries": format!("{:?}", l.entries).to_lowercase(),
                "include": l.include.iter().map(|g| g.text.as_str()).collect::<Vec<_>>(),
            }),
            Kind::Command(c) => json!({
                "run": c.run.display(), "creates": c.creates,
                "unless": c.unless.as_ref().map(Cmdline::display),
                "cwd": c.cwd, "timeout_ms": c.timeout.as_ref().map(ms),
                "retries": c.retry.retries, "backoff_ms": ms(&c.retry.backoff),
            }),
            Kind::Download(d) => json!({
                "url": crate::redact::url(&d.url), "sha256": d.sha256, "dest": d.dest,
                "executable": d.executable,
                "unpack_into": d.unpack_into, "only": d.only,
                "connect_timeout_ms": ms(&d.connect_timeout),
                "read_timeout_ms": ms(&d.read_timeout),
                "max_time_ms": d.max_time.as_ref().map(ms),
                "retries": d.retries, "backoff_ms": ms(&d.backoff),
                "unless": d.unless.as_ref().map(Cmdline::display),
            }),
            Kind::Pin(p) => json!({
                "tool": p.tool, "args": p.args, "expect": p.expect.as_str(),
                "timeout_ms": ms(&p.timeout),
                "fix": match &p.fix {
                    None => Value::Null,
                    // As the manifest wrote it: one link, or the list.
                    Some(Fix::Symlink { links, target }) => match links.as_slice() {
                        [one] => json!({"symlink": one, "target": target}),
                        more => json!({"symlink": more, "target": target}),
                    },
                    Some(Fix::Run(c)) => json!({"run": c.display()}),
                },
            }),
            Kind::Freshness(f) => json!({
                // A name only (a `remote` in JSON is `{name, url}`).
                "remote_name": f.remote.as_deref().map(crate::redact::url), "branch": f.branch,
                "timeout_ms": ms(&f.timeout), "interval_ms": ms(&f.interval),
            }),
            Kind::Service(s) => s.describe(),
            Kind::Doctor(d) => json!({
                "connect_timeout_ms": d.connect_timeout.as_ref().map(ms),
                "timeout_ms": d.timeout.as_ref().map(ms),
                "interval_ms": ms(&d.interval),
            }),
        };
        let mut detail = detail;
        if !self.exports.is_empty()
            && let Some(obj) = detail.as_object_mut()
        {
            obj.insert("exports".into(), self.exports.describe());
        }
        json!({
            "step": self.name,
            "kind": self.kind_name(),
            "source": self.source(repo),
            "background": self.background,
            "fail_open": self.fail_open,
            "after": self.after,
            "detail": detail,
        })
    }
}

/// `BRANCH @ REMOTE` of a cache step, from its cache manifest (read when
/// the table is drawn; a manifest that does not load shows its path, and
/// the step itself says what is wrong).
fn cache_source(repo: &Repo, c: &CacheStep) -> String {
    match crate::cache::manifests::load(repo, &c.cache) {
        Ok(m) => format!(
            "{} @ {}",
            m.branch,
            crate::redact::url(c.remote.as_deref().unwrap_or(&m.remote))
        ),
        Err(_) => format!("cache-manifests/{}.toml", c.cache),
    }
}

/// `cache-manifests/restore.toml` of this repository.
pub fn path_of(repo: &Repo) -> PathBuf {
    repo.manifests_dir().join("restore.toml")
}

/// Reads and validates the repository's restore.toml. Every problem is a
/// `Code::Config` error naming the file, the step and the fix.
pub fn load(repo: &Repo) -> Result<Plan> {
    let file = path_of(repo);
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(fail(
                Code::Config,
                format!(
                    "{} does not exist: create it with the steps this repository needs (docs/restore.md)",
                    file.display()
                ),
            ));
        }
        Err(e) => return Err(anyhow!(e).context(format!("reading {}", file.display()))),
    };
    parse(repo, &file, &text)
}

/// Validates manifest text (the file name is used in messages only).
pub fn parse(repo: &Repo, file: &Path, text: &str) -> Result<Plan> {
    let bad = |msg: String| fail(Code::Config, format!("{}: {msg}", file.display()));
    let mut top: toml::Table = toml::from_str(text)
        .map_err(|e| bad(format!("not valid TOML: {}", one_line(e.message()))))?;
    let raw_steps = match top.remove("step") {
        None => Vec::new(),
        Some(toml::Value::Array(a)) => a,
        Some(_) => {
            return Err(bad(
                "`step` must be an array of tables: write `[[step]]`".into()
            ));
        }
    };
    let parallel = parallel_limit(top.remove("parallel")).map_err(|e| bad(format!("{e:#}")))?;
    let slow_uncached =
        slow_uncached(top.remove("slow_uncached")).map_err(|e| bad(format!("{e:#}")))?;
    let exports = match top.remove("env") {
        None => super::exports::Exports::default(),
        Some(v) => {
            super::exports::top_level(repo, v).map_err(|e| bad(one_line(&format!("{e:#}"))))?
        }
    };
    if let Some(key) = top.keys().next() {
        return Err(bad(format!(
            "unknown top-level key `{key}`: only `parallel`, `slow_uncached`, `[env]` and `[[step]]` tables belong here"
        )));
    }
    let mut steps: Vec<Step> = Vec::new();
    for (i, raw) in raw_steps.into_iter().enumerate() {
        let toml::Value::Table(table) = raw else {
            return Err(bad(format!("step {} is not a table", i + 1)));
        };
        // Errors from the kind's fields come back without the step's name.
        let hint = table.get("name").and_then(|n| n.as_str()).map(String::from);
        let step = parse_step(repo, table).map_err(|(name, e)| {
            let name = name.or(hint.clone());
            let which = match name {
                Some(n) => format!("step {} ({n:?})", i + 1),
                None => format!("step {}", i + 1),
            };
            bad(format!("{which}: {}", one_line(&format!("{e:#}"))))
        })?;
        if steps.iter().any(|s| s.name == step.name) {
            return Err(bad(format!(
                "two steps are named {:?}: step names must be unique",
                step.name
            )));
        }
        steps.push(step);
    }
    if steps.is_empty() {
        return Err(bad(
            "no steps: add at least one `[[step]]` with a `name` and a `kind`".into(),
        ));
    }
    check_after(&steps, parallel).map_err(bad)?;
    let sources = std::iter::once(("[env]".to_string(), &exports)).chain(
        steps
            .iter()
            .map(|s| (format!("step {:?}", s.name), &s.exports)),
    );
    super::exports::check_conflicts(sources).map_err(|e| bad(format!("{e:#}")))?;
    pins_search_exported_path(&exports, &mut steps);
    Ok(Plan {
        file: file.to_path_buf(),
        steps,
        parallel,
        exports,
        slow_uncached,
    })
}

/// A pin checks its tool as the shell that evaluated `restore env` finds
/// it: `[env]`'s directories, then those of each step up to the pin, in file
/// order (the order `restore env` prepends them in), in front of PATH.
fn pins_search_exported_path(top: &super::exports::Exports, steps: &mut [Step]) {
    let mut seen: Vec<PathBuf> = Vec::new();
    let add = |seen: &mut Vec<PathBuf>, dirs: &[String]| {
        for d in dirs.iter().map(PathBuf::from) {
            if !seen.contains(&d) {
                seen.push(d);
            }
        }
    };
    add(&mut seen, &top.path);
    for step in steps {
        add(&mut seen, &step.exports.path);
        if let Kind::Pin(p) = &mut step.kind {
            p.search = seen.clone();
        }
    }
}

/// `parallel = true` (the default limit), `parallel = N` (at most N steps at
/// once, 1 to 64), `parallel = false` or absent (file order, as always).
fn parallel_limit(v: Option<toml::Value>) -> Result<Option<usize>> {
    match v {
        None | Some(toml::Value::Boolean(false)) => Ok(None),
        Some(toml::Value::Boolean(true)) => Ok(Some(super::schedule::default_limit())),
        Some(toml::Value::Integer(n)) if (1..=64).contains(&n) => Ok(Some(n as usize)),
        Some(other) => bail!(
            "`parallel` = {} must be true, false or a number of steps from 1 to 64",
            shown(&other)
        ),
    }
}

/// `slow_uncached` when restore.toml does not set it: ten minutes.
pub const SLOW_UNCACHED_DEFAULT: Duration = Duration::from_secs(600);

/// `slow_uncached = "10m"` (a positive duration; the default), or `false`:
/// the 10-minute rule off.
fn slow_uncached(v: Option<toml::Value>) -> Result<Option<Duration>> {
    let spec = match v {
        None => return Ok(Some(SLOW_UNCACHED_DEFAULT)),
        Some(toml::Value::Boolean(false)) => return Ok(None),
        Some(toml::Value::String(s)) => crate::clock::DurationSpec::Text(s),
        Some(toml::Value::Integer(n)) if n > 0 => crate::clock::DurationSpec::Seconds(n as u64),
        Some(other) => bail!(
            "`slow_uncached` = {} must be a duration such as \"10m\" or \"90s\", or false to flag no step",
            shown(&other)
        ),
    };
    Ok(Some(spec.resolve_positive("`slow_uncached`")?))
}

/// `after` only means something in a parallel plan (file order already
/// orders every step), and names foreground steps for foreground steps:
/// a background step ends after the command returned, so nothing in the
/// foreground can wait for it.
fn check_after(steps: &[Step], parallel: Option<usize>) -> std::result::Result<(), String> {
    if parallel.is_none()
        && let Some(s) = steps.iter().find(|s| !s.after.is_empty())
    {
        return Err(format!(
            "step {:?} has `after`, which needs `parallel = true` at the top of the file (without it steps run in file order)",
            s.name
        ));
    }
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    let after: Vec<Vec<String>> = steps.iter().map(|s| s.after.clone()).collect();
    super::schedule::check_order(&names, &after)?;
    for s in steps.iter().filter(|s| !s.background) {
        if let Some(b) = s
            .after
            .iter()
            .find(|a| steps.iter().any(|t| &t.name == *a && t.background))
        {
            return Err(format!(
                "step {:?} is `after` background step {b:?}: a foreground step cannot wait for a background one; make {:?} background too, or drop {b:?} from its `after`",
                s.name, s.name
            ));
        }
    }
    Ok(())
}

type StepError = (Option<String>, anyhow::Error);

/// The fields every step takes, read here rather than by a kind's serde
/// form: the reference page lists exactly these, and a debug build checks
/// that `parse_step` takes no other field by hand.
pub const STEP_FIELDS: [&str; 7] = [
    "name",
    "kind",
    "background",
    "fail_open",
    "after",
    "path",
    "env",
];

fn parse_step(repo: &Repo, mut t: toml::Table) -> std::result::Result<Step, StepError> {
    let given: Vec<String> = t.keys().cloned().collect();
    let take_str = |t: &mut toml::Table, key: &str| -> Result<Option<String>> {
        match t.remove(key) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(s)),
            Some(_) => bail!("`{key}` must be a string"),
        }
    };
    let take_bool = |t: &mut toml::Table, key: &str, default: bool| -> Result<bool> {
        match t.remove(key) {
            None => Ok(default),
            Some(toml::Value::Boolean(b)) => Ok(b),
            Some(_) => bail!("`{key}` must be true or false"),
        }
    };
    let name = take_str(&mut t, "name")
        .map_err(|e| (None, e))?
        .ok_or_else(|| (None, anyhow!("`name` is missing")))?;
    let named = |e: anyhow::Error| (Some(name.clone()), e);
    check_name(&name).map_err(named)?;
    let kind = take_str(&mut t, "kind")
        .map_err(named)?
        .ok_or_else(|| named(anyhow!("`kind` is missing: one of {}", KINDS.join(", "))))?;
    let background = take_bool(&mut t, "background", false).map_err(named)?;
    let fail_open = take_bool(&mut t, "fail_open", true).map_err(named)?;
    let after = take_after(&mut t).map_err(named)?;
    let exports = super::exports::take(repo, &mut t).map_err(named)?;
    debug_assert!(
        given
            .iter()
            .all(|k| t.contains_key(k) || STEP_FIELDS.contains(&k.as_str())),
        "parse_step took a field by hand that STEP_FIELDS does not list"
    );
    let rest = toml::Value::Table(t);
    let kind = match kind.as_str() {
        "cache" => cache::resolve_cache(de(rest)?).map(Kind::Cache),
        "submodules" => submodules::resolve_submodules(repo, de(rest)?).map(Kind::Submodules),
        "links" => links::resolve_links(repo, de(rest)?).map(Kind::Links),
        "command" => command::resolve_command(repo, de(rest)?).map(Kind::Command),
        "download" => download::resolve_download(repo, de(rest)?).map(Kind::Download),
        "pin" => pin::resolve_pin(repo, de(rest)?).map(Kind::Pin),
        "freshness" => freshness::resolve_freshness(de(rest)?).map(Kind::Freshness),
        "service" => service::resolve_service(repo, &name, de(rest)?).map(Kind::Service),
        "doctor" => doctor::resolve_doctor(de(rest)?, fail_open).map(Kind::Doctor),
        other => Err(anyhow!(
            "unknown kind {other:?}: one of {}",
            KINDS.join(", ")
        )),
    }
    .map_err(named)?;
    Ok(Step {
        name,
        background,
        fail_open,
        after,
        exports,
        kind,
    })
}

/// `after = ["step", ...]`: names, each once.
fn take_after(t: &mut toml::Table) -> Result<Vec<String>> {
    let Some(v) = t.remove("after") else {
        return Ok(Vec::new());
    };
    let list: Vec<String> = v
        .try_into()
        .map_err(|_| anyhow!("`after` must be a list of step names, such as [\"deps\"]"))?;
    for (i, a) in list.iter().enumerate() {
        if list[..i].contains(a) {
            bail!("`after` names {a:?} twice");
        }
    }
    Ok(list)
}

/// Deserializes the kind-specific fields; the caller names the step.
fn de<T: serde::de::DeserializeOwned>(v: toml::Value) -> std::result::Result<T, StepError> {
    v.try_into::<T>()
        .map_err(|e| (None, anyhow!("{}", one_line(e.message()))))
}

fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!("name {name:?} must be letters, digits, `.`, `_` or `-` (it names the log file)");
    }
    Ok(())
}

#[cfg(test)]
mod tests;
