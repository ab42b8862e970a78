//! `cargo xtask cache prune` and `[publish] keep`: old keys leave the branch
//! in one root commit, the keys a machine needs stay, and other files of the
//! tree (e.g. a per-key signature) are kept as they are.

use crate::cache_keys::{
    artifact, branch_keys, manifest, pins, publish, target, verification_cache,
};
use crate::util::fixture::Fixture;
use crate::util::run;
use crate::util::tree::assert_same_tree;
use serde_json::Value;

fn keys_of(v: &Value, field: &str) -> Vec<String> {
    v[field]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap().to_string())
        .collect()
}

/// Adds `file` to the origin's branch by hand, as another tool would (a
/// signed statement), keeping the branch one root commit.
fn add_file_by_hand(fx: &Fixture, file: &str, text: &str) {
    let co = fx.env.join("hand");
    fx.env.git(
        ".",
        [
            "clone",
            "-q",
            "-b",
            "vc-cache",
            "origin.git",
            co.to_str().unwrap(),
        ],
    );
    std::fs::write(co.join(file), text).unwrap();
    fx.env.git("hand", ["add", file]);
    fx.env
        .git("hand", ["commit", "-q", "--amend", "-m", "signed"]);
    fx.env
        .git("hand", ["push", "-q", "-f", "origin", "vc-cache"]);
    std::fs::remove_dir_all(&co).unwrap();
}

