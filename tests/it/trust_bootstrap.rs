//! The generated bootstrap (`tools/warmstart-bootstrap.sh`) under a trust
//! policy: it checks a binary cache's signed statement with `ssh-keygen -Y
//! verify` before it decompresses a byte, using only git, coreutils, zstd
//! and ssh-keygen, and refuses each attack of tests/it/trust.rs, going on
//! to its next fallback and saying why. Real keys, a real `git daemon`.

use crate::trust::{edit_manifest, sha256_hex};
use crate::util::git_daemon::GitDaemon;
use crate::util::{Run, TestEnv, run, show, source_root};
use std::path::{Path, PathBuf};
use std::process::Command;

const TRUSTED: &str = "#!/bin/sh\necho \"trusted tool $*\"\n";

struct Bx {
    env: TestEnv,
    daemon: GitDaemon,
    repo: PathBuf,
}

impl Bx {
    /// Repository `a` with the generated bootstrap, a binary cache `tool`
    /// (its executable a shell script, in 20 kB chunks), policy require
    /// with `ci` the one allowed signer; and `att`, an attacker's clone
    /// with the same manifest, policy off, its own `tool`.
    fn new() -> Bx {
        let env = TestEnv::new();
        std::fs::create_dir_all(env.join("srv")).unwrap();
        env.bare_remote("srv/origin.git");
        let daemon = GitDaemon::start(&env.join("srv"));
        let url = daemon.url("origin.git");
        for name in ["ci", "evil"] {
            env.ssh_key(name);
        }
        for repo in ["a", "att"] {
            env.work_repo(repo);
            env.git(repo, ["remote", "add", "origin", &url]);
            let tools = env.join(repo).join("tools");
            std::fs::create_dir_all(&tools).unwrap();
            std::fs::copy(
                source_root().join("tools/warmstart-bootstrap.sh"),
                tools.join("warmstart-bootstrap.sh"),
            )
            .unwrap();
        }
        let bx = Bx {
            repo: env.join("a"),
            env,
            daemon,
        };
        bx.tool("a", TRUSTED);
        bx.tool("att", "#!/bin/sh\necho \"EVIL tool $*\"\n");
        for repo in ["a", "att"] {
            bx.manifest(repo, "");
        }
        let ci = std::fs::read_to_string(bx.key("ci").with_extension("pub")).unwrap();
        let dir = bx.repo.join("cache-manifests");
        std::fs::write(dir.join("trust.toml"), "policy = \"require\"\n").unwrap();
        std::fs::write(dir.join("allowed_signers"), format!("ci {ci}")).unwrap();
        for repo in ["a", "att"] {
            bx.env.git(repo, ["add", "-A"]);
            bx.env.git(repo, ["commit", "-q", "-m", "binary cache"]);
        }
        bx
    }

    fn key(&self, name: &str) -> PathBuf {
        self.env.join(format!("keys/{name}"))
    }

    /// The executable `repo` packs, with 60 kB of noise (several chunks).
    fn tool(&self, repo: &str, script: &str) {
        let src = self.env.join(format!("src-{repo}"));
        std::fs::create_dir_all(&src).unwrap();
        let exe = src.join("tool");
        std::fs::write(&exe, script).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        crate::util::tree::write_pseudo_random(&src.join("noise.bin"), 60_000, script.len() as u64);
    }

    fn manifest(&self, repo: &str, extra: &str) {
        let dir = self.env.join(repo).join("cache-manifests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("tool.toml"),
            format!(
                "[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\n{extra}\n[restore]\npath = \"inst/tool\"\n\n[bootstrap]\nexec = \"tool\"\n",
                self.env.join(format!("src-{repo}")).display()
            ),
        )
        .unwrap();
    }

    fn publish(&self, repo: &str, signer: Option<&str>, more: &[&str]) -> Run {
        let key = signer.map(|s| self.key(s));
        let mut cmd = self.env.xtask_in(repo);
        cmd.args(["cache", "publish", "tool", "--quiet"]);
        if let Some(k) = &key {
            cmd.arg("--signing-key").arg(k);
        }
        run(cmd.args(more))
    }

