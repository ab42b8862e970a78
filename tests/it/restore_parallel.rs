//! Parallel restore plans (`parallel`, `after`) against real processes, and the serial default.
//!
//! Concurrency is shown, not timed: steps meet at a rendezvous (each one
//! marks its arrival, then waits until all have arrived, giving up after
//! 20 s), which only a run that starts them together passes. Order is read
//! from one events file the commands append to.

use crate::util::tree::files_with_mtimes;
use crate::util::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

fn manifest(env: &TestEnv, text: &str) {
    let dir = env.join("r/cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("restore.toml"), text).unwrap();
}

fn restore(env: &TestEnv, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in("r");
    cmd.arg("restore").args(args);
    run(&mut cmd)
}

fn restore_json(env: &TestEnv, args: &[&str], code: i32) -> (Value, Run) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let r = restore(env, &all).expect_code(code);
    let v: Value = serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("--json output is JSON ({e}):\n{}", show(&r.out)));
    (v, r)
}

fn rows(v: &Value) -> Vec<(String, String, String)> {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["step"].as_str().unwrap().to_string(),
                r["state"].as_str().unwrap().to_string(),
                r["what"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn state_of(v: &Value, step: &str) -> (String, String) {
    rows(v)
        .into_iter()
        .find(|r| r.0 == step)
        .map(|r| (r.1, r.2))
        .unwrap_or_else(|| panic!("no row {step} in {v:#}"))
}

fn events(env: &TestEnv) -> Vec<String> {
    std::fs::read_to_string(env.join("r/events"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A command step that meets `of` others at a rendezvous in `meet/`.
fn rendezvous_step(name: &str, of: usize, extra: &str) -> String {
    format!(
        r#"
[[step]]
name = "{name}"
kind = "command"
creates = "done/{name}"
{extra}
run = '''
mkdir -p meet done
touch meet/{name}
echo "arrived {name}" >> events
i=0
while [ "$(ls meet | wc -l)" -lt {of} ]; do
  i=$((i+1)); [ $i -gt 400 ] && {{ echo "{name} waited alone" >&2; exit 9; }}
  sleep 0.05
done
touch done/{name}
'''
"#
    )
}

#[test]
fn parallel_plan_runs_independent_steps_at_once_and_keeps_file_order_in_the_table() {
    let env = TestEnv::new();
    env.work_repo("r");
    // The step that waits comes first in the file: file order is no
    // dependency here, and the table still lists it first.
    let last = r#"
[[step]]
name = "last"
kind = "command"
creates = "done/last"
after = ["a", "b", "c"]
run = "test -e done/a && test -e done/b && test -e done/c && echo 'start last' >> events && touch done/last"
"#;
    let plan = format!(
        "parallel = 3\n{last}{}{}{}",
        rendezvous_step("a", 3, ""),
        rendezvous_step("b", 3, ""),
        rendezvous_step("c", 3, ""),
    );
    manifest(&env, &plan);
    let (v, _) = restore_json(&env, &[], 0);
    let order: Vec<String> = rows(&v).into_iter().map(|r| r.0).collect();
    assert_eq!(order, ["last", "a", "b", "c"], "{v:#}");
    for s in ["a", "b", "c", "last"] {
        assert_eq!(state_of(&v, s).0, "done", "{v:#}");
    }
    assert_eq!(v["all_steps_ok"], true);
    let ev = events(&env);
    assert_eq!(ev.last().map(String::as_str), Some("start last"), "{ev:?}");
    assert_eq!(ev.len(), 4, "{ev:?}");
    // The state file took every thread's record: none was lost.
    let state: Value = serde_json::from_slice(
        &std::fs::read(env.join("r/.git/warmstart/restore/state.json")).unwrap(),
    )
    .unwrap();
    for s in ["a", "b", "c", "last"] {
        assert_eq!(state["steps"][s]["state"], "done", "{state:#}");
        assert!(state["steps"][s]["last_cold_ms"].is_u64(), "{state:#}");
    }
    let leftovers: Vec<_> = std::fs::read_dir(env.join("r/.git/warmstart/restore"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // Warm: nothing runs, and the state directory is left as it was.
    let before = files_with_mtimes(&env.join("r/.git/warmstart"));
    let (v, _) = restore_json(&env, &[], 0);
    for s in ["a", "b", "c", "last"] {
        assert_eq!(state_of(&v, s).0, "warm", "{v:#}");
    }
    assert_eq!(before, files_with_mtimes(&env.join("r/.git/warmstart")));
}

#[test]
fn parallel_true_uses_the_default_limit_of_at_least_two() {
    let env = TestEnv::new();
    env.work_repo("r");
    let plan = format!(
        "parallel = true\n{}{}",
        rendezvous_step("x", 2, ""),
        rendezvous_step("y", 2, "")
    );
    manifest(&env, &plan);
    let (v, _) = restore_json(&env, &[], 0);
    assert_eq!(state_of(&v, "x").0, "done", "{v:#}");
    assert_eq!(state_of(&v, "y").0, "done", "{v:#}");
    let r = restore(&env, &["--dry-run", "--json"]).ok();
    let plan: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert!(plan["parallel"].as_u64().unwrap() >= 2, "{plan:#}");
}

#[test]
fn a_plan_that_did_not_opt_in_runs_in_file_order_one_step_at_a_time() {
    let env = TestEnv::new();
    env.work_repo("r");
    let step = |n: &str| {
        format!(
            "[[step]]\nname = \"{n}\"\nkind = \"command\"\ncreates = \"done-{n}\"\nrun = \"echo 'start {n}' >> events; sleep 0.2; echo 'end {n}' >> events; touch done-{n}\"\n"
        )
    };
    manifest(&env, &format!("{}{}{}", step("c"), step("a"), step("b")));
    let (v, _) = restore_json(&env, &[], 0);
    let order: Vec<String> = rows(&v).into_iter().map(|r| r.0).collect();
    assert_eq!(order, ["c", "a", "b"]);
    assert_eq!(
        events(&env),
        ["start c", "end c", "start a", "end a", "start b", "end b"]
    );
    // The same rendezvous that a parallel plan passes fails here: the
    // first step waits alone (bounded by the step's timeout).
    let env = TestEnv::new();
    env.work_repo("r");
    let plan = format!(
        "{}{}",
        rendezvous_step("p", 2, "timeout = \"1s\""),
        rendezvous_step("q", 2, "timeout = \"1s\"")
    );
    manifest(&env, &plan);
    let (v, _) = restore_json(&env, &[], 0);
    assert_eq!(state_of(&v, "p").0, "failed-open", "{v:#}");
    assert!(state_of(&v, "p").1.contains("timed out"), "{v:#}");
}

#[test]
fn after_orders_steps_and_a_failure_skips_only_its_dependents() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        r#"
parallel = 4

[[step]]
name = "next"
kind = "command"
creates = "done-next"
after = ["slow"]
run = "echo 'start next' >> events && touch done-next"

[[step]]
name = "slow"
kind = "command"
creates = "done-slow"
run = "sleep 0.3; echo 'end slow' >> events; touch done-slow"

[[step]]
name = "broken"
kind = "command"
creates = "done-broken"
run = "echo 'start broken' >> events; exit 3"

[[step]]
name = "child"
kind = "command"
creates = "done-child"
after = ["broken"]
run = "echo 'start child' >> events; touch done-child"

[[step]]
name = "grandchild"
kind = "command"
creates = "done-grandchild"
after = ["child", "slow"]
run = "echo 'start grandchild' >> events; touch done-grandchild"

[[step]]
name = "free"
kind = "command"
creates = "done-free"
run = "echo 'start free' >> events; touch done-free"
"#,
    );
    let (v, r) = restore_json(&env, &[], 0);
    assert_eq!(v["all_steps_ok"], false, "{v:#}");
    assert_eq!(state_of(&v, "slow").0, "done");
    assert_eq!(state_of(&v, "next").0, "done");
    assert_eq!(state_of(&v, "free").0, "done");
    assert_eq!(state_of(&v, "broken").0, "failed-open");
    for s in ["child", "grandchild"] {
        assert_eq!(
            state_of(&v, s),
            ("skipped".into(), "skipped: after failed step broken".into()),
            "{v:#}"
        );
    }
    let ev = events(&env);
    let at = |e: &str| ev.iter().position(|x| x == e);
    assert!(
        at("end slow").unwrap() < at("start next").unwrap(),
        "{ev:?}"
    );
    assert_eq!(at("start child"), None, "{ev:?}");
    assert_eq!(at("start grandchild"), None, "{ev:?}");
    assert!(
        r.stderr()
            .contains("restore: broken failed (fail-open, continuing)"),
        "{}",
        r.stderr()
    );
    // The table says it too, in file order.
    let r = restore(&env, &[]).ok();
    let table = r.stdout();
    let child = table.lines().find(|l| l.starts_with("child ")).unwrap();
    assert!(
        child.contains("skipped: after failed step broken"),
        "{table}"
    );
    // --strict: the same failure is fatal, and its dependents still never run.
    let (v, r) = restore_json(&env, &["--strict"], 11);
    assert_eq!(state_of(&v, "broken").0, "failed");
    assert_eq!(
        state_of(&v, "grandchild").1,
        "skipped: after failed step broken"
    );
    assert!(r.stderr().contains("step broken failed"), "{}", r.stderr());
    assert!(!events(&env).iter().any(|e| e == "start child"));
}

#[test]
fn a_background_step_after_a_foreground_one_goes_to_the_worker_as_before() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        r#"
parallel = true

[[step]]
name = "fg"
kind = "command"
creates = "done-fg"
run = "touch done-fg"

[[step]]
name = "bg"
kind = "command"
background = true
creates = "done-bg"
after = ["fg"]
run = "test -e done-fg && touch done-bg"
"#,
    );
    let (v, _) = restore_json(&env, &[], 0);
    assert_eq!(state_of(&v, "fg").0, "done", "{v:#}");
    assert_eq!(state_of(&v, "bg").0, "background", "{v:#}");
    assert!(v["background_pid"].is_u64(), "{v:#}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env.join("r/done-bg").exists() {
        assert!(Instant::now() < deadline, "the worker never ran bg");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The worker records its own row once done.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "status", "--json"]);
        let s: Value = serde_json::from_str(&run(&mut cmd).ok().stdout()).unwrap();
        if state_of(&s, "bg").0 == "done" {
            break;
        }
        assert!(Instant::now() < deadline, "{s:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn bad_orders_are_refused_with_one_line_naming_the_steps() {
    let step = |name: &str, extra: &str| {
        format!(
            "[[step]]\nname = \"{name}\"\nkind = \"command\"\ncreates = \"x-{name}\"\nrun = \"true\"\n{extra}\n"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            format!("{}{}", step("a", ""), step("b", "after = [\"a\"]")),
            "step \"b\" has `after`, which needs `parallel = true`",
        ),
        (
            format!("parallel = false\n{}", step("b", "after = [\"b\"]")),
            "step \"b\" has `after`, which needs `parallel = true`",
        ),
        (
            format!("parallel = true\n{}", step("b", "after = [\"nope\"]")),
            "step \"b\": `after` names \"nope\", which is not a step of this file",
        ),
        (
            format!("parallel = true\n{}", step("b", "after = [\"b\"]")),
            "step \"b\" is `after` itself",
        ),
        (
            format!(
                "parallel = true\n{}{}{}",
                step("a", "after = [\"c\"]"),
                step("b", "after = [\"a\"]"),
                step("c", "after = [\"b\"]")
            ),
            "steps a -> c -> b -> a wait for each other in a cycle",
        ),
        (
            format!("parallel = true\n{}", step("b", "after = \"a\"")),
            "`after` must be a list of step names",
        ),
        (
            format!(
                "parallel = true\n{}{}",
                step("a", ""),
                step("b", "after = [\"a\", \"a\"]")
            ),
            "`after` names \"a\" twice",
        ),
        (
            format!(
                "parallel = true\n{}{}",
                step("a", "background = true"),
                step("b", "after = [\"a\"]")
            ),
            "step \"b\" is `after` background step \"a\"",
        ),
        (
            format!("parallel = 0\n{}", step("a", "")),
            "`parallel` = 0 must be true, false or a number of steps from 1 to 64",
        ),
        (
            format!("parallel = 65\n{}", step("a", "")),
            "`parallel` = 65 must be",
        ),
        (
            format!("parallel = \"yes\"\n{}", step("a", "")),
            "`parallel` = \"yes\" must be",
        ),
        (
            format!("paralel = true\n{}", step("a", "")),
            "unknown top-level key `paralel`",
        ),
    ];
    for (text, want) in cases {
        let env = TestEnv::new();
        env.work_repo("r");
        manifest(&env, &text);
        let r = restore(&env, &[]).expect_code(10);
        let err = r.stderr();
        assert!(err.contains(want), "{text}\n---\n{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        assert!(
            !Path::new(&env.join("r/.git/warmstart/restore")).exists(),
            "a refused plan touched the state directory"
        );
        restore(&env, &["--dry-run"]).expect_code(10);
    }
}

#[test]
fn dry_run_shows_the_order_a_parallel_plan_gives() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "parallel = 2\n[[step]]\nname = \"a\"\nkind = \"command\"\ncreates = \"x\"\nrun = \"true\"\n\n[[step]]\nname = \"b\"\nkind = \"command\"\ncreates = \"y\"\nrun = \"true\"\nafter = [\"a\"]\n",
    );
    let r = restore(&env, &["--dry-run"]).ok();
    assert!(
        r.stdout().contains("parallel: up to 2 steps at once"),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout().contains("2. b (command) [after a]"),
        "{}",
        r.stdout()
    );
    let r = restore(&env, &["--dry-run", "--json"]).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["parallel"], 2);
    assert_eq!(v["steps"][1]["after"], serde_json::json!(["a"]));
    assert!(!env.join("r/x").exists());
}

#[test]
fn only_runs_a_step_without_the_steps_it_is_after() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "parallel = true\n[[step]]\nname = \"a\"\nkind = \"command\"\ncreates = \"done-a\"\nrun = \"touch done-a\"\n\n[[step]]\nname = \"b\"\nkind = \"command\"\ncreates = \"done-b\"\nrun = \"touch done-b\"\nafter = [\"a\"]\n",
    );
    let (v, _) = restore_json(&env, &["--only", "b"], 0);
    assert_eq!(rows(&v).len(), 1, "{v:#}");
    assert_eq!(state_of(&v, "b").0, "done", "{v:#}");
    assert!(!env.join("r/done-a").exists());
}
