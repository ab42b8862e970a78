//! `doctor`: for every host this repository's restore reaches (the git
//! remotes, the caches' remotes, restore.toml's downloads, submodules and
//! the package registries its commands use), which way it is reached
//! (directly, or through which proxy, as the real client would go), what
//! answered and with which status line, and what that means.
//!
//! The rule it serves: never conclude "unreachable" from one 403. A proxy's
//! 403 is the proxy's policy, not the host's state; a dead proxy is not a
//! dead host; a host the proxy refuses may be reachable directly.
//!
//! Probes run at once, one thread each, under the connect deadline
//! (`--connect-timeout`, as everywhere) and an overall one (`--timeout`).
//! The doctor never writes, never sends a host's credentials, and never
//! prints a URL's userinfo, a token or a proxy's password
//! (`crate::redact`).

pub mod probe;
pub mod route;

use anyhow::Result;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::cli::doctor::DoctorArgs;
use crate::exit::{Code, fail};
use crate::repo::Repo;
use probe::{Deadlines, Found};
use route::Route;

/// How a host is reached, as the report names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Transport {
    GitHttps,
    Ssh,
    Git,
    Https,
    Registry,
}

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::GitHttps => "git-https",
            Transport::Ssh => "ssh",
            Transport::Git => "git",
            Transport::Https => "https",
            Transport::Registry => "registry",
        }
    }
}

/// One host by one transport, and who needs it.
#[derive(Clone, Debug)]
struct Target {
    transport: Transport,
    /// The URL as configured (it may hold credentials: never print it raw).
    url: String,
    host: String,
    port: u16,
    used_by: Vec<String>,
}

/// The targets, one per transport and address.
#[derive(Default)]
struct Targets(BTreeMap<(Transport, String, u16), Target>);

impl Targets {
    /// Adds `url` for `who`; a local path or an unknown scheme is skipped
    /// (nothing crosses a network to reach it).
    fn add(&mut self, git: bool, url: &str, who: String) {
        let Some((scheme, host, port)) = route::address(url) else {
            return;
        };
        let transport = match (scheme.as_str(), git) {
            ("ssh", _) => Transport::Ssh,
            ("git", _) => Transport::Git,
            ("http" | "https", true) => Transport::GitHttps,
            ("http" | "https", false) => Transport::Https,
            _ => return,
        };
        self.add_as(transport, url, &host, port, who);
    }

    fn add_as(&mut self, transport: Transport, url: &str, host: &str, port: u16, who: String) {
        let t = self
            .0
            .entry((transport, host.to_string(), port))
            .or_insert_with(|| Target {
                transport,
                url: url.to_string(),
                host: host.to_string(),
                port,
                used_by: Vec::new(),
            });
        if !t.used_by.contains(&who) {
            t.used_by.push(who);
        }
    }
}

/// `git config` lines `key value` matching `pattern` in `args`' file.
fn git_config(repo: &Repo, args: &[&str]) -> Vec<(String, String)> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&repo.root)
        .arg("config")
        .args(args)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output();
    let Ok(out) = out else { return Vec::new() };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.trim().to_string()))
        .collect()
}

