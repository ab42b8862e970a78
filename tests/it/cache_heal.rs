//! Damaged private stores heal: cache.git, cache-meta.git and the chunk store are rebuilt once, with a warning.
//!
//! Each test damages a store the way disks and people do (packs deleted or
//! truncated, a ref to an object that is not there, a corrupt chunk file),
//! then runs the command again: it must warn once, naming the store and
//! that it was rebuilt, exit 0, and leave what is installed as it was.
//! Before, every restore and verify exited 8 forever, blaming origin.

use crate::util::git_daemon::GitDaemon;
use crate::util::tree::{assert_same_tree, write_pseudo_random};
use crate::util::{Run, TestEnv, run, show};
use std::path::{Path, PathBuf};

/// A served origin with cache `c` (key `c-one`) published from `work` and
/// restored there, and in a fresh clone `user`: both cache.git stores hold
/// the chunks as git packs (a `git://` remote is read through `git fetch`;
/// the publisher's are the packs it wrote, under a ref it set itself).
fn published_and_restored() -> (TestEnv, GitDaemon) {
    let env = TestEnv::new();
    let src = env.join("src");
    std::fs::create_dir_all(src.join("d")).unwrap();
    std::fs::write(src.join("d/small.txt"), "small\n").unwrap();
    write_pseudo_random(&src.join("big.bin"), 1_500_000, 7);
    env.bare_remote("origin.git");
    let daemon = GitDaemon::start(env.path());
    for w in ["work", "user"] {
        env.work_repo(w);
        env.git(w, ["remote", "add", "origin", &daemon.url("origin.git")]);
        write_manifest(&env, w, "one");
    }
    run(env.xtask_in("work").args(["cache", "publish", "c"])).ok();
    for w in ["work", "user"] {
        run(env.xtask_in(w).args(["cache", "restore", "c"])).ok();
        assert_same_tree(&src, &env.join(w).join("restored"));
    }
    (env, daemon)
}

fn write_manifest(env: &TestEnv, work: &str, literal: &str) {
    let dir = env.join(work).join("cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("c.toml"),
        format!(
            "[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored\"\n",
            env.join("src").display()
        ),
    )
    .unwrap();
}

fn store(env: &TestEnv, work: &str, name: &str) -> PathBuf {
    env.join(work).join(".git/warmstart").join(name)
}

/// Deletes every pack of `store` (objects/pack/*).
fn delete_packs(store: &Path) {
    let dir = store.join("objects/pack");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
        n += 1;
    }
    assert!(n > 0, "{} had no packs to delete", dir.display());
}

/// The run exited 0 and warned exactly once that `store` was rebuilt.
fn assert_healed(r: &Run, store: &Path) {
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    let name = store.display().to_string();
    let warnings: Vec<&str> = r
        .out
        .stderr
        .split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok())
        .filter(|l| l.contains("rebuilt"))
        .collect();
    assert_eq!(warnings.len(), 1, "{}", show(&r.out));
    assert!(
        warnings[0].starts_with("warning: ") && warnings[0].contains(&name),
        "{}",
        show(&r.out)
    );
}

/// The stamp of cache `c` in clone `work`.
fn stamp_bytes(env: &TestEnv, work: &str) -> Vec<u8> {
    let dir = env.join(work).join(".git/warmstart");
    std::fs::read(dir.join("cache/stamps/c.json"))
        .unwrap_or_else(|_| panic!("no stamp; state dir has {:?}", list(&dir)))
}

fn ino(path: &Path) -> u64 {
    std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
}

fn list(dir: &Path) -> Vec<String> {
    walk(dir)
        .into_iter()
        .map(|p| p.display().to_string())
        .collect()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The bug: after cache.git lost its packs, every restore and verify
/// exited 8 ("cannot fetch ... remote did not send all necessary objects"),
/// blaming origin, until someone removed cache.git by hand. It shows in the
/// clone that published (its ref names a commit it made itself).
#[test]
fn a_cache_git_that_lost_its_packs_is_rebuilt_not_blamed_on_origin() {
    let (env, _daemon) = published_and_restored();
    let cache = store(&env, "work", "cache.git");
    let installed = ino(&env.join("work/restored"));

    delete_packs(&cache);
    let r = run(env
        .xtask_in("work")
        .args(["cache", "restore", "c", "--verify"]));
    assert_healed(&r, &cache);
    assert_same_tree(&env.join("src"), &env.join("work/restored"));
    // The install matched: it was left as it was, not swapped.
    assert_eq!(
        installed,
        ino(&env.join("work/restored")),
        "the install was replaced"
    );

    // New keys published, then their packs lost: verify one, restore another.
    write_manifest(&env, "work", "two");
    run(env.xtask_in("work").args(["cache", "publish", "c"])).ok();
    delete_packs(&cache);
    let r = run(env.xtask_in("work").args(["cache", "verify", "c"]));
    assert_healed(&r, &cache);
    write_manifest(&env, "work", "three");
    run(env.xtask_in("work").args(["cache", "publish", "c"])).ok();
    delete_packs(&cache);
    let r = run(env.xtask_in("work").args(["cache", "restore", "c"]));
    assert_healed(&r, &cache);
    assert_same_tree(&env.join("src"), &env.join("work/restored"));
    let stamp = String::from_utf8(stamp_bytes(&env, "work")).unwrap();
    assert!(stamp.contains("\"key\": \"c-three\""), "{stamp}");
}

/// Cuts every pack of `store` to half its length (packs are read-only).
fn truncate_packs(store: &Path) {
    for e in std::fs::read_dir(store.join("objects/pack")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "pack") {
            let mut perm = std::fs::metadata(&p).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
            std::fs::set_permissions(&p, perm).unwrap();
            let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
            f.set_len(f.metadata().unwrap().len() / 2).unwrap();
        }
    }
}

