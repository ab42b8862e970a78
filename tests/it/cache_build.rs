//! `[build]`, `cache build`, and a restore's write-back on a miss: a key no
//! branch holds is built here, then published where this machine may (HEAD
//! on origin, gates green, a signing key the policy allows), and otherwise
//! installed and stamped built-not-published, with the command to run said
//! in the table and `restore status`. Real git, a real `git daemon`, real
//! ssh-keygen keys; the build is a shell command that counts its runs in a
//! file outside the repository.

use crate::trust::{key_path, set_trust};
use crate::util::fixture::Fixture;
use crate::util::rng::Rng;
use crate::util::tree::{Detail, snapshot};
use crate::util::{Run, run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};

const CACHE: &str = "tool";

/// The cache `tool`: keyed by the git tree of `src/`, built by copying
/// `src/tool.sh` into `bin/tool` (and counting the build in `builds.log`
/// beside the repository), packed from `build/out`, restored into
/// `restored/tool`, gated on `check`; `build` is extra `[build]` lines.
fn manifest(build: &str) -> String {
    format!(
        r#"[[key]]
name = "src"
git_tree = ["src"]

[pack]
root = "build/out"

[publish]
gates = ["check"]

[restore]
path = "restored/tool"

[ready]
path = "bin/tool"

[build]
command = ["sh", "-c", "test ! -e src/fail && echo build >> ../builds.log && mkdir -p \"$WARMSTART_BUILD_OUT/bin\" && cp src/tool.sh \"$WARMSTART_BUILD_OUT/bin/tool\""]
inputs = ["src"]
timeout = "30s"
{build}
"#
    )
}

const RESTORE_TOML: &str =
    "[[step]]\nname = \"tool\"\nkind = \"cache\"\ncache = \"tool\"\nbackground = true\n";

/// `work` with the cache, its gate and restore.toml committed and pushed
/// to origin (served by git daemon), keys `ci` and `evil` made, and the
/// trust root committed with `policy` and `ci` allowed.
fn world(policy: Option<&str>, build: &str) -> Fixture {
    let fx = Fixture::served();
    for name in ["ci", "evil"] {
        fx.env.ssh_key(name);
    }
    fx.write("cache-manifests/tool.toml", &manifest(build));
    fx.write("cache-manifests/restore.toml", RESTORE_TOML);
    fx.write(
        "cache-manifests/gates.toml",
        "[[gate]]\nname = \"check\"\ncommand = [\"true\"]\ntimeout = \"30s\"\n",
    );
    fx.write("src/tool.sh", "#!/bin/sh\necho tool 1\n");
    fx.write(".gitignore", "/build/\n/restored/\n");
    set_trust(&fx, policy, &["ci"], "");
    fx.env.git("work", ["push", "-q", "-u", "origin", "main"]);
    fx
}

