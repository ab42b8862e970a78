//! The `--json` contract (README.md "JSON output"), checked from the outside:
//! every command that takes `--json` prints exactly one JSON document on
//! stdout, success or failure, opening with `schema`, `command` and `ok`
//! (and on failure `error` and `code`, the exit status), and its shape
//! (keys and value types, recursively) is the one committed in
//! `tests/it/snapshots/json/<command>.<ok|fail>[.<variant>].json`.
//!
//! A shape that drifts fails the test, naming every stale file;
//! `UPDATE_SNAPSHOTS=1 cargo nextest run -E 'test(/json_contract/)'`
//! rewrites them (review the diff: a renamed or removed field, or a changed
//! type, also bumps `contract::SCHEMA`). Values that vary between runs
//! (times, paths, ids) never reach a snapshot: only their types do, except
//! the envelope's `schema`, `command`, `ok` and `code`, which are the
//! contract itself.

use crate::util::{Run, TestEnv, run, show, source_root};
use clap::CommandFactory;
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

fn snapshot_dir() -> PathBuf {
    source_root().join("tests/it/snapshots/json")
}

/// The type of every value in `v`, keys kept in their printed order; an
/// array is the list of its distinct element shapes.
fn shape(v: &Value) -> Value {
    match v {
        Value::Null => "null".into(),
        Value::Bool(_) => "bool".into(),
        Value::Number(_) => "number".into(),
        Value::String(_) => "string".into(),
        Value::Array(items) => {
            let mut seen: Vec<Value> = Vec::new();
            for s in items.iter().map(shape) {
                if !seen.contains(&s) {
                    seen.push(s);
                }
            }
            Value::Array(seen)
        }
        Value::Object(m) => Value::Object(m.iter().map(|(k, v)| (k.clone(), shape(v))).collect()),
    }
}

/// A document's snapshot: its shape, with the envelope's own values.
fn snapshot_of(doc: &Value) -> Value {
    let mut s = shape(doc);
    if let (Some(obj), Some(doc)) = (s.as_object_mut(), doc.as_object()) {
        for k in ["schema", "command", "ok", "code"] {
            if let Some(v) = doc.get(k) {
                obj.insert(k.into(), v.clone());
            }
        }
    }
    s
}

/// The snapshots one test compared, and the stale ones.
#[derive(Default)]
struct Contract {
    checked: Vec<String>,
    stale: Vec<String>,
}

impl Contract {
    /// Checks one run of `command` (the name the envelope must give):
    /// exit status, one document, envelope, and the committed shape of
    /// `case` (`cache-restore.ok.warm`). Returns the document.
    fn check(&mut self, case: &str, command: &str, r: &Run, ok: bool) -> Value {
        assert_eq!(r.code() == 0, ok, "{case}: exit status\n{}", show(&r.out));
        let text = r.stdout();
        let docs: Vec<Value> = serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{case}: stdout is not JSON ({e})\n{}", show(&r.out)));
        assert_eq!(docs.len(), 1, "{case}: one document\n{}", show(&r.out));
        let doc = docs.into_iter().next().unwrap();
        assert_eq!(doc["schema"], 1, "{case}: {doc:#}");
        assert_eq!(doc["command"], command, "{case}: {doc:#}");
        assert_eq!(doc["ok"], ok, "{case}: {doc:#}");
        let keys: Vec<&str> = doc
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        assert_eq!(
            keys[..3],
            ["schema", "command", "ok"],
            "{case}: envelope first"
        );
        if !ok {
            assert_eq!(doc["code"], r.code(), "{case}: {doc:#}");
            let error = doc["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{case}: {doc:#}"));
            assert!(
                !error.is_empty() && !error.contains('\n'),
                "{case}: {error:?}"
            );
            // What stderr says, in one line (clap's usage errors span
            // several lines there: the envelope keeps them all).
            let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                words(&r.stderr()).contains(&words(error)),
                "{case}: {}",
                show(&r.out)
            );
        }
        self.compare(case, &snapshot_of(&doc));
        doc
    }

    /// Compares a snapshot with its committed file (or rewrites it).
    fn compare(&mut self, case: &str, got: &Value) {
        let path = snapshot_dir().join(format!("{case}.json"));
        let text = serde_json::to_string_pretty(got).unwrap() + "\n";
        if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &text).unwrap();
        }
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        if want != text {
            self.stale
                .push(format!("{} differs; now:\n{text}", path.display()));
        }
        self.checked.push(case.to_string());
    }

    /// Fails naming every stale snapshot.
    fn done(self) {
        assert!(
            self.stale.is_empty(),
            "JSON shapes drifted: rerun with UPDATE_SNAPSHOTS=1, review the diff, and bump contract::SCHEMA if a field was renamed, removed or retyped\n{}",
            self.stale.join("\n")
        );
        assert!(!self.checked.is_empty());
    }
}

