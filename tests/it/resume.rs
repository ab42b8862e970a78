//! `cargo xtask resume`: the crash-resume index, through the real binary,
//! against real concurrent processes and the JavaScript protocol fixture
//! (`tests/fixtures/crash-resume-index.js`, run with the system's node).

use crate::util::{Run, TestEnv, run, show, source_root};
use serde_json::{Value, json};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One test's index file, `<tmp>/golems/index.json`.
pub(crate) struct Idx {
    pub(crate) env: TestEnv,
    pub(crate) path: PathBuf,
}

impl Idx {
    pub(crate) fn new() -> Idx {
        let env = TestEnv::new();
        let path = env.join("golems/index.json");
        Idx { env, path }
    }

    pub(crate) fn dir(&self) -> PathBuf {
        self.path.parent().unwrap().to_path_buf()
    }

    pub(crate) fn lock(&self) -> PathBuf {
        PathBuf::from(format!("{}.lock", self.path.display()))
    }

    /// `xtask resume --path <index> <args>`.
    pub(crate) fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = self.env.xtask();
        cmd.args(["resume", "--path"]).arg(&self.path).args(args);
        cmd
    }

    pub(crate) fn run(&self, args: &[&str]) -> Run {
        run(&mut self.cmd(args))
    }

    /// `cmd` with a long lock wait: for tests of correctness under
    /// contention, which a busy machine must not turn into a timeout.
    pub(crate) fn patient(&self, args: &[&str]) -> Command {
        let mut cmd = self.cmd(args);
        cmd.env("WARMSTART_RESUME_LOCK_WAIT_MS", PATIENT_MS);
        cmd
    }

    /// The JavaScript fixture on this index.
    pub(crate) fn node(&self, args: &[&str]) -> Command {
        let mut cmd = node();
        cmd.arg(source_root().join("tests/fixtures/crash-resume-index.js"))
            .args(args)
            .env("CRASH_RESUME_INDEX_PATH", &self.path)
            .env("HOME", self.env.home());
        cmd
    }

    fn plant(&self, value: &Value) {
        fs::create_dir_all(self.dir()).unwrap();
        fs::write(&self.path, serde_json::to_vec(value).unwrap()).unwrap();
    }

    fn read(&self) -> Value {
        serde_json::from_slice(&fs::read(&self.path).unwrap()).unwrap()
    }

    pub(crate) fn bytes(&self) -> Vec<u8> {
        fs::read(&self.path).unwrap()
    }

    /// Names in the index's directory other than the index itself.
    pub(crate) fn leftovers(&self) -> Vec<String> {
        let name = self
            .path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut names: Vec<_> = fs::read_dir(self.dir())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| *n != name)
            .collect();
        names.sort();
        names
    }
}

pub(crate) const PATIENT_MS: &str = "60000";

