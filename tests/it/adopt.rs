//! Adopting warmstart in another repository: messages that name the command
//! the user ran, `init` and its generated files, and second repositories (an
//! xtask crate of their own, and the standalone binary) restored through the
//! generated bootstrap script with no compiler.

use crate::util::{TestEnv, run};
use std::path::{Path, PathBuf};

/// A copy of the real binary at `rel` (inside the test directory).
fn copy_bin(env: &TestEnv, rel: &str) -> PathBuf {
    let to = env.join(rel);
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    std::fs::copy(crate::util::bin(), &to).unwrap();
    to
}

/// The hint of a missing cache manifest, as `exe` prints it when run in
/// `cwd` with `CARGO` set (as it is for every child of any cargo process).
fn missing_cache_hint(env: &TestEnv, exe: &Path, cwd: &Path, vars: &[(&str, &str)]) -> String {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["cache", "restore", "nosuch"]).current_dir(cwd);
    env.isolate(&mut cmd);
    cmd.env("CARGO", "/usr/bin/cargo")
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let r = run(&mut cmd).expect_code(4);
    let err = r.stderr();
    assert!(err.contains("no cache manifest"), "{err}");
    err
}

/// A workspace `w/` (a repository with a Cargo.toml) to run copies of the binary in.
fn workspace(env: &TestEnv) -> PathBuf {
    let w = env.work_repo("w");
    std::fs::write(w.join("Cargo.toml"), "[workspace]\n").unwrap();
    std::fs::create_dir_all(w.join("cache-manifests")).unwrap();
    w
}

#[test]
fn adopt_messages_say_cargo_xtask_only_for_a_binary_in_the_workspace_target() {
    let env = TestEnv::new();
    let w = workspace(&env);
    // `cargo run` of an xtask crate: CARGO set, the executable in w/target.
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let err = missing_cache_hint(&env, &xtask, &w, &[]);
    assert!(err.contains("`cargo xtask cache list`"), "{err}");
}

#[test]
fn adopt_messages_name_the_binary_outside_the_target_dir_even_with_cargo_set() {
    let env = TestEnv::new();
    let w = workspace(&env);
    let standalone = copy_bin(&env, "tools-bin/warmstart");
    let err = missing_cache_hint(&env, &standalone, &w, &[]);
    assert!(err.contains("`warmstart cache list`"), "{err}");
    assert!(!err.contains("cargo xtask"), "{err}");
    // CARGO_TARGET_DIR elsewhere: w/target is not the target directory then.
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let elsewhere = env.join("elsewhere").display().to_string();
    let mut cmd = std::process::Command::new(&xtask);
    cmd.args(["cache", "restore", "nosuch"]).current_dir(&w);
    env.isolate(&mut cmd);
    cmd.env("CARGO", "/usr/bin/cargo")
        .env("CARGO_TARGET_DIR", &elsewhere);
    let err = run(&mut cmd).expect_code(4).stderr();
    assert!(err.contains("`xtask cache list`"), "{err}");
    assert!(!err.contains("cargo xtask"), "{err}");
}

#[test]
fn adopt_messages_follow_the_command_setting() {
    let env = TestEnv::new();
    let w = workspace(&env);
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let err = missing_cache_hint(&env, &xtask, &w, &[("WARMSTART_COMMAND", "just ws")]);
    assert!(err.contains("`just ws cache list`"), "{err}");
    // Help names it too.
    let mut cmd = std::process::Command::new(&xtask);
    cmd.arg("--help").current_dir(&w);
    env.isolate(&mut cmd);
    cmd.env("WARMSTART_COMMAND", "just ws");
    let out = run(&mut cmd).ok().stdout();
    assert!(out.contains("Usage: just ws <COMMAND>"), "{out}");
}

/// The tidy check of this repository: every file `init` generates is here
/// and current (this repository runs the same bootstrap script and workflow).
#[test]
fn adopt_tidy_init_check_passes_on_this_repository() {
    let env = TestEnv::new();
    let mut cmd = std::process::Command::new(crate::util::bin());
    cmd.args(["init", "--check"])
        .current_dir(crate::util::source_root());
    env.isolate(&mut cmd);
    let r = run(&mut cmd).ok();
    let out = r.stdout();
    for f in [
        "tools/warmstart-bootstrap.sh",
        ".github/workflows/gates.yml",
        "cache-manifests/example.toml.sample",
    ] {
        assert!(out.contains(&format!("current   {f}")), "{out}");
    }
}

// ------------------------------------------------------------------ init

/// Runs the real binary in `cwd` (relative to the test directory).
fn ws(env: &TestEnv, cwd: &str, args: &[&str]) -> crate::util::Run {
    run(env.xtask_in(cwd).args(args))
}

