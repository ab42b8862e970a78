//! Caches in an OCI registry (`[cache] registry`), against the real CNCF
//! distribution registry on 127.0.0.1 with TLS from a CA made at run time
//! and htpasswd basic auth (`util::servers::Registry`): publish and restore
//! byte for byte, an incremental publish that sends only the new blobs and
//! an unchanged one that sends nothing, a damaged blob refused before
//! anything is installed, a wrong password (exit 13), a stalled registry
//! (exit 8 within the deadline), `skopeo` reading what warmstart
//! published, and docs/format.md's curl recipe fetching the artifact byte
//! for byte.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::servers::{REGISTRY_PASSWORD, REGISTRY_USER, Registry};
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use crate::util::{run, show, source_root};
use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const REPO: &str = "team/art";

/// A clone whose cache `art` packs `src` (a tricky tree and 120 kB of
/// noise, in chunks of at most 20 kB) into the registry, with the registry's
/// CA trusted and docker's config.json logging in as `user`/`password`.
fn fixture(reg: &Registry, user: &str, password: &str) -> Fixture {
    let fx = Fixture::new();
    let docker = reg.docker_config(&fx.env.join("docker"), user, password);
    let fx = fx
        .with_var("DOCKER_CONFIG", docker.to_str().unwrap())
        .with_var("CURL_CA_BUNDLE", reg.ca.cert.to_str().unwrap());
    let src = src(&fx);
    make_tricky_tree(&src, false);
    write_pseudo_random(&src.join("0-noise.bin"), 120_000, 7);
    write_manifest(&fx, reg, "1");
    fx
}

fn write_manifest(fx: &Fixture, reg: &Registry, literal: &str) {
    fx.write_manifest(
        "art",
        &Manifest::literal(literal, src(fx))
            .cache(&format!("registry = \"{}\"", reg.name(REPO)))
            .chunk_bytes(20000),
    );
}

fn src(fx: &Fixture) -> PathBuf {
    fx.env.join("src")
}

fn target(fx: &Fixture) -> PathBuf {
    fx.work.join("restored/art")
}

fn publish(fx: &Fixture) -> Value {
    fx.json(&["cache", "publish", "art", "--json", "--allow-unpushed"])
}

fn chunk_digests(p: &Value) -> Vec<String> {
    p["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["sha256"].as_str().unwrap().to_string())
        .collect()
}

/// Blob uploads the registry's log shows (each upload ends with one PUT).
fn uploads(reg: &Registry) -> usize {
    reg.requests("PUT", "/blobs/uploads/")
}

#[test]
fn oci_publish_then_restore_round_trips_and_republishing_sends_only_new_blobs() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let p = publish(&fx);
    assert_eq!(p["status"], "published", "{p:#}");
    let chunks = chunk_digests(&p);
    assert!(chunks.len() >= 6, "{p:#}");
    // Every chunk, the config and the files index: none was there before.
    assert_eq!(uploads(&reg), chunks.len() + 2, "{}", reg.log());
    assert_eq!(
        reg.requests("PUT", "/manifests/"),
        1,
        "{p:#}\n{}",
        reg.log()
    );

    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["state"], "restored", "{r:#}");
    assert_same_tree(&src(&fx), &target(&fx));
    assert_eq!(r["chunks_fetched"], chunks.len() as u64, "{r:#}");
    assert_eq!(
        r["remote"]["url"].as_str().unwrap(),
        format!("oci://{}", reg.name(REPO)),
        "{r:#}"
    );

    // The same input again: no blob, no tag, not even a signature.
    let log_before = reg.log().lines().count();
    let again = publish(&fx);
    assert_eq!(again["status"], "unchanged", "{again:#}");
    assert_eq!(again["commit"], p["commit"]);
    let new_lines: Vec<String> = reg
        .log()
        .lines()
        .skip(log_before)
        .map(String::from)
        .collect();
    assert!(
        !new_lines
            .iter()
            .any(|l| l.contains("\"PUT /v2/") || l.contains("\"POST /v2/")),
        "an unchanged publish wrote to the registry:\n{}",
        new_lines.join("\n")
    );

    // One file more, early in the tar: only the chunks that changed, the
    // config and the new index are sent; the rest is asked for by HEAD.
    // A new key for it (a new tag beside the first): the chunks the two
    // share are the registry's already.
    std::fs::write(src(&fx).join("0-added.txt"), "one more file\n").unwrap();
    write_manifest(&fx, &reg, "2");
    let before = uploads(&reg);
    let next = publish(&fx);
    assert_eq!(next["status"], "published", "{next:#}");
    let new_chunks: Vec<String> = chunk_digests(&next)
        .into_iter()
        .filter(|d| !chunks.contains(d))
        .collect();
    assert!(
        new_chunks.len() < chunks.len() / 2,
        "{} of {} chunks are new",
        new_chunks.len(),
        chunks.len()
    );
    assert_eq!(
        uploads(&reg) - before,
        new_chunks.len() + 2,
        "{}",
        reg.log()
    );

    // The installed tree becomes the new one, fetching only the new chunks.
    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["state"], "restored", "{r:#}");
    assert_same_tree(&src(&fx), &target(&fx));
    assert_eq!(r["chunks_fetched"], new_chunks.len() as u64, "{r:#}");
}

