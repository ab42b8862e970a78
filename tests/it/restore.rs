//! `cargo xtask restore`: every step kind against real git, real processes and a real HTTP server.
//!
//! Remotes are bare repositories on disk (submodules, freshness); downloads
//! come from a small HTTP server on 127.0.0.1 in a thread of this test, which
//! can also stall or act as a proxy. Timeouts in the manifests are short so
//! the failure paths finish in seconds.

use crate::util::http::{HttpServer, reply};
use crate::util::tree::files_with_mtimes;
use crate::util::{Run, TestEnv, run};
use serde_json::Value;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

fn manifest(env: &TestEnv, repo: &str, text: &str) {
    let dir = env.join(repo).join("cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("restore.toml"), text).unwrap();
}

fn restore(env: &TestEnv, repo: &str, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in(repo);
    cmd.arg("restore").args(args);
    for v in [
        "https_proxy",
        "HTTPS_PROXY",
        "http_proxy",
        "HTTP_PROXY",
        "no_proxy",
        "NO_PROXY",
        "ALL_PROXY",
        "all_proxy",
    ] {
        cmd.env_remove(v);
    }
    run(&mut cmd)
}

/// Runs `restore --json` (plus `args`), expecting exit 0; returns the rows by step name.
fn restore_json(env: &TestEnv, repo: &str, args: &[&str]) -> (Value, Run) {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let r = restore(env, repo, &all).ok();
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

fn write(path: impl AsRef<Path>, text: &str) {
    let path = path.as_ref();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn count_lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn git_dir_state(env: &TestEnv, repo: &str) -> PathBuf {
    env.join(repo).join(".git/warmstart")
}

// ---------------------------------------------------------------- submodules

fn suite_remote(env: &TestEnv, name: &str, files: &[(&str, &str)]) -> PathBuf {
    let bare = env.bare_remote(&format!("{name}.git"));
    let src = env.work_repo(&format!("{name}-src"));
    for (f, text) in files {
        write(src.join(f), text);
    }
    env.git(&src, ["add", "-A"]);
    env.git(&src, ["commit", "-q", "-m", "suite files"]);
    env.git(&src, ["push", "-q", bare.to_str().unwrap(), "main"]);
    bare
}

#[test]
fn restore_submodules_cold_init_then_missing_sentinel_then_warm_noop() {
    let env = TestEnv::new();
    let a = suite_remote(&env, "alpha", &[("run.sh", "echo alpha\n")]);
    let b = suite_remote(&env, "beta", &[("data/cases.txt", "1 2 3\n")]);
    let app = env.work_repo("app");
    for (bare, path) in [(&a, "vendor/alpha"), (&b, "vendor/beta")] {
        env.git(
            &app,
            [
                "-c",
                "protocol.file.allow=always",
                "submodule",
                "add",
                "-q",
                bare.to_str().unwrap(),
                path,
            ],
        );
    }
    manifest(
        &env,
        "app",
        r#"
[[step]]
name = "suites"
kind = "submodules"
paths = ["vendor/alpha", "vendor/beta"]
allow_file_protocol = true
sentinel = [
  { suite = "alpha", path = "vendor/alpha/run.sh", breaks = "make test-alpha" },
  { suite = "beta", path = "vendor/beta/data/cases.txt", breaks = "cargo test -p beta" },
]
"#,
    );
    env.git(&app, ["add", "-A"]);
    env.git(
        &app,
        ["commit", "-q", "-m", "submodules and restore manifest"],
    );
    // The fresh machine: a clone without its submodules.
    env.git(".", ["clone", "-q", app.to_str().unwrap(), "box"]);
    let sentinel_b = env.join("box/vendor/beta/data/cases.txt");
    assert!(!sentinel_b.exists());

    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "suites"), "done", "{v:#}");
    assert_eq!(
        std::fs::read_to_string(env.join("box/vendor/alpha/run.sh")).unwrap(),
        "echo alpha\n"
    );
    assert!(sentinel_b.exists());
    let log = row(&v, "suites")["log"].as_str().unwrap().to_string();
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("submodule update --init")
    );

    // Warm: nothing runs, nothing in the state directory changes.
    let before = files_with_mtimes(&git_dir_state(&env, "box"));
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "suites"), "warm", "{v:#}");
    assert_eq!(before, files_with_mtimes(&git_dir_state(&env, "box")));

    // A sentinel deleted inside an initialised submodule: reported, restore goes on.
    std::fs::remove_file(&sentinel_b).unwrap();
    let (v, r) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "suites"), "failed-open", "{v:#}");
    assert!(
        r.stderr()
            .lines()
            .any(|l| l == "MISSING beta vendor/beta/data/cases.txt -> breaks: cargo test -p beta"),
        "{}",
        r.stderr()
    );
    assert!(!r.stderr().contains("MISSING alpha"), "{}", r.stderr());
    assert_eq!(v["all_steps_ok"], false);
    // For CI the same is fatal.
    let r = restore(&env, "box", &["--strict"]).expect_code(11);
    assert!(r.stderr().contains("MISSING beta"), "{}", r.stderr());
}

// --------------------------------------------------------------------- links

