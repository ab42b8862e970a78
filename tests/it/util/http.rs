//! One small HTTP/1.1 server for the tests, on 127.0.0.1 only, in this process.
//!
//! It reads each request's head and hands the connection to the test's
//! `answer`, which writes whatever the case needs (a body, a status, a
//! stall). It counts connections, records each request line, and stops when
//! dropped. It never binds anything but 127.0.0.1 and never serves a file
//! the test did not hand it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the server read it.
pub struct Request<'a> {
    /// Which connection this is, from 0.
    pub n: usize,
    /// The request line, e.g. `GET /tool HTTP/1.1`.
    pub line: &'a str,
    /// Set when the server is being dropped: an answer that waits stops.
    pub stop: &'a AtomicBool,
}

impl Request<'_> {
    /// The path without its leading `/`.
    pub fn path(&self) -> &str {
        self.line
            .split(' ')
            .nth(1)
            .unwrap_or("/")
            .trim_start_matches('/')
    }
}

type Answer = dyn Fn(&Request, &mut TcpStream) + Send + Sync;

/// A running server; stops (and joins its accept loop) when dropped.
pub struct HttpServer {
    pub port: u16,
    hits: Arc<AtomicUsize>,
    requests: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Serves each connection in a thread of its own with `answer`.
    pub fn start(answer: impl Fn(&Request, &mut TcpStream) + Send + Sync + 'static) -> HttpServer {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let hits = Arc::new(AtomicUsize::new(0));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let answer: Arc<Answer> = Arc::new(answer);
        let (h, q, s) = (hits.clone(), requests.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok((conn, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let n = h.fetch_add(1, Ordering::SeqCst);
                let (q, s, answer) = (q.clone(), s.clone(), answer.clone());
                std::thread::spawn(move || serve(conn, n, &*answer, &q, &s));
            }
        });
        HttpServer {
            port,
            hits,
            requests,
            stop,
            thread: Some(thread),
        }
    }

    /// Serves `body` with 200 to every request.
    pub fn body(body: Vec<u8>) -> HttpServer {
        HttpServer::start(move |_, conn| reply(conn, 200, &body))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}/{path}", self.port)
    }

    /// Connections accepted so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }

    /// The request lines read so far, in order.
    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Writes a whole response: `status`, a Content-Length, `body`, and closes.
pub fn reply(conn: &mut TcpStream, status: u16, body: &[u8]) {
    let reason = match status {
        200 => "OK",
        403 => "Forbidden",
        404 => "Not Found",
        _ => "X",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(head.as_bytes());
    let _ = conn.write_all(body);
}

fn serve(
    mut conn: TcpStream,
    n: usize,
    answer: &Answer,
    requests: &Mutex<Vec<String>>,
    stop: &AtomicBool,
) {
    conn.set_nonblocking(false).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    let line = String::from_utf8_lossy(&buf)
        .lines()
        .next()
        .unwrap_or("")
        .to_string();
    requests.lock().unwrap().push(line.clone());
    answer(
        &Request {
            n,
            line: &line,
            stop,
        },
        &mut conn,
    );
}
