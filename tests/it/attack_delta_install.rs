//! Attacks on what a later, honest publish or install takes from a key a
//! pusher wrote: a lying file index (the delta install), and swapped chunk
//! blobs or frames (the chunks a refresh reuses).

use crate::util::fixture::{Fixture, Manifest, Serve};
use crate::util::{TestEnv, show};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fs;
use std::io::Read;
use std::path::PathBuf;

/// The delta cache `dt`: key `dt-<v>` pinned in `pins.txt`, packing `../art`
/// in 8 KiB average chunks, installed at `installed/dt`.
fn delta_cache() -> Fixture {
    let fx = Fixture::serve(Serve::RelativePath);
    Manifest::pinned("pins.txt", "../art")
        .cache("description = \"delta\"")
        .publish("chunk_avg = \"8KiB\"")
        .restore_path(target(&fx))
        .write(&fx.work, "dt");
    fx
}

fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed/dt")
}

fn pin(fx: &Fixture, v: &str) {
    fx.write("pins.txt", &format!("v={v}\n"));
}

/// Publishes `dt-<v>`: forty files, `d/f00` says `first`.
fn publish(fx: &Fixture, v: &str, first: &str) -> crate::util::Run {
    pin(fx, v);
    let art = fx.env.join("art");
    let _ = fs::remove_dir_all(&art);
    fs::create_dir_all(art.join("d")).unwrap();
    for i in 0..40 {
        let tag = if i == 0 { first } else { "base" };
        fs::write(
            art.join(format!("d/f{i:02}")),
            format!("{i} {tag}\n").repeat(200),
        )
        .unwrap();
    }
    // Written after d/f00, so that its ctime is well before the
    // install's end (as any file is, an hour later).
    fs::create_dir_all(art.join("e")).unwrap();
    for i in 0..3000 {
        fs::write(art.join(format!("e/g{i:04}")), format!("{i}\n")).unwrap();
    }
    fx.xtask(&["cache", "publish", "dt", "--json"]).ok()
}

fn restore(fx: &Fixture, v: &str) -> Value {
    pin(fx, v);
    fx.restore("dt")
}

