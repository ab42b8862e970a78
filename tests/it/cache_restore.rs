//! `cargo xtask cache restore | verify | list | status` against real git remotes.
//!
//! Branches are built here independently of warmstart's publisher: python's
//! tarfile, the zstd CLI and git plumbing (`cache_restore/make_branch.py`),
//! or the old shell recipe (`cache_restore/seed_recipe.sh`, a verbatim copy of
//! ../shared/bench/seed_recipe.sh). Remotes are bare repositories over
//! file:// or served by `git daemon` on 127.0.0.1.

use crate::util::fixture::{Fixture, Manifest, json_of};
use crate::util::tree::{assert_same_tree, make_tricky_tree};
use crate::util::{Run, run, show};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MAKE_BRANCH: &str = include_str!("cache_restore/make_branch.py");
const SEED_RECIPE: &str = include_str!("cache_restore/seed_recipe.sh");

/// The manifest of a cache on `tc-cache`: key `v` pinned in `pin.txt`,
/// packing `src`, restoring into `target` in `mode`.
fn tc_manifest(target: &Path, mode: &str) -> Manifest {
    Manifest::pinned("pin.txt", "src")
        .cache("branch = \"tc-cache\"\ndescription = \"test cache\"")
        .restore_path(target)
        .restore_line(&format!("mode = \"{mode}\""))
}

/// A work repository with the `tc` cache manifest (key `tc-<pin>`), a bare
/// origin by path, and the branch builder.
fn test_cache() -> Fixture {
    let fx = Fixture::new();
    pin(&fx, "1");
    manifest(&fx, "");
    std::fs::write(fx.env.join("make_branch.py"), MAKE_BRANCH).unwrap();
    fx
}

/// The target directory, outside both repositories.
fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed/tc")
}

/// Writes `cache-manifests/tc.toml`, restoring into `target`; `extra` is
/// appended (e.g. a `[ready]` table).
fn manifest(fx: &Fixture, extra: &str) {
    manifest_named(fx, "tc", &target(fx), "replace", extra);
}

fn manifest_named(fx: &Fixture, name: &str, target: &Path, mode: &str, extra: &str) {
    fx.write_manifest(name, &tc_manifest(target, mode).extra(extra));
}

/// Moves the key's pin.
fn pin(fx: &Fixture, v: &str) {
    fx.write("pin.txt", &format!("v={v}\n"));
}

/// Writes the files of a branch from `spec` (see make_branch.py), in the
/// first `branch-<n>` not taken.
fn branch_files(fx: &Fixture, spec: Value) -> PathBuf {
    let n = (1..)
        .find(|n| !fx.env.join(format!("spec-{n}.json")).exists())
        .unwrap();
    let out = fx.env.join(format!("branch-{n}"));
    let spec_file = fx.env.join(format!("spec-{n}.json"));
    std::fs::write(&spec_file, spec.to_string()).unwrap();
    let mut cmd = Command::new("python3");
    cmd.arg(fx.env.join("make_branch.py"))
        .arg(&out)
        .arg(&spec_file);
    let r = run(&mut cmd);
    assert_eq!(r.code(), 0, "make_branch.py failed\n{}", show(&r.out));
    out
}

/// Commits the files of `dir` as the single root commit of `branch` on
/// the origin (force), with git plumbing only.
fn push_dir(fx: &Fixture, dir: &Path, branch: &str) {
    let git_dir = fx.env.join("pusher.git");
    if !git_dir.exists() {
        fx.env
            .git(".", ["init", "-q", "--bare", git_dir.to_str().unwrap()]);
    }
    let g = |args: &[&str]| {
        let mut all = vec![
            format!("--git-dir={}", git_dir.display()),
            format!("--work-tree={}", dir.display()),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        fx.env.git(".", all)
    };
    g(&["read-tree", "--empty"]);
    g(&["add", "-A", "."]);
    let tree = g(&["write-tree"]).trim().to_string();
    let commit = g(&["commit-tree", &tree, "-m", "test cache"])
        .trim()
        .to_string();
    g(&[
        "push",
        "-q",
        "-f",
        fx.origin.to_str().unwrap(),
        &format!("{commit}:refs/heads/{branch}"),
    ]);
}

/// Builds a branch from `spec` and pushes it as `tc-cache`.
fn publish(fx: &Fixture, spec: Value) -> PathBuf {
    let dir = branch_files(fx, spec);
    push_dir(fx, &dir, "tc-cache");
    dir
}

fn restore(fx: &Fixture) -> Run {
    fx.xtask(&["cache", "restore", "tc"])
}

/// `cache restore tc --json`, which must succeed; its JSON.
fn restore_json(fx: &Fixture) -> Value {
    fx.restore("tc")
}

fn state_dir(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart")
}

/// Asserts no staging or swap leftovers sit beside the target.
fn assert_no_leftovers(fx: &Fixture) {
    let target = target(fx);
    let parent = target.parent().unwrap();
    let Ok(rd) = std::fs::read_dir(parent) else {
        return;
    };
    let stray: Vec<String> = rd
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != "tc")
        .collect();
    assert!(stray.is_empty(), "leftovers beside the target: {stray:?}");
}

