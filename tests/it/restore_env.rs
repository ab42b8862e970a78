//! `restore env`: the exports of restore.toml, evaluated by real sh, bash, zsh and fish.
//!
//! Every check runs the real binary and then a real shell on its output:
//! PATH must be prepended in order, a tool in a prepended directory must be
//! found by a process the shell spawns afterwards, and any value (quotes,
//! newlines, `$`, backslashes, unicode) must come back byte for byte, from
//! the shell's own `printf` and from the environment its children inherit.
//! The GitHub files are read back with the runner's own parsing rules.

use crate::util::rng::Rng;
use crate::util::{Run, TestEnv, run};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const SHELLS: [&str; 4] = ["sh", "bash", "zsh", "fish"];

fn manifest(env: &TestEnv, text: &str) {
    let dir = env.join("r/cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("restore.toml"), text).unwrap();
}

fn ws(env: &TestEnv, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in("r");
    cmd.args(args).env_remove("SHELL");
    run(&mut cmd)
}

/// A shell by name; a missing one fails the test (tools/test.sh installs them).
fn shell(env: &TestEnv, name: &str) -> Command {
    let found = std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .any(|d| d.join(name).is_file());
    assert!(
        found,
        "{name} is not installed: tools/test.sh installs it (apt-get install {name})"
    );
    let mut cmd = Command::new(name);
    // The runner's PATH as it is: these tests compare PATH with it.
    cmd.env("PATH", std::env::var_os("PATH").unwrap_or_default());
    env.isolate(&mut cmd);
    cmd.current_dir(env.join("r"))
        .env("WS", crate::util::bin())
        .env_remove("SHELL");
    // fish decodes its input by the locale: under C (a stock `env -i`) it
    // maps non-ASCII bytes to its private range, so a value outside ASCII
    // reads back changed. A user's fish runs in a UTF-8 locale (README).
    if name == "fish" {
        cmd.env("LC_ALL", "C.UTF-8");
    }
    cmd
}

/// The line that loads the exports in `sh` (one of SHELLS).
fn load_line(sh: &str) -> String {
    if sh == "fish" {
        "\"$WS\" restore env --shell fish | source; or exit 9".into()
    } else {
        format!("eval \"$(\"$WS\" restore env --shell {sh})\" || exit 9")
    }
}

/// The environment a child of the shell inherits, from `env -0` output.
fn env0(bytes: &[u8]) -> BTreeMap<String, String> {
    bytes
        .split(|&b| b == 0)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let s = String::from_utf8(e.to_vec()).ok()?;
            let (k, v) = s.split_once('=')?;
            Some((k.to_string(), v.to_string()))
        })
        .collect()
}

fn tool(dir: &Path, name: &str, says: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\necho {says}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("JSON ({e}):\n{}", r.stdout()))
}

/// A TOML basic string holding exactly `s`.
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\u{:04X}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// An `env` value that restore.toml reads back as exactly `literal`: `$$`
/// for each `$`, and `$~` for a `~` that would otherwise mean HOME
/// (docs/restore.md).
fn escape(literal: &str) -> String {
    let s = literal.replace('$', "$$");
    match s.strip_prefix('~') {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("$~{rest}"),
        _ => s,
    }
}

const PATHS_STEPS: &str = r#"
[env]
path = ["always/bin"]
env = { ALWAYS = "yes it's here" }

[[step]]
name = "tools"
kind = "command"
run = "true"
creates = "tools/one/wstool"
path = ["tools/one", "tools/two/"]
env = { Z3_HOME = "/opt/z 3", MY_LIB_PATH = "/a:/b", MULTI = "line 1\nline '2' $$HOME `x`\n" }
"#;

