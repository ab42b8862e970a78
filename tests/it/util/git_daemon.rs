//! A real `git daemon` on 127.0.0.1 serving a directory of bare repositories.

use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running daemon; killed when dropped, with its whole process group:
/// `git daemon` runs `git-daemon` as a child (not by exec), so killing the
/// `git` process alone left the listening daemon behind, one per test.
pub struct GitDaemon {
    child: Child,
    pub port: u16,
}

impl GitDaemon {
    /// Serves every repository under `base` (read and push) on a free port.
    pub fn start(base: &Path) -> GitDaemon {
        GitDaemon::start_with(base, &[])
    }

    /// `start`, with `vars` set for the daemon and the `git upload-pack`s it
    /// runs (e.g. `GIT_CONFIG_GLOBAL`, where git reads
    /// `uploadpack.packObjectsHook` only).
    pub fn start_with(base: &Path, vars: &[(&str, &std::ffi::OsStr)]) -> GitDaemon {
        use std::os::unix::process::CommandExt;
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
            .envs(vars.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
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
        // SAFETY: kill(2) on the process group this daemon leads.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
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
