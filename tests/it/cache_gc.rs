//! `cache gc` and the restore's automatic gc, from the outside: a publisher
//! clone and a consumer clone share a bare origin; the consumer's restores
//! fill its chunk store (`WARMSTART_FETCH_BLOB_LIMIT` makes 16 kB chunks
//! "big", so they arrive through the direct reader into
//! `cache.git/chunks`), and gc must never remove a chunk an installed key
//! needs (a property over generated sequences of publishes, restores and
//! gc runs with random budgets), remove what nobody needs, leave everything
//! in place with `--dry-run`, run by itself past `WARMSTART_GC_SIZE` only,
//! and never break a restore that runs at the same time.

use crate::util::rng::Rng;
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, TestEnv, run, sha256sum, show};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Blobs of this size or more are left out of branch fetches here.
const LIMIT: &str = "2k";
/// The smallest chunk that goes to the chunk store (a smaller last chunk
/// arrives with the branch fetch, into cache.git's objects).
const BIG: u64 = 2 * 1024;

struct World {
    env: TestEnv,
}

impl World {
    /// origin.git, `pub` (publishes) and `work` (restores).
    fn new() -> World {
        let env = TestEnv::new();
        env.bare_remote("origin.git");
        for clone in ["pub", "work"] {
            env.work_repo(clone);
            env.git(clone, ["remote", "add", "origin", "../origin.git"]);
        }
        World { env }
    }

    fn src(&self, cache: &str) -> PathBuf {
        self.env.join(format!("src-{cache}"))
    }

    /// Cache `cache`'s manifest in `clone`, its key pinned to `version`.
    fn manifest(&self, clone: &str, cache: &str, version: u32) {
        let dir = self.env.join(clone).join("cache-manifests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join(format!("{cache}.toml")),
            format!(
                "[[key]]\nname = \"v\"\nliteral = \"{version}\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 64000\nchunk_avg = \"8KiB\"\n\n[restore]\npath = \"restored/{cache}\"\n",
                self.src(cache).display()
            ),
        )
        .unwrap();
    }

    fn ws(&self, clone: &str, args: &[&str], env: &[(&str, &str)]) -> Run {
        run(&mut self.cmd(clone, args, env))
    }

