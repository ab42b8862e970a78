//! `cargo xtask restore`'s `cache` step: a real cache published by the real
//! binary to a bare remote, restored through restore.toml (cold, warm with the
//! remote gone, key change, missing branch fail-open and `--strict`).

use crate::util::fixture::{Fixture, Manifest, Serve};
use crate::util::tree::files_with_mtimes;
use serde_json::Value;
use std::path::{Path, PathBuf};

const RESTORE_TOML: &str = r#"[[step]]
name = "bin"
kind = "cache"
cache = "tc"

[[step]]
name = "after"
kind = "command"
run = "touch after-marker"
creates = "after-marker"
"#;

/// A work repository with a tiny ungated cache manifest `tc` (key from
/// pin.txt) and a restore.toml with a cache step, and an empty origin
/// (a `file://` URL).
fn ungated_cache() -> Fixture {
    let fx = Fixture::serve(Serve::FileUrl);
    let m = Manifest::pinned("pin.txt", "payload")
        .cache("branch = \"tc-cache\"\ndescription = \"test cache\"")
        .restore_path(target(&fx))
        .restore_line("mode = \"replace\"")
        .extra("\n[ready]\npath = \"hello.txt\"\n");
    fx.write_manifest("tc", &m);
    fx.write("cache-manifests/restore.toml", RESTORE_TOML);
    fx.write(".gitignore", "after-marker\n");
    set_version(&fx, "1");
    fx
}

fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed")
}

/// Moves the key to `v` and the payload with it, committed.
fn set_version(fx: &Fixture, v: &str) {
    fx.write("pin.txt", &format!("v={v}\n"));
    fx.write("payload/hello.txt", &format!("hello {v}\n"));
    fx.env.git(&fx.work, ["add", "-A"]);
    fx.env
        .git(&fx.work, ["commit", "-q", "-m", &format!("v{v}")]);
}

fn publish(fx: &Fixture) {
    fx.xtask(&["cache", "publish", "tc", "--allow-ungated", "--quiet"])
        .ok();
}

fn restore_json(fx: &Fixture, extra: &[&str]) -> Value {
    let mut args = vec!["restore", "--json"];
    args.extend_from_slice(extra);
    let r = fx.xtask(&args).ok();
    serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("--json output is JSON ({e}):\n{}", r.stdout()))
}

fn state_dir(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart")
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn row<'a>(v: &'a Value, step: &str) -> &'a Value {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == step)
        .unwrap_or_else(|| panic!("no row {step} in {v:#}"))
}

/// The table line of `step` (the first column is the step name).
fn table_line(stdout: &str, step: &str) -> String {
    stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(step))
        .unwrap_or_else(|| panic!("no row {step} in the table:\n{stdout}"))
        .to_string()
}

#[test]
fn restore_cache_step_cold_then_warm_offline_then_key_change() {
    let fx = ungated_cache();
    publish(&fx);

    // Cold: restored through the cache module, and the table says so.
    let cold = fx.xtask(&["restore"]).ok();
    let line = table_line(&cold.stdout(), "bin");
    for want in ["cache", "tc-cache @ origin", "done", "restored tc-1"] {
        assert!(
            line.contains(want),
            "{want:?} not in {line:?}\n{}",
            cold.stdout()
        );
    }
    assert_eq!(
        std::fs::read_to_string(target(&fx).join("hello.txt")).unwrap(),
        "hello 1\n"
    );
    assert!(fx.work.join("after-marker").exists(), "the next step ran");
    assert!(state_dir(&fx).join("logs/bin.log").is_file());

    // Warm, with the remote gone: a no-op that needs no network and leaves
    // no trace in the state directory (logs, stamps, state file, cache.git).
    let before = files_with_mtimes(&state_dir(&fx));
    let away = fx.env.join("origin-away.git");
    std::fs::rename(&fx.origin, &away).unwrap();
    let warm = restore_json(&fx, &[]);
    let bin = row(&warm, "bin");
    assert_eq!(bin["state"], "warm", "{warm:#}");
    assert_eq!(bin["source"], "tc-cache @ origin");
    assert!(
        bin["what"].as_str().unwrap().starts_with("tc-1 at "),
        "{bin}"
    );
    assert!(bin["last_cold_ms"].as_u64().is_some(), "{bin}");
    assert_eq!(warm["all_steps_ok"], true);
    assert_eq!(
        files_with_mtimes(&state_dir(&fx)),
        before,
        "a warm run wrote state"
    );
    let text = fx.xtask(&["restore"]).ok();
    assert!(
        table_line(&text.stdout(), "bin").contains("warm"),
        "{}",
        text.stdout()
    );
    assert_eq!(files_with_mtimes(&state_dir(&fx)), before);
    std::fs::rename(&away, &fx.origin).unwrap();

    // A key change restores the new key.
    set_version(&fx, "2");
    publish(&fx);
    let again = restore_json(&fx, &[]);
    let bin = row(&again, "bin");
    assert_eq!(bin["state"], "done", "{again:#}");
    assert!(
        bin["what"].as_str().unwrap().contains("restored tc-2"),
        "{bin}"
    );
    assert_eq!(
        std::fs::read_to_string(target(&fx).join("hello.txt")).unwrap(),
        "hello 2\n"
    );
    assert_eq!(row(&restore_json(&fx, &[]), "bin")["state"], "warm");
}

