//! A key whose every chunk is its own zstd frame (`frames` in
//! `warmstart.json`) restores through the parallel decoders, and a damaged
//! middle chunk is refused before any decoder sees it, leaving the install
//! as it was. The framed branch is made here by hand, as a publisher with
//! frames writes one: the tar of a published key cut into slices, each
//! compressed on its own by the zstd CLI.

use crate::util::fixture::{Fixture, Manifest, json_of};
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{run, show};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Cache `art` of a tricky tree and 200 kB of noise in 30 kB chunks, key
/// `art-1`, restored into `restored/art`; `origin.git` by path.
fn art_cache() -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", "8k");
    let src = src(&fx);
    make_tricky_tree(&src, false);
    write_pseudo_random(&src.join("noise.bin"), 200_000, 3);
    manifest(&fx, "1");
    fx
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn manifest(fx: &Fixture, literal: &str) {
    fx.write_manifest(
        "art",
        &Manifest::literal(literal, src(fx)).chunk_bytes(30000),
    );
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `zstd -3` of `input`, by the CLI, one frame with its checksum.
fn zstd_frame(input: &[u8]) -> Vec<u8> {
    let mut child = Command::new("zstd")
        .args(["-q", "-3", "-c", "--check"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("zstd (tools/test.sh installs it)");
    let mut stdin = child.stdin.take().unwrap();
    let data = input.to_vec();
    let w = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &data));
    let out = child.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    assert!(out.status.success());
    out.stdout
}

/// Rewrites key `key` of the remote branch as independent frames of
/// `slice` tar bytes each, with `damage(i, chunk)` applied to the chunk
/// files after their digests were taken; returns the chunks' digests.
fn reframe(fx: &Fixture, key: &str, slice: usize, damage: &dyn Fn(usize, &mut Vec<u8>)) -> usize {
    let dir = fx.env.join("reframe");
    let _ = std::fs::remove_dir_all(&dir);
    fx.env.git(
        ".",
        [
            "clone",
            "-q",
            "-b",
            "art-cache",
            fx.env.join("origin.git").to_str().unwrap(),
            "reframe",
        ],
    );
    let mut m: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("warmstart.json")).unwrap())
            .unwrap();
    let entry = &mut m["keys"][key];
    // The tar, from the published chunks.
    let mut z = Vec::new();
    for c in entry["chunks"].as_array().unwrap() {
        let f = dir.join(c["file"].as_str().unwrap());
        z.extend(std::fs::read(&f).unwrap());
        std::fs::remove_file(f).unwrap();
    }
    let tar = zstd::decode_all(&z[..]).unwrap();
    assert_eq!(sha(&tar), entry["tar_sha256"].as_str().unwrap());
    let slices: Vec<&[u8]> = tar.chunks(slice).collect();
    let mut chunks = Vec::new();
    let mut sums = String::new();
    for (i, raw) in slices.iter().enumerate() {
        let file = format!("{key}.tar.zst.part{i:03}");
        let mut frame = zstd_frame(raw);
        chunks.push(json!({
            "file": file, "size": frame.len(), "sha256": sha(&frame),
            "raw_size": raw.len(), "raw_sha256": sha(raw),
        }));
        sums.push_str(&format!("{}  {file}\n", sha(&frame)));
        damage(i, &mut frame);
        std::fs::write(dir.join(&file), frame).unwrap();
    }
    entry["chunks"] = Value::Array(chunks);
    entry["frames"] = json!({
        "chunker": "fastcdc-2020", "min_size": slice / 4, "avg_size": slice,
        "max_size": slice * 4, "zstd": "1.5.4", "level": 3, "checksum": true,
    });
    std::fs::write(dir.join("warmstart.json"), format!("{m:#}\n")).unwrap();
    // SHA256SUMS lists every chunk of every key on the branch, sorted.
    let mut lines: Vec<String> = std::fs::read_to_string(dir.join("SHA256SUMS"))
        .unwrap()
        .lines()
        .filter(|l| !l.contains(&format!("  {key}.tar.zst.")))
        .map(str::to_string)
        .chain(sums.lines().map(str::to_string))
        .collect();
    lines.sort_by(|a, b| {
        a.split_once("  ")
            .unwrap()
            .1
            .cmp(b.split_once("  ").unwrap().1)
    });
    std::fs::write(dir.join("SHA256SUMS"), lines.join("\n") + "\n").unwrap();
    fx.env.git("reframe", ["add", "-A"]);
    let tree = fx.env.git("reframe", ["write-tree"]);
    let commit = fx.env.git(
        "reframe",
        ["commit-tree", tree.trim(), "-m", "framed by hand"],
    );
    fx.env.git(
        "reframe",
        [
            "push",
            "-q",
            "-f",
            "origin",
            &format!("{}:refs/heads/art-cache", commit.trim()),
        ],
    );
    slices.len()
}

fn cache_git_bytes(work: &Path) -> u64 {
    let dir = work.join(".git/warmstart/cache.git/chunks");
    std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.metadata().unwrap().len()).sum())
        .unwrap_or(0)
}

#[test]
fn cache_frames_a_framed_key_restores_through_the_parallel_decoders() {
    let fx = art_cache();
    fx.xtask(&["cache", "publish", "art"]).ok();
    let n = reframe(&fx, "art-1", 20_000, &|_, _| {});
    assert!(n >= 10, "{n} chunks");
    std::fs::remove_dir_all(fx.work.join(".git/warmstart")).unwrap();
    let j = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    // The framed path reads and hashes each chunk once (the one-stream
    // path hashes each twice: once to check it, once on its way to zstd).
    assert_eq!(j["bytes_hashed"], j["compressed_bytes"], "{j}");
    assert!(cache_git_bytes(&fx.work) > 0);
    // `cache verify` takes the same path and hashes the tar too.
    let v = json_of(&fx.xtask(&["cache", "verify", "art", "--json"]).ok());
    assert_eq!(v["keys"][0]["ok"], true, "{v}");
}

#[test]
fn cache_frames_a_damaged_middle_chunk_is_refused_and_the_install_stays() {
    let fx = art_cache();
    fx.xtask(&["cache", "publish", "art"]).ok();
    fx.xtask(&["cache", "restore", "art"]).ok();
    // Key 2, framed by hand, with one byte of its middle chunk flipped.
    write_pseudo_random(&src(&fx).join("zz-more.bin"), 50_000, 4);
    manifest(&fx, "2");
    fx.xtask(&["cache", "publish", "art"]).ok();
    std::fs::remove_file(src(&fx).join("zz-more.bin")).unwrap();
    let n = reframe(&fx, "art-2", 20_000, &|i, c| {
        if i == 6 {
            let mid = c.len() / 2;
            c[mid] ^= 0x10;
        }
    });
    assert!(n >= 12, "{n} chunks");
    // With the default blob limit every chunk comes with the branch fetch
    // into cache.git, unchecked: the framed reader is what refuses it.
    // Without the install's record there is no delta install, which would
    // not read a chunk that holds only unchanged files.
    std::fs::remove_dir_all(fx.work.join(".git/warmstart/cache/installed")).unwrap();
    let mut cmd = fx.env.xtask_in("work");
    cmd.args(["cache", "restore", "art"]);
    let r = run(&mut cmd).expect_code(6);
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("art-2.tar.zst.part006") && err.contains("has sha256"),
        "{err}"
    );
    // Key 1 is still installed, whole, and its stamp still says so.
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    manifest(&fx, "1");
    let r = fx.xtask(&["cache", "restore", "art"]).ok();
    assert!(r.stdout().contains("warm"), "{}", show(&r.out));
}
