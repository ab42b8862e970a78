//! How `cache restore` gets a branch's chunks: the branch fetch leaves big
//! chunks out and they are fetched by id while the earlier ones unpack; the
//! fallbacks (a server that ignores the filter, one that refuses objects by
//! id), a chunk the server lacks, a damaged chunk, and a publish from a
//! clone that holds only some chunks. Real bare remotes over file paths;
//! `WARMSTART_FETCH_BLOB_LIMIT` makes 20 kB chunks "big" so the data stays small.

use crate::util::fixture::{Fixture, Manifest, json_of};
use crate::util::http_backend::HttpGit;
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// Blobs of 8 KiB or more are left out of branch fetches in these tests.
const LIMIT: &str = "8k";

/// A work repository whose cache `art` packs `src` (a tricky tree plus
/// 120 kB of noise: six or seven 20 kB chunks) and restores into
/// `restored/art`, with `origin` a bare remote configured by `config`.
fn art_cache(config: &[(&str, &str)]) -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", LIMIT);
    for (k, v) in config {
        fx.origin_git(&["config", k, v]);
    }
    let src = src(&fx);
    make_tricky_tree(&src, false);
    // Early in the tar: chunks are content-defined frames, split to fit
    // chunk_bytes, so the first chunks are the noise's, all big.
    write_pseudo_random(&src.join("0-noise.bin"), 120_000, 11);
    manifest(&fx, "1");
    fx
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn target(fx: &Fixture) -> PathBuf {
    fx.work.join("restored/art")
}

fn manifest(fx: &Fixture, literal: &str) {
    fx.write_manifest(
        "art",
        &Manifest::literal(literal, src(fx)).chunk_bytes(20000),
    );
}

/// Forgets everything this clone fetched or installed: the next restore
/// is the one of a fresh clone.
fn forget(fx: &Fixture) {
    fx.forget();
    let _ = std::fs::remove_dir_all(fx.work.join("restored"));
}

/// `cache restore art --json` with `config` as the user's global git
/// configuration (which both git and the servers it starts read).
fn restore_json_with_global(fx: &Fixture, config: &str) -> Value {
    let global = fx.env.join("gitconfig-global");
    std::fs::write(&global, config).unwrap();
    let mut cmd = fx.command(&["cache", "restore", "art", "--json"]);
    cmd.env("GIT_CONFIG_GLOBAL", &global);
    json_of(&run(&mut cmd).ok())
}

fn cache_git(fx: &Fixture, args: &[&str]) -> String {
    let mut all = vec!["--git-dir", ".git/warmstart/cache.git"];
    all.extend(args);
    fx.env.git("work", all)
}

/// The blob ids of the branch's chunk files on the remote, in order.
fn remote_chunks(fx: &Fixture) -> Vec<(String, String)> {
    let out = fx.origin_git(&["ls-tree", "art-cache"]);
    out.lines()
        .filter(|l| l.contains(".part"))
        .map(|l| {
            let (meta, name) = l.split_once('\t').unwrap();
            let oid = meta.split_whitespace().nth(2).unwrap().to_string();
            (name.to_string(), oid)
        })
        .collect()
}

/// Chunks of 8 KiB or more on the branch: the ones a restore fetches by id.
fn big_chunks(published: &Value) -> u64 {
    published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() >= 8192)
        .count() as u64
}

