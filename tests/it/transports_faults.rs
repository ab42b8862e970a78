//! The real network failing: a proxy and an ssh server that accept and
//! never answer, a transfer that stalls mid-restore (squid paused with
//! SIGSTOP), a wrong password, a proxy's 407, a wrong ssh key and a server
//! certificate from an unknown CA. Each command must end within its
//! deadline (`--connect-timeout`, `--stall-timeout` or their environment
//! variables) with one line and exit code 8 (unreachable or timed out) or
//! 13 (authentication refused), and a stalled restore must resume from the
//! chunks it stored.

use crate::transports::{Fx, json_of};
use crate::util::servers::{GIT_PASSWORD, GIT_USER, Nginx, PROXY_USER, Silent, Squid, Sshd};
use crate::util::{Run, show, stored_chunks};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long past its own deadline a command may take to end on this
/// shared 2-core machine (git's exit, cleanup) before it counts as hung.
const SLACK: Duration = Duration::from_secs(8);

/// Runs the binary, killing it (and failing) if it outlives `limit`.
fn bounded(fx: &Fx, dir: &str, args: &[&str], limit: Duration) -> (Run, Duration) {
    let start = Instant::now();
    let mut child = fx
        .command(dir, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if start.elapsed() > limit + Duration::from_secs(30) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{args:?} still running after {:?}, its deadline was {limit:?}: it hangs\n{}",
                start.elapsed(),
                show(&out)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (Run { out }, start.elapsed())
}

/// Exit `code`, within `limit`, with one error line on stderr containing
/// `says`, and none of git's own lines (`fatal:`, `hint:`, its
/// boilerplate) around it. Progress lines (`publishing art ...`) may stay.
fn ends_in_one_line(run: &Run, took: Duration, limit: Duration, code: i32, says: &[&str]) {
    assert_eq!(run.code(), code, "{}", show(&run.out));
    assert!(
        took <= limit + SLACK,
        "took {took:?}, deadline {limit:?}\n{}",
        show(&run.out)
    );
    let err = run.stderr();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line: {}", show(&run.out));
    assert!(
        !err.lines().any(|l| l.starts_with("fatal:")
            || l.starts_with("hint:")
            || l.contains("Please make sure you have the correct access rights")),
        "git's own lines in {err:?}"
    );
    for s in says {
        assert!(errors[0].contains(s), "{s:?} missing from {:?}", errors[0]);
    }
}

/// Every network command of a cache, and gates fetch.
const COMMANDS: [&[&str]; 5] = [
    &["cache", "publish", "art"],
    &["cache", "restore", "art"],
    &["cache", "verify", "art"],
    &["cache", "status", "art"],
    &["gates", "fetch"],
];

#[test]
fn transports_faults_a_silent_proxy_times_out_connecting_with_exit_8() {
    let fx = Fx::new();
    let silent = Silent::start();
    // The remote is real and would answer; the proxy in front never does.
    let server = Nginx::start(&fx.env.join("."));
    fx.global_config(&format!(
        "[http]\n\tsslCAInfo = {}\n\tproxy = http://127.0.0.1:{}\n",
        server.ca.cert.display(),
        silent.port
    ));
    fx.set_remote(&server.url_with("origin.git", GIT_USER, GIT_PASSWORD));
    for args in COMMANDS {
        let mut all = args.to_vec();
        all.extend(["--connect-timeout", "2s"]);
        let (r, took) = bounded(&fx, "work", &all, Duration::from_secs(2));
        ends_in_one_line(&r, took, Duration::from_secs(2), 8, &["timed out", "2s"]);
    }
}

#[test]
fn transports_faults_a_silent_ssh_server_times_out_connecting_with_exit_8() {
    let mut fx = Fx::new();
    let silent = Silent::start();
    let sshd = Sshd::start();
    // The key and host key of a real server, the port of one that never
    // says a word (not even its banner).
    fx.var("GIT_SSH_COMMAND", &sshd.ssh_command(&sshd.key));
    fx.var("WARMSTART_CONNECT_TIMEOUT", "2s");
    fx.set_remote(&format!(
        "ssh://root@127.0.0.1:{}{}",
        silent.port,
        fx.env.join("origin.git").display()
    ));
    for args in COMMANDS {
        let (r, took) = bounded(&fx, "work", args, Duration::from_secs(2));
        ends_in_one_line(&r, took, Duration::from_secs(2), 8, &["timed out"]);
    }
}

#[test]
fn transports_faults_a_transfer_stalled_by_a_paused_proxy_ends_and_resumes() {
    // 4 MB in 64 kB chunks: sixty-odd chunks read one proxy tunnel each,
    // long enough to pause squid after the first ones are stored.
    let mut fx = Fx::with(4_000_000, 64_000);
    let server = Nginx::start(&fx.env.join("."));
    let proxy = Squid::start();
    fx.var("GIT_SSL_CAINFO", server.ca.cert.to_str().unwrap());
    fx.global_config(&format!("[http]\n\tproxy = {}\n", proxy.proxy_url()));
    fx.var("WARMSTART_FETCH_BLOB_LIMIT", "32k");
    fx.set_remote(&server.url_with("origin.git", GIT_USER, GIT_PASSWORD));
    let published = json_of(&fx.xtask(&["cache", "publish", "art", "--json"]).ok());
    // Chunks over 32 KiB are fetched by id (warmstart.json, 10 kB here,
    // must stay in the branch fetch).
    let big = published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() >= 32 * 1024)
        .count() as u64;
    fx.forget();

    fx.var("WARMSTART_CONNECT_TIMEOUT", "3s");
    fx.var("WARMSTART_STALL_TIMEOUT", "3s");
    let start = Instant::now();
    let mut child = fx
        .command("work", &["cache", "restore", "art"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while stored_chunks(&fx.work) < 2 {
        if child.try_wait().unwrap().is_some() {
            panic!(
                "the restore ended before the proxy could be paused ({} chunks stored)\n{}",
                stored_chunks(&fx.work),
                show(&child.wait_with_output().unwrap())
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no chunk arrived"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    proxy.pause();
    let paused = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if paused.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            proxy.resume();
            panic!(
                "the restore still runs {:?} after the proxy stalled",
                paused.elapsed()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = paused.elapsed();
    let r = Run {
        out: child.wait_with_output().unwrap(),
    };
    proxy.resume();
    ends_in_one_line(&r, took, Duration::from_secs(6), 8, &[]);
    let err = r.stderr();
    assert!(
        err.contains("stalled") || err.contains("timed out"),
        "{err}"
    );
    assert!(!fx.target.exists(), "nothing installed");
    let kept = stored_chunks(&fx.work) as u64;
    assert!(kept >= 2, "the chunks stored before the stall are kept");

    // The next run fetches only what is missing.
    let j = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert!(
        j["chunks_fetched"].as_u64().unwrap() <= big - kept,
        "fetched again only what was missing ({kept} of {big} kept): {j}"
    );
}

#[test]
fn transports_faults_a_wrong_password_and_a_proxy_407_are_exit_13() {
    let mut fx = Fx::new();
    let server = Nginx::start(&fx.env.join("."));
    let proxy = Squid::start();
    fx.var("GIT_SSL_CAINFO", server.ca.cert.to_str().unwrap());
    fx.var("WARMSTART_CONNECT_TIMEOUT", "5s");
    fx.set_remote(&server.url_with("origin.git", GIT_USER, "not-the-password"));
    let limit = Duration::from_secs(5);
    for args in COMMANDS {
        let (r, took) = bounded(&fx, "work", args, limit);
        ends_in_one_line(&r, took, limit, 13, &["Authentication failed"]);
    }
    // The right password, the wrong one for the proxy.
    fx.env.git(
        "work",
        [
            "remote",
            "set-url",
            "origin",
            &server.url_with("origin.git", GIT_USER, GIT_PASSWORD),
        ],
    );
    fx.global_config(&format!(
        "[http]\n\tproxy = {}\n",
        proxy.proxy_url_with(PROXY_USER, "not-the-proxy-password")
    ));
    for args in COMMANDS {
        let (r, took) = bounded(&fx, "work", args, limit);
        ends_in_one_line(&r, took, limit, 13, &["407"]);
    }
    assert!(
        proxy.access_log().contains("TCP_DENIED/407"),
        "{}",
        proxy.access_log()
    );
}

#[test]
fn transports_faults_a_wrong_ssh_key_is_exit_13_and_keeps_the_cause() {
    let mut fx = Fx::new();
    let sshd = Sshd::start();
    fx.var("GIT_SSH_COMMAND", &sshd.ssh_command(&sshd.wrong_key));
    fx.var("WARMSTART_CONNECT_TIMEOUT", "5s");
    fx.set_remote(&sshd.url(&fx.env.join("origin.git")));
    let limit = Duration::from_secs(5);
    for args in COMMANDS {
        let (r, took) = bounded(&fx, "work", args, limit);
        ends_in_one_line(&r, took, limit, 13, &["Permission denied (publickey)"]);
    }
}

#[test]
fn transports_faults_a_certificate_from_an_unknown_ca_is_exit_13() {
    // The server's CA is not trusted: git's default bundle only.
    let fx = Fx::new();
    let server = Nginx::start(&fx.env.join("."));
    fx.set_remote(&server.url_with("origin.git", GIT_USER, GIT_PASSWORD));
    let limit = Duration::from_secs(10);
    for args in COMMANDS {
        let (r, took) = bounded(&fx, "work", args, limit);
        ends_in_one_line(&r, took, limit, 13, &["certificate"]);
    }
}