#[test]
fn restore_env_sets_path_and_values_in_sh_bash_zsh_and_fish() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(&env, PATHS_STEPS);
    let root = env.join("r");
    // Both prepended directories hold `wstool`: the first one listed must win.
    tool(&root.join("tools/one"), "wstool", "one");
    tool(&root.join("tools/two"), "wstool", "two");
    tool(&root.join("tools/two"), "wsother", "other");
    // The step is warm (its `creates` exists) and is recorded so by this run.
    let r = ws(&env, &["restore", "--json"]).ok();
    assert_eq!(json(&r)["steps"][0]["state"], "warm");
    let prefix = [
        root.join("always/bin"),
        root.join("tools/one"),
        root.join("tools/two"),
    ]
    .map(|p| p.display().to_string())
    .join(":");
    let base = std::env::var("PATH").unwrap();
    for sh in SHELLS {
        let out = env.join(format!("out-{sh}"));
        std::fs::create_dir_all(&out).unwrap();
        let printf = if sh == "fish" {
            "printf %s $MULTI > \"$OUT/multi\"; printf %s $Z3_HOME > \"$OUT/z3\""
        } else {
            "printf %s \"$MULTI\" > \"$OUT/multi\"; printf %s \"$Z3_HOME\" > \"$OUT/z3\""
        };
        let body = format!(
            "{printf}\nsh -c 'command -v wstool; wstool; command -v wsother' > \"$OUT/which\"\nenv -0 > \"$OUT/env\"\n"
        );
        // Twice: a second eval must not put the directories on PATH again.
        let mut cmd = shell(&env, sh);
        cmd.env("OUT", &out)
            .arg("-c")
            .arg(format!("{}\n{}\n{body}", load_line(sh), load_line(sh)));
        let r = run(&mut cmd);
        assert_eq!(r.code(), 0, "{sh}: {}", crate::util::show(&r.out));
        let child = env0(&std::fs::read(out.join("env")).unwrap());
        assert_eq!(child["PATH"], format!("{prefix}:{base}"), "{sh}");
        assert_eq!(child["ALWAYS"], "yes it's here", "{sh}");
        assert_eq!(child["MY_LIB_PATH"], "/a:/b", "{sh}");
        assert_eq!(child["MULTI"], "line 1\nline '2' $HOME `x`\n", "{sh}");
        assert_eq!(
            std::fs::read_to_string(out.join("multi")).unwrap(),
            "line 1\nline '2' $HOME `x`\n",
            "{sh}"
        );
        assert_eq!(std::fs::read_to_string(out.join("z3")).unwrap(), "/opt/z 3");
        assert_eq!(
            std::fs::read_to_string(out.join("which")).unwrap(),
            format!(
                "{}\none\n{}\n",
                root.join("tools/one/wstool").display(),
                root.join("tools/two/wsother").display()
            ),
            "{sh}"
        );
    }
}

/// A standalone adopter's bootstrap leaves the binary at
/// `target/warmstart-bin/warmstart`, not on PATH: the line to eval names it
/// as it was run, and that line, pasted into a shell, works.
#[test]
fn restore_env_hint_names_a_standalone_binary_as_it_was_run() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(&env, PATHS_STEPS);
    std::fs::create_dir_all(env.join("r/tools/one")).unwrap();
    std::fs::write(env.join("r/tools/one/wstool"), "").unwrap();
    let bin = env.join("r/target/warmstart-bin/warmstart");
    std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
    std::fs::copy(crate::util::bin(), &bin).unwrap();
    let mut cmd = shell(&env, "bash");
    // No warmstart on PATH at all, as on the adopter's machine.
    cmd.env("PATH", "/usr/bin:/bin")
        .arg("-c")
        .arg("target/warmstart-bin/warmstart restore");
    let table = run(&mut cmd).ok().stdout();
    let last = table.lines().last().unwrap().trim();
    assert!(
        last.ends_with("eval \"$(target/warmstart-bin/warmstart restore env)\""),
        "{table}"
    );
    let line = last
        .rsplit_once("eval ")
        .map(|(_, l)| format!("eval {l}"))
        .unwrap();
    let mut cmd = shell(&env, "bash");
    cmd.env("PATH", "/usr/bin:/bin")
        .arg("-c")
        .arg(format!("{line} || exit 9\nprintf %s \"$Z3_HOME\""));
    assert_eq!(run(&mut cmd).ok().stdout(), "/opt/z 3");
}

