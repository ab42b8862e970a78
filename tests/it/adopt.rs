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