pub(crate) fn node() -> Command {
    let probe = Command::new("node").arg("--version").output();
    assert!(
        probe.is_ok_and(|o| o.status.success()),
        "node is required for the resume tests: run tools/test.sh, which installs it"
    );
    Command::new("node")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn entry(surface: &str, session: &str, repo: Value, last_active: i64) -> Value {
    json!({
        "surfaceId": surface,
        "sessionId": session,
        "repo": repo,
        "role": null,
        "captured_at": last_active,
        "last_active": last_active,
    })
}

pub(crate) fn wait_all(children: Vec<Child>) -> Vec<std::process::Output> {
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

pub(crate) fn spawn(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs a command that must finish within `limit` (it must never block).
fn run_within(cmd: &mut Command, limit: Duration) -> Run {
    let mut child = spawn(cmd);
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            child.kill().unwrap();
            panic!("{cmd:?} still running after {limit:?}: it blocked");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Run {
        out: child.wait_with_output().unwrap(),
    }
}

#[test]
fn record_then_lookup_prints_the_entry() {
    let idx = Idx::new();
    fs::create_dir_all(idx.env.join("work dir")).unwrap();
    let mut cmd = idx.cmd(&[
        "record",
        "s1",
        "sess-1",
        "Warmstart",
        "lead",
        "--cwd",
        "work dir",
    ]);
    run(&mut cmd).ok();
    let out = idx.run(&["lookup", "s1"]).ok().stdout();
    let e: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(e["surfaceId"], "s1");
    assert_eq!(e["sessionId"], "sess-1");
    assert_eq!(e["repo"], "Warmstart");
    assert_eq!(e["role"], "lead");
    assert_eq!(e["cwd"], idx.env.join("work dir").display().to_string());
    assert!(e["captured_at"].is_i64() && e["captured_at"] == e["last_active"]);
    let age = now_ms() - e["last_active"].as_i64().unwrap();
    assert!((0..60_000).contains(&age), "last_active is not now: {e}");
    // Without a role the entry stores null.
    idx.run(&["record", "s2", "sess-2", "warmstart"]).ok();
    assert_eq!(idx.read()["entries"]["s2"]["role"], Value::Null);
}

#[test]
fn rerecord_keeps_captured_at_and_unknown_fields() {
    let idx = Idx::new();
    let mut e = entry("s1", "sess-1", json!("ws"), 1000);
    e["captured_at"] = json!(500.25);
    e["pid"] = json!(4242);
    idx.plant(&json!({"version": 1, "host": "box-7", "entries": {"s1": e}}));
    idx.run(&["record", "s1", "sess-1", "ws"]).ok();
    let got = idx.read();
    let s1 = &got["entries"]["s1"];
    assert_eq!(s1["captured_at"], json!(500.25));
    assert_eq!(s1["pid"], 4242);
    assert!(s1["last_active"].as_i64().unwrap() > 1000);
    assert_eq!(got["host"], "box-7");
}

#[test]
fn lookup_of_an_unknown_surface_prints_null() {
    let idx = Idx::new();
    // No index file at all, then an index without the surface.
    assert_eq!(idx.run(&["lookup", "nope"]).ok().stdout(), "null\n");
    assert!(!idx.dir().exists(), "lookup created the index directory");
    idx.run(&["record", "s1", "a", "r"]).ok();
    assert_eq!(idx.run(&["lookup", "nope"]).ok().stdout(), "null\n");
}

#[test]
fn exit_codes_usage_and_nothing_resumable() {
    let idx = Idx::new();
    idx.run(&["record", "s1"]).expect_code(2);
    idx.run(&["resume-cmd", "s1", "soon"]).expect_code(2);
    idx.run(&["prune"]).expect_code(2);
    idx.run(&["frobnicate"]).expect_code(2);
    idx.run(&["record", "", "a", "r"]).expect_code(2);
    idx.run(&["record", "s1", "a\nb", "r"]).expect_code(2);
    assert!(!idx.path.exists(), "a refused record wrote the index");
    let r = idx.run(&["resume-cmd", "s1"]).expect_code(4);
    assert!(r.stderr().contains("nothing to resume"), "{}", r.stderr());
    let r = idx.run(&["touch", "s1"]).expect_code(4);
    assert!(r.stderr().contains("\"s1\""), "{}", r.stderr());
    assert!(
        !idx.path.exists(),
        "touch of an unknown surface created the index"
    );
    idx.run(&["record", "s1", "a", "r"]).ok();
    idx.run(&["resume-cmd", "s1"]).ok();
    idx.run(&["--help"]).ok();
    for sub in ["record", "touch", "lookup", "resume-cmd", "list", "prune"] {
        assert!(idx.run(&[sub, "--help"]).ok().stdout().contains("--path"));
    }
}

#[test]
fn touch_bumps_last_active_of_a_known_surface_only() {
    let idx = Idx::new();
    idx.plant(&json!({"version": 1, "entries": {"s1": entry("s1", "a", json!("r"), 1000)}}));
    idx.run(&["touch", "s1"]).ok();
    let s1 = &idx.read()["entries"]["s1"];
    assert_eq!(s1["captured_at"], 1000);
    assert!(s1["last_active"].as_i64().unwrap() > now_ms() - 60_000);
    let before = idx.bytes();
    idx.run(&["touch", "s2"]).expect_code(4);
    assert_eq!(idx.bytes(), before);
}

#[test]
fn resume_cmd_picks_the_launcher_and_honours_max_age() {
    let idx = Idx::new();
    let now = now_ms();
    let mut with_cwd = entry("a", "id-a", json!("Warmstart"), now);
    with_cwd["cwd"] = json!("/srv/work");
    let mut captured_only = entry("e", "id-e", json!("ws"), 0);
    captured_only.as_object_mut().unwrap().remove("last_active");
    captured_only["captured_at"] = json!(now - 10_000);
    idx.plant(&json!({"version": 1, "entries": {
        "a": with_cwd,
        "b": entry("b", "id-b", json!("orchestrator"), now),
        "c": entry("c", "id-c", Value::Null, now),
        "d": entry("d", "id-d", json!("ws"), now - 120_000),
        "e": captured_only,
    }}));
    let line = |args: &[&str]| idx.run(args).ok().stdout();
    assert_eq!(
        line(&["resume-cmd", "a"]),
        "cd /srv/work && warmstartClaude --resume id-a\n"
    );
    assert_eq!(line(&["resume-cmd", "b"]), "orcClaude --resume id-b\n");
    assert_eq!(line(&["resume-cmd", "c"]), "repoGolem --resume id-c\n");
    // Age is measured from last_active, else captured_at.
    assert_eq!(
        line(&["resume-cmd", "d", "300000"]),
        "wsClaude --resume id-d\n"
    );
    let r = idx.run(&["resume-cmd", "d", "60000"]).expect_code(4);
    assert!(r.stderr().contains("2m ago"), "{}", r.stderr());
    assert_eq!(r.stdout(), "");
    idx.run(&["resume-cmd", "e", "60000"]).ok();
    idx.run(&["resume-cmd", "e", "5000"]).expect_code(4);
    let j: Value = serde_json::from_str(&line(&["resume-cmd", "a", "--json"])).unwrap();
    assert_eq!(j["launcher"], "warmstartClaude");
    assert_eq!(j["cwd"], "/srv/work");
    assert_eq!(
        j["shell_command"],
        "cd /srv/work && warmstartClaude --resume id-a"
    );
}

#[test]
fn resume_cmd_is_safe_to_run_in_a_shell() {
    let idx = Idx::new();
    let hostile_dir = idx.env.join("d'$(touch PWNED) `touch PWNED` ;x");
    fs::create_dir_all(&hostile_dir).unwrap();
    let hostile = [
        "x'; touch PWNED; '",
        "$(touch PWNED)",
        "`touch PWNED`",
        "a b;touch PWNED",
        "-rf|touch PWNED &",
        "\"; touch PWNED #",
        "\\'\\\"*?[a]~{a,b}!$HOME",
        "=x",
    ];
    for (i, id) in hostile.iter().enumerate() {
        let surface = format!("s{i}");
        let mut cmd = idx.cmd(&["record", "--cwd"]);
        cmd.arg(&hostile_dir).args(["--", &surface, id, "Evil"]);
        run(&mut cmd).ok();
        let line = idx.run(&["resume-cmd", &surface]).ok().stdout();
        assert_eq!(line.lines().count(), 1, "{line}");
        // Run the line in a real shell with the launcher defined as a
        // function that prints where it runs and what it got.
        let script = format!(
            "evilClaude() {{ pwd; for a in \"$@\"; do printf '%s\\n' \"$a\"; done; }}\n{line}"
        );
        let out = run(Command::new("sh")
            .arg("-c")
            .arg(&script)
            .current_dir(idx.env.path()));
        assert_eq!(
            out.stdout(),
            format!("{}\n--resume\n{id}\n", hostile_dir.display()),
            "line: {line}\n{}",
            show(&out.out)
        );
    }
    // A hostile repo name becomes one quoted (unknown) command word.
    idx.run(&["record", "r1", "id", "x;touch PWNED"]).ok();
    let line = idx.run(&["resume-cmd", "r1"]).ok().stdout();
    let out = run(Command::new("sh")
        .arg("-c")
        .arg(&line)
        .current_dir(idx.env.path()));
    assert_eq!(out.code(), 127, "line: {line}\n{}", show(&out.out));
    let pwned: Vec<_> = walk(idx.env.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "PWNED"))
        .collect();
    assert!(
        pwned.is_empty(),
        "a resume line ran injected code: {pwned:?}"
    );
    // Control characters cannot be quoted safely for a terminal: refused.
    let mut index = idx.read();
    index["entries"]["c1"] = entry("c1", "a\nid; touch PWNED", json!("r"), now_ms());
    index["entries"]["c2"] = entry("c2", "a\u{1b}]2;title\u{7}", json!("r"), now_ms());
    idx.plant(&index);
    for s in ["c1", "c2"] {
        let r = idx.run(&["resume-cmd", s]).expect_code(4);
        assert_eq!(r.stdout(), "");
        assert!(r.stderr().contains("control characters"), "{}", r.stderr());
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

#[test]
fn list_and_prune() {
    let idx = Idx::new();
    let now = now_ms();
    idx.plant(&json!({"version": 1, "entries": {
        "old": entry("old", "id-old", json!("ws"), now - 7_200_000),
        "new": entry("new", "id-new", json!("ws"), now),
        "mid": entry("mid", "id-mid", json!("orchestrator"), now - 120_000),
    }}));
    let table = idx.run(&["list"]).ok().stdout();
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("SURFACE"), "{table}");
    let firsts: Vec<_> = rows[1..]
        .iter()
        .map(|r| r.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(firsts, ["new", "mid", "old"], "{table}");
    assert!(rows[3].contains("2h ago"), "{table}");
    let j: Value = serde_json::from_str(&idx.run(&["list", "--json"]).ok().stdout()).unwrap();
    let order: Vec<_> = j["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["surfaceId"].clone())
        .collect();
    assert_eq!(order, [json!("new"), json!("mid"), json!("old")]);

    let r: Value =
        serde_json::from_str(&idx.run(&["prune", "3600000", "--json"]).ok().stdout()).unwrap();
    assert_eq!(r["pruned"], json!(["old"]));
    assert_eq!(r["remaining"], 2);
    let out = idx.run(&["prune", "60000"]).ok().stdout();
    assert!(out.starts_with("pruned 1 entries"), "{out}");
    let left: Vec<_> = idx.read()["entries"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(left, ["new"]);
    let empty = Idx::new();
    assert!(empty.run(&["list"]).ok().stdout().starts_with("no entries"));
    let none: Value = serde_json::from_str(&empty.run(&["list", "--json"]).ok().stdout()).unwrap();
    assert_eq!(none["entries"], json!([]));
}

#[test]
fn default_path_then_env_then_flag() {
    let env = TestEnv::new();
    let default = env.home().join(".golems/crash-resume-index.json");
    run(env.xtask().args(["resume", "record", "s1", "a", "r"])).ok();
    assert!(default.is_file());
    let from_env = env.join("env/index.json");
    let flag = env.join("flag/index.json");
    run(env
        .xtask()
        .args(["resume", "record", "s2", "b", "r"])
        .env("CRASH_RESUME_INDEX_PATH", &from_env))
    .ok();
    assert!(from_env.is_file());
    run(env
        .xtask()
        .args(["resume", "record", "s3", "c", "r", "--path"])
        .arg(&flag)
        .env("CRASH_RESUME_INDEX_PATH", &from_env))
    .ok();
    let keys = |p: &Path| -> Vec<String> {
        let v: Value = serde_json::from_slice(&fs::read(p).unwrap()).unwrap();
        v["entries"].as_object().unwrap().keys().cloned().collect()
    };
    assert_eq!(keys(&default), ["s1"]);
    assert_eq!(keys(&from_env), ["s2"]);
    assert_eq!(keys(&flag), ["s3"]);
}

/// An index with everything that could make two JSON writers differ:
/// non-ASCII, escapes, control characters, array-index-like keys (which
/// JavaScript orders first), JS number formatting, unknown fields.
const TRICKY: &str = r#"{"version":1.0,"note":"kept \u00e9","entries":{"b-surface":{"surfaceId":"b-surface","sessionId":"é✓😀 \u2028\u2029 \u0001\u001f\u007f \"q\" \\ \t\n\b\f\r </script>","repo":"Ünïcode","role":null,"captured_at":1732934400123.456,"last_active":1e21,"extra":[1.0,-0,0.1,1e-7,0.000001,1E2,-2.5e-10,12345678901234567890,123456789012345680000,9007199254740993,{},[],{"z":true,"10":false,"2":null,"01":1,"4294967295":2,"4294967294":3}]},"10":{"surfaceId":"10","sessionId":"ten","repo":"r","role":"x","captured_at":1,"last_active":2},"2":{"surfaceId":"2","sessionId":"two","repo":"r","role":null,"captured_at":1,"last_active":2},"01":{"surfaceId":"01","sessionId":"zero-one","repo":"r","role":null,"captured_at":1,"last_active":2}}}"#;

#[test]
fn index_bytes_equal_json_stringify_of_the_same_object() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    let original = idx.env.join("original.json");
    fs::write(&original, TRICKY).unwrap();
    fs::write(&idx.path, TRICKY).unwrap();
    idx.run(&["record", "new-surface", "sess-ü", "ws", "lead"])
        .ok();
    let written = idx.bytes();
    // What node writes for the same object: the original, parsed by
    // JavaScript, plus the entry warmstart added.
    let merge = r#"
        const fs = require('fs');
        const x = JSON.parse(fs.readFileSync(process.argv[1], 'utf8'));
        const w = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
        x.entries['new-surface'] = w.entries['new-surface'];
        process.stdout.write(JSON.stringify(x, null, 2) + '\n');
    "#;
    let expected = run(node().arg("-e").arg(merge).arg(&original).arg(&idx.path)).ok();
    assert_eq!(
        String::from_utf8_lossy(&written),
        expected.stdout(),
        "warmstart's bytes differ from JSON.stringify"
    );
    assert_eq!(written, expected.out.stdout);
    // The JavaScript tool reading and rewriting it changes nothing.
    let again = run(&mut idx.node(&["stringify", idx.path.to_str().unwrap()])).ok();
    assert_eq!(again.out.stdout, written);
    // lookup prints the entry exactly as JSON.stringify(entry, null, 2).
    let ours = idx.run(&["lookup", "b-surface"]).ok();
    let theirs = run(&mut idx.node(&["lookup", "b-surface"])).ok();
    assert_eq!(ours.stdout(), theirs.stdout());
}

#[test]
fn sixty_four_concurrent_records_lose_nothing() {
    let idx = Idx::new();
    let children: Vec<Child> = (0..64)
        .map(|i| {
            let surface = format!("surface-{i}");
            let session = format!("session-{i}");
            spawn(&mut idx.patient(&["record", &surface, &session, "warmstart"]))
        })
        .collect();
    for out in wait_all(children) {
        assert!(out.status.success(), "{}", show(&out));
    }
    let index = idx.read();
    let entries = index["entries"].as_object().unwrap();
    assert_eq!(entries.len(), 64, "entries lost: {:?}", entries.keys());
    for i in 0..64 {
        assert_eq!(
            entries[&format!("surface-{i}")]["sessionId"],
            format!("session-{i}")
        );
    }
    assert!(!idx.lock().exists(), "the lock directory was left behind");
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );
}

#[test]
fn rust_and_javascript_writers_share_one_index() {
    let idx = Idx::new();
    let mut children: Vec<Child> = (0..4)
        .map(|i| {
            let mut js = idx.node(&["record-many", &format!("js{i}-"), "8", "js-session", "ws"]);
            spawn(js.env("WARMSTART_RESUME_LOCK_WAIT_MS", PATIENT_MS))
        })
        .collect();
    for i in 0..16 {
        let surface = format!("rs-{i}");
        children.push(spawn(&mut idx.patient(&[
            "record",
            &surface,
            "rs-session",
            "ws",
        ])));
    }
    for out in wait_all(children) {
        assert!(out.status.success(), "{}", show(&out));
    }
    let index = idx.read();
    let entries = index["entries"].as_object().unwrap();
    assert_eq!(
        entries.len(),
        4 * 8 + 16,
        "entries lost: {:?}",
        entries.keys()
    );
    assert!(!idx.lock().exists());
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );
    // Whoever wrote last, the file is what JSON.stringify makes of it.
    let again = run(&mut idx.node(&["stringify", idx.path.to_str().unwrap()])).ok();
    assert_eq!(again.out.stdout, idx.bytes());
}

pub(crate) fn set_mtime_ago(path: &Path, ago: Duration) {
    fs::File::open(path)
        .unwrap()
        .set_modified(SystemTime::now() - ago)
        .unwrap();
}

#[test]
fn a_stale_lock_is_stolen_once_and_nothing_is_lost() {
    let idx = Idx::new();
    idx.plant(
        &json!({"version": 1, "entries": {"keep": entry("keep", "k", json!("ws"), now_ms())}}),
    );
    fs::create_dir(idx.lock()).unwrap();
    set_mtime_ago(&idx.lock(), Duration::from_secs(20));
    let children: Vec<Child> = (0..8)
        .map(|i| spawn(&mut idx.patient(&["record", &format!("s{i}"), "sess", "ws"])))
        .collect();
    let outs = wait_all(children);
    for out in &outs {
        assert!(out.status.success(), "{}", show(out));
    }
    let steals = outs
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stderr).contains("took over the stale index lock"))
        .count();
    assert_eq!(steals, 1, "the stale lock was not stolen exactly once");
    assert_eq!(idx.read()["entries"].as_object().unwrap().len(), 9);
    assert!(!idx.lock().exists());
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );
}

