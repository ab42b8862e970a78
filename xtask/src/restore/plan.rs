//! `cache-manifests/restore.toml`, parsed into a validated plan.
//!
//! Two stages, as in ripgrep's `lowargs`/`hiargs`: the `Raw*` types are what
//! the user wrote (serde, unknown fields refused per step kind), and `Plan` is
//! what will run (paths expanded, durations parsed, patterns compiled, names
//! checked). Building a plan reads the manifest and the environment only: it
//! never touches the network, runs nothing, and never writes, so `--dry-run`
//! and the unit tests below can check plans freely.

use anyhow::{Result, anyhow, bail};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cache::format::manifest::expand_path;
use crate::clock::DurationSpec;
use crate::exit::{Code, fail};
use crate::repo::Repo;
use crate::restore::fields::{dur, field, one_line, repo_relative, retry_policy, shown, timeout};
use crate::restore::steps::command::Cmdline;

/// The step kinds this build knows, as written in `kind = "..."`.
pub const KINDS: [&str; 8] = [
    "cache",
    "submodules",
    "links",
    "command",
    "download",
    "pin",
    "freshness",
    "service",
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
}

/// A cache of `cache-manifests/<cache>.toml`, restored by the cache module.
#[derive(Debug)]
pub struct CacheStep {
    /// The cache manifest's name.
    pub cache: String,
    /// Fetch from this remote (name or URL) instead of the manifest's.
    pub remote: Option<String>,
}

/// `git submodule update --init` of the listed paths, then one sentinel file per suite.
#[derive(Debug)]
pub struct Submodules {
    /// Paths relative to the repository root, as `git submodule` takes them.
    pub paths: Vec<String>,
    pub sentinels: Vec<Sentinel>,
    /// Allow `file://` and local-path submodule URLs (git refuses them by
    /// default since 2.38.1 for submodules).
    pub allow_file_protocol: bool,
    pub timeout: Duration,
    /// Submodules fetched at once (`git submodule update --jobs`).
    pub jobs: u32,
    /// `--depth 1`, with a full fetch where the server refuses it.
    pub shallow: bool,
}

#[derive(Debug)]
pub struct Sentinel {
    pub suite: String,
    /// As written (relative to the root), for the MISSING line.
    pub path: String,
    pub abs: PathBuf,
    /// What stops working without it: the consumer named in MISSING lines.
    pub breaks: String,
}

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

/// Runs only when `creates` is missing and `unless` does not succeed.
#[derive(Debug)]
pub struct CommandStep {
    pub run: Cmdline,
    pub creates: Option<PathBuf>,
    pub unless: Option<Cmdline>,
    pub cwd: PathBuf,
    /// Bounds each attempt; one that runs out is a failed attempt.
    pub timeout: Option<Duration>,
    /// A failed attempt is tried again (default: never, a command may not
    /// be safe to repeat), with `download`'s semantics.
    pub retry: crate::restore::retry::Policy,
}

/// A file fetched over HTTPS, pinned by sha256, installed atomically.
#[derive(Debug)]
pub struct Download {
    pub url: String,
    pub sha256: String,
    pub dest: PathBuf,
    pub executable: bool,
    /// A `.conda` (or `.tar.bz2`) package to unpack into this prefix with
    /// the conda module once its pin checked.
    pub unpack_into: Option<PathBuf>,
    /// With `unpack_into`: install only these directories of the package.
    pub only: Vec<String>,
    pub connect_timeout: Duration,
    /// A transfer that moves no byte for this long is abandoned (and retried).
    pub read_timeout: Duration,
    pub max_time: Option<Duration>,
    /// Further attempts after the first one.
    pub retries: u32,
    /// Wait before the first retry; doubles on each further one.
    pub backoff: Duration,
    /// A probe command whose success means the download is not needed
    /// (e.g. the system's own tool is recent enough).
    pub unless: Option<Cmdline>,
}

/// A tool whose `--version` output must match `expect`, else `fix` is applied.
#[derive(Debug)]
pub struct Pin {
    /// A name looked up in PATH, or a path (contains `/`).
    pub tool: String,
    pub args: Vec<String>,
    pub expect: regex_lite::Regex,
    pub timeout: Duration,
    pub fix: Option<Fix>,
}

#[derive(Debug)]
pub enum Fix {
    /// Make `link` a symlink to `target` (replacing a link already there).
    Symlink {
        link: PathBuf,
        target: PathBuf,
    },
    Run(Cmdline),
}

