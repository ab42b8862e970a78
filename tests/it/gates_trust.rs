//! The gate rule against a pusher: someone who can push refs (gate records,
//! cache branches) with a key that is not an allowed signer, and cannot push
//! the default branch. The setup `init` generates (its `tools/ci-gates.sh`,
//! its gates.toml's `cargo test` gate, its standalone binary cache), run end
//! to end against a real `git daemon`, with keys made by ssh-keygen at run
//! time. What stands in for the test suite is the `cargo` first on PATH: the
//! pusher's exits 0, CI's fails or passes.

use crate::util::git_daemon::GitDaemon;
use crate::util::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The binary cache `init --binary standalone` writes.
const BIN_CACHE: &str = "warmstart-bin";
const BIN_BRANCH: &str = "refs/warmstart/cache/warmstart-bin";

struct Setup {
    env: TestEnv,
    daemon: GitDaemon,
    /// CI runs so far (each in a fresh clone, as a CI job is).
    runs: std::cell::Cell<u32>,
}

impl Setup {
    /// An adopter repository made by `init --binary standalone` (with
    /// `--signer ci=KEY.pub` when `signed`), its build command a copy of the
    /// binary under test (standing in for `cargo install`), pushed to
    /// `origin.git` served by git daemon.
    fn new(signed: bool) -> Setup {
        let env = TestEnv::new();
        for name in ["ci", "evil"] {
            env.ssh_key(name);
        }
        std::fs::create_dir_all(env.join("srv")).unwrap();
        env.bare_remote("srv/origin.git");
        let daemon = GitDaemon::start(&env.join("srv"));
        let repo = env.work_repo("adopter");
        // A Cargo.toml at the root: init then detects `cargo test` for the
        // test gate (without one it writes a placeholder that always fails).
        std::fs::write(repo.join("Cargo.toml"), "[workspace]\n").unwrap();
        let mut init = env.xtask_in("adopter");
        init.args(["init", "--binary", "standalone"]);
        if signed {
            init.arg("--signer")
                .arg(format!("ci={}", env.join("keys/ci.pub").display()));
        }
        run(&mut init).ok();
        let manifest = repo.join(format!("cache-manifests/{BIN_CACHE}.toml"));
        let text = std::fs::read_to_string(&manifest).unwrap();
        let line = text.lines().find(|l| l.starts_with("build = ")).unwrap();
        let cp = format!(
            "build = [\"cp\", \"{}\", \"target/warmstart-build/bin/warmstart\"]",
            crate::util::bin().display()
        );
        std::fs::write(&manifest, text.replace(line, &cp)).unwrap();
        std::fs::write(repo.join(".gitignore"), "/target\n").unwrap();
        env.git("adopter", ["add", "-A"]);
        env.git("adopter", ["commit", "-q", "-m", "adopt warmstart"]);
        let s = Setup {
            env,
            daemon,
            runs: std::cell::Cell::new(0),
        };
        let url = s.url();
        s.env.git("adopter", ["remote", "add", "origin", &url]);
        s.env.git("adopter", ["push", "-q", "origin", "main"]);
        s
    }

    fn url(&self) -> String {
        self.daemon.url("origin.git")
    }

    fn key(&self, name: &str) -> PathBuf {
        self.env.join(format!("keys/{name}"))
    }

