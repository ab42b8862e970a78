//! Both hand-made legacy branch shapes restore: an archive split into
//! `X.partNN` pieces, and a whole archive stored in the tree, each named by
//! `SHA256SUMS` and checked before a byte of it is decompressed.
//!
//! The branches are made here by shell (tar, gzip, split, sha256sum, git),
//! as the bootstraps that warmstart replaces made them, and served by
//! `git daemon` on 127.0.0.1.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{run, show};

use std::path::{Path, PathBuf};
use std::process::Command;

/// Makes a legacy branch by hand and pushes it as the one root commit of
/// `BRANCH`. SHAPE `split`: `NAME.partNN` pieces of 1 MiB, SHA256SUMS names
/// the (absent) whole; `whole`: NAME stored in the tree, `sha256sum -c` works.
/// FLIP (optional): an offset whose byte is flipped in the stored archive
/// after SHA256SUMS was written.
const MAKE_LEGACY: &str = r#"set -euo pipefail
src=$1; remote=$2; branch=$3; name=$4; shape=$5; flip=${6:-}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir "$work/tree"; cd "$work/tree"
tar -C "$src" -czf "$work/$name" .
if [ "$shape" = split ]; then
  split -b 1m -d -a 2 "$work/$name" "$name.part"
  cat "$name".part* | sha256sum | sed "s/-\$/$name/" > SHA256SUMS
  stored=$name.part00
else
  cp "$work/$name" .
  sha256sum "$name" > SHA256SUMS
  stored=$name
fi
if [ -n "$flip" ]; then
  b=$(od -An -tu1 -j "$flip" -N1 "$stored" | tr -d ' ')
  printf "$(printf '\\%03o' $(( b ^ 64 )))" | dd of="$stored" bs=1 seek="$flip" conv=notrunc status=none
fi
git init -q . && git checkout -q --orphan "$branch"
git add -A && git commit -q -m "$branch snapshot"
git push -q -f "$remote" "$branch:refs/heads/$branch"
"#;

/// A work repository with manifest `vc` (branch `vc-cache`, key `v` pinned
/// in `pin.txt`), its origin `srv/origin.git` served by git daemon, and the
/// script that makes legacy branches.
fn legacy_cache() -> Fixture {
    let fx = Fixture::served();
    let m = Manifest::pinned("pin.txt", "src")
        .cache("branch = \"vc-cache\"\ndescription = \"verification cache\"")
        .restore_path(target(&fx));
    fx.write_manifest("vc", &m);
    std::fs::write(fx.env.join("make_legacy.sh"), MAKE_LEGACY).unwrap();
    pin(&fx, "1");
    fx
}

fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed/vc")
}

fn pin(fx: &Fixture, v: &str) {
    fx.write("pin.txt", &format!("v={v}\n"));
}

/// A tree with every kind of entry and a 3 MiB file, so that the whole
/// archive is a blob the filtered branch fetch leaves out.
fn source(fx: &Fixture, name: &str, seed: u64) -> PathBuf {
    let src = fx.env.join(name);
    make_tricky_tree(&src, false);
    write_pseudo_random(&src.join("checked/big.bin"), 3 << 20, seed);
    src
}

fn publish_legacy(fx: &Fixture, src: &Path, name: &str, shape: &str, flip: Option<u64>) {
    let mut cmd = Command::new("bash");
    cmd.arg(fx.env.join("make_legacy.sh"))
        .arg(src)
        .arg(&fx.origin)
        .arg("vc-cache")
        .arg(name)
        .arg(shape);
    if let Some(f) = flip {
        cmd.arg(f.to_string());
    }
    fx.env.isolate(&mut cmd);
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "make_legacy.sh\n{}", show(&r.out));
}

fn assert_no_leftovers(fx: &Fixture) {
    let target = target(fx);
    let stray: Vec<String> = std::fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "vc")
        .collect();
    assert!(stray.is_empty(), "leftovers beside the target: {stray:?}");
}

