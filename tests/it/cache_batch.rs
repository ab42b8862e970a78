//! Many small chunks cost one request per batch, not one per chunk, over
//! every transport: git daemon, smart HTTP and ssh (through the direct
//! reader's multi-want protocol v2 request). Each test counts, on the server's side, the
//! requests a cold restore of about a hundred chunks made.

use crate::transports::{Fx, json_of};
use crate::util::git_daemon::GitDaemon;
use crate::util::http_backend::HttpGit;
use crate::util::servers::Sshd;
use crate::util::tree::assert_same_tree;
use std::sync::atomic::Ordering;

/// 740 kB of noise in chunks of at most 10 kB: about a hundred chunks,
/// two batches, each chunk left out of the branch fetch (blobs of 2 KiB
/// or more are).
fn fixture() -> Fx {
    let mut fx = Fx::with(740_000, 10_000);
    fx.var("WARMSTART_FETCH_BLOB_LIMIT", "2k");
    fx
}

/// Chunks of 2 KiB or more: the ones a restore fetches by id.
fn big_chunks(published: &serde_json::Value) -> u64 {
    published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() >= 2048)
        .count() as u64
}

/// `ceil(chunks / 64)`: the batches a restore asks for.
fn batches(chunks: u64) -> u64 {
    chunks.div_ceil(64)
}

/// Publishes through `url`, forgets, restores cold; the restore's JSON.
fn publish_and_restore(fx: &Fx, url: &str, between: &dyn Fn()) -> (u64, serde_json::Value) {
    fx.set_remote(url);
    let published = json_of(&fx.xtask(&["cache", "publish", "art", "--json"]).ok());
    let big = big_chunks(&published);
    assert!(big >= 70, "{published}");
    fx.forget();
    between();
    let j = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    assert_eq!(j["chunks_reused"], 0, "{j}");
    assert_same_tree(&fx.src, &fx.target);
    (big, j)
}

#[test]
fn cache_batch_over_git_daemon_reads_each_batch_in_one_request() {
    let fx = fixture();
    // Every pack the server makes is logged by the hook, one line each.
    let log = fx.env.join("packs.log");
    let hook = fx.env.join("pack-hook");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\necho pack >> {}\nexec \"$@\"\n", log.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let global = fx.env.join("daemon-gitconfig");
    std::fs::write(
        &global,
        format!("[uploadpack]\n\tpackObjectsHook = {}\n", hook.display()),
    )
    .unwrap();
    // Its `git upload-pack`s read `global`, where git reads
    // `uploadpack.packObjectsHook` only.
    let daemon = GitDaemon::start_with(
        fx.env.path(),
        &[
            ("GIT_CONFIG_GLOBAL", global.as_os_str()),
            ("HOME", fx.env.home().as_os_str()),
        ],
    );
    let url = format!("git://127.0.0.1:{}/origin.git", daemon.port);
    let packs = || {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .count() as u64
    };
    let before = std::cell::Cell::new(0);
    let (big, j) = publish_and_restore(&fx, &url, &|| before.set(packs()));
    // Read straight from the daemon's stream, as over HTTP and ssh.
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert_eq!(j["direct_fallback"], serde_json::Value::Null, "{j}");
    // The branch fetch, the fetch of its warmstart.json (a hundred chunks make
    // it pass the 2 KiB blob limit), then one pack per batch of chunks.
    assert_eq!(packs() - before.get(), 2 + batches(big), "{j}");
}

#[test]
fn cache_batch_over_smart_http_reads_each_batch_in_one_request() {
    let fx = fixture();
    let server = HttpGit::start(&fx.env.join("."));
    let before = std::cell::Cell::new(0);
    let (big, j) = publish_and_restore(&fx, &server.url("origin.git"), &|| {
        before.set(server.requests.load(Ordering::SeqCst))
    });
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert!(j["direct_fallback"].is_null(), "{j}");
    // The branch fetch and the fetch of its warmstart.json (advertisement,
    // request), then an advertisement and one request per batch.
    let served = (server.requests.load(Ordering::SeqCst) - before.get()) as u64;
    assert!(
        (2 * batches(big)..=5 + 2 * batches(big)).contains(&served),
        "{served} requests for {big} chunks"
    );
}

#[test]
fn cache_batch_over_ssh_reads_each_batch_in_one_login() {
    let mut fx = fixture();
    let server = Sshd::start();
    fx.var("GIT_SSH_COMMAND", &server.ssh_command(&server.key));
    let logins = || {
        server
            .log()
            .lines()
            .filter(|l| l.contains("Accepted publickey for root"))
            .count() as u64
    };
    let before = std::cell::Cell::new(0);
    let url = server.url(&fx.env.join("origin.git"));
    let (big, j) = publish_and_restore(&fx, &url, &|| before.set(logins()));
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert!(j["direct_fallback"].is_null(), "{j}");
    // One login for the branch fetch, one for its warmstart.json (past the
    // 2 KiB blob limit), one per batch.
    assert_eq!(logins() - before.get(), 2 + batches(big), "{j}");
}