#[test]
fn restore_env_default_shell_comes_from_shell_and_the_table_ends_with_the_eval_line() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(&env, PATHS_STEPS);
    std::fs::create_dir_all(env.join("r/tools/one")).unwrap();
    std::fs::write(env.join("r/tools/one/wstool"), "").unwrap();
    let table = ws(&env, &["restore"]).ok().stdout();
    let last = table.lines().last().unwrap();
    assert!(
        last.ends_with("eval \"$(warmstart restore env)\""),
        "{table}"
    );
    let with = |shell: &str| {
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "env"]).env("SHELL", shell);
        run(&mut cmd)
    };
    assert!(
        with("/usr/bin/fish")
            .ok()
            .stdout()
            .contains("set -gx PATH ")
    );
    assert!(with("/bin/zsh").ok().stdout().contains("export PATH="));
    assert!(
        ws(&env, &["restore", "env"])
            .ok()
            .stdout()
            .contains("export PATH=")
    );
    let r = with("/bin/tcsh").expect_code(2);
    assert!(
        r.stderr().contains("SHELL=/bin/tcsh") && r.stderr().contains("--shell"),
        "{}",
        r.stderr()
    );
    let mut cmd = env.xtask_in("r");
    cmd.arg("restore").env("SHELL", "/usr/bin/fish");
    let out = run(&mut cmd).ok().stdout();
    assert!(
        out.lines()
            .last()
            .unwrap()
            .ends_with("warmstart restore env | source"),
        "{out}"
    );
    // --json stays one JSON document.
    json(&ws(&env, &["restore", "--json"]).ok());
    // The dry run shows the exports it would offer, [env] and per step.
    let plan = json(&ws(&env, &["restore", "--dry-run", "--json"]).ok());
    assert_eq!(plan["env"]["env"]["ALWAYS"], "yes it's here");
    assert_eq!(
        plan["steps"][0]["detail"]["exports"]["env"]["Z3_HOME"],
        "/opt/z 3"
    );
    let text = ws(&env, &["restore", "--dry-run"]).ok().stdout();
    assert!(
        text.contains("[env] (always exported): ") && text.contains("exports: "),
        "{text}"
    );
    // Text for people: no JSON in it.
    let always = env.join("r/always/bin").display().to_string();
    assert!(
        text.contains(&format!(
            "[env] (always exported): path: {always}; env: ALWAYS=yes it's here"
        )),
        "{text}"
    );
    assert!(!text.contains("{\"") && !text.contains("[\""), "{text}");
    // A plan without exports ends with the table alone.
    manifest(
        &env,
        "[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n",
    );
    let out = ws(&env, &["restore"]).ok().stdout();
    assert!(!out.contains("restore env"), "{out}");
    assert_eq!(ws(&env, &["restore", "env"]).ok().stdout(), "");
}

// ------------------------------------------------------------ property

/// Pieces that break naive quoting in at least one shell (or in fish's
/// internal encoding: its private-use and noncharacter ranges).
const PIECES: &[&str] = &[
    "'",
    "\"",
    "\\",
    "$",
    "`",
    "\n",
    " ",
    "\t",
    "!",
    "*",
    "?",
    "[",
    "]",
    "{",
    "}",
    ";",
    "&",
    "|",
    "<",
    ">",
    "(",
    ")",
    "#",
    "~",
    "%",
    "=",
    ":",
    "-",
    "-n",
    "-e",
    "$(id)",
    "${HOME}",
    "$HOME",
    "'\\''",
    "\\n",
    "\\'",
    "é",
    "日本",
    "🦀",
    "\u{202e}",
    "e\u{301}",
    "\r",
    "\u{1}",
    "\u{1b}[31m",
    "\u{85}",
    "\u{2028}",
    "\u{f600}",
    "\u{fdd0}",
    "\u{7f}",
    "a",
    "Z",
    "0",
    "<<EOF",
    "EOF",
    "%s",
    "%%",
    "\\\\",
    "''",
    "\"\"",
    "$'x'",
    "!!",
    "^",
    "@",
    "\u{a0}",
];

fn hostile(rng: &mut Rng, max_pieces: usize) -> String {
    let n = rng.below(max_pieces + 1);
    (0..n).map(|_| PIECES[rng.below(PIECES.len())]).collect()
}