#[test]
fn cache_legacy_both_hand_made_shapes_restore_byte_exact_and_show_as_legacy() {
    let fx = legacy_cache();
    let sha = "0123456789abcdef0123456789abcdef01234567";
    let whole_name = format!("checked-{sha}-fstar2025.10.6.tar.gz");
    for (i, (shape, name)) in [("split", "cache.tar.gz"), ("whole", whole_name.as_str())]
        .into_iter()
        .enumerate()
    {
        let src = source(&fx, &format!("src-{shape}"), i as u64 + 1);
        publish_legacy(&fx, &src, name, shape, None);
        // The whole archive is named for fstar 2025.10.6: the key pins it.
        pin(&fx, &format!("{shape}-2025.10.06"));
        let j = fx.json(&["cache", "restore", "vc", "--json"]);
        assert_eq!(j["state"], "restored", "{j}");
        assert_eq!(j["layout"], "legacy-gzip", "{j}");
        // Read twice (checked whole, then decoded), and the tar hashed.
        let compressed = j["compressed_bytes"].as_u64().unwrap();
        assert!(compressed > 3 << 20, "{j}");
        assert_eq!(
            j["bytes_hashed"].as_u64().unwrap(),
            2 * compressed + j["tar_bytes"].as_u64().unwrap(),
            "{j}"
        );
        assert_same_tree(&src, &target(&fx));
        assert_eq!(
            fx.json(&["cache", "restore", "vc", "--json"])["state"],
            "warm"
        );
        let st = fx.json(&["cache", "status", "vc", "--json"]);
        let remote = &st["caches"][0]["remote_state"];
        assert_eq!(remote["state"], "legacy", "{st}");
        let said = remote["error"].as_str().unwrap();
        let shape_words = if shape == "whole" {
            "stored whole"
        } else {
            "in 4 parts"
        };
        assert!(said.contains(name) && said.contains(shape_words), "{said}");
        let human = fx.xtask(&["cache", "status", "vc"]).ok().stdout();
        assert!(human.contains("legacy"), "{human}");
        // `cache verify` reads the same shapes.
        let v = fx.xtask(&["cache", "verify", "vc"]);
        assert_eq!(v.code(), 0, "{}", show(&v.out));
        // A legacy branch has no keys to prune: exit 4, branch untouched.
        let p = fx
            .xtask(&["cache", "prune", "vc", "--keep", "1"])
            .expect_code(4);
        assert!(p.stderr().contains("legacy branch"), "{}", p.stderr());
    }
}

/// A legacy archive named for a version is installed only for a key that
/// pins that version: key 2025.12.01 never installs `fstar-2025.10.06`
/// unless the manifest maps the two.
#[test]
fn cache_legacy_archive_named_for_another_version_is_refused_unless_mapped() {
    let fx = legacy_cache();
    let src = source(&fx, "src-old", 7);
    let archive = "fstar-2025.10.06.tar.gz";
    publish_legacy(&fx, &src, archive, "whole", None);
    pin(&fx, "2025.12.01");
    let r = fx.xtask(&["cache", "restore", "vc"]).expect_code(4);
    let err = r.stderr();
    assert!(
        err.contains(&format!(
            "legacy branch vc-cache holds {archive} (version 2025.10.6), but key "
        )) && err.contains("pins 2025.12.01")
            && err.contains("legacy_versions = { \"2025.12.01\" = \"2025.10.6\" }"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(!target(&fx).exists(), "nothing installed");
    // The pinned version restores it.
    pin(&fx, "2025.10.6");
    assert_eq!(
        fx.json(&["cache", "restore", "vc", "--json"])["state"],
        "restored"
    );
    assert_same_tree(&src, &target(&fx));
    // An explicit mapping lets the newer key use the older archive.
    std::fs::remove_dir_all(target(&fx)).unwrap();
    fx.forget();
    let m = Manifest::pinned("pin.txt", "src")
        .cache("branch = \"vc-cache\"\ndescription = \"verification cache\"")
        .restore_path(target(&fx))
        .restore_line("legacy_versions = { \"2025.12.01\" = \"2025.10.06\" }");
    fx.write_manifest("vc", &m);
    pin(&fx, "2025.12.01");
    assert_eq!(
        fx.json(&["cache", "restore", "vc", "--json"])["state"],
        "restored"
    );
    assert_same_tree(&src, &target(&fx));
}

#[test]
fn cache_legacy_a_flipped_byte_in_the_whole_archive_is_refused_before_decoding() {
    let fx = legacy_cache();
    let name = "checked-feed-fstar1.tar.gz";
    let good = source(&fx, "src-good", 7);
    publish_legacy(&fx, &good, name, "whole", None);
    fx.xtask(&["cache", "restore", "vc"]).ok();
    assert_same_tree(&good, &target(&fx));

    let other = source(&fx, "src-other", 8);
    // Offsets in the gzip header, the middle and the trailer.
    for (n, flip) in [20u64, 1 << 20, 2 << 20].into_iter().enumerate() {
        publish_legacy(&fx, &other, name, "whole", Some(flip));
        pin(&fx, &format!("bad{n}"));
        // The decode pass kills the process at its first piece: reaching
        // exit 6 instead proves the decoder never started.
        let r = run(fx
            .env
            .xtask_in("work")
            .args(["cache", "restore", "vc"])
            .env("WARMSTART_TEST_KILL_AT", "restore:first-chunk-decoding"))
        .expect_code(6);
        let e = r.stderr();
        assert!(e.contains(name) && e.contains("SHA256SUMS"), "{e}");
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert_same_tree(&good, &target(&fx));
        assert_no_leftovers(&fx);
    }
    // The old install is still the warm one for its own key.
    pin(&fx, "1");
    assert_eq!(
        fx.json(&["cache", "restore", "vc", "--json"])["state"],
        "warm"
    );
    let _ = &fx.daemon;
}