#[test]
fn restore_links_regenerates_the_farm_and_warns_on_index_drift() {
    let env = TestEnv::new();
    env.work_repo("r");
    for s in ["pdf", "lint", "deploy"] {
        write(env.join(format!("r/skills/{s}/SKILL.md")), s);
    }
    write(env.join("r/skills/README.md"), "not a dir: not linked");
    write(env.join("r/skills/INDEX.md"), "- pdf\n- lint\n- gone\n");
    let farm = env.join("r/.claude/skills");
    std::fs::create_dir_all(&farm).unwrap();
    std::os::unix::fs::symlink("../../skills/gone", farm.join("gone")).unwrap();
    write(farm.join("local-notes.txt"), "mine");
    manifest(
        &env,
        "r",
        r#"
[[step]]
name = "skills"
kind = "links"
source = "skills"
farm = ".claude/skills"
index = "skills/INDEX.md"
entries = "dirs"
"#,
    );
    let (v, r) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "skills"), "warned", "{v:#}");
    assert_eq!(
        what(&v, "skills"),
        "3 linked, 1 dangling removed, 0 current"
    );
    for s in ["pdf", "lint", "deploy"] {
        let link = farm.join(s);
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../../skills").join(s)
        );
        assert_eq!(std::fs::read_to_string(link.join("SKILL.md")).unwrap(), s);
    }
    assert!(std::fs::symlink_metadata(farm.join("gone")).is_err());
    assert!(std::fs::symlink_metadata(farm.join("README.md")).is_err());
    assert_eq!(
        std::fs::read_to_string(farm.join("local-notes.txt")).unwrap(),
        "mine"
    );
    let warned: Vec<_> = r
        .stderr()
        .lines()
        .filter(|l| l.starts_with("WARNING:") && l.contains("does not mention"))
        .map(str::to_string)
        .collect();
    assert_eq!(warned.len(), 1, "{}", r.stderr());
    assert!(warned[0].contains("does not mention deploy"), "{warned:?}");

    // Warm: still warns about the index, changes nothing.
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "skills"), "warned");
    assert_eq!(what(&v, "skills"), "3 links current");

    // A new entry, mentioned in the index: linked, and no more warning.
    write(env.join("r/skills/new/SKILL.md"), "new");
    write(
        env.join("r/skills/INDEX.md"),
        "- pdf\n- lint\n- deploy\n- new\n",
    );
    let (v, r) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "skills"), "done", "{v:#}\n{}", r.stderr());
    assert_eq!(
        what(&v, "skills"),
        "1 linked, 0 dangling removed, 3 current"
    );
    assert!(farm.join("new/SKILL.md").exists());
}

// ------------------------------------------------------------ command and pin

#[test]
fn restore_command_runs_only_when_creates_is_missing_or_unless_fails() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "r",
        r#"
[[step]]
name = "build"
kind = "command"
run = "echo ran >> runs-build.txt; mkdir -p out && touch out/made"
creates = "out/made"

[[step]]
name = "probe"
kind = "command"
run = ["sh", "-c", "echo ran >> runs-probe.txt; touch flag"]
unless = "test -f flag"

[[step]]
name = "liar"
kind = "command"
run = "true"
creates = "never-made"
"#,
    );
    let runs_build = env.join("r/runs-build.txt");
    let runs_probe = env.join("r/runs-probe.txt");
    let (v, r) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "build"), "done");
    assert_eq!(state(&v, "probe"), "done");
    assert_eq!(state(&v, "liar"), "failed-open");
    assert!(
        what(&v, "liar").contains("did not create"),
        "{}",
        what(&v, "liar")
    );
    assert!(
        r.stderr()
            .contains("restore: liar failed (fail-open, continuing)"),
        "{}",
        r.stderr()
    );
    assert_eq!((count_lines(&runs_build), count_lines(&runs_probe)), (1, 1));

    let (v, _) = restore_json(&env, "r", &["--only", "build,probe"]);
    assert_eq!(state(&v, "build"), "warm");
    assert_eq!(state(&v, "probe"), "warm");
    assert_eq!(v["steps"].as_array().unwrap().len(), 2);
    assert_eq!((count_lines(&runs_build), count_lines(&runs_probe)), (1, 1));

    std::fs::remove_file(env.join("r/out/made")).unwrap();
    std::fs::remove_file(env.join("r/flag")).unwrap();
    let (v, _) = restore_json(&env, "r", &["--only", "build", "--only", "probe"]);
    assert_eq!(state(&v, "build"), "done");
    assert_eq!((count_lines(&runs_build), count_lines(&runs_probe)), (2, 2));
}

#[test]
fn restore_fail_closed_step_stops_the_restore_without_strict() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "r",
        r#"
[[step]]
name = "must"
kind = "command"
fail_open = false
run = "exit 4"
creates = "never"

[[step]]
name = "later"
kind = "command"
run = "touch later-ran"
creates = "later-ran"
"#,
    );
    let r = restore(&env, "r", &["--json"]).expect_code(11);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "must"), "failed");
    assert_eq!(state(&v, "later"), "skipped");
    assert!(!env.join("r/later-ran").exists());
    assert!(
        r.stderr()
            .contains("error: step must failed: `exit 4` exit 4"),
        "{}",
        r.stderr()
    );
}

fn script(path: PathBuf, body: &str) {
    write(&path, &format!("#!/bin/sh\n{body}\n"));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

#[test]
fn restore_pin_checks_once_applies_the_named_fix_and_stays_warm() {
    let env = TestEnv::new();
    env.work_repo("r");
    let calls = env.join("r/calls.txt");
    let c = calls.display();
    script(
        env.join("r/versions/tool-1"),
        &format!("echo call >> {c}; echo 'tool 1.9.0'"),
    );
    script(
        env.join("r/versions/tool-2"),
        &format!("echo call >> {c}; echo 'tool 2.1.0'"),
    );
    std::fs::create_dir_all(env.join("r/bin")).unwrap();
    std::os::unix::fs::symlink("../versions/tool-1", env.join("r/bin/tool")).unwrap();
    manifest(
        &env,
        "r",
        r#"
[[step]]
name = "tool"
kind = "pin"
tool = "bin/tool"
expect = '^tool 2\.'
fix = { symlink = "bin/tool", target = "versions/tool-2" }

[[step]]
name = "unfixable"
kind = "pin"
tool = "versions/tool-1"
expect = '^tool 3\.'
"#,
    );
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "tool"), "done", "{v:#}");
    assert!(
        what(&v, "tool").starts_with("fixed (symlink"),
        "{}",
        what(&v, "tool")
    );
    assert!(what(&v, "tool").ends_with("tool 2.1.0"));
    assert_eq!(
        std::fs::read_link(env.join("r/bin/tool")).unwrap(),
        env.join("r/versions/tool-2")
    );
    assert_eq!(state(&v, "unfixable"), "failed-open");
    assert!(
        what(&v, "unfixable").contains("expected /^tool 3\\./; no `fix`"),
        "{}",
        what(&v, "unfixable")
    );
    let after_cold = count_lines(&calls);
    assert_eq!(after_cold, 3, "tool-1 once, tool-2 once, unfixable once");

    let (v, _) = restore_json(&env, "r", &["--only", "tool"]);
    assert_eq!(state(&v, "tool"), "warm");
    assert_eq!(
        what(&v, "tool"),
        "bin/tool: tool 2.1.0".replace("bin/tool", &env.join("r/bin/tool").display().to_string())
    );
    assert_eq!(
        count_lines(&calls),
        after_cold,
        "a warm pin runs no --version"
    );

    // The tool changes under the pin: the stamp no longer matches, so it is checked again.
    script(
        env.join("r/versions/tool-2"),
        &format!("echo call >> {c}; echo 'tool 2.2.0 (new build)'"),
    );
    let (v, _) = restore_json(&env, "r", &["--only", "tool"]);
    assert_eq!(state(&v, "tool"), "done");
    assert_eq!(count_lines(&calls), after_cold + 1);
}

