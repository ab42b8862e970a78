//! A publish from the clone that made the last pack takes the chunks of
//! its unchanged files from that pack's record: not cut, hashed or stored
//! again (`chunks_unchanged`). The key it makes is the one a clone with no
//! record makes of the same tree, chunk for chunk; and a file changed
//! behind the record (content with the mtime put back, mode, a rename, a
//! kind change, a size change, a new neighbour), at the start, middle or
//! end of the tar, is never taken as unchanged: the restored tree is the
//! tree as it is.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::{assert_same_tree, write_pseudo_random};
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const FILES: u64 = 60;

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn name(i: u64) -> String {
    format!("f{i:02}.bin")
}

fn manifest(fx: &Fixture, repo: &str, literal: &str) {
    Manifest::literal(literal, src(fx))
        .publish("chunk_avg = \"64KiB\"")
        .restore_path(fx.env.join(format!("dest-{repo}")))
        .write(&fx.env.join(repo), "art");
}

/// 60 files of 40 kB of noise, older than the racy window of the publish
/// that follows (files written in the 2 s before a pack began are read
/// again by the next, whatever their lstat says).
fn art_cache() -> Fixture {
    let fx = Fixture::new();
    for i in 0..FILES {
        write_pseudo_random(&src(&fx).join(name(i)), 40_000, i + 1);
    }
    manifest(&fx, "work", "1");
    std::thread::sleep(Duration::from_millis(2100));
    fx
}

fn chunk_shas(published: &Value) -> Vec<String> {
    (published["chunks"].as_array().unwrap().iter())
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect()
}

/// Sets `path`'s mtime back to `(secs, nsecs)` (its ctime moves: user
/// space cannot set that).
fn put_mtime_back(path: &Path, (secs, nsecs): (i64, i64)) {
    let ok = Command::new("touch")
        .args(["-m", "-h", "-d", &format!("@{secs}.{nsecs:09}")])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "touch {}", path.display());
}

fn mtime(path: &Path) -> (i64, i64) {
    let md = std::fs::symlink_metadata(path).unwrap();
    (md.mtime(), md.mtime_nsec())
}

#[test]
fn publish_unchanged_takes_unchanged_files_chunks_from_its_record_and_makes_the_key_a_full_pack_makes()
 {
    let fx = art_cache();
    let one = fx.publish("art");
    assert_eq!(one["chunks_unchanged"], 0, "no record yet: {one}");

    // 2 of 60 files, one at the start of the tar, rewritten in place.
    for i in [0, 30] {
        write_pseudo_random(&src(&fx).join(name(i)), 40_000, 1000 + i);
    }
    manifest(&fx, "work", "2");
    let two = fx.publish("art");
    let n = two["chunks"].as_array().unwrap().len() as u64;
    let unchanged = two["chunks_unchanged"].as_u64().unwrap();
    assert!(
        unchanged * 10 >= n * 7,
        "{unchanged} of {n} chunks from the record: {two}"
    );
    assert!(unchanged <= two["chunks_reused"].as_u64().unwrap(), "{two}");

    // A clone with no record reads and cuts everything: the same tar, the
    // same chunks.
    let fresh = fx.clone_repo("fresh");
    manifest(&fx, "fresh", "3");
    let three = fx.json_in(&fresh, &["cache", "publish", "art", "--json"]);
    assert_eq!(three["chunks_unchanged"], 0, "{three}");
    assert_eq!(three["tar_sha256"], two["tar_sha256"], "{three}\n{two}");
    assert_eq!(chunk_shas(&three), chunk_shas(&two));

    // And the key restores to the tree.
    let r = fx.clone_repo("r");
    manifest(&fx, "r", "2");
    fx.json_in(&r, &["cache", "restore", "art", "--json"]);
    assert_same_tree(&src(&fx), &fx.env.join("dest-r"));
}

/// One way to change file `i` behind the record.
type Edit = fn(&Path, u64);

