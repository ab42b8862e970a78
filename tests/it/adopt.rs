//! Adopting warmstart in another repository: messages that name the command
//! the user ran, `init` and its generated files, and second repositories (an
//! xtask crate of their own, and the standalone binary) restored through the
//! generated bootstrap script with no compiler.

use crate::util::rng::Rng;
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
    // Not on PATH: named by the path it was run by.
    let err = missing_cache_hint(&env, &standalone, &w, &[]);
    assert!(
        err.contains(&format!("`{} cache list`", standalone.display())),
        "{err}"
    );
    assert!(!err.contains("cargo xtask"), "{err}");
    // On PATH: its name.
    let path = format!("{}:/usr/bin:/bin", standalone.parent().unwrap().display());
    let err = missing_cache_hint(&env, &standalone, &w, &[("PATH", &path)]);
    assert!(err.contains("`warmstart cache list`"), "{err}");
    // CARGO_TARGET_DIR elsewhere: w/target is not the target directory then.
    let xtask = copy_bin(&env, "w/target/debug/xtask");
    let elsewhere = env.join("elsewhere").display().to_string();
    let mut cmd = std::process::Command::new(&xtask);
    cmd.args(["cache", "restore", "nosuch"]).current_dir(&w);
    env.isolate(&mut cmd);
    cmd.env("CARGO", "/usr/bin/cargo")
        .env("CARGO_TARGET_DIR", &elsewhere);
    let err = run(&mut cmd).expect_code(4).stderr();
    assert!(
        err.contains(&format!("`{} cache list`", xtask.display())),
        "{err}"
    );
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
    assert!(out.contains("Usage: just ws [OPTIONS] <COMMAND>"), "{out}");
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
        "tools/ci-gates.sh",
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
    // Nothing yet: --check lists every file as missing (exit 6), writes nothing.
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(
        r.stdout()
            .contains("missing   tools/warmstart-bootstrap.sh"),
        "{}",
        r.stdout()
    );
    assert!(!repo.join("cache-manifests").exists());
    let out = ws(&env, "r", &["init"]).ok().stdout();
    let generated = [
        "cache-manifests/warmstart-bin.toml",
        "cache-manifests/restore.toml",
        "cache-manifests/example.toml.sample",
        "tools/warmstart-bootstrap.sh",
        ".github/workflows/gates.yml",
        "tools/ci-gates.sh",
        "cache-manifests/gates.toml",
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
    let json = ws(&env, "r", &["init", "--check", "--json"]).ok().stdout();
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["files"][3]["path"], "tools/warmstart-bootstrap.sh");
    assert_eq!(v["files"][3]["state"], "current");
    assert_eq!(v["registry_step"], false);
    assert_eq!(v["stale"].as_array().unwrap().len(), 0);

    // An edited file is the user's: reported, never rewritten, not a failure.
    let script = repo.join("tools/warmstart-bootstrap.sh");
    let mut edited = std::fs::read_to_string(&script).unwrap();
    edited.push_str("# my own line\n");
    std::fs::write(&script, &edited).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("yours     tools/warmstart-bootstrap.sh (edited since init wrote it"),
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
    let r = ws(&env, "r", &["init", "--check", "--json"]).expect_code(6);
    let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["stale"][0], ".github/workflows/gates.yml");
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

/// An edited bootstrap is the user's and never rewritten; one written by
/// an older init (without the checks of the parts it reads) is reported
/// stale by `init --check` (exit 6) with the reason, and `init` says so.
#[test]
fn adopt_init_check_reports_an_edited_bootstrap_that_predates_the_part_checks() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    ws(&env, "r", &["init"]).ok();
    let script = repo.join("tools/warmstart-bootstrap.sh");
    let current = std::fs::read_to_string(&script).unwrap();
    let old: String = current
        .lines()
        .filter(|l| !l.starts_with("# warmstart-bootstrap-reads:"))
        .map(|l| format!("{l}\n"))
        .collect::<String>()
        + "# my own line\n";
    std::fs::write(&script, &old).unwrap();
    let r = ws(&env, "r", &["init", "--check"]).expect_code(6);
    assert!(
        r.stdout()
            .contains("stale     tools/warmstart-bootstrap.sh")
            && r.stdout()
                .contains("predates the checks of the parts it reads"),
        "{}",
        r.stdout()
    );
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("yours     tools/warmstart-bootstrap.sh") && out.contains("predates"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&script).unwrap(),
        old,
        "never rewritten"
    );
    // With its own edit on top of the current script, it is simply the user's.
    std::fs::write(&script, current + "# my own line\n").unwrap();
    ws(&env, "r", &["init", "--check"]).ok();
}