/// The z3 rule: PATH finds a right z3, but the plan exports `~/.local/bin`,
/// where a wrong one is, so a shell after `restore env` runs the wrong one.
/// The pin checks what the shell finds, and one fix links the right z3 into
/// both places that need it.
#[test]
fn restore_pin_checks_the_tool_a_shell_finds_with_the_plans_path_exports() {
    let env = TestEnv::new();
    env.work_repo("r");
    let right = env.join("r/versions/z3-4.13");
    script(right.clone(), "echo 'Z3 version 4.13.0'");
    script(env.join("r/versions/z3-4.8"), "echo 'Z3 version 4.8.17'");
    // What restore's own PATH finds first: the right version.
    std::fs::create_dir_all(env.join("sys")).unwrap();
    std::os::unix::fs::symlink(&right, env.join("sys/z3")).unwrap();
    let local_bin = env.home().join(".local/bin");
    std::fs::create_dir_all(&local_bin).unwrap();
    std::os::unix::fs::symlink(env.join("r/versions/z3-4.8"), local_bin.join("z3")).unwrap();
    manifest(
        &env,
        "r",
        r#"
[env]
path = ["~/.local/bin"]

[[step]]
name = "z3"
kind = "pin"
tool = "z3"
expect = '^Z3 version 4\.13\.'
fix = { symlink = ["~/.local/bin/z3", "tools/fstar/bin/z3"], target = "versions/z3-4.13" }
"#,
    );
    let path = format!("{}:/usr/bin:/bin", env.join("sys").display());
    let with_path = |args: &[&str]| {
        let mut cmd = env.xtask_in("r");
        cmd.env("PATH", &path).arg("restore").args(args);
        run(&mut cmd)
    };
    let dry: Value =
        serde_json::from_str(&with_path(&["--dry-run", "--json"]).ok().stdout()).unwrap();
    assert_eq!(
        dry["steps"][0]["detail"]["fix"]["symlink"],
        serde_json::json!([
            local_bin.join("z3").display().to_string(),
            env.join("r/tools/fstar/bin/z3").display().to_string()
        ])
    );
    let r = with_path(&["--json"]).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "z3"), "done", "{v:#}");
    assert!(what(&v, "z3").starts_with("fixed (symlink "), "{v:#}");
    for link in [local_bin.join("z3"), env.join("r/tools/fstar/bin/z3")] {
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            right,
            "{}",
            link.display()
        );
    }
    // The shell that evaluated the exports now runs the right z3.
    let mut cmd = std::process::Command::new("bash");
    env.isolate(&mut cmd);
    cmd.current_dir(env.join("r"))
        .env("PATH", &path)
        .env("WS", crate::util::bin())
        .arg("-c")
        .arg("eval \"$(\"$WS\" restore env --shell bash)\" && z3");
    assert_eq!(run(&mut cmd).ok().stdout(), "Z3 version 4.13.0\n");
    let (v, _) = {
        let r = with_path(&["--json"]).ok();
        (serde_json::from_str::<Value>(&r.stdout()).unwrap(), r)
    };
    assert_eq!(state(&v, "z3"), "warm", "{v:#}");
}

/// A pin never checked in this clone says so while it waits (a background
/// step's row is its probe's reason until the worker runs it).
#[test]
fn restore_pin_row_says_not_checked_yet_before_its_first_check() {
    let env = TestEnv::new();
    env.work_repo("r");
    script(env.join("r/bin/tool"), "sleep 1; echo 'tool 1.0'");
    manifest(
        &env,
        "r",
        "[[step]]\nname = \"tool\"\nkind = \"pin\"\nbackground = true\ntool = \"bin/tool\"\nexpect = '^tool 1'\n",
    );
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "tool"), "background", "{v:#}");
    let said = what(&v, "tool");
    assert!(
        said.ends_with("bin/tool not checked yet in this clone"),
        "{said}"
    );
    assert!(!said.contains("since it changed"), "{said}");
}

// ------------------------------------------------------------------ download

/// How the test server answers every download request.
#[derive(Clone)]
enum Behave {
    Serve(Vec<u8>),
    /// Send headers and part of the body, then nothing.
    Stall,
    /// Answer as a proxy that refuses everything.
    Refuse,
}

