//! `restore.mode = "overlay"`: a snapshot is written into a target the user
//! also writes, never replacing a file the user changed since warmstart
//! installed it, and never removing one the snapshot lacks.

use crate::cache_keys::{artifact, pins, publish, target, verification_cache};
use crate::util::rng::Rng;
use serde_json::Value;
use std::fs;
use std::path::Path;

fn read(p: &Path) -> String {
    fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn cache_overlay_keeps_what_the_user_changed_and_replaces_what_they_did_not() {
    let fx = verification_cache("mode = \"overlay\"\n");
    let res = target(&fx).join("results");
    publish(&fx, "1", "x");
    let j = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["mode"], "overlay", "{j}");
    assert_eq!(j["kept"], 0, "{j}");
    assert_eq!(read(&res.join("a.checked")), "a of 1\n");

    // The user re-checks a.checked locally and adds a file of their own.
    fs::write(res.join("a.checked"), "a re-checked here\n").unwrap();
    fs::write(res.join("mine.checked"), "mine\n").unwrap();
    publish(&fx, "2", "x");
    let j = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["key"], "vc-2-x", "{j}");
    assert_eq!(j["kept"], 1, "{j}");
    assert_eq!(read(&res.join("a.checked")), "a re-checked here\n");
    // b.checked was untouched since install: replaced.
    assert_eq!(read(&res.join("b.checked")), "b of 2\n");
    assert_eq!(read(&res.join("2.checked")), "2");
    // The snapshot lacks these: left alone.
    assert_eq!(read(&res.join("1.checked")), "1");
    assert_eq!(read(&res.join("mine.checked")), "mine\n");
    let text = fx
        .xtask(&["cache", "restore", "vc", "--verify"])
        .ok()
        .stdout();
    assert!(
        text.contains("kept 1 file") || text.contains("matches"),
        "{text}"
    );

    // --verify no longer replaces a file the user re-verified locally: it
    // is not part of the comparison at all.
    fs::write(res.join("b.checked"), "b re-verified here\n").unwrap();
    let j = fx.json(&["cache", "restore", "vc", "--verify", "--json"]);
    assert_eq!(j["state"], "verified", "{j}");
    assert_eq!(j["kept"], 2, "{j}");
    // `cache verify` judges the installed copy the same way.
    let v = fx.xtask(&["cache", "verify", "vc"]).ok().stdout();
    assert!(v.contains("matches"), "{v}");
    assert_eq!(read(&res.join("b.checked")), "b re-verified here\n");
    // But what warmstart installed and nobody changed is still checked: a
    // missing file is put back, the kept ones stay.
    fs::remove_file(res.join("2.checked")).unwrap();
    let j = fx.json(&["cache", "restore", "vc", "--verify", "--json"]);
    assert_eq!(j["state"], "repaired", "{j}");
    assert!(
        j["difference"].as_str().unwrap().contains("2.checked"),
        "{j}"
    );
    assert_eq!(read(&res.join("2.checked")), "2");
    assert_eq!(read(&res.join("a.checked")), "a re-checked here\n");
    assert_eq!(read(&res.join("b.checked")), "b re-verified here\n");
    // An edit that keeps the size and puts the mtime back still moves the
    // inode when made by rename (what editors and tools do): kept.
    let p = res.join("2.checked");
    let before = fs::metadata(&p).unwrap();
    fs::write(res.join(".tmp"), "3").unwrap();
    fs::rename(res.join(".tmp"), &p).unwrap();
    let mtime = filetime_of(&before);
    set_mtime(&p, mtime);
    assert_eq!(fs::metadata(&p).unwrap().len(), before.len());
    let j = fx.json(&["cache", "restore", "vc", "--key", "vc-1-x", "--json"]);
    assert_eq!(j["kept"], 2, "{j}");
    let j = fx.json(&["cache", "restore", "vc", "--key", "vc-2-x", "--json"]);
    assert_eq!(j["kept"], 3, "{j}");
    assert_eq!(read(&p), "3");
}

fn filetime_of(m: &fs::Metadata) -> std::time::SystemTime {
    m.modified().unwrap()
}

fn set_mtime(p: &Path, t: std::time::SystemTime) {
    let f = fs::File::options().write(true).open(p).unwrap();
    f.set_modified(t).unwrap();
}