#[test]
fn adopt_init_is_idempotent_leaves_edits_alone_and_check_finds_stale_files() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let out = ws(&env, "r", &["init"]).ok().stdout();
    let generated = [
        "cache-manifests/warmstart-bin.toml",
        "cache-manifests/restore.toml",
        "cache-manifests/example.toml.sample",
        "tools/warmstart-bootstrap.sh",
        ".github/workflows/gates.yml",
    ];
    for f in generated {
        assert!(out.contains(&format!("created   {f}")), "{out}");
    }
    assert!(
        out.contains("registry step"),
        "says the registry step is omitted: {out}"
    );
    assert!(out.contains("postCreateCommand"), "{out}");
    let snapshot = |files: &[&str]| -> Vec<Vec<u8>> {
        files
            .iter()
            .map(|f| std::fs::read(repo.join(f)).unwrap())
            .collect()
    };
    let before = snapshot(&generated);
    let settings_before = std::fs::read(repo.join(".claude/settings.json")).unwrap();

    // Idempotent: a second run changes no byte and says so.
    let out = ws(&env, "r", &["init"]).ok().stdout();
    for f in generated {
        assert!(out.contains(&format!("current   {f}")), "{out}");
    }
    assert_eq!(snapshot(&generated), before);
    assert_eq!(
        std::fs::read(repo.join(".claude/settings.json")).unwrap(),
        settings_before
    );
    ws(&env, "r", &["init", "--check"]).ok();

    // An edited file is the user's: reported, never rewritten, not a failure.
    let script = repo.join("tools/warmstart-bootstrap.sh");
    let mut edited = std::fs::read_to_string(&script).unwrap();
    edited.push_str("# my own line\n");
    std::fs::write(&script, &edited).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("yours     (edited since init wrote it"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&script).unwrap(), edited);
    let out = ws(&env, "r", &["init", "--check"]).ok().stdout();
    assert!(out.contains("yours"), "{out}");

    // Stale: what an older generator wrote (its digest matches its body).
    let sample = repo.join("cache-manifests/example.toml.sample");
    std::fs::write(
        &sample,
        warmstart::init::generated::render("# an older example\n"),
    )
    .unwrap();
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(
        r.stdout()
            .contains("stale     cache-manifests/example.toml.sample")
    );
    assert!(
        r.stderr()
            .contains("cache-manifests/example.toml.sample; regenerate with `warmstart init`"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(&sample).unwrap(),
        warmstart::init::generated::render("# an older example\n"),
        "--check writes nothing"
    );
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("updated   cache-manifests/example.toml.sample"),
        "{out}"
    );
    assert_eq!(std::fs::read(&sample).unwrap(), before[2]);

    // Missing is stale too.
    std::fs::remove_file(repo.join(".github/workflows/gates.yml")).unwrap();
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(r.stdout().contains("missing   .github/workflows/gates.yml"));
    ws(&env, "r", &["init"]).ok();
    ws(&env, "r", &["init", "--check"]).ok();
    // The workflow is this repository's own, byte for byte below its header.
    let (_, body) = warmstart::init::generated::split(
        &std::fs::read_to_string(repo.join(".github/workflows/gates.yml")).unwrap(),
    );
    assert_eq!(
        body,
        std::fs::read_to_string(crate::util::source_root().join(".github/workflows/gates.yml"))
            .unwrap()
    );
}

#[test]
fn adopt_init_merges_the_session_hook_only_into_a_file_it_understands() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let settings = repo.join(".claude/settings.json");
    std::fs::create_dir_all(settings.parent().unwrap()).unwrap();
    let theirs = r#"{
  "permissions": {"allow": ["Bash(ls)"]},
  "hooks": {"SessionStart": [{"matcher": "startup", "hooks": [{"type": "command", "command": "echo hi", "timeout": 5}]}]}
}"#;
    std::fs::write(&settings, theirs).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("merged    .claude/settings.json"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&settings).unwrap()).unwrap();
    assert_eq!(v["permissions"]["allow"][0], "Bash(ls)");
    let starts = v["hooks"]["SessionStart"].as_array().unwrap();
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0]["hooks"][0]["command"], "echo hi");
    assert!(
        starts[1]["hooks"][0]["command"]
            .as_str()
            .unwrap()
            .contains("tools/warmstart-bootstrap.sh --background")
    );
    let merged = std::fs::read(&settings).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("current   .claude/settings.json"), "{out}");
    assert_eq!(std::fs::read(&settings).unwrap(), merged, "merged once");

    // Shapes init does not know: the file stays byte for byte, the entry is printed.
    for odd in [
        r#"{"hooks": {"SessionStart": [{"hooks": [{"type": "prompt", "prompt": "x"}]}]}}"#,
        r#"{"hooks": {"SessionStart": {"not": "a list"}}}"#,
        r#"{"hooks": []}"#,
        r#"[1, 2]"#,
        "{ not json",
    ] {
        std::fs::write(&settings, odd).unwrap();
        let out = ws(&env, "r", &["init"]).ok().stdout();
        assert!(
            out.contains("add this entry to hooks.SessionStart by hand"),
            "{odd}: {out}"
        );
        assert_eq!(std::fs::read_to_string(&settings).unwrap(), odd);
    }
}

// --------------------------------------------- the script's key = the binary's