/// Starts the JavaScript fixture holding the lock for `ms`; returns once it holds it.
fn hold_lock(idx: &Idx, ms: u64) -> Child {
    let mut child = spawn(&mut idx.node(&["hold", &ms.to_string()]));
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(
        line, "locked\n",
        "the JavaScript holder did not take the lock"
    );
    child
}

#[test]
fn a_young_lock_held_by_a_live_process_makes_writers_wait_then_fail() {
    let idx = Idx::new();
    idx.run(&["record", "keep", "k", "ws"]).ok();
    let before = idx.bytes();
    let mut holder = hold_lock(&idx, 30_000);
    let start = Instant::now();
    let writers: Vec<Child> = (0..2)
        .map(|i| spawn(&mut idx.cmd(&["record", &format!("w{i}"), "sess", "ws"])))
        .collect();
    let outs = wait_all(writers);
    let waited = start.elapsed();
    holder.kill().unwrap();
    holder.wait().unwrap();
    for out in &outs {
        assert_eq!(out.status.code(), Some(3), "{}", show(out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&idx.lock().display().to_string()), "{err}");
        assert!(err.contains("timed out after 4.0s"), "{err}");
    }
    assert!(
        waited >= Duration::from_secs(3) && waited < Duration::from_secs(15),
        "writers gave up after {waited:?}, not about 4 s"
    );
    assert_eq!(
        idx.bytes(),
        before,
        "a writer that never got the lock changed the index"
    );
}

