//! The `submodules` step's `jobs` and `shallow` against suites served by a real `git daemon` on 127.0.0.1.
//!
//! Local-path submodules are hardlinked and ignore `--depth`, so every suite
//! here is fetched over git://. Each result is compared with what a plain
//! `git submodule update --init` gives in another clone of the same commit.

use crate::util::git_daemon::GitDaemon;
use crate::util::{Run, TestEnv, run};
use serde_json::Value;

const SUITES: [&str; 3] = ["s0", "s1", "s2"];

/// Three suites with five commits each; the superproject records an older
/// commit of `s0` (not a branch tip: a shallow clone must fetch it by id)
/// and the tips of the others. Returns the daemon serving them.
fn setup(env: &TestEnv, reachable_sha1_in_want: bool, step: &str) -> GitDaemon {
    for s in SUITES {
        let bare = env.bare_remote(&format!("srv/{s}.git"));
        env.git(
            &bare,
            [
                "config",
                "uploadpack.allowReachableSHA1InWant",
                if reachable_sha1_in_want {
                    "true"
                } else {
                    "false"
                },
            ],
        );
        let src = env.work_repo(&format!("src-{s}"));
        for c in 1..=5 {
            std::fs::write(
                src.join("data.txt"),
                format!("{s} revision {c}\n").repeat(200),
            )
            .unwrap();
            std::fs::write(src.join("run.sh"), format!("echo {s}\n")).unwrap();
            env.git(&src, ["add", "-A"]);
            env.git(&src, ["commit", "-q", "-m", &format!("revision {c}")]);
        }
        env.git(&src, ["push", "-q", bare.to_str().unwrap(), "main"]);
    }
    let daemon = GitDaemon::start(&env.join("srv"));
    let app = env.work_repo("app");
    for s in SUITES {
        env.git(
            &app,
            [
                "submodule",
                "add",
                "-q",
                &daemon.url(&format!("{s}.git")),
                &format!("vendor/{s}"),
            ],
        );
    }
    env.git(app.join("vendor/s0"), ["checkout", "-q", "HEAD~2"]);
    let dir = app.join("cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("restore.toml"),
        format!(
            "[[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"vendor/s0\", \"vendor/s1\", \"vendor/s2\"]\nsentinel = [{{ suite = \"s0\", path = \"vendor/s0/run.sh\", breaks = \"make test-s0\" }}]\n{step}\n"
        ),
    )
    .unwrap();
    env.git(&app, ["add", "-A"]);
    env.git(&app, ["commit", "-q", "-m", "suites"]);
    daemon
}

fn clone(env: &TestEnv, name: &str) {
    env.git(
        ".",
        ["clone", "-q", env.join("app").to_str().unwrap(), name],
    );
}

fn restore_json(env: &TestEnv, repo: &str) -> (Value, Run) {
    let mut cmd = env.xtask_in(repo);
    cmd.args(["restore", "--json"]);
    let r = run(&mut cmd).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    (v, r)
}

/// What a person sees of the submodules of a clone: status, then per suite
/// its index and each file's bytes, and whether its tree is clean.
fn picture(env: &TestEnv, repo: &str) -> String {
    let mut out = env.git(repo, ["submodule", "status"]);
    for s in SUITES {
        let dir = env.join(repo).join("vendor").join(s);
        out += &env.git(&dir, ["ls-files", "-s"]);
        out += &env.git(&dir, ["status", "--porcelain"]);
        out += &std::fs::read_to_string(dir.join("data.txt")).unwrap();
    }
    out
}

fn depth(env: &TestEnv, repo: &str, suite: &str) -> usize {
    env.git(
        env.join(repo).join("vendor").join(suite),
        ["rev-list", "--count", "HEAD"],
    )
    .trim()
    .parse()
    .unwrap()
}

#[test]
fn shallow_with_jobs_gives_depth_one_and_the_same_checkout_as_a_plain_update() {
    let env = TestEnv::new();
    let _daemon = setup(&env, true, "jobs = 3\nshallow = true");
    clone(&env, "plain");
    env.git("plain", ["submodule", "update", "--init", "-q"]);
    clone(&env, "box");
    let (v, r) = restore_json(&env, "box");
    let row = &v["steps"][0];
    assert_eq!(row["state"], "done", "{v:#}\n{}", r.stderr());
    assert_eq!(
        row["what"],
        "3 submodules initialised (3 at once, shallow), 1 sentinels ok"
    );
    assert_eq!(picture(&env, "box"), picture(&env, "plain"));
    for s in SUITES {
        assert_eq!(depth(&env, "box", s), 1, "{s} is shallow");
    }
    // Five revisions on top of the initial commit; s0 is recorded at HEAD~2.
    assert_eq!(depth(&env, "plain", "s0"), 4);
    assert_eq!(depth(&env, "plain", "s1"), 6);
    let log = std::fs::read_to_string(row["log"].as_str().unwrap()).unwrap();
    assert!(
        log.contains("submodule update --init --jobs 3 --depth 1 -- vendor/s0"),
        "{log}"
    );

    // Without `shallow`, the default: every suite at once, full history.
    clone(&env, "full");
    std::fs::write(
        env.join("full/cache-manifests/restore.toml"),
        "[[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"vendor/s0\", \"vendor/s1\", \"vendor/s2\"]\n",
    )
    .unwrap();
    let (v, _) = restore_json(&env, "full");
    assert_eq!(
        v["steps"][0]["what"], "3 submodules initialised (3 at once), 0 sentinels ok",
        "{v:#}"
    );
    assert_eq!(picture(&env, "full"), picture(&env, "plain"));
    assert_eq!(depth(&env, "full", "s0"), 4);
    assert_eq!(depth(&env, "full", "s2"), 6);
}

