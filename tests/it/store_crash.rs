//! Crash-only private stores: whatever killed the last run (the whole container, or warmstart alone), the next run repairs what it left in cache.git and goes on.
//!
//! A kill of warmstart together with its git children mid-fetch leaves
//! git's `shallow.lock` in cache.git; before, every later restore, verify
//! and publish of that clone exited 3 ("another process holds git's lock")
//! with nobody alive. A kill of warmstart alone left its git running in a
//! process group of its own, holding that lock.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, run, show};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Cache `art` published from `work`, whose stores are then forgotten: the
/// next restore is a fresh clone's, and fetches the branch.
fn published() -> Fixture {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("small.txt"), "small\n").unwrap();
    write_pseudo_random(&src.join("big.bin"), 300_000, 3);
    fx.write_manifest("art", &Manifest::literal("1", &src));
    fx.publish("art");
    fx.forget();
    fx
}

fn cache_git(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart/cache.git")
}

/// A restore started in a process group of its own, whose server stalls
/// 60 s before it sends the branch's pack (a pack-objects hook, which git
/// reads from the global configuration only): once `shallow.lock` is in
/// cache.git, the branch fetch is under way.
fn restore_stalled_in_the_branch_fetch(fx: &Fixture) -> Child {
    let hook = fx.env.join("stall-hook");
    std::fs::write(&hook, "#!/bin/sh\nsleep 60\nexec \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let global = fx.env.join("gitconfig-stall");
    std::fs::write(
        &global,
        format!("[uploadpack]\n\tpackObjectsHook = {}\n", hook.display()),
    )
    .unwrap();
    let mut cmd = fx.command(&["cache", "restore", "art"]);
    use std::os::unix::process::CommandExt;
    cmd.env("GIT_CONFIG_GLOBAL", &global)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0);
    let mut child = cmd.spawn().unwrap();
    let lock = cache_git(fx).join("shallow.lock");
    let until = Instant::now() + Duration::from_secs(30);
    while !lock.exists() {
        if Instant::now() > until || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            panic!(
                "the restore never reached the branch fetch ({} never appeared)",
                lock.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

/// `(pid, parent pid, command name)` of every process.
fn processes() -> Vec<(i32, i32, String)> {
    let mut all = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let name = head.split_once('(').map_or("", |(_, n)| n).to_string();
        let mut fields = rest.split_whitespace();
        let state = fields.next().unwrap_or("");
        let ppid = fields.next().and_then(|p| p.parse().ok()).unwrap_or(0);
        if state != "Z" && state != "X" {
            all.push((pid, ppid, name));
        }
    }
    all
}

/// `root` and every living process below it, with their names.
fn tree_of(root: i32) -> Vec<(i32, String)> {
    let all = processes();
    let mut found: Vec<(i32, String)> = all
        .iter()
        .filter(|p| p.0 == root)
        .map(|p| (p.0, p.2.clone()))
        .collect();
    let mut i = 0;
    while i < found.len() {
        let parent = found[i].0;
        found.extend(
            all.iter()
                .filter(|p| p.1 == parent)
                .map(|p| (p.0, p.2.clone())),
        );
        i += 1;
    }
    found
}

/// Which of `pids` still live, by name.
fn living(pids: &[(i32, String)]) -> Vec<String> {
    let now = processes();
    pids.iter()
        .filter(|(pid, _)| now.iter().any(|p| p.0 == *pid))
        .map(|(pid, name)| format!("{name} ({pid})"))
        .collect()
}

/// Kills every process in `pids` at once, as the kernel does a cgroup:
/// all stopped first, then killed children first, so that none sees
/// another go and cleans up after it.
fn kill_all(pids: &[(i32, String)]) {
    for sig in [libc::SIGSTOP, libc::SIGKILL] {
        for (pid, _) in pids.iter().rev() {
            // SAFETY: signals to this test's own processes.
            unsafe { libc::kill(*pid, sig) };
        }
    }
}

/// The warning lines of a run that name `path`.
fn warnings_naming(r: &Run, path: &Path) -> Vec<String> {
    let name = path.display().to_string();
    r.stderr()
        .lines()
        .filter(|l| l.starts_with("warning: ") && l.contains(&name))
        .map(str::to_string)
        .collect()
}

#[test]
fn store_crash_a_kill_of_the_whole_group_mid_branch_fetch_leaves_a_lock_the_next_restore_removes() {
    let fx = published();
    let mut child = restore_stalled_in_the_branch_fetch(&fx);
    let tree = tree_of(child.id() as i32);
    assert!(
        tree.iter().any(|(_, n)| n == "git"),
        "git runs below warmstart: {tree:?}"
    );
    kill_all(&tree);
    child.wait().unwrap();
    let lock = cache_git(&fx).join("shallow.lock");
    assert!(lock.exists(), "the kill left {}", lock.display());

    let r = run(&mut fx.command(&["cache", "restore", "art"]));
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    let warned = warnings_naming(&r, &lock);
    assert_eq!(
        warned.len(),
        1,
        "one warning names the lock: {}",
        show(&r.out)
    );
    assert!(!lock.exists());
    assert!(fx.work.join("restored/art/big.bin").is_file());
}

#[test]
fn store_crash_a_kill_of_warmstart_alone_mid_branch_fetch_leaves_no_git_running() {
    let fx = published();
    let mut child = restore_stalled_in_the_branch_fetch(&fx);
    let tree = tree_of(child.id() as i32);
    let below: Vec<(i32, String)> = tree
        .iter()
        .filter(|(pid, name)| *pid != child.id() as i32 && name.starts_with("git"))
        .cloned()
        .collect();
    assert!(!below.is_empty(), "git runs below warmstart");
    // The git warmstart started itself (`git fetch`), not its server.
    let direct: Vec<(i32, String)> = processes()
        .into_iter()
        .filter(|p| p.1 == child.id() as i32 && p.2 == "git")
        .map(|p| (p.0, p.2))
        .collect();
    assert!(!direct.is_empty(), "warmstart runs git: {below:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let soon = Instant::now() + Duration::from_secs(2);
    while !living(&direct).is_empty() && Instant::now() < soon {
        std::thread::sleep(Duration::from_millis(20));
    }
    let fetch_left = living(&direct);
    // git itself ends at once; the local server it started (git-upload-pack,
    // waiting on the stalled hook) at its next keep-alive write to the
    // closed pipe, 5 s apart by default.
    let until = Instant::now() + Duration::from_secs(15);
    while !living(&below).is_empty() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left = living(&below);
    // Whatever the outcome, nothing of this test runs on after it (the
    // server's stalled hook included).
    kill_all(&tree);
    assert!(
        fetch_left.is_empty(),
        "git outlived warmstart: {fetch_left:?}"
    );
    assert!(left.is_empty(), "git outlived warmstart: {left:?}");

    // At once, with no git alive: the next restore goes through.
    let r = run(&mut fx.command(&["cache", "restore", "art"]));
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(fx.work.join("restored/art/big.bin").is_file());
}

#[test]
fn store_crash_a_git_lock_planted_in_cache_git_is_removed_with_one_warning_by_restore_publish_and_verify()
 {
    let fx = published();
    fx.restore("art");
    let store = cache_git(&fx);
    let ours = std::fs::read_dir(store.join("refs/warmstart"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.is_file())
        .expect("a ref under refs/warmstart");
    let mut ref_lock = ours.into_os_string();
    ref_lock.push(".lock");
    let locks = [
        store.join("shallow.lock"),
        store.join("index.lock"),
        store.join("packed-refs.lock"),
        PathBuf::from(ref_lock),
    ];
    let commands: [&[&str]; 3] = [
        &["cache", "restore", "art", "--verify"],
        &["cache", "publish", "art"],
        &["cache", "verify", "art"],
    ];
    for lock in &locks {
        for args in commands {
            std::fs::write(lock, "").unwrap();
            let r = run(&mut fx.command(args));
            let what = format!("{args:?} with {}", lock.display());
            assert_eq!(r.code(), 0, "{what}: {}", show(&r.out));
            let warned = warnings_naming(&r, lock);
            assert_eq!(warned.len(), 1, "{what}: {}", show(&r.out));
            assert!(warned[0].contains("removed"), "{what}: {}", show(&r.out));
            assert!(!lock.exists(), "{what}");
        }
    }
}
