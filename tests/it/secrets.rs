//! Secrets never leave git: with a password in the remote URL, in a
//! credential helper, or in `http.extraheader`, no command prints it, puts
//! it in JSON, or writes it under `.git/warmstart/` or onto the cache branch.
//!
//! The server is a real `git http-backend` on 127.0.0.1 that demands Basic
//! authentication (a 401 challenge otherwise), so the credentials are really
//! used. The password is random per run, so no fixed string can pass.

use crate::util::http_backend::{HttpGit, base64};
use crate::util::{Run, TestEnv, run, show};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug)]
enum Where {
    Url,
    Helper,
    ExtraHeader,
}

struct World {
    env: TestEnv,
    server: HttpGit,
    work: PathBuf,
    secret: String,
    /// Everything any command printed, for the final grep.
    said: Vec<(String, String)>,
}

/// A password that differs on every run and in every test.
fn random_secret(salt: u64) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let mut x = nanos ^ (u64::from(std::process::id()) << 32) ^ salt.wrapping_mul(0x9e37_79b9);
    let set = b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789~";
    let mut s = String::from("Pw");
    for _ in 0..22 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.push(set[(x % set.len() as u64) as usize] as char);
    }
    s
}

impl World {
    fn new(place: Where) -> World {
        let env = TestEnv::new();
        env.bare_remote("srv/origin.git");
        let secret = random_secret(place as u64);
        let server = HttpGit::start_with_auth(&env.join("srv"), Some(&format!("ci:{secret}")));
        let work = env.work_repo("work");
        let plain = server.url("origin.git");
        let url = match place {
            Where::Url => plain.replace("http://", &format!("http://ci:{secret}@")),
            _ => plain.clone(),
        };
        env.git("work", ["remote", "add", "origin", &url]);
        match place {
            Where::Url => {}
            Where::Helper => {
                let helper = format!(
                    "!f() {{ test \"$1\" = get && echo username=ci && echo password={secret}; }}; f"
                );
                env.git("work", ["config", "credential.helper", &helper]);
            }
            Where::ExtraHeader => {
                let header = format!(
                    "Authorization: Basic {}",
                    base64(format!("ci:{secret}").as_bytes())
                );
                env.git("work", ["config", "http.extraheader", &header]);
            }
        }
        let payload = env.join("payload");
        std::fs::create_dir_all(&payload).unwrap();
        std::fs::write(payload.join("hello.txt"), "hello\n").unwrap();
        crate::util::tree::write_pseudo_random(&payload.join("noise.bin"), 60_000, 5);
        let manifests = work.join("cache-manifests");
        std::fs::create_dir_all(&manifests).unwrap();
        let manifest = |branch: &str, target: &str| {
            format!(
                "[cache]\nbranch = \"{branch}\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\n\n[restore]\npath = \"{target}\"\n",
                payload.display()
            )
        };
        std::fs::write(
            manifests.join("art.toml"),
            manifest("art-cache", "restored/art"),
        )
        .unwrap();
        std::fs::write(
            manifests.join("gone.toml"),
            manifest("no-such-cache", "restored/gone"),
        )
        .unwrap();
        // A download step with the password in its URL (a 404 there).
        let download = server
            .url("missing.bin")
            .replace("http://", &format!("http://ci:{secret}@"));
        std::fs::write(
            manifests.join("restore.toml"),
            format!(
                "[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\n\n[[step]]\nname = \"gone\"\nkind = \"cache\"\ncache = \"gone\"\n\n[[step]]\nname = \"dl\"\nkind = \"download\"\nurl = \"{download}\"\nsha256 = \"{}\"\ndest = \"dl.bin\"\nretries = 0\n",
                "0".repeat(64)
            ),
        )
        .unwrap();
        World {
            env,
            server,
            work,
            secret,
            said: Vec::new(),
        }
    }

    /// Runs xtask in the work repository and keeps what it printed.
    fn xtask(&mut self, args: &[&str]) -> Run {
        let mut cmd = self.env.xtask_in("work");
        // Chunks of 8 KiB or more are fetched by id, through the direct
        // reader and git's HTTP helper: both must authenticate.
        cmd.env("WARMSTART_FETCH_BLOB_LIMIT", "8k").args(args);
        let r = run(&mut cmd);
        let label = args.join(" ");
        self.said.push((format!("{label} (stdout)"), r.stdout()));
        self.said.push((format!("{label} (stderr)"), r.stderr()));
        r
    }