fn builds(fx: &Fixture) -> usize {
    std::fs::read_to_string(fx.env.join("builds.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// `restore --strict --json` in `dir` (background steps in the foreground,
/// so the build is done when it returns), with `signing` as
/// WARMSTART_SIGNING_KEY when given.
fn restore(fx: &Fixture, dir: &str, signing: Option<&Path>) -> (Run, Value) {
    let mut cmd = fx.env.xtask_in(dir);
    cmd.args(["restore", "--strict", "--json"]);
    if let Some(k) = signing {
        cmd.env("WARMSTART_SIGNING_KEY", k);
    }
    let r = run(&mut cmd);
    let v = serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("--json output is JSON ({e}): {}", show(&r.out)));
    (r, v)
}

fn row(v: &Value) -> &Value {
    &v["steps"][0]
}

fn gates_run(fx: &Fixture, dir: &str) {
    run(fx.env.xtask_in(dir).args(["gates", "run"])).ok();
}

fn remote_has_key(fx: &Fixture) -> bool {
    let refs = fx.origin_git(&["for-each-ref", "--format=%(refname)"]);
    if !refs.contains("refs/heads/tool-cache") {
        return false;
    }
    let json = fx.origin_git(&["show", "tool-cache:warmstart.json"]);
    let m: Value = serde_json::from_str(&json).unwrap();
    m["keys"].as_object().is_some_and(|k| !k.is_empty())
}

fn installed(fx: &Fixture, dir: &str) -> String {
    std::fs::read_to_string(fx.env.join(dir).join("restored/tool/bin/tool")).unwrap_or_default()
}

/// Moves the built stamp's last look at the branch back by more than its
/// `build.recheck`.
fn age_stamp(fx: &Fixture) {
    let p = fx.work.join(".git/warmstart/cache/stamps/tool.json");
    let mut s = stamp(fx, "work");
    let at = s["built"]["checked_at_ms"].as_u64().unwrap();
    s["built"]["checked_at_ms"] = (at - 3_700_000).into();
    std::fs::write(p, serde_json::to_string_pretty(&s).unwrap()).unwrap();
}

fn stamp(fx: &Fixture, dir: &str) -> Value {
    let p: PathBuf = fx
        .env
        .join(dir)
        .join(".git/warmstart/cache/stamps/tool.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

/// A miss builds: the branch has no key, the gates are not green here, so
/// the build is installed, stamped built-not-published, and the row (and
/// `restore status`) says what to run; the next restore is warm with no
/// build and no network.
#[test]
fn a_miss_builds_installs_and_says_it_is_not_published() {
    let fx = world(None, "on_miss = true");
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1);
    assert_eq!(installed(&fx, "work"), "#!/bin/sh\necho tool 1\n");
    let first = row(&v);
    assert_eq!(first["state"], "warned", "{first:#}");
    assert!(
        first["what"].as_str().unwrap().contains("(built in "),
        "{first:#}"
    );
    let warning = first["warnings"][0].as_str().unwrap();
    for want in ["not published", "warmstart cache publish tool", "check"] {
        assert!(warning.contains(want), "{want:?} not in {warning}");
    }
    assert!(!remote_has_key(&fx), "published with gates not green");
    let s = stamp(&fx, "work");
    assert_eq!(s["layout"], "built");
    assert!(
        s["built"]["unpublished"]
            .as_str()
            .unwrap()
            .contains("cache publish tool")
    );

    // Warm: no build, and the table still says it.
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1, "a warm restore built again");
    assert_eq!(row(&v)["state"], "warned", "{:#}", row(&v));
    assert!(
        row(&v)["warnings"][0]
            .as_str()
            .unwrap()
            .contains("not published")
    );
    let table = run(fx.env.xtask_in("work").arg("restore")).ok();
    assert!(
        table.stdout().contains("not published"),
        "{}",
        table.stdout()
    );
    let list = run(fx
        .env
        .xtask_in("work")
        .args(["cache", "list", "--offline", "--json"]))
    .ok();
    let list: Value = serde_json::from_str(&list.stdout()).unwrap();
    let local = &list["caches"][0]["local"];
    assert_eq!(local["state"], "built", "{list:#}");
    assert!(
        local["why"]
            .as_str()
            .unwrap()
            .contains("cache publish tool"),
        "{list:#}"
    );
    let status = run(fx.env.xtask_in("work").args(["restore", "status"])).ok();
    assert!(
        status.stdout().contains("warned") && status.stdout().contains("cache publish tool"),
        "{}",
        status.stdout()
    );
}

/// A gated machine with an allowed signing key publishes what it built,
/// installs it from the branch, and a second fresh clone restores it with
/// no build.
#[test]
fn a_gated_signing_machine_publishes_and_a_fresh_clone_restores_without_building() {
    let fx = world(Some("require"), "on_miss = true");
    gates_run(&fx, "work");
    let ci = key_path(&fx, "ci");
    let (r, v) = restore(&fx, "work", Some(&ci));
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1);
    let first = row(&v);
    assert_eq!(first["state"], "done", "{first:#}");
    assert!(
        first["what"]
            .as_str()
            .unwrap()
            .contains("published it to tool-cache@"),
        "{first:#}"
    );
    assert!(remote_has_key(&fx));
    assert_eq!(
        stamp(&fx, "work")["layout"],
        "v1",
        "installed from the branch"
    );
    assert!(stamp(&fx, "work").get("built").is_none());

    fx.env.git(".", ["clone", "-q", fx.url.as_str(), "fresh"]);
    let (r, v) = restore(&fx, "fresh", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1, "the fresh clone built instead of restoring");
    assert_eq!(row(&v)["state"], "done", "{:#}", row(&v));
    assert!(row(&v)["what"].as_str().unwrap().contains("restored tool-"));
    assert_eq!(installed(&fx, "fresh"), "#!/bin/sh\necho tool 1\n");
}

/// Under `require`, a machine without a signing key, or with one that is
/// not an allowed signer (gates green, HEAD pushed either way), builds and
/// installs but does not publish, and prints the command with the signing
/// key it needs.
#[test]
fn an_unsigned_machine_under_require_does_not_publish_and_prints_the_command() {
    for (signer, why) in [(None, "no signing key"), (Some("evil"), "is not trusted")] {
        let fx = world(Some("require"), "on_miss = true");
        gates_run(&fx, "work");
        let key = signer.map(|s| key_path(&fx, s));
        let (r, v) = restore(&fx, "work", key.as_deref());
        assert_eq!(r.code(), 0, "{}", show(&r.out));
        assert_eq!(builds(&fx), 1);
        assert!(!remote_has_key(&fx), "{signer:?}: published under require");
        let warning = row(&v)["warnings"][0].as_str().unwrap().to_string();
        for want in [
            why,
            "warmstart cache publish tool --signing-key",
            "allowed_signers",
        ] {
            assert!(warning.contains(want), "{want:?} not in {warning}");
        }
        assert_eq!(installed(&fx, "work"), "#!/bin/sh\necho tool 1\n");
    }
}

/// In a plain `restore`, the build runs in the background worker: the
/// command returns, and `restore status` shows the build's row once the
/// worker is done.
#[test]
fn a_plain_restore_builds_in_the_background_worker() {
    let fx = world(None, "on_miss = true");
    run(fx.env.xtask_in("work").arg("restore")).ok();
    let t = std::time::Instant::now();
    let status = loop {
        let r = run(fx
            .env
            .xtask_in("work")
            .args(["restore", "status", "--json"]))
        .ok();
        let v: Value = serde_json::from_str(&r.stdout()).unwrap();
        if row(&v)["state"] == "warned" || t.elapsed().as_secs() > 30 {
            break v;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(row(&status)["state"], "warned", "{status:#}");
    assert!(
        row(&status)["what"]
            .as_str()
            .unwrap()
            .contains("not published"),
        "{status:#}"
    );
    assert_eq!(builds(&fx), 1);
}

/// Where the manifest says not to (`build.platforms` leaves this machine
/// out, or no `on_miss`), a miss builds nothing and fails open as before.
#[test]
fn a_miss_never_builds_where_the_manifest_says_not_to() {
    let fx = world(None, "on_miss = true");
    fx.write(
        "cache-manifests/restore.toml",
        &RESTORE_TOML.replace("true", "false"),
    );
    fx.env
        .git("work", ["commit", "-q", "-am", "a foreground step"]);
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 11, "{}", show(&r.out));
    assert_eq!(builds(&fx), 0, "a foreground step built");
    let what = row(&v)["what"].as_str().unwrap();
    assert!(
        what.contains("background = true") && what.contains("cache build tool"),
        "{what}"
    );
    for build in [
        "on_miss = true\nplatforms = [\"nowhere-os\"]",
        "on_miss = false",
        "",
    ] {
        let fx = world(None, build);
        let (r, v) = restore(&fx, "work", None);
        assert_eq!(r.code(), 11, "{build}: {}", show(&r.out));
        assert_eq!(builds(&fx), 0, "{build}: built");
        assert_eq!(row(&v)["state"], "failed", "{build}: {:#}", row(&v));
        if build.contains("platforms") {
            let what = row(&v)["what"].as_str().unwrap();
            assert!(what.contains("build.platforms"), "{what}");
        }
        assert!(!fx.work.join("restored/tool").exists());
    }
}

/// `cache build` into the pack root; a build that fails or passes its
/// timeout leaves the pack root as it was (exit 11), a manifest without
/// `[build]` is exit 10.
#[test]
fn cache_build_replaces_the_pack_root_only_after_the_build_succeeded() {
    let fx = world(None, "");
    let r = fx.xtask(&["cache", "build", CACHE]).ok();
    assert!(
        r.stdout().contains("warmstart cache publish tool"),
        "{}",
        show(&r.out)
    );
    let built = fx.work.join("build/out/bin/tool");
    assert_eq!(
        std::fs::read_to_string(&built).unwrap(),
        "#!/bin/sh\necho tool 1\n"
    );

    let before = snapshot(&fx.work.join("build/out"), Detail::EXTRACTED);
    for (cmd, timeout, code) in [
        (
            "echo half > \\\"$WARMSTART_BUILD_OUT/half\\\"; exit 3",
            "30s",
            11,
        ),
        (
            "echo half > \\\"$WARMSTART_BUILD_OUT/half\\\"; sleep 30",
            "1s",
            11,
        ),
        ("true", "30s", 10),
    ] {
        let text = manifest("")
            .replace(
                "command = [\"sh\", \"-c\", \"test",
                &format!("command = [\"sh\", \"-c\", \"{cmd}; test"),
            )
            .replace("timeout = \"30s\"", &format!("timeout = \"{timeout}\""));
        let text = if code == 10 {
            text.split("[build]").next().unwrap().to_string()
        } else {
            text
        };
        fx.write("cache-manifests/tool.toml", &text);
        let r = fx.xtask(&["cache", "build", CACHE]).expect_code(code);
        let err = r.stderr();
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        if code == 11 {
            assert!(err.contains("is as it was"), "{err}");
        } else {
            assert!(err.contains("no [build] table"), "{err}");
        }
        let after = snapshot(&fx.work.join("build/out"), Detail::EXTRACTED);
        assert_eq!(before, after, "{cmd}: the pack root changed");
    }
}

/// Until a recheck finds the key, a built install stays warm and is not
/// built again (the recheck finds the pack root still holding it); once
/// someone published the key, the recheck installs it from the branch and
/// the warning goes. A write-back build that fails leaves the install and
/// its stamp as they were. The recheck is made due by moving the stamp's
/// `checked_at_ms` back an hour, as the clock would.
#[test]
fn a_recheck_rebuilds_nothing_and_installs_the_key_once_it_is_published() {
    let fx = world(None, "on_miss = true\nrecheck = \"1h\"");
    let (r, _) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    age_stamp(&fx);
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1, "the recheck built again");
    assert_eq!(row(&v)["state"], "warned", "{:#}", row(&v));
    assert!(
        row(&v)["what"].as_str().unwrap().contains("built earlier"),
        "{:#}",
        row(&v)
    );

    // Someone publishes the key (here, this clone once its gates are green).
    gates_run(&fx, "work");
    fx.xtask(&["cache", "publish", CACHE, "--quiet"]).ok();
    let (_, v) = restore(&fx, "work", None);
    assert_eq!(row(&v)["state"], "warned", "warm until the recheck is due");
    age_stamp(&fx);
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(row(&v)["state"], "done", "{:#}", row(&v));
    assert!(row(&v).get("warnings").is_none(), "{:#}", row(&v));
    assert_eq!(stamp(&fx, "work")["layout"], "v1");
    assert_eq!(builds(&fx), 1);

    // A new key whose build fails: the old install and stamp stay.
    let before = (
        snapshot(&fx.work.join("restored/tool"), Detail::EXTRACTED),
        stamp(&fx, "work"),
    );
    fx.write("src/fail", "");
    fx.env.git("work", ["add", "-A"]);
    fx.env
        .git("work", ["commit", "-q", "-m", "a key whose build fails"]);
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 11, "{}", show(&r.out));
    let what = row(&v)["what"].as_str().unwrap();
    assert!(what.contains("the build of cache tool exited 1"), "{what}");
    let after = (
        snapshot(&fx.work.join("restored/tool"), Detail::EXTRACTED),
        stamp(&fx, "work"),
    );
    assert_eq!(before, after, "a failed write-back touched the install");
}

