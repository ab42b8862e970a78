//! The record an install leaves for the next delta: a full install's lets
//! the next delta link without reading a file, as a delta's does, and it
//! describes what was installed, so an edit made at any moment after the
//! swap is never linked. Built on `cache_delta`'s fixture.

use crate::cache_delta::{
    FILES, assert_no_leftovers, cold, delta_cache, hostile, inode, pin, publish, rel_of, restore,
    target,
};
use crate::util::tree::assert_same_tree;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// A full install (its tar agreed with the index as it was unpacked), then
/// a delta after it and a delta after that: neither reads a file it links.
#[test]
fn cache_delta_after_a_full_install_or_a_delta_reads_no_unchanged_file() {
    let fx = delta_cache();
    publish(&fx, "1", &[]);
    let j = restore(&fx, "1");
    assert_eq!(j["files_linked"], 0, "a full install: {j}");
    publish(&fx, "2", &[7, 150]);
    let j = restore(&fx, "2");
    assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    assert_eq!(j["files_linked"], FILES as u64 - 2 + 1, "{j}");
    assert_eq!(j["files_hashed"], 0, "after a full install: {j}");
    assert_same_tree(&cold(&fx, "2"), &target(&fx));
    // Files 7 and 150 go back to their first content, 8 changes.
    publish(&fx, "3", &[8]);
    let j = restore(&fx, "3");
    assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    assert_eq!(j["files_linked"], FILES as u64 - 3 + 1, "{j}");
    assert_eq!(j["files_hashed"], 0, "after a delta: {j}");
    assert_same_tree(&cold(&fx, "3"), &target(&fx));
    assert_no_leftovers(&fx);
}

/// New bytes of the same size with the mtime put back: only the ctime
/// (and the bytes) say the file changed.
fn edit_in_place(target: &Path, rel: &str) {
    let p = target.join(rel);
    let md = fs::symlink_metadata(&p).unwrap();
    fs::write(&p, "E".repeat(md.len() as usize)).unwrap();
    let f = fs::File::options().write(true).open(&p).unwrap();
    f.set_modified(md.modified().unwrap()).unwrap();
}