    /// Runs the bootstrap cold (its warm stamp removed), binary cache only.
    fn bootstrap(&self, path: Option<&Path>) -> Run {
        let _ = std::fs::remove_file(self.repo.join(".git/warmstart/bootstrap/tool.key"));
        let mut cmd = Command::new("bash");
        cmd.arg(self.repo.join("tools/warmstart-bootstrap.sh"))
            .arg("--prebuilt-only")
            .current_dir(&self.repo);
        self.env.isolate(&mut cmd);
        if let Some(p) = path {
            cmd.env("PATH", p);
        }
        run(&mut cmd)
    }

    fn installed(&self) -> String {
        std::fs::read_to_string(self.repo.join("inst/tool/tool")).unwrap()
    }

    /// Refused: not run, the trusted install as it was, `why` said, and
    /// the next fallback reached (compile, skipped by --prebuilt-only).
    fn refused(&self, what: &str, why: &str) {
        let r = self.bootstrap(None);
        assert_ne!(r.code(), 0, "{what}: ran\n{}", show(&r.out));
        assert!(
            !r.stdout().contains("EVIL"),
            "{what}: ran the attacker's tool\n{}",
            show(&r.out)
        );
        assert!(
            r.stderr().contains(why),
            "{what}: does not say {why:?}\n{}",
            show(&r.out)
        );
        assert!(
            r.stderr().contains("compile: skipped (--prebuilt-only)"),
            "{what}: no fallback\n{}",
            show(&r.out)
        );
        assert_eq!(self.installed(), TRUSTED, "{what}: the install changed");
    }

    /// The attacker rewrites the branch with plain git (a fresh root commit).
    fn tamper(&self, edit: impl FnOnce(&Path)) {
        let dir = self.env.join("tamper");
        let _ = std::fs::remove_dir_all(&dir);
        self.env.git(".", ["init", "-q", "tamper"]);
        let url = self.daemon.url("origin.git");
        self.env.git("tamper", ["fetch", "-q", &url, "tool-cache"]);
        self.env
            .git("tamper", ["checkout", "-q", "--orphan", "x", "FETCH_HEAD"]);
        edit(&dir);
        self.env.git("tamper", ["add", "-A"]);
        self.env.git("tamper", ["commit", "-q", "-m", "tampered"]);
        self.env.git(
            "tamper",
            ["push", "-q", "-f", &url, "HEAD:refs/heads/tool-cache"],
        );
    }
}

/// A PATH of every tool of /usr/bin and /bin but ssh-keygen.
fn path_without_ssh_keygen(env: &TestEnv) -> PathBuf {
    let dir = env.join("no-ssh-keygen");
    std::fs::create_dir_all(&dir).unwrap();
    for bin in ["/usr/bin", "/bin", "/usr/local/bin"] {
        let Ok(rd) = std::fs::read_dir(bin) else {
            continue;
        };
        for e in rd.flatten() {
            let name = e.file_name();
            if name == "ssh-keygen" || dir.join(&name).exists() {
                continue;
            }
            let _ = std::os::unix::fs::symlink(e.path(), dir.join(&name));
        }
    }
    dir
}

