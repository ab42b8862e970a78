//! A real smart-HTTP git server on 127.0.0.1: a small HTTP/1.1 front that runs `git http-backend` as CGI.
//!
//! Each request is parsed (request line, headers, a body sent with
//! Content-Length or chunked transfer encoding), handed to `git http-backend`
//! with the CGI variables it reads, and its output is sent back with
//! `Connection: close`. Push works because the served repositories get
//! `http.receivepack true`; every repository under the base is exported.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;

/// A running server; stopped when dropped.
pub struct HttpGit {
    pub port: u16,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    /// Requests served so far (to prove traffic went through HTTP).
    pub requests: Arc<AtomicUsize>,
}

impl HttpGit {
    /// Serves every bare repository under `base`, read and push.
    pub fn start(base: &Path) -> HttpGit {
        HttpGit::start_with_auth(base, None)
    }

    /// As `start`, but every request must carry `Authorization: Basic
    /// <base64 of basic>` (`user:password`); others get a 401 challenge,
    /// as a hosting server answers, so git asks its credential helpers.
    pub fn start_with_auth(base: &Path, basic: Option<&str>) -> HttpGit {
        let auth = basic.map(|b| format!("Basic {}", base64(b.as_bytes())));
        for entry in std::fs::read_dir(base).unwrap() {
            let path = entry.unwrap().path();
            if path.join("HEAD").is_file() {
                let ok = Command::new("git")
                    .arg("--git-dir")
                    .arg(&path)
                    .args(["config", "http.receivepack", "true"])
                    .status()
                    .unwrap()
                    .success();
                assert!(ok, "configuring {} for push over HTTP", path.display());
            }
        }
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(AtomicUsize::new(0));
        let base = base.to_path_buf();
        let (s, r) = (stop.clone(), requests.clone());
        let accept = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        stream.set_nonblocking(false).unwrap();
                        r.fetch_add(1, Ordering::SeqCst);
                        let base = base.clone();
                        let auth = auth.clone();
                        std::thread::spawn(move || {
                            if let Err(e) = serve(stream, &base, auth.as_deref()) {
                                eprintln!("http-backend bridge: {e}");
                            }
                        });
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            }
        });
        HttpGit {
            port,
            stop,
            accept: Some(accept),
            requests,
        }
    }

    /// The URL of a repository below the base, e.g. `url("origin.git")`.
    pub fn url(&self, rel: &str) -> String {
        format!("http://127.0.0.1:{}/{}", self.port, rel)
    }
}

impl Drop for HttpGit {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Standard base64 with padding (RFC 4648), for the Basic credentials.
pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn serve(stream: TcpStream, base: &PathBuf, auth: Option<&str>) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("/").to_string();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        reader.read_line(&mut h)?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
    }
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size)?;
            let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or("0"), 16)
                .map_err(std::io::Error::other)?;
            let mut chunk = vec![0u8; n + 2];
            reader.read_exact(&mut chunk)?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    } else if let Some(n) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
        body.resize(n, 0);
        reader.read_exact(&mut body)?;
    }
    if let Some(want) = auth
        && header("authorization").as_deref() != Some(want)
    {
        let mut stream = stream;
        write!(
            stream,
            "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"git\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )?;
        return stream.flush();
    }
    let (path, query) = target.split_once('?').unwrap_or((&target, ""));
    let mut cmd = Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("GIT_PROJECT_ROOT", base)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", path)
        .env("QUERY_STRING", query)
        .env("REMOTE_ADDR", "127.0.0.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("CONTENT_LENGTH", body.len().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(ct) = header("content-type") {
        cmd.env("CONTENT_TYPE", ct);
    }
    for (k, v) in &headers {
        cmd.env(
            format!("HTTP_{}", k.to_ascii_uppercase().replace('-', "_")),
            v,
        );
    }
    if let Some(p) = header("git-protocol") {
        cmd.env("GIT_PROTOCOL", p);
    }
    let mut child = cmd.spawn()?;
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&body);
    });
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // CGI headers, then the body: turn `Status:` into the status line.
    let mut status = "200 OK".to_string();
    let mut cgi_headers = Vec::new();
    loop {
        let mut h = String::new();
        if out.read_line(&mut h)? == 0 {
            break;
        }
        let h = h.trim_end().to_string();
        if h.is_empty() {
            break;
        }
        match h.split_once(':') {
            Some((k, v)) if k.eq_ignore_ascii_case("status") => status = v.trim().to_string(),
            _ => cgi_headers.push(h),
        }
    }
    let mut stream = stream;
    write!(stream, "HTTP/1.1 {status}\r\n")?;
    for h in cgi_headers {
        write!(stream, "{h}\r\n")?;
    }
    write!(stream, "Connection: close\r\n\r\n")?;
    std::io::copy(&mut out, &mut stream)?;
    stream.flush()?;
    let _ = writer.join();
    let _ = child.wait();
    Ok(())
}