/// A small tree with every kind of entry, made on disk.
fn small_tree(dir: &Path, flavour: &str) {
    make_tricky_tree(dir, false);
    std::fs::write(dir.join("flavour.txt"), flavour).unwrap();
}

fn key_spec(dir: &Path, v: &str) -> Value {
    json!({ "dir": dir, "parts": [{ "name": "v", "value": v }] })
}

#[test]
fn cache_restore_installs_a_v1_branch_built_without_our_publisher_then_runs_warm() {
    let fx = test_cache();
    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(
        &fx,
        json!({ "chunk_bytes": 4096, "keys": { "tc-1": key_spec(&src, "1") } }),
    );

    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["key"], "tc-1");
    assert_eq!(j["layout"], "v1");
    // Every chunk byte is hashed twice (verified, then re-hashed on its way
    // to the decoder); the tar is not hashed on a plain restore.
    assert_eq!(
        j["bytes_hashed"].as_u64().unwrap(),
        2 * j["compressed_bytes"].as_u64().unwrap(),
        "{j}"
    );
    assert_same_tree(&src, &target(&fx));
    assert_no_leftovers(&fx);

    // Warm: nothing fetched, nothing hashed, same tree.
    let j = restore_json(&fx);
    assert_eq!(j["state"], "warm", "{j}");
    assert_eq!(j["bytes_hashed"], 0);
    assert_eq!(j["tar_bytes"], 0);
    assert_same_tree(&src, &target(&fx));

    // The text summary says what happened, on stdout.
    let r = restore(&fx).ok();
    assert!(
        r.stdout().contains("tc-1 is installed at"),
        "{}",
        r.stdout()
    );
    let r = fx.xtask(&["cache", "restore", "tc", "--quiet"]).ok();
    assert_eq!(r.stdout(), "");
}

#[test]
fn cache_restore_warm_needs_no_remote_and_no_chunk_objects() {
    let fx = test_cache();
    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(
        &fx,
        json!({ "chunk_bytes": 4096, "keys": { "tc-1": key_spec(&src, "1") } }),
    );
    assert_eq!(restore_json(&fx)["state"], "restored");

    // The remote is gone and so are the fetched objects: a warm run can
    // neither fetch nor read (let alone hash) a chunk, and still succeeds.
    std::fs::rename(&fx.origin, fx.env.join("origin-gone.git")).unwrap();
    let objects = state_dir(&fx).join("cache.git/objects");
    std::fs::remove_dir_all(&objects).unwrap();
    std::fs::create_dir(&objects).unwrap();
    let j = restore_json(&fx);
    assert_eq!(j["state"], "warm", "{j}");
    assert_eq!(j["bytes_hashed"], 0);
    assert_same_tree(&src, &target(&fx));

    // A cold run now fails as it should: the remote is unreachable (exit 8),
    // and the install stays as it was.
    pin(&fx, "2");
    let r = restore(&fx).expect_code(8);
    assert!(r.stderr().contains("tc-cache"), "{}", r.stderr());
    assert_same_tree(&src, &target(&fx));
}

#[test]
fn cache_restore_of_a_moved_pin_installs_the_new_key() {
    let fx = test_cache();
    let (s1, s2) = (fx.env.join("src1"), fx.env.join("src2"));
    small_tree(&s1, "one");
    small_tree(&s2, "two");
    std::fs::write(s2.join("only-in-two"), "2").unwrap();
    publish(
        &fx,
        json!({ "chunk_bytes": 4096, "keys": {
            "tc-1": key_spec(&s1, "1"),
            "tc-2": key_spec(&s2, "2"),
        }}),
    );
    assert_eq!(restore_json(&fx)["key"], "tc-1");
    assert_same_tree(&s1, &target(&fx));

    pin(&fx, "2");
    // Status names the pin that moved, offline, from the stamp alone.
    let st = json_of(
        &fx.xtask(&["cache", "status", "tc", "--offline", "--json"])
            .ok(),
    );
    let local = &st["caches"][0]["local"];
    assert_eq!(local["state"], "stale", "{st}");
    assert_eq!(
        local["changed_parts"],
        json!([{ "name": "v", "installed": "1", "current": "2" }])
    );

    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored");
    assert_eq!(j["key"], "tc-2");
    assert_eq!(j["reason"], "installed key tc-1 differs: v 1 -> 2");
    assert_same_tree(&s2, &target(&fx));
    assert_eq!(restore_json(&fx)["state"], "warm");
    assert_no_leftovers(&fx);
}