fn zstd_decode(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    zstd::stream::read::Decoder::new(bytes)
        .unwrap()
        .read_to_end(&mut out)
        .unwrap();
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A pusher (no signature asked for yet) publishes a key whose tar holds
/// one file but whose index claims that file has the content an honest
/// later key will have. The honest key's delta install then links the
/// pusher's file into its tree: the tree is not the honest key's tar,
/// and stays so for every later key where the file does not change.
#[test]
fn a_lying_index_of_the_installed_key_never_keeps_its_file_in_a_later_key() {
    let fx = delta_cache();
    let evil = "0 evil\n".repeat(200);
    let good = "0 base\n".repeat(200);
    publish(&fx, "1", "evil");
    // The pusher rewrites dt-1's index: d/f00's digest becomes the good one.
    let env = &fx.env;
    let refs = env.git("origin.git", ["for-each-ref", "--format=%(refname)"]);
    let cache_ref = refs
        .lines()
        .find(|r| r.contains("dt") && !r.contains("tmp"))
        .unwrap_or_else(|| panic!("no cache ref in {refs}"))
        .to_string();
    env.git(".", ["clone", "-q", "--no-checkout", "origin.git", "evil"]);
    env.git(
        "evil",
        ["fetch", "-q", "origin", &format!("{cache_ref}:refs/x")],
    );
    env.git("evil", ["checkout", "-q", "refs/x"]);
    // The index in parts, rewritten whole (the shape before parts).
    let idx_path = env.join("evil/dt-1.files.zst");
    let mut parts: Vec<std::path::PathBuf> = fs::read_dir(env.join("evil"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains("dt-1.files.zst.part"))
        .collect();
    parts.sort();
    let whole: Vec<u8> = parts.iter().flat_map(|p| fs::read(p).unwrap()).collect();
    parts.iter().for_each(|p| fs::remove_file(p).unwrap());
    let text = String::from_utf8(zstd_decode(&whole)).unwrap();
    let (evil_hex, good_hex) = (
        hex(&Sha256::digest(evil.as_bytes())),
        hex(&Sha256::digest(good.as_bytes())),
    );
    assert!(text.contains(&evil_hex), "{text}");
    let lie = zstd::stream::encode_all(text.replace(&evil_hex, &good_hex).as_bytes(), 3).unwrap();
    fs::write(&idx_path, &lie).unwrap();
    let wj = env.join("evil/warmstart.json");
    let mut j: Value = serde_json::from_str(&fs::read_to_string(&wj).unwrap()).unwrap();
    j["keys"]["dt-1"]
        .as_object_mut()
        .unwrap()
        .remove("index_parts");
    let index = &mut j["keys"]["dt-1"]["index"];
    index["size"] = lie.len().into();
    index["sha256"] = hex(&Sha256::digest(&lie)).into();
    fs::write(&wj, serde_json::to_string_pretty(&j).unwrap()).unwrap();
    // A cache branch is one parentless commit: the pusher replaces it.
    pusher_push(env, &cache_ref);

    let j = restore(&fx, "1");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(fs::read_to_string(target(&fx).join("d/f00")).unwrap(), evil);
    // The honest publisher's key: d/f00 is the good content.
    publish(&fx, "2", "base");
    let j = restore(&fx, "2");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(
        fs::read_to_string(target(&fx).join("d/f00")).unwrap(),
        good,
        "the delta kept the pusher's file in dt-2's tree: {j}"
    );
    // Still a delta: every other file was hashed once, then linked (the
    // full install found the index lying, so its record vouches for none).
    assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    assert_eq!(j["files_linked"], 3039, "{j}");
    assert!(j["files_hashed"].as_u64().unwrap() >= 3039, "{j}");
}

/// The cache branch as a pusher sees it: a clone checked out at it.
fn pusher_checkout(env: &TestEnv) -> String {
    let refs = env.git("origin.git", ["for-each-ref", "--format=%(refname)"]);
    let cache_ref = refs
        .lines()
        .find(|r| r.contains("dt") && !r.contains("tmp"))
        .unwrap_or_else(|| panic!("no cache ref in {refs}"))
        .to_string();
    let _ = fs::remove_dir_all(env.join("evil"));
    env.git(".", ["clone", "-q", "--no-checkout", "origin.git", "evil"]);
    env.git(
        "evil",
        ["fetch", "-q", "origin", &format!("+{cache_ref}:refs/x")],
    );
    env.git("evil", ["checkout", "-q", "refs/x"]);
    cache_ref
}

/// Replaces the cache branch with the checkout, as one parentless commit.
fn pusher_push(env: &TestEnv, cache_ref: &str) {
    env.git("evil", ["add", "-A"]);
    let tree = env.git("evil", ["write-tree"]);
    let msg = env.git("evil", ["log", "-1", "--format=%B"]);
    let commit = env.git(
        "evil",
        [
            "-c",
            "user.name=p",
            "-c",
            "user.email=p@x",
            "commit-tree",
            tree.trim(),
            "-m",
            msg.trim(),
        ],
    );
    let spec = format!("+{}:{cache_ref}", commit.trim());
    env.git("evil", ["push", "-q", "origin", &spec]);
}

/// zstd's own CLI, as the coreutils restore line runs it.
fn zstd_cli(args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut child = std::process::Command::new("zstd")
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("running zstd (tools/test.sh installs it)");
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    out
}

/// The pusher re-frames every chunk of `dt-1` with `zstd ARGS` (the same
/// raw bytes, other frames), rewrites their sizes and digests in
/// warmstart.json and SHA256SUMS so the branch agrees with itself, and
/// pushes. `check` sees each new frame.
fn swap_frames(env: &TestEnv, args: &[&str], check: &dyn Fn(&[u8])) {
    let cache_ref = pusher_checkout(env);
    let wj = env.join("evil/warmstart.json");
    let mut j: Value = serde_json::from_str(&fs::read_to_string(&wj).unwrap()).unwrap();
    let chunks = j["keys"]["dt-1"]["chunks"].as_array_mut().unwrap();
    let mut swaps = Vec::new();
    for c in chunks.iter_mut() {
        let path = env.join("evil").join(c["file"].as_str().unwrap());
        let raw = zstd_decode(&fs::read(&path).unwrap());
        let big = zstd_cli(args, &raw);
        assert!(big.status.success(), "{}", show(&big));
        check(&big.stdout);
        fs::write(&path, &big.stdout).unwrap();
        c["size"] = big.stdout.len().into();
        let new = hex(&Sha256::digest(&big.stdout));
        swaps.push((c["sha256"].as_str().unwrap().to_string(), new.clone()));
        c["sha256"] = new.into();
    }
    fs::write(&wj, serde_json::to_string_pretty(&j).unwrap()).unwrap();
    // Every other list of chunk digests (SHA256SUMS) says the same.
    for e in fs::read_dir(env.join("evil")).unwrap() {
        let path = e.unwrap().path();
        let Ok(mut text) = fs::read_to_string(&path) else {
            continue;
        };
        for (old, new) in &swaps {
            text = text.replace(old.as_str(), new);
        }
        fs::write(&path, text).unwrap();
    }
    pusher_push(env, &cache_ref);
}

/// The chunks of `dt-1` on the branch now: (file, bytes).
fn branch_chunks(env: &TestEnv) -> Vec<(String, Vec<u8>)> {
    pusher_checkout(env);
    let j: Value =
        serde_json::from_str(&fs::read_to_string(env.join("evil/warmstart.json")).unwrap())
            .unwrap();
    j["keys"]["dt-1"]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let file = c["file"].as_str().unwrap().to_string();
            let bytes = fs::read(env.join("evil").join(&file)).unwrap();
            (file, bytes)
        })
        .collect()
}