/// `warmstart <args>` in `cwd` of `env`.
fn ws(env: &TestEnv, cwd: &str, args: &[&str]) -> Run {
    run(env.xtask_in(cwd).args(args))
}

fn write(path: impl AsRef<Path>, text: &str) {
    let path = path.as_ref();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A small artifact, a bare origin, and `work` with cache manifest `art`.
fn cache_world() -> TestEnv {
    let env = TestEnv::new();
    let src = env.join("src");
    write(src.join("hello.txt"), "hello\n");
    write(src.join("bin/tool"), "#!/bin/sh\necho tool\n");
    env.bare_remote("origin.git");
    env.work_repo("work");
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    write(
        env.join("work/cache-manifests/art.toml"),
        &format!(
            "[cache]\ndescription = \"json contract\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored/art\"\n",
            src.display()
        ),
    );
    env
}

#[test]
fn json_contract_cache_commands() {
    let env = cache_world();
    let mut c = Contract::default();
    let w = "work";

    let doc = c.check(
        "cache-publish.ok.key-only",
        "cache publish",
        &ws(
            &env,
            w,
            &["cache", "publish", "art", "--key-only", "--json"],
        ),
        true,
    );
    // Nothing was counted: not `entries: 0`.
    assert_eq!(doc["entries"], Value::Null, "{doc:#}");
    c.check(
        "cache-publish.ok.dry-run",
        "cache publish",
        &ws(&env, w, &["cache", "publish", "art", "--dry-run", "--json"]),
        true,
    );
    let doc = c.check(
        "cache-publish.ok",
        "cache publish",
        &ws(&env, w, &["cache", "publish", "art", "--json"]),
        true,
    );
    assert_eq!(doc["remote"]["name"], "origin", "{doc:#}");
    let doc = c.check(
        "cache-publish.ok.present",
        "cache publish",
        &ws(&env, w, &["cache", "publish", "art", "--missing", "--json"]),
        true,
    );
    assert_eq!(doc["status"], "present", "{doc:#}");
    c.check(
        "cache-publish.fail",
        "cache publish",
        &ws(&env, w, &["cache", "publish", "nope", "--json"]),
        false,
    );

    let doc = c.check(
        "cache-restore.ok",
        "cache restore",
        &ws(&env, w, &["cache", "restore", "art", "--json"]),
        true,
    );
    assert_eq!(doc["state"], "restored", "{doc:#}");
    let doc = c.check(
        "cache-restore.ok.warm",
        "cache restore",
        &ws(&env, w, &["cache", "restore", "art", "--json"]),
        true,
    );
    // Warm, the remote comes from the stamp: the same `{name, url}`.
    assert_eq!(doc["remote"]["name"], "origin", "{doc:#}");
    c.check(
        "cache-restore.fail",
        "cache restore",
        &ws(&env, w, &["cache", "restore", "nope", "--json"]),
        false,
    );

    c.check(
        "cache-verify.ok",
        "cache verify",
        &ws(&env, w, &["cache", "verify", "art", "--json"]),
        true,
    );
    c.check(
        "cache-verify.fail",
        "cache verify",
        &ws(&env, w, &["cache", "verify", "nope", "--json"]),
        false,
    );
    c.check(
        "cache-list.ok",
        "cache list",
        &ws(&env, w, &["cache", "list", "--json"]),
        true,
    );
    c.check(
        "cache-status.ok",
        "cache status",
        &ws(&env, w, &["cache", "status", "--json"]),
        true,
    );
    c.check(
        "cache-status.ok.offline",
        "cache status",
        &ws(&env, w, &["cache", "status", "--offline", "--json"]),
        true,
    );
    c.check(
        "cache-prune.ok.dry-run",
        "cache prune",
        &ws(
            &env,
            w,
            &[
                "cache",
                "prune",
                "art",
                "--keep",
                "1",
                "--dry-run",
                "--json",
            ],
        ),
        true,
    );
    c.check(
        "cache-prune.fail",
        "cache prune",
        &ws(
            &env,
            w,
            &["cache", "prune", "nope", "--keep", "1", "--json"],
        ),
        false,
    );
    c.check(
        "cache-gc.ok.dry-run",
        "cache gc",
        &ws(&env, w, &["cache", "gc", "--dry-run", "--json"]),
        true,
    );
    c.check(
        "cache-gc.ok",
        "cache gc",
        &ws(&env, w, &["cache", "gc", "--keep-for", "0s", "--json"]),
        true,
    );
    c.check(
        "cache-gc.fail",
        "cache gc",
        &ws(&env, w, &["cache", "gc", "--keep-for", "soon", "--json"]),
        false,
    );
    c.check(
        "cache-migrate.fail",
        "cache migrate",
        &ws(&env, w, &["cache", "migrate", "art", "--json"]),
        false,
    );
    c.check(
        "cache-resign.fail",
        "cache resign",
        &ws(&env, w, &["cache", "resign", "art", "--json"]),
        false,
    );

    // A manifest that does not parse: list and status still report every
    // cache, in the failure envelope (exit 10).
    let broken = env.join("work/cache-manifests/broken.toml");
    write(&broken, "[pack\n");
    let doc = c.check(
        "cache-list.fail",
        "cache list",
        &ws(&env, w, &["cache", "list", "--offline", "--json"]),
        false,
    );
    assert_eq!(doc["code"], 10, "{doc:#}");
    c.check(
        "cache-status.fail",
        "cache status",
        &ws(&env, w, &["cache", "status", "--offline", "--json"]),
        false,
    );
    std::fs::remove_file(&broken).unwrap();

    // Migrate: the manifest moves to a ref, the cache follows.
    let art = env.join("work/cache-manifests/art.toml");
    let text = std::fs::read_to_string(&art).unwrap();
    write(
        &art,
        &text.replace("[cache]\n", "[cache]\nref = \"refs/warmstart/cache/art\"\n"),
    );
    c.check(
        "cache-migrate.ok",
        "cache migrate",
        &ws(&env, w, &["cache", "migrate", "art", "--json"]),
        true,
    );

    // Resign: a signer allowed at HEAD re-signs the key it signed.
    let key = env.join("keys/ci");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (tools/test.sh installs openssh-client)");
    assert!(out.status.success(), "{}", show(&out));
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    write(
        env.join("work/cache-manifests/allowed_signers"),
        &format!("ci {public}"),
    );
    env.git(w, ["add", "cache-manifests/allowed_signers"]);
    env.git(w, ["commit", "-q", "-m", "trust root"]);
    let k = key.to_str().unwrap();
    write(env.join("src/hello.txt"), "hello again\n");
    ws(&env, w, &["cache", "publish", "art", "--signing-key", k]).ok();
    let doc = c.check(
        "cache-resign.ok",
        "cache resign",
        &ws(
            &env,
            w,
            &["cache", "resign", "art", "--signing-key", k, "--json"],
        ),
        true,
    );
    assert_eq!(doc["resigned"], serde_json::json!(["art-1"]), "{doc:#}");
    c.done();
}

#[test]
fn json_contract_gates_restore_and_init() {
    let env = TestEnv::new();
    let mut c = Contract::default();
    env.bare_remote("origin.git");
    env.work_repo("work");
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    write(
        env.join("work/cache-manifests/gates.toml"),
        "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n\n[[gate]]\nname = \"bad\"\ncommand = \"false\"\n",
    );
    write(
        env.join("work/cache-manifests/restore.toml"),
        "[[step]]\nname = \"made\"\nkind = \"command\"\nrun = \"touch made\"\ncreates = \"made\"\n\n[[step]]\nname = \"broken\"\nkind = \"command\"\nrun = \"exit 3\"\ncreates = \"never\"\n",
    );
    write(env.join("work/.gitignore"), "made\n");
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "gates and steps"]);
    let w = "work";

    c.check(
        "gates-check.fail",
        "gates check",
        &ws(&env, w, &["gates", "check", "ok", "--json"]),
        false,
    );
    c.check(
        "gates-run.ok",
        "gates run",
        &ws(&env, w, &["gates", "run", "ok", "--json"]),
        true,
    );
    let doc = c.check(
        "gates-run.fail",
        "gates run",
        &ws(&env, w, &["gates", "run", "bad", "--json"]),
        false,
    );
    assert_eq!(doc["code"], 11, "{doc:#}");
    c.check(
        "gates-check.ok",
        "gates check",
        &ws(&env, w, &["gates", "check", "ok", "--json"]),
        true,
    );
    c.check(
        "gates-status.ok",
        "gates status",
        &ws(&env, w, &["gates", "status", "--json"]),
        true,
    );
    c.check(
        "gates-status.fail",
        "gates status",
        &ws(&env, ".", &["gates", "status", "--json"]),
        false,
    );
    let doc = c.check(
        "gates-push.ok",
        "gates push",
        &ws(&env, w, &["gates", "push", "--json"]),
        true,
    );
    assert_eq!(doc["remote"]["name"], "origin", "{doc:#}");
    c.check(
        "gates-fetch.ok",
        "gates fetch",
        &ws(&env, w, &["gates", "fetch", "--json"]),
        true,
    );
    c.check(
        "gates-push.fail",
        "gates push",
        &ws(&env, w, &["gates", "push", "nowhere", "--json"]),
        false,
    );
    c.check(
        "gates-fetch.fail",
        "gates fetch",
        &ws(&env, w, &["gates", "fetch", "nowhere", "--json"]),
        false,
    );

    c.check(
        "restore.ok.dry-run",
        "restore",
        &ws(&env, w, &["restore", "--dry-run", "--json"]),
        true,
    );
    c.check(
        "restore.ok",
        "restore",
        &ws(&env, w, &["restore", "--only", "made", "--json"]),
        true,
    );
    c.check(
        "restore.ok.background",
        "restore",
        &ws(
            &env,
            w,
            &["restore", "--only", "made", "--background", "--json"],
        ),
        true,
    );
    // The worker is quick (its step is warm); wait for it, so that the
    // runs below see a settled state file.
    let settled = (0..600).any(|_| {
        let r = ws(&env, w, &["restore", "status", "--json"]);
        let v: Value = serde_json::from_str(&r.stdout()).unwrap_or_default();
        if v["running"] == false {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        false
    });
    assert!(settled, "the background worker never finished");
    let doc = c.check(
        "restore.fail",
        "restore",
        &ws(&env, w, &["restore", "--strict", "--json"]),
        false,
    );
    assert_eq!(doc["code"], 11, "{doc:#}");
    c.check(
        "restore.fail.usage",
        "restore",
        &ws(&env, w, &["restore", "--only", "nope", "--json"]),
        false,
    );
    let doc = c.check(
        "restore-status.ok",
        "restore status",
        &ws(&env, w, &["restore", "status", "--json"]),
        true,
    );
    // Timestamps are RFC 3339 UTC (only the resume index keeps epoch ms).
    let made = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == "made")
        .unwrap();
    assert!(
        made["finished_at"].as_str().unwrap().ends_with('Z'),
        "{made}"
    );
    c.check(
        "restore-env.ok",
        "restore env",
        &ws(&env, w, &["restore", "env", "--json"]),
        true,
    );
    c.check(
        "restore-env.fail",
        "restore env",
        // `--github` outside GitHub Actions: neither file is named.
        &run(env
            .xtask_in(w)
            .args(["restore", "env", "--github", "--json"])
            .env_remove("GITHUB_ENV")
            .env_remove("GITHUB_PATH")),
        false,
    );
    let state = env.join("work/.git/warmstart/restore/state.json");
    std::fs::write(&state, "{not json").unwrap();
    c.check(
        "restore-status.fail",
        "restore status",
        &ws(&env, w, &["restore", "status", "--json"]),
        false,
    );

    // `--dry-run` of every step kind: each kind's `detail` has a shape.
    env.work_repo("plan");
    let hex = "ab".repeat(32);
    write(
        env.join("plan/cache-manifests/restore.toml"),
        &format!(
            "[[step]]\nname = \"bin\"\nkind = \"cache\"\ncache = \"bin\"\nremote = \"mirror\"\n\n\
             [[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"vendor/a\"]\nsentinel = [{{ suite = \"a\", path = \"vendor/a/run.sh\", breaks = \"cargo test -p a\" }}]\n\n\
             [[step]]\nname = \"skills\"\nkind = \"links\"\nsource = \"skills\"\nfarm = \".claude/skills\"\nindex = \"skills/INDEX.md\"\nentries = \"dirs\"\n\n\
             [[step]]\nname = \"tool\"\nkind = \"download\"\nurl = \"https://example.org/tool\"\nsha256 = \"{hex}\"\ndest = \"bin/tool\"\nexecutable = true\n\n\
             [[step]]\nname = \"python\"\nkind = \"pin\"\ntool = \"python3\"\nargs = [\"--version\"]\nexpect = '^Python 3'\nfix = {{ run = \"true\" }}\n\n\
             [[step]]\nname = \"fresh\"\nkind = \"freshness\"\nbackground = true\nremote = \"origin\"\nbranch = \"main\"\n\n\
             [[step]]\nname = \"daemon\"\nkind = \"service\"\nrun = \"sleep 600\"\n\n\
             [[step]]\nname = \"network\"\nkind = \"doctor\"\nconnect_timeout = \"2s\"\n"
        ),
    );
    let doc = c.check(
        "restore.ok.dry-run-every-kind",
        "restore",
        &ws(&env, "plan", &["restore", "--dry-run", "--json"]),
        true,
    );
    assert_eq!(doc["steps"].as_array().unwrap().len(), 8, "{doc:#}");
    let doc = c.check(
        "restore-stop.ok",
        "restore stop",
        &ws(&env, "plan", &["restore", "stop", "--json"]),
        true,
    );
    assert_eq!(doc["services"][0]["was_running"], false, "{doc:#}");
    c.check(
        "restore-stop.fail",
        "restore stop",
        &ws(&env, "plan", &["restore", "stop", "nope", "--json"]),
        false,
    );

    env.work_repo("fresh");
    c.check(
        "init.fail",
        "init",
        &ws(&env, "fresh", &["init", "--check", "--json"]),
        false,
    );
    // A root Cargo.toml: init detects the test command (null above).
    std::fs::write(env.join("fresh/Cargo.toml"), "[workspace]\n").unwrap();
    c.check(
        "init.ok",
        "init",
        &ws(&env, "fresh", &["init", "--json"]),
        true,
    );
    c.done();
}