    fn cmd(&self, clone: &str, args: &[&str], env: &[(&str, &str)]) -> Command {
        let mut cmd = self.env.xtask_in(clone);
        cmd.env("WARMSTART_FETCH_BLOB_LIMIT", LIMIT).args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Publishes version `version` of `cache`: two files of noise, the
    /// first the same for every version of a cache (about 3 to 6 chunks).
    fn publish(&self, cache: &str, version: u32) {
        fill(&self.src(cache), cache, version);
        self.manifest("pub", cache, version);
        self.ws("pub", &["cache", "publish", cache], &[]).ok();
    }

    fn restore(&self, cache: &str, version: u32, env: &[(&str, &str)]) -> Value {
        self.manifest("work", cache, version);
        json(
            &self
                .ws("work", &["cache", "restore", cache, "--json"], env)
                .ok(),
        )
    }

    fn gc(&self, args: &[&str], env: &[(&str, &str)]) -> Value {
        let mut all = vec!["cache", "gc", "--json"];
        all.extend(args);
        json(&self.ws("work", &all, env).ok())
    }

    fn state(&self) -> PathBuf {
        self.env.join("work/.git/warmstart")
    }

    fn chunk_dir(&self) -> PathBuf {
        self.state().join("cache.git/chunks")
    }

    /// The chunk files in the consumer's store, with their sizes.
    fn chunks(&self) -> BTreeMap<String, u64> {
        let Ok(rd) = std::fs::read_dir(self.chunk_dir()) else {
            return BTreeMap::new();
        };
        rd.flatten()
            .filter(|e| e.file_name().len() == 64)
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().unwrap().len(),
                )
            })
            .collect()
    }

    /// The digests and sizes of the chunks of `key` on `cache`'s branch at
    /// origin that restores keep in the chunk store.
    fn key_chunks(&self, cache: &str, key: &str) -> Vec<(String, u64)> {
        let text = self.env.git(
            "origin.git",
            ["show", &format!("{cache}-cache:warmstart.json")],
        );
        let bm: Value = serde_json::from_str(&text).unwrap();
        bm["keys"][key]["chunks"]
            .as_array()
            .unwrap_or_else(|| panic!("no key {key} on {cache}: {bm:#}"))
            .iter()
            .map(|c| {
                (
                    c["sha256"].as_str().unwrap().to_string(),
                    c["size"].as_u64().unwrap(),
                )
            })
            .filter(|(_, size)| *size >= BIG)
            .collect()
    }

    /// Whether an installed key shares a chunk with a key that is not
    /// installed (of its branch or another cache's): the case where a gc
    /// that went by keys, not digests, would remove what the install needs.
    fn installed_shares_a_chunk(&self) -> bool {
        let branches = self
            .env
            .git("origin.git", ["for-each-ref", "--format=%(refname:short)"]);
        let mut all = Vec::new();
        for branch in branches.lines() {
            let cache = branch.trim_end_matches("-cache");
            let text = self
                .env
                .git("origin.git", ["show", &format!("{branch}:warmstart.json")]);
            let bm: Value = serde_json::from_str(&text).unwrap();
            for key in bm["keys"].as_object().unwrap().keys() {
                all.push((cache.to_string(), key.clone(), self.key_chunks(cache, key)));
            }
        }
        let installed = self.installed();
        all.iter()
            .filter(|(c, k, _)| installed.get(c) == Some(k))
            .any(|(c, k, mine)| {
                all.iter().any(|(c2, k2, theirs)| {
                    (c2 != c || k2 != k)
                        && installed.get(c2) != Some(k2)
                        && theirs.iter().any(|t| mine.contains(t))
                })
            })
    }

    /// The installed key of each cache, per its stamp.
    fn installed(&self) -> BTreeMap<String, String> {
        let dir = self.state().join("cache/stamps");
        let Ok(rd) = std::fs::read_dir(dir) else {
            return BTreeMap::new();
        };
        rd.flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let cache = name.strip_suffix(".json")?.to_string();
                let s: Value =
                    serde_json::from_str(&std::fs::read_to_string(e.path()).unwrap()).unwrap();
                Some((cache, s["key"].as_str().unwrap().to_string()))
            })
            .collect()
    }

    /// Every chunk each installed key needs is in the store, whole: hashed
    /// here by coreutils, not by warmstart. Returns their total size.
    fn assert_installed_chunks_present(&self, context: &str) -> u64 {
        let mut needed = BTreeMap::new();
        for (cache, key) in self.installed() {
            for (sha, size) in self.key_chunks(&cache, &key) {
                needed.insert(sha, (size, format!("{cache} {key}")));
            }
        }
        for (sha, (_, what)) in &needed {
            let path = self.chunk_dir().join(sha);
            assert!(
                path.is_file(),
                "{context}: chunk {sha} of installed {what} is gone"
            );
            assert_eq!(&sha256sum(&path), sha, "{context}: chunk {sha} damaged");
        }
        needed.values().map(|(s, _)| s).sum()
    }
}

/// The content of version `version` of `cache`, in `dir`.
fn fill(dir: &Path, cache: &str, version: u32) {
    let _ = std::fs::remove_dir_all(dir);
    // c2 holds what c0 holds, so the two caches' keys share chunks (as
    // keys of one cache do once chunks are cut by content).
    let named = if cache == "c2" { "c0" } else { cache };
    let seed = named.bytes().map(u64::from).sum::<u64>();
    // `big`: about 30 chunks, so that a restore is still reading when a
    // gc started after it runs (and warmstart.json and SHA256SUMS stay
    // under the blob limit: the branch fetch must bring them).
    let a = if cache == "big" { 500_000 } else { 30_000 };
    write_pseudo_random(&dir.join("a.bin"), a, seed);
    write_pseudo_random(
        &dir.join("b.bin"),
        20_000 + 7_000 * u64::from(version % 5),
        seed * 1000 + u64::from(version),
    );
}

fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// Bytes of every file under `dir`.
fn tree_size(dir: &Path) -> u64 {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                tree_size(&e.path())
            } else if t.is_file() {
                e.metadata().unwrap().len()
            } else {
                0
            }
        })
        .sum()
}

fn store_size(w: &World) -> u64 {
    tree_size(&w.state().join("cache.git")) + tree_size(&w.state().join("cache-meta.git"))
}