#[test]
fn a_writer_waits_for_the_javascript_tool_to_release() {
    let idx = Idx::new();
    let mut holder = hold_lock(&idx, 700);
    idx.run(&["record", "s1", "a", "ws"]).ok();
    assert!(
        holder.wait().unwrap().success(),
        "the JavaScript holder failed to release"
    );
    assert_eq!(idx.read()["entries"]["s1"]["sessionId"], "a");
}

#[test]
fn odd_things_at_the_lock_path_fail_at_once() {
    let idx = Idx::new();
    idx.run(&["record", "keep", "k", "ws"]).ok();
    let before = idx.bytes();
    fs::write(idx.lock(), "").unwrap();
    let start = Instant::now();
    let r = idx.run(&["record", "s1", "a", "ws"]).expect_code(5);
    assert!(r.stderr().contains("is a regular file"), "{}", r.stderr());
    assert!(r.stderr().contains(&idx.lock().display().to_string()));
    fs::remove_file(idx.lock()).unwrap();
    fs::create_dir(idx.lock()).unwrap();
    fs::write(idx.lock().join("owner"), "1234").unwrap();
    let r = idx.run(&["touch", "keep"]).expect_code(5);
    assert!(r.stderr().contains("is not empty"), "{}", r.stderr());
    // Both fail well before the 4 s wait would end: nothing spun.
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(idx.bytes(), before);
    assert_eq!(
        fs::read_to_string(idx.lock().join("owner")).unwrap(),
        "1234"
    );
}

