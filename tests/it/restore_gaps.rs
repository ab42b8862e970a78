//! `cargo xtask restore`, the smaller gaps: command retries, download `unless`, links `include`, named sentinels, re-planning after freshness, and the `partial` state.
//!
//! Everything runs the real binary against real processes: shell commands
//! that fail on purpose, an HTTP server on 127.0.0.1 in a thread of this
//! test, real submodules from bare repositories, a freshness step pulling
//! from a real origin, and a cache restored over `git daemon` on 127.0.0.1.

use crate::cache_keys as keys;
use crate::util::git_daemon::GitDaemon;
use crate::util::http::{HttpServer, reply};
use crate::util::tree::assert_same_tree;
use crate::util::{Run, TestEnv, run};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn manifest(repo: &Path, text: &str) {
    write(repo.join("cache-manifests/restore.toml"), text);
}

fn write(path: impl AsRef<Path>, text: &str) {
    let path = path.as_ref();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn restore(env: &TestEnv, repo: &str, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in(repo);
    cmd.arg("restore").args(args);
    for v in ["https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY"] {
        cmd.env_remove(v);
    }
    cmd.env("NO_PROXY", "*").env("no_proxy", "*");
    run(&mut cmd)
}

/// `restore --json`, which must exit 0; the parsed output and the run.
fn restore_json(env: &TestEnv, repo: &str) -> (Value, Run) {
    let r = restore(env, repo, &["--json"]).ok();
    let v: Value = serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("--json output is JSON ({e}):\n{}", r.stdout()));
    (v, r)
}

fn row<'a>(v: &'a Value, step: &str) -> &'a Value {
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == step)
        .unwrap_or_else(|| panic!("no row {step} in {v:#}"))
}

fn state(v: &Value, step: &str) -> String {
    row(v, step)["state"].as_str().unwrap().to_string()
}

fn what(v: &Value, step: &str) -> String {
    row(v, step)["what"].as_str().unwrap().to_string()
}

/// The STATE cell of `step`'s row in the human table.
fn table_state(table: &str, step: &str) -> String {
    let header = table.lines().next().unwrap();
    let col = header.find("STATE").unwrap();
    let line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(step))
        .unwrap_or_else(|| panic!("no row {step}:\n{table}"));
    line[col..].split_whitespace().next().unwrap().to_string()
}

/// A bad manifest: exit 10 with one line on stderr that contains `needle`.
fn refused(env: &TestEnv, repo: &str, needle: &str) {
    let r = restore(env, repo, &[]).expect_code(10);
    let e = r.stderr();
    assert_eq!(e.trim().lines().count(), 1, "one line: {e}");
    assert!(e.contains(needle), "{needle:?} in {e}");
}

// ------------------------------------------------------- command retries