#[test]
fn json_contract_conda_resume_demo_and_usage() {
    let env = TestEnv::new();
    let mut c = Contract::default();
    let pkg = source_root().join("tests/fixtures/conda/wsfixture-1.2.3-h0_0.conda");
    let pkg = pkg.to_str().unwrap();
    c.check(
        "conda-info.ok",
        "conda info",
        &ws(&env, ".", &["conda", "info", pkg, "--json"]),
        true,
    );
    c.check(
        "conda-info.fail",
        "conda info",
        &ws(&env, ".", &["conda", "info", "missing.conda", "--json"]),
        false,
    );
    let prefix = env.join("prefix");
    let prefix = prefix.to_str().unwrap();
    c.check(
        "conda-unpack.ok",
        "conda unpack",
        &ws(
            &env,
            ".",
            &["conda", "unpack", pkg, "--into", prefix, "--json"],
        ),
        true,
    );
    c.check(
        "conda-unpack.fail",
        "conda unpack",
        &ws(
            &env,
            ".",
            &[
                "conda",
                "unpack",
                "missing.conda",
                "--into",
                prefix,
                "--json",
            ],
        ),
        false,
    );

    let index = env.join("index.json");
    let resume = |args: &[&str]| {
        let mut cmd = env.xtask();
        cmd.arg("resume").arg("--path").arg(&index).args(args);
        run(&mut cmd)
    };
    resume(&["record", "pane-1", "sess-1", "warmstart", "orchestrator"]).ok();
    c.check(
        "resume-resume-cmd.ok",
        "resume resume-cmd",
        &resume(&["resume-cmd", "pane-1", "--json"]),
        true,
    );
    c.check(
        "resume-resume-cmd.fail",
        "resume resume-cmd",
        &resume(&["resume-cmd", "pane-9", "--json"]),
        false,
    );
    c.check(
        "resume-list.ok",
        "resume list",
        &resume(&["list", "--json"]),
        true,
    );
    c.check(
        "resume-prune.ok",
        "resume prune",
        &resume(&["prune", "86400000", "--json"]),
        true,
    );
    // The one exception (docs/reference/json.md): `lookup` prints the entry itself, or
    // `null`, as the JavaScript tool does; no envelope.
    let entry: Value = serde_json::from_str(&resume(&["lookup", "pane-1"]).ok().stdout()).unwrap();
    assert!(entry.get("schema").is_none(), "{entry:#}");
    c.compare("resume-lookup.exception", &shape(&entry));
    assert_eq!(resume(&["lookup", "pane-9"]).ok().stdout(), "null\n");
    std::fs::write(&index, "{corrupt").unwrap();
    c.check(
        "resume-list.fail",
        "resume list",
        &resume(&["list", "--json"]),
        false,
    );
    c.check(
        "resume-prune.fail",
        "resume prune",
        &resume(&["prune", "1", "--json"]),
        false,
    );

    let small = env.join("small");
    write(small.join("a.txt"), "a\n");
    write(small.join("d/b.txt"), "b\n");
    c.check(
        "demo.ok",
        "demo",
        &ws(
            &env,
            ".",
            &["demo", "--source", small.to_str().unwrap(), "--json"],
        ),
        true,
    );
    c.check(
        "demo.fail",
        "demo",
        &ws(
            &env,
            ".",
            &["demo", "--source", "/nonexistent/dir", "--json"],
        ),
        false,
    );

    // A command line that does not parse, and a setting that is refused at
    // startup, still give the envelope.
    let doc = c.check(
        "usage.fail",
        "cache restore",
        &ws(&env, ".", &["cache", "restore", "art", "--json", "--bogus"]),
        false,
    );
    assert_eq!(doc["code"], 2, "{doc:#}");
    // A missing argument: the envelope names it, not only clap's first line.
    let r = ws(&env, ".", &["cache", "restore", "--json"]).expect_code(2);
    let doc: Value = serde_json::from_str(&r.stdout()).unwrap();
    let said = doc["error"].as_str().unwrap();
    assert!(
        said.starts_with("the following required arguments were not provided:")
            && said.contains("<NAME>"),
        "{doc:#}"
    );
    let r = run(env
        .xtask()
        .env(concat!("WARMSTART_", "NO_SUCH_SETTING"), "1")
        .args(["cache", "list", "--json"]));
    let doc = c.check("settings.fail", "cache list", &r, false);
    assert_eq!(doc["code"], 10, "{doc:#}");
    c.done();
}

