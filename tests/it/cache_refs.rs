//! Caches stay out of plain clones: a cache on `refs/warmstart/cache/<name>`
//! (`cache.ref`) is never downloaded by `git clone` or `git fetch`, restores
//! like a branch, and its README's coreutils line works as printed; an old
//! branch is migrated on request (`cache migrate`); hosts that refuse refs
//! outside `refs/heads/`, or force pushes to a protected branch, get one
//! line naming the setting; a dedicated cache remote keeps origin clean.
//! Real bare remotes served by `git daemon` on 127.0.0.1, real hooks.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use crate::util::{Run, show};
use std::path::PathBuf;

const REF: &str = "refs/warmstart/cache/art";

/// `srv/origin.git` (with one commit on main) and `srv/caches.git` served by
/// git daemon, a work clone of origin, and 200 kB of noise to cache.
fn art_cache() -> Fixture {
    let fx = Fixture::served().with_var("WARMSTART_FETCH_BLOB_LIMIT", "8k");
    fx.env.bare_remote("srv/caches.git");
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    let src = src(&fx);
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), 200_000, 3);
    std::fs::write(src.join("hello.txt"), "hello\n").unwrap();
    fx
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn manifest(fx: &Fixture, cache: &str, literal: &str) {
    let m = Manifest::literal(literal, src(fx))
        .cache(cache)
        .chunk_bytes(50000);
    fx.write_manifest("art", &m);
}

/// The commit `name` points at in `srv/<bare>`, if any.
fn remote_ref(fx: &Fixture, bare: &str, name: &str) -> Option<String> {
    let out = fx.env.git(
        format!("srv/{bare}"),
        ["for-each-ref", "--format=%(objectname)", name],
    );
    let s = out.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A plain `git clone` of origin, then a plain `git fetch` in it:
/// whether the clone holds the object `oid`, and its refs.
fn plain_clone_has(fx: &Fixture, oid: &str) -> (bool, String) {
    let dir = fx.env.join("plain");
    let _ = std::fs::remove_dir_all(&dir);
    fx.env.git(".", ["clone", "-q", &fx.url, "plain"]);
    fx.env.git("plain", ["fetch", "-q"]);
    let mut cmd = std::process::Command::new("git");
    cmd.current_dir(&dir).args(["cat-file", "-e", oid]);
    fx.env.isolate(&mut cmd);
    let has = cmd.status().unwrap().success();
    (has, fx.env.git("plain", ["for-each-ref"]))
}

fn one_line_error(r: &Run, code: i32) -> String {
    assert_eq!(r.code(), code, "{}", show(&r.out));
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "one line: {}", show(&r.out));
    err
}

#[test]
fn cache_refs_a_cache_on_a_ref_stays_out_of_plain_clones_and_restores() {
    let fx = art_cache();
    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let p = fx.json(&["cache", "publish", "art", "--json"]);
    assert_eq!(p["status"], "published", "{p}");
    assert_eq!(p["branch"], REF, "{p}");
    let commit = remote_ref(&fx, "origin.git", REF).expect("the ref was pushed");
    assert!(remote_ref(&fx, "origin.git", "refs/heads/art-cache").is_none());
    let (has, refs) = plain_clone_has(&fx, &commit);
    assert!(
        !has,
        "a plain clone downloaded the cache commit; refs:\n{refs}"
    );
    assert!(!refs.contains("warmstart"), "{refs}");

    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["state"], "restored", "{r}");
    assert_eq!(r["branch"], REF, "{r}");
    assert_eq!(
        std::fs::read_to_string(fx.work.join("restored/art/hello.txt")).unwrap(),
        "hello\n"
    );
    let s = fx.json(&["cache", "status", "art", "--json"]);
    assert!(s.to_string().contains("has key"), "{s}");
    fx.xtask(&["cache", "verify", "art"]).ok();

    // The README on the ref names it, and its coreutils line works verbatim.
    let readme = fx
        .env
        .git("srv/origin.git", ["show", &format!("{commit}:README.md")]);
    let line = readme
        .lines()
        .find(|l| l.starts_with("git fetch "))
        .unwrap_or_else(|| panic!("no restore line:\n{readme}"));
    assert!(
        line.starts_with(&format!("git fetch origin {REF} && ")),
        "{line}"
    );
    let key = p["key"].as_str().unwrap();
    let clone = fx.env.join("coreutils");
    fx.env.git(
        ".",
        ["clone", "-q", &fx.daemon().url("origin.git"), "coreutils"],
    );
    std::fs::create_dir_all(clone.join("tmp")).unwrap();
    let script =
        format!("set -eo pipefail; KEY={key}; DEST=restored; mkdir -p tmp \"$DEST\"; {line}");
    let mut cmd = std::process::Command::new("bash");
    cmd.current_dir(&clone).args(["-c", &script]);
    fx.env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(
        std::fs::read(clone.join("restored/noise.bin")).unwrap(),
        std::fs::read(src(&fx).join("noise.bin")).unwrap()
    );
}