/// The value git's URL matching gives `key` for `url` (`Some("")` for a
/// key set empty, which for `http.proxy` means "no proxy").
fn git_urlmatch(repo: &Repo, key: &str, url: &str) -> Option<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&repo.root)
        .args(["config", "--get-urlmatch", key, url])
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Every host the plan, the caches and the downloads reach.
fn gather(sh: &xshell::Shell, repo: &Repo) -> Result<Targets> {
    let mut t = Targets::default();
    let mut remotes = BTreeMap::new();
    for (key, url) in git_config(repo, &["--get-regexp", r"^remote\..*\.url$"]) {
        let name = key
            .strip_prefix("remote.")
            .and_then(|k| k.strip_suffix(".url"))
            .unwrap_or(&key)
            .to_string();
        t.add(true, &url, format!("remote {name}"));
        remotes.insert(name, url);
    }
    let resolve = |remote: &str| -> Option<String> {
        remotes.get(remote).cloned().or_else(|| {
            crate::git::resolve_remote(sh, &repo.root, remote)
                .ok()
                .map(|r| r.url)
        })
    };
    for name in crate::cache::manifests::names(repo).unwrap_or_default() {
        if let Ok(m) = crate::cache::manifests::load(repo, &name)
            && m.registry.is_none()
            && let Some(url) = resolve(&m.remote)
        {
            t.add(true, &url, format!("cache {name}"));
        }
    }
    for (key, url) in git_config(
        repo,
        &["-f", ".gitmodules", "--get-regexp", r"^submodule\..*\.url$"],
    ) {
        let name = key
            .strip_prefix("submodule.")
            .and_then(|k| k.strip_suffix(".url"))
            .unwrap_or(&key);
        t.add(true, &url, format!("submodule {name}"));
    }
    if crate::restore::plan::path_of(repo).is_file() {
        let plan = crate::restore::plan::load(repo)?;
        plan_targets(&plan, &mut t, &resolve);
    }
    Ok(t)
}

/// The hosts restore.toml's steps name.
fn plan_targets(
    plan: &crate::restore::plan::Plan,
    t: &mut Targets,
    resolve: &dyn Fn(&str) -> Option<String>,
) {
    use crate::restore::plan::Kind;
    for step in &plan.steps {
        let who = format!("step {} ({})", step.name, step.kind_name());
        match &step.kind {
            Kind::Download(d) => t.add(false, &d.url, who),
            Kind::Cache(c) => {
                if let Some(url) = c.remote.as_deref().and_then(resolve) {
                    t.add(true, &url, who);
                }
            }
            Kind::Freshness(f) => {
                if let Some(url) = resolve(f.remote.as_deref().unwrap_or("origin")) {
                    t.add(true, &url, who);
                }
            }
            Kind::Command(c) => {
                if let Some(url) = registry_of(&c.run, &|k| std::env::var(k).ok())
                    && let Some((_, host, port)) = route::address(&url)
                {
                    t.add_as(Transport::Registry, &url, &host, port, who);
                }
            }
            _ => {}
        }
    }
}

/// The package registry a command's program talks to, when it is a known
/// package manager: its index from the environment the tool reads, else
/// the public default.
fn registry_of(
    run: &crate::restore::steps::command::Cmdline,
    env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    let (program, args) = run.program_and_args();
    let words: Vec<String> = match program.as_str() {
        "sh" => args.get(1)?.split_whitespace().map(String::from).collect(),
        _ => std::iter::once(program).chain(args).collect(),
    };
    let base = |w: &String| w.rsplit('/').next().unwrap_or(w).to_string();
    let tool = words.iter().enumerate().find_map(|(i, w)| {
        let b = base(w);
        let pip = b.starts_with("python") && words.get(i + 2).is_some_and(|m| m == "pip");
        let b = if pip { "pip".to_string() } else { b };
        matches!(
            b.as_str(),
            "pip"
                | "pip3"
                | "uv"
                | "npm"
                | "npx"
                | "pnpm"
                | "yarn"
                | "cargo"
                | "conda"
                | "mamba"
                | "micromamba"
        )
        .then_some(b)
    })?;
    let env = |k: &str| env(k).filter(|v| !v.is_empty());
    Some(match tool.as_str() {
        "pip" | "pip3" => env("PIP_INDEX_URL").unwrap_or("https://pypi.org/simple/".into()),
        "uv" => env("UV_INDEX_URL")
            .or_else(|| env("PIP_INDEX_URL"))
            .unwrap_or("https://pypi.org/simple/".into()),
        "npm" | "npx" | "pnpm" | "yarn" => {
            env("npm_config_registry").unwrap_or("https://registry.npmjs.org/".into())
        }
        "cargo" => "https://index.crates.io/config.json".into(),
        _ => "https://conda.anaconda.org/conda-forge/".into(),
    })
}

