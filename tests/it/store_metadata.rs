//! Damaged store metadata heals: a cache.git whose `shallow`, `config` or `HEAD` is garbage or gone, or that is a file, is rebuilt in one run, keeping its verified chunks; an unreachable remote rebuilds nothing.
//!
//! Before, a garbage `shallow` or `config` made every restore exit 8
//! ("remote unreachable"), a store without HEAD exit 1 (`Directory not
//! empty`), and a cache.git that was a file was never healed.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, run, show};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Cache `art` (chunks of 20 kB, those of 8 kB or more fetched by id)
/// published from `work` and restored there from a fresh store, so that
/// cache.git holds the branch and a chunk store of verified chunks.
fn restored() -> Fixture {
    let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", "8k");
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("small.txt"), "small\n").unwrap();
    write_pseudo_random(&src.join("big.bin"), 120_000, 5);
    fx.write_manifest("art", &Manifest::literal("1", &src).chunk_bytes(20000));
    fx.publish("art");
    fx.forget();
    fx.restore("art");
    fx
}

fn cache_git(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart/cache.git")
}

/// The chunk files of the chunk store, by name, with their inodes.
fn chunk_files(store: &Path) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = std::fs::read_dir(store.join("chunks"))
        .map(|d| {
            d.flatten()
                .map(|e| {
                    let ino = e.metadata().unwrap().ino();
                    (e.file_name().to_string_lossy().into_owned(), ino)
                })
                .collect()
        })
        .unwrap_or_default();
    found.sort();
    found
}

/// The run exited 0 and warned exactly once that `store` was rebuilt.
fn assert_rebuilt_once(r: &Run, store: &Path, what: &str) {
    assert_eq!(r.code(), 0, "{what}: {}", show(&r.out));
    let name = store.display().to_string();
    let warnings: Vec<String> = r
        .stderr()
        .lines()
        .filter(|l| l.contains("rebuilt"))
        .map(str::to_string)
        .collect();
    assert_eq!(warnings.len(), 1, "{what}: {}", show(&r.out));
    assert!(
        warnings[0].starts_with("warning: ") && warnings[0].contains(&name),
        "{what}: {}",
        show(&r.out)
    );
}

#[test]
fn store_metadata_each_kind_of_damage_is_healed_in_one_run_keeping_the_verified_chunks() {
    type Damage = fn(&Path);
    let kinds: [(&str, Damage, bool); 6] = [
        (
            "chunks a file",
            |s| {
                std::fs::remove_dir_all(s.join("chunks")).unwrap();
                std::fs::write(s.join("chunks"), "not a chunk store\n").unwrap();
            },
            false,
        ),
        (
            "a garbage shallow file",
            |s| std::fs::write(s.join("shallow"), "not a commit id\n").unwrap(),
            true,
        ),
        (
            "a garbage config file",
            |s| std::fs::write(s.join("config"), "[[[ not a config \u{1}\n").unwrap(),
            true,
        ),
        (
            "no HEAD",
            |s| std::fs::remove_file(s.join("HEAD")).unwrap(),
            true,
        ),
        (
            "HEAD a directory",
            |s| {
                std::fs::remove_file(s.join("HEAD")).unwrap();
                std::fs::create_dir(s.join("HEAD")).unwrap();
            },
            true,
        ),
        (
            "cache.git a file",
            |s| {
                std::fs::remove_dir_all(s).unwrap();
                std::fs::write(s, "not a store\n").unwrap();
            },
            false,
        ),
    ];
    let fx = restored();
    let store = cache_git(&fx);
    for (what, damage, keeps_chunks) in kinds {
        let before = chunk_files(&store);
        assert!(!before.is_empty(), "{what}: the restore stored chunks");
        damage(&store);
        let r = run(&mut fx.command(&["cache", "restore", "art", "--verify"]));
        assert_rebuilt_once(&r, &store, what);
        assert!(store.join("HEAD").is_file(), "{what}: a store again");
        assert!(fx.work.join("restored/art/big.bin").is_file(), "{what}");
        if keeps_chunks {
            // The same files, moved (their inodes), not fetched again.
            let after: Vec<(String, u64)> = chunk_files(&store)
                .into_iter()
                .filter(|c| before.contains(c))
                .collect();
            assert_eq!(after, before, "{what}: the chunks were kept");
        }
        // The next run finds nothing to heal.
        let r = run(&mut fx.command(&["cache", "restore", "art", "--verify"]));
        assert_eq!(r.code(), 0, "{what}: {}", show(&r.out));
        assert!(!r.stderr().contains("rebuilt"), "{what}: {}", show(&r.out));
    }
}

#[test]
fn store_metadata_an_unreachable_remote_rebuilds_nothing() {
    let fx = restored();
    let store = cache_git(&fx);
    let inode = std::fs::metadata(&store).unwrap().ino();
    let chunks = chunk_files(&store);
    let gone = fx.env.join("gone.git");
    for url in [
        gone.display().to_string(),
        "git://127.0.0.1:9/origin.git".to_string(),
    ] {
        fx.env.git("work", ["remote", "set-url", "origin", &url]);
        let r = run(&mut fx.command(&["cache", "restore", "art", "--verify"]));
        assert_eq!(r.code(), 8, "{url}: {}", show(&r.out));
        assert!(!r.stderr().contains("rebuilt"), "{url}: {}", show(&r.out));
        assert!(!r.stderr().contains("damaged"), "{url}: {}", show(&r.out));
        assert_eq!(std::fs::metadata(&store).unwrap().ino(), inode, "{url}");
        assert_eq!(chunk_files(&store), chunks, "{url}");
    }
}