#[test]
fn cache_gc_never_removes_a_chunk_an_installed_stamp_needs() {
    const SEQUENCES: u64 = 4;
    const STEPS: usize = 12;
    let caches = ["c0", "c1", "c2"];
    let mut shared_cases = 0;
    for seq in 0..SEQUENCES {
        let w = World::new();
        let mut rng = Rng(0x5eed_0000 + seq);
        // Versions published per cache (1..=n).
        let mut published: BTreeMap<&str, u32> = BTreeMap::new();
        for step in 0..STEPS {
            let ctx = format!("sequence {seq} step {step}");
            let cache = *rng.pick(&caches);
            match rng.below(10) {
                0..=2 => {
                    let v = published.get(cache).copied().unwrap_or(0) + 1;
                    w.publish(cache, v);
                    published.insert(cache, v);
                }
                3..=6 => {
                    let Some(&n) = published.get(cache) else {
                        continue;
                    };
                    let v = 1 + rng.below(n as usize) as u32;
                    let doc = w.restore(cache, v, &[("WARMSTART_GC_SIZE", "1T")]);
                    assert!(
                        ["restored", "warm"].contains(&doc["state"].as_str().unwrap()),
                        "{ctx}: {doc:#}"
                    );
                }
                _ => {
                    let max = *rng.pick(&["0", "20k", "60k", "150k", "1G"]);
                    let keep = *rng.pick(&["0s", "0s", "1h"]);
                    let before = w.chunks();
                    let dry = w.gc(&["--max-size", max, "--keep-for", keep, "--dry-run"], &[]);
                    assert_eq!(w.chunks(), before, "{ctx}: --dry-run removed something");
                    let doc = w.gc(&["--max-size", max, "--keep-for", keep], &[]);
                    assert_eq!(
                        doc["chunks"]["removed"], dry["chunks"]["removed"],
                        "{ctx}: the dry run said otherwise\n{dry:#}\n{doc:#}"
                    );
                    if w.installed_shares_a_chunk() {
                        shared_cases += 1;
                    }
                    let needed = w.assert_installed_chunks_present(&ctx);
                    let chunk_bytes: u64 = w.chunks().values().sum();
                    let total = store_size(&w);
                    let other = total - chunk_bytes;
                    let max_bytes = doc["max_bytes"].as_u64().unwrap();
                    assert_eq!(doc["after_bytes"].as_u64(), Some(total), "{ctx}: {doc:#}");
                    assert_eq!(
                        doc["chunks"]["protected_bytes"].as_u64(),
                        Some(needed),
                        "{ctx}: {doc:#}"
                    );
                    if other + needed <= max_bytes {
                        assert!(total <= max_bytes, "{ctx}: {total} > {max_bytes}\n{doc:#}");
                    }
                    if keep == "0s" {
                        // Nothing unneeded survives a zero keep window.
                        assert_eq!(
                            chunk_bytes, needed,
                            "{ctx}: unneeded chunks stayed\n{doc:#}"
                        );
                    }
                }
            }
            w.assert_installed_chunks_present(&ctx);
        }
        // Offline re-verify: every installed copy checks against chunks
        // from the store alone (nothing fetched), and the branch verifies.
        for (cache, _) in w.installed() {
            let r = w.ws(
                "work",
                &["cache", "restore", &cache, "--verify", "--json"],
                &[],
            );
            let doc = json(&r.ok());
            assert_eq!(doc["state"], "verified", "sequence {seq} {cache}: {doc:#}");
            assert_eq!(doc["chunks_fetched"], 0, "sequence {seq} {cache}: {doc:#}");
            w.ws("work", &["cache", "verify", &cache], &[]).ok();
        }
    }
    assert!(
        shared_cases > 0,
        "no gc ran while an installed key shared a chunk with another key"
    );
}

/// `work` with `c0` version 1 restored, then version 2: version 1's own
/// chunks are now needed by nobody.
fn two_versions() -> World {
    let w = World::new();
    w.publish("c0", 1);
    w.publish("c0", 2);
    w.restore("c0", 1, &[]);
    w.restore("c0", 2, &[]);
    w
}

