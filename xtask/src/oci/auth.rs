//! The credentials sent to a registry, found the way the ecosystem keeps
//! them: `WARMSTART_REGISTRY_TOKEN` (with `WARMSTART_REGISTRY_USER`, basic
//! auth; alone, a bearer token), else the `auths.<host>.auth` of docker's
//! `config.json` (`$DOCKER_CONFIG/config.json`, else
//! `~/.docker/config.json`), else none.
//!
//! Credentials only ever go into curl's config on its standard input
//! (`curl_config`); `Debug` and `source` never show them. Docker's
//! credential helpers (`credsStore`, `credHelpers`) are not run yet: a
//! host that only a helper knows is reached without credentials, and a
//! refusal then says so.

use anyhow::{Context, Result};
use std::path::PathBuf;

use crate::exit::{Code, fail};

pub const TOKEN_ENV: &str = "WARMSTART_REGISTRY_TOKEN";
pub const USER_ENV: &str = "WARMSTART_REGISTRY_USER";

#[derive(Clone)]
enum Secret {
    None,
    /// `user:password`, which curl encodes.
    UserPassword(String),
    /// base64 of `user:password`, as docker's config.json keeps it.
    Basic(String),
    Bearer(String),
}

/// Credentials for one registry host, and where they came from.
#[derive(Clone)]
pub struct Auth {
    secret: Secret,
    source: String,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Auth({})", self.source)
    }
}

impl Auth {
    /// Where the credentials came from, as a refusal names it.
    pub fn source(&self) -> String {
        self.source.clone()
    }

    /// The lines of curl's config that send them.
    pub(super) fn curl_config(&self) -> Result<Vec<String>> {
        let q = super::curl_quoted;
        Ok(match &self.secret {
            Secret::None => Vec::new(),
            Secret::UserPassword(up) => vec![format!("user = {}", q(up)?)],
            Secret::Basic(b) => vec![format!(
                "header = {}",
                q(&format!("Authorization: Basic {b}"))?
            )],
            Secret::Bearer(t) => vec![format!(
                "header = {}",
                q(&format!("Authorization: Bearer {t}"))?
            )],
        })
    }
}

/// The credentials for `host` (`host[:port]`), from the environment
/// `env` and docker's config file.
pub fn find(host: &str) -> Result<Auth> {
    find_with(host, &|k| std::env::var(k).ok())
}

/// `find`, reading the environment through `env`.
pub fn find_with(host: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Auth> {
    if let Some(token) = env(TOKEN_ENV).filter(|t| !t.is_empty()) {
        return Ok(match env(USER_ENV).filter(|u| !u.is_empty()) {
            Some(user) => Auth {
                secret: Secret::UserPassword(format!("{user}:{token}")),
                source: format!("basic auth as {user} from {USER_ENV} and {TOKEN_ENV}"),
            },
            None => Auth {
                secret: Secret::Bearer(token),
                source: format!("a bearer token from {TOKEN_ENV}"),
            },
        });
    }
    let file = match env("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("config.json"),
        None => match env("HOME").filter(|h| !h.is_empty()) {
            Some(home) => PathBuf::from(home).join(".docker/config.json"),
            None => return Ok(none("no credentials: HOME is not set")),
        },
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(none(&format!(
                "no credentials: neither {TOKEN_ENV} nor {} is set",
                file.display()
            )));
        }
        Err(e) => return Err(anyhow::Error::new(e).context(format!("reading {}", file.display()))),
    };
    from_docker_config(host, &text)
        .map_err(|e| fail(Code::Config, format!("{}: {e:#}", file.display())))
        .map(|a| Auth {
            source: format!("{} of {}", a.source, file.display()),
            ..a
        })
}

fn none(source: &str) -> Auth {
    Auth {
        secret: Secret::None,
        source: source.to_string(),
    }
}

/// The `auths` entry of docker's config for `host`: its key is the host
/// (`host:port`), or a URL of it (`https://host/v1/` as old clients wrote).
fn from_docker_config(host: &str, text: &str) -> Result<Auth> {
    let v: serde_json::Value =
        serde_json::from_str(text).context("docker's config.json is not JSON")?;
    let key_host = |k: &str| {
        let k = k
            .strip_prefix("https://")
            .or_else(|| k.strip_prefix("http://"))
            .unwrap_or(k);
        k.split('/').next().unwrap_or("").to_string()
    };
    if let Some(auths) = v.get("auths").and_then(|a| a.as_object()) {
        for (k, entry) in auths {
            if key_host(k) != host {
                continue;
            }
            let Some(auth) = entry.get("auth").and_then(|a| a.as_str()) else {
                continue;
            };
            let auth = auth.trim();
            if auth.is_empty()
                || !auth
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+/=".contains(&b))
            {
                anyhow::bail!("auths.\"{k}\".auth is not base64");
            }
            return Ok(Auth {
                secret: Secret::Basic(auth.to_string()),
                source: format!("basic auth from auths.\"{k}\""),
            });
        }
    }
    let helper = v
        .get("credHelpers")
        .and_then(|h| h.get(host))
        .or_else(|| v.get("credsStore"))
        .and_then(|h| h.as_str());
    Ok(match helper {
        Some(h) => none(&format!(
            "no credentials: docker's credential helper {h:?} is not run by warmstart yet (set {TOKEN_ENV})"
        )),
        None => none(&format!("no credentials for {host} in auths")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(a: &Auth) -> Vec<String> {
        a.curl_config().unwrap()
    }

    #[test]
    fn the_environment_wins_and_picks_basic_or_bearer() {
        let env = |k: &str| match k {
            TOKEN_ENV => Some("t0k\"en".to_string()),
            USER_ENV => Some("ci".to_string()),
            _ => None,
        };
        let a = find_with("r.example:5000", &env).unwrap();
        assert_eq!(lines(&a), vec![r#"user = "ci:t0k\"en""#.to_string()]);
        assert!(!format!("{a:?}").contains("t0k"), "{a:?}");
        let env = |k: &str| (k == TOKEN_ENV).then(|| "abc".to_string());
        let a = find_with("r.example", &env).unwrap();
        assert_eq!(
            lines(&a),
            vec![r#"header = "Authorization: Bearer abc""#.to_string()]
        );
    }

    #[test]
    fn docker_config_entries_match_by_host_and_port() {
        let text = r#"{"auths": {"https://other:5000/v1/": {"auth": "eDp5"},
                                  "r.example:5000": {"auth": "YTpi"}}}"#;
        let a = from_docker_config("r.example:5000", text).unwrap();
        assert_eq!(
            lines(&a),
            vec![r#"header = "Authorization: Basic YTpi""#.to_string()]
        );
        let a = from_docker_config("other:5000", text).unwrap();
        assert_eq!(
            lines(&a),
            vec![r#"header = "Authorization: Basic eDp5""#.to_string()]
        );
        let a = from_docker_config("r.example", text).unwrap();
        assert!(lines(&a).is_empty());
        let a = from_docker_config("r.example", r#"{"credsStore": "desktop"}"#).unwrap();
        assert!(lines(&a).is_empty());
        assert!(a.source().contains("desktop"), "{}", a.source());
        assert!(from_docker_config("r", r#"{"auths": {"r": {"auth": "a\nb"}}}"#).is_err());
        assert!(from_docker_config("r", "not json").is_err());
    }
}
