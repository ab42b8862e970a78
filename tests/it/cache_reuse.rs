//! Restore reuses what the machine has: a chunk of a new key
//! that an earlier key already brought is taken from the chunk store, a
//! clone that holds the chunk blobs gives them, and only the rest crosses
//! the network; a stored chunk or a clone's blob that does not hash to its
//! digest is never used. Counted twice: by `--json` and independently (the
//! chunk store's growth, the server's own record of the packs it sent).
//! `WARMSTART_FETCH_BLOB_LIMIT` makes 20 kB chunks "big", so they are
//! fetched by id as real chunks are.

use crate::util::fixture::{Fixture, Manifest, json_of};
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{run, show};
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Blobs of 8 KiB or more are left out of branch fetches in these tests.
const LIMIT: &str = "8k";
const LIMIT_BYTES: u64 = 8192;

/// A work repository whose cache `art` packs `src` (a tricky tree plus
/// 300 kB of noise, in 20 kB chunks) into `restored/art`, with
/// `origin.git` a bare remote by path.
fn art_cache() -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", LIMIT);
    let src = src(&fx);
    make_tricky_tree(&src, false);
    write_pseudo_random(&src.join("noise.bin"), 300_000, 5);
    manifest(&fx, "1");
    fx
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

/// The manifest, in the publishing repository and in `user`, a
/// repository of its own (not a clone: its objects hold no chunk) that
/// restores from the same remote.
fn manifest(fx: &Fixture, literal: &str) {
    let user = fx.env.join("user");
    if !user.exists() {
        fx.clone_repo("user");
    }
    let m = Manifest::literal(literal, src(fx)).chunk_bytes(20000);
    for repo in [&fx.work, &user] {
        m.write(repo, "art");
    }
}

fn restore_in(fx: &Fixture, dir: &str) -> Value {
    fx.json_in(dir, &["cache", "restore", "art", "--json"])
}