/// The loopback HTTP server answering as `behave` says.
fn serving(behave: Behave) -> HttpServer {
    HttpServer::start(move |req, conn| match &behave {
        Behave::Serve(body) => reply(conn, 200, body),
        Behave::Stall => {
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\npartial");
            let _ = conn.flush();
            let until = Instant::now() + Duration::from_secs(20);
            while !req.stop.load(Ordering::SeqCst) && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Behave::Refuse => {
            let _ = conn.write_all(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
        }
    })
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn download_manifest(url: &str, sha: &str, extra: &str) -> String {
    format!(
        "[[step]]\nname = \"tool\"\nkind = \"download\"\nurl = \"{url}\"\nsha256 = \"{sha}\"\ndest = \"tools/bin/tool\"\nexecutable = true\n{extra}"
    )
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn restore_download_installs_once_and_refuses_a_wrong_pin() {
    let env = TestEnv::new();
    env.work_repo("r");
    let v1 = b"#!/bin/sh\necho tool v1\n".to_vec();
    let server = serving(Behave::Serve(v1.clone()));
    manifest(
        &env,
        "r",
        &download_manifest(&server.url("tool"), &sha256_hex(&v1), ""),
    );
    let dest = env.join("r/tools/bin/tool");

    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "tool"), "done", "{v:#}");
    assert_eq!(std::fs::read(&dest).unwrap(), v1);
    assert_eq!(crate::util::sha256sum(&dest), sha256_hex(&v1));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&dest).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o755);
    assert_eq!(server.hits(), 1);

    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "tool"), "warm");
    assert_eq!(
        server.hits(),
        1,
        "a warm download does not go to the network"
    );

    // The pin moves to bytes the server does not have: refused, old file intact.
    let wanted = b"#!/bin/sh\necho tool v2\n";
    manifest(
        &env,
        "r",
        &download_manifest(&server.url("tool"), &sha256_hex(wanted), ""),
    );
    let (v, r) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "tool"), "failed-open", "{v:#}");
    let w = what(&v, "tool");
    assert!(
        w.contains("sha256 mismatch") && w.contains("nothing installed"),
        "{w}"
    );
    assert!(w.contains(&sha256_hex(&v1)), "names what it got: {w}");
    assert!(
        r.stderr().contains("restore: tool failed"),
        "{}",
        r.stderr()
    );
    assert_eq!(std::fs::read(&dest).unwrap(), v1);
    assert_eq!(
        dir_names(&env.join("r/tools/bin")),
        ["tool"],
        "no temp file left"
    );
    assert_eq!(server.hits(), 2);
    restore(&env, "r", &["--strict"]).expect_code(11);

    // On a fresh machine a wrong pin installs nothing at all.
    let env2 = TestEnv::new();
    env2.work_repo("r");
    manifest(
        &env2,
        "r",
        &download_manifest(&server.url("tool"), &sha256_hex(wanted), ""),
    );
    let (v, _) = restore_json(&env2, "r", &[]);
    assert_eq!(state(&v, "tool"), "failed-open");
    assert!(!env2.join("r/tools/bin/tool").exists());
    assert!(dir_names(&env2.join("r/tools/bin")).is_empty());
}

/// A `.conda` download: pinned, then unpacked by the conda module into the
/// step's prefix (`only` filters, placeholders rewritten), once.
#[test]
fn restore_download_unpacks_a_conda_package_into_its_prefix_once() {
    let env = TestEnv::new();
    env.work_repo("r");
    let fixture =
        crate::util::source_root().join("tests/fixtures/conda/wsfixture-1.2.3-h0_0.conda");
    let bytes = std::fs::read(&fixture).unwrap();
    let server = serving(Behave::Serve(bytes.clone()));
    let prefix = env.join("opt/ws");
    let step = |sha: &str| {
        format!(
            "[[step]]\nname = \"pkg\"\nkind = \"download\"\nurl = \"{}\"\nsha256 = \"{sha}\"\ndest = \"dl/wsfixture-1.2.3-h0_0.conda\"\nunpack_into = \"{}\"\nonly = [\"bin/\", \"lib/\"]\n",
            server.url("wsfixture-1.2.3-h0_0.conda"),
            prefix.display()
        )
    };
    manifest(&env, "r", &step(&sha256_hex(&bytes)));

    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "pkg"), "done", "{v:#}");
    let w = what(&v, "pkg");
    assert!(w.contains("unpacked wsfixture 1.2.3 into"), "{w}");
    assert_eq!(
        std::fs::read(env.join("r/dl/wsfixture-1.2.3-h0_0.conda")).unwrap(),
        bytes
    );
    let tool = std::fs::read_to_string(prefix.join("bin/wsfixture-tool")).unwrap();
    assert!(
        tool.contains(&format!("installed in {}", prefix.display())),
        "placeholder rewritten to the prefix: {tool}"
    );
    assert!(prefix.join("lib/libwsfixture.so.1.0").is_file());
    assert_eq!(dir_names(&prefix), ["bin", "lib"], "only bin/ and lib/");
    assert_eq!(server.hits(), 1);

    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "pkg"), "warm", "{v:#}");
    assert_eq!(server.hits(), 1, "a warm package download needs no network");
    // The prefix gone: the probe notices and the next run installs again.
    std::fs::remove_dir_all(&prefix).unwrap();
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "pkg"), "done", "{v:#}");
    assert!(prefix.join("bin/wsfixture-tool").is_file());

    // Pinned bytes that are not a package: refused by the conda module,
    // nothing installed, neither the file nor anything in a new prefix.
    let env2 = TestEnv::new();
    env2.work_repo("r");
    let junk = b"not a package\n".to_vec();
    let server2 = serving(Behave::Serve(junk.clone()));
    let prefix2 = env2.join("opt/ws");
    manifest(
        &env2,
        "r",
        &step(&sha256_hex(&junk))
            .replace(&server.url(""), &server2.url(""))
            .replace(
                &prefix.display().to_string(),
                &prefix2.display().to_string(),
            ),
    );
    let (v, r) = restore_json(&env2, "r", &[]);
    assert_eq!(state(&v, "pkg"), "failed-open", "{v:#}");
    let w = what(&v, "pkg");
    assert!(
        w.contains("is neither a .conda") && w.contains("not installed"),
        "{w}"
    );
    assert!(r.stderr().contains("restore: pkg failed"), "{}", r.stderr());
    assert!(
        dir_names(&env2.join("r/dl")).is_empty(),
        "no file, no temp file"
    );
    assert!(dir_names(&prefix2).is_empty(), "nothing in the prefix");
}

#[test]
fn restore_download_stall_times_out_retries_and_fails_clearly() {
    let env = TestEnv::new();
    env.work_repo("r");
    let server = serving(Behave::Stall);
    manifest(
        &env,
        "r",
        &download_manifest(
            &server.url("slow"),
            &"0".repeat(64),
            "connect_timeout = \"2s\"\nread_timeout = \"1s\"\nretries = 2\nbackoff = \"100ms\"\n",
        ),
    );
    let start = Instant::now();
    let (v, _) = restore_json(&env, "r", &[]);
    let took = start.elapsed();
    assert_eq!(state(&v, "tool"), "failed-open", "{v:#}");
    let w = what(&v, "tool");
    assert!(
        w.contains("after 3 attempt(s)") && w.contains("timed out"),
        "{w}"
    );
    assert!(w.contains("nothing installed"), "{w}");
    assert_eq!(server.hits(), 3, "first try and two retries");
    // Three stalls of 1 s plus 0.1 + 0.2 s of backoff: bounded well below a minute.
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert!(!env.join("r/tools/bin/tool").exists());
    assert!(dir_names(&env.join("r/tools/bin")).is_empty());
    let log = std::fs::read_to_string(row(&v, "tool")["log"].as_str().unwrap()).unwrap();
    assert_eq!(log.matches("retry ").count(), 2, "{log}");
}