#[test]
fn oci_skopeo_reads_the_published_key() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let p = publish(&fx);
    let creds = format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}");
    let image = format!("docker://{}:{}", reg.name(REPO), p["key"].as_str().unwrap());
    let skopeo = |extra: &[&str]| {
        let out = Command::new("skopeo")
            .args(["inspect", "--raw", "--tls-verify=false", "--creds", &creds])
            .args(extra)
            .arg(&image)
            .output()
            .expect("skopeo (tools/test.sh installs it)");
        assert!(out.status.success(), "{}", show(&out));
        out.stdout
    };
    let raw = skopeo(&[]);
    let manifest: Value = serde_json::from_slice(&raw).unwrap();
    assert_eq!(
        manifest["artifactType"],
        "application/vnd.warmstart.cache.v1"
    );
    assert_eq!(
        manifest["layers"].as_array().unwrap().len(),
        chunk_digests(&p).len() + 1,
        "{manifest:#}"
    );
    // skopeo's bytes are the manifest warmstart tagged: same digest.
    assert_eq!(
        warmstart::hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(&raw)),
        p["commit"].as_str().unwrap(),
        "{manifest:#}"
    );
    let config: Value = serde_json::from_slice(&skopeo(&["--config"])).unwrap();
    let key = p["key"].as_str().unwrap();
    assert_eq!(
        config["keys"][key]["tar_sha256"], p["tar_sha256"],
        "{config:#}"
    );
}

#[test]
fn oci_a_damaged_blob_is_refused_before_anything_is_installed() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let p = publish(&fx);
    let first = &chunk_digests(&p)[0];
    let file = reg.blob_file(first);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[100] ^= 0x55;
    std::fs::write(&file, &bytes).unwrap();
    let r = fx.xtask(&["cache", "restore", "art"]).expect_code(6);
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains(&format!("sha256:{first}")), "{err}");
    assert!(err.contains("refused before use"), "{err}");
    assert!(!target(&fx).exists(), "something was installed");
    // Nothing of the damaged blob stays in the chunk store.
    let store = fx.work.join(".git/warmstart/cache.git/chunks");
    let left: Vec<_> = std::fs::read_dir(&store)
        .map(|rd| rd.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(
        !left
            .iter()
            .any(|n| n.to_string_lossy().contains(first.as_str())),
        "{left:?}"
    );
}

#[test]
fn oci_a_wrong_password_is_exit_13_and_never_printed() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, "not-the-password-4242");
    let r = fx
        .xtask(&["cache", "publish", "art", "--allow-unpushed"])
        .expect_code(13);
    let err = r.stderr();
    assert!(err.contains("HTTP 401"), "{err}");
    assert!(err.contains("config.json"), "{err}");
    assert!(!err.contains("not-the-password-4242"), "{err}");

    // A token in the environment wins over config.json, and is refused too.
    let r = run(fx
        .command(&["cache", "restore", "art"])
        .env("WARMSTART_REGISTRY_USER", REGISTRY_USER)
        .env("WARMSTART_REGISTRY_TOKEN", "tok-wrong-1337"))
    .expect_code(13);
    let err = r.stderr();
    assert!(err.contains("WARMSTART_REGISTRY_TOKEN"), "{err}");
    assert!(!err.contains("tok-wrong-1337"), "{err}");
}

