//! Choosing among the keys of a branch: `cache restore --key K`.
//!
//! Branches are published by warmstart itself to a bare origin set up like a
//! hosting server; the key is `vc-<src>-<platform>`, both read from files of
//! the work repository, so a test moves them like a pin bump would. The
//! fixture is shared with `cache_prune`.

use crate::util::fixture::{Fixture, Manifest, Serve};
use crate::util::tree::assert_same_tree;
use serde_json::Value;
use std::path::PathBuf;

/// A work repository with manifest `vc` (key parts `src` and `platform`,
/// both regex pins over `pins.txt`), a bare origin, a target
/// (`installed/vc`); `extra` is appended to the `[restore]` table.
pub fn verification_cache(extra: &str) -> Fixture {
    let fx = Fixture::serve(Serve::RelativePath);
    manifest(&fx, extra);
    fx
}

pub fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("installed/vc")
}

/// (Re)writes `cache-manifests/vc.toml`; `extra` is appended.
pub fn manifest(fx: &Fixture, extra: &str) {
    let m = Manifest::keyless("../art")
        .cache("description = \"verification cache\"")
        .regex_key("src", "pins.txt")
        .regex_key("platform", "pins.txt")
        .restore_path(target(fx))
        .extra(extra);
    fx.write_manifest("vc", &m);
}

pub fn pins(fx: &Fixture, src: &str, platform: &str) {
    fx.write("pins.txt", &format!("src={src}\nplatform={platform}\n"));
}

/// The artifact for `src`: a few files that say which one it is.
pub fn artifact(fx: &Fixture, src: &str) -> PathBuf {
    let dir = fx.env.join(format!("art-{src}"));
    write_artifact(&dir, src);
    dir
}

fn write_artifact(dir: &std::path::Path, src: &str) {
    std::fs::create_dir_all(dir.join("results")).unwrap();
    std::fs::write(dir.join("results/a.checked"), format!("a of {src}\n")).unwrap();
    std::fs::write(dir.join("results/b.checked"), format!("b of {src}\n")).unwrap();
    std::fs::write(dir.join(format!("results/{src}.checked")), src).unwrap();
}

/// Publishes key `vc-<src>-<platform>` from `artifact(src)`; its JSON.
pub fn publish(fx: &Fixture, src: &str, platform: &str) -> Value {
    pins(fx, src, platform);
    let packed = fx.env.join("art");
    let _ = std::fs::remove_dir_all(&packed);
    write_artifact(&packed, src);
    fx.publish("vc")
}

/// The keys `warmstart.json` lists on the origin's `vc-cache`.
pub fn branch_keys(fx: &Fixture) -> Vec<String> {
    let text = fx.origin_git(&["show", "vc-cache:warmstart.json"]);
    let m: Value = serde_json::from_str(&text).unwrap();
    m["keys"].as_object().unwrap().keys().cloned().collect()
}

#[test]
fn cache_keys_restore_key_installs_a_named_key_and_the_next_run_goes_back() {
    let fx = verification_cache("");
    publish(&fx, "1", "x");
    publish(&fx, "2", "x");
    assert_eq!(branch_keys(&fx), ["vc-1-x", "vc-2-x"]);
    // The pins say vc-2-x; --key asks for the older one.
    let j = fx.json(&["cache", "restore", "vc", "--key", "vc-1-x", "--json"]);
    assert_eq!(j["state"], "restored", "{j}");
    assert_eq!(j["key"], "vc-1-x");
    assert_same_tree(&artifact(&fx, "1"), &target(&fx));
    let again = fx.json(&["cache", "restore", "vc", "--key", "vc-1-x", "--json"]);
    assert_eq!(again["state"], "warm", "{again}");
    // The stamp records the branch's parts for that key, so status and a
    // plain restore say which pin differs from the installed key.
    let plain = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(plain["state"], "restored", "{plain}");
    assert_eq!(plain["key"], "vc-2-x");
    let reason = plain["reason"].as_str().unwrap();
    assert!(reason.contains("src 1 -> 2"), "{reason}");
    assert_same_tree(&artifact(&fx, "2"), &target(&fx));

    // A key the branch lacks: exit 4, naming the keys it has; the install
    // stays as it was.
    let r = fx
        .xtask(&["cache", "restore", "vc", "--key", "vc-3-x"])
        .expect_code(4);
    let e = r.stderr();
    assert!(
        e.contains("no key vc-3-x") && e.contains("vc-1-x, vc-2-x"),
        "{e}"
    );
    assert_same_tree(&artifact(&fx, "2"), &target(&fx));
    let j = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(j["state"], "warm", "{j}");
    // A key that is not a file name is a usage error before anything runs.
    for bad in ["../x", "", "a/b", ".hidden"] {
        let r = fx
            .xtask(&["cache", "restore", "vc", "--key", bad])
            .expect_code(2);
        assert!(r.stderr().contains("--key"), "{}", r.stderr());
    }
}