#[test]
fn restore_gaps_command_retries_until_it_succeeds_and_warns_each_retry() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    // Fails twice (exit 1), then creates its marker.
    let step = |retries: &str| {
        format!(
            r#"[[step]]
name = "flaky"
kind = "command"
run = 'n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; echo "attempt $n" >&2; [ $n -ge 3 ] && touch done.marker'
creates = "done.marker"
{retries}
"#
        )
    };
    manifest(&repo, &step("retries = 2\nbackoff = \"50ms\""));
    let start = Instant::now();
    let (v, r) = restore_json(&env, "r");
    assert_eq!(state(&v, "flaky"), "warned", "{v:#}");
    assert_eq!(
        what(&v, "flaky"),
        "ran `n=$(cat count 2>/dev/null || echo 0); n=$((n+1)); echo $n > count; echo \"attempt $n\" >&2; [ $n -ge 3 ] && touch done.marker` (on attempt 3)"
    );
    assert_eq!(std::fs::read_to_string(repo.join("count")).unwrap(), "3\n");
    assert!(repo.join("done.marker").exists());
    let warnings = row(&v, "flaky")["warnings"].as_array().unwrap().clone();
    assert_eq!(warnings.len(), 2, "{v:#}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .contains("failed on attempt 1 of 3 (exit 1: attempt 1); trying again in 50ms"),
        "{warnings:?}"
    );
    assert!(
        warnings[1]
            .as_str()
            .unwrap()
            .contains("attempt 2 of 3 (exit 1: attempt 2); trying again in 100ms"),
        "{warnings:?}"
    );
    // The user sees each retry on stderr, and the log has each attempt.
    assert_eq!(
        r.stderr().matches("failed on attempt").count(),
        2,
        "{}",
        r.stderr()
    );
    let log = std::fs::read_to_string(row(&v, "flaky")["log"].as_str().unwrap()).unwrap();
    assert_eq!(log.matches("retry ").count(), 2, "{log}");
    assert_eq!(log.matches("$ sh -c").count(), 3, "{log}");
    // 50 + 100 ms of backoff really happened.
    assert!(start.elapsed() >= Duration::from_millis(150));

    // Warm now: nothing runs.
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "flaky"), "warm", "{v:#}");
    assert_eq!(std::fs::read_to_string(repo.join("count")).unwrap(), "3\n");

    // Without retries (the default) the first failure is the answer.
    std::fs::remove_file(repo.join("done.marker")).unwrap();
    std::fs::remove_file(repo.join("count")).unwrap();
    manifest(&repo, &step(""));
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "flaky"), "failed-open", "{v:#}");
    assert!(what(&v, "flaky").ends_with("exit 1: attempt 1"), "{v:#}");
    assert!(!what(&v, "flaky").contains("attempts"), "{v:#}");
    assert_eq!(std::fs::read_to_string(repo.join("count")).unwrap(), "1\n");
}

#[test]
fn restore_gaps_command_timeouts_are_failed_attempts_and_the_what_counts_them() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    manifest(
        &repo,
        r#"[[step]]
name = "hang"
kind = "command"
run = "echo try >> tries; sleep 30"
creates = "never"
timeout = "300ms"
retries = 2
backoff = "0s"
"#,
    );
    let start = Instant::now();
    let (v, r) = restore_json(&env, "r");
    assert!(
        start.elapsed() < Duration::from_secs(10),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(state(&v, "hang"), "failed-open", "{v:#}");
    let w = what(&v, "hang");
    assert!(
        w.starts_with(
            "`echo try >> tries; sleep 30` failed after 3 attempts: timed out after 300ms"
        ),
        "{w}"
    );
    assert_eq!(
        std::fs::read_to_string(repo.join("tries")).unwrap(),
        "try\ntry\ntry\n"
    );
    assert_eq!(r.stderr().matches("failed on attempt").count(), 2);
    // For CI the same is fatal, with the attempts counted.
    std::fs::remove_file(repo.join("tries")).unwrap();
    let r = restore(&env, "r", &["--strict"]).expect_code(11);
    assert!(
        r.stderr().contains("failed after 3 attempts"),
        "{}",
        r.stderr()
    );
}

// ---------------------------------------------------- a small HTTP server

/// Answers each request with the next status of `script` (the last one
/// repeats); a 200 carries `body`. The loopback server of util/http.rs.
fn http(script: Vec<u16>, body: &'static [u8]) -> HttpServer {
    HttpServer::start(move |req, conn| {
        let status = script[req.n.min(script.len() - 1)];
        reply(conn, status, if status == 200 { body } else { b"" });
    })
}

const TOOL: &[u8] = b"#!/bin/sh\necho wasm-opt version 117\n";

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn download(url: &str, extra: &str) -> String {
    format!(
        "[[step]]\nname = \"wasm-opt\"\nkind = \"download\"\nurl = \"{url}\"\nsha256 = \"{}\"\ndest = \"tools/bin/wasm-opt\"\nexecutable = true\n{extra}",
        sha256_hex(TOOL)
    )
}

// ------------------------------------------------------- download unless

