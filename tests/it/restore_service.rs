//! `kind = "service"` and `restore stop`, against real processes: a python3
//! listener on a 127.0.0.1 port chosen free at run time, `sh` and `sleep`.
//!
//! Every test that starts a service holds a `Stopper`, which runs `restore
//! stop` when the test ends (passing or not), so no daemon outlives it.

use crate::util::rng::Rng;
use crate::util::{Run, TestEnv, run};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use warmstart::restore::steps::service::{Liveness, liveness, parse_stat};

const LISTENER: &str = r#"import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen(16)
print("listening on", sys.argv[1], flush=True)
while True:
    c, _ = s.accept()
    c.close()
"#;

/// A port nothing listens on right now (the kernel's choice, then released).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn accepts(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// A repository `w` with `text` as its restore.toml and the listener script.
fn setup(text: &str) -> TestEnv {
    let env = TestEnv::new();
    env.work_repo("w");
    write(&env.join("w/svc.py"), LISTENER);
    write(&env.join("w/cache-manifests/restore.toml"), text);
    env
}

/// Writes a file with mode 0644 whatever the umask (a pidfile that others
/// could write is never trusted, and these tests mean to reach the checks
/// after that one).
fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
}

fn restore(env: &TestEnv, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in("w");
    cmd.arg("restore").args(args);
    run(&mut cmd)
}

/// `restore --json ARGS` (exit 0); the row of `step`.
fn restore_row(env: &TestEnv, step: &str, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let r = restore(env, &all).ok();
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    v["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["step"] == step)
        .unwrap_or_else(|| panic!("no row {step}: {v:#}"))
        .clone()
}

fn stop_json(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = vec!["stop", "--json"];
    all.extend_from_slice(args);
    let r = restore(env, &all).ok();
    serde_json::from_str(&r.stdout()).unwrap()
}

/// Stops every service of `w` when dropped (also when the test panics).
struct Stopper<'a>(&'a TestEnv);

impl Drop for Stopper<'_> {
    fn drop(&mut self) {
        let _ = self.0.xtask_in("w").args(["restore", "stop"]).output();
    }
}

fn pidfile_pid(path: &Path) -> u32 {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines().next().unwrap().parse().unwrap()
}

/// Alive and not exiting: /proc says so, and the state is not Z or X.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .is_some_and(|st| !matches!(st.state, 'Z' | 'X' | 'x'))
}

fn start_time(pid: u32) -> u64 {
    parse_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap())
        .unwrap()
        .start_time
}

