//! Bounded time on a real network (127.0.0.1 only): a server that accepts
//! and never answers (http, git://, ssh), a transfer that stalls mid-chunk
//! (a relay in front of `git http-backend` or `git daemon` that stops
//! forwarding after N bytes), SIGTERM during a stalled restore, servers
//! that refuse our credentials (exit 13), and a push refused by a branch
//! protection rule. Each case must end with one line and the right exit
//! code, leave no child process and no partial chunk file behind, and a
//! stalled restore resumes from the chunks already stored.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::git_daemon::GitDaemon;
use crate::util::http::HttpServer;
use crate::util::http_backend::HttpGit;
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, run, show, signal_and_wait};
use serde_json::Value;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

/// Blobs of 8 KiB or more are left out of branch fetches here.
const LIMIT: &str = "8k";
/// The cache's artifact: 200 kB of noise in 20 kB chunks (ten chunks).
const NOISE: u64 = 200_000;

/// A work repository whose cache `art` is published to the bare
/// `origin.git` (a file remote) and restores into `restored/art`.
fn published(extra_manifest: &str) -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", LIMIT);
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), NOISE, 7);
    manifest(&fx, "1", extra_manifest);
    fx.xtask(&["cache", "publish", "art", "--json"]).ok();
    // Restores here are a fresh clone's: the publish left every chunk
    // in this clone's cache.git.
    fx.forget();
    fx
}

fn manifest(fx: &Fixture, literal: &str, extra: &str) {
    let m = Manifest::literal(literal, fx.env.join("src"))
        .chunk_bytes(20000)
        .extra(extra);
    fx.write_manifest("art", &m);
}

fn chunks_dir(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart/cache.git/chunks")
}

/// Partial chunk files left in the chunk store.
fn partial_files(fx: &Fixture) -> Vec<String> {
    std::fs::read_dir(chunks_dir(fx))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tmp-"))
                .collect()
        })
        .unwrap_or_default()
}

/// git's partial packs in cache.git (`tmp_pack_*` of a killed index-pack).
fn pack_temp_files(fx: &Fixture) -> Vec<String> {
    std::fs::read_dir(fx.work.join(".git/warmstart/cache.git/objects/pack"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("tmp_"))
                .collect()
        })
        .unwrap_or_default()
}