    /// Runs every command that talks to the remote, success and failure.
    fn run_everything(&mut self) {
        self.xtask(&["cache", "publish", "art", "--dry-run"]).ok();
        self.xtask(&["cache", "publish", "art", "--dry-run", "--json"])
            .ok();
        let r = self.xtask(&["cache", "publish", "art", "--json"]).ok();
        assert!(r.stdout().contains("127.0.0.1"), "{}", show(&r.out));
        self.xtask(&["cache", "publish", "art"]).ok();
        self.xtask(&["cache", "list"]).ok();
        self.xtask(&["cache", "list", "--json"]).ok();
        self.xtask(&["cache", "status", "art"]).ok();
        let r = self.xtask(&["cache", "status", "--json"]).ok();
        assert!(r.stdout().contains("\"has key\""), "{}", show(&r.out));
        let r = self.xtask(&["cache", "restore", "art", "--json"]).ok();
        assert!(r.stdout().contains("\"restored\""), "{}", show(&r.out));
        self.xtask(&["cache", "restore", "art", "--json"]).ok();
        self.xtask(&["cache", "verify", "art"]).ok();
        self.xtask(&["cache", "verify", "art", "--json"]).ok();
        // A failing fetch: the branch does not exist.
        let r = self.xtask(&["cache", "restore", "gone"]).expect_code(4);
        assert!(r.stderr().contains("127.0.0.1"), "{}", show(&r.out));
        self.xtask(&["cache", "restore", "gone", "--json"])
            .expect_code(4);
        self.xtask(&["cache", "verify", "gone"]).expect_code(4);
        // The machine restore, cold, with a failing step (logs, state).
        std::fs::remove_dir_all(self.work.join("restored")).unwrap();
        std::fs::remove_dir_all(self.work.join(".git/warmstart/cache")).unwrap();
        let r = self.xtask(&["restore", "--json"]);
        assert!(r.stdout().contains("gone"), "{}", show(&r.out));
        assert!(
            r.stdout().contains("download of http://127.0.0.1:"),
            "{}",
            show(&r.out)
        );
        assert!(
            self.work.join("restored/art/hello.txt").is_file(),
            "{}",
            show(&r.out)
        );
        self.xtask(&["restore"]);
        self.xtask(&["restore", "--strict"]).expect_code(11);
    }

    /// A wrong password in the URL: the refusal names the server, not the password.
    fn wrong_password(&mut self) {
        let wrong = format!("{}x", self.secret);
        let url = self
            .server
            .url("origin.git")
            .replace("http://", &format!("http://ci:{wrong}@"));
        self.env.git("work", ["remote", "add", "wrong", &url]);
        for args in [
            &["cache", "restore", "art", "--remote", "wrong"][..],
            &["cache", "restore", "art", "--remote", &url, "--json"],
            &["cache", "publish", "art", "--remote", &url, "--json"],
            &["cache", "verify", "art", "--remote", &url],
        ] {
            std::fs::remove_dir_all(self.work.join(".git/warmstart")).unwrap();
            let r = self.xtask(args);
            assert_ne!(r.code(), 0, "{}", show(&r.out));
            assert!(
                (r.stdout() + &r.stderr()).contains("127.0.0.1"),
                "the error names the server: {}",
                show(&r.out)
            );
        }
    }