#[test]
fn restore_download_honours_proxy_variables() {
    let env = TestEnv::new();
    env.work_repo("r");
    let proxy = serving(Behave::Refuse);
    manifest(
        &env,
        "r",
        &download_manifest(
            "https://127.0.0.1:9/tool",
            &"0".repeat(64),
            "retries = 0\nconnect_timeout = \"2s\"\nread_timeout = \"2s\"\n",
        ),
    );
    let proxy_url = format!("http://127.0.0.1:{}", proxy.port);
    for var in ["https_proxy", "HTTPS_PROXY"] {
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "--json"])
            .env_remove("https_proxy")
            .env_remove("HTTPS_PROXY")
            .env_remove("no_proxy")
            .env_remove("NO_PROXY")
            .env(var, &proxy_url);
        let r = run(&mut cmd).ok();
        assert!(r.stdout().contains("failed-open"), "{}", r.stdout());
    }
    assert_eq!(
        proxy.requests(),
        [
            "CONNECT 127.0.0.1:9 HTTP/1.1",
            "CONNECT 127.0.0.1:9 HTTP/1.1"
        ]
    );
    // no_proxy sends it direct: the proxy sees nothing more.
    let mut cmd = env.xtask_in("r");
    cmd.args(["restore", "--json"])
        .env("https_proxy", &proxy_url)
        .env("no_proxy", "127.0.0.1");
    run(&mut cmd).ok();
    assert_eq!(proxy.hits(), 2);
}

// ----------------------------------------------------------------- freshness

/// origin.git, a developer clone `dev` that pushes, and the machine's clone `box`.
fn freshness_world(env: &TestEnv) {
    let origin = env.bare_remote("origin.git");
    let dev = env.work_repo("dev");
    env.git(&dev, ["push", "-q", origin.to_str().unwrap(), "main"]);
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    manifest(
        env,
        "box",
        "[[step]]\nname = \"fresh\"\nkind = \"freshness\"\ntimeout = \"3s\"\ninterval = \"0s\"\n",
    );
}

fn advance_origin(env: &TestEnv, n: usize) {
    let origin = env.join("origin.git");
    for i in 0..n {
        write(env.join(format!("dev/file{i}.txt")), "x");
        env.git("dev", ["add", "-A"]);
        env.git("dev", ["commit", "-q", "-m", &format!("remote change {i}")]);
    }
    env.git("dev", ["push", "-q", origin.to_str().unwrap(), "main"]);
}

fn head(env: &TestEnv, repo: &str) -> String {
    env.git(repo, ["rev-parse", "HEAD"]).trim().to_string()
}

#[test]
fn restore_freshness_fast_forwards_when_behind_and_clean() {
    let env = TestEnv::new();
    freshness_world(&env);
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(what(&v, "fresh"), "main is up to date with origin/main");
    advance_origin(&env, 2);
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "done");
    assert!(
        what(&v, "fresh").starts_with("fast-forwarded main by 2 commit(s) to origin/main"),
        "{}",
        what(&v, "fresh")
    );
    assert_eq!(head(&env, "box"), head(&env, "dev"));
    assert!(env.join("box/file1.txt").exists());
}

#[test]
fn restore_freshness_behind_and_dirty_warns_and_touches_nothing() {
    let env = TestEnv::new();
    freshness_world(&env);
    advance_origin(&env, 1);
    write(env.join("box/README.md"), "local edit\n");
    let before = head(&env, "box");
    let (v, r) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "warned", "{v:#}");
    assert!(
        r.stderr().contains(
            "WARNING: main is 1 commit(s) behind origin/main and the work tree has local changes: nothing was changed"
        ),
        "{}",
        r.stderr()
    );
    assert_eq!(head(&env, "box"), before);
    assert_eq!(
        std::fs::read_to_string(env.join("box/README.md")).unwrap(),
        "local edit\n"
    );
    assert!(!env.join("box/file0.txt").exists());
}

#[test]
fn restore_freshness_diverged_warns() {
    let env = TestEnv::new();
    freshness_world(&env);
    advance_origin(&env, 1);
    write(env.join("box/mine.txt"), "local commit");
    env.git("box", ["add", "mine.txt"]);
    env.git("box", ["commit", "-q", "-m", "local"]);
    let before = head(&env, "box");
    let (v, r) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "warned", "{v:#}");
    assert!(
        r.stderr()
            .contains("WARNING: main and origin/main have diverged (1 local, 1 remote commit(s))"),
        "{}",
        r.stderr()
    );
    assert_eq!(head(&env, "box"), before);
}

/// A branch made on this machine has no upstream: that is said, with what
/// it was compared with, and never as the remote being offline.
#[test]
fn restore_freshness_on_a_branch_with_no_upstream_says_so() {
    let env = TestEnv::new();
    freshness_world(&env);
    env.git("box", ["checkout", "-q", "-b", "topic"]);
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "failed-open", "{v:#}");
    let said = what(&v, "fresh");
    assert!(
        said.starts_with("topic has no upstream, and origin has no branch topic to compare it with: push it (`git push -u origin topic`)"),
        "{said}"
    );
    assert!(
        !said.contains("offline") && !said.contains("unreachable"),
        "{said}"
    );
    // The remote has a branch of that name, still no upstream: compared with it, and said.
    let origin = env.join("origin.git");
    env.git("box", ["push", "-q", origin.to_str().unwrap(), "topic"]);
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "done", "{v:#}");
    assert_eq!(
        what(&v, "fresh"),
        "topic is up to date with origin/topic (no upstream is set for topic; compared with the remote's branch of that name)"
    );
}