/// Processes still running on this test's behalf: git in this test's
/// cache.git, or anything talking to `port`.
fn leftovers(fx: &Fixture, port: u16) -> Vec<String> {
    let mine = fx.env.path().to_string_lossy().into_owned();
    let addr = format!("127.0.0.1:{port}");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
        let zombie = std::fs::read_to_string(e.path().join("stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        });
        if zombie || cmdline.contains("cargo") || cmdline.contains("nextest") {
            continue;
        }
        if (cmdline.contains(&mine) && cmdline.contains("warmstart/cache"))
            || cmdline.contains(&addr)
        {
            found.push(cmdline);
        }
    }
    found
}

/// `leftovers` after giving a stopped group a moment to be reaped.
fn assert_no_leftovers(fx: &Fixture, port: u16) {
    let until = Instant::now() + Duration::from_secs(3);
    loop {
        let left = leftovers(fx, port);
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < until, "processes left behind: {left:#?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A port where the kernel accepts connections that nobody ever answers
/// (they wait in the listen backlog).
struct Silent {
    listener: TcpListener,
}

impl Silent {
    fn new() -> Silent {
        Silent {
            listener: TcpListener::bind(("127.0.0.1", 0)).unwrap(),
        }
    }
    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }
}

/// A TCP relay to `upstream` that forwards the server's answer only until
/// `budget` bytes (over all connections) went through, then holds every
/// connection open and silent: a transfer that stalls mid-way.
struct Relay {
    port: u16,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Limits what the server sends (a fetch that stalls).
    fn start(upstream: u16, budget: i64) -> Relay {
        Relay::start_limiting(upstream, budget, false)
    }

    /// Limits what the client sends when `upload` (a push that stalls),
    /// else what the server sends.
    fn start_limiting(upstream: u16, budget: i64, upload: bool) -> Relay {
        let listener = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let left = Arc::new(AtomicI64::new(budget));
        let s = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !s.load(Ordering::SeqCst) {
                let Ok((client, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
                let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                held.push((client.try_clone().unwrap(), server.try_clone().unwrap()));
                let (up, down) = if upload {
                    (Some(left.clone()), None)
                } else {
                    (None, Some(left.clone()))
                };
                std::thread::spawn(move || pipe(c2, s2, up));
                std::thread::spawn(move || pipe(server, client, down));
            }
            drop(held);
        });
        Relay { port, stop }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to`; with a budget, stops copying (but keeps both
/// open) once it is spent.
fn pipe(mut from: TcpStream, mut to: TcpStream, budget: Option<Arc<AtomicI64>>) {
    let mut buf = [0u8; 4096];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let (n, spent) = match &budget {
            None => (n, false),
            Some(b) => {
                let before = b.fetch_sub(n as i64, Ordering::SeqCst).max(0) as usize;
                (n.min(before), before <= n)
            }
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        if spent {
            // Spent: hold the connection open, say nothing more.
            std::thread::sleep(Duration::from_secs(120));
            return;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}

fn json_of(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// The error line(s) of a failed run: exactly one.
fn one_line(r: &Run) -> String {
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected:\n{}", show(&r.out));
    lines[0].to_string()
}

const FAST: [&str; 4] = ["--connect-timeout", "2s", "--stall-timeout", "3s"];
/// For transfers that must connect (through a relay) before they stall:
/// room to connect on a loaded machine.
const STALL: [&str; 4] = ["--connect-timeout", "10s", "--stall-timeout", "3s"];

#[test]
fn silent_servers_end_at_the_connect_deadline_for_every_transport() {
    let fx = published("");
    let silent = Silent::new();
    let port = silent.port();
    for url in [
        format!("http://127.0.0.1:{port}/origin.git"),
        format!("git://127.0.0.1:{port}/origin.git"),
        format!("ssh://git@127.0.0.1:{port}/origin.git"),
    ] {
        for cmd in [
            &["cache", "restore", "art"][..],
            &["cache", "verify", "art"],
        ] {
            let mut args = cmd.to_vec();
            args.extend(["--remote", &url]);
            args.extend(FAST);
            let start = Instant::now();
            let r = fx.xtask(&args).expect_code(8);
            let took = start.elapsed();
            let line = one_line(&r);
            // Printed redacted, as git prints URLs: without any userinfo.
            let shown = url.replace("git@", "");
            assert!(
                line.contains(&format!("timed out connecting to {shown} after 2s"))
                    && line.contains("connect_timeout")
                    && line.contains("WARMSTART_CONNECT_TIMEOUT"),
                "{line}"
            );
            assert!(took < Duration::from_secs(20), "{url}: took {took:?}");
            assert_no_leftovers(&fx, port);
        }
    }
    // Publish fetches the branch first: bounded the same way.
    let url = format!("http://127.0.0.1:{port}/origin.git");
    let mut args = vec!["cache", "publish", "art", "--remote", &url];
    args.extend(FAST);
    let line = one_line(&fx.xtask(&args).expect_code(8));
    assert!(line.contains("timed out connecting to"), "{line}");
    // Status reports it per cache and goes on.
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    let mut args = vec!["cache", "status", "--json"];
    args.extend(FAST);
    let r = fx.xtask(&args);
    let text = r.stdout();
    assert!(
        text.contains("unreachable") && text.contains("timed out connecting to"),
        "{}",
        show(&r.out)
    );
    assert_no_leftovers(&fx, port);
    drop(silent);
}

#[test]
fn connect_deadline_precedence_is_flag_then_env_then_manifest() {
    let fx = published("\n[network]\nconnect_timeout = \"700ms\"\n");
    let silent = Silent::new();
    let url = format!("git://127.0.0.1:{}/origin.git", silent.port());
    let restore = |extra: &[&str], env: Option<&str>| {
        let mut args = vec!["cache", "restore", "art", "--remote", &url];
        args.extend(extra);
        let mut cmd = fx.command(&args);
        if let Some(v) = env {
            cmd.env("WARMSTART_CONNECT_TIMEOUT", v);
        }
        one_line(&run(&mut cmd).expect_code(8))
    };
    assert!(restore(&[], None).contains("after 700ms"));
    assert!(restore(&[], Some("900ms")).contains("after 900ms"));
    assert!(restore(&["--connect-timeout", "1100ms"], Some("900ms")).contains("after 1.1s"));
}

#[test]
fn network_settings_that_do_not_parse_are_exit_10_naming_them() {
    let fx = published("");
    let r = fx
        .xtask(&["cache", "restore", "art", "--connect-timeout", "soon"])
        .expect_code(10);
    assert!(one_line(&r).contains("--connect-timeout = \"soon\" is not a duration"));
    for args in [&["cache", "status"][..], &["cache", "list", "--offline"]] {
        // Even where nothing goes to the network: never a silent default.
        let mut cmd = fx.command(args);
        cmd.env("WARMSTART_STALL_TIMEOUT", "0s");
        let r = run(&mut cmd).expect_code(10);
        assert!(
            r.stderr().contains("WARMSTART_STALL_TIMEOUT"),
            "{}",
            show(&r.out)
        );
    }
    manifest(&fx, "1", "\n[network]\nstall_timeout = \"forever\"\n");
    let r = fx.xtask(&["cache", "restore", "art"]).expect_code(10);
    let line = one_line(&r);
    assert!(
        line.contains("art.toml") && line.contains("[network] stall_timeout"),
        "{line}"
    );
    manifest(&fx, "1", "\n[network]\nconnect = \"2s\"\n");
    let r = fx.xtask(&["cache", "restore", "art"]).expect_code(10);
    assert!(r.stderr().contains("connect"), "{}", show(&r.out));
    let r = fx
        .xtask(&["gates", "fetch", "--stall-timeout=-1"])
        .expect_code(10);
    assert!(r.stderr().contains("--stall-timeout"), "{}", show(&r.out));
}

/// A stalled transfer ends at the stall timeout with the bytes that had
/// arrived, leaves no partial file and no process, and the next run
/// fetches only the chunks the stalled one did not store.
fn stall_then_resume(fx: &Fixture, upstream: u16, scheme: &str) {
    // Enough for the branch fetch (with the small chunks, warmstart.json
    // and the file index: about 15 kB) and a few chunks, not for all ten.
    let relay = Relay::start(upstream, 80_000);
    let url = format!("{scheme}://127.0.0.1:{}/origin.git", relay.port);
    let mut args = vec!["cache", "restore", "art", "--json", "--remote", &url];
    args.extend(STALL);
    let start = Instant::now();
    let r = fx.xtask(&args).expect_code(8);
    let took = start.elapsed();
    let line = one_line(&r);
    assert!(
        line.contains("stalled: nothing moved for 3s")
            && line.contains("had arrived")
            && line.contains("WARMSTART_STALL_TIMEOUT"),
        "{line}"
    );
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert!(partial_files(fx).is_empty(), "{:?}", partial_files(fx));
    assert_no_leftovers(fx, relay.port);
    assert!(!fx.work.join("restored/art").exists());
    assert!(pack_temp_files(fx).is_empty(), "{:?}", pack_temp_files(fx));

    // Resumed straight from the server: only what is missing is fetched.
    let url = format!("{scheme}://127.0.0.1:{upstream}/origin.git");
    let j = json_of(
        &fx.xtask(&["cache", "restore", "art", "--json", "--remote", &url])
            .ok(),
    );
    assert_eq!(j["state"], "restored", "{j}");
    let fetched = j["chunks_fetched"].as_u64().unwrap();
    let reused = j["chunks_reused"].as_u64().unwrap();
    // The direct reader (over git:// too) stored each chunk as it arrived.
    assert!(
        fetched > 0 && fetched < 10 && reused > 0,
        "{scheme}: fetched {fetched} of 10 chunks: {j}"
    );
    let got = std::fs::read(fx.work.join("restored/art/noise.bin")).unwrap();
    assert_eq!(got, std::fs::read(fx.env.join("src/noise.bin")).unwrap());
}

#[test]
fn a_transfer_that_stalls_over_http_ends_and_resumes_from_stored_chunks() {
    let fx = published("");
    let http = HttpGit::start(fx.env.path());
    stall_then_resume(&fx, http.port, "http");
}

#[test]
fn a_transfer_that_stalls_over_git_daemon_ends_and_resumes() {
    let fx = published("");
    let daemon = GitDaemon::start(fx.env.path());
    stall_then_resume(&fx, daemon.port, "git");
}

#[test]
fn sigterm_during_a_stalled_restore_ends_its_children_and_removes_partial_chunks() {
    let fx = published("");
    let http = HttpGit::start(fx.env.path());
    let daemon = GitDaemon::start(fx.env.path());
    // Over HTTP and git:// the direct reader writes tmp-* chunk files
    // (the budgets stop each transfer mid-chunk).
    for (sig, scheme, upstream, budget) in [
        (libc::SIGTERM, "http", http.port, 40_000),
        (libc::SIGINT, "http", http.port, 40_000),
        (libc::SIGTERM, "git", daemon.port, 60_000),
    ] {
        let relay = Relay::start(upstream, budget);
        let url = format!("{scheme}://127.0.0.1:{}/origin.git", relay.port);
        let mut cmd = fx.command(&["cache", "restore", "art", "--remote", &url]);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        // Wait until a chunk is being written (the relay then holds it).
        let until = Instant::now() + Duration::from_secs(20);
        while partial_files(&fx).is_empty() && pack_temp_files(&fx).is_empty() {
            if let Some(status) = child.try_wait().unwrap() {
                let mut err = String::new();
                std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
                panic!(
                    "{scheme}: the restore ended ({status}) before a chunk transfer was seen: {err}"
                );
            }
            assert!(
                Instant::now() < until,
                "{scheme}: no chunk transfer started"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        // The watchdog notes git's partial pack at its next look (every
        // 100 ms); on a loaded machine give it time. The relay holds the
        // transfer meanwhile (the stall timeout is the default 30 s).
        std::thread::sleep(Duration::from_millis(1500));
        let (status, err) = signal_and_wait(&mut child, sig);
        assert_eq!(status.code(), Some(128 + sig), "{err}");
        assert!(err.contains("stopped its git processes"), "{err}");
        assert!(partial_files(&fx).is_empty(), "{:?}", partial_files(&fx));
        assert!(
            pack_temp_files(&fx).is_empty(),
            "{:?}",
            pack_temp_files(&fx)
        );
        assert_no_leftovers(&fx, relay.port);
    }
}

/// The watchdog takes a signal only where its disposition is still the
/// default: a restore started with SIGTERM ignored (a `nohup`ed or
/// supervised worker) runs on through a SIGTERM, until its stall deadline.
#[test]
fn an_ignored_sigterm_stays_ignored_by_the_network_watchdog() {
    use std::os::unix::process::CommandExt;
    let fx = published("");
    let http = HttpGit::start(fx.env.path());
    let relay = Relay::start(http.port, 40_000);
    let url = format!("http://127.0.0.1:{}/origin.git", relay.port);
    let mut args = vec!["cache", "restore", "art", "--remote", &url];
    args.extend(STALL);
    let mut cmd = fx.command(&args);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    // SAFETY: signal(2) is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGTERM, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    while partial_files(&fx).is_empty() && pack_temp_files(&fx).is_empty() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "ended before a transfer"
        );
        assert!(Instant::now() < until, "no chunk transfer started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, err) = signal_and_wait(&mut child, libc::SIGTERM);
    assert_eq!(
        status.code(),
        Some(8),
        "the ignored SIGTERM ended it: {err}"
    );
    assert!(err.contains("stalled: nothing moved for 3s"), "{err}");
    assert!(partial_files(&fx).is_empty(), "{:?}", partial_files(&fx));
}

/// Answers every request with `code` (and the header that goes with it).
fn refusing_server(code: u16) -> HttpServer {
    HttpServer::start(move |_, s| {
        let (reason, header) = match code {
            401 => ("Unauthorized", "WWW-Authenticate: Basic realm=\"git\"\r\n"),
            407 => (
                "Proxy Authentication Required",
                "Proxy-Authenticate: Basic realm=\"proxy\"\r\n",
            ),
            _ => ("Forbidden", ""),
        };
        let _ = write!(
            s,
            "HTTP/1.1 {code} {reason}\r\n{header}Content-Length: 0\r\nConnection: close\r\n\r\n"
        );
    })
}

#[test]
fn refused_credentials_are_exit_13_with_gits_cause() {
    let fx = published("");
    let (s401, s403, s407) = (
        refusing_server(401),
        refusing_server(403),
        refusing_server(407),
    );
    let (port401, port403, port407) = (s401.port, s403.port, s407.port);
    let cases = [
        // No credentials: git would prompt on a terminal; warmstart never lets it.
        (
            format!("http://127.0.0.1:{port401}/origin.git"),
            None,
            "terminal prompts disabled",
        ),
        (
            format!("http://user:wrong@127.0.0.1:{port401}/origin.git"),
            None,
            "Authentication failed for",
        ),
        (
            format!("http://127.0.0.1:{port403}/origin.git"),
            None,
            "The requested URL returned error: 403",
        ),
        (
            "http://127.0.0.1:9/origin.git".to_string(),
            Some(port407),
            "The requested URL returned error: 407",
        ),
    ];
    for (url, proxy, cause) in cases {
        let mut cmd = fx.command(&["cache", "restore", "art", "--remote", &url]);
        cmd.env_remove("GIT_TERMINAL_PROMPT")
            .env_remove("no_proxy")
            .env_remove("NO_PROXY");
        if let Some(p) = proxy {
            cmd.env("http_proxy", format!("http://127.0.0.1:{p}"));
        }
        let r = run(&mut cmd).expect_code(13);
        let line = one_line(&r);
        assert!(
            line.contains("authentication refused") && line.contains(cause),
            "{line}"
        );
        assert!(!line.contains("Please make sure"), "{line}");
    }
    // gates fetch is classified the same way.
    let url = format!("http://user:wrong@127.0.0.1:{port401}/origin.git");
    let mut cmd = fx.command(&["gates", "fetch", &url]);
    cmd.env_remove("GIT_TERMINAL_PROMPT");
    let r = run(&mut cmd);
    // gates fetch needs a commit: the work repo has one.
    assert_eq!(r.code(), 13, "{}", show(&r.out));
}

#[test]
fn a_push_refused_by_branch_protection_names_the_rule_and_the_setting() {
    let fx = published("");
    fx.env.git(
        "origin.git",
        ["config", "receive.denyNonFastForwards", "true"],
    );
    manifest(&fx, "2", "");
    let r = fx.xtask(&["cache", "publish", "art"]).expect_code(8);
    let line = one_line(&r);
    assert!(
        line.contains("refuses to replace refs/heads/art-cache")
            && line.contains("denying non-fast-forward")
            && line.contains("cache.branch"),
        "{line}"
    );
    // Nothing changed on the remote.
    let j = fx
        .env
        .git("origin.git", ["show", "art-cache:warmstart.json"]);
    assert!(j.contains("art-1") && !j.contains("art-2"), "{j}");
}

#[test]
fn the_direct_reader_says_why_it_was_skipped() {
    let fx = published("");
    let daemon = GitDaemon::start(fx.env.path());
    let url = daemon.url("origin.git");
    // A git setting that may change how git reaches the remote: git
    // fetch reaches it, and the restore says why.
    std::fs::create_dir_all(fx.env.home()).unwrap();
    std::fs::write(
        fx.env.home().join(".gitconfig-none"),
        "[protocol \"git\"]\n\tallow = always\n",
    )
    .unwrap();
    let j = json_of(
        &fx.xtask(&["cache", "restore", "art", "--json", "--remote", &url])
            .ok(),
    );
    let why = j["direct_fallback"].as_str().unwrap_or_default();
    assert!(why.contains("protocol.git.allow"), "{j}");
    assert!(Path::new(&fx.work.join("restored/art/noise.bin")).is_file());
}

/// `cargo xtask restore`: the freshness step's `[step.network]` table and a
/// cache manifest's `[network]` table, and `--connect-timeout` above both.
#[test]
fn machine_restore_bounds_freshness_and_cache_steps_by_their_tables_and_the_flag() {
    let fx = published("\n[network]\nconnect_timeout = \"1500ms\"\n");
    let silent = Silent::new();
    let url = format!("git://127.0.0.1:{}/origin.git", silent.port());
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    std::fs::write(
        fx.work.join("cache-manifests/restore.toml"),
        "[[step]]\nname = \"fresh\"\nkind = \"freshness\"\ntimeout = \"60s\"\ninterval = \"0s\"\n\n[step.network]\nconnect_timeout = \"1s\"\n\n[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\n",
    )
    .unwrap();
    let what = |v: &Value, step: &str| -> String {
        v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["step"] == step)
            .unwrap_or_else(|| panic!("no step {step}: {v}"))["what"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let r = fx.xtask(&["restore", "--json"]);
    let v: Value =
        serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)));
    assert!(
        what(&v, "fresh").contains("timed out connecting to origin after 1s"),
        "{v:#}"
    );
    assert!(what(&v, "art").contains("after 1.5s"), "{v:#}");
    let r = fx.xtask(&["restore", "--json", "--connect-timeout", "700ms"]);
    let v: Value =
        serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)));
    assert!(what(&v, "fresh").contains("after 700ms"), "{v:#}");
    assert!(what(&v, "art").contains("after 700ms"), "{v:#}");
    assert_no_leftovers(&fx, silent.port());
    // gates push and fetch are bounded the same way.
    let mut args = vec!["gates", "fetch", &url];
    args.extend(FAST);
    let line = one_line(&fx.xtask(&args).expect_code(8));
    assert!(
        line.contains("timed out connecting to") && line.contains("after 2s"),
        "{line}"
    );
}

/// The background worker continues a `restore --connect-timeout ...`: the
/// flag reaches it (as the environment, which still beats the manifest).
#[test]
fn the_background_worker_keeps_the_flags_deadline() {
    let fx = published("\n[network]\nconnect_timeout = \"20s\"\n");
    let silent = Silent::new();
    let url = format!("git://127.0.0.1:{}/origin.git", silent.port());
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    std::fs::write(
        fx.work.join("cache-manifests/restore.toml"),
        "[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\nbackground = true\n",
    )
    .unwrap();
    fx.xtask(&["restore", "--connect-timeout", "800ms"]).ok();
    let until = Instant::now() + Duration::from_secs(15);
    let what = loop {
        let r = fx.xtask(&["restore", "status", "--json"]).ok();
        let v: Value = serde_json::from_str(&r.stdout()).unwrap();
        let row = v["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["step"] == "art")
            .cloned()
            .unwrap_or_else(|| panic!("no step art: {v}"));
        if row["state"] != "background" && row["state"] != "running" {
            break row["what"].as_str().unwrap_or_default().to_string();
        }
        assert!(Instant::now() < until, "the worker did not finish: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        what.contains("timed out connecting to") && what.contains("after 800ms"),
        "{what}"
    );
    assert_no_leftovers(&fx, silent.port());
}

/// A push that stalls mid-pack (the relay stops forwarding what the client
/// sends) ends at the stall timeout with git's last progress, and leaves
/// the remote branch as it was.
#[test]
fn a_publish_whose_push_stalls_ends_and_changes_nothing() {
    let fx = published("");
    let daemon = GitDaemon::start(fx.env.path());
    // New bytes: the push has about 200 kB to send.
    write_pseudo_random(&fx.env.join("src/noise.bin"), NOISE, 8);
    manifest(&fx, "2", "");
    let relay = Relay::start_limiting(daemon.port, 30_000, true);
    let url = format!("git://127.0.0.1:{}/origin.git", relay.port);
    let mut args = vec!["cache", "publish", "art", "--remote", &url];
    args.extend(STALL);
    let start = Instant::now();
    let r = fx.xtask(&args).expect_code(8);
    let line = one_line(&r);
    assert!(
        line.contains("push of art-cache") && line.contains("stalled: nothing moved for 3s"),
        "{line}"
    );
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_no_leftovers(&fx, relay.port);
    let j = fx
        .env
        .git("origin.git", ["show", "art-cache:warmstart.json"]);
    assert!(j.contains("art-1") && !j.contains("art-2"), "{j}");
}
