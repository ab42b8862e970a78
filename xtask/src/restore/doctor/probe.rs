//! One probe of one host by one transport, under the connect deadline and
//! an overall one, answering what happened in words a person can act on.
//!
//! HTTP(S) goes through `curl`, the client downloads use, with the route
//! `route` chose made explicit (the proxy in its environment, or
//! `--noproxy '*'`), so what the doctor reports is the way the real
//! transfer goes. A proxy is first connected to from here, so a dead proxy
//! is told apart from a dead host; curl's `%{http_connect}` then says what
//! the proxy answered to `CONNECT`. ssh is a TCP connection to the address
//! `ssh -G` resolves, and the server's banner; `git://` a TCP connection.
//!
//! Never sends credentials of the host: the probed URL is the redacted one,
//! so neither curl's arguments nor a host's log ever see a token. The
//! proxy's own credentials go in curl's environment, never its arguments,
//! and nothing printed comes out unredacted.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::process::Command;
use std::time::Duration;

use super::route::{Proxy, Route};
use crate::restore::proc::{self, Exit};

/// What one probe found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// `answered`, `connected`, `proxy-refused`, `proxy-down`, `refused`,
    /// `timed-out`, `dns-failure`, `tls-failure`, `failed`, `not-probed`.
    pub result: &'static str,
    /// The status line that decided it (`HTTP/1.1 403 Forbidden`, an ssh banner).
    pub status_line: Option<String>,
    /// Who said `status_line`: `proxy`, `origin` (the host itself).
    pub status_from: Option<&'static str>,
    /// What the client said, redacted, when it said something.
    pub detail: Option<String>,
}

impl Found {
    fn new(result: &'static str) -> Found {
        Found {
            result,
            status_line: None,
            status_from: None,
            detail: None,
        }
    }

    fn said(mut self, line: Option<String>, from: &'static str) -> Found {
        self.status_from = line.as_ref().map(|_| from);
        self.status_line = line;
        self
    }

    fn detail(mut self, d: impl Into<String>) -> Found {
        let d = crate::redact::text(&d.into());
        self.detail = (!d.is_empty()).then_some(d);
        self
    }

    /// A probe that ran out of time, and why.
    pub fn timed_out(why: String) -> Found {
        Found::new("timed-out").detail(why)
    }

    /// The host answered (whatever it answered: a 401 or a 404 is the
    /// host's own word, so the network let us through).
    pub fn reached(&self) -> bool {
        matches!(self.result, "answered" | "connected")
    }
}

/// The deadlines of one probe.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    pub connect: Duration,
    pub total: Duration,
}

/// A TCP connection to `host:port` within `connect`, or what stopped it.
fn connect(host: &str, port: u16, connect: Duration) -> Result<TcpStream, Found> {
    let addrs: Vec<_> = match (host, port).to_socket_addrs() {
        Ok(a) => a.collect(),
        Err(e) => return Err(Found::new("dns-failure").detail(format!("{host}: {e}"))),
    };
    let mut last = Found::new("dns-failure").detail(format!("{host}: no address"));
    for a in addrs {
        match TcpStream::connect_timeout(&a, connect) {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                last = Found::new("refused").detail(format!("{a}: {e}"));
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                last = Found::new("timed-out").detail(format!(
                    "{a}: no answer within {}",
                    crate::net::show(connect)
                ));
            }
            Err(e) => last = Found::new("refused").detail(format!("{a}: {e}")),
        }
    }
    Err(last)
}

/// The proxy's own address, tried before anything is sent through it: a
/// failure here is the proxy's, whatever the host would have said.
fn proxy_alive(p: &Proxy, d: Deadlines) -> Result<(), Found> {
    connect(&p.host, p.port, d.connect).map(drop).map_err(|f| {
        let why = match f.result {
            "dns-failure" => "its name does not resolve",
            "timed-out" => "it did not accept a connection in time",
            _ => "nothing accepts connections there",
        };
        Found {
            result: "proxy-down",
            detail: Some(format!("{why} ({})", f.detail.unwrap_or_default())),
            ..Found::new("proxy-down")
        }
    })
}