#[test]
fn restore_freshness_unreachable_remote_is_said_within_the_bound() {
    let env = TestEnv::new();
    freshness_world(&env);
    // A closed port: refused at once.
    let closed = crate::util::git_daemon::free_port();
    env.git(
        "box",
        [
            "remote",
            "set-url",
            "origin",
            &format!("git://127.0.0.1:{closed}/origin.git"),
        ],
    );
    let (v, _) = restore_json(&env, "box", &[]);
    assert_eq!(state(&v, "fresh"), "failed-open");
    assert!(
        what(&v, "fresh").starts_with("offline or unreachable: fetching origin/main failed"),
        "{}",
        what(&v, "fresh")
    );
    // A remote that accepts and never answers: cut off at the 3 s bound.
    let silent = TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = silent.local_addr().unwrap().port();
    env.git(
        "box",
        [
            "remote",
            "set-url",
            "origin",
            &format!("git://127.0.0.1:{port}/origin.git"),
        ],
    );
    let start = Instant::now();
    let (v, _) = restore_json(&env, "box", &[]);
    let took = start.elapsed();
    assert_eq!(
        what(&v, "fresh"),
        "offline or unreachable: origin did not answer within 3.0s; main not refreshed"
    );
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(15),
        "took {took:?}"
    );
    drop(silent);
}

// --------------------------------------------------- background and status

fn status_json(env: &TestEnv, repo: &str) -> Value {
    let mut cmd = env.xtask_in(repo);
    cmd.args(["restore", "status", "--json"]);
    let r = run(&mut cmd).ok();
    serde_json::from_str(&r.stdout()).unwrap()
}

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn restore_background_steps_continue_after_return_and_status_shows_progress() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "r",
        r#"
[[step]]
name = "quick"
kind = "command"
run = "touch quick-done"
creates = "quick-done"

[[step]]
name = "slow"
kind = "command"
background = true
run = "while [ ! -e go ]; do sleep 0.05; done; touch slow-done"
creates = "slow-done"
"#,
    );
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "quick"), "done");
    assert_eq!(state(&v, "slow"), "background");
    let pid = v["background_pid"].as_u64().expect("a worker pid");
    assert_eq!(row(&v, "slow")["pid"].as_u64(), Some(pid));
    // The command returned while the step waits for `go`: the worker is alive.
    assert!(!env.join("r/slow-done").exists());
    wait_for("the worker to start the step", || {
        let s = status_json(&env, "r");
        state(&s, "slow") == "running" && row(&s, "slow")["alive"] == true
    });
    // A second restore meanwhile does not start another worker.
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "slow"), "running", "{v:#}");
    assert!(v["background_pid"].is_null());

    write(env.join("r/go"), "");
    wait_for("the background step to finish", || {
        state(&status_json(&env, "r"), "slow") == "done"
    });
    assert!(env.join("r/slow-done").exists());
    let s = status_json(&env, "r");
    assert_eq!(s["running"], false);
    assert!(row(&s, "slow")["last_cold_ms"].as_u64().is_some());
    let (v, _) = restore_json(&env, "r", &[]);
    assert_eq!(state(&v, "slow"), "warm");
    assert!(v["background_pid"].is_null());
}

#[test]
fn restore_background_flag_returns_at_once() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "r",
        "[[step]]\nname = \"wait\"\nkind = \"command\"\nrun = \"while [ ! -e go ]; do sleep 0.05; done; touch done\"\ncreates = \"done\"\n",
    );
    let r = restore(&env, "r", &["--background"]).ok();
    assert!(
        r.stdout().contains("continues in the background (pid "),
        "{}",
        r.stdout()
    );
    assert!(!env.join("r/done").exists());
    write(env.join("r/go"), "");
    wait_for("the worker to finish", || {
        state(&status_json(&env, "r"), "wait") == "done"
    });
    assert!(env.join("r/done").exists());
    // --strict runs everything in the foreground: it cannot be combined.
    restore(&env, "r", &["--background", "--strict"]).expect_code(2);
}

// ------------------------------------------------------------ bad input

#[test]
fn restore_bad_input_has_its_own_exit_codes() {
    let env = TestEnv::new();
    env.work_repo("r");
    let r = restore(&env, "r", &[]).expect_code(10);
    assert!(
        r.stderr().contains("restore.toml does not exist"),
        "{}",
        r.stderr()
    );

    manifest(
        &env,
        "r",
        "[[step]]\nname = \"d\"\nkind = \"download\"\nurl = \"http://example.org/x\"\nsha256 = \"00\"\ndest = \"x\"\n",
    );
    let r = restore(&env, "r", &["--dry-run"]).expect_code(10);
    assert!(
        r.stderr().contains("step 1 (\"d\"): `url`") && r.stderr().contains("must be https://"),
        "{}",
        r.stderr()
    );
    assert_eq!(r.stderr().lines().count(), 1, "{}", r.stderr());

    manifest(
        &env,
        "r",
        "[[step]]\nname = \"c\"\nkind = \"command\"\nrun = \"touch made\"\ncreates = \"made\"\n",
    );
    let r = restore(&env, "r", &["--only", "nope"]).expect_code(2);
    assert!(
        r.stderr().contains("no step named \"nope\""),
        "{}",
        r.stderr()
    );

    // --dry-run prints the plan and runs nothing.
    let r = restore(&env, "r", &["--dry-run"]).ok();
    assert!(r.stdout().contains("1. c (command)"), "{}", r.stdout());
    assert!(!env.join("r/made").exists());
    assert!(!env.join("r/.git/warmstart").exists());

    // A corrupt state file: status refuses (5) and keeps it; restore sets it aside.
    restore(&env, "r", &[]).ok();
    let state_file = env.join("r/.git/warmstart/restore/state.json");
    std::fs::write(&state_file, "{ truncated").unwrap();
    let mut cmd = env.xtask_in("r");
    cmd.args(["restore", "status"]);
    let r = run(&mut cmd).expect_code(5);
    assert!(r.stderr().contains("is corrupt"), "{}", r.stderr());
    assert_eq!(std::fs::read_to_string(&state_file).unwrap(), "{ truncated");
    std::fs::remove_file(env.join("r/made")).unwrap();
    let r = restore(&env, "r", &[]).ok();
    assert!(r.stderr().contains("kept it as"), "{}", r.stderr());
    let kept: Vec<_> = dir_names(&env.join("r/.git/warmstart/restore"))
        .into_iter()
        .filter(|n| n.contains("corrupt"))
        .collect();
    assert_eq!(kept.len(), 1);
    assert_eq!(state(&status_json(&env, "r"), "c"), "done");
}