/// One row of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    host: String,
    port: u16,
    transport: &'static str,
    /// Without credentials.
    url: String,
    used_by: Vec<String>,
    /// `direct`, `proxy` or `ssh-proxy-command`.
    route: &'static str,
    proxy: Option<String>,
    proxy_from: Option<String>,
    /// The variable whose list sent the host direct past a set proxy.
    no_proxy_from: Option<String>,
    result: &'static str,
    status_line: Option<String>,
    status_from: Option<&'static str>,
    detail: Option<String>,
    reached: bool,
    meaning: String,
    duration_ms: u64,
}

/// The doctor's report.
#[derive(Debug, Serialize)]
pub struct Report {
    hosts: Vec<Row>,
    reached: usize,
    not_reached: usize,
}

pub fn run(sh: &xshell::Shell, args: &DoctorArgs) -> Result<()> {
    crate::net::set_flags(crate::net::NetworkFlags {
        connect: args.connect_timeout.clone(),
        stall: None,
    })?;
    let connect = crate::net::settings(&Default::default())?.connect;
    let total = match &args.timeout {
        Some(t) => crate::clock::parse_duration(t)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| {
                fail(
                    Code::Usage,
                    format!("--timeout {t:?} is not a duration: give e.g. 20s, 1m or 500ms"),
                )
            })?,
        None => connect + Duration::from_secs(10),
    };
    let repo = Repo::from_cwd()?;
    let targets = gather(sh, &repo)?;
    let d = Deadlines {
        connect,
        total: total.max(connect),
    };
    let rows = probe_all(&repo, &targets, d);
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !r.reached && r.result != "not-probed")
        .map(|r| format!("{}:{} {} ({})", r.host, r.port, r.transport, r.result))
        .collect();
    let report = Report {
        reached: rows.iter().filter(|r| r.reached).count(),
        not_reached: bad.len(),
        hosts: rows,
    };
    if !crate::contract::json() {
        print_table(&report);
    }
    let result = match bad.len() {
        0 => Ok(()),
        n => Err(fail(
            Code::Remote,
            format!(
                "{n} of {} host(s) not reached: {}",
                report.hosts.len(),
                bad.join(", ")
            ),
        )),
    };
    crate::contract::finish(&report, result)
}

/// Every target at once, one thread each. A thread still running past the
/// deadline (a name lookup that hangs: `getaddrinfo` takes no deadline) is
/// left behind and its row says so, so the doctor itself always ends.
fn probe_all(repo: &Repo, targets: &Targets, d: Deadlines) -> Vec<Row> {
    let (tx, rx) = std::sync::mpsc::channel();
    let all: Vec<Target> = targets.0.values().cloned().collect();
    for (i, t) in all.iter().cloned().enumerate() {
        let (tx, repo) = (tx.clone(), repo.clone());
        std::thread::spawn(move || {
            let _ = tx.send((i, examine(&repo, &t, d)));
        });
    }
    drop(tx);
    let stop = Instant::now() + d.total + Duration::from_secs(3);
    let mut rows: Vec<Option<Row>> = vec![None; all.len()];
    while rows.iter().any(Option::is_none) {
        let left = stop.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok((i, row)) => rows[i] = Some(row),
            Err(_) => break,
        }
    }
    rows.into_iter()
        .zip(&all)
        .map(|(r, t)| {
            r.unwrap_or_else(|| {
                let f = Found::timed_out(format!(
                    "the probe did not finish within {} (a name lookup that hangs?)",
                    crate::net::show(d.total)
                ));
                row(t, &Route::Direct, f, None, d.total, d)
            })
        })
        .collect()
}

