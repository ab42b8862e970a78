//! A real `git daemon` on 127.0.0.1 serving a directory of bare repositories.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; killed when dropped.
pub struct GitDaemon {
    child: Child,
    pub port: u16,
}

impl GitDaemon {
    /// Serves every repository under `base` (read and push) on a free port.
    pub fn start(base: &Path) -> GitDaemon {
        let port = free_port();
        let child = Command::new("git")
            .arg("daemon")
            .arg("--reuseaddr")
            .arg("--export-all")
            .arg("--enable=receive-pack")
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .arg(base)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting git daemon (is git-daemon installed? tools/test.sh installs it)");
        let daemon = GitDaemon { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "git daemon did not listen on port {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// The URL of a repository below the base path, e.g. `url("origin.git")`.
    pub fn url(&self, rel: &str) -> String {
        format!("git://127.0.0.1:{}/{}", self.port, rel)
    }
}

impl Drop for GitDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