#[test]
fn a_refused_shallow_fetch_falls_back_to_a_full_one_and_says_so() {
    let env = TestEnv::new();
    // Protocol v2 serves any reachable commit by id whatever the server's
    // config; a v0 conversation honours `uploadpack.allowReachableSHA1InWant`
    // (off here), as older servers and some hosts do.
    std::fs::write(
        env.home().join(".gitconfig-none"),
        "[protocol]\n\tversion = 0\n",
    )
    .unwrap();
    let _daemon = setup(&env, false, "shallow = true");
    // The refusal is real: git's own shallow update fails here.
    clone(&env, "probe");
    let mut cmd = std::process::Command::new("git");
    cmd.current_dir(env.join("probe"))
        .args(["submodule", "update", "--init", "--depth", "1"]);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unadvertised object"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    clone(&env, "plain");
    env.git("plain", ["submodule", "update", "--init", "-q"]);
    clone(&env, "box");
    let (v, r) = restore_json(&env, "box");
    let row = &v["steps"][0];
    assert_eq!(row["state"], "warned", "{v:#}\n{}", r.stderr());
    let what = row["what"].as_str().unwrap();
    assert!(
        what.starts_with("3 submodules initialised (3 at once, shallow refused for vendor/s0")
            && what.ends_with(": fetched in full), 1 sentinels ok"),
        "{what}"
    );
    let warning = r
        .stderr()
        .lines()
        .find(|l| l.starts_with("WARNING: shallow fetch refused for vendor/s0"))
        .unwrap_or_else(|| panic!("{}", r.stderr()))
        .to_string();
    assert!(
        warning.contains("allowReachableSHA1InWant") && warning.ends_with("fetched in full"),
        "{warning}"
    );
    assert_eq!(picture(&env, "box"), picture(&env, "plain"));
    assert_eq!(depth(&env, "box", "s0"), 4);
    // Warm afterwards: nothing runs again.
    let (v, _) = restore_json(&env, "box");
    assert_eq!(v["steps"][0]["state"], "warm", "{v:#}");
}

#[test]
fn jobs_and_shallow_are_checked_and_shown_by_dry_run() {
    let step = |extra: &str| {
        format!(
            "[[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"a\", \"b\"]\n{extra}\n"
        )
    };
    for (extra, want) in [
        (
            "jobs = 0",
            "`jobs` = 0 must be a number of submodules fetched at once, 1 to 64",
        ),
        ("jobs = 65", "`jobs` = 65 must be"),
        ("jobs = \"many\"", "`jobs` = \"many\" must be"),
        ("jobs = 2.5", "`jobs` = a float must be"),
        (
            "shallow = \"yes\"",
            "`shallow` = \"yes\" must be true or false",
        ),
        ("depth = 1", "depth"),
    ] {
        let env = TestEnv::new();
        env.work_repo("r");
        std::fs::create_dir_all(env.join("r/cache-manifests")).unwrap();
        std::fs::write(env.join("r/cache-manifests/restore.toml"), step(extra)).unwrap();
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "--dry-run"]);
        let r = run(&mut cmd).expect_code(10);
        assert!(
            r.stderr().contains("step 1") && r.stderr().contains(want),
            "{extra}: {}",
            r.stderr()
        );
        assert_eq!(r.stderr().trim_end().lines().count(), 1, "{}", r.stderr());
    }
    let env = TestEnv::new();
    env.work_repo("r");
    std::fs::create_dir_all(env.join("r/cache-manifests")).unwrap();
    std::fs::write(env.join("r/cache-manifests/restore.toml"), step("")).unwrap();
    let mut cmd = env.xtask_in("r");
    cmd.args(["restore", "--dry-run", "--json"]);
    let v: Value = serde_json::from_str(&run(&mut cmd).ok().stdout()).unwrap();
    let d = &v["steps"][0]["detail"];
    assert_eq!(
        (d["jobs"].as_u64(), d["shallow"].as_bool()),
        (Some(2), Some(false))
    );
}