/// The route, the probe and the meaning of one target.
fn examine(repo: &Repo, t: &Target, d: Deadlines) -> Row {
    let start = Instant::now();
    let env = |k: &str| std::env::var(k).ok();
    let (route, found, via) = match t.transport {
        Transport::Https | Transport::Registry => {
            let r = route::curl(&t.url, &env);
            let f = probe::http(&t.url, &r, None, d);
            (r, f, None)
        }
        Transport::GitHttps => {
            let shown = crate::redact::url(&t.url);
            let proxy = git_urlmatch(repo, "http.proxy", &shown);
            let r = route::git_http(&t.url, proxy.as_deref(), &env);
            let ca = std::env::var("GIT_SSL_CAINFO")
                .ok()
                .or_else(|| git_urlmatch(repo, "http.sslcainfo", &shown));
            let f = probe::http(&t.url, &r, ca.as_deref(), d);
            (r, f, None)
        }
        Transport::Ssh => ssh_route(t, d),
        Transport::Git => (Route::Direct, probe::tcp(&t.host, t.port, d), None),
    };
    row(t, &route, found, via, start.elapsed(), d)
}

/// ssh's own view of the host (`ssh -G`): the real address, and whether a
/// `ProxyCommand` or `ProxyJump` carries the connection instead.
fn ssh_route(t: &Target, d: Deadlines) -> (Route, Found, Option<String>) {
    let target = crate::git::ssh::target(&t.url).ok().flatten();
    let mut cmd = std::process::Command::new("ssh");
    cmd.arg("-G");
    if let Some(p) = target.as_ref().and_then(|x| x.port.clone()) {
        cmd.args(["-p", &p]);
    }
    cmd.arg(target.as_ref().map_or(t.host.clone(), |x| x.host.clone()));
    let said = crate::restore::proc::capture(&mut cmd, Some(d.total))
        .map(|(_, out, _)| out)
        .unwrap_or_default();
    let get = |k: &str| {
        said.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ').map(str::to_string))
            .filter(|v| v != "none")
    };
    if let Some(via) =
        get("proxycommand").or_else(|| get("proxyjump").map(|j| format!("ProxyJump {j}")))
    {
        let f = Found {
            result: "not-probed",
            status_line: None,
            status_from: None,
            detail: Some(format!(
                "ssh reaches it through {}",
                crate::redact::text(&via)
            )),
        };
        return (Route::Direct, f, Some(crate::redact::text(&via)));
    }
    let host = get("hostname").unwrap_or(t.host.clone());
    let port = get("port").and_then(|p| p.parse().ok()).unwrap_or(t.port);
    (Route::Direct, probe::ssh(&host, port, d), None)
}

fn row(
    t: &Target,
    route: &Route,
    f: Found,
    via: Option<String>,
    took: Duration,
    d: Deadlines,
) -> Row {
    let (route_name, proxy, proxy_from, no_proxy_from) = match (route, &via) {
        (_, Some(_)) => ("ssh-proxy-command", None, None, None),
        (Route::Proxy(p), _) => ("proxy", Some(p.shown()), Some(p.from.clone()), None),
        (Route::Exempt(v), _) => ("direct", None, None, Some(v.clone())),
        (Route::Direct, _) => ("direct", None, None, None),
    };
    Row {
        host: t.host.clone(),
        port: t.port,
        transport: t.transport.name(),
        url: crate::redact::url(&t.url),
        used_by: t.used_by.clone(),
        route: route_name,
        proxy,
        proxy_from,
        no_proxy_from,
        meaning: meaning(t, route, &f, d),
        reached: f.reached(),
        result: f.result,
        status_line: f.status_line,
        status_from: f.status_from,
        detail: f.detail,
        duration_ms: took.as_millis() as u64,
    }
}