#[test]
fn cache_gc_removes_unneeded_chunks_and_shrinks_the_store() {
    let w = two_versions();
    let stamp = std::fs::read(w.state().join("cache/stamps/c0.json")).unwrap();
    let v2: BTreeSet<String> = w
        .key_chunks("c0", &w.installed()["c0"])
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let before = w.chunks();
    let only_v1: Vec<&String> = before.keys().filter(|s| !v2.contains(*s)).collect();
    assert!(
        !only_v1.is_empty(),
        "version 1 has chunks of its own: {before:?}"
    );
    let size_before = store_size(&w);

    // Within the keep window and under the budget: everything stays.
    let doc = w.gc(&[], &[]);
    assert_eq!(doc["chunks"]["removed"], 0, "{doc:#}");
    assert_eq!(w.chunks(), before);

    let dry = w.gc(&["--keep-for", "0s", "--dry-run"], &[]);
    assert_eq!(dry["dry_run"], true);
    assert_eq!(dry["chunks"]["removed"], only_v1.len(), "{dry:#}");
    assert_eq!(w.chunks(), before, "--dry-run removed a chunk");

    let doc = w.gc(&["--keep-for", "0s"], &[]);
    assert_eq!(doc["chunks"]["removed"], only_v1.len(), "{doc:#}");
    let after = w.chunks();
    assert_eq!(after.keys().cloned().collect::<BTreeSet<_>>(), v2);
    assert!(store_size(&w) < size_before, "{doc:#}");
    // The install and its stamp are untouched, and the next run is warm.
    assert_eq!(
        std::fs::read(w.state().join("cache/stamps/c0.json")).unwrap(),
        stamp
    );
    let warm = w.restore("c0", 2, &[]);
    assert_eq!(warm["state"], "warm", "{warm:#}");

    // Over budget with nothing unneeded left: the needed chunks stay.
    let doc = w.gc(&["--max-size", "0", "--keep-for", "0s"], &[]);
    assert_eq!(doc["chunks"]["removed"], 0, "{doc:#}");
    assert_eq!(w.chunks(), after);
}

#[test]
fn cache_gc_drops_refs_and_objects_of_caches_no_manifest_names() {
    let w = World::new();
    w.publish("c0", 1);
    w.publish("c1", 1);
    w.restore("c0", 1, &[]);
    w.restore("c1", 1, &[]);
    // c1 is published again, so cache.git's first fetch of it is unreachable
    // once the ref moves; then its manifest goes away.
    w.publish("c1", 2);
    w.restore("c1", 2, &[]);
    let refs = |store: &str| {
        w.env.git(
            "work",
            [
                "--git-dir",
                &format!(".git/warmstart/{store}"),
                "for-each-ref",
                "--format=%(refname)",
            ],
        )
    };
    // cache-meta.git is where `cache status` reads branches.
    w.ws("work", &["cache", "status"], &[]).ok();
    std::fs::remove_file(w.env.join("work/cache-manifests/c1.toml")).unwrap();
    assert!(refs("cache.git").contains("refs/warmstart/c1-cache"));
    assert!(refs("cache-meta.git").contains("refs/warmstart/c1-cache"));
    // A ref under refs/warmstart/ that is no cache branch (another
    // command's temporary ref) is not gc's to drop.
    let store = ["--git-dir", ".git/warmstart/cache.git"];
    let git = |args: &[&str]| {
        let all: Vec<&str> = store.iter().chain(args).copied().collect();
        w.env.git("work", all).trim().to_string()
    };
    let tree = git(&["mktree"]);
    let commit = git(&["commit-tree", &tree, "-m", "not a cache"]);
    git(&["update-ref", "refs/warmstart/tmp/push-1", &commit]);
    let doc = w.gc(&["--dry-run"], &[]);
    assert!(
        refs("cache.git").contains("refs/warmstart/c1-cache"),
        "{doc:#}"
    );
    let doc = w.gc(&[], &[]);
    let store = &doc["stores"][0];
    assert_eq!(store["store"], "cache.git", "{doc:#}");
    assert_eq!(
        store["refs_dropped"],
        serde_json::json!(["c1-cache"]),
        "{doc:#}"
    );
    assert!(store["objects_dropped"].as_u64().unwrap() > 0, "{doc:#}");
    assert!(
        store["after_bytes"].as_u64() < store["before_bytes"].as_u64(),
        "{doc:#}"
    );
    let meta = &doc["stores"][1];
    assert_eq!(meta["store"], "cache-meta.git", "{doc:#}");
    assert_eq!(
        meta["refs_dropped"],
        serde_json::json!(["c1-cache"]),
        "{doc:#}"
    );
    assert!(!refs("cache-meta.git").contains("c1-cache"));
    let left = refs("cache.git");
    assert!(
        !left.contains("c1-cache") && left.contains("c0-cache"),
        "{left}"
    );
    // c1 is still installed: its chunks stay although no manifest names it.
    w.assert_installed_chunks_present("after the manifest went");
    // The store still works: c0 verifies, a new c0 key restores.
    w.ws("work", &["cache", "verify", "c0"], &[]).ok();
    w.publish("c0", 2);
    let doc = w.restore("c0", 2, &[]);
    assert_eq!(doc["state"], "restored", "{doc:#}");
}