    /// Greps every output, every file under `.git/warmstart/` and every
    /// blob on the cache branch for the password and its Basic form.
    fn assert_no_secret(&self) {
        let basic = base64(format!("ci:{}", self.secret).as_bytes());
        let needles = [self.secret.as_str(), basic.as_str()];
        for (what, text) in &self.said {
            for n in needles {
                assert!(!text.contains(n), "{what} shows the secret:\n{text}");
            }
        }
        let mut files = Vec::new();
        walk(&self.work.join(".git/warmstart"), &mut files);
        assert!(
            files.len() > 5,
            "the state directory was written: {files:?}"
        );
        for f in &files {
            let bytes = std::fs::read(f).unwrap();
            for n in needles {
                assert!(
                    !contains(&bytes, n.as_bytes()),
                    "{} holds the secret",
                    f.display()
                );
            }
        }
        let tree = self
            .env
            .git("srv/origin.git", ["ls-tree", "-r", "art-cache"]);
        let blobs: Vec<&str> = tree
            .lines()
            .map(|l| l.split_whitespace().nth(2).unwrap())
            .collect();
        assert!(blobs.len() >= 4, "{tree}");
        for oid in blobs {
            let mut cmd = std::process::Command::new("git");
            cmd.arg("--git-dir")
                .arg(self.env.join("srv/origin.git"))
                .args(["cat-file", "blob", oid]);
            self.env.isolate(&mut cmd);
            let out = cmd.output().unwrap();
            assert!(out.status.success());
            for n in needles {
                assert!(
                    !contains(&out.stdout, n.as_bytes()),
                    "blob {oid} holds the secret"
                );
            }
        }
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            walk(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn secrets_in_the_remote_url_are_never_printed_or_written() {
    let mut w = World::new(Where::Url);
    w.run_everything();
    w.wrong_password();
    w.assert_no_secret();
    assert!(w.server.requests.load(std::sync::atomic::Ordering::SeqCst) > 0);
}

#[test]
fn secrets_from_a_credential_helper_are_never_printed_or_written() {
    let mut w = World::new(Where::Helper);
    w.run_everything();
    w.assert_no_secret();
}

#[test]
fn secrets_in_http_extraheader_are_never_printed_or_written() {
    let mut w = World::new(Where::ExtraHeader);
    w.run_everything();
    w.assert_no_secret();
}

/// Never, whatever the URL looks like: many generated remote URLs with
/// hostile userinfo (sub-delimiters, `@`, `:`, percent escapes), schemes and
/// ports, given with `--remote` to commands that print the remote, succeed
/// in planning or fail to connect: no output holds the user or password.
#[test]
fn secrets_in_hostile_remote_urls_never_reach_any_output() {
    let mut w = World::new(Where::Helper);
    let mut x: u64 = 0x2545_f491_4f6c_dd1d ^ u64::from(std::process::id());
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    const SET: &[u8] =
        b"abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789-._~!$&'()*+,;=:@%";
    let mut secrets = Vec::new();
    for i in 0..24 {
        let mut word = |n: u64| {
            let mut s = String::from("Q");
            for _ in 0..(10 + n % 12) {
                let c = SET[(next() % SET.len() as u64) as usize] as char;
                // A `%` starts an escape git would decode: give it one.
                if c == '%' {
                    s.push_str("%41");
                } else {
                    s.push(c);
                }
            }
            s
        };
        let (user, pass) = (word(i), word(i + 5));
        let scheme = ["http", "https", "ssh"][i as usize % 3];
        let port = [1u16, 9, w.server.port][i as usize % 3];
        let url = format!("{scheme}://{user}:{pass}@127.0.0.1:{port}/o{i}.git");
        for args in [
            &["cache", "publish", "art", "--dry-run", "--remote", &url][..],
            &[
                "cache",
                "publish",
                "art",
                "--dry-run",
                "--json",
                "--remote",
                &url,
            ],
            &["cache", "restore", "art", "--json", "--remote", &url],
            &["cache", "verify", "art", "--remote", &url],
        ] {
            let r = w.xtask(args);
            if args.contains(&"--dry-run") {
                assert_eq!(r.code(), 0, "{}", show(&r.out));
                assert!(r.stdout().contains("127.0.0.1"), "{}", show(&r.out));
            } else {
                assert_ne!(r.code(), 0, "{}", show(&r.out));
            }
        }
        secrets.push(user);
        secrets.push(pass);
    }
    for (what, text) in &w.said {
        for s in &secrets {
            assert!(!text.contains(s.as_str()), "{what} shows {s}:\n{text}");
        }
    }
}

/// Never: a token in a remote URL's query string (`?access_token=...`,
/// `&X-Amz-Signature=...`, any parameter named for a secret) reaches any
/// output, whether the command plans, prints the remote or fails to
/// connect and quotes git's own error (git prints the URL whole).
#[test]
fn query_string_secrets_in_remote_urls_never_reach_any_output() {
    let mut w = World::new(Where::Helper);
    let names = [
        "access_token",
        "token",
        "private_token",
        "X-Amz-Signature",
        "sig",
        "api_key",
        "client_secret",
        "password",
    ];
    let mut secrets = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let secret = random_secret(100 + i as u64);
        let port = [1u16, w.server.port][i % 2];
        let url = format!("http://127.0.0.1:{port}/origin.git?ref=main&{name}={secret}");
        for args in [
            &[
                "cache",
                "publish",
                "art",
                "--dry-run",
                "--json",
                "--remote",
                &url,
            ][..],
            &["cache", "restore", "art", "--json", "--remote", &url],
            &["cache", "verify", "art", "--remote", &url],
            &["cache", "status", "art", "--remote", &url],
        ] {
            w.xtask(args);
        }
        secrets.push(secret);
    }
    assert!(
        w.said.iter().any(|(_, t)| t.contains("=***")),
        "no redaction was seen at all"
    );
    for (what, text) in &w.said {
        for s in &secrets {
            assert!(!text.contains(s.as_str()), "{what} shows {s}:\n{text}");
        }
    }
}
