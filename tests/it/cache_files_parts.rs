//! The files index in parts (`index_parts` in `warmstart.json`): a branch
//! this binary publishes is read correctly by the binary and the bootstrap
//! script adopters already run (warmstart at tools/compat-commit.txt, built
//! by tools/compat-bin.sh and named by `WARMSTART_COMPAT_BIN`; the script
//! vendored in tests/it/compat/), and by the coreutils recipe of
//! docs/format.md; and a 1% change of a tree of many files pushes only
//! the parts of the index it touched, and the delta restore after it is
//! correct.

use crate::cache_format_compat::{Cx, assert_readable_by_old_binaries, coreutils_restore};
use crate::util::fixture::{Fixture, Manifest, Serve};
use crate::util::tree::assert_same_tree;
use crate::util::{Run, run, show, source_root};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The released binary the suite checks against: never skipped.
fn compat_bin() -> PathBuf {
    let Some(bin) = std::env::var_os("WARMSTART_COMPAT_BIN") else {
        panic!(
            "WARMSTART_COMPAT_BIN is not set: it names the released warmstart these tests run (tools/test.sh sets it; by hand: export WARMSTART_COMPAT_BIN=$(tools/compat-bin.sh))"
        );
    };
    let bin = PathBuf::from(bin);
    assert!(
        bin.is_file(),
        "WARMSTART_COMPAT_BIN={} is not a file",
        bin.display()
    );
    bin
}

/// The released binary run as the current one would be, in `cx`'s `work`.
fn released(cx: &Cx, args: &[&str]) -> Run {
    let mut cmd = Command::new(compat_bin());
    cmd.current_dir(&cx.work).args(args);
    cx.env.isolate(&mut cmd);
    run(&mut cmd)
}

/// Restores `art` with the released binary: installed, equal to the tree,
/// and at most the one line saying the index cannot be used.
fn released_restores(cx: &Cx, key: &str) {
    let r = released(cx, &["cache", "restore", "art", "--json"]).ok();
    let j: Value = serde_json::from_str(&r.stdout()).unwrap_or_else(|_| panic!("{}", show(&r.out)));
    assert_eq!(
        (j["state"].as_str(), j["key"].as_str()),
        (Some("restored"), Some(key)),
        "{j}"
    );
    assert_same_tree(&cx.src(), &cx.target);
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains(".files.zst")).collect();
    assert!(lines.len() <= 1, "{err}");
    for l in lines {
        assert!(l.contains(&format!("installing {key} in full")), "{l}");
    }
}

#[test]
fn cache_files_parts_a_new_branch_is_read_by_the_released_binary_and_coreutils() {
    let cx = Cx::new();
    cx.publish(None).ok();
    let files = cx.branch();
    assert!(
        files.contains_key("art-1.files.zst.part000"),
        "{:?}",
        files.keys()
    );
    assert!(!files.contains_key("art-1.files.zst"), "{:?}", files.keys());
    assert_readable_by_old_binaries(&files, "art-1");
    released_restores(&cx, "art-1");

    // A second key over the released binary's own install of the first,
    // and the current binary's delta after it.
    cx.pin("2", "");
    cx.content("v2");
    cx.commit("pin 2");
    cx.publish(None).ok();
    released_restores(&cx, "art-2");
    let dest = cx.env.join("dest");
    let out = coreutils_restore(&cx, "art-2", &dest);
    assert!(out.status.success(), "{}", show(&out));
    assert_same_tree(&cx.src(), &dest);
    // `cat <key>.files.zst.part* | zstd -d` is the index.
    let out = Command::new("sh")
        .current_dir(cx.env.join("plain/tmp"))
        .arg("-c")
        .arg("cat art-2.files.zst.part* | zstd -d -q | head -1")
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "warmstart-files 1\n",
        "{}",
        show(&out)
    );
}

