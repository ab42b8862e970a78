//! A server without `uploadpack.allowFilter` (self-hosted git's default)
//! ignores `--filter` and sends every chunk. `cache list`/`status` must
//! never download one there: they ask first (the capability advertisement)
//! and read the branch only from a copy a restore already fetched, else say
//! why they did not. A restore there keeps one copy of the chunks, not two.
//! Real `git daemon` on 127.0.0.1; bytes on disk are the measure.

use crate::util::git_daemon::GitDaemon;
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Random, so zstd keeps it at its size: 12 chunks of 50 kB.
const ARTIFACT: u64 = 600_000;

struct Fx {
    env: TestEnv,
    _daemon: GitDaemon,
    work: PathBuf,
}

impl Fx {
    fn new(allow_filter: bool) -> Fx {
        let env = TestEnv::new();
        std::fs::create_dir_all(env.join("srv")).unwrap();
        env.bare_remote("srv/origin.git");
        env.git(
            "srv/origin.git",
            [
                "config",
                "uploadpack.allowFilter",
                &allow_filter.to_string(),
            ],
        );
        let daemon = GitDaemon::start(&env.join("srv"));
        let work = env.work_repo("work");
        env.git(
            "work",
            ["remote", "add", "origin", &daemon.url("origin.git")],
        );
        let src = env.join("src");
        std::fs::create_dir_all(&src).unwrap();
        write_pseudo_random(&src.join("noise.bin"), ARTIFACT, 9);
        let fx = Fx {
            env,
            _daemon: daemon,
            work,
        };
        fx.manifest("1");
        fx
    }

    fn manifest(&self, literal: &str) {
        let dir = self.work.join("cache-manifests");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("art.toml"),
            format!(
                "[cache]\nref = \"refs/warmstart/cache/art\"\n\n[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 50000\n\n[restore]\npath = \"restored/art\"\n",
                self.env.join("src").display()
            ),
        )
        .unwrap();
    }

    fn xtask(&self, args: &[&str]) -> Run {
        let mut cmd = self.env.xtask_in("work");
        cmd.env("WARMSTART_FETCH_BLOB_LIMIT", "8k").args(args);
        run(&mut cmd)
    }

    fn json(&self, args: &[&str]) -> Value {
        let r = self.xtask(args).ok();
        serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
    }

    /// This clone's state after a publish: as if freshly cloned.
    fn forget(&self) {
        std::fs::remove_dir_all(self.work.join(".git/warmstart")).unwrap();
    }

    fn bytes(&self, rel: &str) -> u64 {
        let p = self.work.join(".git/warmstart").join(rel);
        if p.exists() { du(&p) } else { 0 }
    }

    /// The remote part of `cache status --json` for `art`.
    fn branch_status(&self) -> Value {
        let s = self.json(&["cache", "status", "art", "--json"]);
        let all = s["caches"].as_array().cloned().unwrap_or_default();
        all.into_iter()
            .find(|c| c["name"] == "art")
            .unwrap_or_else(|| panic!("no art in {s}"))["remote_state"]
            .clone()
    }
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
    let fx = Fx::new(false);
    fx.json(&["cache", "publish", "art", "--json"]);
    fx.forget();
    let b = fx.branch_status();
    assert_eq!(b["state"], "unread", "{b}");
    let why = b["error"].as_str().unwrap();
    assert!(why.contains("uploadpack.allowFilter"), "{why}");
    assert!(why.contains("cache restore art"), "{why}");
    assert_eq!(b["commit"].as_str().unwrap().len(), 40, "{b}");
    let r = fx.xtask(&["cache", "list"]).ok();
    assert!(r.stdout().contains("unread"), "{}", show(&r.out));
    fx.xtask(&["cache", "status"]).ok();
    // Not one chunk: the metadata store holds at most its empty skeleton.
    let meta = fx.bytes("cache-meta.git/objects");
    assert!(meta < ARTIFACT / 20, "cache-meta.git received {meta} bytes");
    assert_eq!(fx.bytes("cache.git"), 0, "status never creates cache.git");

    // A restore fetches the chunks once, into cache.git, and keeps no
    // second copy in its chunk store or in cache-meta.git.
    let j = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["chunk_source"], "present", "{j}");
    let objects = fx.bytes("cache.git/objects");
    assert!(
        (ARTIFACT..ARTIFACT * 13 / 10).contains(&objects),
        "cache.git holds {objects}"
    );
    assert!(
        fx.bytes("cache.git/chunks") < 1000,
        "a second copy in the chunk store"
    );

    // Now status reads that copy: full details, still nothing downloaded.
    let b = fx.branch_status();
    assert_eq!(b["state"], "has key", "{b}");
    assert_eq!(b["keys"].as_array().unwrap().len(), 1, "{b}");
    let meta = fx.bytes("cache-meta.git/objects");
    assert!(meta < ARTIFACT / 20, "cache-meta.git received {meta} bytes");

    // Another publish moves the ref: not read again, and said so.
    fx.manifest("2");
    fx.json(&["cache", "publish", "art", "--json"]);
    std::fs::remove_dir_all(fx.work.join(".git/warmstart/cache.git")).unwrap();
    let b = fx.branch_status();
    assert_eq!(b["state"], "unread", "{b}");
    assert!(fx.bytes("cache-meta.git/objects") < ARTIFACT / 20);
}

#[test]
fn cache_nofilter_a_filtering_server_is_read_in_full_without_chunks() {
    let fx = Fx::new(true);
    fx.json(&["cache", "publish", "art", "--json"]);
    fx.forget();
    let b = fx.branch_status();
    assert_eq!(b["state"], "has key", "{b}");
    let meta = fx.bytes("cache-meta.git/objects");
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
