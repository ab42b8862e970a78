//! The cache and the gates over the transports users reach GitHub and
//! GitLab with: HTTPS with basic auth (nginx + `git http-backend`, a test
//! CA), HTTPS through an authenticating CONNECT proxy (squid), and ssh with
//! key-only login (sshd). Each test publishes, lists, restores from a fresh
//! clone state, verifies, and shares a gate record through the real server,
//! and checks from the server's own log that the traffic went through it.
//! `WARMSTART_FETCH_BLOB_LIMIT` makes 20 kB chunks "big", so that the
//! restore reads several chunks by id (the direct reader's path).

use crate::util::fixture::Manifest;
use crate::util::servers::{GIT_PASSWORD, GIT_USER, Nginx, Squid, Sshd};
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

/// Blobs of 8 KiB or more are left out of branch fetches in these tests.
const LIMIT: &str = "8k";

/// Environment variables of the machine that would route these tests'
/// traffic elsewhere or decide which CA git trusts (this machine sets
/// GIT_SSL_CAINFO, which overrides `http.sslCAInfo`): cleared for every
/// command.
const MACHINE_VARS: [&str; 12] = [
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "GIT_SSL_NO_VERIFY",
    "GIT_SSH_COMMAND",
    "http_proxy",
    "https_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "no_proxy",
    "NO_PROXY",
];

pub struct Fx {
    pub env: TestEnv,
    pub work: PathBuf,
    pub src: PathBuf,
    pub target: PathBuf,
    /// What the user's machine sets for this transport (CA, ssh command).
    vars: Vec<(String, String)>,
    /// The user's global git configuration.
    global: PathBuf,
}

impl Fx {
    /// A work repository with a cache `art` (a tricky tree plus 120 kB of
    /// noise, in 20 kB chunks) restoring into `restored/art`, a gate `ok`,
    /// everything committed, and a bare `origin.git` next to it, not yet
    /// the work repository's remote.
    pub fn new() -> Fx {
        Fx::with(120_000, 20_000)
    }

    /// `new` with `noise` bytes of random data cut in chunks of `chunk` bytes.
    pub fn with(noise: u64, chunk: u64) -> Fx {
        let env = TestEnv::new();
        env.bare_remote("origin.git");
        let work = env.work_repo("work");
        let src = env.join("src");
        make_tricky_tree(&src, false);
        write_pseudo_random(&src.join("noise.bin"), noise, 17);
        Manifest::literal("1", &src)
            .chunk_bytes(chunk)
            .write(&work, "art");
        let manifests = work.join("cache-manifests");
        std::fs::write(
            manifests.join("gates.toml"),
            "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
        )
        .unwrap();
        std::fs::write(work.join(".gitignore"), "restored/\n").unwrap();
        env.git("work", ["add", "-A"]);
        env.git("work", ["commit", "-q", "-m", "manifests"]);
        let global = env.join("gitconfig-global");
        std::fs::write(&global, "").unwrap();
        Fx {
            target: work.join("restored/art"),
            env,
            work,
            src,
            vars: Vec::new(),
            global,
        }
    }

    pub fn var(&mut self, k: &str, v: &str) {
        self.vars.push((k.to_string(), v.to_string()));
    }

    /// Appends to the user's global git configuration.
    pub fn global_config(&self, text: &str) {
        let mut all = std::fs::read_to_string(&self.global).unwrap();
        all.push_str(text);
        std::fs::write(&self.global, all).unwrap();
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("GIT_CONFIG_GLOBAL", &self.global)
            .env("WARMSTART_FETCH_BLOB_LIMIT", LIMIT);
        for v in MACHINE_VARS {
            cmd.env_remove(v);
        }
        for (k, v) in &self.vars {
            cmd.env(k, v);
        }
    }

    /// The binary in `dir` (relative to the test directory), not started.
    pub fn command(&self, dir: &str, args: &[&str]) -> Command {
        let mut cmd = self.env.xtask_in(dir);
        self.apply(&mut cmd);
        cmd.args(args);
        cmd
    }

    /// The binary in `dir` (relative to the test directory).
    pub fn xtask_in(&self, dir: &str, args: &[&str]) -> Run {
        run(&mut self.command(dir, args))
    }

    pub fn xtask(&self, args: &[&str]) -> Run {
        self.xtask_in("work", args)
    }

    /// git with this transport's environment; panics on failure.
    pub fn git(&self, dir: &str, args: &[&str]) -> String {
        let mut cmd = Command::new("git");
        cmd.current_dir(self.env.join(dir)).args(args);
        self.env.isolate(&mut cmd);
        self.apply(&mut cmd);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{cmd:?}\n{}", show(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn set_remote(&self, url: &str) {
        self.env.git("work", ["remote", "add", "origin", url]);
    }

    /// Forgets everything this clone fetched or installed.
    pub fn forget(&self) {
        let _ = std::fs::remove_dir_all(self.work.join(".git/warmstart/cache.git"));
        let _ = std::fs::remove_dir_all(self.work.join(".git/warmstart/cache-meta.git"));
        let _ = std::fs::remove_dir_all(self.work.join(".git/warmstart/cache"));
        let _ = std::fs::remove_dir_all(self.work.join("restored"));
    }
}

pub fn json_of(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// Chunks of 8 KiB or more on the branch: the ones a restore fetches by id.
pub fn big_chunks(published: &Value) -> u64 {
    published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() >= 8192)
        .count() as u64
}

