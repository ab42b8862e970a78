//! One request to a registry through `curl`: credentials and URL on its
//! standard input (never argv), its own process group that dies with
//! warmstart and that SIGTERM or Ctrl-C ends, curl's own deadlines set
//! from `crate::net`, and its failures turned into exit codes.

use anyhow::{Context, Result};
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::Client;
use crate::exit::{Code, fail};
use crate::net::Verdict;

/// What curl writes on stdout once the transfer is over, one value a
/// line: status, bytes received, and the headers the API needs.
const WRITE_OUT: &str =
    "%{http_code}\\n%{size_download}\\n%header{content-length}\\n%header{location}\\n";

/// A request being built.
pub(super) struct Call<'a> {
    client: &'a Client,
    method: &'static str,
    url: String,
    headers: Vec<String>,
    output: Option<PathBuf>,
    upload: Option<PathBuf>,
    follow: bool,
    /// Ask for the body from this byte on (`Range`), appended to `output`.
    continue_at: Option<u64>,
    /// Told curl's process group while it runs, `None` after.
    track: Option<&'a mut dyn FnMut(Option<u32>)>,
}

/// The registry's answer.
#[derive(Debug)]
pub(super) struct Reply {
    pub status: u32,
    pub content_length: Option<u64>,
    pub location: Option<String>,
    /// Where `Reply::failure` says the answer came from.
    pub registry: String,
    pub host: String,
    /// Where the credentials sent came from (`auth::Auth::source`).
    pub auth_source: String,
    /// The body of an error answer, when small.
    body: Vec<u8>,
}

impl Reply {
    pub fn with_body(mut self, body: Vec<u8>) -> Reply {
        self.body = body;
        self
    }

    /// ` (CODE: message)` from the registry's JSON error body, if any.
    pub fn said(&self) -> String {
        let v: serde_json::Value = match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(_) => return String::new(),
        };
        let first = &v["errors"][0];
        match (first["code"].as_str(), first["message"].as_str()) {
            (Some(c), Some(m)) => format!(" ({c}: {m})"),
            (Some(c), None) => format!(" ({c})"),
            _ => String::new(),
        }
    }
}

/// A value in curl's config syntax: double-quoted, `\` and `"` escaped.
/// Control characters cannot be in one (they would end the line).
pub(super) fn quoted(v: &str) -> Result<String> {
    if v.chars().any(char::is_control) {
        anyhow::bail!("a value for curl holds a control character");
    }
    Ok(format!(
        "\"{}\"",
        v.replace('\\', "\\\\").replace('"', "\\\"")
    ))
}