/// Fetch the current branch's upstream; fast-forward when behind and clean.
#[derive(Debug)]
pub struct Freshness {
    /// Default: the branch's configured remote, else `origin`.
    pub remote: Option<String>,
    /// Default: the branch's configured upstream branch, else its own name.
    pub branch: Option<String>,
    /// Bound on the fetch; past it the remote counts as unreachable.
    pub timeout: Duration,
    /// A check younger than this is warm (no network).
    pub interval: Duration,
    /// The step's `[network]` table (connect and stall deadlines).
    pub network: crate::net::ManifestNetwork,
}

/// A long-running process kept alive by restore (`steps/service.rs`).
#[derive(Debug)]
pub struct Service {
    /// Stays in the foreground: it is the process the pidfile names.
    pub run: Cmdline,
    pub pidfile: PathBuf,
    /// Its stdout and stderr (appended).
    pub log: PathBuf,
    pub ready: Option<Ready>,
    /// How long a start may take to become ready.
    pub ready_timeout: Duration,
    /// A change to one of these (device, inode, size, mtime) restarts it.
    pub watch: Vec<PathBuf>,
    pub cwd: PathBuf,
    /// `restore stop`: SIGTERM, then SIGKILL after this long.
    pub kill_grace: Duration,
}

/// When a started service counts as ready.
#[derive(Debug)]
pub enum Ready {
    /// Something accepts TCP connections on 127.0.0.1:port.
    Port(u16),
    /// The command exits 0.
    Cmd(Cmdline),
}