#[test]
fn cache_files_parts_a_new_branch_is_installed_by_the_released_bootstrap_script() {
    let fx = Fixture::served();
    let tools = fx.work.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        source_root().join("tests/it/compat/warmstart-bootstrap-425acc8.sh"),
        tools.join("warmstart-bootstrap.sh"),
    )
    .unwrap();
    Manifest::literal("1", fx.env.join("src"))
        .restore_path("inst/tool")
        .extra("\n[bootstrap]\nexec = \"tool\"\n")
        .write(&fx.work, "tool");
    fx.write(".gitignore", "/inst\n");
    fx.env.git(&fx.work, ["add", "-A"]);
    fx.env.git(&fx.work, ["commit", "-q", "-m", "binary cache"]);
    let exe = fx.env.join("src/tool");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::write(&exe, "#!/bin/sh\necho \"tool v1 $*\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    fx.xtask(&["cache", "publish", "tool", "--quiet", "--allow-ungated"])
        .ok();
    let names = fx
        .env
        .git("srv/origin.git", ["ls-tree", "--name-only", "tool-cache"]);
    assert!(names.contains("tool-1.files.zst.part000"), "{names}");

    let mut cmd = Command::new("bash");
    cmd.arg(tools.join("warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&fx.work);
    fx.env.isolate(&mut cmd);
    let r = run(&mut cmd);
    assert!(
        r.stderr().contains("binary cache: installed tool-1"),
        "{}",
        show(&r.out)
    );
    assert!(r.stdout().contains("tool v1"), "{}", show(&r.out));
    assert_same_tree(&fx.env.join("src"), &fx.work.join("inst/tool"));
}

/// Files in the many-files tree, with long paths: enough index text for
/// about 70 parts (a real tree of 50,000 files has about three hundred).
const MANY: usize = 8_000;

fn many_rel(i: usize) -> String {
    let deep = "documentation-of-the-generated-site/reference-manual-for-every-module/";
    format!("{deep}{deep}chapter-{:03}/page-{i:05}.html", i / 160)
}

/// `MANY` small pages; those in `changed` rewritten at the same size.
fn many_files(dir: &Path, changed: &[std::ops::Range<usize>]) {
    let _ = std::fs::remove_dir_all(dir);
    for i in 0..MANY {
        let p = dir.join(many_rel(i));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        let tag = if changed.iter().any(|r| r.contains(&i)) {
            "new"
        } else {
            "old"
        };
        std::fs::write(&p, format!("<p>{i:05} {tag}</p>\n")).unwrap();
    }
}

/// The index parts of `key` on `branch` in `bare`: (name, blob id, size).
fn parts_of(fx: &Fixture, branch: &str, key: &str) -> Vec<(String, String, u64)> {
    let listing = fx.env.git("origin.git", ["ls-tree", "-l", branch]);
    listing
        .lines()
        .filter_map(|l| {
            let (meta, name) = l.split_once('\t')?;
            let f: Vec<&str> = meta.split_whitespace().collect();
            name.starts_with(&format!("{key}.files.zst.part"))
                .then(|| (name.to_string(), f[2].to_string(), f[3].parse().unwrap()))
        })
        .collect()
}

#[test]
fn cache_files_parts_a_one_percent_change_pushes_only_the_parts_it_touched() {
    let fx = Fixture::serve(Serve::RelativePath);
    Manifest::pinned("pins.txt", "../many")
        .cache("description = \"many\"")
        .restore_path(fx.env.join("installed/many"))
        .write(&fx.work, "many");
    let tree = fx.env.join("many");
    many_files(&tree, &[]);
    fx.write("pins.txt", "v=1\n");
    fx.publish("many");
    fx.restore("many");
    // 1% of the files in three runs of the path order, one at the start.
    let n = MANY / 300;
    let runs = [
        0..n,
        MANY * 2 / 5..MANY * 2 / 5 + n,
        MANY * 4 / 5..MANY * 4 / 5 + n,
    ];
    many_files(&tree, &runs);
    fx.write("pins.txt", "v=2\n");
    fx.publish("many");

    let (old, new) = (
        parts_of(&fx, "many-cache", "many-1"),
        parts_of(&fx, "many-cache", "many-2"),
    );
    let had: BTreeSet<&str> = old.iter().map(|p| p.1.as_str()).collect();
    let whole: u64 = new.iter().map(|p| p.2).sum();
    let sent: Vec<&(String, String, u64)> =
        new.iter().filter(|p| !had.contains(p.1.as_str())).collect();
    let sent_bytes: u64 = sent.iter().map(|p| p.2).sum();
    println!(
        "index of {MANY} files: {} parts, {whole} bytes; after the change {} new parts, {sent_bytes} bytes ({:.1}%)",
        new.len(),
        sent.len(),
        100.0 * sent_bytes as f64 / whole as f64
    );
    assert!(new.len() >= 30, "{} parts", new.len());
    // Each changed run costs a part or two, whatever the tree: here that is
    // under a tenth of the index, on 24,000 files of shorter paths 5.2%.
    assert!(sent.len() <= 2 * runs.len(), "{} new parts", sent.len());
    assert!(
        sent_bytes * 10 <= whole,
        "{sent_bytes} of {whole} index bytes are new"
    );

    // The delta restore after it links the rest and equals the tree.
    let j = fx.restore("many");
    assert_eq!(j["state"], "restored", "{j}");
    assert!(
        j["files_linked"].as_u64().unwrap() > (MANY as u64) * 9 / 10,
        "{j}"
    );
    assert_same_tree(&tree, &fx.env.join("installed/many"));
}
