//! A publish under a new key compresses only the chunks no key on the
//! branch holds: the others' frames come from cache.git (the publisher's
//! own clone made them), or, in a fresh clone at a slow level, are fetched
//! by id first; `chunks_reused` counts exactly the chunks not compressed,
//! and the push sends only the new blobs.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use serde_json::Value;
use std::collections::HashSet;
use std::path::PathBuf;

/// Cache `art`: 1.6 MB of noise in files of 40 kB, cut into chunks of
/// about 64 kB at zstd level 19 (a slow level, so a fresh clone fetches the
/// previous frames); blobs of 30 kB or more (the chunks, not
/// warmstart.json) are left out of branch fetches.
fn art_cache() -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", "30k");
    for i in 0..40 {
        write_pseudo_random(&src(&fx).join(format!("f{i:02}.bin")), 40_000, i + 1);
    }
    manifest(&fx, "work", "1");
    fx
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn manifest(fx: &Fixture, repo: &str, literal: &str) {
    Manifest::literal(literal, src(fx))
        .publish("level = 19\nchunk_avg = \"64KiB\"")
        .write(&fx.env.join(repo), "art");
}

fn shas(published: &Value) -> Vec<String> {
    published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect()
}

/// Chunks of `now` that `before` lists, and the bytes of the others.
fn shared(before: &[String], now: &Value) -> (u64, u64) {
    let had: HashSet<&String> = before.iter().collect();
    let mut n = 0;
    let mut new_bytes = 0;
    for c in now["chunks"].as_array().unwrap() {
        if had.contains(&c["sha256"].as_str().unwrap().to_string()) {
            n += 1;
        } else {
            new_bytes += c["size"].as_u64().unwrap();
        }
    }
    (n, new_bytes)
}

/// The push sent no chunk blob but the new ones: at most their bytes and
/// those of the branch's small files (warmstart.json, the indexes, ...).
fn assert_only_new_blobs_pushed(fx: &Fixture, published: &Value, new_chunk_bytes: u64) {
    let tree = fx.origin_git(&["ls-tree", "-l", "refs/heads/art-cache"]);
    let small: u64 = tree
        .lines()
        .filter(|l| !l.contains(".tar.zst.part"))
        .map(|l| l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap())
        .sum();
    let sent = published["push"]["new_bytes"].as_u64().unwrap();
    assert!(
        sent <= new_chunk_bytes + small,
        "pushed {sent} bytes of blobs: new chunks {new_chunk_bytes}, small files {small}"
    );
}

/// Rewrites the first file (the start of the tar), a 1/40 change.
fn change(fx: &Fixture, seed: u64) {
    write_pseudo_random(&src(fx).join("f00.bin"), 40_000, 100 + seed);
}

#[test]
fn publish_reuse_a_new_key_compresses_only_the_chunks_no_key_on_the_branch_holds() {
    let fx = art_cache();
    let one = fx.publish("art");
    assert_eq!(one["chunks_reused"], 0, "{one}");
    let before = shas(&one);
    assert!(before.len() >= 15, "{}", before.len());

    // The publisher's own clone: the frames are in its cache.git.
    change(&fx, 1);
    manifest(&fx, "work", "2");
    let two = fx.publish("art");
    assert_eq!(two["key"], "art-2", "{two}");
    let (same, new_bytes) = shared(&before, &two);
    assert!(same >= 10, "{same} of {} chunks shared", before.len());
    assert_eq!(two["chunks_reused"].as_u64(), Some(same), "{two}");
    assert_eq!(two["frames_fetched"], 0, "{two}");
    let marked = two["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["reused"] == true)
        .count();
    assert_eq!(marked as u64, same, "{two}");
    assert_only_new_blobs_pushed(&fx, &two, new_bytes);

    // A fresh clone, which has no frame in its cache.git: it fetches the
    // previous key's frames by id, compresses only the rest, and pushes
    // only the new blobs.
    let fresh = fx.clone_repo("fresh");
    manifest(&fx, "fresh", "3");
    change(&fx, 2);
    let three = fx.json_in(&fresh, &["cache", "publish", "art", "--json"]);
    assert_eq!(three["key"], "art-3", "{three}");
    let (same, new_bytes) = shared(&shas(&two), &three);
    assert!(same >= 10, "{same} chunks shared with art-2");
    assert_eq!(three["chunks_reused"].as_u64(), Some(same), "{three}");
    assert!(three["frames_fetched"].as_u64().unwrap() > 0, "{three}");
    assert_only_new_blobs_pushed(&fx, &three, new_bytes);
}