// ------------------------------- tools/bootstrap.sh (tools/warmstart-bootstrap.sh)

/// A repository shaped like this one (the paths the xtask-bin key covers, the
/// real bootstrap script and xtask-bin manifest), pushed to origin.git.
fn bootstrap_world(env: &TestEnv) -> PathBuf {
    let origin = env.bare_remote("origin.git");
    let src = env.work_repo("src");
    let real = crate::util::source_root();
    write(src.join("xtask/src/main.rs"), "fn main() {}\n");
    write(src.join("Cargo.toml"), "[workspace]\n");
    write(src.join("Cargo.lock"), "version = 4\n");
    for f in [
        "tools/bootstrap.sh",
        "tools/warmstart-bootstrap.sh",
        "cache-manifests/xtask-bin.toml",
    ] {
        std::fs::create_dir_all(src.join(f).parent().unwrap()).unwrap();
        std::fs::copy(real.join(f), src.join(f)).unwrap();
    }
    manifest(
        env,
        "src",
        "[[step]]\nname = \"marker\"\nkind = \"command\"\nrun = \"touch restored-marker\"\ncreates = \"restored-marker\"\n",
    );
    env.git(&src, ["add", "-A"]);
    env.git(
        &src,
        ["commit", "-q", "-m", "a repository with a bootstrap"],
    );
    env.git(&src, ["push", "-q", origin.to_str().unwrap(), "main"]);
    src
}

fn sh(env: &TestEnv, cwd: &Path, script: &str) {
    let mut cmd = std::process::Command::new("sh");
    cmd.args(["-ec", script]).current_dir(cwd);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{script}\n{}",
        crate::util::show(&out)
    );
}

/// Publishes the real xtask binary under `key` as the cache branch format v1
/// does (tar | zstd, split into parts, SHA256SUMS), optionally with one part
/// altered after its sum was taken.
fn publish_xtask_bin(env: &TestEnv, key: &str, tamper: bool) {
    let stage = env.join(format!("publish-{tamper}"));
    std::fs::create_dir_all(stage.join("payload")).unwrap();
    std::fs::copy(crate::util::bin(), stage.join("payload/warmstart")).unwrap();
    env.git(&stage, ["init", "-q", "-b", "xtask-bin-cache"]);
    sh(
        env,
        &stage,
        &format!(
            "tar -C payload -cf - warmstart | zstd -q -1 | split -b 2M -d -a 3 - {key}.tar.zst.part
             sha256sum {key}.tar.zst.part* > SHA256SUMS
             rm -r payload"
        ),
    );
    if tamper {
        // Flip a byte after SHA256SUMS was written. (Writing a fixed byte
        // was a no-op for a build whose byte 100 of part001 was already it.)
        let part = stage.join(format!("{key}.tar.zst.part001"));
        let mut bytes = std::fs::read(&part).unwrap();
        bytes[100] ^= 0xff;
        std::fs::write(&part, bytes).unwrap();
    }
    env.git(&stage, ["add", "-A"]);
    env.git(&stage, ["commit", "-q", "-m", "xtask-bin cache"]);
    let origin = env.join("origin.git");
    env.git(
        &stage,
        [
            "push",
            "-q",
            "-f",
            origin.to_str().unwrap(),
            "xtask-bin-cache",
        ],
    );
}

fn bootstrap(env: &TestEnv, repo: &str, args: &[&str]) -> Run {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(env.join(repo).join("tools/bootstrap.sh"))
        .args(args)
        .current_dir(env.join(repo));
    env.isolate(&mut cmd);
    run(&mut cmd)
}

#[test]
fn restore_bootstrap_key_matches_the_cache_module() {
    let env = TestEnv::new();
    let src = bootstrap_world(&env);
    let script_key = bootstrap(&env, "src", &["--print-key"]).ok().stdout();
    let repo = warmstart::repo::Repo::discover(&src).unwrap();
    let m = warmstart::cache::manifests::load(&repo, "xtask-bin").unwrap();
    let shell = xshell::Shell::new().unwrap();
    let key = warmstart::cache::manifests::compute_key(&shell, &repo, &m).unwrap();
    assert_eq!(script_key.trim(), key.value);
}

#[test]
fn restore_bootstrap_uses_the_verified_prebuilt_binary_then_stays_warm() {
    let env = TestEnv::new();
    bootstrap_world(&env);
    let key = bootstrap(&env, "src", &["--print-key"]).ok().stdout();
    let key = key.trim();
    publish_xtask_bin(&env, key, false);
    let origin = env.join("origin.git");
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);

    let r = bootstrap(&env, "box", &["--prebuilt-only", "--json"]).ok();
    assert!(
        r.stderr()
            .contains(&format!("binary cache: installed {key}")),
        "{}",
        r.stderr()
    );
    let installed = env.join("box/target/warmstart-bin/warmstart");
    assert_eq!(
        crate::util::sha256sum(&installed),
        crate::util::sha256sum(&crate::util::bin())
    );
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "marker"), "done");
    assert!(env.join("box/restored-marker").exists());
    assert!(
        dir_names(&env.join("box/target"))
            .iter()
            .all(|n| !n.starts_with(".bootstrap")),
        "no staging left behind"
    );

    // Warm: the origin may be gone; the installed binary for this key is used.
    env.git(
        "box",
        ["remote", "set-url", "origin", "/nonexistent/origin.git"],
    );
    let r = bootstrap(&env, "box", &["--prebuilt-only", "--json"]).ok();
    assert!(
        !r.stderr().contains("binary cache: installed"),
        "{}",
        r.stderr()
    );
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "marker"), "warm");

    // Local edits to the source: the prebuilt binary no longer matches it.
    write(
        env.join("box/xtask/src/main.rs"),
        "fn main() { edited() }\n",
    );
    let r = bootstrap(&env, "box", &["--prebuilt-only"]).expect_code(1);
    assert!(r.stderr().contains("local changes"), "{}", r.stderr());
}