/// A pusher swaps a key's chunks for frames of the same raw bytes that ask
/// for a 2 GiB window (`zstd --long=31` from a pipe). The next honest
/// publish reuses frames by their raw sha256 and, once it checked they
/// decode to those bytes, puts them in its own key, which CI signs: then
/// `zstd -d` (the coreutils restore line) and every streaming decoder with
/// zstd's default memory limit refuse that key.
#[test]
fn a_reused_frame_always_decodes_within_zstds_default_window() {
    let fx = delta_cache();
    let env = &fx.env;
    publish(&fx, "1", "base");
    swap_frames(env, &["-q", "-c", "--long=31"], &|big| {
        assert!(!zstd_cli(&["-d", "-q", "-c"], big).status.success());
    });

    // CI restores the cache it refreshes (so cache.git holds its chunks),
    // then publishes the key again, one file changed.
    let r = restore(&fx, "1");
    assert_eq!(r["state"], "restored", "{r}");
    publish(&fx, "1", "next");
    for (file, bytes) in branch_chunks(env) {
        let d = zstd_cli(&["-d", "-q", "-c"], &bytes);
        assert!(
            d.status.success(),
            "{file} of the new dt-1 needs more than zstd's default window: {}",
            show(&d)
        );
    }
}

/// A pusher re-frames a key's chunks without zstd's content checksum
/// (`zstd --no-check`): the frames decode to the right bytes, but the
/// statement of the key CI signs next says every frame carries one. The
/// honest refresh compresses those chunks again instead of reusing them.
#[test]
fn a_frame_without_a_checksum_is_never_reused_into_an_honest_key() {
    let fx = delta_cache();
    let env = &fx.env;
    publish(&fx, "1", "base");
    swap_frames(env, &["-q", "-c", "--no-check"], &|f| {
        assert_eq!(f[4] & 0x04, 0, "zstd --no-check made a checksum");
    });
    let r = restore(&fx, "1");
    assert_eq!(r["state"], "restored", "{r}");
    let refresh = publish(&fx, "1", "next");
    assert!(
        refresh.stderr().contains("compressing it again"),
        "no warning named the refused frames: {}",
        refresh.stderr()
    );
    for (file, bytes) in branch_chunks(env) {
        assert_ne!(bytes[4] & 0x04, 0, "{file}: the pusher's frame was reused");
    }
    fx.forget();
    let r = restore(&fx, "1");
    assert_eq!(r["state"], "restored", "{r}");
}

