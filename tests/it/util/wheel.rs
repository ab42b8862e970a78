//! The run's one release build: the `warmstart` wheel that tools/test.sh builds
//! (tools/build-wheel.sh) and names in `WARMSTART_TEST_WHEEL`, fresh venvs to
//! install it into, and a PEP 503 package index on 127.0.0.1 that serves it.
//!
//! A test that needs a release binary (the wheel test, the adopter test) takes
//! it from this wheel, so a test run compiles release code once, not per test.

use super::git_daemon::free_port;
use super::{TestEnv, run, sha256sum, show};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The variable tools/test.sh sets to the built wheel's path.
pub const VAR: &str = "WARMSTART_TEST_WHEEL";
/// The executable the wheel installs (the crate's bin target).
pub const EXE: &str = "warmstart";

/// The built wheel. Fails the test (never skips it) when the variable is
/// missing or names no file.
pub fn wheel() -> PathBuf {
    let Some(path) = std::env::var_os(VAR) else {
        panic!(
            "{VAR} is not set: run the tests through tools/test.sh (it builds the wheel once), \
             or build it with tools/build-wheel.sh and set {VAR} to the wheel it prints"
        );
    };
    // A relative path is the source tree's (the tests run in xtask/).
    let path = super::source_root().join(path);
    assert!(
        path.is_file(),
        "{VAR}={} is not a file: rebuild it with tools/build-wheel.sh",
        path.display()
    );
    std::fs::canonicalize(&path).unwrap()
}

/// The wheel's version, from its PEP 427 file name.
pub fn version(wheel: &Path) -> String {
    let name = wheel.file_name().unwrap().to_str().unwrap();
    name.split('-').nth(1).unwrap().to_string()
}

/// The release binary inside the wheel, unpacked into `dir` (the wheel is a
/// zip; its executable is `warmstart-VER.data/scripts/warmstart`).
pub fn release_bin(env: &TestEnv, dir: &str) -> PathBuf {
    let wheel = wheel();
    let member = format!("warmstart-{}.data/scripts/{EXE}", version(&wheel));
    let out = env.join(dir);
    std::fs::create_dir_all(&out).unwrap();
    let mut cmd = Command::new("unzip");
    cmd.args(["-q", "-o", "-j"])
        .arg(&wheel)
        .arg(&member)
        .arg("-d")
        .arg(&out);
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "unzip {member}\n{}", show(&r.out));
    out.join(EXE)
}

/// Applies what every pip run in a test needs: no user or site pip
/// configuration (this machine's points at local wheel folders), no cache,
/// no prompt.
pub fn isolate_pip(env: &TestEnv, cmd: &mut Command) {
    env.isolate(cmd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("PIP_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("PIP_CONFIG_FILE", "/dev/null")
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INPUT", "1")
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONPATH");
}

/// How a venv gets its pip.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pip {
    /// `python3 -m venv DIR`: the venv's own pip (ensurepip), seconds to set up.
    Own,
    /// `python3 -m venv --without-pip DIR`, installed into by the host's
    /// `python3 -m pip --python DIR/bin/python` (pip 22.3 or later): a
    /// fraction of a second to set up.
    Host,
}

/// Creates a fresh venv at `rel`; returns its path.
pub fn venv(env: &TestEnv, rel: &str, pip: Pip) -> PathBuf {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "venv"]);
    if pip == Pip::Host {
        cmd.arg("--without-pip");
    }
    cmd.arg(env.join(rel));
    isolate_pip(env, &mut cmd);
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "python3 -m venv {rel}\n{}", show(&r.out));
    env.join(rel)
}

/// `python3 -m http.server` on 127.0.0.1 over a PEP 503 simple index that
/// holds `wheel` under `simple/warmstart/`; killed when dropped.
pub struct Index {
    child: Child,
    pub port: u16,
}

impl Index {
    /// Lays out `root/simple/warmstart/index.html` (a link with #sha256=)
    /// next to a copy of the wheel, and serves `root`.
    pub fn serve(root: &Path, wheel: &Path) -> Index {
        let name = wheel.file_name().unwrap().to_str().unwrap();
        let project = root.join("simple/warmstart");
        std::fs::create_dir_all(&project).unwrap();
        std::fs::copy(wheel, project.join(name)).unwrap();
        let digest = sha256sum(wheel);
        std::fs::write(
            project.join("index.html"),
            format!("<!DOCTYPE html>\n<html><body>\n<a href=\"{name}#sha256={digest}\">{name}</a>\n</body></html>\n"),
        )
        .unwrap();
        std::fs::write(
            root.join("simple/index.html"),
            "<!DOCTYPE html>\n<html><body><a href=\"warmstart/\">warmstart</a></body></html>\n",
        )
        .unwrap();
        let port = free_port();
        let child = Command::new("python3")
            .args(["-m", "http.server", "--bind", "127.0.0.1", "--directory"])
            .arg(root)
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting python3 -m http.server");
        let index = Index { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the package index did not listen on 127.0.0.1:{port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        index
    }

    /// The URL pip's `--index-url` takes.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/simple/", self.port)
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