#[test]
fn cache_restore_reports_missing_branch_key_and_remote_with_their_codes() {
    let fx = test_cache();
    let r = restore(&fx).expect_code(4);
    assert!(
        r.stderr().contains("has no branch tc-cache"),
        "{}",
        r.stderr()
    );

    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(&fx, json!({ "keys": { "tc-1": key_spec(&src, "1") } }));
    pin(&fx, "9");
    let r = restore(&fx).expect_code(4);
    assert!(
        r.stderr().contains("has no key tc-9 (it has tc-1)"),
        "{}",
        r.stderr()
    );
    // On a miss, status says which part of the key differs from the branch.
    let st = json_of(&fx.xtask(&["cache", "status", "tc", "--json"]).ok());
    let remote = &st["caches"][0]["remote_state"];
    assert_eq!(remote["state"], "key missing", "{st}");
    assert_eq!(remote["nearest"], "tc-1");
    assert_eq!(
        remote["differs"],
        json!([{ "name": "v", "branch": "1", "current": "9", "wanted": "9", "used": "1" }])
    );
    // The shape restore's `partial.differs` has, the old fields beside it.
    let keys: Vec<&String> = remote["differs"][0].as_object().unwrap().keys().collect();
    for field in ["name", "wanted", "used"] {
        assert!(keys.iter().any(|k| *k == field), "{field} in {keys:?}");
    }

    let r = fx
        .xtask(&[
            "cache",
            "restore",
            "tc",
            "--remote",
            "/nonexistent/origin.git",
        ])
        .expect_code(8);
    assert!(
        r.stderr().contains("cannot fetch tc-cache"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists());
}

/// Publishes a good key, restores it, then publishes `hostile` under key
/// `tc-bad` and restores that: it must fail with `code`, naming `needle`,
/// leaving the good install as it was.
fn refused(fx: &Fixture, good: &Path, hostile: Value, code: i32, needle: &str) -> String {
    pin(fx, "good");
    publish(
        fx,
        json!({ "keys": {
            "tc-good": key_spec(good, "good"),
            "tc-bad": hostile,
        }}),
    );
    assert_eq!(restore_json(fx)["key"], "tc-good");
    pin(fx, "bad");
    let r = restore(fx).expect_code(code);
    let err = r.stderr();
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
    assert!(err.lines().count() == 1, "one line: {err}");
    assert_same_tree(good, &target(fx));
    assert_no_leftovers(fx);
    // The stamp still describes the good install: going back is warm.
    pin(fx, "good");
    assert_eq!(restore_json(fx)["state"], "warm");
    err
}

#[test]
fn cache_restore_refuses_hostile_archives_naming_the_entry() {
    let fx = test_cache();
    let good = fx.env.join("good");
    small_tree(&good, "good");
    let outside = fx.env.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let entries = |e: Value| json!({ "entries": e });

    refused(
        &fx,
        &good,
        entries(json!([
            { "name": "ok.txt", "data": "fine" },
            { "name": "../escaped.txt", "data": "escaped" },
        ])),
        7,
        "`../escaped.txt`",
    );
    assert!(!target(&fx).parent().unwrap().join("escaped.txt").exists());

    let abs = fx.env.join("absolute-victim.txt");
    refused(
        &fx,
        &good,
        entries(json!([{ "name": abs, "data": "absolute" }])),
        7,
        &format!("`{}`: absolute path", abs.display()),
    );
    assert!(!abs.exists());

    // A symlink out of the target, then a write through it.
    refused(
        &fx,
        &good,
        entries(json!([
            { "name": "esc", "type": "symlink", "link": outside },
            { "name": "esc/evil.txt", "data": "evil" },
        ])),
        7,
        "`esc`",
    );
    // A symlink that stays inside, then a write through it.
    refused(
        &fx,
        &good,
        entries(json!([
            { "name": "d", "type": "dir" },
            { "name": "in", "type": "symlink", "link": "d" },
            { "name": "in/evil.txt", "data": "evil" },
        ])),
        7,
        "`in/evil.txt`",
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    refused(
        &fx,
        &good,
        entries(json!([{ "name": "hostname", "type": "hardlink", "link": "/etc/hostname" }])),
        7,
        "`hostname`",
    );
    refused(
        &fx,
        &good,
        entries(json!([{ "name": "null", "type": "chr" }])),
        7,
        "`null`: device nodes are refused",
    );
    // More bytes than warmstart.json declares.
    refused(
        &fx,
        &good,
        json!({
            "entries": [{ "name": "big.bin", "size": 300000 }],
            "declare_tar_size": 10240,
        }),
        7,
        "`big.bin`",
    );
}

/// A branch with several chunks, and the source it was made from.
fn chunked(fx: &Fixture, v: &str) -> (PathBuf, PathBuf) {
    let src = fx.env.join(format!("src-{v}"));
    small_tree(&src, v);
    crate::util::tree::write_pseudo_random(&src.join("random.bin"), 60_000, 7);
    let dir = branch_files(
        fx,
        json!({ "chunk_bytes": 16384, "keys": {
            format!("tc-{v}"): key_spec(&src, v),
        }}),
    );
    (src, dir)
}

#[test]
fn cache_restore_refuses_damaged_branches_before_installing() {
    let fx = test_cache();
    let (good_src, good_dir) = chunked(&fx, "1");
    push_dir(&fx, &good_dir, "tc-cache");
    restore(&fx).ok();
    assert_same_tree(&good_src, &target(&fx));

    let (_, dir) = chunked(&fx, "2");
    let chunks: Vec<String> = {
        let mut v: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".part"))
            .collect();
        v.sort();
        v
    };
    assert!(chunks.len() >= 4, "{chunks:?}");
    let last = chunks.len() - 1;
    type Damage<'a> = (&'a str, Box<dyn Fn(&Path)>, String);
    let flip = |i: usize| -> Box<dyn Fn(&Path)> {
        let name = chunks[i].clone();
        Box::new(move |d: &Path| {
            let p = d.join(&name);
            let mut b = std::fs::read(&p).unwrap();
            let at = b.len() / 2;
            b[at] ^= 0x01;
            std::fs::write(&p, b).unwrap();
        })
    };
    let c1 = chunks[1].clone();
    let c1b = chunks[1].clone();
    let c2 = chunks[2].clone();
    let cases: Vec<Damage> = vec![
        (
            "flipped byte in the first chunk",
            flip(0),
            chunks[0].clone(),
        ),
        ("flipped byte in a middle chunk", flip(2), chunks[2].clone()),
        (
            "flipped byte in the last chunk",
            flip(last),
            chunks[last].clone(),
        ),
        (
            "missing chunk",
            Box::new(move |d: &Path| std::fs::remove_file(d.join(&c1)).unwrap()),
            format!(
                "{} of key tc-2 is listed in warmstart.json but missing",
                chunks[1]
            ),
        ),
        (
            "truncated chunk",
            Box::new(move |d: &Path| {
                let p = d.join(&c1b);
                let b = std::fs::read(&p).unwrap();
                std::fs::write(&p, &b[..b.len() - 1]).unwrap();
            }),
            "(truncated)".to_string(),
        ),
        (
            "SHA256SUMS disagrees with warmstart.json",
            Box::new(move |d: &Path| {
                let p = d.join("SHA256SUMS");
                let text = std::fs::read_to_string(&p).unwrap();
                let line = text.lines().find(|l| l.ends_with(&c2)).unwrap().to_string();
                let flipped = format!(
                    "{}{}",
                    if line.starts_with('0') { '1' } else { '0' },
                    &line[1..]
                );
                std::fs::write(&p, text.replace(&line, &flipped)).unwrap();
            }),
            format!("SHA256SUMS says {} has sha256", chunks[2]),
        ),
    ];
    pin(&fx, "2");
    for (what, damage, needle) in cases {
        let copy = fx.env.join(format!("damaged-{}", what.replace(' ', "-")));
        let r = Command::new("cp")
            .arg("-a")
            .arg(&dir)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(r.success());
        damage(&copy);
        push_dir(&fx, &copy, "tc-cache");
        let r = restore(&fx).expect_code(6);
        assert!(
            r.stderr().contains(&needle),
            "{what}: expected {needle:?} in {}",
            r.stderr()
        );
        assert_same_tree(&good_src, &target(&fx));
        assert_no_leftovers(&fx);
        // cache verify says the same, and writes nothing.
        let v = fx
            .xtask(&["cache", "verify", "tc", "--json"])
            .expect_code(6);
        assert_eq!(json_of(&v)["ok"], false, "{what}");
        assert_same_tree(&good_src, &target(&fx));
    }
}

