//! Mirrors of a registry: other registries (a fleet's pull-through cache)
//! asked for a blob, by its digest, before the origin is; named by a cache
//! manifest's `[cache] mirrors` and, per machine, by
//! `WARMSTART_REGISTRY_MIRRORS` (so a fleet's mirror is not committed into
//! every repository).
//!
//! A mirror needs no trust: every blob is asked for by its sha256 and hashed
//! on arrival (`Client::get_blob`), so a mirror that serves other bytes costs
//! one warning and a refetch from the next mirror or the origin, and is not
//! asked again in that run; one that cannot be reached is given up on after
//! one connect deadline, with one warning. A mirror that lacks a blob (404)
//! is passed over for that blob alone, silently.
//!
//! This module must never resolve a tag at a mirror (a tag is a name, not
//! content: a stale or hostile mirror could answer an older key or another
//! one, so `Client::get_manifest` asks the origin alone), never publish to
//! a mirror (`Client::new`, which publish uses, has none), and never send a
//! mirror the origin's credentials: `WARMSTART_REGISTRY_TOKEN` is the
//! origin's, and a mirror gets only what docker's `config.json` holds for
//! its own host.

use anyhow::{Result, bail};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{Auth, Registry};
use crate::exit::{Code, fail};

/// The per-machine mirrors: `ORIGIN=MIRROR[,MIRROR...]` entries separated
/// by spaces.
pub const ENV: &str = "WARMSTART_REGISTRY_MIRRORS";

/// Where a mirror is: `host[:port]`, and the path its repositories sit
/// under (empty for a pull-through cache that keeps the origin's paths;
/// `ghcr-proxy` for one that serves `ghcr.io/org/repo` as
/// `mirror/ghcr-proxy/org/repo`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    pub host: String,
    pub prefix: String,
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.prefix.as_str() {
            "" => write!(f, "{}", self.host),
            p => write!(f, "{}/{p}", self.host),
        }
    }
}

impl Spec {
    /// Parses `host[:port][/prefix]`, with `Registry::parse`'s rules for
    /// the host and the path (no scheme, no credentials, no tag).
    pub fn parse(s: &str) -> Result<Spec> {
        let form = "give host[:port], or host[:port]/path for a mirror that serves the origin's repositories under a path, e.g. \"mirror.internal:5000\"";
        // Never echoed: it may be a password.
        if s.contains('@') {
            bail!(
                "has a mirror with '@' (credentials or a digest; a mirror's credentials come from docker's config.json for its host): {form}"
            );
        }
        let checked = match s.split_once('/') {
            Some(_) => s.to_string(),
            // A placeholder repository, to check the host alone.
            None => format!("{s}/x"),
        };
        match Registry::parse(&checked) {
            Ok(r) => Ok(Spec {
                host: r.host,
                prefix: if s.contains('/') {
                    r.repo
                } else {
                    String::new()
                },
            }),
            Err(e) => {
                let why = format!("{e:#}");
                let why = why
                    .strip_prefix(&format!("registry {checked:?} "))
                    .unwrap_or(&why);
                let why = why.split_once(": give ").map_or(why, |w| w.0);
                bail!("mirror {s:?} {why}: {form}")
            }
        }
    }

    /// The repository of this mirror that mirrors `origin`'s.
    pub fn for_origin(&self, origin: &Registry) -> Registry {
        Registry {
            host: self.host.clone(),
            repo: match self.prefix.as_str() {
                "" => origin.repo.clone(),
                p => format!("{p}/{}", origin.repo),
            },
        }
    }
}