/// A directory name: the pieces PATH can carry (no `:`, no line break, no
/// `/`), and no `$`, which the manifest expands (a `$` comes in through a
/// variable instead).
fn hostile_dir(rng: &mut Rng) -> String {
    loop {
        let s: String = hostile(rng, 6)
            .chars()
            .filter(|c| !matches!(c, ':' | '\n' | '\r' | '/' | '$'))
            .collect();
        if !s.is_empty() && s != "." && s != ".." {
            return s;
        }
    }
}

#[test]
fn restore_env_values_round_trip_exactly_through_eval_in_every_shell() {
    let seed = 0x5eed_0017_u64;
    let mut rng = Rng(seed);
    let env = TestEnv::new();
    env.work_repo("r");
    let root = env.join("r");
    let rounds = 4;
    let per_round = 50;
    let mut checked = 0;
    for round in 0..rounds {
        let values: Vec<String> = (0..per_round).map(|_| hostile(&mut rng, 12)).collect();
        let mut dirs: Vec<String> = (0..2)
            .map(|i| format!("p{round}{i}-{}", hostile_dir(&mut rng)))
            .collect();
        // The third comes through `$WS_PROP_DIR`, so it may hold `$` and backticks.
        let var = format!(
            "{}$HOME`id`'{}",
            hostile_dir(&mut rng),
            hostile_dir(&mut rng)
        );
        dirs.push(format!("p{round}2-{var}"));
        let mut text = String::from("[env]\npath = [");
        let mut list: Vec<String> = dirs[..2]
            .iter()
            .map(|d| toml_str(&format!("d/{d}")))
            .collect();
        list.push(toml_str(&format!("d/p{round}2-${{WS_PROP_DIR}}")));
        text.push_str(&list.join(", "));
        text.push_str("]\n[env.env]\n");
        for (i, v) in values.iter().enumerate() {
            text.push_str(&format!("V{i} = {}\n", toml_str(&escape(v))));
        }
        text.push_str("\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n");
        manifest(&env, &text);
        for d in &dirs {
            std::fs::create_dir_all(root.join("d").join(d)).unwrap();
        }
        tool(&root.join("d").join(&dirs[1]), "wsprop", "found");
        let prefix: Vec<String> = dirs
            .iter()
            .map(|d| root.join("d").join(d).display().to_string())
            .collect();
        for sh in SHELLS {
            let out = env.join(format!("prop-{round}-{sh}"));
            std::fs::create_dir_all(&out).unwrap();
            let mut body = String::new();
            for i in 0..per_round {
                if sh == "fish" {
                    body.push_str(&format!("printf %s $V{i} > \"$OUT/V{i}\"\n"));
                } else {
                    body.push_str(&format!("printf %s \"$V{i}\" > \"$OUT/V{i}\"\n"));
                }
            }
            body.push_str("env -0 > \"$OUT/env\"\nsh -c wsprop > \"$OUT/which\"\n");
            let mut cmd = shell(&env, sh);
            cmd.env("OUT", &out)
                .env("WS_PROP_DIR", &var)
                .arg("-c")
                .arg(format!("{0}\n{0}\n{body}", load_line(sh)));
            let r = run(&mut cmd);
            assert_eq!(
                r.code(),
                0,
                "{sh}, seed {seed:#x}, round {round}: {}",
                crate::util::show(&r.out)
            );
            let child = env0(&std::fs::read(out.join("env")).unwrap());
            for (i, v) in values.iter().enumerate() {
                let own = std::fs::read(out.join(format!("V{i}"))).unwrap();
                assert_eq!(
                    String::from_utf8_lossy(&own),
                    *v,
                    "{sh}'s printf of V{i} (seed {seed:#x}, round {round})"
                );
                assert_eq!(
                    child.get(&format!("V{i}")),
                    Some(v),
                    "{sh}'s child's V{i} (seed {seed:#x}, round {round})"
                );
                checked += 1;
            }
            let path = &child["PATH"];
            assert!(
                path.starts_with(&format!("{}:", prefix.join(":"))),
                "{sh}: PATH {path:?} does not start with {prefix:?}"
            );
            // Evaluated twice, and the guard (with these names in its pattern) held.
            assert!(
                !path.starts_with(&format!("{0}:{0}:", prefix.join(":"))),
                "{sh}: the second eval prepended again: {path:?}"
            );
            assert_eq!(
                std::fs::read_to_string(out.join("which")).unwrap(),
                "found\n"
            );
        }
    }
    assert_eq!(checked, rounds * per_round * SHELLS.len());
}