#[test]
fn restore_gaps_download_unless_skips_a_download_the_system_does_not_need() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let server = http(vec![200], TOOL);
    let dest = repo.join("tools/bin/wasm-opt");
    // The system's tool is new enough: nothing is fetched or installed.
    write(
        env.home().join("sys/wasm-opt"),
        "#!/bin/sh\necho wasm-opt version 118\n",
    );
    run(std::process::Command::new("chmod")
        .arg("+x")
        .arg(env.home().join("sys/wasm-opt")))
    .ok();
    let unless = r#"unless = "$HOME/sys/wasm-opt --version | awk '{exit !($3 >= 116)}'""#;
    manifest(&repo, &download(&server.url("wasm-opt"), unless));
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "wasm-opt"), "warm", "{v:#}");
    assert!(
        what(&v, "wasm-opt").ends_with("succeeds: not needed"),
        "{v:#}"
    );
    assert_eq!(server.hits(), 0);
    assert!(!dest.exists());

    // The system's tool is too old now: the download happens, once.
    write(
        env.home().join("sys/wasm-opt"),
        "#!/bin/sh\necho wasm-opt version 110\n",
    );
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "wasm-opt"), "done", "{v:#}");
    assert_eq!(server.hits(), 1);
    assert_eq!(std::fs::read(&dest).unwrap(), TOOL);
    // Warm from the stamp: `unless` is not even started (it would leave
    // its mark), nothing is fetched.
    let marking = r#"unless = "touch $HOME/probed; exit 1""#;
    manifest(&repo, &download(&server.url("wasm-opt"), marking));
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "wasm-opt"), "warm", "{v:#}");
    assert!(what(&v, "wasm-opt").contains("at sha256"), "{v:#}");
    assert!(!env.home().join("probed").exists());
    assert_eq!(server.hits(), 1);
    // --dry-run shows it.
    let r = restore(&env, "r", &["--dry-run", "--json"]).ok();
    let plan: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(
        plan["steps"][0]["detail"]["unless"],
        "touch $HOME/probed; exit 1"
    );
}

#[test]
fn restore_gaps_download_retries_share_the_command_policy_and_warn() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let server = http(vec![503, 200], TOOL);
    manifest(
        &repo,
        &download(&server.url("wasm-opt"), "retries = 2\nbackoff = \"10ms\"\n"),
    );
    let (v, r) = restore_json(&env, "r");
    assert_eq!(state(&v, "wasm-opt"), "warned", "{v:#}");
    assert!(what(&v, "wasm-opt").starts_with("installed"), "{v:#}");
    assert_eq!(server.hits(), 2);
    let e = r.stderr();
    assert!(
        e.contains("download of http://127.0.0.1")
            && e.contains("failed on attempt 1 of 3 (HTTP 503)"),
        "{e}"
    );
    assert_eq!(
        std::fs::read(repo.join("tools/bin/wasm-opt")).unwrap(),
        TOOL
    );
}

// --------------------------------------------------------- links include

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn links_step(extra: &str) -> String {
    format!(
        "[[step]]\nname = \"tools\"\nkind = \"links\"\nsource = \"opt/binaryen\"\nfarm = \"farm\"\n{extra}"
    )
}