/// `WARMSTART_REGISTRY_MIRRORS` parsed: for each origin host
/// (`host[:port]`), its mirrors in order.
pub fn parse_env(value: &str) -> Result<Vec<(String, Vec<Spec>)>> {
    let mut out: Vec<(String, Vec<Spec>)> = Vec::new();
    for (n, entry) in value.split_whitespace().enumerate() {
        // An entry with '@' may hold a password: named by its place only.
        let shown = match entry.contains('@') {
            true => format!("{}", n + 1),
            false => format!("{entry:?}"),
        };
        let bad = |why: &str| {
            fail(
                Code::Config,
                format!(
                    "{ENV}: entry {shown} {why}: give ORIGIN=MIRROR[,MIRROR...] entries separated by spaces, e.g. \"ghcr.io=mirror.internal:5000\""
                ),
            )
        };
        let Some((origin, mirrors)) = entry.split_once('=') else {
            return Err(bad("has no '='"));
        };
        let origin_ok = Spec::parse(origin).is_ok_and(|s| s.prefix.is_empty());
        if !origin_ok {
            return Err(bad("does not name an origin registry as host[:port]"));
        }
        if out.iter().any(|(o, _)| o == origin) {
            return Err(bad(
                "names its origin a second time (list its mirrors once)",
            ));
        }
        let mut specs = Vec::new();
        for m in mirrors.split(',') {
            if m.is_empty() {
                return Err(bad("has an empty mirror"));
            }
            let spec = Spec::parse(m).map_err(|e| {
                let why = format!("{e:#}");
                bad(why.split_once(": give ").map_or(why.as_str(), |w| w.0))
            })?;
            if spec.host == origin && spec.prefix.is_empty() {
                return Err(bad("names its origin as its own mirror"));
            }
            specs.push(spec);
        }
        out.push((origin.to_string(), specs));
    }
    Ok(out)
}

/// The startup check (`lib::run`, beside `settings::check_env`): a
/// `WARMSTART_REGISTRY_MIRRORS` that does not parse is exit 10 for every
/// command, never ignored until a registry is read.
pub fn check_env() -> Result<()> {
    match std::env::var(ENV) {
        Ok(v) => parse_env(&v).map(|_| ()),
        Err(std::env::VarError::NotPresent) => Ok(()),
        Err(std::env::VarError::NotUnicode(_)) => Err(fail(
            Code::Config,
            format!("{ENV} is not valid UTF-8: give ORIGIN=MIRROR entries"),
        )),
    }
}

/// The mirrors of `origin`, in the order they are asked: this machine's
/// (`WARMSTART_REGISTRY_MIRRORS`), then the manifest's `listed`; each once.
pub fn resolve(origin: &Registry, listed: &[Spec]) -> Result<Vec<Spec>> {
    let env = match std::env::var(ENV) {
        Ok(v) => parse_env(&v)?,
        Err(_) => Vec::new(),
    };
    Ok(ordered(origin, &env, listed))
}

fn ordered(origin: &Registry, env: &[(String, Vec<Spec>)], listed: &[Spec]) -> Vec<Spec> {
    let machine = env
        .iter()
        .filter(|(o, _)| *o == origin.host)
        .flat_map(|(_, specs)| specs.iter());
    let mut out: Vec<Spec> = Vec::new();
    for s in machine.chain(listed) {
        let is_origin = s.for_origin(origin) == *origin;
        if !is_origin && !out.contains(s) {
            out.push(s.clone());
        }
    }
    out
}

/// A mirror being asked, with what this run learnt of it.
#[derive(Clone, Debug)]
pub(super) struct Mirror {
    pub client: super::Client,
    /// Set once it failed in a way that makes it not worth asking again
    /// (unreachable, refused, wrong bytes): shared by every clone of the
    /// client, so the fetcher threads of one restore give up together.
    off: Arc<AtomicBool>,
}