/// `(sha256, size)` of each chunk a publish reported.
fn chunks(published: &Value) -> Vec<(String, u64)> {
    published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["sha256"].as_str().unwrap().to_string(),
                c["size"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// The total size of the files under `dir` (0 if it does not exist).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            if m.is_dir() {
                bytes_under(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

fn store_of(repo: &Path) -> PathBuf {
    repo.join(".git/warmstart/cache.git/chunks")
}

#[test]
fn cache_reuse_a_new_key_fetches_only_the_chunks_it_does_not_share() {
    let fx = art_cache();
    let one = chunks(&fx.publish("art"));
    let first = restore_in(&fx, "user");
    assert_eq!(first["state"], "restored", "{first}");
    assert_eq!(first["chunks_reused"], 0, "{first}");

    // Key 2: the same tree and one more file at the end of the tar, so
    // that most chunks are byte for byte those of key 1.
    write_pseudo_random(&src(&fx).join("zzzz-late.bin"), 30_000, 9);
    manifest(&fx, "2");
    let two = chunks(&fx.publish("art"));
    let had: HashSet<&str> = one.iter().map(|(s, _)| s.as_str()).collect();
    let new: Vec<&(String, u64)> = two
        .iter()
        .filter(|(s, _)| !had.contains(s.as_str()))
        .collect();
    let new_big = new.iter().filter(|(_, n)| *n >= LIMIT_BYTES).count() as u64;
    let shared = (two.len() - new.len()) as u64;
    assert!(
        shared >= 5 && new_big >= 1,
        "{shared} shared, {new_big} new"
    );

    let store = store_of(&fx.env.join("user"));
    let before = bytes_under(&store);
    // Without the install's record the delta install (which would skip
    // the shared chunks altogether) stands aside, and every chunk is read:
    // the shared ones from the store.
    std::fs::remove_dir_all(fx.env.join("user/.git/warmstart/cache/installed")).unwrap();
    let j = restore_in(&fx, "user");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["key"], "art-2", "{j}");
    assert_eq!(j["files_linked"], 0, "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(new_big), "{j}");
    assert_eq!(j["chunks_reused"].as_u64(), Some(shared), "{j}");
    let new_bytes: u64 = new.iter().map(|(_, n)| n).sum();
    assert_eq!(j["bytes_fetched"].as_u64(), Some(new_bytes), "{j}");
    // Independently: the chunk store grew by exactly the new big chunks.
    let grown = bytes_under(&store) - before;
    let new_big_bytes: u64 = new
        .iter()
        .filter(|(_, n)| *n >= LIMIT_BYTES)
        .map(|(_, n)| n)
        .sum();
    assert_eq!(grown, new_big_bytes, "{j}");
    assert_same_tree(&src(&fx), &fx.env.join("user/restored/art"));
    // The summary says it too (again without the delta install).
    manifest(&fx, "1");
    std::fs::remove_dir_all(fx.env.join("user/.git/warmstart/cache/installed")).unwrap();
    let r = fx.xtask_in("user", &["cache", "restore", "art"]).ok();
    assert!(
        r.stdout().contains("fetched 0 chunks (0 B), reused"),
        "{}",
        show(&r.out)
    );
}

#[test]
fn cache_reuse_a_damaged_stored_chunk_is_fetched_again_never_used() {
    let fx = art_cache();
    let all = chunks(&fx.publish("art"));
    restore_in(&fx, "user");
    let store = store_of(&fx.env.join("user"));
    // Every way a stored chunk can be wrong, each on its own chunk: a
    // flipped byte (same size), and a different file of the same size.
    let bigs: Vec<&(String, u64)> = all.iter().filter(|(_, n)| *n >= LIMIT_BYTES).collect();
    let flip = store.join(&bigs[1].0);
    let mut bytes = std::fs::read(&flip).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&flip, bytes).unwrap();
    let swap = store.join(&bigs[3].0);
    std::fs::copy(store.join(&bigs[2].0), &swap).unwrap();
    std::fs::remove_dir_all(fx.env.join("user/restored")).unwrap();
    let j = json_of(
        &fx.xtask_in("user", &["cache", "restore", "art", "--verify", "--json"])
            .ok(),
    );
    assert_eq!(j["chunks_fetched"], 2, "{j}");
    assert_eq!(
        j["chunks_reused"].as_u64(),
        Some(all.len() as u64 - 2),
        "{j}"
    );
    assert_same_tree(&src(&fx), &fx.env.join("user/restored/art"));
    // The store holds the right bytes again.
    for (sha, _) in [bigs[1], bigs[3]] {
        let out = run(std::process::Command::new("sha256sum").arg(store.join(sha)));
        assert!(out.stdout().starts_with(sha.as_str()), "{}", show(&out.out));
    }
}

/// A clone of `origin.git` (which has the cache branch as a branch, so a
/// plain clone holds every chunk blob) at `name`, with loose objects only
/// (so that one can be replaced by hand).
fn full_clone(fx: &Fixture, name: &str) -> PathBuf {
    fx.env.git(
        ".",
        [
            "clone",
            "-q",
            "--no-local",
            fx.env.join("origin.git").to_str().unwrap(),
            name,
        ],
    );
    let dir = fx.env.join(name);
    // The manifest, as the work repository has it.
    std::fs::create_dir_all(dir.join("cache-manifests")).unwrap();
    std::fs::copy(
        fx.work.join("cache-manifests/art.toml"),
        dir.join("cache-manifests/art.toml"),
    )
    .unwrap();
    let packs = dir.join(".git/objects/pack");
    for e in std::fs::read_dir(&packs).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "pack") {
            let moved = fx.env.join(format!("{name}.pack"));
            std::fs::rename(&p, &moved).unwrap();
            let _ = std::fs::remove_file(p.with_extension("idx"));
            let _ = std::fs::remove_file(p.with_extension("rev"));
            let mut cmd = std::process::Command::new("git");
            fx.env.isolate(&mut cmd);
            cmd.current_dir(&dir)
                .arg("unpack-objects")
                .arg("-q")
                .stdin(std::fs::File::open(&moved).unwrap());
            let out = cmd.output().unwrap();
            assert!(out.status.success(), "{}", show(&out));
        }
    }
    dir
}

