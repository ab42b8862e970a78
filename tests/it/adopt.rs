//! Adopting warmstart in another repository: messages that name the command
//! the user ran, `init` and its generated files, and second repositories (an
//! xtask crate of their own, and the standalone binary) restored through the
//! generated bootstrap script with no compiler.

use crate::util::{TestEnv, run};
use std::path::{Path, PathBuf};

/// A copy of the real binary at `rel` (inside the test directory).
fn copy_bin(env: &TestEnv, rel: &str) -> PathBuf {
    let to = env.join(rel);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(crate::util::bin(), &to).unwrap();
    to
}

/// The hint of a missing cache manifest, as `exe` prints it when run in
/// `cwd` with `CARGO` set (as it is for every child of any cargo process).
fn missing_cache_hint(env: &TestEnv, exe: &Path, cwd: &Path, vars: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["cache", "restore", "nosuch"]).current_dir(cwd);
    env.isolate(&mut cmd);
    cmd.env("CARGO", "/usr/bin/cargo")
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let r = run(&mut cmd).expect_code(4);
    let err = r.stderr();
    assert!(err.contains("no cache manifest"), "{err}");
    err
}

/// A workspace `w/` (a repository with a Cargo.toml) to run copies of the binary in.
fn workspace(env: &TestEnv) -> PathBuf {
    let w = env.work_repo("w");
    std::fs::write(w.join("Cargo.toml"), "[workspace]\n").unwrap();
    std::fs::create_dir_all(w.join("cache-manifests")).unwrap();
    w
}

#[test]
fn adopt_messages_say_cargo_xtask_only_for_a_binary_in_the_workspace_target() {
    let env = TestEnv::new();
    let w = workspace(&env);
    // `cargo run` of an xtask crate: CARGO set, the executable in w/target.
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let err = missing_cache_hint(&env, &xtask, &w, &[]);
    assert!(err.contains("`cargo xtask cache list`"), "{err}");
}

#[test]
fn adopt_messages_name_the_binary_outside_the_target_dir_even_with_cargo_set() {
    let env = TestEnv::new();
    let w = workspace(&env);
    let standalone = copy_bin(&env, "tools-bin/warmstart");
    let err = missing_cache_hint(&env, &standalone, &w, &[]);
    assert!(err.contains("`warmstart cache list`"), "{err}");
    assert!(!err.contains("cargo xtask"), "{err}");
    // CARGO_TARGET_DIR elsewhere: w/target is not the target directory then.
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let elsewhere = env.join("elsewhere").display().to_string();
    let mut cmd = std::process::Command::new(&xtask);
    cmd.args(["cache", "restore", "nosuch"]).current_dir(&w);
    env.isolate(&mut cmd);
    cmd.env("CARGO", "/usr/bin/cargo")
        .env("CARGO_TARGET_DIR", &elsewhere);
    let err = run(&mut cmd).expect_code(4).stderr();
    assert!(err.contains("`xtask cache list`"), "{err}");
    assert!(!err.contains("cargo xtask"), "{err}");
}

#[test]
fn adopt_messages_follow_the_command_setting() {
    let env = TestEnv::new();
    let w = workspace(&env);
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let err = missing_cache_hint(&env, &xtask, &w, &[("WARMSTART_COMMAND", "just ws")]);
    assert!(err.contains("`just ws cache list`"), "{err}");
    // Help names it too.
    let mut cmd = std::process::Command::new(&xtask);
    cmd.arg("--help").current_dir(&w);
    env.isolate(&mut cmd);
    cmd.env("WARMSTART_COMMAND", "just ws");
    let out = run(&mut cmd).ok().stdout();
    assert!(out.contains("Usage: just ws <COMMAND>"), "{out}");
}

/// The tidy check of this repository: every file `init` generates is here
/// and current (this repository runs the same bootstrap script and workflow).
#[test]
fn adopt_tidy_init_check_passes_on_this_repository() {
    let env = TestEnv::new();
    let mut cmd = std::process::Command::new(crate::util::bin());
    cmd.args(["init", "--check"])
        .current_dir(crate::util::source_root());
    env.isolate(&mut cmd);
    let r = run(&mut cmd).ok();
    let out = r.stdout();
    for f in [
        "tools/warmstart-bootstrap.sh",
        ".github/workflows/gates.yml",
        "cache-manifests/example.toml.sample",
    ] {
        assert!(out.contains(&format!("current   {f}")), "{out}");
    }
}

// ------------------------------------------------------------------ init

/// Runs the real binary in `cwd` (relative to the test directory).
fn ws(env: &TestEnv, cwd: &str, args: &[&str]) -> crate::util::Run {
    run(env.xtask_in(cwd).args(args))
}