#[test]
fn cache_gc_keeps_every_chunk_when_it_cannot_tell_what_an_install_needs() {
    let w = two_versions();
    let needs = w.state().join("cache/needs/c0.json");
    assert!(needs.is_file());
    // Without its record, the install's chunks are read from its commit.
    std::fs::remove_file(&needs).unwrap();
    let doc = w.gc(&["--keep-for", "0s", "--max-size", "0"], &[]);
    assert!(doc["chunks"]["removed"].as_u64().unwrap() > 0, "{doc:#}");
    w.assert_installed_chunks_present("record removed");
    // A stamp naming a commit cache.git lacks: nothing can be told, so
    // nothing is removed, and the report says which install.
    w.restore("c0", 1, &[]);
    std::fs::remove_file(&needs).unwrap();
    let stamp_file = w.state().join("cache/stamps/c0.json");
    let mut stamp: Value =
        serde_json::from_str(&std::fs::read_to_string(&stamp_file).unwrap()).unwrap();
    stamp["commit"] = "0123456789abcdef0123456789abcdef01234567".into();
    std::fs::write(&stamp_file, serde_json::to_string(&stamp).unwrap()).unwrap();
    let before = w.chunks();
    let r = w
        .ws(
            "work",
            &["cache", "gc", "--keep-for", "0s", "--max-size", "0"],
            &[],
        )
        .ok();
    assert!(
        r.stdout().contains("cannot tell what c0"),
        "{}",
        show(&r.out)
    );
    assert_eq!(w.chunks(), before);
}

#[test]
fn cache_gc_runs_after_a_restore_over_the_size_and_not_under() {
    let w = World::new();
    w.publish("c0", 1);
    w.publish("c0", 2);
    w.restore("c0", 1, &[]);
    let before = w.chunks();
    // Under the size: nothing is removed, and nothing is said.
    let mut cmd = w.cmd(
        "work",
        &["cache", "restore", "c0"],
        &[("WARMSTART_GC_SIZE", "1G")],
    );
    w.manifest("work", "c0", 2);
    let r = run(&mut cmd).ok();
    assert!(!r.stderr().contains("cache gc"), "{}", show(&r.out));
    let v2: BTreeSet<String> = w
        .key_chunks("c0", &w.installed()["c0"])
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    let all = w.chunks();
    assert!(
        before.keys().all(|k| all.contains_key(k)),
        "version 1's chunks stayed"
    );
    assert!(all.len() > v2.len());

    // Over the size: the restore ends with gc, which leaves only what the
    // installed key needs (the budget is below it), and says so once.
    w.manifest("work", "c0", 1);
    let r = run(&mut w.cmd(
        "work",
        &["cache", "restore", "c0"],
        &[("WARMSTART_GC_SIZE", "1k")],
    ))
    .ok();
    let stderr = r.stderr();
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("cache gc")).collect();
    assert_eq!(lines.len(), 1, "{}", show(&r.out));
    let v1: BTreeSet<String> = w
        .key_chunks("c0", &w.installed()["c0"])
        .into_iter()
        .map(|(s, _)| s)
        .collect();
    assert_eq!(w.chunks().keys().cloned().collect::<BTreeSet<_>>(), v1);
    w.assert_installed_chunks_present("after the automatic gc");
}