fn ls_branch(fx: &Fixture) -> Vec<(String, String)> {
    fx.env
        .git("origin.git", ["ls-tree", "vc-cache"])
        .lines()
        .map(|l| {
            let (meta, name) = l.split_once('\t').unwrap();
            (
                name.to_string(),
                meta.split(' ').nth(2).unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn cache_prune_keeps_what_it_must_and_another_clone_restores_a_kept_key() {
    let fx = verification_cache("");
    // Publish order is age order (created_at, then name within a second).
    for (src, platform) in [
        ("1", "x"),
        ("2", "x"),
        ("3", "x"),
        ("4", "x"),
        ("1", "y"),
        ("9", "y"),
    ] {
        publish(&fx, src, platform);
    }
    add_file_by_hand(&fx, "vc-4-x.sig", "a signature of vc-4-x\n");
    let before = fx.env.git("origin.git", ["rev-parse", "vc-cache"]);

    // Bad input first: nothing changes.
    let r = fx.xtask(&["cache", "prune", "vc"]).expect_code(2);
    assert!(
        r.stderr().contains("--keep N, --older-than D"),
        "{}",
        r.stderr()
    );
    let r = fx
        .xtask(&["cache", "prune", "vc", "--older-than", "soon"])
        .expect_code(2);
    assert!(r.stderr().contains("--older-than"), "{}", r.stderr());
    let r = fx
        .xtask(&["cache", "prune", "nosuch", "--keep", "1"])
        .expect_code(4);
    assert!(r.stderr().contains("nosuch"), "{}", r.stderr());

    // Today's pins give vc-2-x: it stays, with the newest of each platform.
    pins(&fx, "2", "x");
    let dry = fx.json(&["cache", "prune", "vc", "--keep", "1", "--dry-run", "--json"]);
    assert_eq!(dry["status"], "dry-run", "{dry}");
    assert_eq!(keys_of(&dry, "dropped"), ["vc-1-x", "vc-1-y", "vc-3-x"]);
    assert_eq!(fx.env.git("origin.git", ["rev-parse", "vc-cache"]), before);

    let j = fx.json(&["cache", "prune", "vc", "--keep", "1", "--json"]);
    assert_eq!(j["status"], "pruned", "{j}");
    assert_eq!(keys_of(&j, "dropped"), ["vc-1-x", "vc-1-y", "vc-3-x"]);
    assert_eq!(keys_of(&j, "kept"), ["vc-2-x", "vc-4-x", "vc-9-y"]);
    assert!(j["compressed_bytes_dropped"].as_u64().unwrap() > 0, "{j}");
    assert_eq!(branch_keys(&fx), ["vc-2-x", "vc-4-x", "vc-9-y"]);
    // One root commit; the dropped keys' chunks are gone, the hand-added
    // file is the very same blob.
    let count = fx
        .env
        .git("origin.git", ["rev-list", "--count", "vc-cache"]);
    assert_eq!(count.trim(), "1");
    let parents = fx
        .env
        .git("origin.git", ["rev-list", "--parents", "-n1", "vc-cache"]);
    assert_eq!(parents.split_whitespace().count(), 1, "{parents}");
    let files = ls_branch(&fx);
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    for gone in ["vc-1-x", "vc-3-x", "vc-1-y"] {
        assert!(
            !names.iter().any(|n| n.starts_with(&format!("{gone}."))),
            "{names:?}"
        );
    }
    let sig = files.iter().find(|(n, _)| n == "vc-4-x.sig").unwrap();
    let sig_text = fx.env.git("origin.git", ["cat-file", "-p", &sig.1]);
    assert_eq!(sig_text, "a signature of vc-4-x\n");
    // The coreutils path still holds on the pruned tree.
    let co = fx.env.join("check");
    fx.env.git(
        ".",
        [
            "clone",
            "-q",
            "-b",
            "vc-cache",
            "origin.git",
            co.to_str().unwrap(),
        ],
    );
    let mut sums = std::process::Command::new("sha256sum");
    sums.current_dir(&co).args(["-c", "--strict", "SHA256SUMS"]);
    let r = run(&mut sums);
    assert_eq!(r.code(), 0, "{}", r.stdout());
    assert!(
        r.stdout().contains("vc-2-x.tar.zst.part000: OK"),
        "{}",
        r.stdout()
    );

    // Another clone restores a kept key, and can ask for the other one;
    // a pruned key is exit 4 there.
    let other = fx.env.work_repo("other");
    fx.env
        .git("other", ["remote", "add", "origin", "../origin.git"]);
    let manifest = std::fs::read_to_string(fx.work.join("cache-manifests/vc.toml")).unwrap();
    let target2 = fx.env.join("installed/vc2");
    std::fs::create_dir_all(other.join("cache-manifests")).unwrap();
    std::fs::write(
        other.join("cache-manifests/vc.toml"),
        manifest.replace(target(&fx).to_str().unwrap(), target2.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(other.join("pins.txt"), "src=4\nplatform=x\n").unwrap();
    let r = run(fx
        .env
        .xtask_in("other")
        .args(["cache", "restore", "vc", "--json"]))
    .ok();
    let o: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(o["state"], "restored", "{o}");
    assert_eq!(o["key"], "vc-4-x");
    assert_same_tree(&artifact(&fx, "4"), &target2);
    run(fx
        .env
        .xtask_in("other")
        .args(["cache", "restore", "vc", "--key", "vc-9-y"]))
    .ok();
    assert_same_tree(&artifact(&fx, "9"), &target2);
    let r = run(fx
        .env
        .xtask_in("other")
        .args(["cache", "restore", "vc", "--key", "vc-3-x"]))
    .expect_code(4);
    assert!(r.stderr().contains("no key vc-3-x"), "{}", r.stderr());
    assert_same_tree(&artifact(&fx, "9"), &target2);

    // Again: nothing left to drop, nothing pushed.
    let after = fx.env.git("origin.git", ["rev-parse", "vc-cache"]);
    let j = fx.json(&["cache", "prune", "vc", "--keep", "1", "--json"]);
    assert_eq!(j["status"], "nothing to prune", "{j}");
    assert_eq!(fx.env.git("origin.git", ["rev-parse", "vc-cache"]), after);
    // --older-than alone: everything was published just now, so nothing
    // is old enough; with --keep 0 as well, still nothing.
    let j = fx.json(&[
        "cache",
        "prune",
        "vc",
        "--older-than",
        "1h",
        "--keep",
        "0",
        "--json",
    ]);
    assert_eq!(j["status"], "nothing to prune", "{j}");
    // And a publish after a prune still works on the pruned branch.
    let p = publish(&fx, "5", "x");
    assert_eq!(p["status"], "published", "{p}");
    assert_eq!(branch_keys(&fx), ["vc-2-x", "vc-4-x", "vc-5-x", "vc-9-y"]);
}

#[test]
fn cache_prune_publish_keep_prunes_on_every_publish_but_never_the_new_key() {
    let fx = verification_cache("\n[publish]\nkeep = 1\n");
    let p = publish(&fx, "1", "x");
    assert_eq!(p["pruned"], serde_json::json!([]), "{p}");
    publish(&fx, "2", "x");
    let p = publish(&fx, "3", "x");
    assert_eq!(p["status"], "published", "{p}");
    assert_eq!(p["pruned"], serde_json::json!(["vc-2-x"]), "{p}");
    assert_eq!(branch_keys(&fx), ["vc-3-x"]);
    // Another platform value: x keeps its newest key (which is also the
    // key today's pins give with x), y gains one.
    publish(&fx, "3", "y");
    assert_eq!(branch_keys(&fx), ["vc-3-x", "vc-3-y"]);
    let p = publish(&fx, "4", "y");
    assert_eq!(p["pruned"], serde_json::json!(["vc-3-y"]), "{p}");
    assert_eq!(branch_keys(&fx), ["vc-3-x", "vc-4-y"]);
    // keep = 0: only the keys today's pins give (one per platform value)
    // stay, and the one just published is among them.
    manifest(&fx, "\n[publish]\nkeep = 0\n");
    let p = publish(&fx, "5", "y");
    assert_eq!(p["pruned"], serde_json::json!(["vc-3-x", "vc-4-y"]), "{p}");
    assert_eq!(branch_keys(&fx), ["vc-5-y"]);
    // A setting that is not a count is refused (exit 10), nothing pushed.
    manifest(&fx, "\n[publish]\nkeep = \"some\"\n");
    let r = fx.xtask(&["cache", "publish", "vc"]).expect_code(10);
    assert!(r.stderr().contains("keep"), "{}", r.stderr());
    manifest(&fx, "\n[publish]\nkeep = -1\n");
    fx.xtask(&["cache", "publish", "vc"]).expect_code(10);
    assert_eq!(branch_keys(&fx), ["vc-5-y"]);
}

#[test]
fn cache_prune_that_loses_its_lease_chooses_again_on_the_moved_branch() {
    use std::os::unix::fs::PermissionsExt;
    let fx = verification_cache("");
    for src in ["1", "2", "3"] {
        publish(&fx, src, "x");
    }
    let c3 = fx.env.git("origin.git", ["rev-parse", "vc-cache"]);
    publish(&fx, "4", "x");
    let c4 = fx.env.git("origin.git", ["rev-parse", "vc-cache"]);
    fx.env.git(
        "origin.git",
        ["update-ref", "refs/heads/vc-cache", c3.trim()],
    );
    // Another publisher lands vc-4-x while the prune is pushing: the hook
    // moves the branch once, before the server updates the ref.
    let marker = fx.env.join("moved");
    let hook = fx.env.join("origin.git/hooks/pre-receive");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\ncat >/dev/null\nif [ ! -e '{m}' ]; then touch '{m}'; env -u GIT_QUARANTINE_PATH git update-ref refs/heads/vc-cache {c4}; fi\n",
            m = marker.display(),
            c4 = c4.trim()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    pins(&fx, "1", "x");
    let j = fx.json(&["cache", "prune", "vc", "--keep", "1", "--json"]);
    assert!(marker.exists(), "the hook never ran");
    assert_eq!(j["status"], "pruned", "{j}");
    assert_eq!(j["retries"], 1, "{j}");
    // Chosen again on what the branch held after the move: vc-4-x (newest)
    // and vc-1-x (today's pins) stay, vc-2-x and vc-3-x go.
    assert_eq!(keys_of(&j, "dropped"), ["vc-2-x", "vc-3-x"]);
    assert_eq!(branch_keys(&fx), ["vc-1-x", "vc-4-x"]);
    let count = fx
        .env
        .git("origin.git", ["rev-list", "--count", "vc-cache"]);
    assert_eq!(count.trim(), "1");
}