/// A pusher overwrites one chunk blob of a key with random bytes of the
/// same size, leaving warmstart.json, SHA256SUMS and any statement as they
/// were. The next honest publish makes that chunk again (its content did
/// not change): it must store and push its own bytes, not take the
/// branch's blob by the name and size warmstart.json claims, and it still
/// reuses every chunk whose blob it verified.
#[test]
fn a_same_size_chunk_swap_is_never_reused_and_an_honest_refresh_heals_the_key() {
    let fx = delta_cache();
    let env = &fx.env;
    let first = crate::util::fixture::json_of(&publish(&fx, "1", "base"));
    let old: Vec<String> = first["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect();
    assert!(old.len() >= 4, "{first}");
    let cache_ref = pusher_checkout(env);
    let j: Value =
        serde_json::from_str(&fs::read_to_string(env.join("evil/warmstart.json")).unwrap())
            .unwrap();
    let victim = &j["keys"]["dt-1"]["chunks"][2];
    let (file, digest) = (
        victim["file"].as_str().unwrap(),
        victim["sha256"].as_str().unwrap().to_string(),
    );
    let size = fs::metadata(env.join("evil").join(file)).unwrap().len();
    let noise: Vec<u8> = (0..size).map(|i| (i * 7919 % 251) as u8).collect();
    fs::write(env.join("evil").join(file), noise).unwrap();
    pusher_push(env, &cache_ref);

    // The honest refresh: d/f00 changes; the victim's content does not.
    let refresh = publish(&fx, "1", "next");
    let j = crate::util::fixture::json_of(&refresh);
    let chunks = j["chunks"].as_array().unwrap();
    let victim_row = chunks
        .iter()
        .find(|c| c["sha256"] == digest.as_str())
        .unwrap_or_else(|| panic!("the refresh has no chunk {digest}: {j}"));
    assert_eq!(
        victim_row["reused"], false,
        "the pusher's blob was taken: {j}"
    );
    assert!(
        refresh.stderr().contains(&digest) && refresh.stderr().contains("not the bytes"),
        "no warning named the swapped chunk: {}",
        refresh.stderr()
    );
    // Every other chunk the key had before is reused: verified, not redone.
    let kept = chunks
        .iter()
        .filter(|c| c["sha256"] != digest.as_str() && old.iter().any(|o| c["sha256"] == o.as_str()))
        .collect::<Vec<_>>();
    assert!(!kept.is_empty(), "{j}");
    assert!(kept.iter().all(|c| c["reused"] == true), "{j}");
    // A fresh machine installs the refreshed key.
    fx.forget();
    let r = restore(&fx, "1");
    assert_eq!(r["state"], "restored", "{r}");
}

/// A pusher swaps the bytes of one chunk blob of a key and leaves its
/// digest in warmstart.json. The next honest publish of that key makes a
/// chunk with that digest, and takes the branch's blob for it by the
/// digest warmstart.json gives: the key CI then signs names bytes that no
/// restore accepts, and each later refresh keeps it so.
#[test]
fn a_refresh_never_takes_a_branch_blob_whose_bytes_are_not_its_digest() {
    let fx = delta_cache();
    let env = &fx.env;
    publish(&fx, "1", "base");
    let cache_ref = pusher_checkout(env);
    let j: Value =
        serde_json::from_str(&fs::read_to_string(env.join("evil/warmstart.json")).unwrap())
            .unwrap();
    let victim = j["keys"]["dt-1"]["chunks"][1]["file"]
        .as_str()
        .unwrap()
        .to_string();
    fs::write(env.join("evil").join(&victim), "not the chunk\n").unwrap();
    pusher_push(env, &cache_ref);
    // The honest refresh: d/f00 changes, the chunk after it does not.
    publish(&fx, "1", "next");
    let r = restore(&fx, "1");
    assert_eq!(r["state"], "restored", "{r}");
}