#[test]
fn a_writer_killed_mid_write_never_tears_the_index() {
    let idx = Idx::new();
    idx.run(&["record", "s0", "zero", "ws"]).ok();
    let old = idx.bytes();
    let mut victim = idx.cmd(&["record", "s1", "one", "ws"]);
    victim.env("WARMSTART_TEST_WRITE_DELAY_MS", "10000");
    let mut victim = spawn(&mut victim);
    // Kill it once it is half-way through writing (its temp file exists, or,
    // were it writing in place, the index has changed).
    let start = Instant::now();
    while !idx.leftovers().iter().any(|n| n.contains(".tmp-")) && idx.bytes() == old {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the writer never started writing"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    victim.kill().unwrap();
    victim.wait().unwrap();
    assert_eq!(
        idx.bytes(),
        old,
        "the index changed although its writer died mid-write"
    );
    assert!(
        idx.lock().is_dir(),
        "the killed writer's lock should still be there"
    );
    // The next writer finds the dead writer's lock; with the stale limit
    // shortened (it is 15 s by default) it takes it over and succeeds.
    let mut next = idx.cmd(&["record", "s2", "two", "ws"]);
    next.env("WARMSTART_RESUME_LOCK_STALE_MS", "300");
    let r = run(&mut next).ok();
    assert!(
        r.stderr().contains("took over the stale index lock"),
        "{}",
        r.stderr()
    );
    let entries = idx.read()["entries"].as_object().unwrap().clone();
    assert_eq!(entries.keys().collect::<Vec<_>>(), ["s0", "s2"]);
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );

    // Kills at arbitrary moments: every time the index is the old or the new one.
    for i in 0..6u64 {
        let before = idx.bytes();
        let surface = format!("k{i}");
        let mut c = spawn(
            idx.cmd(&["record", &surface, "s", "ws"])
                .env("WARMSTART_RESUME_LOCK_STALE_MS", "200"),
        );
        std::thread::sleep(Duration::from_millis(i * 3));
        let _ = c.kill();
        c.wait().unwrap();
        let now = idx.bytes();
        let index: Value = serde_json::from_slice(&now).expect("a torn index");
        let has = index["entries"].get(&surface).is_some();
        assert!(now == before || has, "neither the old nor the new index");
    }
    let mut last = idx.cmd(&["record", "last", "s", "ws"]);
    run(last.env("WARMSTART_RESUME_LOCK_STALE_MS", "200")).ok();
    assert!(
        idx.leftovers().is_empty(),
        "left behind: {:?}",
        idx.leftovers()
    );
}