/// Waits until `target` names another directory than inode `before` (the
/// swap) or `child` ended; false when it ended first.
fn wait_for_swap(target: &Path, before: u64, child: &mut std::process::Child) -> bool {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if fs::symlink_metadata(target).is_ok_and(|m| m.ino() != before) {
            return true;
        }
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        assert!(Instant::now() < deadline, "no swap within 120 s");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A shell using the tree while a restore finishes: a file changed 0 to
/// 70 ms after a delta's swap (inside the racy window of a coarse clock),
/// or right after the command returned, is written again by the next
/// delta, never linked, whatever the moment and the change: every other
/// case is new bytes of the same size with the mtime put back, the others
/// go through `cache_delta::hostile`'s list (content, chmod, a symlink or
/// a directory in its place, a hardlink from outside, a rename, removal).
#[test]
fn cache_delta_an_edit_made_right_after_the_swap_is_never_linked_by_the_next_delta() {
    let fx = delta_cache();
    publish(&fx, "a", &[]);
    publish(&fx, "b", &[3]);
    fs::rename(cold(&fx, "a"), fx.env.join("cold-a")).unwrap();
    let cold_a = fx.env.join("cold-a");
    let cold_b = cold(&fx, "b");
    restore(&fx, "a");
    let outside = fx.env.join("outside");
    fs::create_dir(&outside).unwrap();
    let offsets = [
        0,
        1,
        2,
        3,
        4,
        5,
        7,
        10,
        12,
        15,
        20,
        25,
        30,
        45,
        60,
        70,
        u64::MAX,
    ];
    let kinds = [0, 1, 2, 3, 4, 6, 7];
    let mut edited: Option<(String, Option<u64>, String)> = None;
    for (k, &ms) in offsets.iter().enumerate() {
        let next = if k % 2 == 0 { "b" } else { "a" };
        pin(&fx, next);
        let before = fs::symlink_metadata(target(&fx)).unwrap().ino();
        let mut child = fx
            .env
            .xtask_in("work")
            .args(["cache", "restore", "dt", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let victim = rel_of(10 + 11 * k);
        let change = |target: &Path| {
            if k % 2 == 0 {
                edit_in_place(target, &victim);
                "new bytes, the mtime put back"
            } else {
                hostile(kinds[k / 2 % kinds.len()], target, &victim, &outside)
            }
        };
        let mut when = match ms {
            u64::MAX => "after the command returned".to_string(),
            ms => format!("{ms} ms after the swap"),
        };
        if ms != u64::MAX {
            assert!(
                wait_for_swap(&target(&fx), before, &mut child),
                "the restore ended before a swap"
            );
            std::thread::sleep(Duration::from_millis(ms));
            when = format!("{when}: {}", change(&target(&fx)));
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let j: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(j["delta_fallback"], Value::Null, "{j}");
        if let Some((rel, ino, when)) = edited.take() {
            assert_ne!(
                Some(inode(&fx, &rel)),
                ino,
                "{rel}, {when}, was linked: {j}"
            );
        }
        if ms == u64::MAX {
            when = format!("{when}: {}", change(&target(&fx)));
        }
        let ino = fs::symlink_metadata(target(&fx).join(&victim))
            .map(|m| m.ino())
            .ok();
        edited = Some((victim.clone(), ino, when));
    }
    let last = if offsets.len() % 2 == 0 { "b" } else { "a" };
    let j = restore(&fx, last);
    let (rel, ino, when) = edited.unwrap();
    assert_ne!(
        Some(inode(&fx, &rel)),
        ino,
        "{rel}, {when}, was linked: {j}"
    );
    let expected = if last == "a" { &cold_a } else { &cold_b };
    assert_same_tree(expected, &target(&fx));
    assert_no_leftovers(&fx);
}

/// A delta that a full disk stops after it linked the unchanged files
/// leaves the record true of the installed tree: once the space the
/// changed files need is freed, the retry links every unchanged file again
/// (hashing those the failed run had linked) and writes only the changed.
#[test]
fn cache_delta_failed_by_a_full_disk_then_retried_links_the_unchanged_files_again() {
    let fx = delta_cache();
    let disk = fx.env.join("installed");
    let _tmpfs = crate::store_disk_full::Tmpfs::mount(&disk, "2m");
    publish(&fx, "1", &[]);
    restore(&fx, "1");
    let changed: Vec<usize> = (0..40).map(|i| i * 5).collect();
    publish(&fx, "2", &changed);
    // Fill the disk in pages, then free 10 of them: fewer than the 40
    // changed files need.
    let fill = disk.join("fill");
    fs::create_dir(&fill).unwrap();
    let mut pages = 0;
    while fs::write(fill.join(pages.to_string()), [7u8; 4096]).is_ok() {
        pages += 1;
    }
    let free = |n: usize, from: &mut usize| {
        for _ in 0..n {
            *from -= 1;
            fs::remove_file(fill.join(from.to_string())).unwrap();
        }
    };
    free(11, &mut pages);
    pin(&fx, "2");
    let r = crate::util::run(fx.env.xtask_in("work").args(["cache", "restore", "dt"]));
    assert!(!r.out.status.success(), "{}", crate::util::show(&r.out));
    assert!(r.stderr().contains("No space left"), "{}", r.stderr());
    assert_eq!(
        fs::read_to_string(target(&fx).join(rel_of(1))).unwrap(),
        "1 base\n".repeat(150),
        "the installed tree is untouched"
    );
    // Room for the changed files (a page each) and a few directories.
    free(40, &mut pages);
    let j = restore(&fx, "2");
    assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    assert_eq!(
        j["files_linked"],
        (FILES - changed.len() + 1) as u64,
        "the retry linked the unchanged files: {j}"
    );
    assert_same_tree(&cold(&fx, "2"), &target(&fx));
}

/// A delta killed (`kill -9`) once it has linked the unchanged files, at
/// each point from the link phase to the eve of the swap: the killed run's
/// links and the removal of its staging moved the ctime of every file it
/// linked, yet the re-run links every unchanged file again (hashing those
/// it has to: their new ctimes are racy against the record) and ends equal
/// to a cold restore. Before, the re-run linked none of them.
#[test]
fn cache_delta_killed_after_linking_then_rerun_links_the_unchanged_files_again() {
    use std::os::unix::process::ExitStatusExt;
    let fx = delta_cache();
    publish(&fx, "1", &[]);
    restore(&fx, "1");
    let changed = [3, 50, 120];
    publish(&fx, "2", &changed);
    let cold2 = cold(&fx, "2");
    let points = [
        "delta:linked",
        "restore:first-chunk-decoding",
        "delta:written",
        "restore:unpacked",
    ];
    for point in points {
        pin(&fx, "2");
        let mut cmd = fx.env.xtask_in("work");
        cmd.args(["cache", "restore", "dt", "--quiet"])
            .env("WARMSTART_TEST_KILL_AT", point);
        let r = crate::util::run(&mut cmd);
        assert_eq!(r.out.status.signal(), Some(9), "{point} was not reached");
        let j = restore(&fx, "2");
        assert_eq!(j["delta_fallback"], Value::Null, "after {point}: {j}");
        assert_eq!(
            j["files_linked"],
            (FILES - changed.len() + 1) as u64,
            "after a kill at {point}, the re-run links every unchanged file: {j}"
        );
        assert!(
            j["files_hashed"].as_u64().unwrap() > 0,
            "the files the killed run moved are hashed before they are linked: {j}"
        );
        assert_same_tree(&cold2, &target(&fx));
        assert_no_leftovers(&fx);
        // Back to the old key (itself a delta) for the next point.
        let j = restore(&fx, "1");
        assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    }
}
