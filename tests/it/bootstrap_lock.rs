//! The generated bootstrap's own lock and its fetch, with real processes:
//! a lock whose pid now belongs to an unrelated process is taken over at
//! once, and a bootstrap killed with SIGKILL mid-fetch takes its `timeout
//! git fetch` with it. A real `init`, a real silent TCP server.

use crate::util::{TestEnv, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A repository set up by `init`, committed, with `origin` a bare remote
/// where nothing was published.
fn adopted(env: &TestEnv) -> PathBuf {
    let repo = env.work_repo("r");
    run(env.xtask_in("r").arg("init")).ok();
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "init"]);
    let origin = env.bare_remote("origin.git");
    env.git("r", ["remote", "add", "origin", origin.to_str().unwrap()]);
    repo
}

fn bootstrap(env: &TestEnv, repo: &Path) -> Command {
    let mut cmd = Command::new("bash");
    cmd.arg(repo.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(repo);
    env.isolate(&mut cmd);
    cmd
}

fn host() -> String {
    let out = Command::new("uname").arg("-n").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Field 22 of /proc/PID/stat: when the process started.
fn start_time(pid: u32) -> String {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(") ").unwrap() + 2..];
    rest.split(' ').nth(19).unwrap().to_string()
}

/// Regression: a lock naming a pid that a later, unrelated process got
/// (the owner was SIGKILLed, the pid recycled) was waited on for the full
/// 3 x WARMSTART_BOOTSTRAP_FETCH_TIMEOUT (180 s by default). The lock
/// records its owner's start time; a live pid with another start time is
/// not the owner, and its lock is taken over at once. The true owner (same
/// pid, same start time) is still waited for.
#[test]
fn bootstrap_lock_of_a_reused_pid_is_taken_over_at_once() {
    let env = TestEnv::new();
    let repo = adopted(&env);
    let lock = repo.join(".git/warmstart/bootstrap/fetch.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let mut unrelated = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = unrelated.id();
    let real = start_time(pid);
    let other: u64 = real.parse::<u64>().unwrap().saturating_sub(1000).max(1);
    let owner = format!("{pid}.{other}@{}", host());
    std::os::unix::fs::symlink(&owner, &lock).unwrap();
    let started = Instant::now();
    let mut cmd = bootstrap(&env, &repo);
    cmd.env("WARMSTART_BOOTSTRAP_FETCH_TIMEOUT", "5");
    let r = run(&mut cmd);
    let took = started.elapsed();
    let err = r.stderr();
    assert_eq!(r.code(), 1, "{err}");
    assert!(
        err.contains(&format!(
            "({owner}) is gone (pid {pid} now runs another process): taking the lock over"
        )),
        "{err}"
    );
    assert!(!err.contains("another bootstrap"), "not waited on: {err}");
    assert!(took < Duration::from_secs(10), "took {took:?}: {err}");
    assert!(std::fs::symlink_metadata(&lock).is_err(), "released");

    // The same pid with its own start time is the owner: waited for.
    let owner = format!("{pid}.{real}@{}", host());
    std::os::unix::fs::symlink(&owner, &lock).unwrap();
    let mut cmd = bootstrap(&env, &repo);
    cmd.env("WARMSTART_BOOTSTRAP_FETCH_TIMEOUT", "1");
    let r = run(&mut cmd);
    unrelated.kill().unwrap();
    unrelated.wait().unwrap();
    let err = r.stderr();
    assert_eq!(r.code(), 8, "{err}");
    assert!(
        err.contains(&format!("another bootstrap ({owner}) is fetching")),
        "{err}"
    );
    assert_eq!(std::fs::read_link(&lock).unwrap().to_str().unwrap(), owner);
}

/// The pids whose parent chain leads to `root`, from /proc.
fn descendants(root: u32) -> Vec<(u32, String)> {
    let mut parent = std::collections::BTreeMap::new();
    let mut names = std::collections::BTreeMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(") ") else {
            continue;
        };
        let fields: Vec<&str> = stat[close + 2..].split(' ').collect();
        parent.insert(pid, fields[1].parse::<u32>().unwrap_or(0));
        let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        names.insert(pid, String::from_utf8_lossy(&cmdline).replace('\0', " "));
    }
    let mut found = Vec::new();
    for &pid in parent.keys() {
        let mut p = pid;
        while let Some(&pp) = parent.get(&p) {
            if pp == root {
                found.push((pid, names[&pid].clone()));
                break;
            }
            if pp <= 1 {
                break;
            }
            p = pp;
        }
    }
    found
}

/// Alive and not a zombie waiting for a reaper.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rfind(") ").map(|i| s[i + 2..].starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

/// Regression: SIGKILL of the bootstrap left `timeout 60 git fetch` (in a
/// process group of timeout's own) fetching on, to its deadline. Against a
/// server that accepts and never answers, the fetch now ends with the
/// bootstrap: no git or timeout process of it is left.
#[test]
fn bootstrap_killed_mid_fetch_leaves_no_git_or_timeout_behind() {
    let env = TestEnv::new();
    let repo = adopted(&env);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!(
        "git://127.0.0.1:{}/x.git",
        listener.local_addr().unwrap().port()
    );
    let mut cmd = bootstrap(&env, &repo);
    cmd.env("WARMSTART_BOOTSTRAP_REMOTE", &silent)
        .env("WARMSTART_BOOTSTRAP_FETCH_TIMEOUT", "60")
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(30);
    let fetching = loop {
        let d = descendants(child.id());
        if d.iter()
            .any(|(_, c)| c.starts_with("git ") && c.contains(" fetch "))
        {
            break d;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the bootstrap ended before fetching"
        );
        assert!(Instant::now() < until, "no git fetch started: {d:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        fetching.iter().any(|(_, c)| c.starts_with("timeout ")),
        "the fetch runs under timeout: {fetching:?}"
    );
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGKILL) };
    child.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let left: Vec<_> = fetching.iter().filter(|(p, _)| alive(*p)).collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "left running after the SIGKILL: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(listener);
}