/// What a result means, in one line that says what to do.
fn meaning(t: &Target, route: &Route, f: &Found, d: Deadlines) -> String {
    let hostport = format!("{}:{}", t.host, t.port);
    let why = f.detail.clone().unwrap_or_default();
    let proxy = route.proxy();
    match (f.result, proxy) {
        ("answered", Some(p)) => format!("reached through the proxy {}", p.shown()),
        ("answered", None) => match route {
            Route::Exempt(v) => format!("reached directly ({v} names it)"),
            _ => "reached directly".into(),
        },
        ("connected", _) => format!("a server accepts connections at {hostport}"),
        ("proxy-refused", Some(p))
            if f.status_line.as_deref().is_some_and(|l| l.contains(" 407")) =>
        {
            format!(
                "the proxy {} wants credentials: put user:password in {}",
                p.shown(),
                p.from
            )
        }
        ("proxy-refused", Some(p)) => format!(
            "the proxy {} refuses this host: ask for it to be allowed, or set NO_PROXY if it is reachable directly",
            p.shown()
        ),
        ("proxy-down", Some(p)) => p.down_line(&why),
        ("refused", _) => format!(
            "nothing accepts connections at {hostport}: the host is down or the port is wrong"
        ),
        ("timed-out", _) => format!(
            "no answer from {hostport} within {}: a firewall drops the traffic or the host is down; if this network needs a proxy, set HTTPS_PROXY",
            crate::net::show(d.connect)
        ),
        ("dns-failure", _) => format!(
            "the name {} does not resolve here: this network may reach it only through a proxy (set HTTPS_PROXY), or the name is wrong",
            t.host
        ),
        ("tls-failure", _) => format!(
            "TLS with {hostport} failed ({why}): the certificate is not trusted here (git: http.sslCAInfo), or something intercepts TLS"
        ),
        ("not-probed", _) => why,
        _ => format!("{hostport} could not be probed: {why}"),
    }
}

fn print_table(r: &Report) {
    for row in &r.hosts {
        let via = match (&row.proxy, &row.proxy_from) {
            (Some(p), Some(from)) => format!("via proxy {p} ({from})"),
            _ if row.route == "ssh-proxy-command" => "via ssh ProxyCommand".into(),
            _ => "direct".into(),
        };
        let said = match (&row.status_line, row.status_from) {
            (Some(l), Some(from)) => format!("  {l} (from the {from})"),
            _ => String::new(),
        };
        println!(
            "{}:{}  {}  {via}  {}{said}",
            row.host, row.port, row.transport, row.result
        );
        println!("    {}", row.meaning);
        println!("    used by: {}", row.used_by.join(", "));
    }
    if r.hosts.is_empty() {
        println!("no host to probe: no remote, cache, download or registry crosses a network");
    }
    println!("{} reached, {} not reached", r.reached, r.not_reached);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::restore::steps::command::Cmdline;

    #[test]
    fn package_managers_name_their_registry_and_its_variable_wins() {
        let none = |_: &str| None;
        let argv = |v: &[&str]| Cmdline::Argv(v.iter().map(|s| s.to_string()).collect());
        let sh = |s: &str| Cmdline::Shell(s.to_string());
        let of = |c: &Cmdline| registry_of(c, &none);
        assert_eq!(
            of(&argv(&["python3", "-m", "pip", "install", "x"])).as_deref(),
            Some("https://pypi.org/simple/")
        );
        assert_eq!(
            of(&sh("npm ci")).as_deref(),
            Some("https://registry.npmjs.org/")
        );
        assert_eq!(
            of(&sh("/usr/bin/cargo fetch")).as_deref(),
            Some("https://index.crates.io/config.json")
        );
        assert_eq!(of(&sh("make all")), None);
        let mirror =
            |k: &str| (k == "PIP_INDEX_URL").then(|| "https://m.example/simple".to_string());
        assert_eq!(
            registry_of(&argv(&["pip", "install"]), &mirror).as_deref(),
            Some("https://m.example/simple")
        );
    }
}