fn same_size_content_mtime_back(dir: &Path, i: u64) {
    let p = dir.join(name(i));
    let was = mtime(&p);
    write_pseudo_random(&p, 40_000, 7000 + i);
    put_mtime_back(&p, was);
}

fn mode_only(dir: &Path, i: u64) {
    let p = dir.join(name(i));
    let was = mtime(&p);
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    put_mtime_back(&p, was);
}

fn swapped_with_its_neighbour(dir: &Path, i: u64) {
    let j = if i + 1 < FILES { i + 1 } else { i - 1 };
    let (a, b, t) = (dir.join(name(i)), dir.join(name(j)), dir.join("swap.tmp"));
    std::fs::rename(&a, &t).unwrap();
    std::fs::rename(&b, &a).unwrap();
    std::fs::rename(&t, &b).unwrap();
}

fn replaced_by_a_symlink(dir: &Path, i: u64) {
    let p = dir.join(name(i));
    std::fs::remove_file(&p).unwrap();
    std::os::unix::fs::symlink(name((i + 7) % FILES), &p).unwrap();
}

fn truncated_mtime_back(dir: &Path, i: u64) {
    let p = dir.join(name(i));
    let was = mtime(&p);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(12_345).unwrap();
    drop(f);
    put_mtime_back(&p, was);
}

fn a_new_neighbour(dir: &Path, i: u64) {
    write_pseudo_random(&dir.join(format!("{}.new", name(i))), 3_000, 9000 + i);
}

fn removed_and_written_again_same_bytes_but_one(dir: &Path, i: u64) {
    let p = dir.join(name(i));
    let was = mtime(&p);
    let mut bytes = std::fs::read(&p).unwrap();
    bytes[20_000] ^= 1;
    std::fs::remove_file(&p).unwrap();
    std::fs::write(&p, bytes).unwrap();
    put_mtime_back(&p, was);
}

#[test]
fn publish_unchanged_never_takes_a_file_changed_behind_its_record() {
    let fx = art_cache();
    fx.publish("art");
    let r = fx.clone_repo("r");
    let edits: [(&str, Edit); 7] = [
        (
            "content, same size, mtime put back",
            same_size_content_mtime_back,
        ),
        ("mode only, mtime put back", mode_only),
        (
            "swapped with its neighbour by rename",
            swapped_with_its_neighbour,
        ),
        ("replaced by a symlink", replaced_by_a_symlink),
        ("truncated, mtime put back", truncated_mtime_back),
        ("a new file beside it", a_new_neighbour),
        (
            "written again with one bit flipped, mtime put back",
            removed_and_written_again_same_bytes_but_one,
        ),
    ];
    let mut case = 0;
    for (what, edit) in edits {
        // The first file, one in the middle, the last: the tar's start,
        // a run's middle, and the run that ends the tar.
        for i in [0, FILES / 2, FILES - 1] {
            case += 1;
            // Each case edits the tree the previous case's publish packed:
            // its record is the one that must not vouch for the edit.
            let target = src(&fx).join(name(i));
            // A case before may have left it another kind or size.
            if !std::fs::symlink_metadata(&target).is_ok_and(|m| m.is_file() && m.len() == 40_000) {
                let _ = std::fs::remove_file(&target);
                write_pseudo_random(&target, 40_000, 50_000 + case);
            }
            edit(&src(&fx), i);
            let key = format!("p{case}");
            manifest(&fx, "work", &key);
            let p = fx.publish("art");
            assert!(
                p["chunks_unchanged"].as_u64().unwrap() > 0,
                "{what} at file {i}: nothing was taken from the record, so nothing was tested: {p}"
            );
            manifest(&fx, "r", &key);
            fx.json_in(&r, &["cache", "restore", "art", "--json"]);
            let diff =
                std::panic::catch_unwind(|| assert_same_tree(&src(&fx), &fx.env.join("dest-r")));
            assert!(
                diff.is_ok(),
                "{what} at file {i}: the key restores to another tree"
            );
        }
    }
}