impl Mirror {
    /// A mirror of `origin` at `spec`, with only the credentials docker's
    /// config.json holds for the mirror's own host.
    pub fn new(spec: &Spec, origin: &Registry, net: crate::net::NetworkSettings) -> Result<Mirror> {
        let registry = spec.for_origin(origin);
        let own = |k: &str| match k {
            super::auth::TOKEN_ENV | super::auth::USER_ENV => None,
            _ => std::env::var(k).ok(),
        };
        let auth: Auth = super::auth::find_with(&registry.host, &own)?;
        Ok(Mirror {
            client: super::Client::bare(registry, auth, net),
            off: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn is_off(&self) -> bool {
        self.off.load(Ordering::SeqCst)
    }

    /// What a failed fetch of `what` from this mirror means: a blob it lacks
    /// is asked of the next source with no word; anything else turns the
    /// mirror off for the rest of the run, with one warning (only the first
    /// fetcher to see it says so).
    pub fn failed(&self, what: &str, e: &anyhow::Error, next: &str) {
        if crate::exit::code_of(e) == Code::NotFound {
            return;
        }
        if self.off.swap(true, Ordering::SeqCst) {
            return;
        }
        let how = match crate::exit::code_of(e) {
            Code::Verify => "served wrong bytes for",
            _ => "failed on",
        };
        let line = format!(
            "warning: mirror {} {how} {what} ({e:#}): fetched from {next} instead, and the mirror is not asked again in this run",
            self.client.registry
        );
        eprintln!("{}", crate::redact::text(&line));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin() -> Registry {
        Registry::parse("ghcr.io/org/tools").unwrap()
    }

    #[test]
    fn specs_keep_the_origins_path_under_their_prefix() {
        let s = Spec::parse("mirror.internal:5000").unwrap();
        assert_eq!(
            s.for_origin(&origin()).to_string(),
            "mirror.internal:5000/org/tools"
        );
        let s = Spec::parse("harbor.internal/ghcr-proxy").unwrap();
        assert_eq!(
            s.for_origin(&origin()).to_string(),
            "harbor.internal/ghcr-proxy/org/tools"
        );
        assert_eq!(s.to_string(), "harbor.internal/ghcr-proxy");
    }

    #[test]
    fn hostile_specs_are_refused_with_the_form_to_give() {
        for bad in [
            "",
            "https://mirror",
            "u:p@mirror",
            "mirror:99999",
            "mirror/Upper",
            "mirror/x:tag",
            "mir ror",
            "mirror:",
            "/prefix",
        ] {
            let e = format!("{:#}", Spec::parse(bad).unwrap_err());
            assert!(e.contains("host[:port]"), "{bad:?}: {e}");
            assert!(!e.contains("u:p@"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_environment_maps_origins_to_mirrors_strictly() {
        let env = parse_env(" ghcr.io=a:5000,b/p  reg.example:5000=c ").unwrap();
        assert_eq!(env.len(), 2);
        assert_eq!(env[0].0, "ghcr.io");
        assert_eq!(env[0].1.len(), 2);
        assert_eq!(env[1].1[0].host, "c");
        assert!(parse_env("").unwrap().is_empty());
        for bad in [
            "ghcr.io",
            "=a",
            "ghcr.io=",
            "ghcr.io=a,,b",
            "ghcr.io/org=a",
            "ghcr.io=https://a",
            "ghcr.io=a ghcr.io=b",
            "ghcr.io=ghcr.io",
        ] {
            let e = parse_env(bad).unwrap_err();
            assert_eq!(crate::exit::code_of(&e), Code::Config, "{bad:?}");
            assert!(format!("{e:#}").contains("ORIGIN=MIRROR"), "{bad:?}: {e:#}");
        }
    }

    #[test]
    fn the_machines_mirrors_come_first_each_once_and_never_the_origin() {
        let env = parse_env("ghcr.io=m1,m2 other.io=x").unwrap();
        let listed = vec![
            Spec::parse("m2").unwrap(),
            Spec::parse("ghcr.io").unwrap(),
            Spec::parse("m3").unwrap(),
        ];
        let got: Vec<String> = ordered(&origin(), &env, &listed)
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, ["m1", "m2", "m3"]);
    }

    #[test]
    fn generated_entries_never_parse_to_a_mirror_with_credentials_or_a_scheme() {
        let mut rng = crate::test_rng::Rng(0x6d69_7272);
        let alphabet = b"ab:/@=,. -_9Z%\\";
        for _ in 0..4000 {
            let len = rng.below(24) as usize;
            let s: String = (0..len).map(|_| rng.pick(alphabet) as char).collect();
            if let Ok(env) = parse_env(&s) {
                for (o, specs) in env {
                    assert!(!o.contains('@') && !o.contains('/'), "{s:?}");
                    for m in specs {
                        let shown = m.to_string();
                        assert!(!shown.contains('@'), "{s:?}");
                        assert!(!shown.contains("://"), "{s:?}");
                        assert!(!shown.contains(' '), "{s:?}");
                    }
                }
            }
        }
    }
}