/// Waits (bounded) until `pid` is dead or a zombie.
fn wait_dead(pid: u32) {
    let start = Instant::now();
    while alive(pid) {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "pid {pid} did not die"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn listener_plan(port: u16, extra: &str) -> String {
    format!(
        "[[step]]\nname = \"svc\"\nkind = \"service\"\nrun = [\"python3\", \"svc.py\", \"{port}\"]\nready_port = {port}\nready_timeout = \"20s\"\npidfile = \"run/svc.pid\"\nlog = \"run/svc.log\"\n{extra}"
    )
}

/// A process of the test, in a session of its own when `leader`.
fn spawn_other(program: &str, args: &[&str], leader: bool) -> Other {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    if leader {
        // SAFETY: setsid is async-signal-safe and touches no memory of this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    }
    Other(cmd.spawn().unwrap())
}

/// A process of the test, killed and reaped when dropped (also on a panic).
struct Other(Child);

impl Other {
    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Other {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The pidfile's JSON line, with `pid` set in both lines (a forged pidfile).
fn forged(real: &Value, pid: u32, start_time: Value) -> String {
    let mut rec = real.clone();
    rec["pid"] = pid.into();
    rec["start_time"] = start_time;
    format!("{pid}\n{rec}\n")
}

fn record(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(text.lines().nth(1).unwrap()).unwrap()
}

#[test]
fn service_starts_once_then_stays_warm_with_the_same_pid() {
    let port = free_port();
    let env = setup(&listener_plan(port, ""));
    let _stop = Stopper(&env);
    let pidfile = env.join("w/run/svc.pid");
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    let pid = pidfile_pid(&pidfile);
    assert!(
        row["what"]
            .as_str()
            .unwrap()
            .starts_with(&format!("started pid {pid}, ready on 127.0.0.1:{port}")),
        "{row:#}"
    );
    assert!(accepts(port) && alive(pid));
    let rec = record(&pidfile);
    assert_eq!(rec["start_time"], start_time(pid));
    assert_eq!(rec["ready"], true);

    for _ in 0..2 {
        let row = restore_row(&env, "svc", &[]);
        assert_eq!(row["state"], "warm", "{row:#}");
        let what = row["what"].as_str().unwrap();
        assert!(what.starts_with(&format!("pid {pid}, up ")), "{what}");
        assert_eq!(pidfile_pid(&pidfile), pid);
    }
    let table = restore(&env, &[]).ok().stdout();
    assert!(
        table.contains("warm") && table.contains(&format!("pid {pid}, up")),
        "{table}"
    );
    let log = std::fs::read_to_string(env.join("w/run/svc.log")).unwrap();
    assert!(log.contains(&format!("listening on {port}")), "{log}");

    let v = stop_json(&env, &["svc"]);
    let s = &v["services"][0];
    assert_eq!(
        (&s["was_running"], &s["pid"], &s["signal"], &v["ok"]),
        (
            &Value::Bool(true),
            &Value::from(pid),
            &Value::from("SIGTERM"),
            &Value::Bool(true)
        ),
        "{v:#}"
    );
    assert!(!alive(pid) && !pidfile.exists() && !accepts(port));
}

#[test]
fn service_killed_with_kill_9_is_restarted_on_the_next_run() {
    let port = free_port();
    let env = setup(&listener_plan(port, ""));
    let _stop = Stopper(&env);
    let pidfile = env.join("w/run/svc.pid");
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    let old = pidfile_pid(&pidfile);
    // SAFETY: kill(2) of the service this test started.
    assert_eq!(unsafe { libc::kill(old as i32, libc::SIGKILL) }, 0);
    // Dead or a zombie (an init that does not reap keeps it one forever):
    // either way the pid is still "alive" to `kill -0`, and not running here.
    wait_dead(old);
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    let new = pidfile_pid(&pidfile);
    assert_ne!(new, old);
    assert!(alive(new) && accepts(port));
    let steplog = std::fs::read_to_string(env.join("w/.git/warmstart/logs/svc.log")).unwrap();
    assert!(
        steplog.contains(&format!("not running: pid {old} is"))
            && (steplog.contains("is gone") || steplog.contains("is exiting (state Z)")),
        "{steplog}"
    );
    assert_eq!(restore_row(&env, "svc", &[])["state"], "warm");
}

#[test]
fn a_pid_reused_by_another_program_or_a_zombie_is_not_taken_for_the_service() {
    let port = free_port();
    let env = setup(&listener_plan(port, ""));
    let _stop = Stopper(&env);
    let pidfile = env.join("w/run/svc.pid");
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    let real = record(&pidfile);
    assert_eq!(
        stop_json(&env, &["svc"])["services"][0]["was_running"],
        true
    );

    // A live program in a session of its own got "the pid": its start time differs.
    let other = spawn_other("sleep", &["600"], true);
    let opid = other.id();
    write(&pidfile, &forged(&real, opid, real["start_time"].clone()));
    let v = stop_json(&env, &["svc"]);
    assert_eq!(v["services"][0]["was_running"], false, "{v:#}");
    assert!(
        v["services"][0]["note"]
            .as_str()
            .unwrap()
            .contains(&format!("pid {opid} is another program now")),
        "{v:#}"
    );
    assert!(alive(opid), "restore stop signalled an unrelated process");
    write(&pidfile, &forged(&real, opid, real["start_time"].clone()));
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    let started = pidfile_pid(&pidfile);
    assert_ne!(started, opid);
    assert!(alive(opid) && alive(started) && accepts(port));
    assert_eq!(stop_json(&env, &["svc"])["services"][0]["pid"], started);
    assert!(alive(opid));
    drop(other);

    // The right start time, but the process is a zombie (exited, not reaped).
    let zombie = spawn_other("true", &[], true);
    let zpid = zombie.id();
    let zstart = start_time(zpid);
    wait_dead(zpid);
    write(&pidfile, &forged(&real, zpid, zstart.into()));
    match liveness(&pidfile, "svc") {
        Liveness::NotRunning(why) => {
            assert!(
                why.contains(&format!("pid {zpid} is exiting (state Z)")),
                "{why}"
            )
        }
        other => panic!("a zombie was taken for running: {other:?}"),
    }
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    assert_ne!(pidfile_pid(&pidfile), zpid);
    drop(zombie);
}

#[test]
fn a_change_of_a_watched_file_or_of_the_executable_restarts_the_service() {
    let port = free_port();
    let text = format!(
        "[[step]]\nname = \"svc\"\nkind = \"service\"\nrun = \"exec bin/svc {port}\"\nready_port = {port}\nready_timeout = \"20s\"\nwatch = [\"svc.conf\", \"svc.py\"]\npidfile = \"run/svc.pid\"\n"
    );
    let env = setup(&text);
    let _stop = Stopper(&env);
    let exe = env.join("w/bin/svc");
    write(&exe, "#!/bin/sh\nexec python3 svc.py \"$1\"\n");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    write(&env.join("w/svc.conf"), "level = 1\n");
    let pidfile = env.join("w/run/svc.pid");
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    let first = pidfile_pid(&pidfile);
    assert_eq!(restore_row(&env, "svc", &[])["state"], "warm");
    assert_eq!(
        record(&pidfile)["exe"]["path"],
        std::fs::canonicalize(&exe).unwrap().display().to_string()
    );

    write(&env.join("w/svc.conf"), "level = 22\n");
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    let second = pidfile_pid(&pidfile);
    assert_eq!(
        row["what"].as_str().unwrap().split(',').next().unwrap(),
        format!("restarted: pid {first} -> {second}")
    );
    assert!(!alive(first) && alive(second) && accepts(port));
    assert_eq!(restore_row(&env, "svc", &[])["state"], "warm");

    // The executable itself: a new version written in place.
    write(&exe, "#!/bin/sh\n# v2\nexec python3 svc.py \"$1\"\n");
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let row = restore_row(&env, "svc", &[]);
    assert_eq!(row["state"], "done", "{row:#}");
    let third = pidfile_pid(&pidfile);
    assert!(!alive(second) && alive(third) && accepts(port));
    let steplog = std::fs::read_to_string(env.join("w/.git/warmstart/logs/svc.log")).unwrap();
    assert!(
        steplog.contains(&format!("pid {second} must restart: its executable")),
        "{steplog}"
    );
    // A watched file that disappears is a change too.
    std::fs::remove_file(env.join("w/svc.conf")).unwrap();
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    assert_eq!(restore_row(&env, "svc", &[])["state"], "warm");

    // A new command line in the manifest.
    let fourth = pidfile_pid(&pidfile);
    write(
        &env.join("w/cache-manifests/restore.toml"),
        &text.replace("exec bin/svc", "exec ./bin/svc"),
    );
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    let steplog = std::fs::read_to_string(env.join("w/.git/warmstart/logs/svc.log")).unwrap();
    assert!(
        steplog.contains(&format!(
            "pid {fourth} must restart: its command line changed"
        )),
        "{steplog}"
    );
    assert!(!alive(fourth));

    // A start interrupted before its readiness was confirmed is redone.
    let fifth = pidfile_pid(&pidfile);
    let text = std::fs::read_to_string(&pidfile).unwrap();
    write(&pidfile, &text.replace("\"ready\":true", "\"ready\":false"));
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    assert!(!alive(fifth) && alive(pidfile_pid(&pidfile)) && accepts(port));
    assert_eq!(restore_row(&env, "svc", &[])["state"], "warm");
}

#[test]
fn readiness_a_never_ready_service_fails_with_one_line_and_strict_exits_11() {
    let port = free_port();
    let text = format!(
        "[[step]]\nname = \"never\"\nkind = \"service\"\nrun = \"exec sleep 600\"\nready_port = {port}\nready_timeout = \"700ms\"\n\n\
         [[step]]\nname = \"flag\"\nkind = \"service\"\nrun = \"sleep 0.3; touch ready.flag; exec sleep 600\"\nready_cmd = \"test -f ready.flag\"\n\n\
         [[step]]\nname = \"dies\"\nkind = \"service\"\nrun = \"echo no config >&2; exit 3\"\n"
    );
    let env = setup(&text);
    let _stop = Stopper(&env);
    let r = restore(&env, &[]).ok();
    let err = r.stderr();
    let lines: Vec<_> = err.lines().filter(|l| l.contains("never")).collect();
    let svclog = env.join("w/.git/warmstart/logs/never.service.log");
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].starts_with("restore: never failed (fail-open, continuing): service never is not ready: nothing accepted a connection on 127.0.0.1:")
            && lines[0].contains(&format!("its output: {}", svclog.display())),
        "{err}"
    );
    assert!(
        !env.join("w/.git/warmstart/restore/services/never.pid")
            .exists()
    );
    assert!(err.contains("restore: dies failed (fail-open, continuing): service dies exited before it was ready (exit 3)"), "{err}");
    let dies_log =
        std::fs::read_to_string(env.join("w/.git/warmstart/logs/dies.service.log")).unwrap();
    assert!(dies_log.contains("no config"), "{dies_log}");
    let flag_row = r
        .stdout()
        .lines()
        .find(|l| l.starts_with("flag "))
        .unwrap_or_default()
        .to_string();
    assert!(
        flag_row.contains(" done ")
            && flag_row.contains("started pid")
            && flag_row.contains(", ready, in "),
        "{}",
        r.stdout()
    );
    let row = restore_row(&env, "flag", &["--only", "flag"]);
    assert_eq!(row["state"], "warm", "{row:#}");

    let r = restore(&env, &["--strict", "--only", "never"]).expect_code(11);
    assert!(
        r.stderr()
            .contains("restore: never failed: service never is not ready"),
        "{}",
        r.stderr()
    );
    // Nothing of the failed start stays: no pidfile, and the port is free.
    assert!(
        !env.join("w/.git/warmstart/restore/services/never.pid")
            .exists()
    );
    assert!(!accepts(port));
}

#[test]
fn restore_stop_ends_the_whole_process_group_children_included() {
    // The shell's two children: one ends on SIGTERM, one ignores it (SIGKILL needed).
    let text = "[[step]]\nname = \"tree\"\nkind = \"service\"\nrun = \"sleep 600 & echo $! > a.pid; (trap '' TERM; exec sleep 601) & echo $! > b.pid; wait\"\nkill_grace = \"300ms\"\n\n[[step]]\nname = \"cmd\"\nkind = \"command\"\nrun = \"true\"\nunless = \"true\"\n";
    let env = setup(text);
    let _stop = Stopper(&env);
    let row = restore_row(&env, "tree", &["--only", "tree"]);
    assert_eq!(row["state"], "done", "{row:#}");
    let pidfile = env.join("w/.git/warmstart/restore/services/tree.pid");
    let leader = pidfile_pid(&pidfile);
    let read = |f: &str| -> u32 {
        std::fs::read_to_string(env.join("w").join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let (a, b) = (read("a.pid"), read("b.pid"));
    assert!(alive(leader) && alive(a) && alive(b));

    let r = restore(&env, &["stop"]).ok();
    assert!(
        r.stdout().contains(&format!(
            "tree: stopped pid {leader} and its process group (SIGKILL"
        )),
        "{}",
        r.stdout()
    );
    for pid in [leader, a, b] {
        assert!(!alive(pid), "pid {pid} survived restore stop");
    }
    assert!(!pidfile.exists());
    let v = stop_json(&env, &[]);
    assert_eq!(
        v["services"][0]["note"], "not running (no pidfile)",
        "{v:#}"
    );
    assert_eq!(v["services"].as_array().unwrap().len(), 1, "{v:#}");
    // -q: nothing on either stream when it went as asked.
    let row = restore_row(&env, "tree", &["--only", "tree"]);
    assert_eq!(row["state"], "done", "{row:#}");
    let r = restore(&env, &["stop", "-q"]).ok();
    assert_eq!((r.stdout(), r.stderr()), (String::new(), String::new()));
    assert!(!pidfile.exists());

    let r = restore(&env, &["stop", "nosuch"]).expect_code(2);
    assert!(
        r.stderr().contains("no step named \"nosuch\"") && r.stderr().contains("services are tree"),
        "{}",
        r.stderr()
    );
    let r = restore(&env, &["stop", "cmd"]).expect_code(2);
    assert!(
        r.stderr()
            .contains("step \"cmd\" is a command step, not a service"),
        "{}",
        r.stderr()
    );
}

/// A hostile pidfile: garbage, or a well-formed one about the wrong process.
fn hostile(rng: &mut Rng, real: &Value, victims: &[(u32, u64)]) -> String {
    match rng.below(4) {
        0 => (0..rng.below(120))
            .map(|_| *rng.pick(&[b'0', b'9', b'\n', b'{', b'"', b'-', b' ', 0xff, b'x']))
            .map(|b| b as char)
            .collect(),
        1 => {
            let first = rng
                .pick(&[
                    "0",
                    "1",
                    "-1",
                    "-42",
                    "4294967296",
                    "99999999999999999999",
                    "",
                    " 7",
                    "+7",
                    "0x10",
                    "2147483648",
                ])
                .to_string();
            format!("{first}\n{real}\n")
        }
        _ => {
            let (pid, start) = *rng.pick(victims);
            let mut rec = real.clone();
            rec["pid"] = pid.into();
            rec["start_time"] = match rng.below(5) {
                0 => start.into(),
                1 => (start + 1).into(),
                2 => start.saturating_sub(1).into(),
                3 => Value::from(-1),
                _ => Value::from(u64::MAX),
            };
            match rng.below(8) {
                0 => rec["boot_id"] = "00000000-0000-0000-0000-000000000000".into(),
                1 => rec["step"] = "other".into(),
                2 => rec["format"] = 2.into(),
                3 => {
                    let keys: Vec<String> = rec.as_object().unwrap().keys().cloned().collect();
                    let key = rng.pick(&keys).clone();
                    rec.as_object_mut().unwrap().remove(&key);
                }
                4 => rec["pid"] = (pid + 1).into(),
                _ => {}
            }
            let first = if rng.below(6) == 0 {
                format!("{pid} ")
            } else {
                pid.to_string()
            };
            format!("{first}\n{rec}\n")
        }
    }
}

#[test]
fn hostile_pidfiles_never_count_as_running_and_never_signal_anything() {
    let text = "[[step]]\nname = \"svc\"\nkind = \"service\"\nrun = [\"sleep\", \"600\"]\n";
    let env = setup(text);
    let _stop = Stopper(&env);
    assert_eq!(restore_row(&env, "svc", &[])["state"], "done");
    let pidfile = env.join("w/.git/warmstart/restore/services/svc.pid");
    let real = record(&pidfile);
    assert_eq!(stop_json(&env, &[])["services"][0]["was_running"], true);

    // Victims: an unrelated process (not a session leader), pid 1, this test.
    let victim = spawn_other("sleep", &["600"], false);
    let me = std::process::id();
    let victims: Vec<(u32, u64)> = [victim.id(), 1, me]
        .into_iter()
        .map(|p| (p, start_time(p)))
        .collect();
    // Each victim with its exact identity (boot id and start time) too.
    let mut cases: Vec<String> = victims
        .iter()
        .map(|&(p, s)| forged(&real, p, s.into()))
        .collect();
    let mut rng = Rng(0x5eed_1234_abcd_0017);
    cases.extend((0..3000).map(|_| hostile(&mut rng, &real, &victims)));
    for (i, case) in cases.iter().enumerate() {
        write(&pidfile, case);
        if i % 7 == 0 {
            // Others could have written it: never trusted, whatever it says.
            std::fs::set_permissions(&pidfile, std::fs::Permissions::from_mode(0o666)).unwrap();
        }
        if let Liveness::Running(rec) = liveness(&pidfile, "svc") {
            panic!("case {i} counts as running: {case:?} -> {rec:?}");
        }
    }
    // The binary on a sample: `restore stop` signals nothing and says why,
    // and `restore` starts a real service instead of calling one of them warm.
    for (i, case) in cases
        .iter()
        .enumerate()
        .filter(|(i, _)| *i < 3 || i % 300 == 0)
    {
        write(&pidfile, case);
        let v = stop_json(&env, &["svc"]);
        let s = &v["services"][0];
        assert_eq!(
            (&s["was_running"], &v["ok"]),
            (&Value::Bool(false), &Value::Bool(true)),
            "case {i} {case:?}: {v:#}"
        );
        assert!(
            s["note"].as_str().unwrap().starts_with("not running: "),
            "{v:#}"
        );
        assert!(!pidfile.exists(), "restore stop removes the pidfile");
        if i % 600 == 0 {
            write(&pidfile, case);
            let row = restore_row(&env, "svc", &[]);
            assert_eq!(row["state"], "done", "case {i} {case:?}: {row:#}");
            assert!(!victims.iter().any(|&(p, _)| p == pidfile_pid(&pidfile)));
            assert_eq!(
                stop_json(&env, &["svc"])["services"][0]["was_running"],
                true
            );
        }
    }
    assert!(alive(victim.id()), "an unrelated process was signalled");
    drop(victim);
}

#[test]
fn bad_service_settings_fail_open_with_the_fix_named() {
    let port = free_port();
    let held = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let text = format!(
        "[[step]]\nname = \"missing\"\nkind = \"service\"\nrun = [\"no-such-daemon-here\"]\n\n\
         [[step]]\nname = \"nowhere\"\nkind = \"service\"\nrun = [\"sleep\", \"600\"]\npidfile = \"/proc/none/x.pid\"\n\n\
         [[step]]\nname = \"taken\"\nkind = \"service\"\nrun = [\"python3\", \"svc.py\", \"{port}\"]\nready_port = {port}\n"
    );
    let env = setup(&text);
    let _stop = Stopper(&env);
    let r = restore(&env, &[]).ok();
    let err = r.stderr();
    for want in [
        "restore: missing failed (fail-open, continuing): cannot start `no-such-daemon-here` in ",
        "restore: nowhere failed (fail-open, continuing): creating /proc/none, the directory of `pidfile`: choose a writable path",
        &format!(
            "restore: taken failed (fail-open, continuing): 127.0.0.1:{port} already accepts connections, from a process this service did not start"
        ),
    ] {
        assert!(err.contains(want), "missing {want:?} in\n{err}");
    }
    assert_eq!(err.lines().count(), 3, "one line per failure:\n{err}");
    // The port's owner is untouched, and nothing was left running or recorded.
    assert!(held.local_addr().is_ok() && accepts(port));
    assert!(
        !env.join("w/.git/warmstart/restore/services/taken.pid")
            .exists()
    );
    assert!(
        !env.join("w/.git/warmstart/restore/services/missing.pid")
            .exists()
    );

    write(
        &env.join("w/cache-manifests/restore.toml"),
        "[[step]]\nname = \"s\"\nkind = \"service\"\nrun = \"x\"\nready_port = \"7\"\n",
    );
    let r = restore(&env, &["stop"]).expect_code(10);
    assert!(
        r.stderr()
            .contains("step 1 (\"s\"): `ready_port` = a string is not a TCP port"),
        "{}",
        r.stderr()
    );
}