#[test]
fn adopt_init_pins_the_registry_step_only_with_a_well_formed_hash() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    for bad in [
        "abc",
        "sha256:xyz",
        "md5:0123",
        &format!("sha256:{}", "a".repeat(63)),
    ] {
        let r = ws(&env, "r", &["init", "--pip-hash", bad]).expect_code(2);
        assert!(r.stderr().contains("--pip-hash"), "{}", r.stderr());
        assert!(
            !repo.join("cache-manifests").exists(),
            "nothing written for {bad:?}"
        );
    }
    let hash = format!("sha256:{}", "0f".repeat(32));
    let out = ws(&env, "r", &["init", "--pip-hash", &hash]).ok().stdout();
    assert!(!out.contains("registry step"), "{out}");
    let text = std::fs::read_to_string(repo.join("cache-manifests/warmstart-bin.toml")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.contains(&format!("pip = \"warmstart=={version}\"")),
        "{text}"
    );
    assert!(
        text.contains(&format!("pip_hashes = [\"{hash}\"]")),
        "{text}"
    );
    ws(&env, "r", &["init", "--check", "--pip-hash", &hash]).ok();
    // A rerun without the flag keeps the committed pin.
    ws(&env, "r", &["init", "--check"]).ok();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("current   cache-manifests/warmstart-bin.toml"),
        "{out}"
    );
    let again = std::fs::read_to_string(repo.join("cache-manifests/warmstart-bin.toml")).unwrap();
    assert_eq!(again, text);
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