    /// A PATH whose first `cargo` exits with `status`.
    fn cargo_exiting(&self, status: u8) -> String {
        let dir = self.env.join(format!("cargo-{status}"));
        std::fs::create_dir_all(&dir).unwrap();
        let cargo = dir.join("cargo");
        std::fs::write(
            &cargo,
            format!("#!/bin/sh\necho \"cargo $* (exits {status})\"\nexit {status}\n"),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cargo, std::fs::Permissions::from_mode(0o755)).unwrap();
        format!(
            "{}:{}",
            dir.display(),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// The pusher: a clone of origin where `cargo test` exits 0, `gates run`
    /// (signed with `key` when given), then `gates push`.
    fn forge(&self, key: Option<&str>) {
        let dir = self.env.join("pusher");
        if !dir.exists() {
            self.env.git(".", ["clone", "-q", &self.url(), "pusher"]);
        }
        self.env.git("pusher", ["pull", "-q", "--ff-only"]);
        let path = self.cargo_exiting(0);
        let mut gates = self.env.xtask_in("pusher");
        gates.env("PATH", &path).args(["gates", "run"]);
        if let Some(k) = key {
            gates.arg("--signing-key").arg(self.key(k));
        }
        run(&mut gates).ok();
        run(self.env.xtask_in("pusher").args(["gates", "push"])).ok();
    }

    /// One CI job: a fresh clone of origin, the workflow's build step
    /// (`tools/warmstart-bootstrap.sh --build-only`), then the generated
    /// `tools/ci-gates.sh` with `cargo test` exiting `cargo_status` and
    /// CI's signing key in WARMSTART_SIGNING_KEY. Returns the clone and
    /// the script's run.
    fn ci(&self, cargo_status: u8) -> (PathBuf, Run) {
        self.runs.set(self.runs.get() + 1);
        let name = format!("ci-{}", self.runs.get());
        self.env.git(".", ["clone", "-q", &self.url(), &name]);
        let clone = self.env.join(&name);
        std::fs::create_dir_all(clone.join("target/warmstart-build/bin")).unwrap();
        let mut build = Command::new("bash");
        build
            .arg("tools/warmstart-bootstrap.sh")
            .arg("--build-only")
            .current_dir(&clone);
        self.env.isolate(&mut build);
        let built = run(&mut build).ok().stdout();
        let mut cmd = Command::new("bash");
        cmd.arg("tools/ci-gates.sh").current_dir(&clone);
        self.env.isolate(&mut cmd);
        cmd.env("XTASK", built.trim())
            .env("WARMSTART_SIGNING_KEY", self.key("ci"))
            .env("PATH", self.cargo_exiting(cargo_status));
        (clone, run(&mut cmd))
    }

    /// What origin holds at `refname`, if anything.
    fn on_origin(&self, refname: &str) -> Option<String> {
        let mut cmd = Command::new("git");
        cmd.arg("-C").arg(self.env.join("srv/origin.git")).args([
            "rev-parse",
            "--verify",
            "-q",
            refname,
        ]);
        self.env.isolate(&mut cmd);
        let out = cmd.output().unwrap();
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    /// A fresh clone's bootstrap, binary cache only.
    fn bootstrap(&self, name: &str) -> Run {
        self.env.git(".", ["clone", "-q", &self.url(), name]);
        let mut cmd = Command::new("bash");
        cmd.arg("tools/warmstart-bootstrap.sh")
            .arg("--prebuilt-only")
            .current_dir(self.env.join(name));
        self.env.isolate(&mut cmd);
        run(&mut cmd)
    }
}

/// A red CI job: exit 11 with the test gate run and failed (never
/// `already-green`), and no cache branch on origin.
fn assert_ran_red_and_published_nothing(s: &Setup, what: &str, r: &Run) {
    assert_eq!(
        r.code(),
        11,
        "{what}: not stopped by the red test\n{}",
        show(&r.out)
    );
    assert!(
        !r.stdout().contains("already-green"),
        "{what}: a gate was skipped on the pusher's record\n{}",
        show(&r.out)
    );
    assert!(
        r.stdout().contains("test    failed") || r.stdout().contains("test  failed"),
        "{what}: the test gate did not run\n{}",
        show(&r.out)
    );
    assert!(
        !r.stderr().contains("publishing"),
        "{what}\n{}",
        show(&r.out)
    );
    assert_eq!(
        s.on_origin(BIN_BRANCH),
        None,
        "{what}: a binary cache was published on a red test"
    );
}

/// The record of `tree` in `dir` (plain git).
fn record_in(env: &TestEnv, dir: &Path, tree: &str) -> Value {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir).args([
        "cat-file",
        "blob",
        &format!("refs/warmstart/gates/{tree}:gates.json"),
    ]);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The signed setup `init --signer` generates, end to end: a forged record
/// (unsigned, then signed by a stranger's key) never makes CI skip the red
/// test nor publish; with the test passing CI publishes a signed key with
/// signed gate records, a fresh clone's bootstrap installs it, and a later
/// job on the same tree still skips the test on CI's own trusted record.
#[test]
fn forged_gate_record_never_skips_or_publishes_in_signed_setup() {
    let s = Setup::new(true);
    s.forge(None);
    let (clone, r) = s.ci(1);
    assert_ran_red_and_published_nothing(&s, "unsigned forged record", &r);
    // The job's clone holds the forged record: shown as stored, never counted.
    let status = run(s.env.xtask_in(&clone).args(["gates", "status"])).ok();
    assert!(
        status
            .stdout()
            .contains("sets signed_gates: an entry counts only when"),
        "{}",
        show(&status.out)
    );
    let check = run(s.env.xtask_in(&clone).args(["gates", "check"])).expect_code(12);
    assert!(
        check.stderr().contains("gate test") && check.stderr().contains("not signed"),
        "{}",
        show(&check.out)
    );
    s.forge(Some("evil"));
    let (_, r) = s.ci(1);
    assert_ran_red_and_published_nothing(&s, "record signed by a stranger", &r);

    // Green: CI signs its records and the key, and publishes.
    let (clone, r) = s.ci(0);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(
        r.stderr().contains("publishing warmstart-bin"),
        "{}",
        show(&r.out)
    );
    assert!(s.on_origin(BIN_BRANCH).is_some());
    let tree = s.env.git(&clone, ["rev-parse", "HEAD^{tree}"]);
    let tree = tree.trim();
    s.env.git(
        &clone,
        [
            "fetch",
            "-q",
            "origin",
            "+refs/warmstart/gates/*:refs/warmstart/gates/*",
        ],
    );
    let record = record_in(&s.env, &clone, tree);
    assert!(
        record["gates"]["test"]["signature"]
            .as_str()
            .is_some_and(|sig| sig.contains("BEGIN SSH SIGNATURE")),
        "CI's gate record is not signed: {record}"
    );
    let r = s.bootstrap("box");
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(
        r.stderr()
            .contains("binary cache: installed warmstart_bin-")
            && r.stderr().contains("is signed by ci"),
        "{}",
        show(&r.out)
    );

    let trust = std::fs::read_to_string(s.env.join("adopter/cache-manifests/trust.toml")).unwrap();
    assert!(
        trust.contains("signed_gates = true"),
        "init --signer: {trust}"
    );

    // What works stays: a trusted record of exactly this tree skips its
    // gate (here even with a red `cargo`, the tree was proven).
    let (_, r) = s.ci(1);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(r.stdout().contains("already-green"), "{}", show(&r.out));
}

/// Without a trust policy (`init` with no signer), the generated CI runs
/// every gate whatever record someone pushed: a forged record never skips
/// the red test, and nothing is published.
#[test]
fn forged_gate_record_never_skips_a_gate_in_the_generated_ci_without_a_policy() {
    let s = Setup::new(false);
    s.forge(None);
    let (_, r) = s.ci(1);
    assert_ran_red_and_published_nothing(&s, "forged record, no policy", &r);
    // Green, published (unsigned: there is no policy); the job's own record
    // is what the publish used.
    let (_, r) = s.ci(0);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(s.on_origin(BIN_BRANCH).is_some());
}

/// `[trust] signed_gates = true` in a cache manifest (no `signed_gates` in
/// trust.toml): a forged record, fetched, never makes `gates run
/// --skip-green` skip the gate, and `gates check` says why it is not green.
#[test]
fn forged_gate_record_never_skips_with_signed_gates_on() {
    let s = Setup::new(true);
    // trust.toml as an older init wrote it (no signed_gates); the binary
    // cache's own [trust] table asks for signed gates instead.
    let repo = s.env.join("adopter");
    std::fs::write(
        repo.join("cache-manifests/trust.toml"),
        "policy = \"require\"\n",
    )
    .unwrap();
    let manifest = repo.join(format!("cache-manifests/{BIN_CACHE}.toml"));
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("\n[trust]\nsigned_gates = true\n");
    std::fs::write(&manifest, text).unwrap();
    s.env
        .git("adopter", ["commit", "-q", "-am", "signed gates per cache"]);
    s.env.git("adopter", ["push", "-q", "origin", "main"]);
    s.forge(None);
    let (_, r) = s.ci(1);
    assert_ran_red_and_published_nothing(&s, "signed_gates in the manifest", &r);
}
