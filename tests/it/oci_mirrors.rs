//! Mirrors of a registry cache and resumed registry transfers, against
//! real servers on 127.0.0.1: a fleet of concurrent cold restores through
//! nginx as a pull-through cache with `proxy_cache_lock` (each blob leaves
//! the registry once), a mirror that serves wrong bytes (one warning, a
//! refetch from the origin, a correct install), dead mirrors (given up on
//! within one connect deadline), a link that cuts every connection (the
//! cut blobs resumed with HTTP Range, and fetched whole again from a server
//! that ignores ranges), a mirror that never sees the
//! origin's token, a tag or a publish, and the settings' refusals.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::git_daemon::free_port;
use crate::util::relay::CuttingRelay;
use crate::util::servers::{
    REGISTRY_PASSWORD, REGISTRY_USER, Registry, RegistryMirror, Silent, StaticHttps, ca_bundle,
};
use crate::util::tree::{assert_same_tree, write_pseudo_random};
use crate::util::{run, show};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const REPO: &str = "team/art";

/// A docker `config.json` directory logging in to each of `hosts`.
fn docker_config(at: &Path, hosts: &[String]) -> PathBuf {
    std::fs::create_dir_all(at).unwrap();
    let auth = base64(&format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"));
    let auths: Vec<String> = hosts
        .iter()
        .map(|h| format!("\"{h}\": {{\"auth\": \"{auth}\"}}"))
        .collect();
    std::fs::write(
        at.join("config.json"),
        format!("{{\"auths\": {{{}}}}}\n", auths.join(", ")),
    )
    .unwrap();
    at.to_path_buf()
}

fn base64(s: &str) -> String {
    let out = std::process::Command::new("sh")
        .arg("-c")
        .arg("printf %s \"$1\" | base64 -w0")
        .arg("sh")
        .arg(s)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()
}

/// A clone whose cache `art` packs `noise` bytes of incompressible data in
/// chunks of at most `chunk_bytes`, with credentials for `hosts` and the
/// CAs `cas` trusted.
fn fixture(hosts: &[String], cas: &[&Path], noise: u64, chunk_bytes: u64) -> (Fixture, String) {
    let fx = Fixture::new();
    let docker = docker_config(&fx.env.join("docker"), hosts);
    let bundle = ca_bundle(&fx.env.join("cas.pem"), cas);
    let fx = fx
        .with_var("DOCKER_CONFIG", docker.to_str().unwrap())
        .with_var("CURL_CA_BUNDLE", bundle.to_str().unwrap());
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), noise, 11);
    std::fs::write(src.join("small.txt"), "a small file\n").unwrap();
    let publish = format!("chunk_bytes = {chunk_bytes}");
    (fx, publish)
}