#[test]
fn oci_a_stalled_registry_is_exit_8_within_the_deadline() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    publish(&fx);
    reg.pause();
    let start = Instant::now();
    let r = run(fx
        .command(&["cache", "restore", "art"])
        .env("WARMSTART_CONNECT_TIMEOUT", "2s")
        .env("WARMSTART_STALL_TIMEOUT", "2s"));
    let took = start.elapsed();
    reg.resume();
    let r = r.expect_code(8);
    assert!(took < Duration::from_secs(15), "took {took:?}");
    let err = r.stderr();
    assert!(
        err.contains("timed out") || err.contains("stalled"),
        "{err}"
    );
    assert!(!target(&fx).exists());
}

#[test]
fn oci_the_format_docs_curl_recipe_fetches_the_artifact_byte_for_byte() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let p = publish(&fx);
    let text = std::fs::read_to_string(source_root().join("docs/format.md")).unwrap();
    let (_, after) = text
        .split_once("<!-- recipe: oci -->\n```sh\n")
        .expect("docs/format.md has the oci recipe");
    let recipe = after.split_once("```").unwrap().0;
    let dir = fx.env.join("recipe");
    std::fs::create_dir_all(&dir).unwrap();
    let auth = Command::new("sh")
        .arg("-c")
        .arg("printf %s \"$1\" | base64 -w0")
        .arg("sh")
        .arg(format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}"))
        .output()
        .unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(recipe)
        .current_dir(&dir)
        .env("REGISTRY", format!("127.0.0.1:{}", reg.port))
        .env("REPO", REPO)
        .env("KEY", p["key"].as_str().unwrap())
        .env("DEST", dir.join("dest"))
        .env(
            "AUTH",
            format!("Basic {}", String::from_utf8_lossy(&auth.stdout)),
        )
        .env("CURL_CA_BUNDLE", &reg.ca.cert)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    assert_same_tree(&src(&fx), &dir.join("dest"));
    // Every file it fetched is the registry's stored blob, byte for byte.
    let sums = std::fs::read_to_string(dir.join("tmp/key.sums")).unwrap();
    let mut n = 0;
    for line in sums.lines() {
        let (sum, name) = line.split_once("  ").unwrap();
        assert_eq!(
            std::fs::read(dir.join("tmp").join(name)).unwrap(),
            std::fs::read(reg.blob_file(sum)).unwrap(),
            "{name}"
        );
        n += 1;
    }
    // warmstart.json, the chunks and the files index.
    assert_eq!(n, chunk_digests(&p).len() + 2, "{sums}");
}

#[test]
fn oci_a_registry_excludes_the_git_fields_and_git_only_commands_say_so() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let err = fx
        .xtask(&["cache", "status", "art"])
        .expect_code(10)
        .stderr();
    assert!(err.contains("reads git branches only"), "{err}");
    let err = fx
        .xtask(&["cache", "verify", "art"])
        .expect_code(10)
        .stderr();
    assert!(err.contains("cache verify"), "{err}");
    for (cache, why) in [
        (
            format!("registry = \"{}\"\nbranch = \"x\"", reg.name(REPO)),
            "both set",
        ),
        (
            format!("registry = \"https://{}\"", reg.name(REPO)),
            "has a scheme",
        ),
        (
            format!("registry = \"{}:v1\"", reg.name(REPO)),
            "names a tag",
        ),
        ("registry = \"127.0.0.1:5000/Team\"".to_string(), "refuses"),
        (
            "registry = \"u:p@127.0.0.1:5000/team\"".to_string(),
            "credentials",
        ),
    ] {
        fx.write_manifest("art", &Manifest::literal("1", src(&fx)).cache(&cache));
        let err = fx
            .xtask(&["cache", "restore", "art"])
            .expect_code(10)
            .stderr();
        assert!(err.contains(why), "{cache}: {err}");
    }
}

/// Commits trust.toml (`policy`) and allowed_signers (principal = key
/// name) with the manifest in `work`: HEAD is the trust root.
fn commit_trust(fx: &Fixture, policy: &str, signers: &[&str]) {
    let dir = fx.work.join("cache-manifests");
    std::fs::write(dir.join("trust.toml"), format!("policy = \"{policy}\"\n")).unwrap();
    let mut allowed = String::new();
    for s in signers {
        let public =
            std::fs::read_to_string(fx.env.join(format!("keys/{s}")).with_extension("pub"))
                .unwrap();
        allowed.push_str(&format!("{s} {public}"));
    }
    std::fs::write(dir.join("allowed_signers"), allowed).unwrap();
    fx.env.git("work", ["add", "-A"]);
    fx.env.git("work", ["commit", "-q", "-m", "trust root"]);
}

