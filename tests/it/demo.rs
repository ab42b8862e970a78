//! `cargo xtask demo`: the README's first command, run for real.

use crate::util::tree::make_tricky_tree;
use crate::util::{TestEnv, run};

/// With no arguments, from a directory that is not a repository: the
/// default source (this machine's Rust toolchain) is published to a scratch
/// origin, restored into a fresh clone, and found equal.
#[test]
fn demo_runs_with_no_setup() {
    let env = TestEnv::new();
    let r = run(env.xtask().arg("demo")).ok();
    let out = r.stdout();
    for want in [
        "lib/rustlib",
        "published demo-v1-",
        "unchanged:",
        "restored demo-v1-",
        "(warm,",
        "equal: ",
        "| restore again (warm) |",
        "warmstart cache publish <name>",
    ] {
        assert!(out.contains(want), "demo output lacks {want:?}:\n{out}");
    }
    // The scratch directory is gone.
    let scratch = out
        .lines()
        .find_map(|l| l.strip_prefix("scratch  "))
        .and_then(|l| l.split(' ').next())
        .unwrap()
        .to_string();
    assert!(
        !std::path::Path::new(&scratch).exists(),
        "{scratch} was left behind"
    );
}

#[test]
fn demo_with_a_tricky_source_reports_json() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    let r = run(env
        .xtask()
        .args(["demo", "--json", "--keep", "--source"])
        .arg(&src))
    .ok();
    let s: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(s["equal"], true);
    assert_eq!(s["tar_sha256"], s["restored_tar_sha256"]);
    assert!(s["entries"].as_u64().unwrap() > 20);
    for step in [
        "publish",
        "publish_unchanged",
        "restore",
        "restore_warm",
        "compare",
    ] {
        assert!(s["timings_ms"][step].is_u64(), "{step}: {s}");
    }
    let scratch = std::path::PathBuf::from(s["scratch"].as_str().unwrap());
    crate::util::tree::assert_same_tree(&src, &scratch.join("clone/restored"));
    std::fs::remove_dir_all(&scratch).unwrap();

    let r = run(env
        .xtask()
        .args(["demo", "--source"])
        .arg(env.join("missing")));
    assert_eq!(r.code(), 4, "{}", r.stderr());
    assert!(r.stderr().contains("--source"), "{}", r.stderr());
}