#[test]
fn adopt_init_is_idempotent_leaves_edits_alone_and_check_finds_stale_files() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let out = ws(&env, "r", &["init"]).ok().stdout();
    let generated = [
        "cache-manifests/warmstart-bin.toml",
        "cache-manifests/restore.toml",
        "cache-manifests/example.toml.sample",
        "tools/warmstart-bootstrap.sh",
        ".github/workflows/gates.yml",
    ];
    for f in generated {
        assert!(out.contains(&format!("created   {f}")), "{out}");
    }
    assert!(
        out.contains("registry step"),
        "says the registry step is omitted: {out}"
    );
    assert!(out.contains("postCreateCommand"), "{out}");
    let snapshot = |files: &[&str]| -> Vec<Vec<u8>> {
        files
            .iter()
            .map(|f| std::fs::read(repo.join(f)).unwrap())
            .collect()
    };
    let before = snapshot(&generated);
    let settings_before = std::fs::read(repo.join(".claude/settings.json")).unwrap();

    // Idempotent: a second run changes no byte and says so.
    let out = ws(&env, "r", &["init"]).ok().stdout();
    for f in generated {
        assert!(out.contains(&format!("current   {f}")), "{out}");
    }
    assert_eq!(snapshot(&generated), before);
    assert_eq!(
        std::fs::read(repo.join(".claude/settings.json")).unwrap(),
        settings_before
    );
    ws(&env, "r", &["init", "--check"]).ok();

    // An edited file is the user's: reported, never rewritten, not a failure.
    let script = repo.join("tools/warmstart-bootstrap.sh");
    let mut edited = std::fs::read_to_string(&script).unwrap();
    edited.push_str("# my own line\n");
    std::fs::write(&script, &edited).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("yours     (edited since init wrote it"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), edited);
    let out = ws(&env, "r", &["init", "--check"]).ok().stdout();
    assert!(out.contains("yours"), "{out}");

    // Stale: what an older generator wrote (its digest matches its body).
    let sample = repo.join("cache-manifests/example.toml.sample");
    std::fs::write(
        &sample,
        warmstart::init::generated::render("# an older example\n"),
    )
    .unwrap();
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(
        r.stdout()
            .contains("stale     cache-manifests/example.toml.sample")
    );
    assert!(
        r.stderr()
            .contains("cache-manifests/example.toml.sample; regenerate with `warmstart init`"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(&sample).unwrap(),
        warmstart::init::generated::render("# an older example\n"),
        "--check writes nothing"
    );
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("updated   cache-manifests/example.toml.sample"),
        "{out}"
    );
    assert_eq!(std::fs::read(&sample).unwrap(), before[2]);

    // Missing is stale too.
    std::fs::remove_file(repo.join(".github/workflows/gates.yml")).unwrap();
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(r.stdout().contains("missing   .github/workflows/gates.yml"));
    ws(&env, "r", &["init"]).ok();
    ws(&env, "r", &["init", "--check"]).ok();
    // The workflow is this repository's own, byte for byte below its header.
    let (_, body) = warmstart::init::generated::split(
        &std::fs::read_to_string(repo.join(".github/workflows/gates.yml")).unwrap(),
    );
    assert_eq!(
        body,
        std::fs::read_to_string(crate::util::source_root().join(".github/workflows/gates.yml"))
            .unwrap()
    );
}

#[test]
fn adopt_init_merges_the_session_hook_only_into_a_file_it_understands() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let settings = repo.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let theirs = r#"{
  "permissions": {"allow": ["Bash(ls)"]},
  "hooks": {"SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "echo hi", "timeout": 5}]}]}
}"#;
    std::fs::write(&settings, theirs).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("merged    .claude/settings.json"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(v["permissions"]["allow"][0], "Bash(ls)");
    let starts = v["hooks"]["SessionStart"].as_array().unwrap();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["hooks"][0]["command"], "echo hi");
    assert!(
        starts[1]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .contains("tools/warmstart-bootstrap.sh --background")
    );
    let merged = std::fs::read(&settings).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("current   .claude/settings.json"), "{out}");
    assert_eq!(std::fs::read(&settings).unwrap(), merged, "merged once");

    // Shapes init does not know: the file stays byte for byte, the entry is printed.
    for odd in [
        r#"{"hooks": {"SessionStart": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}"#,
        r#"{"hooks": {"SessionStart": {"not": "a list"}}}"#,
        r#"{"hooks": []}"#,
        r#"[1, 2]"#,
        "{ not json",
    ] {
        std::fs::write(&settings, odd).unwrap();
        let out = ws(&env, "r", &["init"]).ok().stdout();
        assert!(
            out.contains("add this entry to hooks.SessionStart by hand"),
            "{odd}: {out}"
        );
        assert_eq!(std::fs::read_to_string(&settings).unwrap(), odd);
    }
}