fn secs(d: std::time::Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

impl<'a> Call<'a> {
    pub fn new(client: &'a Client, method: &'static str, url: String) -> Call<'a> {
        Call {
            client,
            method,
            url,
            headers: Vec::new(),
            output: None,
            upload: None,
            follow: false,
            continue_at: None,
            track: None,
        }
    }

    /// `track` is told curl's process group once it runs, and `None` once
    /// it exited (`prefetch` stops the transfers of a restore that failed).
    pub fn track(mut self, track: &'a mut dyn FnMut(Option<u32>)) -> Self {
        self.track = Some(track);
        self
    }

    pub fn header(mut self, h: &str) -> Self {
        self.headers.push(h.to_string());
        self
    }

    /// The body goes to `path` (else it is dropped).
    pub fn output(mut self, path: &Path) -> Self {
        self.output = Some(path.to_path_buf());
        self
    }

    /// The request's body is the file at `path`.
    pub fn upload(mut self, path: &Path) -> Self {
        self.upload = Some(path.to_path_buf());
        self
    }

    /// Follow redirects (a blob served from object storage), over https
    /// only; curl sends credentials to the registry's host alone.
    pub fn follow(mut self) -> Self {
        self.follow = true;
        self
    }

    /// Resume a cut body: ask for it from byte `at` on (an HTTP Range),
    /// appending to the `output` file, which holds the first `at` bytes.
    pub fn continue_at(mut self, at: u64) -> Self {
        self.continue_at = Some(at);
        self
    }

    /// The config curl reads on stdin: the URL, the headers, the
    /// credentials.
    fn config(&self) -> Result<String> {
        let mut c = format!("url = {}\n", quoted(&self.url)?);
        for h in &self.headers {
            c.push_str(&format!("header = {}\n", quoted(h)?));
        }
        for line in self.client.auth.curl_config()? {
            c.push_str(&line);
            c.push('\n');
        }
        Ok(c)
    }

    /// Runs the request. `Err` is a transfer that failed (exit 8, 13 or
    /// 1); an HTTP status, whatever it is, is an `Ok` for the caller to
    /// judge.
    pub fn run(self) -> Result<Reply> {
        self.run_with_exit().0
    }

    /// `run`, with curl's exit status beside it (`is_cut` tells a
    /// connection cut mid-body, which a Range can resume).
    pub fn run_with_exit(mut self) -> (Result<Reply>, Option<i32>) {
        let mut exit = None;
        let r = self.run_inner(&mut exit);
        (r, exit)
    }

    fn run_inner(&mut self, exit: &mut Option<i32>) -> Result<Reply> {
        let net = self.client.net;
        let mut cmd = self.command();
        let output = self.output.clone();
        crate::process::group::die_with_parent(&mut cmd);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .context("running curl (the registry backend needs it: `apt-get install curl`)")?;
        // SIGTERM or Ctrl-C to warmstart ends curl too.
        let _group = crate::process::signals::register_group(child.id());
        let _partial = output
            .as_deref()
            .map(crate::process::signals::register_temp);
        let config = self.config()?;
        {
            let mut stdin = child.stdin.take().expect("piped");
            // A curl that died at once closed its end: its exit says why.
            let _ = stdin.write_all(config.as_bytes());
        }
        if let Some(t) = self.track.as_mut() {
            t(Some(child.id()));
        }
        let out = child.wait_with_output().context("waiting for curl");
        if let Some(t) = self.track.as_mut() {
            t(None);
        }
        let out = out?;
        *exit = out.status.code();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = crate::redact::text(String::from_utf8_lossy(&out.stderr).trim());
        let mut lines = stdout.split('\n');
        let status: u32 = lines.next().unwrap_or("").trim().parse().unwrap_or(0);
        let received: u64 = lines.next().unwrap_or("").trim().parse().unwrap_or(0);
        let content_length = lines.next().and_then(|l| l.trim().parse().ok());
        let location = lines
            .next()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string);
        let registry = self.client.registry.to_string();
        if let Some(e) = self.transfer_failed(out.status.code(), received, &stderr, net) {
            return Err(e);
        }
        // An error's body is the registry's words on it.
        let body = match (&output, status >= 400) {
            (Some(p), true) if received <= 64 << 10 => std::fs::read(p).unwrap_or_default(),
            _ => Vec::new(),
        };
        Ok(Reply {
            status,
            content_length,
            location,
            registry,
            host: self.client.registry.host.clone(),
            auth_source: self.client.auth.source(),
            body,
        })
    }

    /// curl's exit `code` as warmstart's failure: exit 8 for a deadline
    /// (curl's 28, worded as `net` words a watchdog's stop) or a host not
    /// reached, 13 for a certificate refused, 1 for the rest; `None` when
    /// curl succeeded (whatever the HTTP status).
    fn transfer_failed(
        &self,
        code: Option<i32>,
        received: u64,
        stderr: &str,
        net: crate::net::NetworkSettings,
    ) -> Option<anyhow::Error> {
        let registry = &self.client.registry;
        let what = format!("{} {}", self.method, crate::redact::url(&self.url));
        Some(match code {
            Some(0) => return None,
            Some(28) => {
                let shown = format!("registry {registry}");
                let verdict = if received == 0 && stderr.to_ascii_lowercase().contains("connect") {
                    Verdict::Connect(net.connect)
                } else {
                    Verdict::Stall {
                        after: net.stall,
                        bytes: received,
                        last: None,
                    }
                };
                verdict.error(&what, &shown)
            }
            Some(c @ (51 | 58 | 59 | 60 | 77 | 83 | 90 | 91)) => fail(
                Code::AuthRefused,
                format!(
                    "{what}: the certificate of registry {registry} was refused (curl exit {c}: {stderr}); trust its CA with CURL_CA_BUNDLE or the system's store"
                ),
            ),
            Some(c @ (5 | 6 | 7 | 16 | 18 | 35 | 52 | 55 | 56 | 92 | 95)) => fail(
                Code::Remote,
                format!("{what}: cannot reach registry {registry} (curl exit {c}: {stderr})"),
            ),
            Some(c) => fail(
                Code::Failed,
                format!("{what} at registry {registry}: curl exit {c}: {stderr}"),
            ),
            None => fail(
                Code::Remote,
                format!("{what} at registry {registry}: curl was stopped by a signal"),
            ),
        })
    }

    /// curl's argv: no URL and no credential (those go on stdin).
    fn command(&self) -> Command {
        let net = self.client.net;
        let mut cmd = Command::new("curl");
        cmd.args(["--silent", "--show-error", "--no-progress-meter"])
            .args(["--proto", "=https", "--proto-redir", "=https"])
            .args(["--connect-timeout", &secs(net.connect)])
            .args(["--speed-limit", "1", "--speed-time"])
            .arg(net.stall.as_secs().max(1).to_string())
            .args(["--write-out", WRITE_OUT])
            .args(["--config", "-"]);
        match self.method {
            "HEAD" => {
                cmd.arg("--head");
            }
            "GET" => {}
            "PUT" => {}
            m => {
                cmd.args(["--request", m]);
            }
        }
        if self.method == "POST" && self.upload.is_none() {
            cmd.args(["--data-binary", ""]);
        }
        if self.follow {
            cmd.arg("--location");
        }
        if let Some(at) = self.continue_at {
            cmd.args(["--continue-at", &at.to_string()]);
        }
        match &self.upload {
            Some(p) => {
                cmd.arg("--upload-file").arg(p);
            }
            None if self.method == "PUT" => {
                cmd.args(["--request", "PUT"]);
            }
            None => {}
        }
        let body_file = self
            .output
            .clone()
            .unwrap_or_else(|| PathBuf::from("/dev/null"));
        cmd.arg("--output").arg(&body_file);
        cmd
    }
}

/// Whether curl's exit `code` is a connection that ended before the body
/// did (a reset, a close, a short body, a broken HTTP/2 stream): what a
/// Range request can resume. A stall (28) is not: the deadline spoke.
pub(super) fn is_cut(code: i32) -> bool {
    matches!(code, 16 | 18 | 52 | 55 | 56 | 92)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_values_are_quoted_and_control_characters_refused() {
        assert_eq!(quoted(r#"a"b\c"#).unwrap(), r#""a\"b\\c""#);
        assert!(quoted("a\nurl = x").is_err());
        assert!(quoted("a\rb").is_err());
    }
}