/// A truncated pack (a disk that filled up, a copy cut short) heals too.
#[test]
fn a_cache_git_with_a_truncated_pack_is_rebuilt() {
    let (env, _daemon) = published_and_restored();
    let cache = store(&env, "user", "cache.git");
    truncate_packs(&cache);
    let r = run(env
        .xtask_in("user")
        .args(["cache", "restore", "c", "--verify"]));
    assert_healed(&r, &cache);
    assert_same_tree(&env.join("src"), &env.join("user/restored"));
}

/// A publish from a clone whose cache.git lost its packs rebuilds it and
/// publishes (the branch's own chunks are packed again from the source).
#[test]
fn a_publish_over_a_cache_git_that_lost_its_packs_heals() {
    let (env, _daemon) = published_and_restored();
    let cache = store(&env, "work", "cache.git");
    delete_packs(&cache);
    write_manifest(&env, "work", "three");
    let r = run(env.xtask_in("work").args(["cache", "publish", "c"]));
    assert_healed(&r, &cache);
    let m = env.git("origin.git", ["show", "c-cache:warmstart.json"]);
    assert!(m.contains("c-one") && m.contains("c-three"), "{m}");
}

/// The same for cache-meta.git, through `cache status` and `cache list`:
/// a truncated pack used to make both exit 8, "unreachable".
#[test]
fn a_cache_meta_git_with_a_truncated_pack_is_rebuilt() {
    let (env, _daemon) = published_and_restored();
    let meta = store(&env, "user", "cache-meta.git");
    run(env.xtask_in("user").args(["cache", "status"])).ok();
    for cmd in ["status", "list"] {
        truncate_packs(&meta);
        let r = run(env.xtask_in("user").args(["cache", cmd]));
        assert_healed(&r, &meta);
        assert!(r.stdout().contains("c-one"), "{cmd}\n{}", show(&r.out));
    }
}

/// A ref in cache.git to an object that is not there (git skips such a
/// ref when it fetches): the restore goes on, and so does the install.
#[test]
fn a_cache_git_ref_to_a_missing_object_does_not_stop_a_restore() {
    let (env, _daemon) = published_and_restored();
    for w in ["work", "user"] {
        let cache = store(&env, w, "cache.git");
        std::fs::write(
            cache.join("refs/warmstart/c-cache"),
            format!("{}\n", "1234567".repeat(6).get(..40).unwrap()),
        )
        .unwrap();
        let r = run(env.xtask_in(w).args(["cache", "restore", "c", "--verify"]));
        assert_eq!(r.code(), 0, "{w}\n{}", show(&r.out));
        assert_same_tree(&env.join("src"), &env.join(w).join("restored"));
    }
}

/// A chunk file in the chunk store (cache.git/chunks, filled when the
/// remote is a repository on this machine) whose bytes changed is fetched
/// again, and the restore goes on: the store is never trusted unhashed.
#[test]
fn a_corrupt_chunk_in_the_chunk_store_is_fetched_again() {
    let env = TestEnv::new();
    let src = env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("big.bin"), 1_500_000, 9);
    env.bare_remote("origin.git");
    for w in ["work", "user"] {
        env.work_repo(w);
        env.git(w, ["remote", "add", "origin", "../origin.git"]);
        write_manifest(&env, w, "one");
    }
    run(env.xtask_in("work").args(["cache", "publish", "c"])).ok();
    run(env.xtask_in("user").args(["cache", "restore", "c"])).ok();
    let chunks = store(&env, "user", "cache.git").join("chunks");
    let files: Vec<PathBuf> = walk(&chunks);
    assert!(
        !files.is_empty(),
        "the chunk store is empty: {:?}",
        list(&chunks)
    );
    for f in &files {
        let mut bytes = std::fs::read(f).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0x55;
        std::fs::write(f, bytes).unwrap();
    }
    let r = run(env
        .xtask_in("user")
        .args(["cache", "restore", "c", "--verify"]));
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert_same_tree(&src, &env.join("user/restored"));
    let r = run(env.xtask_in("user").args(["cache", "verify", "c"]));
    assert_eq!(r.code(), 0, "{}", show(&r.out));
}