#[test]
fn cache_verify_checks_a_branch_and_the_installed_copy_without_writing() {
    let fx = test_cache();
    let (src, dir) = chunked(&fx, "1");
    push_dir(&fx, &dir, "tc-cache");
    let r = fx.xtask(&["cache", "verify", "tc", "--json"]).ok();
    let j = json_of(&r);
    assert_eq!(j["ok"], true, "{j}");
    assert_eq!(j["keys"][0]["key"], "tc-1");
    assert_eq!(j["keys"][0]["current"], true);
    assert_eq!(j["installed"]["state"], "not installed");
    assert!(!target(&fx).exists(), "verify must not install");
    assert!(!state_dir(&fx).join("cache/stamps/tc.json").exists());

    restore(&fx).ok();
    let j = json_of(&fx.xtask(&["cache", "verify", "tc", "--json"]).ok());
    assert_eq!(j["installed"]["state"], "matches", "{j}");

    // A changed installed file: verify names it (exit 6) and leaves it;
    // restore --verify repairs it; then both agree again.
    std::fs::write(target(&fx).join("plain.txt"), "tampered\n").unwrap();
    let r = fx.xtask(&["cache", "verify", "tc"]).expect_code(6);
    assert!(
        r.stderr()
            .contains("differs from the branch (plain.txt is 9 bytes"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        std::fs::read_to_string(target(&fx).join("plain.txt")).unwrap(),
        "tampered\n"
    );
    assert_eq!(restore_json(&fx)["state"], "warm");
    let j = json_of(
        &fx.xtask(&["cache", "restore", "tc", "--verify", "--json"])
            .ok(),
    );
    assert_eq!(j["state"], "repaired", "{j}");
    assert_same_tree(&src, &target(&fx));
    let j = json_of(
        &fx.xtask(&["cache", "restore", "tc", "--verify", "--json"])
            .ok(),
    );
    assert_eq!(j["state"], "verified", "{j}");
    // `--verify` hashes the decoded tar too, on top of every chunk twice.
    assert_eq!(
        j["bytes_hashed"].as_u64().unwrap(),
        2 * j["compressed_bytes"].as_u64().unwrap() + j["tar_bytes"].as_u64().unwrap(),
        "{j}"
    );
    assert_no_leftovers(&fx);
    // No scratch left in cache.git either.
    let scratch: Vec<_> = std::fs::read_dir(state_dir(&fx).join("cache.git"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("verify"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
}

#[test]
fn cache_restore_installs_branches_made_by_the_seed_recipe() {
    let fx = test_cache();
    let recipe = fx.env.join("seed_recipe.sh");
    std::fs::write(&recipe, SEED_RECIPE).unwrap();
    let src = fx.env.join("src1");
    small_tree(&src, "legacy");
    for comp in ["gz", "zst"] {
        let mut cmd = Command::new("bash");
        cmd.arg(&recipe)
            .arg("publish")
            .arg(&src)
            .arg(&fx.origin)
            .arg("tc-cache")
            .arg(comp);
        fx.env.isolate(&mut cmd);
        let r = run(&mut cmd);
        assert_eq!(r.code(), 0, "{}", show(&r.out));
        pin(&fx, comp);
        let j = restore_json(&fx);
        assert_eq!(j["state"], "restored", "{j}");
        let layout = if comp == "gz" {
            "legacy-gzip"
        } else {
            "legacy-zstd"
        };
        assert_eq!(j["layout"], layout);
        assert_same_tree(&src, &target(&fx));
        assert_eq!(restore_json(&fx)["state"], "warm");
    }
    // A corrupt legacy part is caught by the whole-archive digest; the
    // decoded staging copy is never swapped in.
    let checkout = fx.env.join("legacy-checkout");
    fx.env.git(
        ".",
        [
            "clone",
            "-q",
            "-b",
            "tc-cache",
            fx.origin.to_str().unwrap(),
            checkout.to_str().unwrap(),
        ],
    );
    let part = checkout.join("cache.tar.zst.part00");
    let mut b = std::fs::read(&part).unwrap();
    let n = b.len();
    b[n - 10] ^= 0x40;
    std::fs::write(&part, b).unwrap();
    fx.env.git("legacy-checkout", ["commit", "-qam", "damage"]);
    fx.env
        .git("legacy-checkout", ["push", "-qf", "origin", "tc-cache"]);
    pin(&fx, "damaged");
    let r = restore(&fx).expect_code(6);
    assert!(r.stderr().contains("cache.tar.zst"), "{}", r.stderr());
    assert_same_tree(&src, &target(&fx));
    assert_no_leftovers(&fx);
}

#[test]
fn cache_restore_killed_at_any_point_is_completed_by_the_next_run() {
    let fx = test_cache();
    let (s1, d1) = chunked(&fx, "1");
    let (s2, d2) = chunked(&fx, "2");
    let both = fx.env.join("both");
    std::fs::create_dir(&both).unwrap();
    for d in [&d1, &d2] {
        for e in std::fs::read_dir(d).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), both.join(e.file_name())).unwrap();
        }
    }
    // A branch holding both keys: merge the two manifests' key tables.
    let mut m1: Value =
        serde_json::from_str(&std::fs::read_to_string(d1.join("warmstart.json")).unwrap()).unwrap();
    let m2: Value =
        serde_json::from_str(&std::fs::read_to_string(d2.join("warmstart.json")).unwrap()).unwrap();
    m1["keys"]["tc-2"] = m2["keys"]["tc-2"].clone();
    std::fs::write(both.join("warmstart.json"), m1.to_string()).unwrap();
    let sums = std::fs::read_to_string(d1.join("SHA256SUMS")).unwrap()
        + &std::fs::read_to_string(d2.join("SHA256SUMS")).unwrap();
    std::fs::write(both.join("SHA256SUMS"), sums).unwrap();
    push_dir(&fx, &both, "tc-cache");

    let points = [
        "restore:fetched",
        "restore:first-chunk-decoding",
        "restore:unpacked",
        "swap:exchanged",
        "restore:installed",
    ];
    pin(&fx, "1");
    restore(&fx).ok();
    let mut installed = &s1;
    for (i, point) in points.iter().enumerate() {
        // Alternate keys so that every kill interrupts a replacement of a
        // previous install (the first one: a fresh install).
        let (next_src, next_v) = if i % 2 == 0 { (&s2, "2") } else { (&s1, "1") };
        pin(&fx, next_v);
        let mut cmd = fx.env.xtask_in("work");
        cmd.args(["cache", "restore", "tc"])
            .env("WARMSTART_TEST_KILL_AT", point);
        let r = run(&mut cmd);
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            r.out.status.signal(),
            Some(9),
            "{point}: not killed\n{}",
            show(&r.out)
        );
        // Whatever the moment, the target is one complete tree.
        let before = if *point == "restore:installed" || *point == "swap:exchanged" {
            next_src
        } else {
            installed
        };
        assert_same_tree(before, &target(&fx));
        let j = restore_json(&fx);
        assert_eq!(j["key"], format!("tc-{next_v}"), "{point}");
        assert_eq!(
            j["state"], "restored",
            "{point}: the next run redoes the work"
        );
        assert_same_tree(next_src, &target(&fx));
        assert_no_leftovers(&fx);
        installed = next_src;
    }
}