#[test]
fn restore_gaps_links_include_links_only_matching_entries() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let src = repo.join("opt/binaryen");
    for f in [
        "bin/wasm-opt",
        "bin/wasm-as",
        "bin/.hidden",
        "build-info.json",
        "lib/libbinaryen.so",
        "lib/cmake/x.cmake",
        "alt/wasm-opt",
    ] {
        write(src.join(f), f);
    }
    let farm = repo.join("farm");
    // A link that is not this step's, and a real file: both stay.
    std::fs::create_dir_all(&farm).unwrap();
    std::os::unix::fs::symlink("/bin/sh", farm.join("sh")).unwrap();
    write(farm.join("notes.txt"), "mine");

    // Before: every entry, build-info.json too.
    manifest(&repo, &links_step(""));
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "tools"), "done", "{v:#}");
    assert_eq!(
        names(&farm),
        ["alt", "bin", "build-info.json", "lib", "notes.txt", "sh"]
    );

    // include: only the binaries; the links it no longer selects go.
    manifest(&repo, &links_step("include = [\"bin/*\"]\n"));
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "tools"), "done", "{v:#}");
    assert_eq!(
        what(&v, "tools"),
        "2 linked, 0 dangling removed, 4 unselected removed, 0 current"
    );
    assert_eq!(names(&farm), ["notes.txt", "sh", "wasm-as", "wasm-opt"]);
    assert_eq!(
        std::fs::read_to_string(farm.join("wasm-opt")).unwrap(),
        "bin/wasm-opt"
    );
    assert_eq!(
        std::fs::read_link(farm.join("wasm-opt")).unwrap(),
        Path::new("../opt/binaryen/bin/wasm-opt")
    );
    assert_eq!(
        std::fs::read_link(farm.join("sh")).unwrap(),
        Path::new("/bin/sh")
    );
    let (v, _) = restore_json(&env, "r");
    assert_eq!(state(&v, "tools"), "warm", "{v:#}");
    assert_eq!(what(&v, "tools"), "2 links current");

    // With entries: an entry is linked when it matches and is of the kind.
    manifest(
        &repo,
        &links_step("include = [\"bin/*\", \"lib/*\"]\nentries = \"files\"\n"),
    );
    restore_json(&env, "r");
    assert_eq!(
        names(&farm),
        ["libbinaryen.so", "notes.txt", "sh", "wasm-as", "wasm-opt"]
    );
    manifest(
        &repo,
        &links_step("include = [\"lib/*\"]\nentries = \"dirs\"\n"),
    );
    restore_json(&env, "r");
    assert_eq!(names(&farm), ["cmake", "notes.txt", "sh"]);

    // Two matches with one name: the first in path order, and a warning.
    manifest(&repo, &links_step("include = [\"bin/*\", \"alt/*\"]\n"));
    let (v, r) = restore_json(&env, "r");
    assert_eq!(state(&v, "tools"), "warned", "{v:#}");
    assert!(
        r.stderr().contains("would both be linked as") && r.stderr().contains("alt/wasm-opt"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read_link(farm.join("wasm-opt")).unwrap(),
        Path::new("../opt/binaryen/alt/wasm-opt")
    );

    // Bad patterns: exit 10, one line naming `include`; the farm is intact.
    let before = names(&farm);
    for (bad, needle) in [
        ("bin/[ab]*", "[...]"),
        ("**/wasm-*", "`**`"),
        ("/bin/*", "absolute"),
        ("bin/../lib/*", "`..`"),
        ("", "empty"),
    ] {
        manifest(&repo, &links_step(&format!("include = [{bad:?}]\n")));
        refused(&env, "r", needle);
        let e = restore(&env, "r", &[]).stderr();
        assert!(e.contains("`include`"), "{e}");
    }
    manifest(&repo, &links_step("include = \"bin/*\"\n"));
    refused(&env, "r", "include");
    assert_eq!(names(&farm), before);
}

// ------------------------------------------------------ named sentinels

fn suite_remote(env: &TestEnv, name: &str) -> PathBuf {
    let bare = env.bare_remote(&format!("{name}.git"));
    let src = env.work_repo(&format!("{name}-src"));
    write(src.join("run.sh"), "echo run\n");
    env.git(&src, ["add", "-A"]);
    env.git(&src, ["commit", "-q", "-m", "suite"]);
    env.git(&src, ["push", "-q", bare.to_str().unwrap(), "main"]);
    bare
}