/// What a repository's object store and refs are, to see that nothing
/// changed them.
fn fingerprint(fx: &Fixture, dir: &str) -> (String, u64) {
    let refs = fx.env.git(dir, ["for-each-ref"]);
    (refs, bytes_under(&fx.env.join(dir).join(".git/objects")))
}

#[test]
fn cache_reuse_a_full_clone_gives_its_chunk_blobs_hashed_and_nothing_is_fetched_or_copied() {
    let fx = art_cache();
    let all = chunks(&fx.publish("art"));
    fx.env.git("work", ["push", "-q", "origin", "HEAD:main"]);
    let clone = full_clone(&fx, "full");
    let bigs = all.iter().filter(|(_, n)| *n >= LIMIT_BYTES).count() as u64;
    let small: u64 = all
        .iter()
        .filter(|(_, n)| *n < LIMIT_BYTES)
        .map(|(_, n)| n)
        .sum();
    let total: u64 = all.iter().map(|(_, n)| n).sum();
    assert!(bigs >= 10, "{all:?}");

    let before = fingerprint(&fx, "full");
    let j = restore_in(&fx, "full");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"], 0, "{j}");
    assert_eq!(j["chunks_from_clone"].as_u64(), Some(bigs), "{j}");
    // Only a chunk small enough to come with the branch fetch crossed.
    assert_eq!(j["bytes_fetched"].as_u64(), Some(small), "{j}");
    assert_same_tree(&src(&fx), &clone.join("restored/art"));
    // cache.git's objects did not receive the chunks a second time, and
    // the clone itself is exactly as it was.
    let objects = bytes_under(&clone.join(".git/warmstart/cache.git/objects"));
    assert!(
        objects < small + total / 4,
        "cache.git holds {objects} of {total}"
    );
    // Nor were they copied into the chunk store: they are read from the
    // clone itself (hashed before use, and again before decoding).
    assert_eq!(bytes_under(&store_of(&clone)), 0);
    assert_eq!(fingerprint(&fx, "full"), before);
}

#[test]
fn cache_reuse_a_wrong_blob_in_the_clone_is_never_used() {
    let fx = art_cache();
    let all = chunks(&fx.publish("art"));
    fx.env.git("work", ["push", "-q", "origin", "HEAD:main"]);
    let clone = full_clone(&fx, "full");
    // The loose object of one chunk now inflates to other bytes of the
    // same size (git's cat-file does not re-hash what it reads).
    let tree = fx.env.git("full", ["ls-tree", "origin/art-cache"]);
    let victims: Vec<(String, String)> = tree
        .lines()
        .filter(|l| l.contains(".part0"))
        .take(3)
        .map(|l| {
            let (meta, name) = l.split_once('\t').unwrap();
            (
                meta.split_whitespace().nth(2).unwrap().to_string(),
                name.to_string(),
            )
        })
        .collect();
    let oid = &victims[1].0;
    let size: usize = fx
        .env
        .git("full", ["cat-file", "-s", oid])
        .trim()
        .parse()
        .unwrap();
    let mut forged = format!("blob {size}\0").into_bytes();
    forged.extend(std::iter::repeat_n(b'x', size));
    let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut z, &forged).unwrap();
    let loose = clone.join(".git/objects").join(&oid[..2]).join(&oid[2..]);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::fs::write(&loose, z.finish().unwrap()).unwrap();

    let j = restore_in(&fx, "full");
    assert_eq!(j["state"], "restored", "{j}");
    // That chunk came from the server; every other one from the clone.
    assert_eq!(j["chunks_fetched"], 1, "{j}");
    let bigs = all.iter().filter(|(_, n)| *n >= LIMIT_BYTES).count() as u64;
    assert_eq!(j["chunks_from_clone"].as_u64(), Some(bigs - 1), "{j}");
    assert_same_tree(&src(&fx), &clone.join("restored/art"));
    // And the forged bytes never reached the chunk store.
    let store = store_of(&clone);
    for e in std::fs::read_dir(&store).unwrap().flatten() {
        let out = run(std::process::Command::new("sha256sum").arg(e.path()));
        assert!(
            out.stdout().starts_with(&*e.file_name().to_string_lossy()),
            "{}",
            show(&out.out)
        );
    }
}