#[test]
fn the_bootstrap_runs_only_a_signed_binary_cache_and_refuses_every_attack() {
    let bx = Bx::new();
    bx.publish("a", Some("ci"), &[]).ok();
    let r = bx.bootstrap(None).ok();
    assert!(
        r.stdout().contains("trusted tool restore"),
        "{}",
        show(&r.out)
    );
    assert!(
        r.stderr().contains("binary cache: tool-1 is signed by ci"),
        "{}",
        show(&r.out)
    );

    // Without ssh-keygen, policy require: the binary cache is refused, saying why.
    let no_keygen = path_without_ssh_keygen(&bx.env);
    let r = bx.bootstrap(Some(&no_keygen));
    assert_ne!(r.code(), 0, "{}", show(&r.out));
    assert!(
        r.stderr().contains("needs ssh-keygen") && r.stderr().contains("compile: skipped"),
        "{}",
        show(&r.out)
    );

    // Signed by a key the repository does not allow, then with an
    // allowed_signers naming it placed on the branch.
    bx.publish("att", Some("evil"), &[]).ok();
    bx.refused(
        "untrusted signer",
        "not signed by an allowed signer (signer seen: SHA256:",
    );
    let evil = std::fs::read_to_string(bx.key("evil").with_extension("pub")).unwrap();
    bx.tamper(|d| std::fs::write(d.join("allowed_signers"), format!("ci {evil}")).unwrap());
    bx.refused(
        "allowed_signers on the branch",
        "not signed by an allowed signer",
    );
    // Unsigned.
    bx.tamper(|d| {
        std::fs::remove_file(d.join("tool-1.statement")).unwrap();
        std::fs::remove_file(d.join("tool-1.statement.sig")).unwrap();
    });
    bx.refused("unsigned", "is unsigned");

    // A trusted branch with two chunks swapped, checksums made to agree.
    bx.publish("a", Some("ci"), &[]).ok();
    bx.tamper(|d| {
        let (a, b) = (
            d.join("tool-1.tar.zst.part000"),
            d.join("tool-1.tar.zst.part001"),
        );
        let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        std::fs::write(&a, &bb).unwrap();
        std::fs::write(&b, &ba).unwrap();
        edit_manifest(d, "tool-1", |e| {
            let c = e["chunks"].as_array_mut().unwrap();
            c[0]["sha256"] = sha256_hex(&bb).into();
            c[0]["size"] = bb.len().into();
            c[1]["sha256"] = sha256_hex(&ba).into();
            c[1]["size"] = ba.len().into();
        });
    });
    bx.refused("swapped chunks", "sha256sum -c failed");

    // A valid old statement and signature replayed onto the attacker's tree.
    bx.publish("a", Some("ci"), &[]).ok();
    let old = bx.env.join("old");
    bx.tamper(|d| {
        std::fs::create_dir_all(&old).unwrap();
        for f in ["tool-1.statement", "tool-1.statement.sig"] {
            std::fs::copy(d.join(f), old.join(f)).unwrap();
        }
    });
    bx.publish("att", None, &[]).ok();
    bx.tamper(|d| {
        for f in ["tool-1.statement", "tool-1.statement.sig"] {
            std::fs::copy(old.join(f), d.join(f)).unwrap();
        }
    });
    bx.refused("replayed statement", "sha256sum -c failed");

    // Validly signed, but published --allow-ungated.
    std::fs::write(
        bx.repo.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"check\"\ncommand = [\"false\"]\ntimeout = \"30s\"\n",
    )
    .unwrap();
    bx.manifest("a", "gates = [\"check\"]\n");
    bx.env.git("a", ["add", "-A"]);
    bx.env.git("a", ["commit", "-q", "-m", "gated"]);
    bx.publish("a", Some("ci"), &["--allow-ungated"]).ok();
    bx.refused("ungated", "--allow-ungated");
}

/// Runs the bootstrap `--prebuilt-only` under a hard limit of its own (a
/// hang fails the test instead of stalling the suite), with `vars` set.
fn bounded_bootstrap(bx: &Bx, vars: &[(&str, &std::ffi::OsStr)]) -> (Run, std::time::Duration) {
    let _ = std::fs::remove_file(bx.repo.join(".git/warmstart/bootstrap/tool.key"));
    let mut cmd = Command::new("timeout");
    cmd.args(["-s", "KILL", "120", "bash"])
        .arg(bx.repo.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&bx.repo);
    bx.env.isolate(&mut cmd);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let t0 = std::time::Instant::now();
    let r = run(&mut cmd);
    (r, t0.elapsed())
}

