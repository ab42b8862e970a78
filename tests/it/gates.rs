//! `cargo xtask gates`: records bound to tree ids in real git repositories,
//! real gate processes (timeouts, process groups), records shared through a
//! real bare remote and a real `git daemon`.

use crate::util::git_daemon::GitDaemon;
use crate::util::{Run, TestEnv, run, source_root};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A work repository `work` whose gates.toml is `gates`, committed.
fn setup(env: &TestEnv, gates: &str) {
    env.work_repo("work");
    write(env, "work/cache-manifests/gates.toml", gates);
    commit(env, "work", "gates");
}

fn write(env: &TestEnv, rel: &str, text: &str) {
    let path = env.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn commit(env: &TestEnv, dir: &str, message: &str) {
    env.git(dir, ["add", "-A"]);
    env.git(dir, ["commit", "-q", "-m", message]);
}

/// `cargo xtask <args>` in `dir`.
fn xt(env: &TestEnv, dir: &str, args: &[&str]) -> Run {
    run(env.xtask_in(dir).args(args))
}

fn rev(env: &TestEnv, dir: &str, spec: &str) -> String {
    env.git(dir, ["rev-parse", spec]).trim().to_string()
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", r.stdout()))
}

/// The record stored for `tree` in `dir`, read with plain git.
fn stored(env: &TestEnv, dir: &str, tree: &str) -> Option<Value> {
    let refname = format!("refs/warmstart/gates/{tree}");
    let mut cmd = Command::new("git");
    cmd.current_dir(env.join(dir))
        .args(["cat-file", "blob", &format!("{refname}:gates.json")]);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    out.status
        .success()
        .then(|| serde_json::from_slice(&out.stdout).unwrap())
}

/// git in `work` with `input` on stdin; its trimmed stdout.
fn git_stdin(env: &TestEnv, args: &[&str], input: &str) -> String {
    let mut cmd = Command::new("git");
    cmd.current_dir(env.join("work"))
        .args(args)
        .stdout(Stdio::piped());
    env.isolate(&mut cmd);
    cmd.stdin(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "git {args:?} failed");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A record commit made by hand in `work`, holding `text` as gates.json.
fn record_commit(env: &TestEnv, text: &str) -> String {
    let blob = git_stdin(env, &["hash-object", "-w", "--stdin"], text);
    let listing = format!("100644 blob {blob}\tgates.json\n");
    let tree = git_stdin(env, &["mktree"], &listing);
    env.git("work", ["commit-tree", &tree, "-m", "by hand"])
        .trim()
        .to_string()
}

fn gate_refs(env: &TestEnv, dir: &str) -> String {
    env.git(dir, ["for-each-ref", "refs/warmstart/"])
}

fn not_green_message(tree: &str, missing: &[&str]) -> String {
    format!(
        "error: gates not green for tree {tree}: missing {}; run `warmstart gates run {}`",
        missing.join(", "),
        missing.join(" ")
    )
}

/// Whether a process is running (a zombie is dead: it only waits to be reaped).
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => false,
        Ok(stat) => {
            let state = stat.rsplit_once(')').unwrap().1.trim_start();
            !(state.starts_with('Z') || state.starts_with('X'))
        }
    }
}