#[test]
fn restore_gaps_submodules_what_names_the_missing_sentinels() {
    let env = TestEnv::new();
    let app = env.work_repo("app");
    for name in ["alpha", "beta"] {
        let bare = suite_remote(&env, name);
        env.git(
            &app,
            [
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                bare.to_str().unwrap(),
                &format!("vendor/{name}"),
            ],
        );
    }
    env.git(&app, ["commit", "-q", "-m", "suites"]);
    env.git(".", ["clone", "-q", app.to_str().unwrap(), "box"]);
    let step = |sentinels: &[(&str, &str)]| {
        let list: Vec<String> = sentinels
            .iter()
            .map(|(s, p)| format!("{{ suite = \"{s}\", path = \"{p}\", breaks = \"make {s}\" }}"))
            .collect();
        format!(
            "[[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"vendor/alpha\", \"vendor/beta\"]\nallow_file_protocol = true\nsentinel = [{}]\n",
            list.join(", ")
        )
    };
    let box_ = env.join("box");
    manifest(
        &box_,
        &step(&[
            ("alpha", "vendor/alpha/run.sh"),
            ("alpha", "vendor/alpha/data/cases"),
            ("beta", "vendor/beta/gen/parser.rs"),
        ]),
    );
    let (v, r) = restore_json(&env, "box");
    assert_eq!(state(&v, "suites"), "failed-open", "{v:#}");
    assert_eq!(
        what(&v, "suites"),
        "2 sentinel(s) missing: alpha (vendor/alpha/data/cases), beta (vendor/beta/gen/parser.rs)"
    );
    let table = restore(&env, "box", &[]).ok().stdout();
    assert!(
        table.contains("2 sentinel(s) missing: alpha (vendor/alpha/data/cases), beta"),
        "{table}"
    );
    assert!(
        r.stderr()
            .contains("MISSING beta vendor/beta/gen/parser.rs -> breaks: make beta")
    );

    // Many: the first three by name, then a count; stderr has them all.
    let many: Vec<(String, String)> = (1..=5)
        .map(|i| ("beta".to_string(), format!("vendor/beta/t{i}")))
        .collect();
    let refs: Vec<(&str, &str)> = many.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    manifest(&box_, &step(&refs));
    let (v, r) = restore_json(&env, "box");
    assert_eq!(
        what(&v, "suites"),
        "5 sentinel(s) missing: beta (vendor/beta/t1), beta (vendor/beta/t2), beta (vendor/beta/t3), and 2 more"
    );
    assert_eq!(
        r.stderr().matches("MISSING beta").count(),
        5,
        "{}",
        r.stderr()
    );
}

// ------------------------------------------- freshness re-plans what follows

const FRESH: &str =
    "[[step]]\nname = \"fresh\"\nkind = \"freshness\"\ntimeout = \"5s\"\ninterval = \"0s\"\n\n";

fn marker_step(name: &str, marker: &str) -> String {
    format!(
        "[[step]]\nname = \"{name}\"\nkind = \"command\"\nrun = \"touch {marker}\"\ncreates = \"{marker}\"\n\n"
    )
}

/// `dev` commits `files` and pushes them to origin.
fn push(env: &TestEnv, files: &[(&str, &str)], msg: &str) {
    for (f, text) in files {
        write(env.join("dev").join(f), text);
    }
    env.git("dev", ["add", "-A"]);
    env.git("dev", ["commit", "-q", "-m", msg]);
    env.git("dev", ["push", "-q", "origin", "main"]);
}