#[test]
fn a_corrupt_or_unreadable_index_is_refused_and_left_untouched() {
    let good = r#"{"version": 1, "entries": {"a": {"surfaceId": "a", "sessionId": "x", "repo": "r", "role": null, "captured_at": 1, "last_active": 2}, "b": {"surfaceId": "b", "sessionId": "y", "repo": "r", "role": null, "captured_at": 1, "last_active": 2}}}"#;
    let cases: [(&str, &[u8], &str); 5] = [
        ("truncated", &good.as_bytes()[..good.len() / 2], "truncated"),
        ("garbage", b"\x00\xffnot json at all", "not valid JSON"),
        ("empty", b"", "truncated"),
        (
            "version 2",
            br#"{"version": 2, "entries": {"a": {"sessionId": "x"}}}"#,
            "version 2",
        ),
        ("no entries", br#"{"version": 1, "entries": []}"#, "entries"),
    ];
    for (name, bytes, why) in cases {
        let idx = Idx::new();
        fs::create_dir_all(idx.dir()).unwrap();
        fs::write(&idx.path, bytes).unwrap();
        for args in [
            &["record", "new", "s", "ws"][..],
            &["touch", "a"],
            &["prune", "0"],
            &["lookup", "a"],
        ] {
            let r = idx.run(args).expect_code(5);
            let err = r.stderr();
            assert!(
                err.contains(&idx.path.display().to_string()),
                "{name}: {err}"
            );
            assert!(
                err.contains(why) && err.contains("--reinit"),
                "{name}: {err}"
            );
        }
        assert_eq!(idx.bytes(), bytes, "{name}: the index was changed");
        assert!(
            idx.leftovers().is_empty(),
            "{name}: left behind: {:?}",
            idx.leftovers()
        );
    }

    // Unreadable: tests run as root, which reads a chmod 000 file anyway, so
    // the index path is a directory, then a fifo (which must not block).
    let idx = Idx::new();
    fs::create_dir_all(idx.path.join("inside")).unwrap();
    let r = idx.run(&["record", "new", "s", "ws"]).expect_code(5);
    assert!(r.stderr().contains("is a directory"), "{}", r.stderr());
    assert!(idx.path.join("inside").is_dir());
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    run(Command::new("mkfifo").arg(&idx.path)).ok();
    let r = run_within(
        &mut idx.cmd(&["record", "new", "s", "ws"]),
        Duration::from_secs(20),
    );
    assert_eq!(r.code(), 5, "{}", show(&r.out));
    assert!(r.stderr().contains("not a regular file"), "{}", r.stderr());
    let r = run_within(&mut idx.cmd(&["lookup", "new"]), Duration::from_secs(20));
    assert_eq!(r.code(), 5, "{}", show(&r.out));
}

#[test]
fn reinit_moves_a_corrupt_index_aside_and_keeps_a_healthy_one() {
    let idx = Idx::new();
    fs::create_dir_all(idx.dir()).unwrap();
    let bad = b"{\"version\": 1, \"entries\": {\"a\": {\"sessionId\": \"x\"";
    fs::write(&idx.path, bad).unwrap();
    let r = idx.run(&["record", "new", "s", "ws", "--reinit"]).ok();
    let aside: Vec<_> = idx
        .leftovers()
        .into_iter()
        .filter(|n| n.starts_with("index.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{:?}", idx.leftovers());
    let aside = idx.dir().join(&aside[0]);
    assert!(
        r.stderr().contains(&aside.display().to_string()),
        "{}",
        r.stderr()
    );
    assert_eq!(fs::read(&aside).unwrap(), bad, "the set-aside copy differs");
    let keys: Vec<_> = idx.read()["entries"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, ["new"]);
    // On a healthy index --reinit changes nothing but the recorded entry.
    idx.run(&["record", "second", "s", "ws", "--reinit"]).ok();
    assert_eq!(idx.read()["entries"].as_object().unwrap().len(), 2);
    assert_eq!(idx.leftovers().len(), 1);
}
