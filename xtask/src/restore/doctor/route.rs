//! Which way a client reaches a URL: directly, or through which proxy, by
//! the rules the real client follows, so that `doctor` probes the route a
//! download or a fetch really takes and a failed download can name its proxy.
//!
//! curl (downloads, package registries): `https_proxy`, then `HTTPS_PROXY`
//! for https URLs, only the lower-case `http_proxy` for http ones (curl
//! ignores `HTTP_PROXY` on purpose), then `all_proxy`, `ALL_PROXY`; a host
//! that `no_proxy` (else `NO_PROXY`) names goes direct. git over HTTPS:
//! `http.proxy` (the URL-matched value, an empty one meaning "no proxy")
//! beats the environment, where the lower-case name wins over the upper-case
//! one and `all_proxy` comes last; `NO_PROXY` applies as for curl. ssh has
//! no proxy but its own `ProxyCommand`, which `probe` reads from `ssh -G`.
//!
//! This module never touches the network, the file system or the process
//! environment: the environment and git's config value are passed in, so
//! its rules are tested as data.

/// A proxy a client would use: its URL as configured (it may hold
/// credentials: print only `shown`), where it was set, and its address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Proxy {
    /// With a scheme (`http://` when none was given, as curl reads it).
    pub url: String,
    /// The variable or git setting it came from (`HTTPS_PROXY`, `http.proxy`).
    pub from: String,
    pub host: String,
    pub port: u16,
}

impl Proxy {
    /// The URL as it may be printed: no userinfo, no secret parameter.
    pub fn shown(&self) -> String {
        crate::redact::url(&self.url)
    }

    /// The one line that says what a dead proxy means and what to do, for
    /// the doctor and for a download that failed through it.
    pub fn down_line(&self, why: &str) -> String {
        format!(
            "the proxy {} (from {}) is down: {}; start it, fix {}, or add the host to NO_PROXY if it is reachable directly",
            self.shown(),
            self.from,
            crate::redact::text(why),
            self.from
        )
    }
}

/// The scheme, host and port a URL names (`None` for a path or a
/// scheme this module does not know the default port of). An scp-like
/// `user@host:path` is ssh on port 22.
pub fn address(url: &str) -> Option<(String, String, u16)> {
    let Some((scheme, rest)) = url.split_once("://") else {
        let (host, _) = url.split_once(':')?;
        if host.contains('/') || host.is_empty() {
            return None;
        }
        let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
        return Some(("ssh".into(), host.to_ascii_lowercase(), 22));
    };
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "https" => 443,
        "http" => 80,
        "ssh" | "git+ssh" | "ssh+git" => 22,
        "git" => 9418,
        "socks5" | "socks5h" | "socks4" | "socks4a" | "socks" => 1080,
        _ => return None,
    };
    let (host, port) = host_and_port(rest)?;
    let port = match port {
        Some(p) if !p.is_empty() => p.parse().ok()?,
        _ => default,
    };
    let scheme = if scheme.contains("ssh") {
        "ssh".into()
    } else {
        scheme
    };
    Some((scheme, host.to_ascii_lowercase(), port))
}

/// The host (brackets of an IPv6 address taken off) and the port as
/// written, if any, of what follows a URL's `://`: its authority without the
/// userinfo. `None` when it names no host.
fn host_and_port(rest: &str) -> Option<(&str, Option<&str>)> {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match hostport.strip_prefix('[') {
        Some(v6) => {
            let (h, after) = v6.split_once(']')?;
            (h, after.strip_prefix(':'))
        }
        None => match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        },
    };
    (!host.is_empty()).then_some((host, port))
}