/// Never a half-built pack root: generated hostile builds (writing junk,
/// links out, background children, removing or replacing the staging
/// directory, then exiting nonzero, killing themselves, or running past the
/// timeout) each leave the pack root exactly as it was, with one line of
/// error and no staging directory behind; one that exits 0 with its
/// staging directory whole replaces the pack root with exactly that.
#[test]
fn a_hostile_build_never_leaves_a_half_built_pack_root() {
    let fx = world(None, "");
    fx.xtask(&["cache", "build", CACHE]).ok();
    let pack = fx.work.join("build/out");
    let mut rng = Rng(0x5eed_b11d);
    let mut ends = std::collections::BTreeSet::new();
    for case in 0..14 {
        let mut script = Vec::new();
        let mut files = Vec::new();
        for i in 0..1 + rng.below(4) {
            match rng.below(4) {
                0 | 1 => {
                    script.push(format!("echo {case}.{i} > $WARMSTART_BUILD_OUT/f{i}"));
                    files.push(format!("f{i}"));
                }
                2 => script.push(format!("ln -s /etc $WARMSTART_BUILD_OUT/l{i}")),
                _ => script.push("(sleep 30 &)".to_string()),
            }
        }
        let staging_gone = rng.chance(20);
        if staging_gone {
            script.push(
                (*rng.pick(&[
                    "rm -rf $WARMSTART_BUILD_OUT",
                    "rm -rf $WARMSTART_BUILD_OUT && touch $WARMSTART_BUILD_OUT",
                ]))
                .to_string(),
            );
        }
        let end = *rng.pick(&[
            "exit 0",
            "exit 0",
            "exit 7",
            "kill -9 $$",
            "kill -TERM $$",
            "sleep 30",
        ]);
        script.push(end.to_string());
        ends.insert((end, staging_gone));
        let cmd = script.join("; ");
        let text = manifest("")
            .replace(
                &manifest("")[manifest("").find("command = ").unwrap()
                    ..manifest("").find("inputs = ").unwrap()],
                &format!("command = [\"sh\", \"-c\", \"{cmd}\"]\n"),
            )
            // Only the build meant to pass its timeout gets a short one: the
            // others must never be cut by a slow machine.
            .replace(
                "timeout = \"30s\"",
                if end == "sleep 30" {
                    "timeout = \"1s\""
                } else {
                    "timeout = \"30s\""
                },
            );
        fx.write("cache-manifests/tool.toml", &text);
        let before = snapshot(&pack, Detail::EXTRACTED);
        let r = fx.xtask(&["cache", "build", CACHE]);
        let ok = end == "exit 0" && !staging_gone;
        let listing: Vec<String> = std::fs::read_dir(fx.work.join("build"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(listing, ["out"], "case {case} `{cmd}` left {listing:?}");
        if ok {
            assert_eq!(r.code(), 0, "case {case} `{cmd}`: {}", show(&r.out));
            let mut names: Vec<String> = std::fs::read_dir(&pack)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with('f'))
                .collect();
            names.sort();
            files.sort();
            files.dedup();
            assert_eq!(names, files, "case {case} `{cmd}`");
        } else {
            assert_ne!(r.code(), 0, "case {case} `{cmd}` succeeded");
            assert_eq!(
                r.stderr().trim().lines().count(),
                1,
                "case {case}: {}",
                r.stderr()
            );
            assert_eq!(
                before,
                snapshot(&pack, Detail::EXTRACTED),
                "case {case} `{cmd}`"
            );
        }
    }
    assert!(
        ends.len() >= 6,
        "the seed exercised too few endings: {ends:?}"
    );
}

/// A `cache build` killed outright (SIGKILL, which it cannot catch) takes
/// the build with it, leaves the pack root as it was, and the next build
/// clears the staging directory it left.
#[test]
fn a_killed_cache_build_takes_its_build_with_it_and_leaves_the_pack_root() {
    let fx = world(None, "");
    fx.xtask(&["cache", "build", CACHE]).ok();
    let pack = fx.work.join("build/out");
    let before = snapshot(&pack, Detail::EXTRACTED);
    let text = manifest("").replace(
        "\"test ! -e src/fail",
        "\"echo half > $WARMSTART_BUILD_OUT/half; echo $$ > ../build.pid; exec sleep 30; test ! -e src/fail",
    );
    fx.write("cache-manifests/tool.toml", &text);
    let mut child = fx
        .command(&["cache", "build", CACHE])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid_file = fx.env.join("build.pid");
    let t = std::time::Instant::now();
    while !pid_file.exists() && t.elapsed().as_secs() < 10 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(100));
    let build_pid: i32 = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let (status, _) = crate::util::signal_and_wait(&mut child, libc::SIGKILL);
    assert!(!status.success());
    let t = std::time::Instant::now();
    // SAFETY: signal 0 only asks whether the process exists.
    while unsafe { libc::kill(build_pid, 0) } == 0 && t.elapsed().as_secs() < 5 {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_ne!(
        unsafe { libc::kill(build_pid, 0) },
        0,
        "the build outlived warmstart"
    );
    assert_eq!(
        before,
        snapshot(&pack, Detail::EXTRACTED),
        "the pack root changed"
    );

    fx.write("cache-manifests/tool.toml", &manifest(""));
    fx.xtask(&["cache", "build", CACHE]).ok();
    let listing: Vec<String> = std::fs::read_dir(fx.work.join("build"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(listing, ["out"], "the killed build's staging stayed");
}

/// CI publishes only what is missing, building it first: `cache publish
/// --missing` on a key the branch lacks runs `[build]` once and publishes
/// it signed; the re-run finds the key trusted and builds, packs and pushes
/// nothing. On a machine whose HEAD is not on origin, the publish is
/// refused before the build runs, not after it.
#[test]
fn publish_missing_builds_only_the_key_the_remote_lacks() {
    let fx = world(Some("require"), "");
    gates_run(&fx, "work");
    let publish = |dir: &str| {
        let mut cmd = fx.env.xtask_in(dir);
        cmd.args(["cache", "publish", CACHE, "--missing", "--json"])
            .env("WARMSTART_SIGNING_KEY", key_path(&fx, "ci"));
        run(&mut cmd)
    };
    let r = publish("work");
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["status"], "published", "{v:#}");
    assert_eq!(builds(&fx), 1, "the missing key was not built once");
    assert!(remote_has_key(&fx));
    let tip = fx.origin_git(&["rev-parse", "tool-cache"]);

    let r = publish("work");
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["status"], "present", "{v:#}");
    assert_eq!(builds(&fx), 1, "a present key was built again");
    assert_eq!(fx.origin_git(&["rev-parse", "tool-cache"]), tip);

    // A new key (src changed) from a commit origin does not have.
    fx.write("src/tool.sh", "#!/bin/sh\necho tool 2\n");
    fx.env.git("work", ["commit", "-qam", "tool 2"]);
    let r = publish("work");
    assert_eq!(r.code(), 9, "{}", show(&r.out));
    assert!(r.stderr().contains("push it first"), "{}", show(&r.out));
    assert_eq!(builds(&fx), 1, "built before the refusal: {}", show(&r.out));
    assert_eq!(fx.origin_git(&["rev-parse", "tool-cache"]), tip);
}

/// `--missing` cannot yet tell whether a registry cache needs its build, so
/// a registry cache with `[build]` is refused (exit 10, naming the commands
/// to run) rather than published from whatever the pack root holds.
#[test]
fn publish_missing_of_a_registry_cache_with_a_build_is_refused_not_published_stale() {
    let fx = world(None, "");
    let text = manifest("").replace(
        "[pack]",
        "[cache]\nregistry = \"127.0.0.1:9/team/tool\"\n\n[pack]",
    );
    fx.write("cache-manifests/tool.toml", &text);
    std::fs::create_dir_all(fx.work.join("build/out/bin")).unwrap();
    std::fs::write(fx.work.join("build/out/bin/tool"), "stale\n").unwrap();
    let r = run(fx.env.xtask_in("work").args([
        "cache",
        "publish",
        CACHE,
        "--missing",
        "--allow-unpushed",
    ]));
    assert_eq!(r.code(), 10, "{}", show(&r.out));
    let err = r.stderr();
    assert!(
        err.contains("cache build tool") && err.contains("without --missing"),
        "{err}"
    );
    assert_eq!(builds(&fx), 0);
}

/// `manifest(build)` with its build command replaced by `sh -c script`.
fn manifest_running(script: &str, build: &str) -> String {
    let command = serde_json::to_string(&["sh", "-c", script]).unwrap();
    manifest(build)
        .lines()
        .map(|l| {
            if l.starts_with("command = ") {
                format!("command = {command}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Regression (a poisoned key): a build during which HEAD moves (here the
/// build itself commits and pushes a change to its input, then makes the
/// new tree's gates green) made v1's output, and publishing it would file
/// it under v2's key. It is installed here, not published, and the stamp
/// says why.
#[test]
fn a_build_during_which_head_moves_is_not_published_under_the_new_key() {
    let script = "echo build >> ../builds.log && mkdir -p \"$WARMSTART_BUILD_OUT/bin\" && cp src/tool.sh \"$WARMSTART_BUILD_OUT/bin/tool\" \
        && printf '#!/bin/sh\\necho tool 2\\n' > src/tool.sh && git commit -q -am v2 && git push -q origin main && \"$WS_BIN\" gates run";
    let fx = world(None, "on_miss = true");
    fx.write(
        "cache-manifests/tool.toml",
        &manifest_running(script, "on_miss = true"),
    );
    fx.env
        .git("work", ["commit", "-q", "-am", "build moves HEAD"]);
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    gates_run(&fx, "work");
    let mut cmd = fx.env.xtask_in("work");
    cmd.args(["restore", "--strict", "--json"])
        .env("WS_BIN", crate::util::bin());
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1);
    assert_eq!(
        fx.env.git("work", ["log", "-1", "--format=%s"]).trim(),
        "v2",
        "the build did not move HEAD"
    );
    assert!(
        !remote_has_key(&fx),
        "v1's build was published under v2's key"
    );
    let why = stamp(&fx, "work")["built"]["unpublished"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(why.contains("HEAD moved during the build"), "{why}");
}

/// Regression (a poisoned key): an uncommitted edit under an input is
/// built here and installed, but never published under the clean tree's
/// key, so a clean clone builds (or restores) the committed input instead.
#[test]
fn an_uncommitted_input_is_built_here_but_never_published_under_the_clean_key() {
    let fx = world(None, "on_miss = true");
    gates_run(&fx, "work");
    fx.write("src/tool.sh", "#!/bin/sh\necho dirty\n");
    fx.write("src/new-file.sh", "untracked\n");
    let (r, v) = restore(&fx, "work", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(builds(&fx), 1);
    assert_eq!(installed(&fx, "work"), "#!/bin/sh\necho dirty\n");
    assert!(!remote_has_key(&fx), "the dirty build was published");
    let why = stamp(&fx, "work")["built"]["unpublished"]
        .as_str()
        .unwrap()
        .to_string();
    for want in ["inputs differ from HEAD", "src/tool.sh", "src/new-file.sh"] {
        assert!(why.contains(want), "{want:?} not in {why}");
    }
    let warning = row(&v)["warnings"][0].as_str().unwrap_or_default();
    assert!(warning.contains("inputs differ from HEAD"), "{:#}", row(&v));

    fx.env.git(".", ["clone", "-q", fx.url.as_str(), "fresh"]);
    let (r, _) = restore(&fx, "fresh", None);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_eq!(installed(&fx, "fresh"), "#!/bin/sh\necho tool 1\n");
}

/// Regression (data loss): a `[build]` swaps its output in for the whole
/// pack root, so generated hostile manifests (a pack root that is or holds
/// the repository, its git dir, warmstart's state, HOME or an input,
/// lexically or through a symlink; `[pack] include`/`exclude`; `on_miss`
/// under merge or overlay) are each refused, exit 10, on one line naming
/// the manifest, and nothing in the repository or HOME changes.
#[test]
fn a_build_whose_pack_root_is_not_its_own_is_refused_and_touches_nothing() {
    let fx = world(None, "");
    std::os::unix::fs::symlink(&fx.work, fx.env.join("link-to-work")).unwrap();
    std::os::unix::fs::symlink(".", fx.work.join("here")).unwrap();
    std::os::unix::fs::symlink(fx.env.home(), fx.work.join("build-home")).unwrap();
    let work = fx.work.display().to_string();
    let roots = [
        ".".to_string(),
        "./".into(),
        "..".into(),
        "src".into(),
        "src/..".into(),
        "./src/".into(),
        "build/../src".into(),
        "~".into(),
        "$HOME".into(),
        "${HOME}".into(),
        "~/..".into(),
        ".git".into(),
        ".git/warmstart".into(),
        "/".into(),
        work.clone(),
        format!("{work}/."),
        "../link-to-work".into(),
        format!("{}/link-to-work", fx.env.path().display()),
        "here".into(),
        "here/src".into(),
        "build-home".into(),
        "cache-manifests/..".into(),
    ];
    let safe = ["build/out", "~/.local", "out"];
    let mut rng = Rng(0x5eed_b01d);
    let detail = Detail::default();
    let before = (snapshot(&fx.work, detail), snapshot(&fx.env.home(), detail));
    for case in 0..40 {
        // Every case is hostile in at least one way.
        let bad_root = case < roots.len() || rng.chance(50);
        let root = if bad_root {
            rng.pick(&roots).clone()
        } else {
            rng.pick(&safe).to_string()
        };
        let mut pack = format!("root = {root:?}");
        let mut mode = "";
        let mut build = "";
        let which = rng.below(4);
        if !bad_root || rng.chance(30) {
            match which {
                0 => pack.push_str("\ninclude = [\"out/**\"]"),
                1 => pack.push_str("\nexclude = [\"*.o\"]"),
                2 => {
                    mode = "mode = \"merge\"";
                    build = "on_miss = true";
                }
                _ => {
                    mode = "mode = \"overlay\"";
                    build = "on_miss = true";
                }
            }
        }
        let text = manifest(build)
            .replace("root = \"build/out\"", &pack)
            .replace(
                "path = \"restored/tool\"",
                &format!("path = \"restored/tool\"\n{mode}"),
            );
        fx.write("cache-manifests/tool.toml", &text);
        let snap = (snapshot(&fx.work, detail), snapshot(&fx.env.home(), detail));
        let r = run(fx.env.xtask_in("work").args(["cache", "build", CACHE]));
        assert_eq!(r.code(), 10, "case {case}: {text}\n{}", show(&r.out));
        let err = r.stderr();
        assert_eq!(err.trim().lines().count(), 1, "case {case}: {err}");
        assert!(err.contains("tool.toml"), "case {case}: {err}");
        let after = (snapshot(&fx.work, detail), snapshot(&fx.env.home(), detail));
        assert!(snap == after, "case {case} changed the tree: {text}");
    }
    fx.write("cache-manifests/tool.toml", &manifest(""));
    let after = (snapshot(&fx.work, detail), snapshot(&fx.env.home(), detail));
    assert!(before == after, "the hostile cases left the tree changed");
}

/// Pins read HEAD, the build reads the work tree: `--missing` on a tree
/// whose inputs differ from HEAD is refused (exit 9, naming the paths)
/// before it builds, and nothing is published under the clean key.
#[test]
fn publish_missing_on_a_dirty_input_is_refused_before_it_builds() {
    let fx = world(Some("require"), "");
    // The gates call *.log noise, so the tree is green for them: the
    // inputs check is what must refuse.
    fx.write(
        "cache-manifests/gates.toml",
        "ignore = [\"**/*.log\"]\n\n[[gate]]\nname = \"check\"\ncommand = [\"true\"]\ntimeout = \"30s\"\n",
    );
    fx.env.git("work", ["commit", "-qam", "ignore logs"]);
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    gates_run(&fx, "work");
    fx.write("src/notes.log", "an untracked file among the inputs\n");
    let r = run(fx
        .env
        .xtask_in("work")
        .args(["cache", "publish", CACHE, "--missing"])
        .env("WARMSTART_SIGNING_KEY", key_path(&fx, "ci")));
    assert_eq!(r.code(), 9, "{}", show(&r.out));
    let err = r.stderr();
    assert!(
        err.contains("src/notes.log") && err.contains("not built"),
        "{err}"
    );
    assert_eq!(builds(&fx), 0, "built a dirty tree for CI");
    assert!(!remote_has_key(&fx));
}
