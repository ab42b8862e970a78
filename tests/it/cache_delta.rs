//! The delta install: a restore of a new key over an installed
//! one links the files that did not change, never one the user changed, and
//! always ends equal to a cold restore of the same key, also after `kill -9`.
//!
//! Keys are `dt-<v>`, published by warmstart itself to a bare origin; a
//! second manifest `cold` reads the same branch into another directory, so
//! every delta result is compared with a cold restore of the same key.

use crate::util::fixture::{Fixture, Manifest, Serve};
use crate::util::rng::Rng;
use crate::util::run;
use crate::util::tree::assert_same_tree;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Files in the artifact: one in a hundred is 2 of them.
pub(crate) const FILES: usize = 200;

/// The delta cache `dt` installed at `installed/dt`, and `cold`, the same
/// branch (`dt-cache`) read into `cold/dt`: keys `dt-<v>` pinned in
/// `pins.txt`, packing `../art` in 8 KiB average chunks.
pub(crate) fn delta_cache() -> Fixture {
    let fx = Fixture::serve(Serve::RelativePath);
    for (name, path, branch) in [
        ("dt", target(&fx), None),
        (
            "cold",
            fx.env.join("cold/dt"),
            Some("branch = \"dt-cache\""),
        ),
    ] {
        Manifest::pinned("pins.txt", "../art")
            .cache(&match branch {
                Some(b) => format!("description = \"delta\"\n{b}"),
                None => "description = \"delta\"".to_string(),
            })
            .publish("chunk_avg = \"8KiB\"")
            .restore_path(path)
            .write(&fx.work, name);
    }
    fx
}

pub(crate) fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed/dt")
}

pub(crate) fn pin(fx: &Fixture, v: &str) {
    fx.write("pins.txt", &format!("v={v}\n"));
}

/// Publishes `dt-<v>`: the artifact with files `changed` at version `v`.
pub(crate) fn publish(fx: &Fixture, v: &str, changed: &[usize]) {
    publish_as(fx, v, v, changed);
}

/// Publishes key `dt-<v>` with the content of version `content`.
fn publish_as(fx: &Fixture, v: &str, content: &str, changed: &[usize]) {
    pin(fx, v);
    let art = fx.env.join("art");
    let _ = fs::remove_dir_all(&art);
    artifact(&art, content, changed);
    fx.publish("dt");
}

/// Restores `dt-<v>` into the delta target; its JSON.
pub(crate) fn restore(fx: &Fixture, v: &str) -> Value {
    pin(fx, v);
    fx.restore("dt")
}

/// A cold restore of `dt-<v>` elsewhere: what the delta must equal.
pub(crate) fn cold(fx: &Fixture, v: &str) -> PathBuf {
    pin(fx, v);
    // Never a delta: no record to build one from.
    let record = fx
        .env
        .join("work/.git/warmstart/cache/installed/cold.record");
    let _ = fs::remove_file(record);
    let key = format!("dt-{v}");
    let _ = fx.xtask(&["cache", "restore", "cold", "--key", &key]).ok();
    fx.env.join("cold/dt")
}

pub(crate) fn inode(fx: &Fixture, rel: &str) -> u64 {
    fs::symlink_metadata(target(fx).join(rel)).unwrap().ino()
}

/// Nothing beside the target but the shadow a delta keeps, and only the
/// record beside the stamps.
pub(crate) fn assert_no_leftovers(fx: &Fixture) {
    let target = target(fx);
    let names: Vec<String> = fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".dt.links")
        .collect();
    assert_eq!(names, ["dt"], "leftovers beside the target");
    let state = fx.env.join("work/.git/warmstart/cache/installed");
    let mut kept: Vec<String> = fs::read_dir(state)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("dt."))
        .collect();
    kept.sort();
    assert_eq!(kept, ["dt.files.zst", "dt.record"]);
}

pub(crate) fn rel_of(i: usize) -> String {
    format!("d{}/f{i:03}.txt", i % 10)
}

