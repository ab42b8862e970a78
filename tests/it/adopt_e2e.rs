//! An adopting team's afternoon, end to end, with nothing but what `init`
//! generates and the real binary: a repository with a submodule and its
//! sentinel, a toolchain-like cache keyed by a version pinned in a JSON
//! file, a command step, an `[env]` export and a gate, set up with `init
//! --binary standalone --signer ci=...`, published signed by the generated
//! `tools/ci-gates.sh` from a CI clone, then restored on a fresh clone
//! where the first `cargo` on PATH fails (and leaves a mark), by two
//! session-start hooks started at once; then `init` re-run there after a
//! warmstart upgrade.

use crate::adopt::write;
use crate::util::{Run, TestEnv, run, show};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The team's repository `team`, before `init`: a submodule
/// `vendor/suite` (its sentinel `run.sh`), `toolchain.json` pinning the
/// tool's version, and the toolchain cache's manifest.
fn team_repo(env: &TestEnv) -> PathBuf {
    let suite = env.work_repo("suite-src");
    write(&suite.join("run.sh"), "#!/bin/sh\necho suite\n");
    env.git("suite-src", ["add", "-A"]);
    env.git("suite-src", ["commit", "-q", "-m", "suite"]);
    let repo = env.work_repo("team");
    env.git(
        "team",
        [
            "-c",
            "protocol.file.allow=always",
            "submodule",
            "add",
            "-q",
            suite.to_str().unwrap(),
            "vendor/suite",
        ],
    );
    write(&repo.join(".gitignore"), "/target\n");
    write(
        &repo.join("toolchain.json"),
        "{\"toolchain\": {\"version\": \"4.13.0\"}}\n",
    );
    write(
        &repo.join("cache-manifests/toolchain.toml"),
        "[cache]\nref = \"refs/warmstart/cache/toolchain\"\n\n\
[[key]]\nname = \"platform\"\nplatform = true\n\n\
[[key]]\nname = \"version\"\njson = { file = \"toolchain.json\", pointer = \"/toolchain/version\" }\n\n\
[pack]\nroot = \"target/toolchain\"\n\n\
[restore]\npath = \"~/.local/toolchain\"\n\n\
[ready]\npath = \"bin/tool\"\n\n\
[publish]\ngates = [\"test\"]\n",
    );
    repo
}

/// The team's own steps and gate, added to what `init` wrote (which makes
/// those two files theirs).
fn add_team_steps(repo: &Path) {
    let restore = repo.join("cache-manifests/restore.toml");
    let mut text = std::fs::read_to_string(&restore).unwrap();
    text.push_str(
        "\n[[step]]\nname = \"suites\"\nkind = \"submodules\"\npaths = [\"vendor/suite\"]\n\
allow_file_protocol = true\n\
sentinel = [{ suite = \"suite\", path = \"vendor/suite/run.sh\", breaks = \"the suite\" }]\n\
\n[[step]]\nname = \"toolchain\"\nkind = \"cache\"\ncache = \"toolchain\"\n\
\n[[step]]\nname = \"setup\"\nkind = \"command\"\n\
run = \"mkdir -p \\\"$HOME/.team\\\" && echo done > \\\"$HOME/.team/setup\\\"\"\n\
unless = \"test -f \\\"$HOME/.team/setup\\\"\"\n\
\n[env]\npath = [\"~/.local/toolchain/bin\"]\nenv = { TEAM_TOOLCHAIN = \"4.13.0\" }\n",
    );
    std::fs::write(&restore, text).unwrap();
    write(
        &repo.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"test\"\ncommand = [\"sh\", \"-c\", \"grep -q version toolchain.json\"]\ntimeout = \"1m\"\n",
    );
}

/// What CI's build leaves for the caches to pack: the binary (standing in
/// for the build command) and the toolchain.
fn build_artifacts(clone: &Path) {
    let bin = clone.join("target/warmstart-build/bin/warmstart");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(crate::util::bin(), &bin).unwrap();
    write(
        &clone.join("target/toolchain/bin/tool"),
        "#!/bin/sh\necho tool 4.13.0\n",
    );
}

