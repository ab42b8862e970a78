//! The direct reader's connection to a `git daemon` (`git://`): a TCP
//! stream on which warmstart sends git's own request line
//! (`git-upload-pack <path>`, `host=`, `version=2`) and then speaks the
//! same protocol v2 conversation as over a local `git upload-pack`, so
//! that a batch cut short over `git://` keeps every chunk that arrived
//! whole, as over smart HTTP and ssh.
//!
//! There is no child process here for the watchdog (`crate::net::Watch`)
//! to stop, so the stream bounds itself: a connect deadline, a stall
//! deadline on every read, and a look at the signal handler's flag and at
//! the fetcher's `stopped` between reads. It must never be used where git
//! would reach the server another way (`core.gitProxy`,
//! `GIT_PROXY_COMMAND`, `url.*.insteadOf`): `target` says so, and
//! `git fetch` does those.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::git::CacheGit;
use crate::net::{NetworkSettings, Verdict};

/// A `git://` server and the repository path to ask it for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Daemon {
    host: String,
    port: u16,
    path: String,
}

/// The daemon a `git://` URL names: `None` for any other URL, `Err(why)`
/// for one git reaches in a way this reader does not (a proxy command,
/// %-escapes, userinfo).
pub fn target(url: &str, git: &CacheGit) -> Option<Result<Daemon, String>> {
    let rest = url.strip_prefix("git://")?;
    Some(parse(rest).and_then(|d| {
        if std::env::var_os("GIT_PROXY_COMMAND").is_some() {
            return Err("GIT_PROXY_COMMAND is set, so git fetch reaches the git:// remote".into());
        }
        match git.config_matching(r"^core\.gitproxy$") {
            Ok(v) if v.is_empty() => Ok(d),
            Ok(_) => Err("core.gitProxy is set, so git fetch reaches the git:// remote".into()),
            Err(e) => Err(format!("git's core.gitProxy could not be read ({e:#})")),
        }
    }))
}

fn parse(rest: &str) -> Result<Daemon, String> {
    let fallback = |why: &str| Err(format!("a git:// URL with {why} goes through git fetch"));
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => return fallback("no path"),
    };
    if rest.contains('%') {
        return fallback("%-escapes");
    }
    if authority.contains('@') {
        return fallback("a user name");
    }
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        match v6.split_once(']') {
            Some((h, "")) => (h, None),
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => return fallback("an unclosed [host]"),
        }
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    let port = match port {
        None | Some("") => 9418,
        Some(p) => match p.parse() {
            Ok(p) => p,
            Err(_) => return fallback("a port that is not a number"),
        },
    };
    if host.is_empty() {
        return fallback("no host");
    }
    Ok(Daemon {
        host: host.to_string(),
        port,
        path: path.to_string(),
    })
}

impl Daemon {
    /// The request line `git fetch` sends first (pack-protocol(5)), asking
    /// for protocol v2.
    fn request_line(&self) -> Vec<u8> {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let host = if self.port == 9418 {
            host
        } else {
            format!("{host}:{}", self.port)
        };
        let body = format!("git-upload-pack {}\0host={host}\0\0version=2\0", self.path);
        let mut line = format!("{:04x}", body.len() + 4).into_bytes();
        line.extend_from_slice(body.as_bytes());
        line
    }