impl Service {
    fn describe(&self) -> Value {
        json!({
            "run": self.run.display(), "pidfile": self.pidfile, "log": self.log,
            "ready_port": match &self.ready { Some(Ready::Port(p)) => json!(p), _ => Value::Null },
            "ready_cmd": match &self.ready { Some(Ready::Cmd(c)) => json!(c.display()), _ => Value::Null },
            "ready_timeout_ms": self.ready_timeout.as_millis() as u64,
            "watch": self.watch, "cwd": self.cwd,
            "kill_grace_ms": self.kill_grace.as_millis() as u64,
        })
    }
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
                    Some(Fix::Symlink { link, target }) => json!({"symlink": link, "target": target}),
                    Some(Fix::Run(c)) => json!({"run": c.display()}),
                },
            }),
            Kind::Freshness(f) => json!({
                // A name only (a `remote` in JSON is `{name, url}`).
                "remote_name": f.remote.as_deref().map(crate::redact::url), "branch": f.branch,
                "timeout_ms": ms(&f.timeout), "interval_ms": ms(&f.interval),
            }),
            Kind::Service(s) => s.describe(),
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
    match crate::cache::format::manifest::load(repo, &c.cache) {
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
                    "{} does not exist: create it with the steps this repository needs (README.md, \"Restore the machine\")",
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
    let exports = match top.remove("env") {
        None => super::exports::Exports::default(),
        Some(v) => {
            super::exports::top_level(repo, v).map_err(|e| bad(one_line(&format!("{e:#}"))))?
        }
    };
    if let Some(key) = top.keys().next() {
        return Err(bad(format!(
            "unknown top-level key `{key}`: only `parallel`, `[env]` and `[[step]]` tables belong here"
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
    Ok(Plan {
        file: file.to_path_buf(),
        steps,
        parallel,
        exports,
    })
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

fn parse_step(repo: &Repo, mut t: toml::Table) -> std::result::Result<Step, StepError> {
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
    let rest = toml::Value::Table(t);
    let kind = match kind.as_str() {
        "cache" => resolve_cache(de(rest)?),
        "submodules" => resolve_submodules(repo, de(rest)?),
        "links" => resolve_links(repo, de(rest)?),
        "command" => resolve_command(repo, de(rest)?),
        "download" => resolve_download(repo, de(rest)?),
        "pin" => resolve_pin(repo, de(rest)?),
        "freshness" => resolve_freshness(de(rest)?),
        "service" => resolve_service(repo, &name, de(rest)?),
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    cache: String,
    remote: Option<String>,
}

fn resolve_cache(r: RawCache) -> Result<Kind> {
    let ok = !r.cache.is_empty()
        && !r.cache.starts_with('.')
        && r.cache
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        bail!(
            "`cache` = {:?} must name a manifest cache-manifests/<cache>.toml (letters, digits, `.`, `_`, `-`)",
            r.cache
        );
    }
    if crate::cache::format::manifest::RESERVED.contains(&r.cache.as_str()) {
        bail!(
            "`cache` = {:?} names a reserved file, not a cache manifest",
            r.cache
        );
    }
    if let Some(remote) = &r.remote
        && (remote.is_empty() || remote.starts_with('-'))
    {
        bail!("`remote` = {remote:?} is not a remote name or URL");
    }
    Ok(Kind::Cache(CacheStep {
        cache: r.cache,
        remote: r.remote,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSubmodules {
    paths: Vec<String>,
    #[serde(default)]
    sentinel: Vec<RawSentinel>,
    #[serde(default)]
    allow_file_protocol: bool,
    timeout: Option<DurationSpec>,
    // Values, not types: serde's "expected i64" would not name the field.
    jobs: Option<toml::Value>,
    shallow: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSentinel {
    suite: String,
    path: String,
    breaks: String,
}

fn resolve_submodules(repo: &Repo, r: RawSubmodules) -> Result<Kind> {
    if r.paths.is_empty() {
        bail!("`paths` is empty: list the submodule paths to initialise");
    }
    let paths = r
        .paths
        .iter()
        .map(|p| repo_relative("paths", p))
        .collect::<Result<Vec<_>>>()?;
    let mut sentinels = Vec::new();
    for s in r.sentinel {
        let path = repo_relative("sentinel.path", &s.path)?;
        if s.suite.is_empty() || s.breaks.is_empty() {
            bail!(
                "sentinel {path:?} needs a non-empty `suite` and `breaks` (what stops working without it)"
            );
        }
        sentinels.push(Sentinel {
            suite: s.suite,
            abs: repo.root.join(&path),
            path,
            breaks: s.breaks,
        });
    }
    // Default: every listed submodule at once, at most 8 (each is one
    // clone talking to the server; git's own default is 1, one by one).
    let jobs = match r.jobs {
        None => paths.len().clamp(1, 8) as u32,
        Some(toml::Value::Integer(n)) if (1..=64).contains(&n) => n as u32,
        Some(v) => bail!(
            "`jobs` = {} must be a number of submodules fetched at once, 1 to 64",
            shown(&v)
        ),
    };
    let shallow = match r.shallow {
        None => false,
        Some(toml::Value::Boolean(b)) => b,
        Some(v) => bail!("`shallow` = {} must be true or false", shown(&v)),
    };
    Ok(Kind::Submodules(Submodules {
        paths,
        sentinels,
        allow_file_protocol: r.allow_file_protocol,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(600))?,
        jobs,
        shallow,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLinks {
    source: String,
    farm: String,
    index: Option<String>,
    entries: Option<Entries>,
    include: Option<toml::Value>,
}

fn resolve_links(repo: &Repo, r: RawLinks) -> Result<Kind> {
    let source = expand_path(repo, &r.source)?;
    let farm = expand_path(repo, &r.farm)?;
    if source == farm || farm.starts_with(&source) {
        bail!("`farm` must not be `source` or inside it (the scan would see the links)");
    }
    Ok(Kind::Links(Links {
        source,
        farm,
        index: r.index.map(|i| expand_path(repo, &i)).transpose()?,
        entries: r.entries.unwrap_or(Entries::All),
        include: field::<Vec<String>>(r.include, "include")?
            .unwrap_or_default()
            .iter()
            .map(|g| link_glob(g))
            .collect::<Result<_>>()?,
    }))
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    run: Cmdline,
    creates: Option<String>,
    unless: Option<Cmdline>,
    cwd: Option<String>,
    timeout: Option<DurationSpec>,
    retries: Option<toml::Value>,
    backoff: Option<toml::Value>,
}

fn resolve_command(repo: &Repo, r: RawCommand) -> Result<Kind> {
    r.run.check("run")?;
    if let Some(u) = &r.unless {
        u.check("unless")?;
    }
    if r.creates.is_none() && r.unless.is_none() {
        bail!(
            "a command needs `creates` (a path) or `unless` (a probe command), else it would run on every restore"
        );
    }
    Ok(Kind::Command(CommandStep {
        run: r.run,
        creates: r.creates.map(|c| expand_path(repo, &c)).transpose()?,
        unless: r.unless,
        cwd: match r.cwd {
            Some(c) => expand_path(repo, &c)?,
            None => repo.root.clone(),
        },
        timeout: r
            .timeout
            .map(|t| t.resolve_positive("timeout"))
            .transpose()?,
        retry: retry_policy(r.retries.as_ref(), r.backoff, 0)?,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDownload {
    url: String,
    sha256: String,
    dest: String,
    #[serde(default)]
    executable: bool,
    unpack_into: Option<String>,
    #[serde(default)]
    only: Vec<String>,
    connect_timeout: Option<DurationSpec>,
    read_timeout: Option<DurationSpec>,
    max_time: Option<DurationSpec>,
    retries: Option<toml::Value>,
    backoff: Option<toml::Value>,
    unless: Option<toml::Value>,
}

fn resolve_download(repo: &Repo, r: RawDownload) -> Result<Kind> {
    check_url(&r.url)?;
    let sha256 = r.sha256.to_ascii_lowercase();
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "`sha256` = {:?} is not 64 hex digits: pin the file with `sha256sum FILE`",
            r.sha256
        );
    }
    let dest = expand_path(repo, &r.dest)?;
    if dest.file_name().is_none() || r.dest.ends_with('/') {
        bail!("`dest` = {:?} must name the file to install", r.dest);
    }
    let unpack_into = r.unpack_into.map(|p| expand_path(repo, &p)).transpose()?;
    match &unpack_into {
        None if !r.only.is_empty() => {
            bail!("`only` needs `unpack_into`: it filters what a package installs")
        }
        Some(_) if !(r.dest.ends_with(".conda") || r.dest.ends_with(".tar.bz2")) => bail!(
            "`dest` = {:?} must end in .conda or .tar.bz2 when `unpack_into` is set",
            r.dest
        ),
        Some(_) if r.executable => {
            bail!("`executable` does not apply to a package that is unpacked")
        }
        _ => {}
    }
    for o in &r.only {
        let p = Path::new(o);
        if o.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!("`only` = {o:?} must be a directory inside the package, such as \"bin/\"");
        }
    }
    let retry = retry_policy(r.retries.as_ref(), r.backoff, 3)?;
    let unless = field::<Cmdline>(r.unless, "unless")?;
    if let Some(u) = &unless {
        u.check("unless")?;
    }
    Ok(Kind::Download(Download {
        url: r.url,
        sha256,
        dest,
        executable: r.executable,
        unpack_into,
        only: r.only,
        connect_timeout: timeout(
            &r.connect_timeout,
            "connect_timeout",
            Duration::from_secs(10),
        )?,
        read_timeout: timeout(&r.read_timeout, "read_timeout", Duration::from_secs(30))?,
        max_time: r
            .max_time
            .map(|t| t.resolve_positive("max_time"))
            .transpose()?,
        retries: retry.retries,
        backoff: retry.backoff,
        unless,
    }))
}

/// HTTPS only; plain HTTP is accepted for loopback hosts (local mirrors and
/// tests), where nothing crosses a network. The sha256 pin guards the bytes
/// either way.
fn check_url(url: &str) -> Result<()> {
    if let Some(rest) = url.strip_prefix("https://") {
        if rest.is_empty() {
            bail!("`url` = {:?} has no host", crate::redact::url(url));
        }
        return Ok(());
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        // `user:password@` is not the host.
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return Ok(());
        }
    }
    bail!(
        "`url` = {:?} must be https:// (plain http:// only for 127.0.0.1 or localhost)",
        crate::redact::url(url)
    )
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    tool: String,
    args: Option<Vec<String>>,
    expect: String,
    timeout: Option<DurationSpec>,
    fix: Option<RawFix>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFix {
    symlink: Option<String>,
    target: Option<String>,
    run: Option<Cmdline>,
}

fn resolve_pin(repo: &Repo, r: RawPin) -> Result<Kind> {
    if r.tool.is_empty() {
        bail!("`tool` is empty");
    }
    let tool = if r.tool.contains('/') {
        expand_path(repo, &r.tool)?.display().to_string()
    } else {
        r.tool
    };
    let expect = regex_lite::Regex::new(&r.expect)
        .map_err(|e| anyhow!("`expect` = {:?} is not a valid pattern: {e}", r.expect))?;
    let fix = match r.fix {
        None => None,
        Some(RawFix {
            symlink: Some(link),
            target: Some(target),
            run: None,
        }) => Some(Fix::Symlink {
            link: expand_path(repo, &link)?,
            target: expand_path(repo, &target)?,
        }),
        Some(RawFix {
            symlink: None,
            target: None,
            run: Some(run),
        }) => {
            run.check("fix.run")?;
            Some(Fix::Run(run))
        }
        Some(_) => bail!(
            "`fix` must be either `{{ symlink = LINK, target = TARGET }}` or `{{ run = COMMAND }}`"
        ),
    };
    Ok(Kind::Pin(Pin {
        tool,
        args: r.args.unwrap_or_else(|| vec!["--version".into()]),
        expect,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(10))?,
        fix,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFreshness {
    remote: Option<String>,
    branch: Option<String>,
    timeout: Option<DurationSpec>,
    interval: Option<DurationSpec>,
    #[serde(default)]
    network: crate::net::RawNetwork,
}

fn resolve_freshness(r: RawFreshness) -> Result<Kind> {
    for (field, v) in [("remote", &r.remote), ("branch", &r.branch)] {
        if let Some(v) = v
            && (v.is_empty() || v.starts_with('-'))
        {
            bail!("`{field}` = {v:?} is not a remote or branch name");
        }
    }
    Ok(Kind::Freshness(Freshness {
        remote: r.remote,
        branch: r.branch,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(10))?,
        interval: dur(&r.interval, "interval", Duration::from_secs(600))?,
        network: r.network.resolve()?,
    }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    run: Cmdline,
    pidfile: Option<String>,
    log: Option<String>,
    /// Taken as any value, so that a wrong type is refused naming the field.
    ready_port: Option<toml::Value>,
    ready_cmd: Option<Cmdline>,
    ready_timeout: Option<DurationSpec>,
    #[serde(default)]
    watch: Vec<String>,
    cwd: Option<String>,
    kill_grace: Option<DurationSpec>,
}

fn resolve_service(repo: &Repo, name: &str, r: RawService) -> Result<Kind> {
    r.run.check("run")?;
    let ready = match (r.ready_port, r.ready_cmd) {
        (Some(_), Some(_)) => {
            bail!("`ready_port` and `ready_cmd` are two probes: keep one")
        }
        (Some(p), None) => match p.as_integer().map(u16::try_from) {
            Some(Ok(n)) if n > 0 => Some(Ready::Port(n)),
            _ => bail!(
                "`ready_port` = {} is not a TCP port (a number from 1 to 65535)",
                p.as_integer()
                    .map(|n| n.to_string())
                    .unwrap_or_else(|| format!("a {}", p.type_str()))
            ),
        },
        (None, Some(c)) => {
            c.check("ready_cmd")?;
            Some(Ready::Cmd(c))
        }
        (None, None) => None,
    };
    let state = repo.state_dir();
    let path_or = |raw: Option<String>, default: PathBuf| match raw {
        Some(p) if p.is_empty() => bail!("a path of the service is empty"),
        Some(p) => expand_path(repo, &p),
        None => Ok(default),
    };
    let pidfile = path_or(
        r.pidfile,
        state.join("restore/services").join(format!("{name}.pid")),
    )?;
    let log = path_or(
        r.log,
        state.join("logs").join(format!("{name}.service.log")),
    )?;
    if pidfile == log {
        bail!("`pidfile` and `log` are the same file: give each its own path");
    }
    let watch = r
        .watch
        .iter()
        .map(|w| {
            if w.is_empty() {
                bail!("`watch` holds an empty path");
            }
            expand_path(repo, w)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Kind::Service(Service {
        run: r.run,
        pidfile,
        log,
        ready,
        ready_timeout: timeout(&r.ready_timeout, "ready_timeout", Duration::from_secs(10))?,
        watch,
        cwd: match r.cwd {
            Some(c) => expand_path(repo, &c)?,
            None => repo.root.clone(),
        },
        kill_grace: dur(&r.kill_grace, "kill_grace", Duration::from_secs(5))?,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exit::code_of;

    fn repo() -> Repo {
        Repo {
            root: PathBuf::from("/r"),
            git_dir: PathBuf::from("/r/.git"),
        }
    }

    fn plan(text: &str) -> Result<Plan> {
        parse(&repo(), Path::new("restore.toml"), text)
    }

    fn err(text: &str) -> String {
        let e = plan(text).unwrap_err();
        assert_eq!(code_of(&e), Code::Config, "{e:#}");
        let msg = format!("{e:#}");
        assert!(!msg.contains('\n'), "one line: {msg}");
        msg
    }

    #[test]
    fn every_kind_resolves_with_defaults() {
        let p = plan(
            &r#"
[[step]]
name = "bin"
kind = "cache"
cache = "xtask-bin"

[[step]]
name = "suites"
kind = "submodules"
paths = ["vendor/a/", "vendor/b"]
sentinel = [{ suite = "a", path = "vendor/a/run.sh", breaks = "make test-a" }]

[[step]]
name = "skills"
kind = "links"
source = "skills"
farm = ".claude/skills"
index = "skills/INDEX.md"
entries = "dirs"

[[step]]
name = "deps"
kind = "command"
run = ["npm", "ci"]
creates = "node_modules"

[[step]]
name = "tool"
kind = "download"
url = "https://example.org/tool"
sha256 = "SHA"
dest = "bin/tool"
executable = true
read_timeout = "2s"
backoff = 0

[[step]]
name = "python"
kind = "pin"
tool = "python3"
expect = '^Python 3\.1[12]'
fix = { symlink = "bin/python3", target = "/usr/bin/python3.11" }

[[step]]
name = "fresh"
kind = "freshness"
background = true
timeout = "500ms"

[[step]]
name = "lsp"
kind = "service"
run = ["lsp", "--port", "7070"]
ready_port = 7070
watch = ["bin/lsp"]
"#
            .replace("SHA", &"AB".repeat(32)),
        )
        .unwrap();
        let names: Vec<_> = p.steps.iter().map(|s| s.kind_name()).collect();
        assert_eq!(names, KINDS);
        let Kind::Submodules(s) = &p.steps[1].kind else {
            panic!()
        };
        assert_eq!(s.paths, ["vendor/a", "vendor/b"]);
        assert_eq!(s.sentinels[0].abs, Path::new("/r/vendor/a/run.sh"));
        let Kind::Download(d) = &p.steps[4].kind else {
            panic!()
        };
        assert_eq!(d.sha256, "ab".repeat(32));
        assert_eq!(d.dest, Path::new("/r/bin/tool"));
        assert_eq!(d.read_timeout, Duration::from_secs(2));
        assert_eq!(d.connect_timeout, Duration::from_secs(10));
        assert_eq!(d.backoff, Duration::ZERO);
        assert_eq!(d.retries, 3);
        let Kind::Pin(pin) = &p.steps[5].kind else {
            panic!()
        };
        assert!(pin.expect.is_match("Python 3.11.2"));
        assert_eq!(pin.args, ["--version"]);
        assert!(p.steps[6].background && p.steps[6].fail_open);
        let Kind::Freshness(f) = &p.steps[6].kind else {
            panic!()
        };
        assert_eq!(f.timeout, Duration::from_millis(500));
        assert_eq!(p.steps[2].source(&repo()), "skills -> .claude/skills");
        let d = p.steps[3].describe(&repo());
        assert_eq!(d["detail"]["creates"], "/r/node_modules");
        let Kind::Cache(c) = &p.steps[0].kind else {
            panic!()
        };
        assert_eq!((c.cache.as_str(), c.remote.as_deref()), ("xtask-bin", None));
        // No manifest under /r: the source names the file the step needs.
        assert_eq!(p.steps[0].source(&repo()), "cache-manifests/xtask-bin.toml");
    }

    #[test]
    fn cache_steps_and_package_downloads_are_checked() {
        let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\n");
        assert!(m.contains("cache"), "{m}");
        let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\ncache = \"../x\"\n");
        assert!(m.contains("must name a manifest"), "{m}");
        let m = err("[[step]]\nname = \"c\"\nkind = \"cache\"\ncache = \"gates\"\n");
        assert!(m.contains("reserved"), "{m}");
        let dl = |dest: &str, extra: &str| {
            format!(
                "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"https://e.org/p\"\nsha256 = \"{}\"\ndest = \"{dest}\"\n{extra}",
                "0".repeat(64)
            )
        };
        let m = err(&dl("dl/p.conda", "only = [\"bin/\"]\n"));
        assert!(m.contains("`only` needs `unpack_into`"), "{m}");
        let m = err(&dl("dl/p.zip", "unpack_into = \"opt\"\n"));
        assert!(m.contains("must end in .conda"), "{m}");
        let m = err(&dl(
            "dl/p.conda",
            "unpack_into = \"opt\"\nonly = [\"../bin\"]\n",
        ));
        assert!(m.contains("inside the package"), "{m}");
        let p = plan(&dl(
            "dl/p.conda",
            "unpack_into = \"opt\"\nonly = [\"bin/\"]\n",
        ))
        .unwrap();
        let Kind::Download(d) = &p.steps[0].kind else {
            panic!()
        };
        assert_eq!(d.unpack_into.as_deref(), Some(Path::new("/r/opt")));
        assert_eq!(d.only, ["bin/"]);
    }

    #[test]
    fn bad_manifests_are_refused_with_the_step_named() {
        let m = err("[[step]]\nname = \"x\"\nkind = \"teleport\"\n");
        assert!(
            m.contains("step 1 (\"x\")") && m.contains("unknown kind"),
            "{m}"
        );
        let m = err(
            "[[step]]\nname = \"x\"\nkind = \"links\"\nsource = \"a\"\nfarm = \"b\"\nfarn = 1\n",
        );
        assert!(m.contains("farn"), "{m}");
        let m = err("[[step]]\nname = \"x\"\nkind = \"command\"\nrun = \"make\"\n");
        assert!(m.contains("`creates`"), "{m}");
        let m = err("[[step]]\nname = \"bad name\"\nkind = \"command\"\n");
        assert!(m.contains("letters, digits"), "{m}");
        let m = err("[[step]]\nkind = \"command\"\n");
        assert!(m.contains("step 1: `name` is missing"), "{m}");
        let two = "[[step]]\nname = \"a\"\nkind = \"freshness\"\n";
        let m = err(&format!("{two}{two}"));
        assert!(m.contains("two steps are named \"a\""), "{m}");
        assert!(err("").contains("no steps"));
        assert!(err("[defaults]\nx = 1\n").contains("unknown top-level key `defaults`"));
        assert!(err("[[step]\n").contains("not valid TOML"));
        let m = err("[[step]]\nname = \"p\"\nkind = \"pin\"\ntool = \"x\"\nexpect = \"(\"\n");
        assert!(m.contains("not a valid pattern"), "{m}");
        let m = err(
            "[[step]]\nname = \"p\"\nkind = \"pin\"\ntool = \"x\"\nexpect = \"x\"\nfix = { symlink = \"a\" }\n",
        );
        assert!(m.contains("`fix` must be either"), "{m}");
        let m = err("[[step]]\nname = \"s\"\nkind = \"submodules\"\npaths = [\"../escape\"]\n");
        assert!(m.contains("inside the repository"), "{m}");
        let m = err("[[step]]\nname = \"f\"\nkind = \"freshness\"\ntimeout = \"soon\"\n");
        assert!(m.contains("not a duration"), "{m}");
    }

    #[test]
    fn service_steps_resolve_and_refuse_what_they_do_not_understand() {
        let svc = |extra: &str| format!("[[step]]\nname = \"lsp\"\nkind = \"service\"\n{extra}");
        let p = plan(&svc(
            "run = \"exec lsp\"\nready_cmd = \"lsp --ping\"\nwatch = [\"~/x\"]\n",
        ))
        .unwrap();
        let Kind::Service(s) = &p.steps[0].kind else {
            panic!()
        };
        assert_eq!(
            s.pidfile,
            Path::new("/r/.git/warmstart/restore/services/lsp.pid")
        );
        assert_eq!(s.log, Path::new("/r/.git/warmstart/logs/lsp.service.log"));
        assert_eq!(
            (s.ready_timeout, s.kill_grace),
            (Duration::from_secs(10), Duration::from_secs(5))
        );
        assert!(matches!(&s.ready, Some(Ready::Cmd(c)) if c.display() == "lsp --ping"));
        assert_eq!(s.cwd, Path::new("/r"));
        assert_eq!(
            p.steps[0].describe(&repo())["detail"]["ready_cmd"],
            "lsp --ping"
        );
        let m = err(&svc("run = \"x\"\nready_port = 70000\n"));
        assert!(m.contains("`ready_port` = 70000 is not a TCP port"), "{m}");
        let m = err(&svc("run = \"x\"\nready_port = 0\n"));
        assert!(m.contains("not a TCP port"), "{m}");
        let m = err(&svc("run = \"x\"\nready_port = 1\nready_cmd = \"y\"\n"));
        assert!(m.contains("keep one"), "{m}");
        let m = err(&svc("run = \"x\"\nreadiness = 1\n"));
        assert!(
            m.contains("step 1") && m.contains("unknown field `readiness`"),
            "{m}"
        );
        let m = err(&svc("run = []\n"));
        assert!(m.contains("`run` is empty"), "{m}");
        let m = err(&svc("run = \"x\"\npidfile = \"a\"\nlog = \"a\"\n"));
        assert!(m.contains("same file"), "{m}");
        let m = err(&svc("run = \"x\"\nready_timeout = \"0s\"\n"));
        assert!(m.contains("ready_timeout"), "{m}");
        let m = err(&svc("pidfile = \"a\"\n"));
        assert!(m.contains("run"), "{m}");
    }

    #[test]
    fn downloads_need_https_and_a_real_pin() {
        let step = |url: &str, sha: &str| {
            format!(
                "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"{url}\"\nsha256 = \"{sha}\"\ndest = \"bin/x\"\n"
            )
        };
        let good = "0".repeat(64);
        assert!(err(&step("http://example.org/x", &good)).contains("must be https://"));
        assert!(err(&step("ftp://example.org/x", &good)).contains("must be https://"));
        assert!(err(&step("https://example.org/x", "abc")).contains("not 64 hex digits"));
        for ok in [
            "https://example.org/x",
            "http://127.0.0.1:8080/x",
            "http://localhost/x",
            "http://[::1]:9/x",
        ] {
            plan(&step(ok, &good)).unwrap();
        }
        assert!(err(&step("http://127.0.0.1.evil.org/x", &good)).contains("https://"));
    }

    #[test]
    fn retries_unless_and_include_resolve_and_bad_values_name_their_field() {
        let cmd = |extra: &str| {
            format!(
                "[[step]]\nname = \"c\"\nkind = \"command\"\nrun = \"make\"\ncreates = \"x\"\n{extra}"
            )
        };
        let p = plan(&cmd("retries = 2\nbackoff = \"250ms\"\n")).unwrap();
        let Kind::Command(c) = &p.steps[0].kind else {
            panic!()
        };
        assert_eq!(c.retry.retries, 2);
        assert_eq!(c.retry.backoff, Duration::from_millis(250));
        let Kind::Command(c) = &plan(&cmd("")).unwrap().steps[0].kind else {
            panic!()
        };
        assert_eq!(c.retry.retries, 0, "commands are not retried by default");
        for (extra, needle) in [
            (
                "retries = -1\n",
                "`retries` = -1 is not a number of retries",
            ),
            ("retries = 1.5\n", "`retries` = 1.5"),
            ("retries = \"3\"\n", "`retries` = \"3\""),
            ("retries = true\n", "`retries` = a boolean"),
            ("retries = 11\n", "at most 10"),
            ("backoff = \"x\"\n", "backoff"),
            ("backoff = -1\n", "`backoff`"),
        ] {
            let m = err(&cmd(extra));
            assert!(
                m.contains(needle) && m.contains("step 1 (\"c\")"),
                "{extra}: {m}"
            );
        }
        let dl = |extra: &str| {
            format!(
                "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"https://e.org/p\"\nsha256 = \"{}\"\ndest = \"bin/p\"\n{extra}",
                "0".repeat(64)
            )
        };
        let p = plan(&dl("unless = [\"wasm-opt\", \"--version\"]\n")).unwrap();
        let Kind::Download(d) = &p.steps[0].kind else {
            panic!()
        };
        assert_eq!(
            d.unless.as_ref().map(Cmdline::display).as_deref(),
            Some("wasm-opt --version")
        );
        assert_eq!(d.retries, 3);
        assert!(err(&dl("unless = \"  \"\n")).contains("`unless` is empty"));
        assert!(err(&dl("unless = 5\n")).contains("`unless`"));
        assert!(err(&dl("retries = -2\n")).contains("`retries` = -2"));
        let links = |extra: &str| {
            format!(
                "[[step]]\nname = \"l\"\nkind = \"links\"\nsource = \"a\"\nfarm = \"b\"\n{extra}"
            )
        };
        let p = plan(&links("include = [\"bin/*\", \"*.sh\"]\n")).unwrap();
        let Kind::Links(l) = &p.steps[0].kind else {
            panic!()
        };
        let texts: Vec<_> = l.include.iter().map(|g| g.text.as_str()).collect();
        assert_eq!(texts, ["bin/*", "*.sh"]);
        assert_eq!(l.include[0].components.len(), 2);
        assert!(l.include[0].components[1].matches("wasm-opt"));
        for (bad, needle) in [
            ("[\"bin/[ab]\"]", "[...]"),
            ("[\"**/x\"]", "`**`"),
            ("[\"a/**\"]", "`**`"),
            ("[\"{a,b}\"]", "{a,b}"),
            ("[\"!x\"]", "negation"),
            ("[\"bin/\"]", "ends with `/`"),
            ("\"bin/*\"", "`include`"),
            ("[1]", "`include`"),
        ] {
            let m = err(&links(&format!("include = {bad}\n")));
            assert!(m.contains(needle) && m.contains("include"), "{bad}: {m}");
        }
    }
}