#[test]
fn cache_overlay_property_a_changed_file_is_never_replaced() {
    // Random rounds of user edits between overlay restores of alternating
    // snapshots: every file the user wrote since the last install keeps
    // the user's bytes; every file nobody touched has the snapshot's.
    let fx = verification_cache("mode = \"overlay\"\n");
    let res = target(&fx).join("results");
    for src in ["p", "q"] {
        publish(&fx, src, "x");
    }
    pins(&fx, "p", "x");
    fx.xtask(&["cache", "restore", "vc"]).ok();
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    // What the user wrote, by file name; persists across rounds (once
    // changed, a file is the user's for good).
    let mut user: std::collections::BTreeMap<String, String> = Default::default();
    let names = ["a.checked", "b.checked", "p.checked", "q.checked"];
    for round in 0..8 {
        for name in names {
            let p = res.join(name);
            match rng.below(5) {
                // Rewrite in place, same length where possible.
                0 if p.exists() => {
                    let old = read(&p);
                    let new: String = old.chars().rev().collect::<String>() + "";
                    let new = if new == old { format!("{old}!") } else { new };
                    fs::write(&p, &new).unwrap();
                    user.insert(name.to_string(), new);
                }
                // Replace by rename.
                1 if p.exists() => {
                    let new = format!("renamed in round {round}\n");
                    fs::write(res.join(".new"), &new).unwrap();
                    fs::rename(res.join(".new"), &p).unwrap();
                    user.insert(name.to_string(), new);
                }
                // Only touch the mtime.
                2 if p.exists() => {
                    set_mtime(&p, std::time::SystemTime::now());
                    user.insert(name.to_string(), read(&p));
                }
                _ => {}
            }
        }
        let src = if round % 2 == 0 { "q" } else { "p" };
        pins(&fx, src, "x");
        let verify = rng.below(2) == 0;
        let mut args = vec!["cache", "restore", "vc", "--json"];
        if verify {
            args.push("--verify");
        }
        let j: Value = fx.json(&args);
        let art = artifact(&fx, src);
        for name in names {
            let p = res.join(name);
            match user.get(name) {
                Some(mine) => assert_eq!(&read(&p), mine, "round {round}: {name}\n{j}"),
                None => {
                    let snap = art.join("results").join(name);
                    if snap.exists() {
                        assert_eq!(read(&p), read(&snap), "round {round}: {name}\n{j}");
                    }
                }
            }
        }
        let kept = j["kept"].as_u64();
        if let Some(k) = kept {
            assert!(k as usize <= user.len(), "round {round}: {j}");
        }
    }
    assert!(!user.is_empty(), "the generator changed nothing");
}

#[test]
fn cache_overlay_never_writes_through_a_link_that_leaves_the_target() {
    let fx = verification_cache("mode = \"overlay\"\n");
    publish(&fx, "1", "x");
    // The target's results/ is a link to a directory outside it.
    let outside = fx.env.join("outside");
    fs::create_dir_all(&outside).unwrap();
    fs::write(outside.join("a.checked"), "outside\n").unwrap();
    fs::create_dir_all(target(&fx)).unwrap();
    std::os::unix::fs::symlink(&outside, target(&fx).join("results")).unwrap();
    let r = fx.xtask(&["cache", "restore", "vc"]).expect_code(7);
    assert!(r.stderr().contains("results"), "{}", r.stderr());
    assert_eq!(read(&outside.join("a.checked")), "outside\n");
    let names: Vec<_> = fs::read_dir(&outside).unwrap().collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn cache_overlay_killed_mid_merge_is_completed_and_still_knows_its_files() {
    use std::os::unix::process::ExitStatusExt;
    for point in [
        "merge:journal-written",
        "merge:moved-one",
        "restore:installed",
    ] {
        let fx = verification_cache("mode = \"overlay\"\n");
        let res = target(&fx).join("results");
        publish(&fx, "1", "x");
        publish(&fx, "2", "x");
        pins(&fx, "1", "x");
        fx.xtask(&["cache", "restore", "vc"]).ok();
        fs::write(res.join("a.checked"), "a re-checked here\n").unwrap();
        pins(&fx, "2", "x");
        let r = crate::util::run(
            fx.env
                .xtask_in("work")
                .args(["cache", "restore", "vc"])
                .env("WARMSTART_TEST_KILL_AT", point),
        );
        assert_eq!(r.out.status.signal(), Some(9), "{point}: {}", r.stderr());
        // The next run completes the merge, and the files it moved are
        // known as warmstart's: replaced again, not kept as the user's.
        let j = fx.json(&["cache", "restore", "vc", "--json"]);
        assert_eq!(j["state"], "restored", "{point}: {j}");
        assert_eq!(j["kept"], 1, "{point}: {j}");
        assert_eq!(read(&res.join("a.checked")), "a re-checked here\n");
        assert_eq!(read(&res.join("b.checked")), "b of 2\n");
        assert_eq!(read(&res.join("2.checked")), "2");
        let stray: Vec<String> = fs::read_dir(target(&fx).parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "vc")
            .collect();
        assert!(stray.is_empty(), "{point}: {stray:?}");
    }
}

/// Through restore.toml, the orientation table's row says what the overlay
/// kept, not only the step's log.
#[test]
fn cache_overlay_the_restore_row_says_how_many_files_it_kept() {
    let fx = verification_cache("mode = \"overlay\"\n");
    fx.write(
        "cache-manifests/restore.toml",
        "[[step]]\nname = \"vc\"\nkind = \"cache\"\ncache = \"vc\"\n",
    );
    let res = target(&fx).join("results");
    publish(&fx, "1", "x");
    let row = |fx: &crate::util::fixture::Fixture| {
        let v = fx.json(&["restore", "--json"]);
        v["steps"][0]["what"].as_str().unwrap().to_string()
    };
    assert!(!row(&fx).contains("kept"));
    fs::write(res.join("a.checked"), "a re-checked here\n").unwrap();
    publish(&fx, "2", "x");
    let what = row(&fx);
    assert!(
        what.starts_with("restored vc-2-x")
            && what.ends_with("; kept 1 file the user changed since warmstart installed it"),
        "{what}"
    );
    assert_eq!(read(&res.join("a.checked")), "a re-checked here\n");
}
