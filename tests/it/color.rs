//! `--color` and `NO_COLOR` for warmstart's own `error:` and `warning:`
//! lines, on a real pseudo-terminal and through a real pipe: `auto` colours
//! only a terminal, `NO_COLOR` (set, not empty) turns `auto` off, `never`
//! never colours and `always` colours a pipe too.

use crate::util::TestEnv;
use crate::util::pty;
use std::process::Command;

const RED_ERROR: &str = "\x1b[1;31merror:\x1b[0m";
const YELLOW_WARNING: &str = "\x1b[1;33mwarning:\x1b[0m";

/// A repository whose gate `ok` was never run: `gates check --fetch=<a
/// missing remote> ok` prints a `warning:` (the fetch failed) and an
/// `error:` (the gate is not green).
fn repo(env: &TestEnv) -> Vec<String> {
    env.work_repo("work");
    let gates = env.join("work/cache-manifests/gates.toml");
    std::fs::create_dir_all(gates.parent().unwrap()).unwrap();
    std::fs::write(&gates, "[[gate]]\nname = \"ok\"\ncommand = [\"true\"]\n").unwrap();
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "gates"]);
    let nowhere = env.join("no-such-remote.git");
    ["gates", "check"]
        .into_iter()
        .map(String::from)
        .chain([format!("--fetch={}", nowhere.display()), "ok".into()])
        .collect()
}

/// The command, with `NO_COLOR` as given (the test environment sets it).
fn command(env: &TestEnv, args: &[String], extra: &[&str], no_color: Option<&str>) -> Command {
    let mut cmd = env.xtask_in("work");
    cmd.args(args).args(extra);
    match no_color {
        Some(v) => cmd.env("NO_COLOR", v),
        None => cmd.env_remove("NO_COLOR"),
    };
    cmd
}

fn plain_lines_present(text: &str) {
    assert!(
        text.contains("warning: fetching gate records from"),
        "{text:?}"
    );
    assert!(text.contains("error: "), "{text:?}");
}

#[test]
fn color_auto_paints_a_terminal_and_never_a_pipe_or_under_no_color() {
    let env = TestEnv::new();
    let args = repo(&env);

    // auto on a terminal: coloured.
    let (status, drawn) = pty::run(command(&env, &args, &[], None));
    assert_eq!(status.code(), Some(9), "{drawn:?}");
    assert!(drawn.contains(YELLOW_WARNING), "{drawn:?}");
    assert!(drawn.contains(RED_ERROR), "{drawn:?}");

    // An empty NO_COLOR is no NO_COLOR.
    let (_, drawn) = pty::run(command(&env, &args, &[], Some("")));
    assert!(drawn.contains(RED_ERROR), "{drawn:?}");

    // NO_COLOR, and --color=never: plain on a terminal.
    for (extra, no_color) in [(&[][..], Some("1")), (&["--color=never"][..], None)] {
        let (_, drawn) = pty::run(command(&env, &args, extra, no_color));
        assert!(!drawn.contains('\x1b'), "{extra:?} {no_color:?}: {drawn:?}");
        plain_lines_present(&drawn);
    }

    // auto into a pipe: plain.
    let out = command(&env, &args, &[], None).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(9), "{err}");
    assert!(!err.contains('\x1b'), "{err:?}");
    plain_lines_present(&err);
}

#[test]
fn color_always_paints_a_pipe_even_under_no_color() {
    let env = TestEnv::new();
    let args = repo(&env);
    for flags in [&["--color=always"][..], &["--color", "always"]] {
        let out = command(&env, &args, flags, Some("1")).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(9), "{err}");
        assert!(err.contains(YELLOW_WARNING), "{flags:?}: {err:?}");
        assert!(err.contains(RED_ERROR), "{flags:?}: {err:?}");
    }
    // A bad value is a usage error naming the choices.
    let out = command(&env, &args, &["--color=sometimes"], None)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("always") && err.contains("never"), "{err}");
}
