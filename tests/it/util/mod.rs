//! Test harness: a fresh temporary directory per test, the real built binary, real git.
//!
//! Nothing here mocks a part: `warmstart` is the binary cargo built, `git` is the
//! system git, remotes are bare repositories on disk or served by `git daemon`
//! on 127.0.0.1. Helpers panic with the full output when a setup step fails,
//! so a broken fixture never looks like a passing test.

#![allow(dead_code)]

pub mod fixture;
pub mod git_daemon;
pub mod http;
pub mod http_backend;
pub mod pty;
pub mod relay;
pub mod rng;
pub mod servers;
pub mod tree;
pub mod wheel;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The warmstart binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_warmstart"))
}

/// The top of this source tree (where README.md and cache-manifests/ live).
pub fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// One test's world: a temporary directory that is also `$HOME`, with git
/// configured so that no user or system config leaks in.
pub struct TestEnv {
    pub dir: tempfile::TempDir,
}

impl Default for TestEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl TestEnv {
    pub fn new() -> TestEnv {
        let dir = tempfile::Builder::new()
            .prefix("warmstart-test-")
            .tempdir()
            .expect("creating a temporary directory");
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        TestEnv { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// A path inside the test directory.
    pub fn join(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// A fresh ed25519 key pair `keys/<name>` and `keys/<name>.pub` (comment
    /// `name`, no passphrase), made by the real `ssh-keygen`; its path.
    pub fn ssh_key(&self, name: &str) -> PathBuf {
        let f = self.join(format!("keys/{name}"));
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
            .arg(&f)
            .output()
            .expect("ssh-keygen (tools/test.sh installs openssh-client)");
        assert!(out.status.success(), "{}", show(&out));
        f
    }

    pub fn home(&self) -> PathBuf {
        self.join("home")
    }

    /// Applies the isolated environment to any command.
    pub fn isolate(&self, cmd: &mut Command) {
        cmd.env("HOME", self.home())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", self.home().join(".gitconfig-none"))
            .env("GIT_AUTHOR_NAME", "warmstart test")
            .env("GIT_AUTHOR_EMAIL", "test@warmstart.invalid")
            .env("GIT_COMMITTER_NAME", "warmstart test")
            .env("GIT_COMMITTER_EMAIL", "test@warmstart.invalid")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env_remove("CRASH_RESUME_INDEX_PATH")
            .env_remove("CARGO_TARGET_DIR")
            .env_remove("GIT_DIR")
            .env_remove("GIT_WORK_TREE")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null());
        // The runner's own settings never leak in (an unknown one is exit 10).
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("WARMSTART_") {
                cmd.env_remove(k);
            }
        }
        // The binary is on PATH, as for a user who installed it, so its hints
        // name it `warmstart` (run by a path PATH does not find, a hint names
        // that path: `invocation.rs`). A PATH the test chose stays.
        if !cmd.get_envs().any(|(k, _)| k == "PATH") {
            let dir = bin().parent().unwrap().to_path_buf();
            let rest = std::env::var_os("PATH").unwrap_or_default();
            let path =
                std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest)))
                    .unwrap();
            cmd.env("PATH", path);
        }
    }

    /// The real binary, run in `cwd` (relative to the test directory).
    pub fn xtask_in(&self, cwd: impl AsRef<Path>) -> Command {
        let mut cmd = Command::new(bin());
        cmd.current_dir(self.join(cwd));
        self.isolate(&mut cmd);
        cmd
    }

    /// The real binary, run in the test directory.
    pub fn xtask(&self) -> Command {
        self.xtask_in(".")
    }

    /// Runs git in `cwd` (relative to the test directory); panics on failure.
    pub fn git<I, S>(&self, cwd: impl AsRef<Path>, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new("git");
        cmd.current_dir(self.join(cwd)).args(args);
        self.isolate(&mut cmd);
        let out = cmd.output().expect("running git");
        assert!(
            out.status.success(),
            "git failed: {:?}\n{}",
            cmd,
            show(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Creates a bare repository set up like a hosting server (pushes stay packed).
    pub fn bare_remote(&self, rel: &str) -> PathBuf {
        self.git(".", ["init", "-q", "--bare", "-b", "main", rel]);
        self.git(rel, ["config", "receive.unpackLimit", "1"]);
        self.git(rel, ["config", "uploadpack.allowFilter", "true"]);
        self.git(
            rel,
            ["config", "uploadpack.allowReachableSHA1InWant", "true"],
        );
        self.join(rel)
    }

    /// Creates a work repository with one commit on `main`.
    pub fn work_repo(&self, rel: &str) -> PathBuf {
        self.git(".", ["init", "-q", "-b", "main", rel]);
        std::fs::write(self.join(rel).join("README.md"), "test repository\n").unwrap();
        self.git(rel, ["add", "-A"]);
        self.git(rel, ["commit", "-q", "-m", "initial"]);
        self.join(rel)
    }
}

/// What a finished process said, for assertion messages.
pub fn show(out: &Output) -> String {
    format!(
        "status: {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A finished run of the binary, with the accessors tests want.
pub struct Run {
    pub out: Output,
}

impl Run {
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    /// Panics (with all output) unless the exit code is `code`.
    pub fn expect_code(self, code: i32) -> Run {
        assert_eq!(
            self.code(),
            code,
            "unexpected exit code\n{}",
            show(&self.out)
        );
        self
    }
    pub fn ok(self) -> Run {
        self.expect_code(0)
    }
}

/// Runs a command to completion.
pub fn run(cmd: &mut Command) -> Run {
    Run {
        out: cmd
            .output()
            .unwrap_or_else(|e| panic!("spawning {cmd:?}: {e}")),
    }
}

/// sha256 of a file, via coreutils (an independent implementation).
/// Verified chunk files in the chunk store of the clone `work` (not the
/// partial `tmp-*` ones a fetch writes first).
pub fn stored_chunks(work: &Path) -> usize {
    std::fs::read_dir(work.join(".git/warmstart/cache.git/chunks"))
        .map(|rd| {
            rd.flatten()
                .filter(|e| !e.file_name().to_string_lossy().starts_with("tmp-"))
                .count()
        })
        .unwrap_or(0)
}

/// Sends `sig` to `child`, waits for it, and returns its status and stderr.
pub fn signal_and_wait(
    child: &mut std::process::Child,
    sig: libc::c_int,
) -> (std::process::ExitStatus, String) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
    let status = child.wait().unwrap();
    (status, child_stderr(child))
}

/// All that an ended `child` (spawned with a piped stderr) wrote to stderr.
pub fn child_stderr(child: &mut std::process::Child) -> String {
    use std::io::Read;
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    err
}

pub fn sha256sum(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}