// ------------------------------------------------------ recorded state

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn step_state(env: &TestEnv, step: &str) -> (String, bool) {
    let v = json(&ws(env, &["restore", "status", "--json"]).ok());
    let row = v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == step)
        .unwrap()
        .clone();
    (row["state"].as_str().unwrap().into(), row["alive"] == true)
}

#[test]
fn restore_env_takes_only_steps_recorded_done_and_hints_at_background_ones() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        r#"
[env]
env = { TOP = "1" }

[[step]]
name = "ok"
kind = "command"
run = "touch ok-done"
creates = "ok-done"
path = ["ok/bin"]
env = { OK = "1" }

[[step]]
name = "broken"
kind = "command"
run = "exit 3"
creates = "never"
path = ["broken/bin"]
env = { BROKEN = "1" }

[[step]]
name = "slow"
kind = "command"
background = true
run = "while [ ! -e go ]; do sleep 0.05; done; touch slow-done"
creates = "slow-done"
path = ["slow/bin"]
env = { SLOW = "1" }
"#,
    );
    let root = env.join("r");
    // Before any run: [env] only, and each step named on stderr.
    let r = ws(&env, &["restore", "env", "--json"]).ok();
    let v = json(&r);
    assert_eq!(v["env"], serde_json::json!({ "TOP": "1" }));
    assert_eq!(v["left_out"].as_array().unwrap().len(), 3, "{v:#}");
    assert!(
        v["left_out"][0]["why"]
            .as_str()
            .unwrap()
            .contains("no run recorded")
    );

    let r = ws(&env, &["restore", "--json"]).ok();
    let states: Vec<_> = json(&r)["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["state"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(states, ["done", "failed-open", "background"]);
    wait_for("the worker to start slow", || {
        step_state(&env, "slow") == ("running".into(), true)
    });
    let r = ws(&env, &["restore", "env"]).ok();
    let out = r.stdout();
    assert!(
        out.contains(&root.join("ok/bin").display().to_string()),
        "{out}"
    );
    assert!(
        out.contains("export OK='1'") && out.contains("export TOP='1'"),
        "{out}"
    );
    assert!(
        !out.contains("broken/bin") && !out.contains("BROKEN"),
        "{out}"
    );
    assert!(!out.contains("slow/bin") && !out.contains("SLOW"), "{out}");
    let err = r.stderr();
    assert!(
        err.contains("step slow left out: still running in the background (pid ")
            && err.contains("eval again"),
        "{err}"
    );
    assert!(err.contains("step broken left out: it failed"), "{err}");
    let v = json(&ws(&env, &["restore", "env", "--json"]).ok());
    assert_eq!(v["from"], serde_json::json!(["[env]", "ok"]));
    assert_eq!(v["left_out"][1]["step"], "slow");
    assert_eq!(v["left_out"][1]["state"], "running");

    std::fs::write(root.join("go"), "").unwrap();
    wait_for("slow to finish", || step_state(&env, "slow").0 == "done");
    let v = json(&ws(&env, &["restore", "env", "--json"]).ok());
    assert_eq!(v["from"], serde_json::json!(["[env]", "ok", "slow"]));
    assert_eq!(
        v["path"],
        serde_json::json!([
            root.join("ok/bin").display().to_string(),
            root.join("slow/bin").display().to_string()
        ])
    );
    assert_eq!(
        v["env"],
        serde_json::json!({ "OK": "1", "SLOW": "1", "TOP": "1" })
    );
}