#[test]
fn cache_fetch_restores_chunks_fetched_by_id_while_unpacking() {
    let fx = art_cache(&[]);
    let published = fx.publish("art");
    let big = big_chunks(&published);
    assert!(big >= 5, "{published}");
    forget(&fx);

    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "byid", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    // The remote is a path: every chunk came straight from upload-pack's
    // pack into the chunk store, under its sha256, which coreutils agrees
    // with.
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    let stored = stored_chunks(&store);
    assert_eq!(stored.len() as u64, big, "{stored:?}");
    for c in published["chunks"].as_array().unwrap() {
        if c["size"].as_u64().unwrap() >= 8192 {
            let sha = c["sha256"].as_str().unwrap();
            assert!(stored.contains(&sha.to_string()), "{sha} in {stored:?}");
            let out = run(std::process::Command::new("sha256sum").arg(store.join(sha)));
            assert!(out.stdout().starts_with(sha), "{}", show(&out.out));
        }
    }
    let phases = &j["timings_ms"];
    for p in ["fetch", "unpack", "chunk_fetch", "chunk_wait"] {
        assert!(phases[p].is_u64(), "{p} in {j}");
    }
    assert!(
        phases["chunk_wait"].as_u64() <= phases["unpack"].as_u64(),
        "{j}"
    );
    assert_same_tree(&src(&fx), &target(&fx));

    // cache.git is a partial clone of a promisor named `warmstart`, whose
    // URL was never written down.
    assert_eq!(
        cache_git(&fx, &["config", "remote.warmstart.promisor"]).trim(),
        "true"
    );
    let url = run(std::process::Command::new("git")
        .current_dir(&fx.work)
        .args([
            "--git-dir",
            ".git/warmstart/cache.git",
            "config",
            "remote.warmstart.url",
        ]));
    assert_eq!(url.code(), 1, "{}", show(&url.out));

    // The chunks are in the chunk store now: `cache verify` and a
    // `--verify` restore fetch nothing.
    let v = json_of(&fx.xtask(&["cache", "verify", "art", "--json"]).ok());
    assert_eq!(v["keys"][0]["ok"], true, "{v}");
    let again = json_of(
        &fx.xtask(&["cache", "restore", "art", "--verify", "--json"])
            .ok(),
    );
    assert_eq!(again["state"], "verified", "{again}");
    assert_eq!(again["chunk_source"], "present", "{again}");
    assert_eq!(again["chunks_fetched"], 0, "{again}");
}