fn manifest(fx: &Fixture, publish: &str, cache: &str) -> Manifest {
    Manifest::literal("1", fx.env.join("src"))
        .cache(cache)
        .publish(publish)
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn chunk_digests(p: &Value) -> Vec<String> {
    p["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect()
}

/// How many times the registry's access log shows each blob served by a
/// GET (any status).
fn blob_gets(reg: &Registry) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in reg.log().lines() {
        let Some((_, rest)) = line.split_once(&format!("\"GET /v2/{REPO}/blobs/sha256:")) else {
            continue;
        };
        let digest: String = rest.chars().take(64).collect();
        *out.entry(digest).or_default() += 1;
    }
    out
}

fn warnings(err: &str) -> Vec<&str> {
    err.lines().filter(|l| l.starts_with("warning:")).collect()
}

/// The issue asks for 16 restores of 200 MB; on this 2-core machine, with
/// the other tests beside it, 16 restores of 16 MB (in chunks of at most
/// 2 MB) keep the test under half a minute (about 24 s here, publish and
/// tree comparisons included) and still put all 16 on every blob at once.
const FLEET: usize = 16;
const FLEET_NOISE: u64 = 16 << 20;

#[test]
fn oci_mirror_a_fleets_concurrent_cold_restores_through_nginx_take_each_blob_from_the_registry_once()
 {
    let reg = Registry::start();
    let mirror = RegistryMirror::start(&reg);
    let (fx, publish) = fixture(
        &[format!("127.0.0.1:{}", reg.port)],
        &[&reg.ca.cert, &mirror.ca.cert],
        FLEET_NOISE,
        2_000_000,
    );
    // The mirror is the fleet's, set per machine: the manifest names none.
    let cache = format!("registry = \"{}\"", reg.name(REPO));
    manifest(&fx, &publish, &cache).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    assert_eq!(p["status"], "published", "{p:#}");
    let chunks = chunk_digests(&p);
    assert!(chunks.len() >= 8, "{p:#}");
    let before = blob_gets(&reg);
    assert!(before.is_empty(), "{before:?}");

    let mirrors = format!("127.0.0.1:{}=127.0.0.1:{}", reg.port, mirror.port);
    let start = Instant::now();
    let children: Vec<_> = (0..FLEET)
        .map(|i| {
            let rel = format!("m{i}");
            let repo = fx.clone_repo(&rel);
            manifest(&fx, &publish, &cache).write(&repo, "art");
            fx.command_in(&rel, &["cache", "restore", "art", "--json"])
                .env("WARMSTART_REGISTRY_MIRRORS", &mirrors)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (i, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "restore {i}: {}", show(&out));
        let r: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(r["state"], "restored", "{r:#}");
        assert_eq!(r["chunks_fetched"], chunks.len() as u64, "{r:#}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(warnings(&err).is_empty(), "restore {i}: {err}");
        assert_same_tree(&src(&fx), &fx.env.join(format!("m{i}/restored/art")));
    }
    eprintln!(
        "{FLEET} cold restores of {} bytes through the mirror took {:?}",
        FLEET_NOISE,
        start.elapsed()
    );
    // Each blob (every chunk, the config, the files index) left the
    // registry once, whatever the number of machines that missed it at once.
    let gets = blob_gets(&reg);
    for c in &chunks {
        assert_eq!(gets.get(c), Some(&1), "chunk {c}: {gets:?}\n{}", reg.log());
    }
    assert!(
        gets.values().all(|&n| n == 1),
        "a blob was served twice: {gets:?}"
    );
    assert_eq!(gets.len(), chunks.len() + 2, "{gets:?}");
    // And the machines asked the mirror for every blob, each of them.
    let asked = mirror
        .access_log()
        .lines()
        .filter(|l| l.contains("/blobs/sha256:") && l.contains("\" 200 "))
        .count();
    assert_eq!(asked, FLEET * (chunks.len() + 2), "{}", mirror.access_log());
}

#[test]
fn oci_mirror_serving_wrong_bytes_costs_one_warning_and_a_refetch_from_the_origin() {
    let reg = Registry::start();
    let bad = Registry::start();
    let bad_host = format!("127.0.0.1:{}", bad.port);
    let (fx, publish) = fixture(
        &[format!("127.0.0.1:{}", reg.port), bad_host.clone()],
        &[&reg.ca.cert, &bad.ca.cert],
        600_000,
        100_000,
    );
    // The mirror holds the same key, then one of its stored blobs rots.
    manifest(&fx, &publish, &format!("registry = \"{}\"", bad.name(REPO))).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    let cache = format!(
        "registry = \"{}\"\nmirrors = [\"{bad_host}\"]",
        reg.name(REPO)
    );
    manifest(&fx, &publish, &cache).write(&fx.work, "art");
    let writes = |r: &Registry| {
        r.log()
            .lines()
            .filter(|l| l.contains("\"PUT /v2/") || l.contains("\"POST /v2/"))
            .count()
    };
    let mirror_writes = writes(&bad);
    let q = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    assert_eq!(q["status"], "published", "{q:#}");
    assert_eq!(q["key"], p["key"]);
    // A publish never writes to a mirror.
    assert_eq!(writes(&bad), mirror_writes, "{}", bad.log());

    let chunks = chunk_digests(&p);
    let rotten = &chunks[1];
    let file = bad.blob_file(rotten);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[10] ^= 0x01;
    std::fs::write(&file, &bytes).unwrap();

    fx.forget();
    let _ = std::fs::remove_dir_all(fx.work.join("restored"));
    let r = fx.xtask(&["cache", "restore", "art", "--json"]).ok();
    let err = r.stderr();
    let w = warnings(&err);
    assert_eq!(w.len(), 1, "{err}");
    assert!(
        w[0].contains(&format!("mirror {}", bad.name(REPO))),
        "{err}"
    );
    assert!(w[0].contains("wrong bytes"), "{err}");
    assert!(w[0].contains(&format!("sha256:{rotten}")), "{err}");
    assert!(
        w[0].contains(&format!("the origin {}", reg.name(REPO))),
        "{err}"
    );
    let out: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(out["state"], "restored", "{out:#}");
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    // The mirror was asked first, then the origin for what it spoiled.
    let mirror_gets = blob_gets(&bad);
    assert!(mirror_gets.contains_key(rotten.as_str()), "{mirror_gets:?}");
    assert_eq!(
        blob_gets(&reg).get(rotten.as_str()),
        Some(&1),
        "{}",
        reg.log()
    );
    // Nothing of the wrong bytes is left in the chunk store.
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    let stored = std::fs::read_dir(&store)
        .unwrap()
        .flatten()
        .map(|e| e.path());
    for path in stored {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.len() == 64 {
            let got = warmstart::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(
                std::fs::read(&path).unwrap(),
            ));
            assert_eq!(got, name, "{}", path.display());
        }
    }
}

#[test]
fn oci_a_dead_mirror_falls_through_to_the_origin_within_the_connect_deadline() {
    let reg = Registry::start();
    let (fx, publish) = fixture(
        &[format!("127.0.0.1:{}", reg.port)],
        &[&reg.ca.cert],
        600_000,
        60_000,
    );
    manifest(&fx, &publish, &format!("registry = \"{}\"", reg.name(REPO))).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    let chunks = chunk_digests(&p).len() as u32;
    assert!(chunks >= 8, "{p:#}");
    let restore = |vars: &[(&str, &str)]| {
        fx.forget();
        let _ = std::fs::remove_dir_all(fx.work.join("restored"));
        let mut cmd = fx.command(&["cache", "restore", "art"]);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let t = Instant::now();
        let r = run(&mut cmd).ok();
        (t.elapsed(), r)
    };
    let (direct, _) = restore(&[]);

    // One mirror that accepts and never answers (a host that hangs), one
    // where nothing listens (a host that is down).
    let silent = Silent::start();
    let refused = free_port();
    let connect = Duration::from_secs(2);
    let mirrors = format!(
        "127.0.0.1:{}=127.0.0.1:{},127.0.0.1:{refused}",
        reg.port, silent.port
    );
    let (took, r) = restore(&[
        ("WARMSTART_REGISTRY_MIRRORS", &mirrors),
        ("WARMSTART_CONNECT_TIMEOUT", "2s"),
    ]);
    let err = r.stderr();
    let w = warnings(&err);
    assert_eq!(w.len(), 2, "one warning per dead mirror:\n{err}");
    assert!(
        w[0].contains(&format!("127.0.0.1:{}/{REPO}", silent.port)),
        "{err}"
    );
    assert!(
        w[1].contains(&format!("127.0.0.1:{refused}/{REPO}")),
        "{err}"
    );
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    // One connect deadline for the whole restore, not one per blob (which
    // would be more than `chunks` deadlines).
    assert!(
        took < direct + connect + Duration::from_secs(4),
        "took {took:?}, {direct:?} without mirrors, connect deadline {connect:?}"
    );
}

#[test]
fn oci_a_cut_connection_is_resumed_by_range() {
    let reg = Registry::start();
    // Every connection through the relay is cut after 48 KiB from the
    // registry (its TLS handshake included).
    let budget = 48 << 10;
    let relay = CuttingRelay::start(reg.port, budget);
    let (fx, publish) = fixture(
        &[
            format!("127.0.0.1:{}", reg.port),
            format!("127.0.0.1:{}", relay.port),
        ],
        &[&reg.ca.cert],
        700_000,
        300_000,
    );
    manifest(&fx, &publish, &format!("registry = \"{}\"", reg.name(REPO))).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    let largest = p["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["size"].as_u64().unwrap())
        .max()
        .unwrap();
    assert!(largest > 2 * budget, "largest chunk {largest}: {p:#}");

    // The same registry, reached through the link that cuts.
    let through = format!("registry = \"127.0.0.1:{}/{REPO}\"", relay.port);
    manifest(&fx, &publish, &through).write(&fx.work, "art");
    fx.forget();
    let r = fx.xtask(&["cache", "restore", "art", "--json"]).ok();
    let out: Value = serde_json::from_str(&r.stdout()).unwrap();
    assert_eq!(out["state"], "restored", "{out:#}\n{}", r.stderr());
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    let cuts = relay.cuts.load(std::sync::atomic::Ordering::SeqCst);
    assert!(cuts >= 2, "the relay cut {cuts} connections");
    // The rest of each cut blob was asked for by range: partial answers.
    let partial = reg
        .log()
        .lines()
        .filter(|l| l.contains("/blobs/sha256:") && l.contains("\" 206 "))
        .count();
    assert!(partial >= 2, "{}", reg.log());
}

#[test]
fn oci_mirror_settings_that_do_not_parse_are_exit_10_naming_the_fix() {
    let fx = Fixture::new();
    std::fs::create_dir_all(fx.env.join("src")).unwrap();
    let one_line = |r: crate::util::Run, needles: &[&str]| {
        let err = r.expect_code(10).stderr();
        assert_eq!(err.trim_end().lines().count(), 1, "{err}");
        for n in needles {
            assert!(err.contains(n), "{n:?}: {err}");
        }
        err
    };
    // The machine's setting is checked before any command, even one that
    // reads no registry, and a credential in it is never echoed.
    for (value, needle) in [
        ("ghcr.io", "has no '='"),
        ("ghcr.io=", "empty mirror"),
        ("ghcr.io=https://m", "has a scheme"),
        ("ghcr.io=u:pw-93a1@m", "'@'"),
        ("ghcr.io=m ghcr.io=n", "second time"),
    ] {
        let err = one_line(
            run(fx
                .command(&["cache", "list"])
                .env("WARMSTART_REGISTRY_MIRRORS", value)),
            &["WARMSTART_REGISTRY_MIRRORS", "ORIGIN=MIRROR", needle],
        );
        assert!(!err.contains("pw-93a1"), "{err}");
    }
    // The manifest's list: only with a registry, each mirror once, never the
    // registry itself, and nothing was installed.
    for (cache, needle) in [
        ("mirrors = [\"m:5000\"]", "without cache.registry"),
        (
            "registry = \"r:5000/team/art\"\nmirrors = [\"m:5000\", \"m:5000\"]",
            "twice",
        ),
        (
            "registry = \"r:5000/team/art\"\nmirrors = [\"r:5000\"]",
            "the registry itself",
        ),
        (
            "registry = \"r:5000/team/art\"\nmirrors = [\"m:5000/Up\"]",
            "host[:port]",
        ),
        (
            "registry = \"r:5000/team/art\"\nmirrors = \"m:5000\"",
            "mirrors",
        ),
    ] {
        manifest(&fx, "chunk_bytes = 100000", cache).write(&fx.work, "art");
        one_line(fx.xtask(&["cache", "restore", "art"]), &[needle]);
        assert!(!fx.work.join("restored").exists());
    }
}

#[test]
fn oci_a_mirror_is_never_sent_the_origins_token() {
    let reg = Registry::start();
    let mirror = RegistryMirror::start(&reg);
    // No config.json entry for either host: the origin's credentials are
    // the environment's, as in CI.
    let (fx, publish) = fixture(&[], &[&reg.ca.cert, &mirror.ca.cert], 300_000, 60_000);
    let fx = fx
        .with_var("WARMSTART_REGISTRY_USER", REGISTRY_USER)
        .with_var("WARMSTART_REGISTRY_TOKEN", REGISTRY_PASSWORD);
    let cache = format!(
        "registry = \"{}\"\nmirrors = [\"{}\"]",
        reg.name(REPO),
        mirror.host()
    );
    manifest(&fx, &publish, &cache).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    // A publish writes nothing to the mirror, not even a question.
    assert_eq!(mirror.access_log(), "", "a publish asked the mirror");
    fx.forget();
    let r = fx.xtask(&["cache", "restore", "art", "--json"]).ok();
    assert!(warnings(&r.stderr()).is_empty(), "{}", r.stderr());
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    let log = mirror.access_log();
    let blobs = log.lines().filter(|l| l.contains("/blobs/sha256:")).count();
    assert_eq!(blobs, chunk_digests(&p).len() + 2, "{log}");
    // nginx logs the user of any basic credentials a request carried.
    assert!(!log.contains(REGISTRY_USER), "{log}");
    assert!(log.lines().all(|l| l.contains(" - - [")), "{log}");
    // The tag was read from the origin alone.
    assert!(!log.contains("/manifests/"), "{log}");
}

#[test]
fn oci_a_cut_blob_from_a_server_that_ignores_ranges_is_fetched_whole_again() {
    let reg = Registry::start();
    let plain = StaticHttps::start();
    // The mirror's link drops once, 48 KiB into the first blob over it.
    let relay = CuttingRelay::start_cutting(plain.port, 48 << 10, 1);
    let (fx, publish) = fixture(
        &[format!("127.0.0.1:{}", reg.port)],
        &[&reg.ca.cert, &plain.ca.cert],
        400_000,
        300_000,
    );
    let cache = format!(
        "registry = \"{}\"\nmirrors = [\"127.0.0.1:{}\"]",
        reg.name(REPO),
        relay.port
    );
    manifest(&fx, &publish, &cache).write(&fx.work, "art");
    let p = fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"]);
    assert!(
        p["chunks"].as_array().unwrap()[0]["size"].as_u64().unwrap() > 48 << 10,
        "{p:#}"
    );
    // The static server holds every blob the registry does, at its path.
    let blobs = plain.root.join(format!("v2/{REPO}/blobs"));
    std::fs::create_dir_all(&blobs).unwrap();
    let mut n = 0;
    for digest in blob_gets_all(&reg) {
        std::fs::copy(
            reg.blob_file(&digest),
            blobs.join(format!("sha256:{digest}")),
        )
        .unwrap();
        n += 1;
    }
    assert!(n >= 3, "{n}");
    fx.forget();
    let r = fx.xtask(&["cache", "restore", "art", "--json"]).ok();
    assert!(warnings(&r.stderr()).is_empty(), "{}", r.stderr());
    assert_same_tree(&src(&fx), &fx.work.join("restored/art"));
    assert_eq!(relay.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    // The cut blob: asked whole, asked for the rest (refused with a whole
    // answer), asked whole again; nothing of it from the origin.
    let log = plain.log();
    let cut = log
        .lines()
        .filter_map(|l| l.split_once("/blobs/sha256:").map(|x| &x.1[..64]))
        .fold(BTreeMap::<&str, usize>::new(), |mut m, d| {
            *m.entry(d).or_default() += 1;
            m
        });
    assert_eq!(cut.values().filter(|&&k| k == 3).count(), 1, "{log}");
    assert!(cut.values().all(|&k| k == 1 || k == 3), "{log}");
    assert!(blob_gets(&reg).is_empty(), "{}", reg.log());
}

/// Every blob in the registry's storage, by digest.
fn blob_gets_all(reg: &Registry) -> Vec<String> {
    let any = reg.blob_file(&"0".repeat(64));
    let root = any.parent().unwrap().parent().unwrap().parent().unwrap();
    let mut out = Vec::new();
    for prefix in std::fs::read_dir(root).unwrap().flatten() {
        for blob in std::fs::read_dir(prefix.path()).unwrap().flatten() {
            out.push(blob.file_name().to_string_lossy().into_owned());
        }
    }
    out
}