#[test]
fn restore_records_an_exporting_warm_step_once_and_a_steady_warm_run_writes_nothing() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "[[step]]\nname = \"w\"\nkind = \"command\"\nrun = \"false\"\ncreates = \"README.md\"\nenv = { W = \"1\" }\n",
    );
    ws(&env, &["restore"]).ok();
    let v = json(&ws(&env, &["restore", "env", "--json"]).ok());
    assert_eq!(v["from"], serde_json::json!(["w"]), "{v:#}");
    let state = env.join("r/.git/warmstart/restore/state.json");
    let before = (
        std::fs::read(&state).unwrap(),
        std::fs::metadata(&state).unwrap().modified().unwrap(),
    );
    ws(&env, &["restore"]).ok();
    let after = (
        std::fs::read(&state).unwrap(),
        std::fs::metadata(&state).unwrap().modified().unwrap(),
    );
    assert_eq!(before, after, "a steady warm run rewrote state.json");
}

// ------------------------------------------------------ GitHub and files

/// `$GITHUB_ENV` as the runner reads it (actions/runner SetEnvFileCommand):
/// `NAME=value` split at the first `=`, or `NAME<<DELIM` up to the line
/// equal to DELIM, the newline before it not part of the value.
fn parse_github_env(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
        rest = after;
        if line.is_empty() {
            continue;
        }
        let eq = line.find('=');
        let heredoc = line.find("<<");
        match (eq, heredoc) {
            (Some(e), h) if h.is_none_or(|h| e < h) => {
                out.insert(line[..e].to_string(), line[e + 1..].to_string());
            }
            (_, Some(h)) => {
                let (name, delim) = (&line[..h], &line[h + 2..]);
                let end = format!("\n{delim}\n");
                let at = format!("\n{rest}")
                    .find(&end)
                    .unwrap_or_else(|| panic!("no closing {delim} in {text:?}"));
                let value = if at == 0 { "" } else { &rest[..at - 1] };
                out.insert(name.to_string(), value.to_string());
                rest = &rest[(at + end.len() - 1).min(rest.len())..];
            }
            _ => panic!("the runner refuses the line {line:?}"),
        }
    }
    out
}

/// PATH as the runner builds it from `$GITHUB_PATH` lines: each line moves
/// to the end of its list, and the list goes in front of PATH reversed.
fn github_path_order(text: &str) -> Vec<String> {
    let mut list: Vec<String> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        list.retain(|x| x != line);
        list.push(line.to_string());
    }
    list.reverse();
    list
}

#[test]
fn restore_env_github_appends_both_files_in_the_runners_formats() {
    let env = TestEnv::new();
    env.work_repo("r");
    let multi = "first\nsecond 'q' $X\n\nghadelimiter_x\n";
    manifest(
        &env,
        &format!(
            "[env]\npath = [\"a/bin\", \"b/bin\"]\nenv = {{ ONE = \"1=2<<3\", EMPTY = \"\", MULTI = {} }}\n\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n",
            toml_str(&escape(multi))
        ),
    );
    let ge = env.join("github_env");
    let gp = env.join("github_path");
    std::fs::write(&ge, "EARLIER=kept\n").unwrap();
    std::fs::write(&gp, "/earlier/bin\n").unwrap();
    let github = |env: &TestEnv| {
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "env", "--github"])
            .env("GITHUB_ENV", &ge)
            .env("GITHUB_PATH", &gp);
        run(&mut cmd).ok()
    };
    let r = github(&env);
    assert_eq!(r.stdout(), "", "--github prints nothing on stdout");
    let text = std::fs::read_to_string(&ge).unwrap();
    let vars = parse_github_env(&text);
    assert_eq!(vars["EARLIER"], "kept");
    assert_eq!(vars["ONE"], "1=2<<3");
    assert_eq!(vars["EMPTY"], "");
    assert_eq!(vars["MULTI"], multi, "{text}");
    let delim = text
        .lines()
        .find_map(|l| l.strip_prefix("MULTI<<"))
        .expect("the heredoc form for a multi-line value")
        .to_string();
    let hex = delim.strip_prefix("ghadelimiter_").unwrap();
    assert!(
        hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()),
        "{delim}"
    );
    let root = env.join("r");
    assert_eq!(
        github_path_order(&std::fs::read_to_string(&gp).unwrap()),
        [
            root.join("a/bin").display().to_string(),
            root.join("b/bin").display().to_string(),
            "/earlier/bin".into()
        ]
    );
    // A second run appends again, with a new delimiter.
    github(&env);
    let text2 = std::fs::read_to_string(&ge).unwrap();
    assert!(text2.starts_with(&text));
    let delims: Vec<_> = text2
        .lines()
        .filter_map(|l| l.strip_prefix("MULTI<<"))
        .collect();
    assert_eq!(delims.len(), 2);
    assert_ne!(delims[0], delims[1], "the delimiter is random");
    assert_eq!(parse_github_env(&text2)["MULTI"], multi);

    // Outside a workflow: exit 2, naming the variable, and nothing written.
    let mut cmd = env.xtask_in("r");
    cmd.args(["restore", "env", "--github"])
        .env_remove("GITHUB_ENV")
        .env("GITHUB_PATH", &gp);
    let r = run(&mut cmd).expect_code(2);
    assert!(
        r.stderr().contains("--github needs GITHUB_ENV"),
        "{}",
        r.stderr()
    );
}

