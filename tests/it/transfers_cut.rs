//! Links that cut every connection after a few MB (a real `git daemon`
//! behind a real TCP relay on 127.0.0.1): a restore keeps every chunk that
//! arrived whole and asks again only for the rest, so it completes (over
//! ssh behind the same relay too), and
//! leaves none of git's partial packs; a chunk bigger than what one
//! connection carries is named, with its size and the cut, in one line.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::relay::CuttingRelay;
use crate::util::servers::Sshd;
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, show, stored_chunks};
use serde_json::Value;
use std::path::Path;
use std::sync::atomic::Ordering;

/// A cache `art` of `noise` pseudo-random bytes in chunks of `chunk`
/// bytes, published to `srv/origin.git` (served by `git daemon`); then
/// forgotten, so that the next restore is a fresh clone's. Chunks of 32 KiB
/// or more are fetched by id, not with the branch.
fn published(noise: u64, chunk: u64) -> (Fixture, Value) {
    let fx = Fixture::served().with_var("WARMSTART_FETCH_BLOB_LIMIT", "32k");
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), noise, 11);
    let m = Manifest::literal("1", &src).chunk_bytes(chunk);
    fx.write_manifest("art", &m);
    let j = fx.publish("art");
    fx.forget();
    (fx, j)
}

/// git's temporary files in the private store: `tmp_pack_*`, `tmp_idx_*`
/// and `tmp_objdir-*`, anywhere under `objects/`.
fn git_temp_files(work: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut dirs = vec![work.join(".git/warmstart/cache.git/objects")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("tmp_") || name.starts_with("tmp_objdir") {
                found.push(e.path().display().to_string());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    found
}

fn restore_via(fx: &Fixture, url: &str) -> Run {
    let args = [
        "cache",
        "restore",
        "art",
        "--remote",
        url,
        "--json",
        "--stall-timeout",
        "10s",
    ];
    fx.xtask(&args)
}

/// Restores through `url` (a link that cuts) until a run succeeds, at
/// most 4 runs, each failed one keeping more chunks than the last; the
/// result is the published tree and no partial file of git's is left.
fn completes_through(fx: &Fixture, url: &str, relay: &CuttingRelay) {
    let mut kept = Vec::new();
    let mut done = None;
    for _ in 0..4 {
        let r = restore_via(fx, url);
        kept.push(stored_chunks(&fx.work));
        if r.code() == 0 {
            done = Some(r);
            break;
        }
        // A failed run must have made progress: more chunks than before.
        let before = kept.len().checked_sub(2).map_or(0, |i| kept[i]);
        assert!(
            *kept.last().unwrap() > before,
            "a cut run kept nothing new (stored after each run: {kept:?})\n{}",
            show(&r.out)
        );
    }
    let r = done.unwrap_or_else(|| panic!("not restored in 4 runs (stored after each: {kept:?})"));
    let j: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(j["state"], "restored", "{j}");
    assert!(
        relay.cuts.load(Ordering::SeqCst) >= 2,
        "the link cut connections ({} cuts)",
        relay.cuts.load(Ordering::SeqCst)
    );
    assert!(
        std::fs::read(fx.env.join("src/noise.bin")).unwrap()
            == std::fs::read(fx.work.join("restored/art/noise.bin")).unwrap_or_default(),
        "the restored tree is the published one"
    );
    let left = git_temp_files(&fx.work);
    assert!(left.is_empty(), "git's partial files left: {left:?}");
}

/// 12 MB of noise in 1 MB chunks, for a link that cuts each connection
/// after 2.5 MB: no batch passes whole.
const NOISE: u64 = 12_000_000;
const CHUNK: u64 = 1_000_000;
const CUT: u64 = 2_500_000;

#[test]
fn transfers_cut_over_git_daemon_keep_every_whole_chunk_and_complete_without_partial_packs() {
    let (fx, published) = published(NOISE, CHUNK);
    let big = published["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["size"].as_u64().unwrap() >= 32 * 1024)
        .count();
    assert!(big >= 8, "{published}");
    let relay = CuttingRelay::start(fx.daemon().port, CUT);
    completes_through(&fx, &relay.git_url("origin.git"), &relay);
}

#[test]
fn transfers_cut_over_ssh_keep_every_whole_chunk_and_complete_without_partial_packs() {
    let (fx, _) = published(NOISE, CHUNK);
    let sshd = Sshd::start();
    let relay = CuttingRelay::start(sshd.port, CUT);
    // The relay's port, the server's host key.
    let ssh = format!(
        "{} -o HostKeyAlias=[127.0.0.1]:{}",
        sshd.ssh_command(&sshd.key),
        sshd.port
    );
    let fx = fx.with_var("GIT_SSH_COMMAND", &ssh);
    let url = format!("ssh://root@127.0.0.1:{}{}", relay.port, fx.origin.display());
    completes_through(&fx, &url, &relay);
}

#[test]
fn transfers_cut_a_chunk_bigger_than_one_connection_carries_is_named_with_its_size_and_the_cut() {
    // 3 MB chunks of noise through a link that cuts at 1.5 MB.
    let (fx, published) = published(6_000_000, 3_000_000);
    let relay = CuttingRelay::start(fx.daemon().port, 1_500_000);
    let r = restore_via(&fx, &relay.git_url("origin.git")).expect_code(8);
    let err = r.stderr();
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "one error line\n{}", show(&r.out));
    let line = errors[0];
    let named = published["chunks"].as_array().unwrap().iter().find(|c| {
        line.contains(c["file"].as_str().unwrap())
            && line.contains(&format!("{} bytes", c["size"].as_u64().unwrap()))
    });
    assert!(named.is_some(), "the chunk and its size are named: {line}");
    assert!(line.contains("cut after"), "where the cut fell: {line}");
    assert!(line.contains("chunk_bytes"), "what to change: {line}");
    assert!(!fx.work.join("restored/art").exists(), "nothing installed");
    let left = git_temp_files(&fx.work);
    assert!(left.is_empty(), "git's partial files left: {left:?}");
}