/// A small deterministic PRNG (xorshift64*): hostile cases without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// Printable ASCII without `"` and `\` (what the subset allows in a string).
    fn text(&mut self, max: usize) -> String {
        let n = (self.next() % (max as u64 + 1)) as usize;
        (0..n)
            .map(|_| (b' ' + (self.next() % 95) as u8) as char)
            .filter(|c| *c != '"' && *c != '\\')
            .collect()
    }
}

fn bootstrap_cmd(env: &TestEnv, repo: &Path, args: &[&str]) -> crate::util::Run {
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(repo.join("tools/warmstart-bootstrap.sh"))
        .args(args)
        .current_dir(repo);
    env.isolate(&mut cmd);
    run(&mut cmd)
}

/// The key the binary computes for manifest `name` (`cache publish --key-only`).
fn binary_key(env: &TestEnv, cwd: &str, name: &str) -> String {
    let r = ws(env, cwd, &["cache", "publish", name, "--key-only"]).ok();
    r.stdout().lines().next().unwrap_or_default().to_string()
}

#[test]
fn adopt_the_script_and_the_binary_compute_the_same_key() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    ws(&env, "r", &["init"]).ok();
    std::fs::create_dir_all(repo.join("xtask/src")).unwrap();
    std::fs::write(repo.join("xtask/src/main.rs"), "fn main() {}\n").unwrap();
    std::fs::write(repo.join("Cargo.lock"), "version = 4\n").unwrap();
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "init"]);
    // The standalone manifest as init wrote it: version plus platform.
    let key = binary_key(&env, "r", "warmstart-bin");
    assert!(key.starts_with("warmstart_bin-"), "{key}");
    assert_eq!(
        bootstrap_cmd(&env, &repo, &["--print-key"])
            .ok()
            .stdout()
            .trim(),
        key
    );

    // Hostile literals and one-line files, with git trees, many times over.
    let manifest = repo.join("cache-manifests/warmstart-bin.toml");
    let original = std::fs::read_to_string(&manifest).unwrap();
    let mut rng = Rng(0x5eed_ad09);
    for case in 0..40u32 {
        let lit = rng.text(12);
        let mut line = rng.text(20);
        if case.is_multiple_of(5) {
            line = format!(".{line}");
        }
        let newline = if rng.next().is_multiple_of(2) {
            "\n"
        } else {
            ""
        };
        std::fs::write(repo.join("pin.txt"), format!("{line}{newline}")).unwrap();
        let pins = format!(
            "[[key]]\nname = \"lit\"\nliteral = \"{lit}\"\n\n[[key]]\nname = \"line\"\nfile = \"pin.txt\"\n\n[[key]]\nname = \"src\"\ngit_tree = [\"xtask\", \"Cargo.lock\"]\n\n[pack]"
        );
        std::fs::write(&manifest, original.replacen("[pack]", &pins, 1)).unwrap();
        let key = binary_key(&env, "r", "warmstart-bin");
        let script = bootstrap_cmd(&env, &repo, &["--print-key"]).ok().stdout();
        assert_eq!(
            script.trim(),
            key,
            "literal {lit:?}, file {line:?}{newline:?}"
        );
    }

    // What shell cannot compute is refused by both, not guessed.
    let json_pin =
        "[[key]]\nname = \"v\"\njson = { file = \"b.json\", pointer = \"/v\" }\n\n[pack]";
    std::fs::write(&manifest, original.replacen("[pack]", json_pin, 1)).unwrap();
    let r = ws(
        &env,
        "r",
        &["cache", "publish", "warmstart-bin", "--key-only"],
    )
    .expect_code(10);
    assert!(r.stderr().contains("pin kind `json`"), "{}", r.stderr());
    let r = bootstrap_cmd(&env, &repo, &["--print-key"]).expect_code(1);
    assert!(r.stderr().contains("bootstrap:"), "{}", r.stderr());
    for (bad, why) in [
        ("literal = \"caf\u{e9}\"", "printable ASCII"),
        ("literal = 'single'", "TOML subset"),
    ] {
        let pins = format!("[[key]]\nname = \"v\"\n{bad}\n\n[pack]");
        std::fs::write(&manifest, original.replacen("[pack]", &pins, 1)).unwrap();
        let r = ws(&env, "r", &["init", "--check"]).expect_code(10);
        assert!(r.stderr().contains(why), "{bad}: {}", r.stderr());
        bootstrap_cmd(&env, &repo, &["--print-key"]).expect_code(1);
    }
    std::fs::write(repo.join("pin.txt"), "two\nlines\n").unwrap();
    let pins = "[[key]]\nname = \"v\"\nfile = \"pin.txt\"\n\n[pack]";
    std::fs::write(&manifest, original.replacen("[pack]", pins, 1)).unwrap();
    let r = ws(
        &env,
        "r",
        &["cache", "publish", "warmstart-bin", "--key-only"],
    )
    .expect_code(10);
    assert!(r.stderr().contains("more than one line"), "{}", r.stderr());
    let r = bootstrap_cmd(&env, &repo, &["--print-key"]).expect_code(1);
    assert!(r.stderr().contains("more than one line"), "{}", r.stderr());
}