/// `FILES` files of 1.5 KiB in ten directories, an executable, a symlink,
/// a hardlink, an empty directory; files in `changed` say `v`.
fn artifact(dir: &Path, v: &str, changed: &[usize]) {
    for i in 0..FILES {
        let p = dir.join(rel_of(i));
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        let tag = if changed.contains(&i) { v } else { "base" };
        fs::write(&p, format!("{i} {tag}\n").repeat(150)).unwrap();
    }
    fs::create_dir_all(dir.join("bin")).unwrap();
    fs::write(dir.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    fs::set_permissions(dir.join("bin/tool"), fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("../d0/f000.txt", dir.join("bin/link")).unwrap();
    fs::hard_link(dir.join("d1/f001.txt"), dir.join("bin/hard")).unwrap();
    fs::create_dir_all(dir.join("empty")).unwrap();
}

#[test]
fn cache_delta_links_what_did_not_change_and_equals_a_cold_restore() {
    let fx = delta_cache();
    publish(&fx, "1", &[]);
    let j = restore(&fx, "1");
    assert_eq!(
        (j["state"].as_str(), j["files_linked"].as_u64()),
        (Some("restored"), Some(0)),
        "{j}"
    );
    let before: Vec<u64> = (0..FILES).map(|i| inode(&fx, &rel_of(i))).collect();
    // 1% of the files change.
    publish(&fx, "2", &[7, 150]);
    let j = restore(&fx, "2");
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["delta_fallback"], Value::Null, "{j}");
    // Every file but the two, plus bin/tool; bin/hard is the link of f001.
    assert_eq!(j["files_linked"], FILES as u64 - 2 + 1, "{j}");
    assert!(j["bytes_linked"].as_u64().unwrap() > 198 * 1000, "{j}");
    // Independent frames: only the chunks holding the two files decoded.
    let (decoded, skipped) = (
        j["tar_bytes"].as_u64().unwrap(),
        j["chunks_skipped"].as_u64().unwrap(),
    );
    assert!(skipped >= 10 && decoded < 100_000, "{j}");
    for (i, ino) in before.iter().enumerate() {
        let same = inode(&fx, &rel_of(i)) == *ino;
        assert_eq!(same, ![7, 150].contains(&i), "{}", rel_of(i));
    }
    let f7 = fs::read_to_string(target(&fx).join(rel_of(7))).unwrap();
    assert!(f7.starts_with("7 2\n"), "{f7}");
    assert_same_tree(&cold(&fx, "2"), &target(&fx));
    assert_no_leftovers(&fx);
    // The human summary says so.
    publish(&fx, "3", &[7]);
    pin(&fx, "3");
    let text = fx.xtask(&["cache", "restore", "dt"]).ok().stdout();
    assert!(
        text.contains(&format!("linked {} unchanged files", FILES - 1)),
        "{text}"
    );
    assert_same_tree(&cold(&fx, "3"), &target(&fx));
    // A new key with nothing changed: every file linked, nothing decoded.
    publish_as(&fx, "4", "3", &[7]);
    let j = restore(&fx, "4");
    assert_eq!(j["files_linked"], FILES as u64 + 1, "{j}");
    assert_eq!(j["tar_bytes"], 0, "{j}");
    assert_same_tree(&cold(&fx, "4"), &target(&fx));
}

/// What a user may do to an installed file.
pub(crate) fn hostile(kind: usize, target: &Path, rel: &str, outside: &Path) -> &'static str {
    let p = target.join(rel);
    let md = fs::metadata(&p).unwrap();
    let overwrite = |p: &Path| fs::write(p, "Z".repeat(md.len() as usize)).unwrap();
    match kind % 8 {
        0 => {
            overwrite(&p);
            "new content of the same size"
        }
        1 => {
            fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
            "chmod"
        }
        2 => {
            fs::remove_file(&p).unwrap();
            std::os::unix::fs::symlink("/etc/passwd", &p).unwrap();
            "replaced by a symlink"
        }
        3 => {
            fs::remove_file(&p).unwrap();
            fs::create_dir(&p).unwrap();
            fs::write(p.join("inside"), "x").unwrap();
            "replaced by a directory"
        }
        4 => {
            fs::hard_link(&p, outside.join(format!("h{}", md.ino()))).unwrap();
            "hardlinked from outside"
        }
        5 => {
            overwrite(&p);
            let f = fs::File::options().write(true).open(&p).unwrap();
            f.set_modified(md.modified().unwrap()).unwrap();
            "touched with the same size and the mtime put back"
        }
        6 => {
            let tmp = p.with_extension("tmp");
            fs::write(&tmp, fs::read(&p).unwrap()).unwrap();
            fs::rename(&tmp, &p).unwrap();
            "replaced by a copy of itself (rename)"
        }
        _ => {
            fs::remove_file(&p).unwrap();
            "removed"
        }
    }
}