#[test]
fn restore_gaps_freshness_fast_forward_replans_the_steps_after_it() {
    let env = TestEnv::new();
    let origin = env.bare_remote("origin.git");
    env.work_repo("dev");
    env.git("dev", ["remote", "add", "origin", origin.to_str().unwrap()]);
    let plan_v1 = format!("{FRESH}{}", marker_step("tool", "tool-v1"));
    push(
        &env,
        &[("cache-manifests/restore.toml", &plan_v1)],
        "plan v1",
    );
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let (v, _) = restore_json(&env, "box");
    assert_eq!(what(&v, "fresh"), "main is up to date with origin/main");
    assert!(env.join("box/tool-v1").exists());

    // A pin bump in restore.toml itself, and a new step: restored in the
    // same run that pulls them.
    let plan_v2 = format!(
        "{FRESH}{}{}",
        marker_step("tool", "tool-v2"),
        marker_step("extra", "extra-v2")
    );
    push(
        &env,
        &[("cache-manifests/restore.toml", &plan_v2)],
        "plan v2",
    );
    let (v, _) = restore_json(&env, "box");
    let w = what(&v, "fresh");
    assert!(w.starts_with("fast-forwarded main by 1 commit(s)"), "{w}");
    assert!(
        w.ends_with("restore.toml changed: the 2 step(s) after it run as it says now"),
        "{w}"
    );
    assert_eq!(state(&v, "tool"), "done", "{v:#}");
    assert_eq!(state(&v, "extra"), "done", "{v:#}");
    assert!(env.join("box/tool-v2").exists() && env.join("box/extra-v2").exists());
    let steps: Vec<&str> = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["step"].as_str().unwrap())
        .collect();
    assert_eq!(steps, ["fresh", "tool", "extra"]);

    // A pull that leaves restore.toml alone re-plans nothing.
    push(&env, &[("src.txt", "x")], "code only");
    let (v, _) = restore_json(&env, "box");
    let w = what(&v, "fresh");
    assert!(w.starts_with("fast-forwarded"), "{w}");
    assert!(!w.contains("restore.toml changed"), "{w}");

    // --only keeps its meaning: only the named steps of the new plan run.
    let plan_v3 = format!(
        "{FRESH}{}{}",
        marker_step("tool", "tool-v3"),
        marker_step("extra", "extra-v3")
    );
    push(
        &env,
        &[("cache-manifests/restore.toml", &plan_v3)],
        "plan v3",
    );
    let r = restore(&env, "box", &["--json", "--only", "fresh,tool"]).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert!(
        what(&v, "fresh").contains("the 1 step(s) after it"),
        "{v:#}"
    );
    assert!(env.join("box/tool-v3").exists());
    assert!(!env.join("box/extra-v3").exists());

    // A pulled restore.toml that does not load: a warning on the freshness
    // row, the rest as loaded at the start; the next run refuses it (10).
    let broken = format!("{plan_v3}[[step]]\nname = \"x\"\nkind = \"teleport\"\n");
    push(
        &env,
        &[("cache-manifests/restore.toml", &broken)],
        "broken plan",
    );
    let (v, r) = restore_json(&env, "box");
    assert_eq!(state(&v, "fresh"), "warned", "{v:#}");
    assert!(
        r.stderr().contains("restore.toml does not load now") && r.stderr().contains("teleport"),
        "{}",
        r.stderr()
    );
    assert_eq!(state(&v, "extra"), "done", "{v:#}");
    assert!(env.join("box/extra-v3").exists());
    let r = run(env.xtask_in("box").args(["restore", "status", "--json"])).ok();
    let st: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&st, "fresh"), "warned", "{st:#}");
    let r = restore(&env, "box", &[]).expect_code(10);
    assert!(
        r.stderr().contains("unknown kind \"teleport\""),
        "{}",
        r.stderr()
    );
}

// ------------------------------------------------- partial, over git daemon