#[test]
fn cache_refs_a_branch_cache_is_migrated_to_a_ref_on_request() {
    let fx = art_cache();
    // No field: the branch it always was (existing manifests keep working).
    manifest(&fx, "", "1");
    let p = fx.json(&["cache", "publish", "art", "--json"]);
    assert_eq!(p["branch"], "art-cache", "{p}");
    let commit = remote_ref(&fx, "origin.git", "refs/heads/art-cache").unwrap();
    let (has, _) = plain_clone_has(&fx, &commit);
    assert!(
        has,
        "a branch cache is in every plain clone (the reason for refs)"
    );
    fx.json(&["cache", "restore", "art", "--json"]);

    // A manifest moved to the ref before the cache: a fetch says how to move it.
    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let err = one_line_error(&fx.xtask(&["cache", "verify", "art"]), 4);
    assert!(err.contains("warmstart cache migrate art"), "{err}");
    manifest(&fx, "", "1");
    // Migrating needs the ref in the manifest first.
    let err = one_line_error(&fx.xtask(&["cache", "migrate", "art"]), 10);
    assert!(err.contains("ref = \"refs/warmstart/cache/art\""), "{err}");

    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let m = fx.json(&["cache", "migrate", "art", "--json"]);
    assert_eq!(m["state"], "migrated", "{m}");
    assert_eq!(m["commit"], commit.as_str(), "{m}");
    assert_eq!(
        remote_ref(&fx, "origin.git", REF).as_deref(),
        Some(commit.as_str())
    );
    assert!(remote_ref(&fx, "origin.git", "refs/heads/art-cache").is_none());
    let (has, refs) = plain_clone_has(&fx, &commit);
    assert!(
        !has,
        "after the migration a plain clone has no cache: {refs}"
    );
    let m = fx.json(&["cache", "migrate", "art", "--json"]);
    assert_eq!(m["state"], "already", "{m}");

    // The install is still current, and a new key publishes to the ref.
    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["state"], "warm", "{r}");
    manifest(&fx, &format!("ref = \"{REF}\""), "2");
    let p = fx.json(&["cache", "publish", "art", "--json"]);
    assert_eq!(p["status"], "published", "{p}");
    assert!(remote_ref(&fx, "origin.git", "refs/heads/art-cache").is_none());
    assert_ne!(remote_ref(&fx, "origin.git", REF).unwrap(), commit);

    // A second run, or another old name, finds the work done.
    let r = fx
        .xtask(&["cache", "migrate", "art", "--from", "nope-cache"])
        .ok();
    assert!(r.stdout().contains("already lives at"), "{}", show(&r.out));
}

#[test]
fn cache_refs_bad_ref_settings_are_config_errors() {
    let fx = art_cache();
    for (cache, says) in [
        (
            format!("branch = \"art-cache\"\nref = \"{REF}\""),
            "both set",
        ),
        ("ref = \"refs/tags/art\"".to_string(), "refs/tags/"),
        (
            "ref = \"refs/warmstart/gates/x\"".to_string(),
            "refs/warmstart/gates/",
        ),
        (
            "ref = \"warmstart/cache/art\"".to_string(),
            "not a usable ref",
        ),
        ("ref = \"refs/x\"".to_string(), "not a usable ref"),
        (
            "ref = \"refs/warmstart/cache/a b\"".to_string(),
            "not a usable ref",
        ),
        (
            "ref = \"refs/warmstart/cache/a..b\"".to_string(),
            "not a usable ref",
        ),
        (
            "branch = \"refs/warmstart/cache/art\"".to_string(),
            "set cache.ref instead",
        ),
    ] {
        manifest(&fx, &cache, "1");
        let r = fx.xtask(&["cache", "publish", "art", "--dry-run"]);
        let err = one_line_error(&r, 10);
        assert!(err.contains(says), "{cache}: {err}");
    }
    // A misspelt field is refused too (toml's own message, with its snippet).
    manifest(&fx, "refs = \"refs/warmstart/cache/art\"", "1");
    let r = fx
        .xtask(&["cache", "publish", "art", "--dry-run"])
        .expect_code(10);
    assert!(
        r.stderr().contains("unknown field `refs`"),
        "{}",
        show(&r.out)
    );
    // A migration from a branch that is not there either: not found.
    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let err = one_line_error(&fx.xtask(&["cache", "migrate", "art", "--from", "nope"]), 4);
    assert!(err.contains("nothing to migrate"), "{err}");
    let err = one_line_error(
        &fx.xtask(&["cache", "migrate", "art", "--from", "refs/heads/x"]),
        2,
    );
    assert!(err.contains("--from takes a branch name"), "{err}");
    assert!(
        fx.env
            .git("srv/origin.git", ["for-each-ref", "refs/warmstart"])
            .is_empty()
    );
}

