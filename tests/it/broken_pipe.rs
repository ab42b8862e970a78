//! A reader that goes away (`cargo xtask ... --json | head -c1`) ends every
//! report command quietly with status 0, as ripgrep does: no panic, no
//! exit 101, nothing on stderr.
//!
//! The deterministic case gives the command a pipe whose read end is already
//! closed, so its first write fails with EPIPE whatever the output's size;
//! each command is also run with a live pipe to show it does print (so the
//! closed-pipe run is not passing on silence). A shell pipeline into
//! `head -c1` checks the real thing with output larger than a pipe buffer.

use crate::util::{Run, TestEnv, run, show, source_root};
use std::process::Command;

/// A repository with a cache manifest, gates.toml, restore.toml (run once,
/// so `restore status` has rows) and a resume index with an entry.
fn world() -> TestEnv {
    let env = TestEnv::new();
    env.work_repo("r");
    let m = env.join("r/cache-manifests");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(
        m.join("c.toml"),
        "[pack]\nroot = \"out\"\n[restore]\npath = \"dest\"\n",
    )
    .unwrap();
    std::fs::write(
        m.join("gates.toml"),
        "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
    )
    .unwrap();
    std::fs::write(
        m.join("restore.toml"),
        "[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"touch made\"\ncreates = \"made\"\n",
    )
    .unwrap();
    std::fs::write(env.join("r/.gitignore"), "made\n").unwrap();
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "manifests"]);
    run(env.xtask_in("r").arg("restore")).ok();
    run(env.xtask_in("r").args([
        "resume",
        "--path",
        "../index.json",
        "record",
        "s1",
        "sess",
        "r",
    ]))
    .ok();
    env
}

/// Every report command, text and `--json`.
fn report_commands() -> Vec<Vec<String>> {
    let conda = source_root()
        .join("tests/fixtures/conda/wsfixture-1.2.3-h0_0.conda")
        .display()
        .to_string();
    let idx = ["resume", "--path", "../index.json", "list"];
    let mut all: Vec<Vec<&str>> = vec![
        vec!["cache", "list", "--offline"],
        vec!["cache", "status", "--offline"],
        vec!["gates", "status"],
        vec!["restore", "status"],
        vec!["restore", "--dry-run"],
        idx.to_vec(),
        vec!["conda", "info", &conda],
    ];
    let json: Vec<Vec<&str>> = all
        .iter()
        .map(|a| a.iter().copied().chain(["--json"]).collect())
        .collect();
    all.extend(json);
    // `lookup` always prints JSON (docs/reference/json.md), and takes no `--json`.
    all.push(vec!["resume", "--path", "../index.json", "lookup", "s1"]);
    all.into_iter()
        .map(|a| a.into_iter().map(String::from).collect())
        .collect()
}

/// Runs `cmd` with stdout on a pipe nobody reads any more.
fn with_closed_stdout(cmd: &mut Command) -> Run {
    let (reader, writer) = std::io::pipe().expect("a pipe");
    drop(reader);
    cmd.stdout(writer);
    let out = cmd.output().expect("spawning xtask");
    Run { out }
}

#[test]
fn every_report_command_ends_quietly_with_0_when_stdout_is_closed() {
    let env = world();
    for args in report_commands() {
        let live = run(env.xtask_in("r").args(&args));
        assert_eq!(
            live.code(),
            0,
            "{args:?} with a reader\n{}",
            show(&live.out)
        );
        assert!(!live.stdout().is_empty(), "{args:?} prints something");

        let closed = with_closed_stdout(env.xtask_in("r").args(&args));
        assert_eq!(
            closed.code(),
            0,
            "{args:?} on a closed pipe\n{}",
            show(&closed.out)
        );
        assert_eq!(closed.stderr(), "", "{args:?} says nothing on stderr");
    }
}

#[test]
fn a_pipeline_into_head_ends_with_0_and_no_panic() {
    let env = world();
    // Enough entries that the output outgrows any pipe buffer, so xtask is
    // still writing when `head` has gone (written directly, in the index's
    // own format: 1500 `resume record` runs would take seconds).
    let entries: serde_json::Map<String, serde_json::Value> = (0..1500)
        .map(|i| {
            let id = format!("surface-{i:04}-{}", "x".repeat(40));
            let e = serde_json::json!({
                "surfaceId": id, "sessionId": "sess", "repo": "r", "role": null,
                "captured_at": 1_796_000_000_000u64 + i, "last_active": 1_796_000_000_000u64 + i,
            });
            (id, e)
        })
        .collect();
    let index = serde_json::json!({"version": 1, "entries": entries});
    std::fs::write(
        env.join("index.json"),
        serde_json::to_string_pretty(&index).unwrap() + "\n",
    )
    .unwrap();
    for args in [
        "resume --path ../index.json list --json",
        "cache list --offline --json",
        "gates status --json",
        "restore status --json",
    ] {
        let script =
            format!("\"$XTASK\" {args} | head -c1 >/dev/null; echo \"status=${{PIPESTATUS[0]}}\"");
        let mut cmd = Command::new("bash");
        cmd.current_dir(env.join("r"))
            .env("XTASK", crate::util::bin())
            .args(["-c", &script]);
        env.isolate(&mut cmd);
        let r = run(&mut cmd);
        assert!(r.stdout().contains("status=0"), "{args}: {}", show(&r.out));
        assert!(!r.stderr().contains("panicked"), "{args}: {}", r.stderr());
        assert!(
            !r.stderr().contains("Broken pipe"),
            "{args}: {}",
            r.stderr()
        );
    }
}