#[test]
fn restore_cache_step_missing_branch_fails_open_and_strict_makes_it_fatal() {
    let fx = ungated_cache();
    // Nothing published: origin has no tc-cache branch.
    let r = fx.xtask(&["restore"]).ok();
    let lines: Vec<_> = r.stderr().lines().map(str::to_string).collect();
    let about: Vec<_> = lines.iter().filter(|l| l.contains("bin")).collect();
    assert_eq!(about.len(), 1, "one line about the step:\n{}", r.stderr());
    assert!(
        about[0].starts_with("restore: bin failed (fail-open, continuing)")
            && about[0].contains("has no branch tc-cache"),
        "{}",
        about[0]
    );
    assert!(table_line(&r.stdout(), "bin").contains("failed-open"));
    assert!(fx.work.join("after-marker").exists(), "the rest went on");
    assert!(!target(&fx).exists(), "nothing installed");

    std::fs::remove_file(fx.work.join("after-marker")).unwrap();
    let strict = fx.xtask(&["restore", "--strict"]).expect_code(11);
    assert!(
        strict.stderr().contains("restore: bin failed:")
            && strict.stderr().contains("has no branch tc-cache"),
        "{}",
        strict.stderr()
    );
    assert!(
        table_line(&strict.stdout(), "after").contains("skipped"),
        "{}",
        strict.stdout()
    );
    assert!(
        !fx.work.join("after-marker").exists(),
        "--strict stopped there"
    );
}

#[test]
fn restore_cache_step_with_a_bad_manifest_name_fails_open_naming_the_file() {
    let fx = ungated_cache();
    write(
        &fx.work.join("cache-manifests/restore.toml"),
        &RESTORE_TOML.replace("cache = \"tc\"", "cache = \"nope\""),
    );
    let v = restore_json(&fx, &[]);
    let bin = row(&v, "bin");
    assert_eq!(bin["state"], "failed-open", "{v:#}");
    assert_eq!(bin["source"], "cache-manifests/nope.toml");
    assert!(
        bin["what"].as_str().unwrap().contains("no cache manifest"),
        "{bin}"
    );
    assert_eq!(row(&v, "after")["state"], "done");
}