/// Installs `body` as the pre-receive hook of `srv/<bare>`.
fn hook(fx: &Fixture, bare: &str, body: &str) {
    let path = fx.env.join(format!("srv/{bare}/hooks/pre-receive"));
    std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn cache_refs_a_host_that_refuses_refs_outside_heads_names_cache_branch() {
    let fx = art_cache();
    hook(
        &fx,
        "origin.git",
        "while read old new ref; do case \"$ref\" in refs/heads/*|refs/tags/*) ;; *) echo \"refusing ref outside refs/heads: $ref\" >&2; exit 1;; esac; done\n",
    );
    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let err = one_line_error(&fx.xtask(&["cache", "publish", "art"]), 8);
    assert!(
        err.contains("set cache.branch (e.g. \"art-cache\")"),
        "{err}"
    );
    assert!(
        err.contains("refusing ref outside refs/heads"),
        "git's cause is kept: {err}"
    );
    assert!(remote_ref(&fx, "origin.git", REF).is_none());
    // The setting it names works.
    manifest(&fx, "branch = \"art-cache\"", "1");
    fx.json(&["cache", "publish", "art", "--json"]);
    // And a migration to a ref there is refused whole: the branch stays.
    manifest(&fx, &format!("ref = \"{REF}\""), "1");
    let err = one_line_error(&fx.xtask(&["cache", "migrate", "art"]), 8);
    assert!(err.contains("set cache.branch"), "{err}");
    assert!(remote_ref(&fx, "origin.git", "refs/heads/art-cache").is_some());
}

#[test]
fn cache_refs_a_protected_branch_names_cache_ref() {
    let fx = art_cache();
    // Like a ruleset that covers every branch: no force push, no deletion.
    hook(
        &fx,
        "origin.git",
        "z=0000000000000000000000000000000000000000\nwhile read old new ref; do if [ \"$old\" != \"$z\" ]; then echo \"protected branch: $ref cannot be force-pushed or deleted\" >&2; exit 1; fi; done\n",
    );
    manifest(&fx, "", "1");
    fx.json(&["cache", "publish", "art", "--json"]);
    manifest(&fx, "", "2");
    let err = one_line_error(&fx.xtask(&["cache", "publish", "art"]), 8);
    assert!(
        err.contains("cache.ref = \"refs/warmstart/cache/art\""),
        "{err}"
    );
    assert!(err.contains("cache migrate art"), "{err}");
    assert!(
        err.contains("protected branch"),
        "git's cause is kept: {err}"
    );
}

#[test]
fn cache_refs_a_dedicated_cache_remote_keeps_origin_clean() {
    let fx = art_cache();
    let caches = fx.daemon().url("caches.git");
    manifest(&fx, &format!("ref = \"{REF}\"\nremote = \"{caches}\""), "1");
    let p = fx.json(&["cache", "publish", "art", "--json"]);
    assert_eq!(p["remote"]["url"], caches.as_str(), "{p}");
    assert!(remote_ref(&fx, "caches.git", REF).is_some());
    assert!(
        fx.env
            .git(
                "srv/origin.git",
                ["for-each-ref", "refs/warmstart", "refs/heads/art-cache"]
            )
            .is_empty()
    );
    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["state"], "restored", "{r}");
    assert!(
        r["remote"]["url"].as_str().unwrap().contains("caches.git"),
        "{r}"
    );
    let readme = fx
        .env
        .git("srv/caches.git", ["show", &format!("{REF}:README.md")]);
    assert!(
        readme.contains(&format!("git fetch {caches} {REF} && ")),
        "{readme}"
    );
    let s = fx.json(&["cache", "list", "--json"]);
    assert!(s.to_string().contains("caches.git"), "{s}");
}