/// An HTTP(S) URL by `route`, with curl; `cacert` is the CA file git
/// would trust for it, if one is set.
pub fn http(url: &str, route: &Route, cacert: Option<&str>, d: Deadlines) -> Found {
    if let Some(p) = route.proxy()
        && let Err(f) = proxy_alive(p, d)
    {
        return f;
    }
    let secs = |t: Duration| format!("{:.3}", t.as_secs_f64());
    let mut cmd = Command::new("curl");
    cmd.args([
        "--silent",
        "--show-error",
        "--head",
        "--proto",
        "=http,https",
    ])
    .args(["--connect-timeout", &secs(d.connect)])
    .args(["--max-time", &secs(d.total)])
    .args(["--output", "/dev/null", "--dump-header", "-"])
    .args(["--write-out", "\nwarmstart-connect-code:%{http_connect}\n"]);
    for v in PROXY_VARS {
        cmd.env_remove(v);
    }
    match route.proxy() {
        Some(p) => {
            cmd.env("all_proxy", &p.url);
        }
        None => {
            cmd.args(["--noproxy", "*"]);
        }
    }
    if let Some(ca) = cacert {
        cmd.arg("--cacert").arg(ca);
    }
    // The host's credentials stay out: the probe asks anonymously.
    cmd.arg("--").arg(crate::redact::url(url));
    let (exit, out, err) = match proc::capture(&mut cmd, Some(d.total + Duration::from_secs(2))) {
        Ok(r) => r,
        Err(e) => return Found::new("failed").detail(format!("running curl: {e:#}")),
    };
    let code = match exit {
        Exit::Status(s) => s.code().unwrap_or(-1),
        Exit::TimedOut(_) => 28,
    };
    classify(code, &out, &proc::last_line(&err), route.proxy().is_some())
}

/// The environment variables any client reads a proxy from.
pub const PROXY_VARS: [&str; 8] = [
    "https_proxy",
    "HTTPS_PROXY",
    "http_proxy",
    "HTTP_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
];

/// curl's exit code, its header dump and last words, as a `Found`.
fn classify(code: i32, out: &str, said: &str, proxied: bool) -> Found {
    let lines: Vec<String> = out
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("HTTP/"))
        .map(String::from)
        .collect();
    let connect_code: u32 = out
        .lines()
        .find_map(|l| l.strip_prefix("warmstart-connect-code:"))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or(0);
    if proxied && connect_code != 0 && connect_code != 200 {
        let line = lines
            .first()
            .cloned()
            .or(Some(format!("HTTP {connect_code}")));
        return Found::new("proxy-refused").said(line, "proxy").detail(said);
    }
    // A plain-http request through a proxy has no CONNECT: the proxy's own
    // refusal is told by its marks (squid's `X-Squid-Error`, a 407's
    // `Proxy-Authenticate`), else the answer is taken as the host's.
    let lower = out.to_ascii_lowercase();
    if proxied
        && connect_code == 0
        && (lower.contains("\nx-squid-error:") || lower.contains("\nproxy-authenticate:"))
    {
        return Found::new("proxy-refused")
            .said(lines.last().cloned(), "proxy")
            .detail(said);
    }
    let origin = if proxied && connect_code == 200 {
        lines.get(1).cloned()
    } else {
        lines.last().cloned()
    };
    match code {
        0 => Found::new("answered").said(origin, "origin"),
        5 => Found::new("proxy-down").detail(said),
        6 => Found::new("dns-failure").detail(said),
        7 if proxied => Found::new("proxy-down").detail(said),
        7 => Found::new("refused").detail(said),
        28 if proxied && connect_code == 0 => Found::new("proxy-down").detail(format!(
            "the proxy accepted the connection but did not answer CONNECT ({said})"
        )),
        28 => Found::new("timed-out").detail(said),
        35 | 51 | 53 | 54 | 58 | 59 | 60 | 64 | 66 | 77 | 80 | 82 | 83 | 90 | 91 => {
            Found::new("tls-failure").detail(said)
        }
        _ => Found::new("failed").detail(said),
    }
}