/// The names in the chunk store.
fn stored_chunks(store: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(store)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn cache_fetch_from_a_file_url_reads_chunks_direct_and_fetches_a_damaged_stored_one_again() {
    let fx = art_cache(&[]);
    let url = format!("file://{}", fx.env.join("origin.git").display());
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    let published = fx.publish("art");
    let big = big_chunks(&published);
    forget(&fx);
    let j = fx.restore("art");
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert_same_tree(&src(&fx), &target(&fx));

    // One stored chunk damaged, one cut short, as a crash or a hand edit
    // might leave them; the installed copy is gone.
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    let stored = stored_chunks(&store);
    let damaged = store.join(&stored[0]);
    let mut bytes = std::fs::read(&damaged).unwrap();
    bytes[10] ^= 1;
    std::fs::write(&damaged, &bytes).unwrap();
    let cut = store.join(&stored[1]);
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    std::fs::remove_dir_all(fx.work.join("restored")).unwrap();

    // Both are fetched again, the rest come from the store.
    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"], 2, "{j}");
    assert_eq!(j["chunks_direct"], 2, "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
    assert_eq!(stored_chunks(&store), stored, "no partial file is left");
    for name in &stored {
        let out = run(std::process::Command::new("sha256sum").arg(store.join(name)));
        assert!(
            out.stdout().starts_with(name.as_str()),
            "{}",
            show(&out.out)
        );
    }
}

#[test]
fn cache_fetch_over_http_reads_chunks_direct_through_gits_helper() {
    // Smart HTTP (git http-backend on 127.0.0.1): the chunks come through
    // `git remote-http`'s stateless-connect, not `git fetch`.
    let fx = art_cache(&[]);
    let server = HttpGit::start(&fx.env.join("."));
    let url = server.url("origin.git");
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    let published = fx.publish("art");
    let big = big_chunks(&published);
    forget(&fx);
    let before = server.requests.load(Ordering::SeqCst);
    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    assert_eq!(j["chunks_direct"].as_u64(), Some(big), "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
    // All of it went through the HTTP server: the branch fetch, then one
    // advertisement and one request for the whole batch of chunks (not
    // one per chunk).
    let served = server.requests.load(Ordering::SeqCst) - before;
    assert!(big >= 5, "{big}");
    assert!(
        (3..=6).contains(&served),
        "{served} requests for {big} chunks"
    );

    assert!(j["direct_fallback"].is_null(), "{j}");

    // A user who asks git for protocol v0 (in the global configuration,
    // which is not the repository's) gets no v2 request from us either:
    // the chunks come through `git fetch`, by id.
    forget(&fx);
    let j = restore_json_with_global(&fx, "[protocol]\n\tversion = 0\n");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    assert_eq!(j["chunks_direct"], 0, "{j}");
    // Never tried, and it says why.
    assert!(
        j["direct_fallback"]
            .as_str()
            .is_some_and(|w| w.contains("protocol.version")),
        "{j}"
    );
    assert_same_tree(&src(&fx), &target(&fx));
}

#[test]
fn cache_fetch_falls_back_to_git_fetch_when_the_pack_is_not_one_blob() {
    // The server's pack-objects (through the hook git allows in the
    // global configuration) adds the empty blob to every pack it sends: a
    // pack of two objects, which git fetch accepts and the direct reader
    // does not.
    let fx = art_cache(&[]);
    let published = fx.publish("art");
    let big = big_chunks(&published);
    forget(&fx);
    let empty = fx
        .env
        .git("origin.git", ["hash-object", "-w", "/dev/null"])
        .trim()
        .to_string();
    let hook = fx.env.join("pack-objects-hook");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\n{{ echo {empty}; cat; }} | \"$@\"\n"),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let j = restore_json_with_global(
        &fx,
        &format!("[uploadpack]\n\tpackObjectsHook = {}\n", hook.display()),
    );
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "byid", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big), "{j}");
    assert_eq!(j["chunks_direct"], 0, "{j}");
    // It was tried, and gave up on what it saw.
    assert!(
        j["direct_fallback"]
            .as_str()
            .is_some_and(|w| w.contains("no chunk asked for")),
        "{j}"
    );
    assert_same_tree(&src(&fx), &target(&fx));

    // Again with the later chunks in the chunk store and the first one
    // not: one direct fetcher gives up on chunk 0 while the other has run
    // ahead through the store to the end of its window. The restore must
    // finish through git fetch, not wait for the window to move.
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    let first = published["chunks"][0]["sha256"].as_str().unwrap();
    // Fill the store without the hook, then take chunk 0 out of it (the
    // direct reader never puts chunks in cache.git's objects) and the
    // installed copy away.
    forget(&fx);
    assert_eq!(fx.restore("art")["chunks_direct"].as_u64(), Some(big));
    std::fs::remove_file(store.join(first)).unwrap();
    std::fs::remove_dir_all(fx.work.join("restored")).unwrap();
    let j = restore_json_with_global(
        &fx,
        &format!("[uploadpack]\n\tpackObjectsHook = {}\n", hook.display()),
    );
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunks_fetched"], 1, "{j}");
    assert_eq!(j["chunks_direct"], 0, "{j}");
    assert!(j["direct_fallback"].is_string(), "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
}

#[test]
fn cache_fetch_with_a_blob_limit_that_is_not_a_size_fails_in_one_line() {
    let fx = art_cache(&[]);
    fx.publish("art");
    forget(&fx);
    let mut cmd = fx.env.xtask_in("work");
    cmd.env("WARMSTART_FETCH_BLOB_LIMIT", "lots")
        .args(["cache", "restore", "art"]);
    let r = run(&mut cmd).expect_code(10);
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("WARMSTART_FETCH_BLOB_LIMIT=\"lots\" is not a size"),
        "{err}"
    );
    assert!(!target(&fx).exists(), "nothing is installed");
}