    /// Connects within the connect deadline and sends the request line.
    pub(super) fn connect<'a>(
        &self,
        net: NetworkSettings,
        stopped: &'a dyn Fn() -> bool,
    ) -> Result<(Link<'a>, HalfClose), super::Error> {
        let start = Instant::now();
        let addrs = (self.host.as_str(), self.port)
            .to_socket_addrs()
            .map_err(|e| failed(format!("cannot resolve {}: {e}", self.host)))?;
        let mut last = None;
        let mut stream = None;
        for a in addrs {
            let left = net.connect.saturating_sub(start.elapsed());
            if left.is_zero() {
                break;
            }
            match TcpStream::connect_timeout(&a, left) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = Some(e),
            }
        }
        let stream = match (stream, last) {
            (Some(s), _) => s,
            (None, Some(e)) if e.kind() != io::ErrorKind::TimedOut => {
                return Err(failed(format!(
                    "cannot connect to {}:{}: {e}",
                    self.host, self.port
                )));
            }
            _ => return Err(verdict_error(Verdict::Connect(net.connect))),
        };
        stream.set_read_timeout(Some(TICK))?;
        stream.set_write_timeout(Some(net.stall))?;
        let mut w = HalfClose(stream.try_clone()?);
        w.0.write_all(&self.request_line())?;
        let link = Link {
            stream,
            net,
            start,
            moved: None,
            bytes: 0,
            stopped,
            verdict: None,
        };
        Ok((link, w))
    }
}

/// How often a silent read looks at the deadlines and the stop flags.
const TICK: Duration = Duration::from_millis(100);

fn failed(msg: String) -> super::Error {
    super::Error::Failed(anyhow::anyhow!(msg))
}

pub(super) fn verdict_error(v: Verdict) -> super::Error {
    super::Error::Failed(v.error("the direct read", "the server"))
}

/// The write side of the stream: dropped, it tells the server the
/// request is complete (as closing a child's stdin does).
pub(super) struct HalfClose(TcpStream);

impl Write for HalfClose {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl Drop for HalfClose {
    fn drop(&mut self) {
        let _ = self.0.shutdown(Shutdown::Write);
    }
}

/// The read side of the stream, bounded like a watched child: nothing
/// within the connect deadline, or nothing more for the stall deadline,
/// or a signal, or the fetcher's stop, ends it with `verdict` set (or, for
/// the stop, a hang-up).
pub(super) struct Link<'a> {
    stream: TcpStream,
    net: NetworkSettings,
    start: Instant,
    moved: Option<Instant>,
    bytes: u64,
    stopped: &'a dyn Fn() -> bool,
    /// Why the read was given up, when a deadline or a signal did it.
    pub(super) verdict: Option<Verdict>,
}

impl Read for Link<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.stream.read(buf) {
                Ok(n) => {
                    self.moved = Some(Instant::now());
                    self.bytes += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    if let Some(v) = self.overdue() {
                        self.verdict = Some(v);
                        return Err(io::Error::other("the direct read was stopped"));
                    }
                    if (self.stopped)() {
                        return Err(io::Error::other("the restore stopped fetching"));
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Link<'_> {
    /// Why the read must end now, if it must.
    fn overdue(&self) -> Option<Verdict> {
        if let Some(sig) = crate::process::signals::interrupted() {
            return Some(Verdict::Interrupted(sig));
        }
        match self.moved {
            None if self.start.elapsed() >= self.net.connect => {
                Some(Verdict::Connect(self.net.connect))
            }
            Some(t) if t.elapsed() >= self.net.stall => Some(Verdict::Stall {
                after: self.net.stall,
                bytes: self.bytes,
                last: None,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_urls_parse_into_host_port_and_path() {
        let d = parse("127.0.0.1:9999/origin.git").unwrap();
        assert_eq!(
            (d.host.as_str(), d.port, d.path.as_str()),
            ("127.0.0.1", 9999, "/origin.git")
        );
        assert_eq!(
            d.request_line(),
            b"003fgit-upload-pack /origin.git\0host=127.0.0.1:9999\0\0version=2\0"
        );
        let d = parse("example.org/~me/x.git").unwrap();
        assert_eq!((d.port, d.path.as_str()), (9418, "/~me/x.git"));
        let d = parse("[::1]:1234/r").unwrap();
        assert_eq!((d.host.as_str(), d.port), ("::1", 1234));
        for bad in [
            "host",
            "u@host/r",
            "host:x/r",
            "host/a%20b",
            ":1/r",
            "[::1/r",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