/// `doctor`: a `git://` host that accepts connections (a listening
/// socket is enough), then one where nothing listens (exit 8, the rows in
/// the failure document).
#[test]
fn json_contract_doctor() {
    let env = TestEnv::new();
    let mut c = Contract::default();
    env.work_repo("work");
    let listening = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listening.local_addr().unwrap().port();
    let url = format!("git://127.0.0.1:{port}/r.git");
    env.git("work", ["remote", "add", "origin", &url]);
    let doc = c.check(
        "doctor.ok",
        "doctor",
        &ws(&env, "work", &["doctor", "--json"]),
        true,
    );
    assert_eq!(doc["hosts"][0]["result"], "connected", "{doc:#}");
    drop(listening);
    let doc = c.check(
        "doctor.fail",
        "doctor",
        &ws(
            &env,
            "work",
            &["doctor", "--json", "--connect-timeout", "2s"],
        ),
        false,
    );
    assert_eq!(doc["code"], 8, "{doc:#}");
    assert_eq!(doc["hosts"][0]["result"], "refused", "{doc:#}");
    c.done();
}

/// Every command that takes `--json` has a success and a failure snapshot,
/// and every snapshot file belongs to a command (none left behind).
#[test]
fn json_contract_covers_every_command() {
    let mut cmd = warmstart::cli::Cli::command();
    cmd.build();
    let mut with_json = BTreeSet::new();
    fn walk(c: &clap::Command, path: &str, out: &mut BTreeSet<String>) {
        if c.get_arguments().any(|a| a.get_id() == "json") {
            out.insert(path.replace(' ', "-"));
        }
        for sub in c.get_subcommands() {
            walk(sub, format!("{path} {}", sub.get_name()).trim(), out);
        }
    }
    walk(&cmd, "", &mut with_json);
    assert!(with_json.len() >= 20, "{with_json:?}");
    let files: BTreeSet<String> = std::fs::read_dir(snapshot_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let mut missing = Vec::new();
    for slug in &with_json {
        for kind in ["ok", "fail"] {
            let prefix = format!("{slug}.{kind}.");
            if !files.iter().any(|f| f.starts_with(&prefix)) {
                missing.push(format!("{slug}.{kind}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "commands without a JSON snapshot test (tests/it/json_contract.rs): {missing:?}"
    );
    let known: BTreeSet<&str> = ["usage", "settings", "resume-lookup"].into();
    for f in &files {
        let slug = f.split('.').next().unwrap();
        assert!(
            with_json.contains(slug) || known.contains(slug),
            "{f}: no such command takes --json; remove it"
        );
    }
}

/// Hostile command lines, generated: whatever a script passes along with
/// `--json` (unknown flags, bad values, missing names, control characters),
/// stdout holds exactly one document whose `ok` and `code` agree with the
/// exit status, and whose `error` is the one line printed on stderr.
#[test]
fn json_contract_never_prints_zero_or_two_documents() {
    let env = TestEnv::new();
    env.work_repo("work");
    let mut cmd = warmstart::cli::Cli::command();
    cmd.build();
    let mut paths = Vec::new();
    fn walk(c: &clap::Command, path: Vec<String>, out: &mut Vec<Vec<String>>) {
        if c.get_arguments().any(|a| a.get_id() == "json") {
            out.push(path.clone());
        }
        for sub in c.get_subcommands() {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            walk(sub, p, out);
        }
    }
    walk(&cmd, Vec::new(), &mut paths);
    let pool = [
        "--bogus",
        "nope",
        "",
        "--remote",
        "--only",
        "--max-bytes",
        "16Q",
        "--keep",
        "x",
        "--older-than",
        "soon",
        "--timeout",
        "forever",
        "--connect-timeout",
        "0",
        "\u{1}",
        "--path",
        "/nonexistent/dir/i.json",
        "--into",
        "-",
        "../../..",
        "--key",
        "a b",
        "--fetch=",
        "--stall-timeout",
        "1h30",
        "--offline",
        "--dry-run",
        "--strict",
    ];
    let mut seed: u64 = 0x5eed_c0de_1234_5678;
    let mut next = |n: usize| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed % n as u64) as usize
    };
    let mut codes = BTreeSet::new();
    for case in 0..90 {
        let path = &paths[next(paths.len())];
        let mut args: Vec<String> = path.clone();
        for _ in 0..next(4) {
            args.push(pool[next(pool.len())].to_string());
        }
        // The demo's default source is the whole toolchain: never that here.
        if path[0] == "demo" {
            args.extend(["--source".into(), "/nonexistent/src".into()]);
        }
        let at = next(args.len() + 1).max(path.len().min(1));
        args.insert(at, "--json".into());
        let r = run(env.xtask_in("work").args(&args));
        codes.insert(r.code());
        let text = r.stdout();
        let docs: Vec<Value> = serde_json::Deserializer::from_str(&text)
            .into_iter::<Value>()
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("case {case} {args:?}: not JSON ({e})\n{}", show(&r.out)));
        assert_eq!(docs.len(), 1, "case {case} {args:?}\n{}", show(&r.out));
        let doc = &docs[0];
        assert_eq!(doc["schema"], 1, "case {case} {args:?}: {doc}");
        assert_eq!(doc["ok"], r.code() == 0, "case {case} {args:?}: {doc}");
        if r.code() != 0 {
            assert_eq!(doc["code"], r.code(), "case {case} {args:?}: {doc}");
            let error = doc["error"].as_str().unwrap_or_default();
            // What stderr says, in one line (clap's usage errors span lines).
            let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
            assert!(
                !error.is_empty()
                    && !error.contains('\n')
                    && words(&r.stderr()).contains(&words(error)),
                "case {case} {args:?}: {doc}\n{}",
                show(&r.out)
            );
        }
    }
    // Not only usage errors: the cases reach the commands themselves.
    assert!(codes.len() >= 4, "exit codes seen: {codes:?}");
}