/// Printable ASCII without `"` and `\` (what the subset allows in a string).
fn text(rng: &mut Rng, max: usize) -> String {
    let n = rng.below(max + 1);
    (0..n)
        .map(|_| (b' ' + rng.below(95) as u8) as char)
        .filter(|c| *c != '"' && *c != '\\')
        .collect()
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
        let lit = text(&mut rng, 12);
        let mut line = text(&mut rng, 20);
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

// ------------------------------------------- second repositories, end to end

/// The target directory the binary under test was built in. The adopter's
/// xtask crate builds into it with the same profile settings, so warmstart's
/// dependencies are compiled once for both (cargo keys them by flags, not by
/// workspace).
pub(crate) fn shared_target() -> PathBuf {
    let bin = crate::util::bin();
    bin.parent().unwrap().parent().unwrap().to_path_buf()
}

/// `cargo` with the runner's own environment (its registry, its toolchain),
/// offline, building into `shared_target()`; no WARMSTART_* leaks in.
pub(crate) fn cargo(repo: &Path, args: &[&str]) -> crate::util::Run {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = std::process::Command::new(cargo);
    cmd.args(args)
        .current_dir(repo)
        .env("CARGO_TARGET_DIR", shared_target())
        .env("CARGO_NET_OFFLINE", "true")
        .stdin(std::process::Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("WARMSTART_") {
            cmd.env_remove(k);
        }
    }
    run(&mut cmd)
}

/// Builds the adopter's xtask crate at `repo` and returns a copy of its
/// binary in the test's own directory. Every adopter repository builds
/// `xtask` into the one shared target, and each build relinks `debug/xtask`
/// from its own path: two tests at once overwrote each other's binary
/// between one's build and its checksum of what it published. The build and
/// the copy hold one lock, so each test keeps the binary it built.
pub(crate) fn build_adopter_xtask(env: &TestEnv, repo: &Path) -> PathBuf {
    let lock = std::fs::File::create(shared_target().join("adopter-xtask.lock")).unwrap();
    lock.lock().unwrap();
    cargo(repo, &["build", "--quiet", "-p", "xtask"]).ok();
    let copy = env.join("adopter-xtask");
    std::fs::copy(shared_target().join("debug/xtask"), &copy).unwrap();
    copy
}

/// A repository with an xtask crate of its own: `fn main() { warmstart::main() }`
/// and `warmstart = { path = ... }`, this repository's profile settings and
/// lockfile (so the offline build resolves the same versions).
pub(crate) fn xtask_adopter(env: &TestEnv) -> PathBuf {
    let repo = env.work_repo("adopter");
    let src = crate::util::source_root();
    let ours = std::fs::read_to_string(src.join("Cargo.toml")).unwrap();
    let profiles = &ours[ours.find("[profile").unwrap()..];
    write(
        &repo.join("Cargo.toml"),
        &format!("[workspace]\nmembers = [\"xtask\"]\nresolver = \"3\"\n\n{profiles}"),
    );
    write(
        &repo.join("xtask/Cargo.toml"),
        &format!(
            "[package]\nname = \"xtask\"\nversion = \"0.1.0\"\nedition = \"2024\"\npublish = false\n\n[dependencies]\nwarmstart = {{ path = {:?} }}\n",
            src.join("xtask")
        ),
    );
    write(
        &repo.join("xtask/src/main.rs"),
        "fn main() {\n    warmstart::main()\n}\n",
    );
    write(
        &repo.join(".cargo/config.toml"),
        "[alias]\nxtask = \"run --quiet --package xtask --\"\n",
    );
    std::fs::copy(src.join("Cargo.lock"), repo.join("Cargo.lock")).unwrap();
    repo
}

pub(crate) fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// A small cache of the adopter's own, and its restore step (an edit to the
/// generated restore.toml, which makes that file the user's).
fn add_data_cache(repo: &Path) {
    write(&repo.join(".gitignore"), "/target\n/restored-data\n");
    write(
        &repo.join("target/data-src/hello.txt"),
        "restored by the adopter\n",
    );
    write(
        &repo.join("cache-manifests/data.toml"),
        "[pack]\nroot = \"target/data-src\"\n\n[restore]\npath = \"restored-data\"\n",
    );
    let restore = repo.join("cache-manifests/restore.toml");
    let mut text = std::fs::read_to_string(&restore).unwrap();
    text.push_str("\n[[step]]\nname = \"data\"\nkind = \"cache\"\ncache = \"data\"\n");
    std::fs::write(&restore, text).unwrap();
}

/// Commits and pushes `repo` to a new origin, publishes the binary cache
/// (`bin_cache`, with `publisher` copied to `pack_dest` as CI's build leaves
/// it) and the data cache with `publisher`, clones it fresh, and runs the
/// generated bootstrap there with a `cargo` first on PATH that fails. Returns
/// the clone and the bootstrap's run.
fn publish_then_bootstrap_a_fresh_clone(
    env: &TestEnv,
    repo: &Path,
    publisher: &Path,
    bin_cache: &str,
    pack_dest: &str,
) -> (PathBuf, crate::util::Run) {
    let origin = env.bare_remote("origin.git");
    env.git(repo, ["add", "-A"]);
    env.git(repo, ["commit", "-q", "-m", "adopt warmstart"]);
    env.git(repo, ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git(repo, ["push", "-q", "origin", "main"]);
    let dest = repo.join(pack_dest);
    std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
    std::fs::copy(publisher, &dest).unwrap();
    for cache in [bin_cache, "data"] {
        let mut cmd = std::process::Command::new(publisher);
        cmd.args(["cache", "publish", cache, "--allow-ungated", "--quiet"])
            .current_dir(repo);
        env.isolate(&mut cmd);
        run(&mut cmd).ok();
    }

    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "box"]);
    let nocargo = env.join("nocargo");
    write(
        &nocargo.join("cargo"),
        "#!/bin/sh\necho 'cargo must not run on this machine' >&2\nexit 97\n",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(0o755);
        std::fs::set_permissions(nocargo.join("cargo"), mode).unwrap();
    }
    let path = format!(
        "{}:{}",
        nocargo.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let clone = env.join("box");
    let mut cmd = std::process::Command::new("bash");
    // --strict (to restore): the binary's own step, a background one,
    // runs in front, so the test reads the install after it.
    cmd.arg(clone.join("tools/warmstart-bootstrap.sh"))
        .arg("--strict")
        .current_dir(&clone);
    env.isolate(&mut cmd);
    cmd.env("PATH", path);
    (clone.clone(), run(&mut cmd))
}

fn assert_restored_without_compiling(clone: &Path, r: &crate::util::Run, key_prefix: &str) {
    let err = r.stderr();
    assert_eq!(r.code(), 0, "{}", crate::util::show(&r.out));
    assert!(
        err.contains(&format!("bootstrap: binary cache: installed {key_prefix}")),
        "{err}"
    );
    assert!(
        !err.contains("compile:") && !err.contains("cargo must not run"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(clone.join("restored-data/hello.txt")).unwrap(),
        "restored by the adopter\n"
    );
}

#[test]
fn adopt_an_xtask_crate_repository_restores_a_fresh_clone_with_no_compiler() {
    let env = TestEnv::new();
    let repo = xtask_adopter(&env);
    let built = build_adopter_xtask(&env, &repo);
    // `cargo xtask init` through the adopter's alias: it names itself so.
    let init = cargo(&repo, &["xtask", "init"]).ok().stdout();
    assert!(
        init.contains("created   cache-manifests/xtask-bin.toml"),
        "{init}"
    );
    assert!(init.contains("`cargo xtask init --pip-hash"), "{init}");
    add_data_cache(&repo);
    let (clone, r) = publish_then_bootstrap_a_fresh_clone(
        &env,
        &repo,
        &built,
        "xtask-bin",
        "target/release/xtask",
    );
    assert_restored_without_compiling(&clone, &r, "xtask_bin-");
    assert_eq!(
        crate::util::sha256sum(&clone.join("target/warmstart-bin/xtask")),
        crate::util::sha256sum(&built)
    );
    // The key covers the crate and its lockfile: the script says which key it
    // installed, and the binary computes the same one.
    let mut cmd = std::process::Command::new(&built);
    cmd.args(["cache", "publish", "xtask-bin", "--key-only"])
        .current_dir(&clone);
    env.isolate(&mut cmd);
    let key = run(&mut cmd).ok().stdout();
    let key = key.lines().next().unwrap();
    assert!(
        r.stderr().contains(&format!("installed {key} from origin")),
        "{}",
        r.stderr()
    );
}

#[test]
fn adopt_a_standalone_repository_restores_a_fresh_clone_with_no_compiler() {
    let env = TestEnv::new();
    let repo = env.work_repo("adopter");
    let init = ws(&env, "adopter", &["init"]).ok().stdout();
    assert!(
        init.contains("created   cache-manifests/warmstart-bin.toml"),
        "{init}"
    );
    add_data_cache(&repo);
    let (clone, r) = publish_then_bootstrap_a_fresh_clone(
        &env,
        &repo,
        &crate::util::bin(),
        "warmstart-bin",
        "target/warmstart-build/bin/warmstart",
    );
    let version = env!("CARGO_PKG_VERSION");
    assert_restored_without_compiling(&clone, &r, &format!("warmstart_bin-{version}-"));
    assert_eq!(
        crate::util::sha256sum(&clone.join("target/warmstart-bin/warmstart")),
        crate::util::sha256sum(&crate::util::bin())
    );
    // What step 5 of the README's adoption says a fresh machine shows: the
    // orientation table on stdout, and on the next run every row warm.
    let table = r.stdout();
    let header = table.lines().next().unwrap_or_default();
    for column in [
        "STEP",
        "KIND",
        "SOURCE",
        "STATE",
        "THIS RUN",
        "LAST COLD",
        "WHAT",
    ] {
        assert!(header.contains(column), "no {column} column:\n{table}");
    }
    let again = bootstrap_cmd(&env, &clone, &["--strict"]).ok().stdout();
    let rows: Vec<&str> = again
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.starts_with("eval "))
        .collect();
    assert!(!rows.is_empty(), "{again}");
    for row in rows {
        assert!(row.contains(" warm "), "not warm on the second run: {row}");
    }
    // Warm: the origin gone, the installed binary runs with no network.
    env.git(
        &clone,
        ["remote", "set-url", "origin", "/nonexistent/origin.git"],
    );
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(clone.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&clone);
    env.isolate(&mut cmd);
    let err = run(&mut cmd).ok().stderr();
    assert!(err.contains("bootstrap: warm:"), "{err}");
}

/// No binary cache for the key, no registry pin: the script says so at each
/// step and compiles with the manifest's build command (here a copy of the
/// built binary, standing in for `cargo install`, which this test cannot
/// reach offline), then restores with it.
#[test]
fn adopt_the_bootstrap_falls_back_step_by_step_to_the_build_command() {
    let env = TestEnv::new();
    let repo = env.work_repo("adopter");
    ws(&env, "adopter", &["init"]).ok();
    let manifest = repo.join("cache-manifests/warmstart-bin.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let build_line = text.lines().find(|l| l.starts_with("build = ")).unwrap();
    let bin = crate::util::bin();
    let ours = format!(
        "build = [\"cp\", \"{}\", \"target/warmstart-build/bin/warmstart\"]",
        bin.display()
    );
    let text = text.replace(build_line, &ours);
    std::fs::write(&manifest, text).unwrap();
    std::fs::create_dir_all(repo.join("target/warmstart-build/bin")).unwrap();
    write(&repo.join(".gitignore"), "/target\n");
    let origin = env.bare_remote("origin.git");
    env.git(&repo, ["add", "-A"]);
    env.git(&repo, ["commit", "-q", "-m", "adopt"]);
    env.git(&repo, ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git(&repo, ["push", "-q", "origin", "main"]);

    // --prebuilt-only: every step says why it did not apply, nothing compiles.
    let r = bootstrap_cmd(&env, &repo, &["--prebuilt-only"]).expect_code(1);
    let err = r.stderr();
    assert!(
        err.contains("binary cache: no refs/warmstart/cache/warmstart-bin on origin"),
        "{err}"
    );
    assert!(err.contains("compile: skipped (--prebuilt-only)"), "{err}");
    assert!(!repo.join("target/warmstart-build/bin/warmstart").exists());

    let r = bootstrap_cmd(&env, &repo, &[]);
    let err = r.stderr();
    assert!(
        err.contains("binary cache: no refs/warmstart/cache/warmstart-bin"),
        "{err}"
    );
    assert!(err.contains("registry: skipped"), "{err}");
    assert!(err.contains("compile: cp "), "{err}");
    assert!(
        err.contains("target/warmstart-build/bin/warmstart restore"),
        "{err}"
    );
    assert_eq!(r.code(), 0, "{}", crate::util::show(&r.out));
    // The restore ran with the compiled binary: its cache step failed open
    // (nothing published), one row in the table.
    assert!(
        r.stdout().contains("warmstart-bin"),
        "{}",
        crate::util::show(&r.out)
    );
}

// ------------------------------------------------ what init writes, and when

/// The `command` of gates.toml's `test` gate, as init wrote it.
fn test_gate(repo: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(repo.join("cache-manifests/gates.toml")).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    v["gate"][0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

#[test]
fn adopt_init_writes_a_failing_placeholder_gate_without_a_test_command_it_can_be_sure_of() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("gates: no test command detected"), "{out}");
    assert_ne!(test_gate(&repo)[0], "cargo", "no Cargo.toml here");
    // The placeholder fails, with one line that says what to edit: a gate
    // that passed would let CI publish untested caches.
    write(&repo.join(".gitignore"), "/target\n");
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "init"]);
    let r = ws(&env, "r", &["gates", "run"]).expect_code(11);
    let all = format!("{}{}", r.stdout(), r.stderr());
    assert!(all.contains("edit cache-manifests/gates.toml"), "{all}");

    // Unambiguous: a Cargo.toml at the root, `--locked` only with a lockfile.
    let repo = env.work_repo("rust");
    write(&repo.join("Cargo.toml"), "[workspace]\n");
    let out = ws(&env, "rust", &["init"]).ok().stdout();
    assert_eq!(test_gate(&repo), ["cargo", "test", "--workspace"]);
    assert!(
        out.contains("gates: the test gate runs `cargo test --workspace` (init detected Cargo.toml at the root"),
        "{out}"
    );
    // --json names the detected command too (and null where there is none).
    let doc: serde_json::Value =
        serde_json::from_str(&ws(&env, "rust", &["init", "--json"]).ok().stdout()).unwrap();
    assert_eq!(
        doc["test_command"],
        serde_json::json!(["cargo", "test", "--workspace"]),
        "{doc}"
    );
    assert!(
        doc["test_command_detected_from"]
            .as_str()
            .is_some_and(|s| s.starts_with("Cargo.toml at the root")),
        "{doc}"
    );
    let doc: serde_json::Value =
        serde_json::from_str(&ws(&env, "r", &["init", "--json"]).ok().stdout()).unwrap();
    assert!(doc["test_command"].is_null(), "{doc}");
    write(&repo.join("Cargo.lock"), "version = 4\n");
    let out = ws(&env, "rust", &["init"]).ok().stdout();
    assert!(
        out.contains("updated   cache-manifests/gates.toml"),
        "{out}"
    );
    assert_eq!(
        test_gate(&repo),
        ["cargo", "test", "--workspace", "--locked"]
    );
}

#[test]
fn adopt_init_no_agent_hook_wires_nothing_and_later_runs_remember_it() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    let settings = repo.join(".claude/settings.json");
    let out = ws(&env, "r", &["init", "--no-agent-hook"]).ok().stdout();
    assert!(out.contains("off       .claude/settings.json"), "{out}");
    assert!(!settings.exists());
    // Recorded in restore.toml, so neither --check nor a plain rerun calls
    // the hook missing or wires it.
    for args in [
        &["init", "--check"][..],
        &["init"],
        &["init", "--check", "--json"],
    ] {
        let out = ws(&env, "r", args).ok().stdout();
        assert!(
            !out.contains("unwired") && !out.contains("missing"),
            "{args:?}: {out}"
        );
        assert!(out.contains("off"), "{args:?}: {out}");
        assert!(!settings.exists(), "{args:?}");
    }
    // --agent-hook takes it back.
    let out = ws(&env, "r", &["init", "--agent-hook"]).ok().stdout();
    assert!(out.contains("created   .claude/settings.json"), "{out}");
    assert!(
        out.contains("updated   cache-manifests/restore.toml"),
        "{out}"
    );
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(out.contains("current   .claude/settings.json"), "{out}");
    ws(&env, "r", &["init", "--no-agent-hook", "--agent-hook"]).expect_code(2);
}

