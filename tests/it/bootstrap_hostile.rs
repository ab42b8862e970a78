//! The generated bootstrap script against a manifest someone pushed: the
//! cache ref it fetches must pass the same rules the binary applies to
//! `cache.ref` and `cache.branch`, so a ref can never become a refspec that
//! writes this clone's refs, nor an option of `git fetch`.

use crate::util::rng::Rng;
use crate::util::{TestEnv, run};

/// The manifest line that names where the binary cache lives, each hostile.
fn hostile_lines(marker: &str) -> Vec<String> {
    let good = "refs/warmstart/cache/warmstart-bin";
    let mut refs: Vec<String> = [
        format!("+{good}:refs/remotes/origin/main"),
        format!("{good}:refs/remotes/origin/main"),
        format!("{good}:refs/heads/stolen"),
        format!("--upload-pack=touch {marker}"),
        format!("-{good}"),
        "refs/remotes/origin/main".into(),
        "refs/tags/v1".into(),
        "refs/warmstart/gates/abc".into(),
        "warmstart-bin-cache".into(),
        "refs/x".into(),
        format!("{good} x"),
        format!("{good}..x"),
        format!("{good}.lock"),
        format!("{good}/"),
        "refs/warmstart//cache".into(),
        format!("{good}*"),
        format!("{good}^"),
        format!("{good}~1"),
        format!("{good}?"),
        format!("{good}["),
    ]
    .into();
    // Each character the binary refuses, at a random place of a good ref.
    let mut rng = Rng(0x5eed_b007);
    for _ in 0..12 {
        let bad = [':', '~', '^', '?', '*', '[', ' ', '\t'][rng.below(8)];
        let at = 5 + rng.below(good.len() - 5);
        refs.push(format!("{}{bad}{}", &good[..at], &good[at..]));
    }
    let mut lines: Vec<String> = refs.iter().map(|r| format!("ref = \"{r}\"")).collect();
    for b in [
        "x:refs/remotes/origin/main",
        "+x:refs/heads/stolen",
        "refs/warmstart/cache/warmstart-bin",
        "--upload-pack=touch MARK",
        "a b",
    ] {
        lines.push(format!("branch = \"{}\"", b.replace("MARK", marker)));
    }
    lines
}

/// Never fetches (nor runs) what a hostile `cache.ref` or `cache.branch`
/// names: every ref the binary refuses in the manifest (exit 10) the script
/// refuses before any git fetch, naming the field, with this clone's refs
/// untouched and no `--upload-pack` command run.
#[test]
fn bootstrap_never_fetches_a_cache_ref_the_binary_refuses() {
    let env = TestEnv::new();
    let repo = env.work_repo("r");
    run(env.xtask_in("r").args(["init"])).ok();
    env.git("r", ["add", "-A"]);
    env.git("r", ["commit", "-q", "-m", "init"]);
    let origin = env.bare_remote("origin.git");
    env.git("r", ["remote", "add", "origin", origin.to_str().unwrap()]);
    env.git("r", ["push", "-q", "origin", "main"]);
    // Something to fetch at the cache ref, so a refspec would succeed.
    let tree = env.git("r", ["rev-parse", "HEAD^{tree}"]);
    let orphan = env.git("r", ["commit-tree", "-m", "cache", tree.trim()]);
    let spec = format!("{}:refs/warmstart/cache/warmstart-bin", orphan.trim());
    env.git("r", ["push", "-q", "origin", &spec]);
    let before = env.git("r", ["for-each-ref"]);

    let manifest = repo.join("cache-manifests/warmstart-bin.toml");
    let original = std::fs::read_to_string(&manifest).unwrap();
    let line = original
        .lines()
        .find(|l| l.starts_with("ref = "))
        .expect("init writes cache.ref")
        .to_string();
    let marker = env.join("upload-pack-ran");
    let cases = hostile_lines(marker.to_str().unwrap());
    for case in &cases {
        std::fs::write(&manifest, original.replace(&line, case)).unwrap();
        let binary =
            run(env
                .xtask_in("r")
                .args(["cache", "publish", "warmstart-bin", "--key-only"]));
        assert_eq!(
            binary.code(),
            10,
            "the binary takes {case}:\n{}",
            binary.stderr()
        );
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(repo.join("tools/warmstart-bootstrap.sh"))
            .arg("--prebuilt-only")
            .current_dir(&repo);
        env.isolate(&mut cmd);
        let r = run(&mut cmd);
        let err = r.stderr();
        let field = if case.starts_with("ref") {
            "cache.ref"
        } else {
            "cache.branch"
        };
        assert_ne!(r.code(), 0, "{case}:\n{err}");
        assert!(
            err.contains(field) && !err.contains("binary cache:"),
            "{case}:\n{err}"
        );
        assert!(
            !marker.exists(),
            "{case}: git fetch ran --upload-pack:\n{err}"
        );
        assert_eq!(env.git("r", ["for-each-ref"]), before, "{case}:\n{err}");
    }
    println!("{} hostile cache refs refused by both", cases.len());

    // The ref init writes is still fetched.
    std::fs::write(&manifest, &original).unwrap();
    let mut cmd = std::process::Command::new("bash");
    cmd.arg(repo.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&repo);
    env.isolate(&mut cmd);
    let err = run(&mut cmd).stderr();
    assert!(
        err.contains("binary cache: refs/warmstart/cache/warmstart-bin has no"),
        "{err}"
    );
}