#[test]
fn cache_fetch_from_a_server_that_ignores_the_filter_fetches_no_chunk_by_id() {
    let fx = art_cache(&[("uploadpack.allowFilter", "false")]);
    fx.publish("art");
    forget(&fx);
    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "present", "{j}");
    assert_eq!(j["chunks_fetched"], 0, "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
}

#[test]
fn cache_fetch_falls_back_to_a_whole_fetch_when_the_server_refuses_objects_by_id() {
    // Protocol v0 without allow*SHA1InWant: a `want` of a blob is refused.
    let fx = art_cache(&[("uploadpack.allowReachableSHA1InWant", "false")]);
    fx.publish("art");
    forget(&fx);
    fx.env.git("work", ["config", "protocol.version", "0"]);
    let j = fx.restore("art");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "refetch", "{j}");
    assert_eq!(j["chunks_fetched"], 0, "{j}");
    // protocol.version is the user's choice: no protocol v2 request here.
    assert_eq!(j["chunks_direct"], 0, "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
    // A second key restored in the same clone goes the same way.
    let v = json_of(&fx.xtask(&["cache", "verify", "art", "--json"]).ok());
    assert_eq!(v["keys"][0]["ok"], true, "{v}");
}

#[test]
fn cache_fetch_of_a_chunk_the_server_lacks_fails_in_one_line_and_installs_nothing() {
    // Loose objects on the server, so that one chunk can be taken away.
    let fx = art_cache(&[("receive.unpackLimit", "100000")]);
    fx.publish("art");
    forget(&fx);
    // A first restore fetches the branch (without chunks) and is killed.
    let mut cmd = fx.env.xtask_in("work");
    cmd.env("WARMSTART_FETCH_BLOB_LIMIT", LIMIT)
        .env("WARMSTART_TEST_KILL_AT", "restore:fetched")
        .args(["cache", "restore", "art", "--quiet"]);
    let killed = run(&mut cmd);
    assert_ne!(killed.code(), 0, "{}", show(&killed.out));
    let chunks = remote_chunks(&fx);
    let (name, oid) = &chunks[1];
    let loose = fx
        .env
        .join("origin.git/objects")
        .join(&oid[..2])
        .join(&oid[2..]);
    std::fs::remove_file(&loose).unwrap_or_else(|e| panic!("{}: {e}", loose.display()));

    let r = fx.xtask(&["cache", "restore", "art"]).expect_code(8);
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("cannot fetch chunk {name}")) && err.contains("does not have it"),
        "{err}"
    );
    assert!(!target(&fx).exists(), "nothing is installed");
    assert_no_staging(&target(&fx));
}

#[test]
fn cache_fetch_a_damaged_chunk_fetched_by_id_exits_6_before_installing() {
    let fx = art_cache(&[]);
    let published = fx.publish("art");
    // The branch, with one chunk's bytes changed (its digest in
    // warmstart.json and SHA256SUMS left as published).
    let chunks = remote_chunks(&fx);
    let (name, oid) = &chunks[2];
    let mut cat = std::process::Command::new("git");
    cat.current_dir(fx.env.join("origin.git"))
        .args(["cat-file", "blob", oid]);
    fx.env.isolate(&mut cat);
    let mut bytes = cat.output().unwrap().stdout;
    assert!(bytes.len() > 1000);
    bytes[100] ^= 1;
    let damaged = fx.env.join("damaged.bin");
    std::fs::write(&damaged, &bytes).unwrap();
    let new_oid = fx
        .env
        .git(
            "origin.git",
            ["hash-object", "-w", damaged.to_str().unwrap()],
        )
        .trim()
        .to_string();
    let tree = fx
        .env
        .git("origin.git", ["ls-tree", "art-cache"])
        .replace(oid, &new_oid);
    let tree_file = fx.env.join("tree.txt");
    std::fs::write(&tree_file, tree).unwrap();
    let mut mktree = std::process::Command::new("git");
    mktree.current_dir(fx.env.join("origin.git")).arg("mktree");
    fx.env.isolate(&mut mktree);
    mktree.stdin(std::fs::File::open(&tree_file).unwrap());
    let out = mktree.output().unwrap();
    assert!(out.status.success());
    let new_tree = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let commit = fx
        .env
        .git("origin.git", ["commit-tree", &new_tree, "-m", "damaged"])
        .trim()
        .to_string();
    fx.env.git(
        "origin.git",
        ["update-ref", "refs/heads/art-cache", &commit],
    );

    forget(&fx);
    let r = fx.xtask(&["cache", "restore", "art"]).expect_code(6);
    assert!(r.stderr().contains(name.as_str()), "{}", r.stderr());
    assert!(r.stderr().contains("sha256"), "{}", r.stderr());
    assert!(!target(&fx).exists(), "nothing is installed");
    assert_no_staging(&target(&fx));
    // Only chunks that matched their digest are stored, and nothing partial.
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    assert!(
        !stored_chunks(&store).is_empty(),
        "the chunks before it were stored"
    );
    let digests: Vec<String> = published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["file"] != name.as_str())
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect();
    for f in stored_chunks(&store) {
        assert!(digests.contains(&f), "{f} is stored");
    }
}