#[test]
fn oci_a_signed_key_is_trusted_and_a_pushers_unsigned_replacement_is_refused_before_any_chunk() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let ci = fx.env.ssh_key("ci");
    commit_trust(&fx, "require", &["ci"]);
    let p = fx.json(&[
        "cache",
        "publish",
        "art",
        "--json",
        "--allow-unpushed",
        "--signing-key",
        ci.to_str().unwrap(),
    ]);
    assert_eq!(p["status"], "published", "{p:#}");
    assert!(p["signed_by"].as_str().unwrap().starts_with("ci "), "{p:#}");
    // The statement and its signature are layers of the artifact.
    assert_eq!(uploads(&reg), chunk_digests(&p).len() + 4, "{}", reg.log());
    let r = fx.json(&["cache", "restore", "art", "--json"]);
    assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{r:#}");
    assert_same_tree(&src(&fx), &target(&fx));

    // Someone else who can push to the registry replaces the key with
    // other bytes, unsigned (their clone has no trust root).
    let att = fx.clone_repo("att");
    let other = fx.env.join("src-att");
    make_tricky_tree(&other, false);
    std::fs::write(other.join("planted.sh"), "echo planted\n").unwrap();
    Manifest::literal("1", &other)
        .cache(&format!("registry = \"{}\"", reg.name(REPO)))
        .chunk_bytes(20000)
        .write(&att, "art");
    let a = fx.json_in(
        "att",
        &["cache", "publish", "art", "--json", "--allow-unpushed"],
    );
    assert_eq!(a["status"], "published", "{a:#}");
    assert_eq!(a["key"], p["key"]);

    fx.forget();
    std::fs::remove_dir_all(target(&fx)).unwrap();
    let chunk_gets = |digests: &[String]| -> usize {
        digests
            .iter()
            .map(|d| reg.requests("GET", &format!("sha256:{d}")))
            .sum()
    };
    let planted = chunk_digests(&a);
    let before = chunk_gets(&planted);
    let err = fx
        .xtask(&["cache", "restore", "art"])
        .expect_code(12)
        .stderr();
    assert!(err.contains("unsigned"), "{err}");
    assert_eq!(
        chunk_gets(&planted),
        before,
        "a chunk was fetched before the verdict"
    );
    assert!(!target(&fx).exists());
}

#[test]
fn oci_a_manifest_whose_layers_disagree_with_warmstart_json_is_refused_before_any_chunk() {
    let reg = Registry::start();
    let fx = fixture(&reg, REGISTRY_USER, REGISTRY_PASSWORD);
    let p = publish(&fx);
    let key = p["key"].as_str().unwrap();
    // A pusher swaps two chunk layers: every blob is real, the order lies.
    let url = format!("https://127.0.0.1:{}/v2/{REPO}/manifests/{key}", reg.port);
    let creds = format!("{REGISTRY_USER}:{REGISTRY_PASSWORD}");
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-fsS", "--cacert"])
            .arg(&reg.ca.cert)
            .args(["-u", &creds])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        out.stdout
    };
    let accept = "Accept: application/vnd.oci.image.manifest.v1+json";
    let mut m: Value = serde_json::from_slice(&curl(&["-H", accept, &url])).unwrap();
    let layers = m["layers"].as_array_mut().unwrap();
    layers.swap(0, 1);
    let body = fx.env.join("swapped.json");
    std::fs::write(&body, serde_json::to_vec(&m).unwrap()).unwrap();
    curl(&[
        "-X",
        "PUT",
        "-H",
        "Content-Type: application/vnd.oci.image.manifest.v1+json",
        "--data-binary",
        &format!("@{}", body.display()),
        &url,
    ]);
    let gets_before = reg.requests("GET", "/blobs/");
    let err = fx
        .xtask(&["cache", "restore", "art"])
        .expect_code(6)
        .stderr();
    assert!(err.contains("layer 0 is"), "{err}");
    assert!(err.contains("republish"), "{err}");
    // Only the config was read: no chunk, no index, nothing installed.
    assert_eq!(
        reg.requests("GET", "/blobs/") - gets_before,
        1,
        "{}",
        reg.log()
    );
    assert!(!target(&fx).exists());
}