/// Never: a part, `SHA256SUMS`, the statement or its signature that is
/// not a regular, non-executable blob of the size warmstart.json names is
/// read. Each shape a pusher can give a name on the branch (a symlink to
/// /dev/zero, which `sha256sum` would read forever; a gitlink; a tree; an
/// executable; a blob of another size) is refused in seconds with exit 12
/// under `--prebuilt-only`, naming it, and the install stays as it was.
#[test]
fn a_part_that_is_not_a_regular_blob_of_its_size_is_refused_unread() {
    let bx = Bx::new();
    bx.publish("a", Some("ci"), &[]).ok();
    bx.bootstrap(None).ok();
    // The signed branch as published, put back before each case.
    let url = bx.daemon.url("origin.git");
    bx.env.git(".", ["init", "-q", "--bare", "keep.git"]);
    bx.env
        .git("keep.git", ["fetch", "-q", &url, "+tool-cache:refs/keep"]);
    type Shape = fn(&Path, &str);
    let shapes: [(&str, Shape); 5] = [
        ("a symlink to /dev/zero", |d, f| {
            std::fs::remove_file(d.join(f)).unwrap();
            std::os::unix::fs::symlink("/dev/zero", d.join(f)).unwrap();
        }),
        ("a gitlink", |d, f| {
            std::fs::remove_file(d.join(f)).unwrap();
            let sub = d.join(f);
            std::fs::create_dir_all(&sub).unwrap();
            for args in [
                &["init", "-q"][..],
                &[
                    "-c",
                    "user.name=p",
                    "-c",
                    "user.email=p@x",
                    "commit",
                    "-q",
                    "--allow-empty",
                    "-m",
                    "x",
                ],
            ] {
                assert!(
                    Command::new("git")
                        .args(args)
                        .current_dir(&sub)
                        .status()
                        .unwrap()
                        .success()
                );
            }
        }),
        ("a tree", |d, f| {
            std::fs::remove_file(d.join(f)).unwrap();
            std::fs::create_dir_all(d.join(f)).unwrap();
            std::fs::write(d.join(f).join("x"), "x").unwrap();
        }),
        ("an executable", |d, f| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.join(f), std::fs::Permissions::from_mode(0o755)).unwrap();
        }),
        ("a blob of another size", |d, f| {
            let mut b = std::fs::read(d.join(f)).unwrap();
            b.push(0);
            std::fs::write(d.join(f), b).unwrap();
        }),
    ];
    let mut cases = 0;
    for name in [
        "tool-1.tar.zst.part001",
        "SHA256SUMS",
        "tool-1.statement",
        "tool-1.statement.sig",
    ] {
        for (what, shape) in &shapes {
            // A size of its own is a part's promise only.
            if *what == "a blob of another size" && !name.contains(".part") {
                continue;
            }
            bx.env.git(
                "keep.git",
                ["push", "-q", "-f", &url, "refs/keep:refs/heads/tool-cache"],
            );
            bx.tamper(|d| shape(d, name));
            let (r, took) = bounded_bootstrap(&bx, &[]);
            let case = format!("{name} as {what}");
            assert_eq!(r.code(), 12, "{case}\n{}", show(&r.out));
            assert!(
                took < std::time::Duration::from_secs(60),
                "{case}: took {took:?}"
            );
            assert!(
                r.stderr().contains(&format!("refused: {name} on ")),
                "{case}: not named\n{}",
                show(&r.out)
            );
            assert_eq!(bx.installed(), TRUSTED, "{case}: the install changed");
            cases += 1;
        }
    }
    assert_eq!(cases, 17);
}

/// A step that reads data and never ends (here a `sha256sum` that hangs)
/// runs into the bootstrap's deadline: one line naming the step and the
/// setting, the next fallback, and exit 8 under `--prebuilt-only`.
#[test]
fn a_read_past_its_deadline_ends_the_binary_cache_with_exit_8() {
    let bx = Bx::new();
    bx.publish("a", Some("ci"), &[]).ok();
    let slow = bx.env.join("slow-bin");
    std::fs::create_dir_all(&slow).unwrap();
    let fake = slow.join("sha256sum");
    std::fs::write(&fake, "#!/bin/sh\nexec sleep 300\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", slow.display(), std::env::var("PATH").unwrap());
    let (r, took) = bounded_bootstrap(
        &bx,
        &[
            ("PATH", path.as_ref()),
            ("WARMSTART_BOOTSTRAP_FETCH_TIMEOUT", "3".as_ref()),
        ],
    );
    assert_eq!(r.code(), 8, "{}", show(&r.out));
    assert!(took < std::time::Duration::from_secs(60), "took {took:?}");
    assert!(
        r.stderr().contains("sha256sum -c of tool-1 ran past 3s")
            && r.stderr().contains("compile: skipped (--prebuilt-only)"),
        "{}",
        show(&r.out)
    );
}

/// The trust root is HEAD's committed tree: a `[trust] policy = "off"`
/// written into the work tree's manifest and never committed changes
/// nothing; the unsigned key a pusher published is still refused.
#[test]
fn an_uncommitted_policy_off_never_lets_the_bootstrap_take_an_unsigned_key() {
    let bx = Bx::new();
    bx.publish("a", Some("ci"), &[]).ok();
    bx.bootstrap(None).ok();
    bx.publish("att", None, &[]).ok();
    let m = bx.repo.join("cache-manifests/tool.toml");
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, format!("{text}\n[trust]\npolicy = \"off\"\n")).unwrap();
    bx.refused("uncommitted policy off", "is unsigned");
}