/// A proxy setting's value as the client reads it; `None` when it names no
/// usable address. Like curl, a value without a scheme is `http://`, and
/// the default port of a proxy is 1080 (443 for an `https://` proxy).
fn proxy_of(value: &str, from: &str) -> Option<Proxy> {
    let value = value.trim();
    if value.is_empty() {
        return None;
    }
    let url = if value.contains("://") {
        value.to_string()
    } else {
        format!("http://{value}")
    };
    let (scheme, rest) = url.split_once("://")?;
    let (host, port) = host_and_port(rest)?;
    let port = match port {
        Some(p) => p.parse().ok()?,
        None if scheme.eq_ignore_ascii_case("https") => 443,
        None => 1080,
    };
    let host = host.to_ascii_lowercase();
    Some(Proxy {
        url,
        from: from.to_string(),
        host,
        port,
    })
}

/// The first variable of `names` that is set and not empty.
fn first_set(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<(String, String)> {
    names.iter().find_map(|n| {
        env(n)
            .filter(|v| !v.trim().is_empty())
            .map(|v| (n.to_string(), v))
    })
}

/// Whether `no_proxy` (curl's rules) sends `host` direct: `*` alone means
/// every host; otherwise a comma- or space-separated list of names, each
/// matching the host itself and every name below it (a leading `.` is
/// optional), or of IP addresses, which match only themselves.
pub fn no_proxy_matches(no_proxy: &str, host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if no_proxy.trim() == "*" {
        return true;
    }
    no_proxy
        .split([',', ' ', '\t'])
        .map(|t| t.trim().trim_start_matches('.').to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .any(|t| {
            let t = t.trim_start_matches('[').trim_end_matches(']');
            host == t
                || (host.parse::<std::net::IpAddr>().is_err()
                    && host.ends_with(t)
                    && host[..host.len() - t.len()].ends_with('.'))
        })
}

/// The no-proxy list a client reads, and where it came from.
fn no_proxy(env: &dyn Fn(&str) -> Option<String>) -> Option<(String, String)> {
    first_set(env, &["no_proxy", "NO_PROXY"])
}

/// Why a URL goes direct although a proxy is set (`no_proxy`), or the proxy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    Direct,
    /// A proxy was set, and this variable's list names the host.
    Exempt(String),
    Proxy(Proxy),
}

impl Route {
    pub fn proxy(&self) -> Option<&Proxy> {
        match self {
            Route::Proxy(p) => Some(p),
            _ => None,
        }
    }
}

fn exempt_or(proxy: Option<Proxy>, host: &str, env: &dyn Fn(&str) -> Option<String>) -> Route {
    let Some(proxy) = proxy else {
        return Route::Direct;
    };
    match no_proxy(env) {
        Some((var, list)) if no_proxy_matches(&list, host) => Route::Exempt(var),
        _ => Route::Proxy(proxy),
    }
}

/// The route curl takes to `url` under `env`.
pub fn curl(url: &str, env: &dyn Fn(&str) -> Option<String>) -> Route {
    let Some((scheme, host, _)) = address(url) else {
        return Route::Direct;
    };
    let names: &[&str] = match scheme.as_str() {
        "https" => &["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"],
        "http" => &["http_proxy", "all_proxy", "ALL_PROXY"],
        _ => return Route::Direct,
    };
    let proxy = first_set(env, names).and_then(|(n, v)| proxy_of(&v, &n));
    exempt_or(proxy, &host, env)
}

/// The route git's HTTP transport takes to `url`: `config` is the
/// `http.proxy` value git's URL matching gives for it, if one is set.
pub fn git_http(url: &str, config: Option<&str>, env: &dyn Fn(&str) -> Option<String>) -> Route {
    let Some((scheme, host, _)) = address(url) else {
        return Route::Direct;
    };
    let proxy = match config {
        // An empty http.proxy turns the proxy off, whatever the environment.
        Some(v) if v.trim().is_empty() => return Route::Direct,
        Some(v) => proxy_of(v, "http.proxy"),
        None => {
            let per_scheme: &[&str] = if scheme == "https" {
                &["https_proxy", "HTTPS_PROXY"]
            } else {
                &["http_proxy"]
            };
            first_set(env, per_scheme)
                .or_else(|| first_set(env, &["all_proxy", "ALL_PROXY"]))
                .and_then(|(n, v)| proxy_of(&v, &n))
        }
    };
    exempt_or(proxy, &host, env)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn via(r: &Route) -> Option<(String, String, u16)> {
        r.proxy().map(|p| (p.from.clone(), p.host.clone(), p.port))
    }

    #[test]
    fn addresses_of_every_url_form() {
        let a = |u: &str| address(u);
        assert_eq!(
            a("https://h.example/x"),
            Some(("https".into(), "h.example".into(), 443))
        );
        assert_eq!(
            a("https://u:p@H.example:8443/x"),
            Some(("https".into(), "h.example".into(), 8443))
        );
        assert_eq!(
            a("git@github.com:o/r.git"),
            Some(("ssh".into(), "github.com".into(), 22))
        );
        assert_eq!(
            a("ssh://git@h:2222/r"),
            Some(("ssh".into(), "h".into(), 2222))
        );
        assert_eq!(a("git://h/r"), Some(("git".into(), "h".into(), 9418)));
        assert_eq!(
            a("https://[::1]:9/x"),
            Some(("https".into(), "::1".into(), 9))
        );
        assert_eq!(a("/srv/git/r.git"), None);
        assert_eq!(a("../r.git"), None);
        assert_eq!(a("file:///srv/r.git"), None);
    }

    #[test]
    fn curl_reads_lower_case_first_and_never_upper_case_http_proxy() {
        let e = env(&[("HTTPS_PROXY", "http://a:1"), ("https_proxy", "b:2")]);
        assert_eq!(
            via(&curl("https://h/x", &e)),
            Some(("https_proxy".into(), "b".into(), 2))
        );
        let e = env(&[("HTTP_PROXY", "http://a:1")]);
        assert_eq!(curl("http://h/x", &e), Route::Direct);
        let e = env(&[("ALL_PROXY", "http://a")]);
        assert_eq!(
            via(&curl("https://h/x", &e)),
            Some(("ALL_PROXY".into(), "a".into(), 1080))
        );
        let e = env(&[("https_proxy", "https://p")]);
        assert_eq!(via(&curl("https://h/x", &e)).unwrap().2, 443);
    }

    #[test]
    fn no_proxy_sends_named_hosts_and_their_subdomains_direct() {
        let e = env(&[
            ("https_proxy", "http://p:3128"),
            ("NO_PROXY", "example.com, .corp,127.0.0.1"),
        ]);
        assert_eq!(
            curl("https://example.com/x", &e),
            Route::Exempt("NO_PROXY".into())
        );
        assert_eq!(
            curl("https://a.example.com/x", &e),
            Route::Exempt("NO_PROXY".into())
        );
        assert_eq!(
            curl("https://x.corp/x", &e),
            Route::Exempt("NO_PROXY".into())
        );
        assert_eq!(
            curl("https://127.0.0.1:9/x", &e),
            Route::Exempt("NO_PROXY".into())
        );
        assert!(curl("https://badexample.com/x", &e).proxy().is_some());
        assert!(curl("https://127.0.0.2/x", &e).proxy().is_some());
        assert!(no_proxy_matches("*", "anything"));
    }

    #[test]
    fn git_config_beats_the_environment_and_empty_turns_it_off() {
        let e = env(&[("https_proxy", "http://env:1")]);
        assert_eq!(
            via(&git_http("https://h/r", Some("http://cfg:2"), &e)),
            Some(("http.proxy".into(), "cfg".into(), 2))
        );
        assert_eq!(git_http("https://h/r", Some(""), &e), Route::Direct);
        // git, unlike curl, reads HTTPS_PROXY and lets the lower case win.
        let e = env(&[
            ("HTTPS_PROXY", "http://up:1"),
            ("https_proxy", "http://low:2"),
        ]);
        assert_eq!(via(&git_http("https://h/r", None, &e)).unwrap().1, "low");
    }
}