/// The 10-minute rule, with `slow_uncached = "1s"`: a slow step no cache
/// holds is flagged with the command that would cache it (the publish of
/// the manifest that packs its output, or a new manifest's), in `--json`
/// and under the table; a fast step never is, and once a cache step
/// restores the slow step's output, neither is that step.
#[test]
fn slow_uncached_steps_are_flagged_with_the_command_that_would_cache_them() {
    let fx = Fixture::serve(Serve::FileUrl);
    let out = fx.work.join("out");
    fx.write_manifest("outc", &Manifest::literal("1", &out).restore_path(&out));
    fx.write(
        "cache-manifests/restore.toml",
        r#"slow_uncached = "1s"

[[step]]
name = "outc"
kind = "cache"
cache = "outc"

[[step]]
name = "built"
kind = "command"
run = "sleep 1.2 && mkdir -p out && echo built > out/built.txt"
creates = "out/built.txt"

[[step]]
name = "slow"
kind = "command"
run = "sleep 1.2 && touch slow-marker"
creates = "slow-marker"

[[step]]
name = "fast"
kind = "command"
run = "touch fast-marker"
creates = "fast-marker"
"#,
    );
    fx.write(".gitignore", "out/\nslow-marker\nfast-marker\n");
    fx.env.git(&fx.work, ["add", "-A"]);
    fx.env.git(&fx.work, ["commit", "-q", "-m", "slow steps"]);
    let hint = |v: &Value, step: &str| row(v, step)["cache_hint"].as_str().map(String::from);

    // Nothing published: the cache step fails open, both slow steps run.
    let v = restore_json(&fx, &[]);
    assert_eq!(row(&v, "outc")["state"], "failed-open", "{v:#}");
    let built = hint(&v, "built").unwrap_or_else(|| panic!("built not flagged: {v:#}"));
    assert!(
        built.contains("more than slow_uncached = 1s")
            && built.contains("cache publish outc`")
            && !built.contains("restore it with"),
        "{built}"
    );
    let slow = hint(&v, "slow").unwrap_or_else(|| panic!("slow not flagged: {v:#}"));
    assert!(
        slow.contains("pack slow-marker in a cache manifest")
            && slow.contains("cache publish slow`"),
        "{slow}"
    );
    assert_eq!(hint(&v, "fast"), None, "{v:#}");
    assert_eq!(hint(&v, "outc"), None, "{v:#}");

    // Warm, and still nothing cached: flagged from the last cold time, in
    // the table's LAST COLD column and a line under it.
    let text = fx.xtask(&["restore"]).ok().stdout();
    assert!(
        text.contains("! slow, uncached: step slow took ")
            && text.contains("! slow, uncached: step built took "),
        "{text}"
    );
    let fast_line = text.lines().find(|l| l.starts_with("fast ")).unwrap();
    assert!(!fast_line.contains('!'), "{text}");

    // Published and restored by the cache step: built is held by a cache now.
    fx.xtask(&["cache", "publish", "outc", "--quiet"]).ok();
    std::fs::remove_dir_all(&out).unwrap();
    let v = restore_json(&fx, &[]);
    assert_eq!(row(&v, "outc")["state"], "done", "{v:#}");
    assert_eq!(row(&v, "built")["state"], "warm", "{v:#}");
    assert!(row(&v, "built")["last_cold_ms"].as_u64().unwrap() > 1000);
    assert_eq!(hint(&v, "built"), None, "{v:#}");
    assert!(hint(&v, "slow").is_some(), "{v:#}");
    assert_eq!(hint(&v, "fast"), None, "{v:#}");
}

/// `slow_uncached` is strict: a value that is not a positive duration or
/// `false` is exit 10 naming the key and what it takes; `false` flags nothing.
#[test]
fn slow_uncached_refuses_what_is_not_a_duration_and_false_turns_it_off() {
    let fx = Fixture::serve(Serve::FileUrl);
    let step = "\n[[step]]\nname = \"slow\"\nkind = \"command\"\nrun = \"sleep 0.2 && touch m\"\ncreates = \"m\"\n";
    for bad in ["\"soon\"", "0", "\"0s\"", "true", "-5"] {
        fx.write(
            "cache-manifests/restore.toml",
            &format!("slow_uncached = {bad}\n{step}"),
        );
        let r = fx.xtask(&["restore"]).expect_code(10);
        assert!(
            r.stderr().contains("slow_uncached") && r.stderr().lines().count() == 1,
            "{bad}: {}",
            r.stderr()
        );
        assert!(!fx.work.join("m").exists(), "{bad}: a step ran");
    }
    fx.write(
        "cache-manifests/restore.toml",
        &format!("slow_uncached = \"100ms\"\n{step}"),
    );
    let v = restore_json(&fx, &[]);
    assert!(row(&v, "slow")["cache_hint"].is_string(), "{v:#}");
    fx.write(
        "cache-manifests/restore.toml",
        &format!("slow_uncached = false\n{step}"),
    );
    let v = restore_json(&fx, &[]);
    assert_eq!(row(&v, "slow")["cache_hint"], Value::Null, "{v:#}");
}