#[test]
fn cache_restore_killed_from_outside_mid_unpack_is_completed_by_the_next_run() {
    let fx = test_cache();
    let src = fx.env.join("src-big");
    small_tree(&src, "big");
    // Enough data that unpacking takes a moment to catch.
    for i in 0..4 {
        crate::util::tree::write_pseudo_random(&src.join(format!("r{i}.bin")), 6_000_000, i);
    }
    publish(
        &fx,
        json!({ "chunk_bytes": 1048576, "keys": { "tc-1": key_spec(&src, "1") } }),
    );
    let parent = target(&fx).parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&parent).unwrap();
    let mut child = fx
        .env
        .xtask_in("work")
        .args(["cache", "restore", "tc", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait for the staging directory to hold something, then SIGKILL.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut killed_mid = false;
    loop {
        let staging = std::fs::read_dir(&parent)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .contains(".staging-")
            });
        if let Some(s) = staging
            && std::fs::read_dir(&s).map(|d| d.count()).unwrap_or(0) > 0
        {
            child.kill().unwrap();
            killed_mid = true;
            break;
        }
        if child.try_wait().unwrap().is_some() || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let status = child.wait().unwrap();
    assert!(
        killed_mid,
        "never saw the staging directory fill (exit {status:?})"
    );
    assert!(
        !target(&fx).exists(),
        "a killed first restore installs nothing"
    );
    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored");
    assert_same_tree(&src, &target(&fx));
    assert_no_leftovers(&fx);
}