#[test]
fn adopt_init_rerun_after_an_upgrade_updates_unedited_files_and_names_edited_ones() {
    use warmstart::init::generated::render;
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    ws(&env, "r", &["init"]).ok();
    let restore = repo.join("cache-manifests/restore.toml");
    let today = std::fs::read_to_string(&restore).unwrap();
    // Edited on top of today's template: theirs, and nothing new to see.
    std::fs::write(&restore, format!("{today}# mine\n")).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    let line = out.lines().find(|l| l.contains("restore.toml")).unwrap();
    assert!(
        line.starts_with("yours ") && !line.contains("newer"),
        "{line}"
    );
    // Made by an older init (its header names an older body), then edited:
    // left alone, and named with how to see the new version.
    let old_body = "# the steps, as init 0.0.9 wrote them\n";
    let old = render(old_body).replace("init 0.1.0", "init 0.0.9") + "# mine\n";
    std::fs::write(&restore, &old).unwrap();
    // Made by an older init and never edited: updated.
    let sample = repo.join("cache-manifests/example.toml.sample");
    let fresh_sample = std::fs::read(&sample).unwrap();
    std::fs::write(&sample, render("# an older example\n")).unwrap();
    let out = ws(&env, "r", &["init"]).ok().stdout();
    assert!(
        out.contains("updated   cache-manifests/example.toml.sample"),
        "{out}"
    );
    assert_eq!(std::fs::read(&sample).unwrap(), fresh_sample);
    let named: Vec<&str> = out
        .lines()
        .filter(|l| l.contains("newer version"))
        .collect();
    assert_eq!(named.len(), 1, "{out}");
    assert!(
        named[0].starts_with("yours     cache-manifests/restore.toml (edited since init wrote it")
            && named[0].contains("`warmstart init --print cache-manifests/restore.toml | diff -u cache-manifests/restore.toml -`"),
        "{out}"
    );
    assert_eq!(std::fs::read_to_string(&restore).unwrap(), old);
    let printed = ws(
        &env,
        "r",
        &["init", "--print", "./cache-manifests/restore.toml"],
    )
    .ok()
    .stdout();
    assert_eq!(printed, today);
    let r = ws(&env, "r", &["init", "--print", "nosuch.toml"]).expect_code(2);
    assert!(
        r.stderr().contains("tools/warmstart-bootstrap.sh"),
        "{}",
        r.stderr()
    );
    ws(&env, "r", &["init", "--check"]).ok();
}