/// Waits for a shell's `echo $! > file` to land, and returns the pid.
fn wait_pid(file: &Path, child: &mut std::process::Child) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && text.ends_with('\n')
        {
            return text.trim().parse().unwrap();
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("xtask exited ({status}) before {} appeared", file.display());
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const TWO_GATES: &str = r#"
[[gate]]
name = "ok"
command = "echo ok-gate-ran"

[[gate]]
name = "other"
command = ["true"]
"#;

#[test]
fn a_passing_gate_is_recorded_green_for_the_clean_tree() {
    let env = TestEnv::new();
    setup(&env, TWO_GATES);
    let tree = rev(&env, "work", "HEAD^{tree}");
    let head = rev(&env, "work", "HEAD");
    assert_eq!(stored(&env, "work", &tree), None);

    let r = xt(&env, "work", &["gates", "run", "ok"]).ok();
    assert!(r.stderr().contains("ok-gate-ran"), "{}", r.stderr());
    assert!(r.stdout().contains("ok    passed"), "{}", r.stdout());

    let rec = stored(&env, "work", &tree).expect("a record for HEAD's tree");
    assert_eq!(rec["format"], "warmstart-gates/1");
    assert_eq!(rec["tree"], tree.as_str());
    let ok = &rec["gates"]["ok"];
    assert!(ok["digest"].as_str().unwrap().starts_with("sha256:"));
    assert_eq!(ok["command"], "echo ok-gate-ran");
    assert_eq!(ok["commit"], head.as_str());
    assert!(ok["duration_ms"].is_u64());
    assert!(!ok["host"].as_str().unwrap().is_empty());
    assert_eq!(
        ok["tool"],
        format!("warmstart {}", env!("CARGO_PKG_VERSION")).as_str()
    );
    assert!(ok["finished_at"].as_str().unwrap().ends_with('Z'));
    assert!(rec["gates"].get("other").is_none());

    xt(&env, "work", &["gates", "check", "ok"]).ok();
    let r = xt(&env, "work", &["gates", "check"]).expect_code(9);
    assert_eq!(r.stderr().trim(), not_green_message(&tree, &["other"]));

    // A gate run later for the same tree joins the same record.
    xt(&env, "work", &["gates", "run", "other"]).ok();
    let rec = stored(&env, "work", &tree).unwrap();
    assert_eq!(rec["gates"]["ok"], *ok, "the earlier entry is kept");
    assert!(rec["gates"]["other"].is_object());
    let r = xt(&env, "work", &["gates", "check", "--json"]).ok();
    let v = json(&r);
    assert_eq!(v["green"], true);
    assert_eq!(v["record"]["gates"].as_object().unwrap().len(), 2);

    let s = json(&xt(&env, "work", &["gates", "status", "--json"]).ok());
    assert_eq!(s["tree"], tree.as_str());
    assert_eq!(s["clean"], true);
    assert_eq!(s["green"], true);
    assert_eq!(s["gates"][0]["name"], "ok");
    assert_eq!(s["gates"][0]["state"], "green");
    // Each update is a commit on top of the previous record: nothing rewritten.
    let history = env.git(
        "work",
        [
            "rev-list",
            "--count",
            &format!("refs/warmstart/gates/{tree}"),
        ],
    );
    assert_eq!(history.trim(), "2");
}

#[test]
fn a_dirty_worktree_is_refused_modified_or_untracked() {
    let env = TestEnv::new();
    setup(&env, TWO_GATES);
    let tree = rev(&env, "work", "HEAD^{tree}");

    write(&env, "work/README.md", "edited\n");
    let r = xt(&env, "work", &["gates", "run"]).expect_code(9);
    assert!(
        r.stderr().contains("the worktree is dirty (M README.md)"),
        "{}",
        r.stderr()
    );
    assert!(!r.stderr().contains("ok-gate-ran"), "no gate may run");
    assert_eq!(gate_refs(&env, "work"), "", "nothing recorded");

    env.git("work", ["checkout", "--", "README.md"]);
    // A staged rename is one entry (its source path is not a second one).
    env.git("work", ["mv", "README.md", "RENAMED.md"]);
    let r = xt(&env, "work", &["gates", "run"]).expect_code(9);
    assert!(
        r.stderr()
            .contains("the worktree is dirty (R  RENAMED.md);"),
        "{}",
        r.stderr()
    );
    env.git("work", ["mv", "RENAMED.md", "README.md"]);
    write(&env, "work/notes/new.txt", "untracked\n");
    let r = xt(&env, "work", &["gates", "run"]).expect_code(9);
    assert!(r.stderr().contains("?? notes/new.txt"), "{}", r.stderr());
    assert_eq!(gate_refs(&env, "work"), "");

    // --no-record tests a dirty worktree without recording anything.
    let r = xt(&env, "work", &["gates", "run", "--no-record"]).ok();
    assert!(r.stderr().contains("ok-gate-ran"), "{}", r.stderr());
    assert!(
        r.stdout().contains("nothing was recorded"),
        "{}",
        r.stdout()
    );
    assert_eq!(gate_refs(&env, "work"), "");

    // A green record does not apply to a dirty worktree either.
    std::fs::remove_dir_all(env.join("work/notes")).unwrap();
    xt(&env, "work", &["gates", "run"]).ok();
    xt(&env, "work", &["gates", "check"]).ok();
    write(&env, "work/stray.txt", "x\n");
    let r = xt(&env, "work", &["gates", "check"]).expect_code(9);
    assert!(
        r.stderr().contains(&format!(
            "gates not green for tree {tree}: the worktree is dirty (?? stray.txt)"
        )),
        "{}",
        r.stderr()
    );
}

#[test]
fn ignore_paths_do_not_make_the_worktree_dirty() {
    let env = TestEnv::new();
    setup(
        &env,
        "ignore = [\"scratch\", \"**/*.log\"]\n[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
    );
    write(&env, "work/scratch/deep/x.bin", "x");
    write(&env, "work/sub/run.log", "x");
    xt(&env, "work", &["gates", "run"]).ok();
    xt(&env, "work", &["gates", "check", "ok"]).ok();
    write(&env, "work/sub/other.txt", "x");
    xt(&env, "work", &["gates", "check", "ok"]).expect_code(9);
}

#[test]
fn a_new_commit_with_another_tree_is_not_green_and_a_revert_of_a_revert_is() {
    let env = TestEnv::new();
    setup(&env, TWO_GATES);
    let base_tree = rev(&env, "work", "HEAD^{tree}");

    write(&env, "work/src.txt", "change\n");
    commit(&env, "work", "change");
    let changed = rev(&env, "work", "HEAD");
    let changed_tree = rev(&env, "work", "HEAD^{tree}");
    xt(&env, "work", &["gates", "run"]).ok();
    xt(&env, "work", &["gates", "check"]).ok();

    // Revert: the tree is the base tree, which never ran the gates.
    env.git("work", ["revert", "--no-edit", "HEAD"]);
    assert_eq!(rev(&env, "work", "HEAD^{tree}"), base_tree);
    let r = xt(&env, "work", &["gates", "check"]).expect_code(9);
    assert_eq!(
        r.stderr().trim(),
        not_green_message(&base_tree, &["ok", "other"])
    );
    let s = json(&xt(&env, "work", &["gates", "status", "--json"]).ok());
    assert_eq!(s["gates"][0]["state"], "missing");

    // Revert the revert: a new commit, the gated tree again, so green.
    env.git("work", ["revert", "--no-edit", "HEAD"]);
    assert_ne!(rev(&env, "work", "HEAD"), changed);
    assert_eq!(rev(&env, "work", "HEAD^{tree}"), changed_tree);
    let r = xt(&env, "work", &["gates", "check"]).ok();
    assert!(r.stdout().contains(&changed_tree), "{}", r.stdout());

    // And a commit with another tree is not green.
    write(&env, "work/src.txt", "another change\n");
    commit(&env, "work", "another");
    xt(&env, "work", &["gates", "check", "ok"]).expect_code(9);
}

#[test]
fn a_failing_gate_records_nothing_and_its_output_is_shown() {
    let env = TestEnv::new();
    setup(
        &env,
        r#"
[[gate]]
name = "first"
command = "true"

[[gate]]
name = "bad"
command = "echo the-failure-marker; echo on-stderr >&2; exit 3"

[[gate]]
name = "after"
command = "echo after-ran"
"#,
    );
    let tree = rev(&env, "work", "HEAD^{tree}");
    let r = xt(&env, "work", &["gates", "run", "--json"]).expect_code(11);
    let err = r.stderr();
    // Live, then again as the tail after the failure.
    let shown = err.lines().filter(|l| *l == "the-failure-marker").count();
    assert_eq!(shown, 2, "{err}");
    assert!(err.contains("on-stderr"), "{err}");
    assert!(err.contains("==> gate bad failed: exit status 3"), "{err}");
    assert!(!err.contains("after-ran"), "stops at the first failure");
    assert!(
        err.contains(&format!(
            "error: gates failed for tree {tree}: bad (failed)"
        )),
        "{err}"
    );
    let v = json(&r);
    let results: Vec<(&str, &str, bool)> = v["gates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap(),
                g["result"].as_str().unwrap(),
                g["recorded"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        results,
        [
            ("first", "passed", true),
            ("bad", "failed", false),
            ("after", "not-run", false)
        ]
    );
    let log = v["gates"][1]["log"].as_str().unwrap();
    assert!(
        std::fs::read_to_string(log)
            .unwrap()
            .contains("the-failure-marker")
    );
    let rec = stored(&env, "work", &tree).unwrap();
    let names: Vec<&String> = rec["gates"].as_object().unwrap().keys().collect();
    assert_eq!(names, ["first"], "the failing gate recorded nothing");

    // --keep-going runs the rest; the failure still fails the run.
    let r = xt(&env, "work", &["gates", "run", "--keep-going"]).expect_code(11);
    assert!(r.stderr().contains("after-ran"), "{}", r.stderr());
    assert!(stored(&env, "work", &tree).unwrap()["gates"]["bad"].is_null());
}

/// `sh` whose background grandchild writes its pid to `pidfile`.
fn slow_gate(name: &str, pidfile: &Path, ignore_term: bool) -> String {
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    format!(
        "[[gate]]\nname = \"{name}\"\ncommand = \"{trap}sleep 300 & echo $! > {}; sleep 300\"\ntimeout = \"1s\"\n",
        pidfile.display()
    )
}

#[test]
fn a_gate_past_its_timeout_is_killed_with_its_children_and_reported() {
    let env = TestEnv::new();
    let polite = env.join("polite.pid");
    let stubborn = env.join("stubborn.pid");
    // The second gate ignores SIGTERM (and so does its child): only the
    // SIGKILL after kill_grace can end it.
    setup(
        &env,
        &format!(
            "kill_grace = \"500ms\"\n{}{}",
            slow_gate("polite", &polite, false),
            slow_gate("stubborn", &stubborn, true)
        ),
    );
    let tree = rev(&env, "work", "HEAD^{tree}");
    let started = Instant::now();
    let mut child = env
        .xtask_in("work")
        .args(["gates", "run", "--keep-going"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let first = wait_pid(&polite, &mut child);
    assert!(alive(first), "the grandchild {first} should be running");
    let second = wait_pid(&stubborn, &mut child);
    assert!(alive(second), "the grandchild {second} should be running");
    let r = Run {
        out: child.wait_with_output().unwrap(),
    }
    .expect_code(11);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        !alive(first),
        "grandchild {first} of the timed-out gate lives"
    );
    assert!(
        !alive(second),
        "grandchild {second} that ignores SIGTERM lives"
    );
    let err = r.stderr();
    assert!(
        err.contains("==> gate polite timed-out: timed out after 1.0s; its process group was sent SIGTERM, then SIGKILL after 500ms"),
        "{err}"
    );
    assert!(
        err.contains("polite (timed-out), stubborn (timed-out)"),
        "{err}"
    );
    assert!(r.stdout().contains("polite    timed-out"), "{}", r.stdout());
    assert_eq!(stored(&env, "work", &tree), None);
}

#[test]
fn processes_a_passing_gate_leaves_behind_are_terminated() {
    let env = TestEnv::new();
    let pidfile = env.join("left.pid");
    setup(
        &env,
        &format!(
            "kill_grace = \"1s\"\n[[gate]]\nname = \"leaves\"\ncommand = \"sleep 300 & echo $! > {}\"\n",
            pidfile.display()
        ),
    );
    let r = xt(&env, "work", &["gates", "run", "--json"]).ok();
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!alive(pid), "the left-behind {pid} lives");
    let v = json(&r);
    assert_eq!(v["gates"][0]["result"], "passed");
    assert_eq!(v["gates"][0]["recorded"], true);
    assert!(
        v["gates"][0]["note"]
            .as_str()
            .unwrap()
            .contains("left processes running")
    );
}

/// The gate runner's signals: INT (Ctrl-C), TERM (a CI cancel) and HUP (a
/// closed terminal) are each noted, forwarded to the gate's group, and end
/// the run with exit 11 and no record.
#[test]
fn int_term_and_hup_on_warmstart_stop_the_gate_group_and_record_nothing() {
    for (sig, name) in [
        (libc::SIGINT, "SIGINT"),
        (libc::SIGTERM, "SIGTERM"),
        (libc::SIGHUP, "SIGHUP"),
    ] {
        let env = TestEnv::new();
        let pidfile = env.join("child.pid");
        setup(
            &env,
            &format!(
                "kill_grace = \"1s\"\n[[gate]]\nname = \"long\"\ncommand = \"sleep 300 & echo $! > {}; wait\"\n",
                pidfile.display()
            ),
        );
        let tree = rev(&env, "work", "HEAD^{tree}");
        let mut child = env
            .xtask_in("work")
            .args(["gates", "run"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = wait_pid(&pidfile, &mut child);
        assert!(alive(pid));
        // SAFETY: signalling the xtask process this test spawned.
        unsafe { libc::kill(child.id() as i32, sig) };
        let r = Run {
            out: child.wait_with_output().unwrap(),
        }
        .expect_code(11);
        assert!(!alive(pid), "{name}: the gate's child {pid} outlived it");
        assert!(
            r.stderr().contains(&format!("interrupted by {name}")),
            "{name}: {}",
            r.stderr()
        );
        assert_eq!(stored(&env, "work", &tree), None, "{name}");
    }
}

#[test]
fn a_changed_gate_definition_makes_its_record_stale() {
    let env = TestEnv::new();
    // gates.toml is ignored here so that editing it keeps the tree: the only
    // way the same tree can meet another definition of a gate.
    setup(
        &env,
        "ignore = [\"cache-manifests/gates.toml\"]\n[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
    );
    let tree = rev(&env, "work", "HEAD^{tree}");
    xt(&env, "work", &["gates", "run"]).ok();
    xt(&env, "work", &["gates", "check"]).ok();
    write(
        &env,
        "work/cache-manifests/gates.toml",
        "ignore = [\"cache-manifests/gates.toml\"]\n[[gate]]\nname = \"ok\"\ncommand = \"true\"\nenv = { MODE = \"strict\" }\n",
    );
    let r = xt(&env, "work", &["gates", "check"]).expect_code(9);
    assert_eq!(r.stderr().trim(), not_green_message(&tree, &["ok"]));
    let r = xt(&env, "work", &["gates", "status"]).ok();
    assert!(r.stdout().contains("ok    stale"), "{}", r.stdout());
    // --skip-green does not skip a stale gate.
    let r = xt(&env, "work", &["gates", "run", "--skip-green", "--json"]).ok();
    assert_eq!(json(&r)["gates"][0]["result"], "passed");
    xt(&env, "work", &["gates", "check"]).ok();
    let r = xt(&env, "work", &["gates", "run", "--skip-green", "--json"]).ok();
    assert_eq!(json(&r)["gates"][0]["result"], "already-green");
}

#[test]
fn a_record_pushed_from_one_clone_is_seen_by_another_after_a_fetch() {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    setup(&env, TWO_GATES);
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    env.git("work", ["push", "-q", "origin", "main"]);
    env.git(".", ["clone", "-q", "origin.git", "second"]);
    let tree = rev(&env, "work", "HEAD^{tree}");

    xt(&env, "work", &["gates", "run"]).ok();
    // Not pushed yet: the second clone knows nothing, even after a fetch.
    let r = xt(&env, "second", &["gates", "fetch", "--json"]).ok();
    assert_eq!(json(&r)["result"], "none-on-remote");
    xt(&env, "second", &["gates", "check"]).expect_code(9);

    let r = xt(&env, "work", &["gates", "push", "--json"]).ok();
    assert_eq!(json(&r)["result"], "created");
    let on_remote = env.git("origin.git", ["for-each-ref", "refs/warmstart/"]);
    assert!(
        on_remote.contains(&format!("refs/warmstart/gates/{tree}")),
        "{on_remote}"
    );
    let r = xt(&env, "work", &["gates", "push", "--json"]).ok();
    assert_eq!(json(&r)["result"], "up-to-date");

    // Local only until fetched.
    xt(&env, "second", &["gates", "check"]).expect_code(9);
    let r = xt(&env, "second", &["gates", "fetch"]).ok();
    assert!(
        r.stdout().contains("green here now: ok, other"),
        "{}",
        r.stdout()
    );
    xt(&env, "second", &["gates", "check", "ok", "other"]).ok();
    assert_eq!(
        stored(&env, "second", &tree),
        stored(&env, "work", &tree),
        "the same record"
    );
    // The fetch's landing ref is not left behind.
    assert_eq!(
        gate_refs(&env, "second").lines().count(),
        1,
        "{}",
        gate_refs(&env, "second")
    );
}

#[test]
fn records_of_one_tree_from_two_machines_merge_through_git_daemon() {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    let daemon = GitDaemon::start(env.path());
    let url = daemon.url("origin.git");
    setup(
        &env,
        "[[gate]]\nname = \"a\"\ncommand = \"true\"\n[[gate]]\nname = \"b\"\ncommand = \"true\"\n",
    );
    env.git("work", ["remote", "add", "origin", &url]);
    env.git("work", ["push", "-q", "origin", "main"]);
    env.git(".", ["clone", "-q", &url, "second"]);
    let tree = rev(&env, "work", "HEAD^{tree}");

    // Each machine proves one gate and pushes; the second push merges.
    xt(&env, "work", &["gates", "run", "a"]).ok();
    xt(&env, "second", &["gates", "run", "b"]).ok();
    let r = xt(&env, "work", &["gates", "push", "--json"]).ok();
    assert_eq!(json(&r)["result"], "created");
    let r = xt(&env, "second", &["gates", "push", "--json"]).ok();
    let v = json(&r);
    assert_eq!(v["result"], "updated");
    assert_eq!(v["gates"], serde_json::json!(["a", "b"]));
    // The remote record is a merge of both histories, not a forced rewrite.
    let refname = format!("refs/warmstart/gates/{tree}");
    let parents = env.git("origin.git", ["rev-list", "--parents", "-n1", &refname]);
    assert_eq!(parents.split_whitespace().count(), 3, "{parents}");

    // The first machine sees both after fetching (and check --fetch does it too).
    xt(&env, "work", &["gates", "check", "a", "b"]).expect_code(9);
    xt(&env, "work", &["gates", "check", "--fetch", "a", "b"]).ok();
    assert_eq!(stored(&env, "work", &tree), stored(&env, "second", &tree));
}

#[test]
fn an_unreachable_remote_is_exit_8_and_check_falls_back_to_local_records() {
    let env = TestEnv::new();
    setup(&env, TWO_GATES);
    let tree = rev(&env, "work", "HEAD^{tree}");
    let nowhere = env.join("no-such-remote.git");
    let nowhere = nowhere.to_str().unwrap();
    xt(&env, "work", &["gates", "run", "ok"]).ok();
    let r = xt(&env, "work", &["gates", "fetch", nowhere]).expect_code(8);
    assert!(
        r.stderr().contains("fetching gate records from `/") && r.stderr().contains("failed:"),
        "{}",
        r.stderr()
    );
    let r = xt(&env, "work", &["gates", "push", nowhere]).expect_code(8);
    assert!(r.stderr().contains("no-such-remote.git"), "{}", r.stderr());
    let fetch = format!("--fetch={nowhere}");
    let r = xt(&env, "work", &["gates", "check", &fetch, "ok"]).ok();
    assert!(
        r.stderr().contains("warning: fetching gate records from"),
        "{}",
        r.stderr()
    );
    // A remote that never answers is cut off by the timeout.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!(
        "git://127.0.0.1:{}/x.git",
        listener.local_addr().unwrap().port()
    );
    let started = Instant::now();
    let r = xt(
        &env,
        "work",
        &["gates", "fetch", &silent, "--timeout", "1s"],
    )
    .expect_code(8);
    assert!(
        r.stderr().contains("took longer than 1.0s"),
        "{}",
        r.stderr()
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    drop(listener);
    // The local record is intact after all of it.
    assert!(stored(&env, "work", &tree).unwrap()["gates"]["ok"].is_object());
}

#[test]
fn bad_inputs_get_one_line_errors_and_distinct_codes() {
    let env = TestEnv::new();
    env.work_repo("work");
    // No gates.toml.
    let r = xt(&env, "work", &["gates", "status"]).expect_code(10);
    assert!(
        r.stderr().contains("cache-manifests/gates.toml not found"),
        "{}",
        r.stderr()
    );
    // Invalid gates.toml.
    write(
        &env,
        "work/cache-manifests/gates.toml",
        "[[gate]]\nname = \"x\"\ncomand = \"true\"\n",
    );
    commit(&env, "work", "bad gates");
    let r = xt(&env, "work", &["gates", "run"]).expect_code(10);
    assert!(
        r.stderr().contains("gates.toml is not valid"),
        "{}",
        r.stderr()
    );
    assert!(
        r.stderr().contains("comand"),
        "names the bad key: {}",
        r.stderr()
    );
    // An unknown gate name, in run and in check.
    write(&env, "work/cache-manifests/gates.toml", TWO_GATES);
    commit(&env, "work", "gates");
    for sub in ["run", "check"] {
        let r = xt(&env, "work", &["gates", sub, "nope"]).expect_code(10);
        assert_eq!(
            r.stderr().trim(),
            "error: no gate named `nope` in cache-manifests/gates.toml (defined: ok, other): add it there or fix the name"
        );
    }
    // Nothing to push.
    env.bare_remote("origin.git");
    let r = xt(&env, "work", &["gates", "push", "../origin.git"]).expect_code(4);
    assert!(
        r.stderr().contains("run `warmstart gates run` first"),
        "{}",
        r.stderr()
    );
    // A remote that looks like an option is taken as a (missing) remote.
    let r = xt(
        &env,
        "work",
        &["gates", "fetch", "--", "--upload-pack=touch pwned"],
    )
    .expect_code(8);
    assert!(
        r.stderr().contains("`--upload-pack=touch pwned`"),
        "{}",
        r.stderr()
    );
    assert!(!env.join("work/pwned").exists());
    // A bad duration flag is a usage error.
    xt(&env, "work", &["gates", "fetch", "--timeout", "soon"]).expect_code(2);
    // No commit yet.
    env.git(".", ["init", "-q", "-b", "main", "empty"]);
    write(&env, "empty/cache-manifests/gates.toml", TWO_GATES);
    let r = xt(&env, "empty", &["gates", "run"]).expect_code(4);
    assert!(r.stderr().contains("has no commit yet"), "{}", r.stderr());
    // Outside any repository.
    let r = xt(&env, ".", &["gates", "status"]).expect_code(10);
    assert!(
        r.stderr().contains("not inside a git repository"),
        "{}",
        r.stderr()
    );
}

#[test]
fn an_unreadable_record_is_exit_5_and_is_left_in_place() {
    let env = TestEnv::new();
    setup(&env, TWO_GATES);
    let tree = rev(&env, "work", "HEAD^{tree}");
    let refname = format!("refs/warmstart/gates/{tree}");
    // A record ref that holds garbage (as a hand edit or a bug might leave).
    let c = record_commit(&env, "{\"format\": \"warmstart-gates/1\", \"tree\": ");
    env.git("work", ["update-ref", &refname, &c]);

    for args in [&["gates", "check"][..], &["gates", "status"][..]] {
        let r = xt(&env, "work", args).expect_code(5);
        assert!(
            r.stderr()
                .contains(&format!("gate record {refname} is unreadable")),
            "{}",
            r.stderr()
        );
    }
    assert_eq!(rev(&env, "work", &refname), c, "left in place");
    // Running the gates writes a good record on top; the junk stays in its history.
    let r = xt(&env, "work", &["gates", "run"]).ok();
    assert!(r.stderr().contains("is unreadable"), "{}", r.stderr());
    xt(&env, "work", &["gates", "check"]).ok();
    let parent = rev(&env, "work", &format!("{refname}~2"));
    assert_eq!(parent, c);
}

#[test]
fn a_gate_that_changes_the_worktree_or_head_is_not_recorded() {
    let env = TestEnv::new();
    setup(
        &env,
        r#"
[[gate]]
name = "writes"
command = "echo x > generated.txt"

[[gate]]
name = "commits"
command = "echo y > committed.txt && git add committed.txt && git commit -q -m sneaky"
"#,
    );
    let tree = rev(&env, "work", "HEAD^{tree}");
    let r = xt(&env, "work", &["gates", "run", "writes"]).expect_code(9);
    assert!(
        r.stderr().contains(&format!(
            "error: gates passed but were not recorded for tree {tree}: writes"
        )),
        "{}",
        r.stderr()
    );
    assert!(
        r.stdout()
            .contains("not recorded: while it ran, the worktree is dirty (?? generated.txt)"),
        "{}",
        r.stdout()
    );
    std::fs::remove_file(env.join("work/generated.txt")).unwrap();
    let r = xt(&env, "work", &["gates", "run", "commits"]).expect_code(9);
    assert!(
        r.stdout().contains("not recorded: HEAD moved to tree"),
        "{}",
        r.stdout()
    );
    assert_eq!(gate_refs(&env, "work"), "", "nothing recorded for any tree");
}

#[test]
fn with_no_gates_defined_check_is_green() {
    let env = TestEnv::new();
    setup(&env, "# no gates yet\n");
    let r = xt(&env, "work", &["gates", "check"]).ok();
    assert!(
        r.stdout().contains("green: no gates defined"),
        "{}",
        r.stdout()
    );
    let r = xt(&env, "work", &["gates", "run", "--json"]).ok();
    assert_eq!(json(&r)["gates"], serde_json::json!([]));
}

#[test]
fn an_unreadable_record_on_the_remote_is_exit_5_and_the_local_one_is_kept() {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    setup(&env, TWO_GATES);
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    let tree = rev(&env, "work", "HEAD^{tree}");
    let refname = format!("refs/warmstart/gates/{tree}");
    xt(&env, "work", &["gates", "run", "ok"]).ok();
    let good = stored(&env, "work", &tree).unwrap();
    // Someone pushed a record of another format version for this tree.
    let c = record_commit(&env, "{\"format\": \"warmstart-gates/99\"}");
    env.git("work", ["push", "-q", "origin", &format!("{c}:{refname}")]);
    let r = xt(&env, "work", &["gates", "fetch"]).expect_code(5);
    assert_eq!(
        r.stderr().trim(),
        format!(
            "error: gate record {refname} on `origin` is unreadable: format `warmstart-gates/99` is not `warmstart-gates/1` (written by a newer warmstart?); the local record was left as is: delete the remote one with `git push origin :{refname}`, then push a good one with `warmstart gates push origin`"
        )
    );
    assert_eq!(stored(&env, "work", &tree).unwrap(), good);
    xt(&env, "work", &["gates", "push"]).expect_code(5);
    // The way out the message gives works.
    env.git("work", ["push", "-q", "origin", &format!(":{refname}")]);
    let r = xt(&env, "work", &["gates", "push", "--json"]).ok();
    assert_eq!(json(&r)["result"], "created");
}

#[test]
fn help_teaches_the_tree_binding_and_the_flags() {
    let env = TestEnv::new();
    let r = xt(&env, ".", &["gates", "--help"]).ok();
    for needle in [
        "HEAD's tree id",
        "refs/warmstart/gates/<tree-id>",
        "run",
        "status",
        "check",
        "fetch",
        "push",
    ] {
        assert!(
            r.stdout().contains(needle),
            "`{needle}` missing:\n{}",
            r.stdout()
        );
    }
    let r = xt(&env, ".", &["gates", "run", "--help"]).ok();
    for needle in [
        "--keep-going",
        "--skip-green",
        "--no-record",
        "--json",
        "SIGKILL",
        "kill_grace",
    ] {
        assert!(
            r.stdout().contains(needle),
            "`{needle}` missing:\n{}",
            r.stdout()
        );
    }
    let r = xt(&env, ".", &["gates", "check", "--help"]).ok();
    assert!(r.stdout().contains("--fetch[=<REMOTE>]"), "{}", r.stdout());
}

#[test]
fn the_ci_script_runs_the_gates_and_pushes_the_record_only_when_green() {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    let gates = "[[gate]]\nname = \"ok\"\ncommand = \"test ! -e FAIL\"\n";
    setup(&env, gates);
    let script = std::fs::read_to_string(source_root().join("tools/ci-gates.sh")).unwrap();
    write(&env, "work/tools/ci-gates.sh", &script);
    write(&env, "work/FAIL", "x");
    commit(&env, "work", "ci script, failing");
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    let ci = |env: &TestEnv| {
        let mut bash = Command::new("bash");
        bash.arg(env.join("work/tools/ci-gates.sh"))
            .current_dir(env.join("work"))
            .env("XTASK", crate::util::bin());
        env.isolate(&mut bash);
        run(&mut bash)
    };
    let r = ci(&env).expect_code(11);
    assert!(
        r.stderr().contains("error: gates failed for tree"),
        "{}",
        r.stderr()
    );
    assert!(!r.stderr().contains("publishing"), "{}", r.stderr());
    assert_eq!(
        env.git("origin.git", ["for-each-ref", "refs/warmstart/"]),
        ""
    );

    std::fs::remove_file(env.join("work/FAIL")).unwrap();
    commit(&env, "work", "green");
    let tree = rev(&env, "work", "HEAD^{tree}");
    ci(&env).ok();
    let on_remote = env.git("origin.git", ["for-each-ref", "refs/warmstart/"]);
    assert!(on_remote.contains(&tree), "{on_remote}");
}