/// A directory holding a `cargo` that records that it ran, then fails;
/// PATH with it first.
fn failing_cargo(env: &TestEnv) -> (PathBuf, String) {
    let mark = env.join("cargo-ran");
    let script = env.join("badcargo/cargo");
    write(
        &script,
        &format!(
            "#!/bin/sh\necho \"$@\" >> '{}'\necho 'cargo must not run on this machine' >&2\nexit 1\n",
            mark.display()
        ),
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        script.parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    (mark, path)
}

fn bash(env: &TestEnv, cwd: &Path, script: &str, args: &[&str], path: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(script).args(args).current_dir(cwd);
    env.isolate(&mut cmd);
    cmd.env("PATH", path);
    cmd
}

/// The session-start hook's command, twice at once; both runs.
fn two_hooks_at_once(env: &TestEnv, clone: &Path, path: &str) -> [Run; 2] {
    let start = || {
        bash(
            env,
            clone,
            "tools/warmstart-bootstrap.sh",
            &["--background"],
            path,
        )
        .env("CLAUDE_PROJECT_DIR", clone)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    let (a, b) = (start(), start());
    let done = |c: std::process::Child| Run {
        out: c.wait_with_output().unwrap(),
    };
    [done(a), done(b)]
}

#[test]
fn adopt_e2e_a_team_adopts_warmstart_in_an_afternoon() {
    let env = TestEnv::new();
    let ci_key = env.ssh_key("ci");
    let repo = team_repo(&env);
    let init = run(env.xtask_in("team").args([
        "init",
        "--binary",
        "standalone",
        "--signer",
        &format!("ci={}", ci_key.with_extension("pub").display()),
    ]))
    .ok()
    .stdout();
    assert!(init.contains("gates: no test command detected"), "{init}");
    add_team_steps(&repo);
    let origin = env.bare_remote("origin.git");
    env.git("team", ["add", "-A"]);
    env.git("team", ["commit", "-q", "-m", "adopt warmstart"]);
    env.git(
        "team",
        ["remote", "add", "origin", origin.to_str().unwrap()],
    );
    env.git("team", ["push", "-q", "origin", "main"]);

    // CI: a fresh clone, the artifacts built, the generated script.
    env.git(".", ["clone", "-q", origin.to_str().unwrap(), "ci"]);
    let ci = env.join("ci");
    build_artifacts(&ci);
    let exe = ci.join("target/warmstart-build/bin/warmstart");
    let mut cmd = bash(
        &env,
        &ci,
        "tools/ci-gates.sh",
        &[],
        &std::env::var("PATH").unwrap(),
    );
    cmd.env("XTASK", &exe).env("WARMSTART_SIGNING_KEY", &ci_key);
    let r = run(&mut cmd).ok();
    for cache in ["warmstart-bin", "toolchain"] {
        assert!(
            r.stderr().contains(&format!("publishing {cache}")),
            "{}",
            show(&r.out)
        );
    }
    let bin_commit = env.git(&origin, ["rev-parse", "refs/warmstart/cache/warmstart-bin"]);

    // A plain clone downloads no cache: the binary's ref is outside refs/heads/.
    // (--no-local: by git's transport, not a copy of origin's object store.)
    env.git(
        ".",
        ["clone", "-q", "--no-local", origin.to_str().unwrap(), "box"],
    );
    let clone = env.join("box");
    let mut probe = Command::new("git");
    probe
        .args(["-C", clone.to_str().unwrap(), "cat-file", "-e"])
        .arg(bin_commit.trim());
    env.isolate(&mut probe);
    assert!(
        !probe.status().unwrap().success(),
        "a plain clone holds the binary cache"
    );

    // Two session-start hooks at once on the cold clone: both succeed, one
    // installs the binary, the other waits for it, and neither compiles.
    let (mark, path) = failing_cargo(&env);
    let runs = two_hooks_at_once(&env, &clone, &path);
    for r in &runs {
        assert_eq!(r.code(), 0, "{}", show(&r.out));
        assert!(!r.stderr().contains("compile:"), "{}", show(&r.out));
    }
    let said: String = runs.iter().map(|r| r.stderr()).collect();
    assert_eq!(
        said.matches("binary cache: installed warmstart_bin-")
            .count(),
        1,
        "{said}"
    );
    assert!(said.contains("is signed by ci"), "{said}");
    // The other found it installed: after waiting for the lock, or (started
    // later) before it.
    assert!(said.contains("bootstrap: warm: warmstart_bin-"), "{said}");
    // The restore itself, in front, after the background workers.
    let r = run(&mut bash(
        &env,
        &clone,
        "tools/warmstart-bootstrap.sh",
        &["--strict"],
        &path,
    ))
    .ok();
    assert!(r.stderr().contains("bootstrap: warm:"), "{}", show(&r.out));
    assert!(
        !mark.exists(),
        "cargo ran: {}",
        std::fs::read_to_string(&mark).unwrap_or_default()
    );
    let home = env.home();
    assert!(clone.join("vendor/suite/run.sh").is_file(), "the sentinel");
    assert!(
        home.join(".local/toolchain/bin/tool").is_file(),
        "the toolchain"
    );
    assert!(home.join(".team/setup").is_file(), "the command step");
    let mut env_cmd = Command::new(clone.join("target/warmstart-bin/warmstart"));
    env_cmd.args(["restore", "env"]).current_dir(&clone);
    env.isolate(&mut env_cmd);
    let exports = run(&mut env_cmd).ok().stdout();
    assert!(
        exports.contains(&format!("{}/.local/toolchain/bin", home.display()))
            && exports.contains("TEAM_TOOLCHAIN='4.13.0'"),
        "{exports}"
    );

    // A second worktree of this clone restores no HOME-wide target again:
    // ~/.local/toolchain is stamped where every worktree of the clone sees it.
    env.git(&clone, ["worktree", "add", "-q", "--detach", "../box2"]);
    let mut again = Command::new(clone.join("target/warmstart-bin/warmstart"));
    again
        .args(["restore", "--json"])
        .current_dir(env.join("box2"));
    env.isolate(&mut again);
    let r = run(&mut again).ok();
    let doc: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    let toolchain = doc["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["step"] == "toolchain")
        .unwrap_or_else(|| panic!("no toolchain step: {doc:#}"));
    assert_eq!(toolchain["state"], "warm", "{doc:#}");

    rerun_init_after_an_upgrade(&env, &clone);
}

/// `init` re-run with the restored binary after warmstart moved on. The
/// upgrade is simulated the way the generated-file header allows: a file
/// whose header digest matches its body is what an older init wrote and
/// nobody edited; one whose header names an older template's body, with
/// the team's edits below, is theirs, made from that older template.
fn rerun_init_after_an_upgrade(env: &TestEnv, clone: &Path) {
    use warmstart::init::generated::{render, split};
    let older = |text: &str| text.replace("# CI gate job for any CI system", "# CI gate job");
    let ci_gates = clone.join("tools/ci-gates.sh");
    let (_, body) = split(&std::fs::read_to_string(&ci_gates).unwrap());
    std::fs::write(
        &ci_gates,
        render(&older(&body)).replace("init 0.1.0", "init 0.0.9"),
    )
    .unwrap();
    let restore = clone.join("cache-manifests/restore.toml");
    let theirs = std::fs::read_to_string(&restore).unwrap();
    let (_, edited) = split(&theirs);
    let template_body = edited[..edited.find("\n[[step]]\nname = \"suites\"").unwrap()].to_string();
    let old_template = template_body.replace("at session start", "when a session starts");
    let old_header = render(&old_template);
    let old_header = old_header.lines().next().unwrap();
    let edited_old = format!(
        "{old_header}\n{}",
        edited.replace("at session start", "when a session starts")
    );
    std::fs::write(&restore, &edited_old).unwrap();

    let exe = clone.join("target/warmstart-bin/warmstart");
    let init = || {
        let mut cmd = Command::new(&exe);
        cmd.arg("init").current_dir(clone);
        env.isolate(&mut cmd);
        cmd
    };
    let out = run(&mut init()).ok().stdout();
    assert!(out.contains("updated   tools/ci-gates.sh"), "{out}");
    let line = out
        .lines()
        .find(|l| l.contains("cache-manifests/restore.toml"))
        .unwrap();
    assert!(
        line.starts_with("yours ")
            && line.contains("newer version")
            && line.contains(
                "init --print cache-manifests/restore.toml | diff -u cache-manifests/restore.toml -"
            ),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(&restore).unwrap(),
        edited_old,
        "theirs is never rewritten"
    );
    // What the line says to run shows today's template, header and all.
    let printed = run(init().args(["--print", "cache-manifests/restore.toml"]))
        .ok()
        .stdout();
    assert_eq!(split(&printed).1, template_body);
    assert_eq!(printed, render(&template_body));
    let (_, now) = split(&std::fs::read_to_string(&ci_gates).unwrap());
    assert_eq!(now, body, "the unedited file is today's");
    run(init().arg("--check")).ok();
}