#[test]
fn restore_bootstrap_refuses_a_tampered_part() {
    let env = TestEnv::new();
    bootstrap_world(&env);
    let key = bootstrap(&env, "src", &["--print-key"]).ok().stdout();
    publish_xtask_bin(&env, key.trim(), true);
    let origin = env.join("origin.git");
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let r = bootstrap(&env, "box", &["--prebuilt-only"]).expect_code(1);
    assert!(r.stderr().contains("sha256sum -c failed"), "{}", r.stderr());
    assert!(!env.join("box/target/warmstart-bin").exists());
    assert!(!env.join("box/restored-marker").exists());
    assert!(
        dir_names(&env.join("box/target"))
            .iter()
            .all(|n| !n.starts_with(".bootstrap")),
        "no staging left behind"
    );
}

/// The bootstrap and the cache module share one install: a binary that
/// `cache restore xtask-bin` (or restore.toml's cache step) installed for
/// this key is warm for tools/bootstrap.sh too, with the origin gone.
#[test]
fn restore_bootstrap_is_warm_after_the_cache_module_installed_the_binary() {
    let env = TestEnv::new();
    let src = bootstrap_world(&env);
    let release = src.join("target/release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::copy(crate::util::bin(), release.join("warmstart")).unwrap();
    write(src.join(".git/info/exclude"), "target/\n");
    let origin = env.join("origin.git");
    env.git(&src, ["remote", "add", "origin", origin.to_str().unwrap()]);
    run(env.xtask_in(&src).args([
        "cache",
        "publish",
        "xtask-bin",
        "--allow-ungated",
        "--quiet",
    ]))
    .ok();
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let r = run(env.xtask_in("box").args(["cache", "restore", "xtask-bin"])).ok();
    assert!(r.stdout().contains("restored xtask_bin-"), "{}", r.stdout());

    env.git(
        "box",
        ["remote", "set-url", "origin", "/nonexistent/origin.git"],
    );
    let r = bootstrap(&env, "box", &["--prebuilt-only", "--json"]).ok();
    assert!(
        r.stderr().contains("running") && r.stderr().contains("warmstart-bin/warmstart restore"),
        "{}",
        r.stderr()
    );
    assert!(
        !r.stderr().contains("binary cache: installed"),
        "{}",
        r.stderr()
    );
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "marker"), "done");
    assert!(
        !env.join("box/.git/warmstart/bootstrap").exists(),
        "no second install, no second key file"
    );
}

/// CARGO_TARGET_DIR moves the xtask-bin cache's pack root, install
/// directory and compile output (`$CARGO_TARGET_DIR/` in
/// cache-manifests/xtask-bin.toml), and the bootstrap script expands it
/// alike: it runs the binary `cache restore` installed there, and its
/// compile fallback runs the binary from there.
#[test]
fn restore_bootstrap_and_the_cache_module_follow_cargo_target_dir() {
    let env = TestEnv::new();
    let src = bootstrap_world(&env);
    let built = env.join("built-elsewhere");
    std::fs::create_dir_all(built.join("release")).unwrap();
    std::fs::copy(crate::util::bin(), built.join("release/warmstart")).unwrap();
    let origin = env.join("origin.git");
    env.git(&src, ["remote", "add", "origin", origin.to_str().unwrap()]);
    let publish = ["cache", "publish", "xtask-bin", "--allow-ungated"];
    // Unset, the pack root is src/target/release, which does not exist.
    let r = run(env.xtask_in(&src).args(publish));
    assert_ne!(r.code(), 0, "{}", r.stderr());
    assert!(r.stderr().contains("src/target/release"), "{}", r.stderr());
    run(env
        .xtask_in(&src)
        .args(publish)
        .arg("--quiet")
        .env("CARGO_TARGET_DIR", &built))
    .ok();

    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let target = env.join("shared-target");
    run(env
        .xtask_in("box")
        .args(["cache", "restore", "xtask-bin", "--quiet"])
        .env("CARGO_TARGET_DIR", &target))
    .ok();
    let installed = target.join("warmstart-bin/warmstart");
    assert_eq!(
        crate::util::sha256sum(&installed),
        crate::util::sha256sum(&crate::util::bin())
    );
    assert!(!env.join("box/target").exists(), "nothing under box/target");

    env.git(
        "box",
        ["remote", "set-url", "origin", "/nonexistent/origin.git"],
    );
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(env.join("box/tools/bootstrap.sh"))
        .args(["--prebuilt-only", "--json"])
        .current_dir(env.join("box"));
    env.isolate(&mut cmd);
    let r = run(cmd.env("CARGO_TARGET_DIR", &target)).ok();
    assert!(
        r.stderr()
            .contains(&format!("running {} restore", installed.display())),
        "{}",
        r.stderr()
    );
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(state(&v, "marker"), "done");

    // The compile fallback runs `$CARGO_TARGET_DIR/release/warmstart`: a
    // `cargo` stand-in first on PATH "builds" it there.
    let fake = env.join("fake-bin");
    std::fs::create_dir_all(&fake).unwrap();
    let cargo = fake.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\nmkdir -p \"$CARGO_TARGET_DIR/release\" && cp {} \"$CARGO_TARGET_DIR/release/warmstart\"\n",
            crate::util::bin().display()
        ),
    )
    .unwrap();
    let mut perm = std::fs::metadata(&cargo).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&cargo, perm).unwrap();
    let other = env.join("other-target");
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(env.join("box/tools/bootstrap.sh"))
        .args(["--no-prebuilt", "--json"])
        .current_dir(env.join("box"));
    env.isolate(&mut cmd);
    let path = format!("{}:{}", fake.display(), std::env::var("PATH").unwrap());
    let r = run(cmd.env("CARGO_TARGET_DIR", &other).env("PATH", path)).ok();
    assert!(
        r.stderr().contains(&format!(
            "running {} restore",
            other.join("release/warmstart").display()
        )),
        "{}",
        r.stderr()
    );
}