#[test]
fn restore_env_append_writes_the_sh_form_to_a_hooks_file() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "[env]\npath = [\"hook/bin\"]\nenv = { HOOKED = \"it's \\\"on\\\"\\n$$HOME\" }\n\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n",
    );
    let file = env.join("claude-env");
    std::fs::write(&file, "export EARLIER=1\n").unwrap();
    for _ in 0..2 {
        let r = ws(
            &env,
            &["restore", "env", "--append", file.to_str().unwrap()],
        )
        .ok();
        assert_eq!(r.stdout(), "");
    }
    tool(&env.join("r/hook/bin"), "wshook", "hooked");
    // As an agent's shell does: source the file before each command.
    let mut cmd = shell(&env, "bash");
    cmd.env("F", &file).arg("-c").arg(
        ". \"$F\" && printf '%s|%s|' \"$EARLIER\" \"$HOOKED\" && wshook && printf %s \"$PATH\"",
    );
    let r = run(&mut cmd).ok();
    let hook = env.join("r/hook/bin").display().to_string();
    assert_eq!(
        r.stdout(),
        format!(
            "1|it's \"on\"\n$HOME|hooked\n{hook}:{}",
            std::env::var("PATH").unwrap()
        ),
        "sourced twice, the directory is on PATH once"
    );
    // --shell means nothing with --append: refused, not ignored.
    ws(
        &env,
        &["restore", "env", "--append", "x", "--shell", "fish"],
    )
    .expect_code(2);
}

// ------------------------------------------------------------ bad input

