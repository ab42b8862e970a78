//! A real pseudo-terminal for the binary: its stdin, stdout and stderr are
//! the pty's slave side, it leads its own session with the pty as its
//! controlling terminal (so a `^C` written to the master is the terminal's
//! own SIGINT to its foreground group), and everything it draws is kept.
//! It never interprets what was drawn; tests read the raw bytes.

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child on a pty, and what it drew so far.
pub struct Pty {
    child: Child,
    master: std::fs::File,
    drawn: Arc<Mutex<Vec<u8>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Pty {
    /// Starts `cmd` on a fresh 120x40 pty.
    pub fn spawn(mut cmd: Command) -> Pty {
        let (mut master, mut slave) = (-1, -1);
        let size = libc::winsize {
            ws_row: 40,
            ws_col: 120,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: openpty writes two fds into the locals; the size is read only.
        let rc = unsafe {
            libc::openpty(
                &mut master,
                &mut slave,
                std::ptr::null_mut(),
                std::ptr::null(),
                &size,
            )
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both fds were just opened and are owned here alone.
        let (master, slave) = unsafe {
            (
                std::fs::File::from_raw_fd(master),
                OwnedFd::from_raw_fd(slave),
            )
        };
        cmd.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave);
        // SAFETY: setsid and ioctl are async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY as _, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        // The slave's last copies go with `cmd`: the master then reads EOF
        // (EIO) once the child and its children have closed theirs.
        drop(cmd);
        let drawn = Arc::new(Mutex::new(Vec::new()));
        let mut from = master.try_clone().unwrap();
        let sink = drawn.clone();
        let reader = std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = from.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        Pty {
            child,
            master,
            drawn,
            reader: Some(reader),
        }
    }

    /// All it drew so far, lossily as text.
    pub fn drawn(&self) -> String {
        String::from_utf8_lossy(&self.drawn.lock().unwrap()).into_owned()
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to `limit`) until what was drawn satisfies `ready`; false
    /// when the child ended or the time ran out first.
    pub fn wait_for(&mut self, limit: Duration, ready: impl Fn(&str) -> bool) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if ready(&self.drawn()) {
                return true;
            }
            if self.child.try_wait().unwrap().is_some() {
                return ready(&self.drawn());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Types `bytes` at the terminal (`b"\x03"` is Ctrl-C).
    pub fn type_bytes(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Waits for the child's end (at most 60 s, then kills it), then for the
    /// last of what it drew; returns its status and all it drew.
    pub fn finish(mut self) -> (ExitStatus, String) {
        let until = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > until {
                let _ = self.child.kill();
                panic!("still running after 60 s; drew {:?}", self.drawn());
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // A grandchild that kept the slave open would hold the reader:
        // give it a moment, then read what there is.
        let reader = self.reader.take().unwrap();
        let until = Instant::now() + Duration::from_secs(5);
        while !reader.is_finished() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
        (status, self.drawn())
    }
}

/// Runs `cmd` on a pty to its end: its status and all it drew.
pub fn run(cmd: Command) -> (ExitStatus, String) {
    Pty::spawn(cmd).finish()
}