#[test]
fn cache_gc_and_a_concurrent_restore_both_succeed() {
    let w = two_versions();
    let dest = w.env.join("work/restored/c0");
    // gc holds the use lock for a while; a restore started meanwhile waits
    // for it, then installs (refetching what gc removed).
    for round in 0..2u32 {
        let version = 1 + round % 2;
        let mut gc = w
            .cmd(
                "work",
                &["cache", "gc", "--keep-for", "0s", "--max-size", "0"],
                &[("WARMSTART_TEST_GC_PAUSE_MS", "1500")],
            )
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let doc = w.restore("c0", version, &[]);
        assert_eq!(doc["state"], "restored", "round {round}: {doc:#}");
        assert!(gc.wait().unwrap().success(), "round {round}: gc failed");
        w.assert_installed_chunks_present(&format!("round {round}"));
        let want = w.env.join(format!("want-{round}"));
        fill(&want, "c0", version);
        crate::util::tree::assert_same_tree(&want, &dest);
    }
    // A restore of about 30 chunks with gc runs started while it reads
    // them: gc (keep 0s) wants every chunk not yet installed gone, the
    // very ones the restore fetched and is about to read. Both succeed.
    w.publish("big", 1);
    w.publish("big", 2);
    for round in 0..4u32 {
        let version = 1 + round % 2;
        w.manifest("work", "big", version);
        let mut restore = w.cmd("work", &["cache", "restore", "big", "--json"], &[]);
        let mut gc = w.cmd("work", &["cache", "gc", "--keep-for", "0s", "--json"], &[]);
        let r = restore.spawn().unwrap();
        let mut gcs = Vec::new();
        for _ in 0..3 {
            std::thread::sleep(std::time::Duration::from_millis(150));
            gcs.push(gc.spawn().unwrap());
        }
        let r = r.wait_with_output().unwrap();
        assert!(r.status.success(), "round {round}: restore\n{}", show(&r));
        for g in gcs {
            let g = g.wait_with_output().unwrap();
            assert!(g.status.success(), "round {round}: gc\n{}", show(&g));
        }
        w.assert_installed_chunks_present(&format!("concurrent round {round}"));
    }
}

#[test]
fn cache_gc_busy_store_and_bad_settings_are_refused() {
    let w = two_versions();
    let stamp = std::fs::read(w.state().join("cache/stamps/c0.json")).unwrap();
    let before = w.chunks();
    let mut gc = w
        .cmd(
            "work",
            &["cache", "gc"],
            &[("WARMSTART_TEST_GC_PAUSE_MS", "2000")],
        )
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(400));
    // A restore that cannot wait that long is busy (3), and installs nothing.
    w.manifest("work", "c0", 1);
    let r = w.ws(
        "work",
        &["cache", "restore", "c0"],
        &[("WARMSTART_LOCK_TIMEOUT", "200ms")],
    );
    let r = r.expect_code(3);
    assert!(
        r.stderr().contains("cache.git.use.lock"),
        "{}",
        show(&r.out)
    );
    assert_eq!(r.stderr().trim().lines().count(), 1, "{}", show(&r.out));
    // So is a second gc.
    w.ws(
        "work",
        &["cache", "gc"],
        &[("WARMSTART_LOCK_TIMEOUT", "200ms")],
    )
    .expect_code(3);
    assert!(gc.wait().unwrap().success());
    assert_eq!(
        std::fs::read(w.state().join("cache/stamps/c0.json")).unwrap(),
        stamp
    );
    assert_eq!(w.chunks(), before);

    for (args, env, code, says) in [
        (vec!["--max-size", "12MB"], vec![], 2, "ambiguous"),
        (vec!["--max-size", "lots"], vec![], 2, "not a size"),
        (vec!["--keep", "soon"], vec![], 2, "--keep"),
        (
            vec![],
            vec![("WARMSTART_GC_SIZE", "lots")],
            10,
            "WARMSTART_GC_SIZE",
        ),
        (
            vec![],
            vec![("WARMSTART_GC_KEEP", "forever")],
            10,
            "WARMSTART_GC_KEEP",
        ),
    ] {
        let mut all = vec!["cache", "gc"];
        all.extend(args.iter().copied());
        let r = w.ws("work", &all, &env).expect_code(code);
        assert!(
            r.stderr().contains(says),
            "{args:?} {env:?}\n{}",
            show(&r.out)
        );
    }
    assert_eq!(w.chunks(), before, "a refused gc removed something");
}