/// The generated files of every kind of adoption (standalone and xtask,
/// with and without a signer) name no document of warmstart's own (an
/// adopter's docs/ and README.md are theirs), no version of warmstart a
/// registry lacks, and only `--help` pages that exist.
#[test]
fn adopt_init_generates_nothing_that_points_at_what_does_not_exist() {
    let env = TestEnv::new();
    let key = env.ssh_key("ci");
    let signer = format!("ci={}", key.with_extension("pub").display());
    let help = regex_lite::Regex::new(r"`warmstart ((?:[a-z]+ )*)--help`").unwrap();
    let mut helps = std::collections::BTreeSet::new();
    for (i, (xtask, signed)) in [(false, false), (false, true), (true, false), (true, true)]
        .into_iter()
        .enumerate()
    {
        let name = format!("r{i}");
        let repo = env.work_repo(&name);
        if xtask {
            write(
                &repo.join("xtask/Cargo.toml"),
                "[package]\nname = \"xtask\"\nversion = \"0.1.0\"\n",
            );
        }
        let mut args = vec!["init", "--json"];
        if signed {
            args.extend(["--signer", &signer]);
        }
        let v: serde_json::Value =
            serde_json::from_str(&ws(&env, &name, &args).ok().stdout()).unwrap();
        for f in v["files"].as_array().unwrap() {
            let rel = f["path"].as_str().unwrap();
            let text = std::fs::read_to_string(repo.join(rel)).unwrap();
            for ours in [
                "docs/",
                "README",
                "--version 0.",
                "cargo install --locked --root",
            ] {
                assert!(!text.contains(ours), "{rel} names {ours:?}:\n{text}");
            }
            for c in help.captures_iter(&text) {
                helps.insert(c[1].trim().to_string());
            }
        }
    }
    assert!(helps.len() >= 3, "{helps:?}");
    for h in helps {
        let mut cmd = env.xtask();
        cmd.args(h.split_whitespace()).arg("--help");
        run(&mut cmd).ok();
    }
}