/// Publish, status, a cold restore through the direct reader, verify,
/// then a gate record pushed from `work` and fetched by a second clone of
/// `url`; every step through the transport the fixture is set up for.
/// Between the steps, `mark` says how much traffic the server logged so
/// far, and each step must have added some.
fn round_trip(fx: &Fx, url: &str, mark: &dyn Fn() -> usize) {
    fx.set_remote(url);
    let mut seen = mark();
    let mut went_through = |step: &str| {
        let now = mark();
        assert!(now > seen, "{step} left no trace in the server's log");
        seen = now;
    };

    let published = json_of(&fx.xtask(&["cache", "publish", "art", "--json"]).ok());
    assert_eq!(published["status"], "published", "{published}");
    let big = big_chunks(&published);
    assert!(big >= 4, "{published}");
    went_through("publish");

    fx.forget();
    let status = json_of(&fx.xtask(&["cache", "status", "art", "--json"]).ok());
    let remote = &status["caches"][0]["remote_state"];
    assert_eq!(remote["state"], "has key", "{status}");
    assert_eq!(remote["commit"], published["commit"], "{status}");
    assert_eq!(
        remote["keys"][0]["chunk_count"].as_u64(),
        Some(published["chunks"].as_array().unwrap().len() as u64),
        "{status}"
    );
    went_through("status");

    fx.forget();
    let j = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert!(j["direct_fallback"].is_null(), "{j}");
    assert_same_tree(&fx.src, &fx.target);
    went_through("restore");

    fx.forget();
    let v = fx.xtask(&["cache", "verify", "art", "--json"]).ok();
    assert!(
        v.stdout().contains("\"ok\": true") || v.stdout().contains("\"ok\":true"),
        "{}",
        show(&v.out)
    );
    went_through("verify");

    fx.xtask(&["gates", "run"]).ok();
    let r = json_of(&fx.xtask(&["gates", "push", "--json"]).ok());
    assert_eq!(r["result"], "created", "{r}");
    went_through("gates push");
    fx.git("work", &["push", "-q", "origin", "main"]);
    fx.git(".", &["clone", "-q", url, "second"]);
    fx.xtask_in("second", &["gates", "check"]).expect_code(9);
    let r = fx.xtask_in("second", &["gates", "fetch"]).ok();
    assert!(
        r.stdout().contains("green here now: ok"),
        "{}",
        show(&r.out)
    );
    went_through("gates fetch");
    fx.xtask_in("second", &["gates", "check", "ok"]).ok();
}

/// A credential helper holding the password, as `git credential approve`
/// leaves it on a developer's machine.
fn store_credentials(fx: &Fx, server: &Nginx) {
    let store = fx.env.join("git-credentials");
    std::fs::write(
        &store,
        format!(
            "https://{GIT_USER}:{GIT_PASSWORD}@127.0.0.1:{}\n",
            server.port
        ),
    )
    .unwrap();
    fx.global_config(&format!(
        "[credential]\n\thelper = store --file={}\n",
        store.display()
    ));
}

#[test]
fn transports_https_with_basic_auth_publish_restore_verify_status_and_gates() {
    let fx = Fx::new();
    let server = Nginx::start(&fx.env.join("."));
    fx.global_config(&format!(
        "[http]\n\tsslCAInfo = {}\n",
        server.ca.cert.display()
    ));
    store_credentials(&fx, &server);
    let requests = || {
        server
            .access_log()
            .lines()
            .filter(|l| l.contains(&format!(" - {GIT_USER} [")) && l.contains("\" 200 "))
            .count()
    };
    round_trip(&fx, &server.url("origin.git"), &requests);
}

#[test]
fn transports_https_through_an_authenticating_proxy_carries_every_step() {
    let mut fx = Fx::new();
    let server = Nginx::start(&fx.env.join("."));
    let proxy = Squid::start();
    fx.var("GIT_SSL_CAINFO", server.ca.cert.to_str().unwrap());
    fx.global_config(&format!("[http]\n\tproxy = {}\n", proxy.proxy_url()));
    // The credentials in the URL, as GitLab CI checks out.
    let url = server.url_with("origin.git", GIT_USER, GIT_PASSWORD);
    let tunnels = || proxy.tunnels_to(server.port);
    round_trip(&fx, &url, &tunnels);
    // Every request nginx saw came through squid's tunnels: none direct.
    assert!(proxy.tunnels_to(server.port) >= 8, "{}", proxy.access_log());
}

#[test]
fn transports_ssh_with_a_key_publish_restore_verify_status_and_gates() {
    let mut fx = Fx::new();
    let server = Sshd::start();
    fx.var("GIT_SSH_COMMAND", &server.ssh_command(&server.key));
    let url = server.url(&fx.env.join("origin.git"));
    let logins = || {
        server
            .log()
            .lines()
            .filter(|l| l.contains("Accepted publickey for root"))
            .count()
    };
    round_trip(&fx, &url, &logins);
}

#[test]
fn transports_ssh_without_accept_env_restores_through_git_fetch_and_says_why() {
    // OpenSSH's default sshd passes no GIT_PROTOCOL: upload-pack answers
    // protocol v0, and the chunks come through `git fetch` instead.
    let mut fx = Fx::new();
    let server = Sshd::start_without_git_protocol();
    fx.var("GIT_SSH_COMMAND", &server.ssh_command(&server.key));
    fx.set_remote(&server.url(&fx.env.join("origin.git")));
    let published = json_of(&fx.xtask(&["cache", "publish", "art", "--json"]).ok());
    fx.forget();
    let j = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(
        j["chunks_fetched"].as_u64(),
        Some(big_chunks(&published)),
        "{j}"
    );
    assert_eq!(j["chunks_direct"], 0, "{j}");
    assert!(
        j["direct_fallback"]
            .as_str()
            .is_some_and(|w| w.contains("protocol v0") && w.contains("AcceptEnv GIT_PROTOCOL")),
        "{j}"
    );
    assert_same_tree(&fx.src, &fx.target);
}