const FALLBACK: &str = "fallback = [{ drop = [\"src\"] }]\n";

#[test]
fn cache_keys_fallback_gives_partial_then_the_exact_key_after_recheck() {
    let fx = verification_cache(&format!("{FALLBACK}recheck = \"1h\"\n"));
    publish(&fx, "1", "x");
    publish(&fx, "0", "y");
    // The source moved on: no vc-2-x on the branch yet.
    pins(&fx, "2", "x");
    let j = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(j["state"], "partial", "{j}");
    assert_eq!(j["key"], "vc-1-x", "{j}");
    let p = &j["partial"];
    assert_eq!(p["wanted"], "vc-2-x", "{j}");
    assert_eq!(p["used"], "vc-1-x", "{j}");
    assert_eq!(p["fallback"], "drop src", "{j}");
    assert_eq!(
        p["differs"],
        serde_json::json!([{ "name": "src", "wanted": "2", "used": "1" }])
    );
    assert_same_tree(&artifact(&fx, "1"), &target(&fx));
    // Warm while the recheck is not due: nothing fetched or hashed.
    let w = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(w["state"], "partial", "{w}");
    assert_eq!(w["bytes_hashed"], 0, "{w}");
    assert_eq!(w["timings_ms"]["fetch"], 0, "{w}");
    let text = fx.xtask(&["cache", "restore", "vc"]).ok().stdout();
    assert!(text.contains("vc-1-x stands in for vc-2-x"), "{text}");
    let st = fx.json(&["cache", "status", "vc", "--offline", "--json"]);
    assert_eq!(st["caches"][0]["local"]["state"], "partial", "{st}");
    // The machine restore's table says so too (its warm probe is the
    // same stat-only check).
    std::fs::write(
        fx.work.join("cache-manifests/restore.toml"),
        "[[step]]\nname = \"vc\"\nkind = \"cache\"\ncache = \"vc\"\n",
    )
    .unwrap();
    let table = fx.json(&["restore", "--json"]);
    let row = &table["steps"][0];
    assert_eq!(row["state"], "partial", "{table}");
    assert_eq!(row["partial"]["used"], "vc-1-x", "{table}");
    let what = row["what"].as_str().unwrap();
    assert!(what.contains("vc-1-x stands in for vc-2-x"), "{table}");
    let human = fx.xtask(&["restore"]).ok().stdout();
    assert!(human.contains("partial"), "{human}");
    // --verify checks the stand-in byte for byte (no short cut), and it
    // stays the stand-in.
    let v = fx.json(&["cache", "restore", "vc", "--verify", "--json"]);
    assert_eq!(v["state"], "verified", "{v}");
    assert!(v["bytes_hashed"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["partial"]["wanted"], "vc-2-x", "{v}");
    assert_eq!(
        fx.json(&["cache", "restore", "vc", "--json"])["state"],
        "partial"
    );
    assert!(text.contains("src 2 -> 1"), "{text}");

    // Recheck due, the exact key still missing: the same stand-in is kept
    // without unpacking anything, and its recheck starts again.
    manifest(&fx, &format!("{FALLBACK}recheck = \"1ms\"\n"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(r["state"], "partial", "{r}");
    assert_eq!(r["tar_bytes"], 0, "{r}");
    assert!(r["reason"].as_str().unwrap().contains("recheck"), "{r}");

    // The exact key is published, but the recheck is not due: still the
    // stand-in, from the stamp alone (the warm path reads no branch).
    manifest(&fx, &format!("{FALLBACK}recheck = \"1h\"\n"));
    publish(&fx, "2", "x");
    pins(&fx, "2", "x");
    let w = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(w["state"], "partial", "{w}");
    assert_same_tree(&artifact(&fx, "1"), &target(&fx));
    // After the recheck: restored with the exact key, no longer partial.
    manifest(&fx, &format!("{FALLBACK}recheck = \"1ms\"\n"));
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(r["state"], "restored", "{r}");
    assert_eq!(r["key"], "vc-2-x", "{r}");
    assert!(r.get("partial").is_none(), "{r}");
    assert_same_tree(&artifact(&fx, "2"), &target(&fx));
    assert_eq!(
        fx.json(&["cache", "restore", "vc", "--json"])["state"],
        "warm"
    );
}

#[test]
fn cache_keys_fallback_refusals_and_misses() {
    let fx = verification_cache("");
    publish(&fx, "1", "x");
    // Nothing the fallbacks allow: exit 4, naming the manifest; nothing
    // installed.
    manifest(
        &fx,
        "fallback = [{ prefix = \"other-\" }]\nrecheck = \"1h\"\n",
    );
    pins(&fx, "2", "x");
    let r = fx.xtask(&["cache", "restore", "vc"]).expect_code(4);
    assert!(
        r.stderr().contains("no [[restore.fallback]]"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists());
    // A prefix that matches: the newest key with it.
    manifest(
        &fx,
        "fallback = [{ prefix = \"other-\" }, { prefix = \"vc-\" }]\nrecheck = \"1h\"\n",
    );
    let j = fx.json(&["cache", "restore", "vc", "--json"]);
    assert_eq!(j["state"], "partial", "{j}");
    assert_eq!(j["partial"]["fallback"], "prefix vc-", "{j}");
    // --key never falls back.
    fx.xtask(&["cache", "restore", "vc", "--key", "vc-9-x"])
        .expect_code(4);
    // Settings that are not understood are refused (exit 10), naming them.
    for (bad, says) in [
        (
            "fallback = [{ drop = [\"nosuch\"] }]\nrecheck = \"1h\"\n",
            "nosuch",
        ),
        ("fallback = [{ drop = [\"src\"] }]\n", "restore.recheck"),
        ("recheck = \"1h\"\n", "no restore.fallback"),
        (
            "fallback = [{ drop = [\"src\"], prefix = \"vc\" }]\nrecheck = \"1h\"\n",
            "exactly one",
        ),
        (
            "fallback = [{ prefix = \"\" }]\nrecheck = \"1h\"\n",
            "empty",
        ),
        (
            "fallback = [{ drop = [] }]\nrecheck = \"1h\"\n",
            "no key parts",
        ),
        (
            "fallback = [{ drop = [\"src\"] }]\nrecheck = \"soon\"\n",
            "recheck",
        ),
        (
            "fallback = [{ dorp = [\"src\"] }]\nrecheck = \"1h\"\n",
            "dorp",
        ),
    ] {
        manifest(&fx, bad);
        let r = fx.xtask(&["cache", "restore", "vc"]).expect_code(10);
        assert!(r.stderr().contains(says), "{bad}: {}", r.stderr());
    }
    assert_same_tree(&artifact(&fx, "1"), &target(&fx));
}

/// A pin file that is not there is a plan error (exit 10) naming it, for
/// restore and for `cache status`, which lists it and then fails too.
#[test]
fn cache_keys_a_missing_pin_file_is_exit_10_and_cache_status_fails_on_it() {
    let fx = verification_cache("");
    let r = fx.xtask(&["cache", "restore", "vc"]).expect_code(10);
    let err = r.stderr();
    assert!(
        err.contains("pin file ") && err.contains("pins.txt does not exist"),
        "{err}"
    );
    let r = fx
        .xtask(&["cache", "status", "vc", "--offline", "--json"])
        .expect_code(10);
    let v: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(v["ok"], false, "{v:#}");
    let text = fx.xtask(&["cache", "status", "--offline"]).expect_code(10);
    assert!(
        text.stdout().contains("pins.txt does not exist"),
        "{}",
        text.stdout()
    );
}

/// A cache name one typo away is named back.
#[test]
fn cache_keys_a_misspelt_cache_name_says_did_you_mean() {
    let fx = verification_cache("");
    for typo in ["v", "vcc", "vd"] {
        let r = fx.xtask(&["cache", "restore", typo]).expect_code(4);
        assert!(
            r.stderr().contains("did you mean vc?"),
            "{typo}: {}",
            r.stderr()
        );
    }
    let r = fx
        .xtask(&["cache", "restore", "nothing-like-it"])
        .expect_code(4);
    assert!(!r.stderr().contains("did you mean"), "{}", r.stderr());
}