/// When the fetch of the binary cache fails, git's own words are shown,
/// not only the script's guess.
#[test]
fn adopt_bootstrap_prints_gits_own_error_when_the_fetch_fails() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    ws(&env, "r", &["init"]).ok();
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "init"]);
    let gone = env.join("gone.git");
    env.git("r", ["remote", "add", "origin", gone.to_str().unwrap()]);
    let err = bootstrap_cmd(&env, &repo, &["--prebuilt-only"])
        .expect_code(1)
        .stderr();
    assert!(
        err.contains("binary cache: git fetch origin refs/warmstart/cache/warmstart-bin failed (exit 128); git said:")
            && err.contains("bootstrap:   fatal: ")
            && err.contains("gone.git"),
        "{err}"
    );
}

/// The bootstrap's own lock: a holder that died is taken over at once; a
/// live one is waited for, within a bound, and then named.
#[test]
fn adopt_bootstrap_takes_over_a_lock_whose_owner_died_and_bounds_its_wait() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    ws(&env, "r", &["init"]).ok();
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "init"]);
    let origin = env.bare_remote("origin.git");
    env.git("r", ["remote", "add", "origin", origin.to_str().unwrap()]);
    let lock = repo.join(".git/warmstart/bootstrap/fetch.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let host = String::from_utf8(
        std::process::Command::new("uname")
            .arg("-n")
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    std::os::unix::fs::symlink(format!("{}@{}", dead.id(), host.trim()), &lock).unwrap();
    let err = bootstrap_cmd(&env, &repo, &["--prebuilt-only"])
        .expect_code(1)
        .stderr();
    assert!(err.contains("is gone: taking the lock over"), "{err}");
    assert!(
        err.contains("no refs/warmstart/cache/warmstart-bin on origin"),
        "{err}"
    );
    assert!(std::fs::symlink_metadata(&lock).is_err(), "released");

    let mut live = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let owner = format!("{}@{}", live.id(), host.trim());
    std::os::unix::fs::symlink(&owner, &lock).unwrap();
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(repo.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&repo);
    env.isolate(&mut cmd);
    cmd.env("WARMSTART_BOOTSTRAP_FETCH_TIMEOUT", "1");
    let r = run(&mut cmd);
    live.kill().unwrap();
    live.wait().unwrap();
    let err = r.stderr();
    assert_eq!(r.code(), 8, "{err}");
    assert!(
        err.contains(&format!("another bootstrap ({owner}) is fetching")),
        "{err}"
    );
    assert!(
        err.contains(&format!("still held by {owner} after 3s")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_link(&lock).unwrap().to_str().unwrap(),
        owner,
        "not ours to remove"
    );
}

/// A checked-out symlink that leads out of the repository (a directory init
/// writes into, or a file it would write) is never written through: init
/// refuses with exit 7 naming the link, and what it points at is unchanged.
#[test]
fn adopt_init_never_writes_through_a_symlink_out_of_the_repository() {
    let env = TestEnv::new();
    let links = [
        ("tools", true),
        (".claude", true),
        (".github", true),
        ("cache-manifests", true),
        (".claude/settings.json", false),
        ("tools/ci-gates.sh", false),
    ];
    for (i, (link, dir)) in links.iter().enumerate() {
        let name = format!("r{i}");
        let repo = env.work_repo(&name);
        let outside = env.join(format!("outside{i}"));
        std::fs::create_dir_all(&outside).unwrap();
        let target = if *dir {
            outside.clone()
        } else {
            std::fs::write(outside.join("f"), "{}\n").unwrap();
            outside.join("f")
        };
        let at = repo.join(link);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&target, &at).unwrap();
        let r = run(env.xtask_in(&name).arg("init"));
        let err = r.stderr();
        // A linked file init leaves alone (no header: the user's) is fine.
        if *dir || r.code() != 0 {
            assert_eq!(r.code(), 7, "{link}:\n{err}");
            assert!(
                err.contains(&format!("{link} is a symlink")) && err.lines().count() == 1,
                "{link}:\n{err}"
            );
        }
        let left: Vec<_> = std::fs::read_dir(&outside)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left.len(), usize::from(!dir), "{link}: {left:?}");
        if !dir {
            assert_eq!(std::fs::read_to_string(&target).unwrap(), "{}\n");
            assert!(std::fs::read_link(&at).is_ok(), "{link} replaced");
        }
    }
}