#[test]
fn cache_delta_never_links_a_file_the_user_changed() {
    let fx = delta_cache();
    let outside = fx.env.join("outside");
    fs::create_dir(&outside).unwrap();
    publish(&fx, "a", &[]);
    publish(&fx, "b", &[3]);
    fs::rename(cold(&fx, "a"), fx.env.join("cold-a")).unwrap();
    let cold_a = fx.env.join("cold-a");
    let cold_b = cold(&fx, "b");
    let mut outside_copies = Vec::new();
    restore(&fx, "a");
    let mut rng = Rng(0xde17a);
    for case in 0..24 {
        let (now, next) = if case % 2 == 0 {
            ("a", "b")
        } else {
            ("b", "a")
        };
        let victims: Vec<usize> = (0..1 + rng.below(3))
            .map(|_| 10 + rng.below(FILES - 10))
            .collect();
        let mut edited = Vec::new();
        for (k, &v) in victims.iter().enumerate() {
            let rel = rel_of(v);
            if edited.iter().any(|(r, _, _)| *r == rel) {
                continue;
            }
            let what = hostile(case + k, &target(&fx), &rel, &outside);
            let ino = fs::symlink_metadata(target(&fx).join(&rel))
                .map(|m| m.ino())
                .ok();
            if what == "hardlinked from outside" {
                let p = outside.join(format!("h{}", ino.unwrap()));
                outside_copies.push((p.clone(), fs::read(&p).unwrap()));
            }
            edited.push((rel, ino, what));
        }
        let j = restore(&fx, next);
        assert_eq!(j["state"], "restored", "case {case} ({now} -> {next}): {j}");
        for (rel, ino, what) in &edited {
            let now_ino = fs::symlink_metadata(target(&fx).join(rel)).unwrap().ino();
            assert_ne!(
                Some(now_ino),
                *ino,
                "case {case}: {rel} ({what}) was linked"
            );
        }
        let expected = if next == "a" { &cold_a } else { &cold_b };
        assert_same_tree(expected, &target(&fx));
        assert!(
            j["files_linked"].as_u64().unwrap() >= (FILES - 6) as u64,
            "case {case}: {j}"
        );
    }
    // What the user hardlinked from outside was never written to.
    assert!(!outside_copies.is_empty());
    for (p, bytes) in outside_copies {
        assert_eq!(fs::read(&p).unwrap(), bytes, "{}", p.display());
    }
}