#[test]
fn restore_gaps_fallback_cache_row_is_partial_then_done_with_the_exact_key() {
    let fx = keys::verification_cache("fallback = [{ drop = [\"src\"] }]\nrecheck = \"1h\"\n");
    keys::publish(&fx, "1", "x");
    // The source moved on: the branch has no vc-2-x yet.
    keys::pins(&fx, "2", "x");
    let daemon = GitDaemon::start(fx.env.path());
    manifest(
        &fx.work,
        &format!(
            "[[step]]\nname = \"vc\"\nkind = \"cache\"\ncache = \"vc\"\nremote = \"{}\"\n",
            daemon.url("origin.git")
        ),
    );
    let (v, _) = restore_json(&fx.env, "work");
    assert_eq!(state(&v, "vc"), "partial", "{v:#}");
    assert_eq!(v["ok"], true);
    let p = &row(&v, "vc")["partial"];
    assert_eq!(p["used"], "vc-1-x", "{v:#}");
    assert_eq!(p["wanted"], "vc-2-x", "{v:#}");
    assert_eq!(p["fallback"], "drop src", "{v:#}");
    assert_eq!(
        p["differs"],
        json!([{ "name": "src", "wanted": "2", "used": "1" }])
    );
    let w = what(&v, "vc");
    assert!(
        w.starts_with("vc-1-x stands in for vc-2-x (src 2 -> 1; fallback drop src) at "),
        "{w}"
    );
    assert!(w.contains(&daemon.url("origin.git")), "{w}");
    assert_same_tree(&keys::artifact(&fx, "1"), &keys::target(&fx));

    // Warm (the stat-only probe): still partial, in the JSON, the table
    // and `restore status`.
    let (v, _) = restore_json(&fx.env, "work");
    assert_eq!(state(&v, "vc"), "partial", "{v:#}");
    assert_eq!(row(&v, "vc")["partial"]["used"], "vc-1-x");
    assert!(
        what(&v, "vc").contains("exact key looked for again after"),
        "{v:#}"
    );
    let table = restore(&fx.env, "work", &[]).ok().stdout();
    assert_eq!(table_state(&table, "vc"), "partial", "{table}");
    let r = run(fx
        .env
        .xtask_in("work")
        .args(["restore", "status", "--json"]))
    .ok();
    let st: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&st, "vc"), "partial", "{st:#}");

    // The exact key is published; after the recheck the step restores it.
    keys::publish(&fx, "2", "x");
    keys::manifest(
        &fx,
        "fallback = [{ drop = [\"src\"] }]\nrecheck = \"1ms\"\n",
    );
    std::thread::sleep(Duration::from_millis(20));
    let (v, _) = restore_json(&fx.env, "work");
    assert_eq!(state(&v, "vc"), "done", "{v:#}");
    assert!(what(&v, "vc").starts_with("restored vc-2-x"), "{v:#}");
    assert!(row(&v, "vc").get("partial").is_none(), "{v:#}");
    assert_same_tree(&keys::artifact(&fx, "2"), &keys::target(&fx));
    let (v, _) = restore_json(&fx.env, "work");
    assert_eq!(state(&v, "vc"), "warm", "{v:#}");
}

// ------------------------------------------------------------ bad input

#[test]
fn restore_gaps_bad_retries_backoff_and_unless_are_refused_and_nothing_runs() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let cmd = |extra: &str| {
        format!(
            "[[step]]\nname = \"c\"\nkind = \"command\"\nrun = \"touch ran\"\ncreates = \"ran\"\n{extra}"
        )
    };
    let dl = |extra: &str| download("http://127.0.0.1:9/x", extra);
    for (text, needle) in [
        (
            cmd("retries = -1\n"),
            "`retries` = -1 is not a number of retries",
        ),
        (cmd("retries = 1.5\n"), "`retries` = 1.5"),
        (cmd("retries = \"3\"\n"), "`retries` = \"3\""),
        (cmd("retries = 11\n"), "at most 10"),
        (cmd("backoff = \"x\"\n"), "backoff"),
        (cmd("backoff = -1\n"), "backoff"),
        (cmd("retry = 2\n"), "retry"),
        (dl("retries = -1\n"), "`retries` = -1"),
        (dl("backoff = \"soon\"\n"), "backoff"),
        (dl("unless = \"\"\n"), "`unless` is empty"),
        (dl("unless = []\n"), "`unless` is empty"),
    ] {
        manifest(&repo, &text);
        refused(&env, "r", needle);
        assert!(!repo.join("ran").exists(), "{text}");
    }
}