/// An ssh server at `host:port` (after `ssh -G`): its banner line.
pub fn ssh(host: &str, port: u16, d: Deadlines) -> Found {
    let mut s = match connect(host, port, d.connect) {
        Ok(s) => s,
        Err(f) => return f,
    };
    let _ = s.set_read_timeout(Some(d.total));
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while buf.len() < 255 {
        match s.read(&mut byte) {
            Ok(1) if byte[0] == b'\n' => break,
            Ok(1) => buf.push(byte[0]),
            Ok(_) => break,
            Err(_) if buf.is_empty() => {
                return Found::new("timed-out").detail(format!(
                    "{host}:{port} accepted the connection but sent no ssh banner within {}",
                    crate::net::show(d.total)
                ));
            }
            Err(_) => break,
        }
    }
    let line = String::from_utf8_lossy(&buf).trim().to_string();
    if line.starts_with("SSH-") {
        Found::new("answered").said(Some(crate::redact::text(&line)), "origin")
    } else {
        Found::new("failed").detail(format!("{host}:{port} answered, but not as an ssh server"))
    }
}

/// A `git daemon` at `host:port`: it says nothing until asked, so a
/// connection is all there is to see.
pub fn tcp(host: &str, port: u16, d: Deadlines) -> Found {
    match connect(host, port, d.connect) {
        Ok(_) => Found::new("connected"),
        Err(f) => f,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proxy_refusal_is_the_proxys_status_line() {
        let out = "HTTP/1.1 403 Forbidden\r\nServer: squid\r\n\r\n\nwarmstart-connect-code:403\n";
        let f = classify(
            56,
            out,
            "curl: (56) CONNECT tunnel failed, response 403",
            true,
        );
        assert_eq!(f.result, "proxy-refused");
        assert_eq!(f.status_line.as_deref(), Some("HTTP/1.1 403 Forbidden"));
        assert_eq!(f.status_from, Some("proxy"));
    }

    #[test]
    fn through_a_tunnel_the_status_is_the_origins() {
        let out = "HTTP/1.1 200 Connection established\r\n\r\nHTTP/1.1 401 Unauthorized\r\n\r\n\nwarmstart-connect-code:200\n";
        let f = classify(0, out, "", true);
        assert_eq!(f.result, "answered");
        assert_eq!(f.status_line.as_deref(), Some("HTTP/1.1 401 Unauthorized"));
        assert_eq!(f.status_from, Some("origin"));
        assert!(f.reached());
    }

    #[test]
    fn a_plain_http_refusal_is_told_by_the_proxys_marks() {
        let out = "HTTP/1.1 403 Forbidden\r\nServer: squid\r\nX-Squid-Error: ERR_ACCESS_DENIED 0\r\n\r\n\nwarmstart-connect-code:000\n";
        let f = classify(0, out, "", true);
        assert_eq!((f.result, f.status_from), ("proxy-refused", Some("proxy")));
        let out = "HTTP/1.1 403 Forbidden\r\nServer: nginx\r\n\r\n\nwarmstart-connect-code:000\n";
        assert_eq!(classify(0, out, "", true).result, "answered");
    }

    #[test]
    fn refused_is_the_proxys_when_there_is_one() {
        assert_eq!(classify(7, "", "x", true).result, "proxy-down");
        assert_eq!(classify(7, "", "x", false).result, "refused");
        assert_eq!(classify(6, "", "x", false).result, "dns-failure");
        assert_eq!(classify(60, "", "x", false).result, "tls-failure");
    }
}
