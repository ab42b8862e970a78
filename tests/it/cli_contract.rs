//! What every command promises people: `--quiet` silences progress and
//! informational lines but never an error, `--help` ends with examples in
//! the command as it was run, and `restore` names a failed step once.

use crate::util::{TestEnv, run, show};

fn write(env: &TestEnv, rel: &str, text: &str) {
    let path = env.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// `work` with one gate that prints a marker, committed (clean tree).
fn gated_work(env: &TestEnv) {
    env.work_repo("work");
    write(
        env,
        "work/cache-manifests/gates.toml",
        "[[gate]]\nname = \"loud\"\ncommand = \"echo gate-output-marker\"\n",
    );
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "gates"]);
}

#[test]
fn quiet_silences_gate_output_and_headers_but_not_the_report() {
    let env = TestEnv::new();
    gated_work(&env);
    // Without --quiet the gate's output and header go to stderr: what the
    // quiet run below must not show.
    let r = run(env.xtask_in("work").args(["gates", "run", "--no-record"])).ok();
    assert!(
        r.stderr().contains("gate-output-marker"),
        "{}",
        show(&r.out)
    );
    assert!(r.stderr().contains("==> gate loud"), "{}", show(&r.out));
    for quiet in ["--quiet", "-q"] {
        let r = run(env
            .xtask_in("work")
            .args(["gates", "run", "--no-record", quiet]))
        .ok();
        assert_eq!(r.stderr(), "", "{quiet}: {}", show(&r.out));
        // The summary is the command's output, not chatter.
        assert!(r.stdout().contains("loud"), "{}", show(&r.out));
    }
    // A global flag: accepted before the subcommand too.
    let r = run(env
        .xtask_in("work")
        .args(["--quiet", "gates", "run", "--no-record"]))
    .ok();
    assert_eq!(r.stderr(), "", "{}", show(&r.out));
}

#[test]
fn quiet_still_prints_errors() {
    let env = TestEnv::new();
    env.work_repo("work");
    for args in [
        &["cache", "restore", "nope", "--quiet"][..],
        &["gates", "status", "-q"],
        &["restore", "--quiet"],
        &["resume", "touch", "nobody", "--quiet", "--path", "idx.json"],
    ] {
        let r = run(env.xtask_in("work").args(args));
        assert_ne!(r.code(), 0, "{args:?}: {}", show(&r.out));
        let stderr = r.stderr();
        let lines: Vec<&str> = stderr.lines().collect();
        assert!(
            lines.len() == 1 && lines[0].starts_with("error: "),
            "{args:?}: {}",
            show(&r.out)
        );
    }
}

#[test]
fn every_help_ends_with_examples_in_the_command_as_run() {
    let env = TestEnv::new();
    for (args, first) in [
        (&["--help"][..], "warmstart cache restore"),
        (&["cache", "restore", "--help"], "warmstart cache restore"),
        (&["gates", "push", "-h"], "warmstart gates push"),
        (
            &["resume", "resume-cmd", "--help"],
            "warmstart resume resume-cmd",
        ),
        (&["restore", "status", "--help"], "warmstart restore status"),
    ] {
        let r = run(env.xtask().args(args)).ok();
        let out = r.stdout();
        let tail = out
            .split("\nExamples:\n")
            .nth(1)
            .unwrap_or_else(|| panic!("{args:?}: no examples\n{out}"));
        assert!(tail.trim_start().starts_with(first), "{args:?}: {tail}");
    }
    // An adopter's name for the command is the one the examples use.
    let r = run(env
        .xtask()
        .env("WARMSTART_COMMAND", "just ws")
        .args(["cache", "verify", "--help"]))
    .ok();
    assert!(
        r.stdout().contains("\nExamples:\n  just ws cache verify "),
        "{}",
        r.stdout()
    );
    assert!(
        !r.stdout().contains("warmstart cache verify"),
        "{}",
        r.stdout()
    );
}

/// The regression: `step bin failed: step bin: cache manifest ...`.
#[test]
fn restore_names_a_failed_step_once() {
    let env = TestEnv::new();
    env.work_repo("work");
    write(
        &env,
        "work/cache-manifests/restore.toml",
        "[[step]]\nname = \"bin\"\nkind = \"cache\"\ncache = \"nope\"\n",
    );
    let r = run(env.xtask_in("work").args(["restore", "--strict"])).expect_code(11);
    let err = r.stderr();
    let last = err.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: step bin failed: "),
        "{}",
        show(&r.out)
    );
    assert_eq!(last.matches("step bin").count(), 1, "{last}");
    assert!(!err.contains("step bin:"), "{err}");
    // The table row, without the name in its text either.
    let r = run(env.xtask_in("work").args(["restore", "--json"])).ok();
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    let what = v["steps"][0]["what"].as_str().unwrap();
    assert!(!what.contains("step bin"), "{what}");
    assert!(what.contains("nope"), "{what}");
}
