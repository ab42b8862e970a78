//! A server without `uploadpack.allowFilter` (self-hosted git's default)
//! ignores `--filter` and sends every chunk. `cache list`/`status` must
//! never download one there: they ask first (the capability advertisement)
//! and read the branch only from a copy a restore already fetched, else say
//! why they did not. A restore there keeps one copy of the chunks, not two.
//! Real `git daemon` on 127.0.0.1; bytes on disk are the measure.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::show;
use crate::util::tree::write_pseudo_random;
use serde_json::Value;
use std::path::Path;

/// Random, so zstd keeps it at its size: 12 chunks of 50 kB.
const ARTIFACT: u64 = 600_000;

/// `srv/origin.git` served by git daemon, `uploadpack.allowFilter` set to
/// `allow_filter`, and cache `art` of `ARTIFACT` random bytes in 50 kB
/// chunks on `refs/warmstart/cache/art`.
fn art_cache(allow_filter: bool) -> Fixture {
    let fx = Fixture::served().with_var("WARMSTART_FETCH_BLOB_LIMIT", "8k");
    fx.origin_git(&[
        "config",
        "uploadpack.allowFilter",
        &allow_filter.to_string(),
    ]);
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), ARTIFACT, 9);
    manifest(&fx, "1");
    fx
}

fn manifest(fx: &Fixture, literal: &str) {
    let m = Manifest::literal(literal, fx.env.join("src"))
        .cache("ref = \"refs/warmstart/cache/art\"")
        .chunk_bytes(50000);
    fx.write_manifest("art", &m);
}

fn bytes(fx: &Fixture, rel: &str) -> u64 {
    let p = fx.work.join(".git/warmstart").join(rel);
    if p.exists() { du(&p) } else { 0 }
}

/// The remote part of `cache status --json` for `art`.
fn branch_status(fx: &Fixture) -> Value {
    let s = fx.json(&["cache", "status", "art", "--json"]);
    let all = s["caches"].as_array().cloned().unwrap_or_default();
    all.into_iter()
        .find(|c| c["name"] == "art")
        .unwrap_or_else(|| panic!("no art in {s}"))["remote_state"]
        .clone()
}

fn du(p: &Path) -> u64 {
    let m = std::fs::symlink_metadata(p).unwrap();
    if m.is_dir() {
        std::fs::read_dir(p)
            .unwrap()
            .map(|e| du(&e.unwrap().path()))
            .sum()
    } else {
        m.len()
    }
}

#[test]
fn cache_nofilter_status_and_list_download_no_chunk_and_say_why() {
    let fx = art_cache(false);
    fx.json(&["cache", "publish", "art", "--json"]);
    fx.forget();
    let b = branch_status(&fx);
    assert_eq!(b["state"], "unread", "{b}");
    let why = b["error"].as_str().unwrap();
    assert!(why.contains("uploadpack.allowFilter"), "{why}");
    assert!(why.contains("cache restore art"), "{why}");
    assert_eq!(b["commit"].as_str().unwrap().len(), 40, "{b}");
    let r = fx.xtask(&["cache", "list"]).ok();
    assert!(r.stdout().contains("unread"), "{}", show(&r.out));
    fx.xtask(&["cache", "status"]).ok();
    // Not one chunk: the metadata store holds at most its empty skeleton.
    let meta = bytes(&fx, "cache-meta.git/objects");
    assert!(meta < ARTIFACT / 20, "cache-meta.git received {meta} bytes");
    assert_eq!(bytes(&fx, "cache.git"), 0, "status never creates cache.git");

    // A restore fetches the chunks once, into cache.git, and keeps no
    // second copy in its chunk store or in cache-meta.git.
    let j = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "present", "{j}");
    let objects = bytes(&fx, "cache.git/objects");
    assert!(
        (ARTIFACT..ARTIFACT * 13 / 10).contains(&objects),
        "cache.git holds {objects}"
    );
    assert!(
        bytes(&fx, "cache.git/chunks") < 1000,
        "a second copy in the chunk store"
    );

    // Now status reads that copy: full details, still nothing downloaded.
    let b = branch_status(&fx);
    assert_eq!(b["state"], "has key", "{b}");
    assert_eq!(b["keys"].as_array().unwrap().len(), 1, "{b}");
    let meta = bytes(&fx, "cache-meta.git/objects");
    assert!(meta < ARTIFACT / 20, "cache-meta.git received {meta} bytes");

    // Another publish moves the ref: not read again, and said so.
    manifest(&fx, "2");
    fx.json(&["cache", "publish", "art", "--json"]);
    std::fs::remove_dir_all(fx.work.join(".git/warmstart/cache.git")).unwrap();
    let b = branch_status(&fx);
    assert_eq!(b["state"], "unread", "{b}");
    assert!(bytes(&fx, "cache-meta.git/objects") < ARTIFACT / 20);
}

#[test]
fn cache_nofilter_a_filtering_server_is_read_in_full_without_chunks() {
    let fx = art_cache(true);
    fx.json(&["cache", "publish", "art", "--json"]);
    fx.forget();
    let b = branch_status(&fx);
    assert_eq!(b["state"], "has key", "{b}");
    let meta = bytes(&fx, "cache-meta.git/objects");
    assert!(meta < ARTIFACT / 20, "cache-meta.git received {meta} bytes");
    // A remote that cannot be reached is still "unreachable", exit 8.
    fx.env.git(
        "work",
        [
            "remote",
            "set-url",
            "origin",
            "git://127.0.0.1:1/origin.git",
        ],
    );
    let r = fx.xtask(&["cache", "status", "art"]).expect_code(8);
    assert!(r.stdout().contains("unreachable"), "{}", show(&r.out));
}