/// Sets the mtime of `path` to `days` days ago.
fn age(path: &Path, days: u64) {
    let t = std::time::SystemTime::now() - std::time::Duration::from_secs(days * 24 * 3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

#[test]
fn cache_gc_removes_old_logs_of_steps_restore_toml_no_longer_names() {
    let w = World::new();
    std::fs::create_dir_all(w.env.join("work/cache-manifests")).unwrap();
    std::fs::write(
        w.env.join("work/cache-manifests/restore.toml"),
        "[[step]]\nname = \"hello\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"hello.txt\"\n",
    )
    .unwrap();
    let logs = w.state().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let write = |name: &str, bytes: usize, days: u64| {
        let p = logs.join(name);
        std::fs::write(&p, "a line of output\n".repeat(bytes / 17 + 1)).unwrap();
        age(&p, days);
        p
    };
    let named_old = write("hello.log", 100, 90);
    let gone_old = write("retired.log", 100, 31);
    let gone_service = write("old-lsp.service.log", 100, 45);
    let gone_recent = write("recent.log", 100, 3);
    let worker = write("restore-worker.log", 3 << 20, 1);
    let dry = w.gc(&["--dry-run"], &[]);
    assert_eq!(
        dry["logs"]["removed"].as_array().unwrap().len(),
        2,
        "{dry:#}"
    );
    assert!(gone_old.exists() && gone_service.exists());
    assert!(std::fs::metadata(&worker).unwrap().len() > 3 << 20);
    // The plan loads (else no log would go).
    w.ws("work", &["restore", "--dry-run"], &[]).ok();
    let doc = w.gc(&[], &[]);
    let removed: BTreeSet<String> = doc["logs"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        removed,
        [&gone_old, &gone_service]
            .iter()
            .map(|p| p.display().to_string())
            .collect(),
        "{doc:#}"
    );
    assert!(!gone_old.exists() && !gone_service.exists());
    // The log of a step restore.toml names is its latest, however old.
    assert!(named_old.exists() && gone_recent.exists());
    let len = std::fs::metadata(&worker).unwrap().len();
    assert!(len <= 257 << 10 && len > 200 << 10, "{len}\n{doc:#}");
    let text = std::fs::read_to_string(&worker).unwrap();
    assert!(text.starts_with("[older lines removed by cache gc]\na line of output\n"));

    // restore.toml that does not load: no log goes.
    let kept = write("another.log", 100, 60);
    std::fs::write(w.env.join("work/cache-manifests/restore.toml"), "[[step]\n").unwrap();
    let doc = w.gc(&[], &[]);
    assert_eq!(doc["logs"]["removed"], serde_json::json!([]), "{doc:#}");
    assert!(kept.exists());
}

#[test]
fn cache_gc_keeps_the_objects_of_an_installed_commit_after_its_branch_moved() {
    let w = World::new();
    w.publish("c0", 1);
    w.restore("c0", 1, &[]);
    let stamp_file = w.state().join("cache/stamps/c0.json");
    let commit_of = || -> String {
        let s: Value =
            serde_json::from_str(&std::fs::read_to_string(&stamp_file).unwrap()).unwrap();
        s["commit"].as_str().unwrap().to_string()
    };
    let installed = commit_of();
    let present = |oid: &str| {
        let mut cmd = Command::new("git");
        w.env.isolate(&mut cmd);
        cmd.current_dir(w.env.join("work"))
            .env("GIT_NO_LAZY_FETCH", "1")
            .args([
                "--git-dir",
                ".git/warmstart/cache.git",
                "cat-file",
                "-e",
                oid,
            ]);
        cmd.status().unwrap().success()
    };
    // What cache.git holds of the installed commit: its tree and the
    // blobs the branch fetch brought (the small files, the last chunk).
    let tree = format!("{installed}^{{tree}}");
    let listing = w.env.git(
        "work",
        [
            "--git-dir",
            ".git/warmstart/cache.git",
            "ls-tree",
            &installed,
        ],
    );
    let held: Vec<String> = listing
        .lines()
        .map(|l| l.split_whitespace().nth(2).unwrap().to_string())
        .filter(|o| present(o))
        .collect();
    assert!(present(&tree) && held.len() >= 3, "{listing}");
    // The branch moves on (a verify fetches it) while v1 stays installed.
    w.publish("c0", 2);
    w.manifest("work", "c0", 2);
    w.ws("work", &["cache", "verify", "c0"], &[]).ok();
    let doc = w.gc(&["--keep-for", "0s"], &[]);
    assert!(present(&tree), "{doc:#}");
    for o in &held {
        assert!(present(o), "blob {o} of the installed commit went\n{doc:#}");
    }
    // Once v2 is installed, nothing holds v1's commit: its objects go.
    w.restore("c0", 2, &[]);
    assert_ne!(commit_of(), installed);
    let doc = w.gc(&["--keep-for", "0s"], &[]);
    assert!(
        doc["stores"][0]["objects_dropped"].as_u64().unwrap() > 0,
        "{doc:#}"
    );
    assert!(!present(&tree), "{doc:#}");
    w.ws("work", &["cache", "restore", "c0", "--verify"], &[])
        .ok();
}