/// Starts `n` restores of `cmds` at once and waits for all.
fn all_at_once(cmds: Vec<Command>) -> Vec<Run> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(cmds.len()));
    let handles: Vec<_> = cmds
        .into_iter()
        .map(|mut c| {
            let b = barrier.clone();
            std::thread::spawn(move || {
                b.wait();
                run(&mut c)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn cache_restore_eight_at_once_into_one_target_does_the_work_once() {
    let fx = test_cache();
    let (src, dir) = chunked(&fx, "1");
    push_dir(&fx, &dir, "tc-cache");
    let cmds = (0..8)
        .map(|_| {
            let mut c = fx.env.xtask_in("work");
            c.args(["cache", "restore", "tc", "--json"]);
            c
        })
        .collect();
    let runs = all_at_once(cmds);
    let mut states = Vec::new();
    for r in &runs {
        assert_eq!(r.code(), 0, "{}", show(&r.out));
        states.push(json_of(r)["state"].as_str().unwrap().to_string());
    }
    let restored = states.iter().filter(|s| *s == "restored").count();
    assert_eq!(restored, 1, "exactly one does the work: {states:?}");
    assert!(
        states
            .iter()
            .all(|s| s == "restored" || s == "reused" || s == "warm"),
        "{states:?}"
    );
    assert_same_tree(&src, &target(&fx));
    assert_no_leftovers(&fx);
}

#[test]
fn cache_restore_eight_at_once_from_one_git_daemon_into_different_targets() {
    let fx = test_cache();
    let (src, dir) = chunked(&fx, "1");
    push_dir(&fx, &dir, "tc-cache");
    let daemon = crate::util::git_daemon::GitDaemon::start(fx.env.path());
    let url = daemon.url("origin.git");
    // Eight clones, each with its own cache.git and target, all fetching
    // from the daemon at once.
    let mut cmds = Vec::new();
    let mut targets = Vec::new();
    for i in 0..8 {
        let clone = format!("clone{i}");
        fx.env
            .git(".", ["clone", "-q", fx.work.to_str().unwrap(), &clone]);
        fx.env.git(&clone, ["remote", "set-url", "origin", &url]);
        let own = fx.env.join(format!("targets/t{i}"));
        let dir = fx.env.join(&clone);
        std::fs::copy(fx.work.join("pin.txt"), dir.join("pin.txt")).unwrap();
        std::fs::create_dir_all(dir.join("cache-manifests")).unwrap();
        let text = std::fs::read_to_string(fx.work.join("cache-manifests/tc.toml"))
            .unwrap()
            .replace(target(&fx).to_str().unwrap(), own.to_str().unwrap());
        std::fs::write(dir.join("cache-manifests/tc.toml"), text).unwrap();
        let mut c = fx.env.xtask_in(&clone);
        c.args(["cache", "restore", "tc", "--json"]);
        cmds.push(c);
        targets.push(own);
    }
    for r in all_at_once(cmds) {
        assert_eq!(r.code(), 0, "{}", show(&r.out));
        let j = json_of(&r);
        assert_eq!(j["state"], "restored");
        assert_eq!(j["remote"]["name"], "origin", "{j}");
        assert!(
            j["remote"]["url"]
                .as_str()
                .unwrap()
                .starts_with("git://127.0.0.1:"),
            "{j}"
        );
    }
    for t in &targets {
        assert_same_tree(&src, t);
    }
}

#[test]
fn cache_restore_merge_mode_adds_files_to_a_shared_prefix() {
    let fx = test_cache();
    let prefix = fx.env.join("prefix");
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::write(prefix.join("bin/mine"), "not the cache's").unwrap();
    manifest_named(
        &fx,
        "tc",
        &prefix,
        "merge",
        "[ready]\npath = \"bin/tool\"\n",
    );
    let src = fx.env.join("src1");
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::write(src.join("bin/tool"), "#!/bin/sh\n").unwrap();
    std::fs::write(src.join("share.txt"), "shared").unwrap();
    publish(&fx, json!({ "keys": { "tc-1": key_spec(&src, "1") } }));
    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["mode"], "merge");
    assert_eq!(
        std::fs::read_to_string(prefix.join("bin/tool")).unwrap(),
        "#!/bin/sh\n"
    );
    assert_eq!(
        std::fs::read_to_string(prefix.join("share.txt")).unwrap(),
        "shared"
    );
    assert_eq!(
        std::fs::read_to_string(prefix.join("bin/mine")).unwrap(),
        "not the cache's"
    );
    assert_eq!(restore_json(&fx)["state"], "warm");
    // The ready-probe fails when its path is gone: the next run reinstalls.
    std::fs::remove_file(prefix.join("bin/tool")).unwrap();
    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored");
    assert!(
        j["reason"]
            .as_str()
            .unwrap()
            .contains("the ready-probe fails"),
        "{j}"
    );
    assert!(prefix.join("bin/tool").exists());

    // Killed in the middle of the merge (journal written, one file moved):
    // the next run completes it from the journal, then restores cleanly.
    let src2 = fx.env.join("src2");
    std::fs::create_dir_all(src2.join("bin")).unwrap();
    std::fs::write(src2.join("bin/tool"), "#!/bin/sh\necho 2\n").unwrap();
    std::fs::write(src2.join("share.txt"), "shared 2").unwrap();
    publish(
        &fx,
        json!({ "keys": { "tc-1": key_spec(&src, "1"), "tc-2": key_spec(&src2, "2") } }),
    );
    pin(&fx, "2");
    for point in ["merge:journal-written", "merge:moved-one"] {
        pin(&fx, if point == "merge:moved-one" { "1" } else { "2" });
        let mut cmd = fx.env.xtask_in("work");
        cmd.args(["cache", "restore", "tc"])
            .env("WARMSTART_TEST_KILL_AT", point);
        use std::os::unix::process::ExitStatusExt;
        let r = run(&mut cmd);
        assert_eq!(r.out.status.signal(), Some(9), "{point}\n{}", show(&r.out));
        assert!(
            state_dir(&fx).join("cache/journals/tc.journal").exists(),
            "{point}"
        );
        let j = restore_json(&fx);
        assert_eq!(j["state"], "restored", "{point}");
        let want = if point == "merge:moved-one" {
            &src
        } else {
            &src2
        };
        for f in ["bin/tool", "share.txt"] {
            assert_eq!(
                std::fs::read(prefix.join(f)).unwrap(),
                std::fs::read(want.join(f)).unwrap(),
                "{point}: {f}"
            );
        }
        assert_eq!(
            std::fs::read_to_string(prefix.join("bin/mine")).unwrap(),
            "not the cache's"
        );
        let stray: Vec<_> = std::fs::read_dir(prefix.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("staging") || n.contains("warmstart"))
            .collect();
        assert!(stray.is_empty(), "{point}: {stray:?}");
    }

    // A journal that cannot be read is not guessed at: exit 5, named, kept.
    let journal = state_dir(&fx).join("cache/journals/tc.journal");
    std::fs::write(&journal, "not a journal").unwrap();
    pin(&fx, "2");
    let r = restore(&fx).expect_code(5);
    assert!(r.stderr().contains("tc.journal"), "{}", r.stderr());
    assert_eq!(std::fs::read_to_string(&journal).unwrap(), "not a journal");
    assert_eq!(
        std::fs::read_to_string(prefix.join("share.txt")).unwrap(),
        "shared"
    );
}

#[test]
fn cache_restore_sets_a_corrupt_stamp_aside_and_restores() {
    let fx = test_cache();
    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(&fx, json!({ "keys": { "tc-1": key_spec(&src, "1") } }));
    restore(&fx).ok();
    let stamp = state_dir(&fx).join("cache/stamps/tc.json");
    std::fs::write(&stamp, "{ truncated").unwrap();
    let st = json_of(&fx.xtask(&["cache", "status", "--offline", "--json"]).ok());
    assert_eq!(st["caches"][0]["local"]["state"], "corrupt stamp", "{st}");
    let r = fx.xtask(&["cache", "restore", "tc", "--json"]).ok();
    assert_eq!(json_of(&r)["state"], "restored");
    assert!(r.stderr().contains("tc.json.corrupt-"), "{}", r.stderr());
    let aside: Vec<_> = std::fs::read_dir(stamp.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tc.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(restore_json(&fx)["state"], "warm");
    assert_same_tree(&src, &target(&fx));
}

#[test]
fn cache_restore_gives_up_busy_when_another_restorer_holds_the_target() {
    use sha2::{Digest, Sha256};
    let fx = test_cache();
    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(&fx, json!({ "keys": { "tc-1": key_spec(&src, "1") } }));
    // Hold the target's lock as another restorer would (flock on the lock
    // file under the state directory, named by the target path's digest).
    let digest: String = Sha256::digest(target(&fx).to_str().unwrap().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let locks = state_dir(&fx).join("cache/locks");
    std::fs::create_dir_all(&locks).unwrap();
    let held = std::fs::File::create(locks.join(format!("{}.lock", &digest[..16]))).unwrap();
    held.lock().unwrap();
    let r = run(fx
        .env
        .xtask_in("work")
        .args(["cache", "restore", "tc"])
        .env("WARMSTART_LOCK_TIMEOUT", "300ms"));
    let r = r.expect_code(3);
    assert!(
        r.stderr().contains("WARMSTART_LOCK_TIMEOUT"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists());
    held.unlock().unwrap();
    assert_eq!(restore_json(&fx)["state"], "restored");
}

#[test]
fn cache_list_shows_every_cache_with_local_and_branch_state() {
    let fx = test_cache();
    let other = fx.env.join("installed/other");
    manifest_named(&fx, "other", &other, "replace", "");
    let src = fx.env.join("src1");
    small_tree(&src, "one");
    publish(&fx, json!({ "keys": { "tc-1": key_spec(&src, "1") } }));
    restore(&fx).ok();
    let l = json_of(&fx.xtask(&["cache", "list", "--json"]).ok())["caches"].clone();
    let names: Vec<&str> = l
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["other", "tc"]);
    assert_eq!(l[1]["local"]["state"], "installed");
    assert_eq!(l[1]["remote_state"]["state"], "has key");
    assert_eq!(l[1]["remote_state"]["keys"][0]["key"], "tc-1");
    assert_eq!(l[0]["local"]["state"], "not installed");
    // Listing fetched no chunk: cache-meta.git holds metadata only.
    let meta = state_dir(&fx).join("cache-meta.git");
    let r = run(Command::new("git").arg("--git-dir").arg(&meta).args([
        "cat-file",
        "--batch-check",
        "--batch-all-objects",
    ]));
    let big_blobs = r
        .stdout()
        .lines()
        .filter(|l| {
            l.contains(" blob ") && l.rsplit(' ').next().unwrap().parse::<u64>().unwrap() > 1 << 20
        })
        .count();
    assert_eq!(big_blobs, 0);
    let text = fx.xtask(&["cache", "list"]).ok().stdout();
    assert!(text.contains("tc") && text.contains("installed"), "{text}");
    // A broken manifest is listed with its error; the others still are,
    // and the command ends with the manifest's exit code.
    std::fs::write(fx.work.join("cache-manifests/broken.toml"), "[pack\n").unwrap();
    let r = fx
        .xtask(&["cache", "list", "--offline", "--json"])
        .expect_code(10);
    let l = json_of(&r)["caches"].clone();
    assert_eq!(l[0]["name"], "broken");
    assert!(
        l[0]["error"].as_str().unwrap().contains("broken.toml"),
        "{l}"
    );
    assert_eq!(l[2]["local"]["state"], "installed");
    std::fs::remove_file(fx.work.join("cache-manifests/broken.toml")).unwrap();
    // Offline: no remote column, exit 0 even with the remote gone.
    std::fs::rename(&fx.origin, fx.env.join("gone.git")).unwrap();
    let l = json_of(&fx.xtask(&["cache", "list", "--offline", "--json"]).ok())["caches"].clone();
    assert_eq!(l[1]["remote_state"], Value::Null);
    let r = fx.xtask(&["cache", "status", "tc"]).expect_code(8);
    assert!(r.stderr().contains("--offline"), "{}", r.stderr());
}

/// Our publisher, then our restorer: the tricky tree (every kind of entry)
/// round-trips over file://, small chunks so that files cross chunk
/// boundaries. (The 200 MB case is the one big test in cache_publish.rs.)
#[test]
fn cache_restore_round_trips_what_cache_publish_wrote() {
    let fx = test_cache();
    let src = fx.work.join("src");
    make_tricky_tree(&src, false);
    crate::util::tree::write_pseudo_random(&src.join("data/random.bin"), 300_000, 3);
    manifest(&fx, "[publish]\nchunk_bytes = 65536\n");
    let url = format!("file://{}", fx.origin.display());
    fx.env.git("work", ["remote", "set-url", "origin", &url]);
    let r = fx
        .xtask(&["cache", "publish", "tc", "--allow-ungated", "--json"])
        .ok();
    let published = json_of(&r);
    assert!(
        published["chunks"].as_array().unwrap().len() >= 4,
        "{published}"
    );
    let j = restore_json(&fx);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["key"], "tc-1");
    assert_same_tree(&src, &target(&fx));
    assert_eq!(restore_json(&fx)["state"], "warm");
    // The restorer checked the same digest the publisher recorded.
    let stamp: Value = serde_json::from_str(
        &std::fs::read_to_string(state_dir(&fx).join("cache/stamps/tc.json")).unwrap(),
    )
    .unwrap();
    let verify = json_of(&fx.xtask(&["cache", "verify", "tc", "--json"]).ok());
    assert_eq!(stamp["tar_sha256"], verify["keys"][0]["tar_sha256"]);
    assert_eq!(verify["installed"]["state"], "matches");
}