#[test]
fn restore_env_refuses_bad_names_path_in_env_and_unknown_keys() {
    let env = TestEnv::new();
    env.work_repo("r");
    let step = |extra: &str| {
        format!(
            "[[step]]\nname = \"s\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"x\"\n{extra}\n"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            step("env = { \"1X\" = \"v\" }"),
            "\"1X\" is not a variable name",
        ),
        (
            step("env = { \"A-B\" = \"v\" }"),
            "\"A-B\" is not a variable name",
        ),
        (
            step("env = { \"A B\" = \"v\" }"),
            "\"A B\" is not a variable name",
        ),
        (
            step("env = { \"\" = \"v\" }"),
            "\"\" is not a variable name",
        ),
        (
            step("env = { PATH = \"/x\" }"),
            "list the directories in `path = [...]`",
        ),
        (
            step("env = { WARMSTART_COMMAND = \"x\" }"),
            "WARMSTART_* settings",
        ),
        (
            step("env = { UID = \"0\" }"),
            "\"UID\" belongs to the shell (bash and zsh",
        ),
        (
            step("env = { path = \"/x\" }"),
            "\"path\" belongs to the shell (zsh",
        ),
        (step("env = { N = 3 }"), "`env.N` must be a string"),
        (step("env = { N = \"a\\u0000b\" }"), "NUL byte"),
        (step("env = \"X=1\""), "`env` must be a table"),
        (step("path = \"bin\""), "`path` must be a list"),
        (
            step("path = [\"a:b\"]"),
            "which PATH and $GITHUB_PATH cannot carry",
        ),
        (
            step("path = [\"a\\nb\"]"),
            "which PATH and $GITHUB_PATH cannot carry",
        ),
        (step("path = [\"\"]"), "empty entry"),
        (step("paht = [\"bin\"]"), "paht"),
        (
            format!("[env]\npaths = [\"bin\"]\n{}", step("")),
            "[env]: unknown key `paths`",
        ),
        (
            format!("[env]\nenv = {{ PATH = \"/x\" }}\n{}", step("")),
            "[env]: `env.PATH` would replace the whole PATH",
        ),
        (format!("env = 1\n{}", step("")), "must be a table"),
        (
            format!(
                "[env]\nenv = {{ FSTAR_HOME = \"$WS_SURELY_UNSET/fstar\" }}\n{}",
                step("")
            ),
            "[env]: `env.FSTAR_HOME` = \"$WS_SURELY_UNSET/fstar\" uses $WS_SURELY_UNSET, which is not set",
        ),
        (
            step("env = { Z3 = \"${WS_SURELY_UNSET}\" }"),
            "`env.Z3` = \"${WS_SURELY_UNSET}\" uses $WS_SURELY_UNSET",
        ),
        (
            step("env = { PRICE = \"5$\" }"),
            "write `$$` for a literal `$`",
        ),
        (
            format!(
                "[env]\nenv = {{ X = \"1\" }}\n{}",
                step("env = { X = \"2\" }")
            ),
            "env `X` is set to different values by [env] and step \"s\"",
        ),
    ];
    for (text, want) in &cases {
        manifest(&env, text);
        for args in [&["restore", "env"][..], &["restore", "--dry-run"][..]] {
            let r = ws(&env, args).expect_code(10);
            let err = r.stderr();
            assert!(
                err.contains(want),
                "{args:?} on\n{text}\nwants {want:?}, said: {err}"
            );
            assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
            assert!(err.contains("restore.toml"), "names the file: {err}");
        }
    }
    // The same value in two places is one setting, not a conflict.
    manifest(
        &env,
        &format!(
            "[env]\nenv = {{ X = \"1\" }}\n{}",
            step("env = { X = \"1\" }")
        ),
    );
    ws(&env, &["restore", "env"]).ok();
}

#[test]
fn restore_env_expands_home_and_variables_in_env_values() {
    let env = TestEnv::new();
    env.work_repo("r");
    manifest(
        &env,
        "[env]\nenv = { FSTAR_HOME = \"$HOME/.local/fstar\", TILDE = \"~/.local/z3\", BRACED = \"${WS_EXP_ROOT}x\", PLAIN = \"$WS_EXP_ROOT/y\", LITERAL = \"$$HOME $~/z\" }\n\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n",
    );
    let home = env.home();
    let mut cmd = shell(&env, "bash");
    cmd.env("WS_EXP_ROOT", "/opt/r o").arg("-c").arg(format!(
        "{}\nprintf '%s|' \"$FSTAR_HOME\" \"$TILDE\" \"$BRACED\" \"$PLAIN\" \"$LITERAL\"",
        load_line("bash")
    ));
    let r = run(&mut cmd).ok();
    let h = home.display();
    assert_eq!(
        r.stdout(),
        format!("{h}/.local/fstar|{h}/.local/z3|/opt/r ox|/opt/r o/y|$HOME ~/z|")
    );
}

#[test]
fn restore_env_ends_quietly_with_0_when_stdout_is_closed() {
    let env = TestEnv::new();
    env.work_repo("r");
    // Enough variables that the output outgrows a pipe buffer.
    let vars: String = (0..4000)
        .map(|i| format!("V{i} = \"{}\"\n", "x".repeat(20)))
        .collect();
    manifest(
        &env,
        &format!(
            "[env]\npath = [\"bin\"]\n[env.env]\n{vars}\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n"
        ),
    );
    for args in [&["restore", "env"][..], &["restore", "env", "--json"][..]] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut cmd = env.xtask_in("r");
        cmd.args(args).env_remove("SHELL").stdout(writer);
        let r = run(&mut cmd);
        assert_eq!(r.code(), 0, "{args:?}: {}", crate::util::show(&r.out));
        assert_eq!(r.stderr(), "", "{args:?}");
    }
}