#[test]
fn cache_fetch_publish_from_a_clone_without_the_other_keys_chunks_keeps_them() {
    let fx = art_cache(&[]);
    let a = fx.publish("art");
    // A fresh clone publishes another key: its branch fetch leaves key 1's
    // chunks on the remote, and the new commit keeps them.
    forget(&fx);
    manifest(&fx, "2");
    std::fs::write(src(&fx).join("flavour.txt"), "two").unwrap();
    let b = fx.publish("art");
    assert_eq!(b["status"], "published", "{b}");
    assert_eq!(b["keys_on_branch"].as_array().unwrap().len(), 2, "{b}");
    // Key 1 still restores in full from a fresh clone, chunks fetched by id.
    forget(&fx);
    manifest(&fx, "1");
    let j = fx.restore("art");
    assert_eq!(j["key"], "art-1", "{j}");
    assert_eq!(j["chunks_fetched"].as_u64(), Some(big_chunks(&a)), "{j}");
    std::fs::remove_file(src(&fx).join("flavour.txt")).unwrap();
    assert_same_tree(&src(&fx), &target(&fx));
    // And so does key 2.
    forget(&fx);
    manifest(&fx, "2");
    std::fs::write(src(&fx).join("flavour.txt"), "two").unwrap();
    let j = fx.restore("art");
    assert_eq!(j["key"], "art-2", "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
}

/// No staging directory was left beside `target`.
fn assert_no_staging(target: &Path) {
    let parent = target.parent().unwrap();
    if let Ok(rd) = std::fs::read_dir(parent) {
        let stray: Vec<String> = rd
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(stray.is_empty(), "leftovers beside the target: {stray:?}");
    }
}

#[test]
fn cache_fetch_a_legacy_branch_gets_its_parts_before_unpacking() {
    // Parts of a legacy branch declare no size, so they are fetched (by
    // id) before the plan is made; the restore is whole.
    let fx = art_cache(&[]);
    let recipe = fx.env.join("seed_recipe.sh");
    std::fs::write(&recipe, include_str!("cache_restore/seed_recipe.sh")).unwrap();
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(&recipe)
        .arg("publish")
        .arg(src(&fx))
        .arg(fx.env.join("origin.git"))
        .arg("art-cache")
        .arg("zst");
    fx.env.isolate(&mut cmd);
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    let part = fx.env.git("origin.git", ["ls-tree", "-l", "art-cache"]);
    assert!(
        part.lines().any(|l| l.contains(".part")
            && l.split_whitespace().nth(3).unwrap().parse::<u64>().unwrap() > 8192),
        "the part must be big enough to be left out: {part}"
    );
    let j = fx.restore("art");
    assert_eq!(j["layout"], "legacy-zstd", "{j}");
    assert_same_tree(&src(&fx), &target(&fx));
}