#[test]
fn cache_delta_a_forged_index_or_a_corrupt_record_means_a_full_install_with_one_line() {
    let fx = delta_cache();
    publish(&fx, "1", &[]);
    restore(&fx, "1");
    publish(&fx, "2", &[5]);
    // Swap an index part on the origin for another one (warmstart.json,
    // which names its digest, stays).
    let tree = fx.env.git("origin.git", ["ls-tree", "dt-cache"]);
    let forged = fx.env.join("forged");
    // The same size, one bit off.
    let real = std::process::Command::new("git")
        .current_dir(fx.env.join("origin.git"))
        .args(["cat-file", "blob", "dt-cache:dt-2.files.zst.part000"])
        .output()
        .unwrap();
    let mut bytes = real.stdout;
    *bytes.last_mut().unwrap() ^= 1;
    fs::write(&forged, bytes).unwrap();
    let blob = fx.env.git(
        "origin.git",
        ["hash-object", "-w", forged.to_str().unwrap()],
    );
    let edited: String = tree
        .lines()
        .map(|l| {
            if l.ends_with("dt-2.files.zst.part000") {
                let (meta, name) = l.split_once('\t').unwrap();
                let mode = meta.split(' ').next().unwrap();
                format!("{mode} blob {}\t{name}\n", blob.trim())
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    fs::write(fx.env.join("tree.txt"), &edited).unwrap();
    let mut mk = std::process::Command::new("git");
    mk.current_dir(fx.env.join("origin.git"))
        .args(["mktree"])
        .stdin(fs::File::open(fx.env.join("tree.txt")).unwrap());
    let new_tree = String::from_utf8(mk.output().unwrap().stdout).unwrap();
    // A cache branch is one root commit.
    let commit = fx.env.git(
        "origin.git",
        ["commit-tree", new_tree.trim(), "-m", "forged index"],
    );
    fx.env.git(
        "origin.git",
        ["update-ref", "refs/heads/dt-cache", commit.trim()],
    );

    pin(&fx, "2");
    let r = fx.xtask(&["cache", "restore", "dt", "--json"]).ok();
    let j: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["files_linked"], 0, "{j}");
    let why = j["delta_fallback"]
        .as_str()
        .unwrap_or_else(|| panic!("{j}"));
    assert!(
        why.contains("dt-2.files.zst") && why.contains("sha256"),
        "{why}"
    );
    let stderr = r.stderr();
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("dt-2.files.zst"))
        .collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr());
    assert!(lines[0].contains("installing dt-2 in full"), "{}", lines[0]);
    assert_same_tree(&cold(&fx, "2"), &target(&fx));

    // Our own record, damaged: a full install with one line, never an error.
    publish(&fx, "3", &[6]);
    restore(&fx, "3");
    publish(&fx, "4", &[6]);
    let record = fx.env.join("work/.git/warmstart/cache/installed/dt.record");
    fs::write(&record, "warmstart-installed 1\nkey dt-3\n").unwrap();
    let j = restore(&fx, "4");
    assert_eq!(
        (j["state"].as_str(), j["files_linked"].as_u64()),
        (Some("restored"), Some(0)),
        "{j}"
    );
    assert!(
        j["delta_fallback"].as_str().unwrap().contains("record"),
        "{j}"
    );
    assert_same_tree(&cold(&fx, "4"), &target(&fx));
    assert_no_leftovers(&fx);
}

