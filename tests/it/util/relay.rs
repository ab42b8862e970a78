//! A real TCP relay on 127.0.0.1 in front of a server, that cuts every
//! connection once the server has sent it a given number of bytes: a link
//! that drops its connections (a flaky NAT, a proxy with a transfer cap).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// The relay; it stops accepting when dropped.
pub struct CuttingRelay {
    pub port: u16,
    /// Connections it cut.
    pub cuts: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl CuttingRelay {
    /// Relays to `upstream`, cutting each connection (both ways, both
    /// sockets) after the server sent `per_connection` bytes on it.
    pub fn start(upstream: u16, per_connection: u64) -> CuttingRelay {
        CuttingRelay::start_cutting(upstream, per_connection, u64::MAX)
    }

    /// `start`, making at most `max_cuts` cuts: once they are made, every
    /// connection is relayed whole (a link that dropped once).
    pub fn start_cutting(upstream: u16, per_connection: u64, max_cuts: u64) -> CuttingRelay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicU64::new(0));
        let (s, c) = (stop.clone(), cuts.clone());
        std::thread::spawn(move || {
            while !s.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                    continue;
                };
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || copy(c2, s2, u64::MAX, None));
                let cuts = c.clone();
                std::thread::spawn(move || {
                    copy(server, client, per_connection, Some((cuts, max_cuts)))
                });
            }
        });
        CuttingRelay { port, cuts, stop }
    }

    /// The URL of a repository behind the relay (a `git daemon` upstream).
    pub fn git_url(&self, rel: &str) -> String {
        format!("git://127.0.0.1:{}/{rel}", self.port)
    }
}

impl Drop for CuttingRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until either ends or `budget` bytes went through;
/// then closes both sockets both ways (a cut, counted in `cuts`), unless
/// the cuts already made reached their most, when it copies on to the end.
fn copy(mut from: TcpStream, mut to: TcpStream, budget: u64, cuts: Option<(Arc<AtomicU64>, u64)>) {
    let mut buf = [0u8; 16384];
    let mut left = budget;
    loop {
        let got = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let n = got.min(usize::try_from(left).unwrap_or(usize::MAX));
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        left -= n as u64;
        if left == 0 {
            if let Some((c, most)) = &cuts
                && c.fetch_add(1, Ordering::SeqCst) >= *most
            {
                // No cut left to make: the rest goes through whole.
                c.fetch_sub(1, Ordering::SeqCst);
                left = u64::MAX;
                if to.write_all(&buf[n..got]).is_err() {
                    break;
                }
                continue;
            }
            let _ = from.shutdown(Shutdown::Both);
            let _ = to.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