#[test]
fn cache_delta_killed_at_any_point_ends_complete_and_equal_to_a_cold_restore() {
    use std::os::unix::process::ExitStatusExt;
    let fx = delta_cache();
    publish(&fx, "1", &[]);
    publish(&fx, "2", &[1, 100]);
    let cold1 = cold(&fx, "1");
    fs::rename(&cold1, fx.env.join("cold-1")).unwrap();
    let cold = [fx.env.join("cold-1"), cold(&fx, "2")];
    restore(&fx, "1");
    let points = [
        "restore:fetched",
        "delta:linked",
        "restore:first-chunk-decoding",
        "delta:written",
        "restore:unpacked",
        "swap:exchanged",
        "swap:pruned",
        "restore:installed",
        "delta:recorded",
    ];
    let mut rng = Rng(0x9e37);
    for (i, point) in points.iter().map(Some).chain([None; 6]).enumerate() {
        let next = if i % 2 == 0 { "2" } else { "1" };
        pin(&fx, next);
        let mut cmd = fx.env.xtask_in("work");
        cmd.args(["cache", "restore", "dt", "--quiet"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let status = match point {
            Some(p) => run(cmd.env("WARMSTART_TEST_KILL_AT", p)).out.status,
            None => {
                // At a random moment of the restore. Only warmstart is
                // killed, as `kill -9 <pid>` would: a git it runs (in a
                // process group of its own) finishes on its own, and the
                // next run starts after it, as a user's would.
                let mut child = cmd.spawn().unwrap();
                std::thread::sleep(std::time::Duration::from_millis(rng.below(150) as u64));
                let _ = child.kill();
                let status = child.wait().unwrap();
                wait_for_orphans(fx.env.path());
                status
            }
        };
        if point.is_some() {
            assert_eq!(status.signal(), Some(9), "{point:?} was not reached");
        }
        let j = restore(&fx, next);
        assert_eq!(j["key"], format!("dt-{next}"), "{point:?}");
        assert_same_tree(&cold[if next == "1" { 0 } else { 1 }], &target(&fx));
        assert_no_leftovers(&fx);
        fx.xtask(&["cache", "verify", "dt"]).ok();
    }
}

/// Waits until no process runs in `dir` or names it (the git children a
/// killed warmstart leaves: they hold git's locks until they finish).
fn wait_for_orphans(dir: &Path) {
    let me = std::process::id().to_string();
    let dir = dir.to_string_lossy().into_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let busy = fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| e.ok())
            .any(|e| {
                let pid = e.file_name().to_string_lossy().into_owned();
                if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
                    return false;
                }
                let cmdline = fs::read(e.path().join("cmdline")).unwrap_or_default();
                let cwd = fs::read_link(e.path().join("cwd")).unwrap_or_default();
                String::from_utf8_lossy(&cmdline).contains(&dir)
                    || cwd.to_string_lossy().starts_with(&dir)
            });
        if !busy {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "processes in {dir} never ended"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A target outside the work tree is one install for every worktree of the
/// clone: a second `git worktree add` finds it warm (nothing fetched, its
/// own chunk store never made), while a target inside a work tree is each
/// worktree's own. Records an older build left in a worktree's own state
/// directory move to the shared one, the delta record with the stamp.
#[test]
fn cache_delta_a_second_worktree_restores_a_home_wide_target_once() {
    let fx = Fixture::serve(Serve::RelativePath);
    let home_wide = fx.env.home().join(".local/fstar");
    Manifest::literal("1", "../art")
        .restore_path(&home_wide)
        .write(&fx.work, "fstar");
    Manifest::literal("1", "../art")
        .restore_path("restored/inner")
        .write(&fx.work, "inner");
    artifact(&fx.env.join("art"), "1", &[]);
    fx.publish("fstar");
    fx.publish("inner");
    assert_eq!(fx.restore("fstar")["state"], "restored");
    assert_eq!(fx.restore("inner")["state"], "restored");

    fx.env
        .git(&fx.work, ["worktree", "add", "-q", "--detach", "../two"]);
    let two = fx.env.join("two");
    let copy = |from: &Path, to: &Path| {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    };
    copy(
        &fx.work.join("cache-manifests"),
        &two.join("cache-manifests"),
    );
    let own = fx.work.join(".git/worktrees/two/warmstart");
    let shared = fx.work.join(".git/warmstart");
    let j = fx.json_in(&two, &["cache", "restore", "fstar", "--json"]);
    assert_eq!(j["state"], "warm", "{j}");
    assert!(
        !own.join("cache.git").exists(),
        "nothing fetched in the second worktree"
    );
    assert_eq!(
        fx.json_in(&two, &["cache", "restore", "inner", "--json"])["state"],
        "restored",
        "a target inside the work tree is the worktree's own"
    );

    // An older build stamped the HOME-wide target in the worktree's own
    // directory: the stamp and its delta record move to the shared one.
    let moved = ["cache/stamps/fstar.json", "cache/installed/fstar.record"];
    for rel in moved {
        let (from, to) = (shared.join(rel), own.join(rel));
        fs::create_dir_all(to.parent().unwrap()).unwrap();
        fs::rename(&from, &to).unwrap();
    }
    let j = fx.json_in(&two, &["cache", "restore", "fstar", "--json"]);
    assert_eq!(j["state"], "warm", "{j}");
    for rel in moved {
        assert!(
            shared.join(rel).exists(),
            "{rel} moved to the shared directory"
        );
        assert!(!own.join(rel).exists(), "{rel} left in the worktree's own");
    }
    assert_eq!(fx.restore("fstar")["state"], "warm");
}
