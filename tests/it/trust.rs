//! Trust: signed cache keys and restores that refuse what the
//! repository does not trust, with real ssh-keygen keys made at run time and
//! a real `git daemon` on 127.0.0.1 as the hosting server.
//!
//! The machine under attack (`work`) has installed a trusted key, then
//! moves to a new key (a pin moved). An attacker with push access (its own
//! clone, `att`, and plain git) makes the branch hold something else; each
//! attempt must be exit 12, with nothing fetched into the target and the old
//! install byte for byte as it was.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::{Detail, snapshot};
use crate::util::{Run, TestEnv, run, show};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const CACHE: &str = "art";

/// `work` (the trusted publisher and the restoring machine) and `att`
/// (the attacker's clone), both cloned from `origin.git` served by git
/// daemon; signing keys `ci`, `alice` and `evil`; `work` commits
/// allowed_signers with `signers` and trust.toml with `policy`.
pub(crate) fn trusted(policy: Option<&str>, signers: &[&str]) -> Fixture {
    let fx = Fixture::served();
    fx.clone_repo("att");
    for name in ["ci", "alice", "evil"] {
        fx.env.ssh_key(name);
    }
    set_trust(&fx, policy, signers, "");
    for repo in ["work", "att"] {
        manifest(&fx, repo, "1", "");
        content(&fx, repo, "v1");
    }
    fx.env.git("work", ["add", "-A"]);
    fx.env.git("work", ["commit", "-q", "-m", "cache manifest"]);
    fx
}

/// Where `work` installs the cache.
fn target(fx: &Fixture) -> PathBuf {
    fx.env.join("work/restored/art")
}

pub(crate) fn key_path(fx: &Fixture, name: &str) -> PathBuf {
    fx.env.join(format!("keys/{name}"))
}

/// Commits trust.toml and allowed_signers (principal = key name) in `work`.
pub(crate) fn set_trust(fx: &Fixture, policy: Option<&str>, signers: &[&str], extra: &str) {
    let dir = fx.work.join("cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    let trust = dir.join("trust.toml");
    match policy {
        Some(p) => std::fs::write(&trust, format!("policy = \"{p}\"\n")).unwrap(),
        None => drop(std::fs::remove_file(&trust)),
    }
    let mut allowed = String::from(extra);
    for s in signers {
        let public = std::fs::read_to_string(key_path(fx, s).with_extension("pub")).unwrap();
        allowed.push_str(&format!("{s} {public}"));
    }
    std::fs::write(dir.join("allowed_signers"), allowed).unwrap();
    fx.env.git("work", ["add", "-A"]);
    fx.env.git(
        "work",
        ["commit", "-q", "--allow-empty", "-m", "trust root"],
    );
}

/// The manifest of cache `art` in `repo`, key literal `literal`.
fn manifest(fx: &Fixture, repo: &str, literal: &str, extra: &str) {
    let src = fx.env.join(format!("src-{repo}"));
    Manifest::literal(literal, src)
        .chunk_bytes(20000)
        .extra(extra)
        .write(&fx.env.join(repo), "art");
}

/// What `repo` packs: a few files and ~70 kB of noise (four chunks).
pub(crate) fn content(fx: &Fixture, repo: &str, tag: &str) {
    let src = fx.env.join(format!("src-{repo}"));
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(src.join("bin")).unwrap();
    std::fs::write(src.join("bin/tool"), format!("#!/bin/sh\necho {tag}\n")).unwrap();
    crate::util::tree::write_pseudo_random(&src.join("noise.bin"), 70_000, tag.len() as u64 + 7);
}

pub(crate) fn xtask(fx: &Fixture, repo: &str, args: &[&str]) -> Run {
    let mut cmd = fx.env.xtask_in(repo);
    cmd.args(args);
    run(&mut cmd)
}

/// Publishes from `repo` signed with key `signer` (none: unsigned).
pub(crate) fn publish(fx: &Fixture, repo: &str, signer: Option<&str>, more: &[&str]) -> Run {
    let key = signer.map(|s| key_path(fx, s));
    let mut args = vec!["cache", "publish", CACHE, "--json"];
    if let Some(k) = &key {
        args.extend(["--signing-key", k.to_str().unwrap()]);
    }
    args.extend(more);
    xtask(fx, repo, &args)
}

fn restore(fx: &Fixture) -> Run {
    xtask(fx, "work", &["cache", "restore", CACHE, "--json"])
}

/// `work` moves to key `literal` (as when a version pin moves).
fn pin(fx: &Fixture, literal: &str) {
    manifest(fx, "work", literal, "");
}

/// The attacker rewrites the branch: its tree, edited by `edit`, as a
/// fresh root commit force-pushed with plain git.
pub(crate) fn tamper(fx: &Fixture, edit: impl FnOnce(&Path)) {
    let dir = fx.env.join("tamper");
    let _ = std::fs::remove_dir_all(&dir);
    fx.env.git(".", ["init", "-q", "tamper"]);
    let url = fx.daemon().url("origin.git");
    fx.env.git("tamper", ["fetch", "-q", &url, "art-cache"]);
    fx.env
        .git("tamper", ["checkout", "-q", "--orphan", "x", "FETCH_HEAD"]);
    edit(&dir);
    fx.env.git("tamper", ["add", "-A"]);
    fx.env.git("tamper", ["commit", "-q", "-m", "tampered"]);
    fx.env.git(
        "tamper",
        ["push", "-q", "-f", &url, "HEAD:refs/heads/art-cache"],
    );
}

/// The installed files and the stamp, to show they did not change.
fn installed(fx: &Fixture) -> (std::collections::BTreeMap<String, String>, Vec<u8>) {
    let stamp = std::fs::read(fx.work.join(".git/warmstart/cache/stamps/art.json"))
        .expect("a stamp of the old install");
    (snapshot(&target(fx), Detail::EXTRACTED), stamp)
}

/// A refusal: exit 12, one line naming the key, the signer and the file.
fn refused(
    fx: &Fixture,
    what: &str,
    before: &(std::collections::BTreeMap<String, String>, Vec<u8>),
) -> String {
    let r = restore(fx);
    assert_eq!(r.code(), 12, "{what}: not refused\n{}", show(&r.out));
    let err = r.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("untrusted: key"))
        .unwrap_or_else(|| panic!("{what}: no refusal line\n{err}"));
    assert!(line.contains("art-2"), "{what}: names the key: {line}");
    assert!(line.contains("signer seen: "), "{what}: {line}");
    assert!(
        line.contains("cache-manifests/allowed_signers at HEAD"),
        "{what}: {line}"
    );
    assert_eq!(&installed(fx), before, "{what}: the install changed");
    line.to_string()
}

pub(crate) fn json(r: &Run) -> Value {
    serde_json::from_str(&r.stdout()).unwrap_or_else(|e| panic!("{e}\n{}", show(&r.out)))
}

/// Edits warmstart.json's entry of `key` and rewrites SHA256SUMS to agree,
/// as an attacker who knows the format would.
pub fn edit_manifest(dir: &Path, key: &str, edit: impl FnOnce(&mut Value)) {
    let file = dir.join("warmstart.json");
    let mut m: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    edit(&mut m["keys"][key]);
    std::fs::write(&file, serde_json::to_string_pretty(&m).unwrap() + "\n").unwrap();
    rewrite_sums(dir, &m);
}

fn rewrite_sums(dir: &Path, m: &Value) {
    let mut lines = Vec::new();
    for e in m["keys"].as_object().unwrap().values() {
        for c in e["chunks"].as_array().unwrap() {
            lines.push(format!(
                "{}  {}\n",
                c["sha256"].as_str().unwrap(),
                c["file"].as_str().unwrap()
            ));
        }
    }
    lines.sort_by(|a, b| a[66..].cmp(&b[66..]));
    std::fs::write(dir.join("SHA256SUMS"), lines.concat()).unwrap();
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Trusted: a publish signed by an allowed signer restores, and reports
/// its signer; the warm run after it checks no signature.
#[test]
fn a_trusted_publish_restores_and_the_warm_path_checks_nothing() {
    let fx = trusted(Some("require"), &["ci"]);
    let p = json(&publish(&fx, "work", Some("ci"), &[]).ok());
    assert!(
        p["signed_by"].as_str().unwrap().starts_with("ci (SHA256:"),
        "{p}"
    );
    let r = json(&restore(&fx).ok());
    assert_eq!(r["state"], "restored");
    assert_eq!(r["trust"]["policy"], "require");
    assert_eq!(r["trust"]["key"]["verdict"], "trusted");
    assert!(r["signature_checks"].as_u64().unwrap() >= 1, "{r}");
    assert!(target(&fx).join("bin/tool").exists());
    let w = json(&restore(&fx).ok());
    assert_eq!(w["state"], "warm");
    assert_eq!(w["signature_checks"], 0);
    // The bytes a shell needs: the statement and its signature verify with
    // ssh-keygen alone, and the statement's chunk lines with sha256sum.
    let dir = fx.env.join("coreutils");
    fx.env.git(".", ["init", "-q", "coreutils"]);
    fx.env.git(
        "coreutils",
        ["fetch", "-q", (&fx.daemon().url("origin.git")), "art-cache"],
    );
    fx.env.git("coreutils", ["checkout", "-q", "FETCH_HEAD"]);
    let allowed = fx.work.join("cache-manifests/allowed_signers");
    let out = Command::new("sh")
        .current_dir(&dir)
        .arg("-c")
        .arg(format!(
            // The branch README's lines, with its variables set.
            "cp {} allowed_signers && KEY=art-1 && mkdir tmp && cp art-1.* tmp/ && WHO=$(ssh-keygen -Y find-principals -f allowed_signers -s tmp/$KEY.statement.sig) && ssh-keygen -Y verify -f allowed_signers -I \"$WHO\" -n warmstart-cache -s tmp/$KEY.statement.sig < tmp/$KEY.statement && (cd tmp && grep -E '^[0-9a-f]{{64}}  ' $KEY.statement | sha256sum -c --quiet) && test \"$WHO\" = ci",
            allowed.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
}

/// Every attack of the issue, one after the other against one machine that
/// holds a trusted install of key art-1: each is exit 12 and changes nothing.
#[test]
fn every_attack_by_a_pusher_is_refused_and_the_install_stays() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    restore(&fx).ok();
    let before = installed(&fx);
    assert!(!before.0.is_empty());
    pin(&fx, "2");
    manifest(&fx, "att", "2", "");
    content(&fx, "att", "evil");

    // Re-signed under an untrusted signing key.
    publish(&fx, "att", Some("evil"), &[]).ok();
    let line = refused(&fx, "untrusted signer", &before);
    assert!(
        line.contains("(untrusted)") && line.contains("signer seen: SHA256:"),
        "{line}"
    );
    // `cache verify` refuses it the same way, before reading a chunk.
    let v = xtask(&fx, "work", &["cache", "verify", CACHE]);
    assert_eq!(v.code(), 12, "{}", show(&v.out));

    // An unsigned branch (the attacker's own bytes, its statement removed).
    tamper(&fx, |d| {
        std::fs::remove_file(d.join("art-2.statement")).unwrap();
        std::fs::remove_file(d.join("art-2.statement.sig")).unwrap();
    });
    let line = refused(&fx, "unsigned", &before);
    assert!(
        line.contains("(unsigned)") && line.contains("signer seen: none"),
        "{line}"
    );

    // An allowed_signers (naming the attacker) placed on the cache branch.
    publish(&fx, "att", Some("evil"), &[]).ok();
    let evil_pub = std::fs::read_to_string(key_path(&fx, "evil").with_extension("pub")).unwrap();
    tamper(&fx, |d| {
        std::fs::write(d.join("allowed_signers"), format!("ci {evil_pub}")).unwrap()
    });
    let line = refused(&fx, "allowed_signers on the branch", &before);
    assert!(
        line.contains("allowed_signers on branch art-cache is ignored"),
        "{line}"
    );

    // A signed statement with a swapped chunk and correct checksums.
    publish(&fx, "work", Some("ci"), &[]).ok();
    tamper(&fx, |d| {
        let (a, b) = (
            d.join("art-2.tar.zst.part000"),
            d.join("art-2.tar.zst.part001"),
        );
        let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        std::fs::write(&a, &bb).unwrap();
        std::fs::write(&b, &ba).unwrap();
        edit_manifest(d, "art-2", |e| {
            let c = e["chunks"].as_array_mut().unwrap();
            c[0]["sha256"] = sha256_hex(&bb).into();
            c[0]["size"] = bb.len().into();
            c[1]["sha256"] = sha256_hex(&ba).into();
            c[1]["size"] = ba.len().into();
        });
    });
    let line = refused(&fx, "swapped chunk", &before);
    assert!(
        line.contains("(mismatch)") && line.contains("`chunks`"),
        "{line}"
    );
    assert!(line.contains("signer seen: ci (SHA256:"), "{line}");

    // A valid old signature replayed onto a new tree.
    publish(&fx, "work", Some("ci"), &[]).ok();
    let old = fx.env.join("old");
    tamper(&fx, |d| {
        std::fs::create_dir_all(&old).unwrap();
        for f in ["art-2.statement", "art-2.statement.sig"] {
            std::fs::copy(d.join(f), old.join(f)).unwrap();
        }
    });
    publish(&fx, "att", None, &[]).ok();
    tamper(&fx, |d| {
        for f in ["art-2.statement", "art-2.statement.sig"] {
            std::fs::copy(old.join(f), d.join(f)).unwrap();
        }
    });
    let line = refused(&fx, "replayed signature", &before);
    assert!(line.contains("(mismatch)"), "{line}");

    // Nothing the attacker pushed reached the target's parent either.
    let stray: Vec<_> = std::fs::read_dir(target(&fx).parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(stray, ["art"], "staging left behind");
}

/// An ungated key, validly signed: refused under `require` unless its
/// manifest opts in with `[trust] allow_ungated = true`.
#[test]
fn an_ungated_key_is_refused_unless_its_manifest_opts_in() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    restore(&fx).ok();
    let before = installed(&fx);
    std::fs::write(
        fx.work.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"check\"\ncommand = [\"false\"]\ntimeout = \"30s\"\n",
    )
    .unwrap();
    let src = fx.env.join("src-work");
    let m = |extra: &str| {
        format!(
            "[[key]]\nname = \"v\"\nliteral = \"2\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\ngates = [\"check\"]\n\n[restore]\npath = \"restored/art\"\n{extra}",
            src.display()
        )
    };
    std::fs::write(fx.work.join("cache-manifests/art.toml"), m("")).unwrap();
    fx.env.git("work", ["add", "-A"]);
    fx.env.git("work", ["commit", "-q", "-m", "gated"]);
    let p = json(&publish(&fx, "work", Some("ci"), &["--allow-ungated"]).ok());
    assert_eq!(p["ungated"], true);
    let line = refused(&fx, "ungated", &before);
    assert!(
        line.contains("(ungated)") && line.contains("allow_ungated"),
        "{line}"
    );
    std::fs::write(
        fx.work.join("cache-manifests/art.toml"),
        m("\n[trust]\nallow_ungated = true\n"),
    )
    .unwrap();
    // Trust settings count once committed: HEAD is the trust root.
    refused(&fx, "ungated", &before);
    fx.env.git("work", ["commit", "-q", "-am", "allow ungated"]);
    let r = json(&restore(&fx).ok());
    assert_eq!(r["state"], "restored");
}

/// A clone whose HEAD says `policy = "off"` (committed, never pushed)
/// cannot replace a signed key with an unsigned one while the remote's
/// default branch requires signed caches: the refusal names the signer
/// and the branch, nothing is pushed, and fresh machines keep restoring.
#[test]
fn a_local_policy_off_never_replaces_a_signed_key_the_remote_requires() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    fx.env
        .git("work", ["push", "-q", "origin", "HEAD:refs/heads/main"]);
    fx.env.git("work", ["fetch", "-q", "origin"]);
    fx.env.git("work", ["remote", "set-head", "origin", "main"]);
    set_trust(&fx, Some("off"), &["ci"], "");
    content(&fx, "work", "v2");
    // The policy change is not pushed: refused for that first, naming both
    // commits; --allow-unpushed lets that pass and nothing else.
    let r = publish(&fx, "work", None, &[]).expect_code(9);
    assert!(
        r.stderr().contains("is not on origin") && r.stderr().contains("origin/main is at"),
        "{}",
        r.stderr()
    );
    let r = publish(&fx, "work", None, &["--allow-unpushed"]).expect_code(12);
    assert!(
        r.stderr().contains("refusing to replace key")
            && r.stderr().contains("signed by ci")
            && r.stderr().contains("origin/main")
            && r.stderr().contains("nothing was pushed"),
        "{}",
        r.stderr()
    );
    // Signed, the same publish goes through.
    publish(&fx, "work", Some("ci"), &["--allow-unpushed"]).ok();
}

/// The trust root is HEAD's committed tree: a `[trust] policy = "off"`
/// in the work tree's manifest, never committed, changes nothing, and a
/// pusher's unsigned key is still refused; once committed it counts.
#[test]
fn an_uncommitted_policy_off_in_the_manifest_never_switches_the_checks_off() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "att", None, &[]).ok();
    manifest(&fx, "work", "1", "[trust]\npolicy = \"off\"\n");
    let r = restore(&fx).expect_code(12);
    assert!(r.stderr().contains("unsigned"), "{}", r.stderr());
    // Said literally: the branch's small blobs came, no chunk was read.
    assert!(
        r.stderr().contains("only the branch itself was fetched")
            && r.stderr()
                .contains("none of its chunks was read or decoded"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists(), "installed anyway");
    fx.env.git("work", ["commit", "-q", "-am", "policy off"]);
    restore(&fx).ok();
}

/// Rotation: a key signed by a signer removed from allowed_signers is
/// refused from the next restore on; `cache resign` re-signs the current
/// keys with the new signer without repacking, and they restore again.
#[test]
fn a_rotated_out_signer_is_refused_and_resign_brings_keys_back() {
    let fx = trusted(Some("require"), &["ci", "alice"]);
    let p = json(&publish(&fx, "work", Some("alice"), &[]).ok());
    let chunks_before = p["chunks"].clone();
    set_trust(&fx, Some("require"), &["ci"], "");
    let r = restore(&fx).expect_code(12);
    assert!(
        r.stderr().contains("signer seen: SHA256:")
            && r.stderr().contains("was removed, its keys stay refused")
            && r.stderr().contains("cache resign art --signing-key KEY"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists(), "installed anyway");

    // Rotation as documented: resign while the old signer is still allowed.
    set_trust(&fx, Some("require"), &["ci", "alice"], "");
    let ci = key_path(&fx, "ci");
    let s = json(
        &xtask(
            &fx,
            "work",
            &[
                "cache",
                "resign",
                CACHE,
                "--signing-key",
                ci.to_str().unwrap(),
                "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(s["resigned"], serde_json::json!(["art-1"]), "{s}");
    set_trust(&fx, Some("require"), &["ci"], "");
    let r = json(&restore(&fx).ok());
    assert!(
        r["trust"]["key"]["signer"]
            .as_str()
            .unwrap()
            .starts_with("ci "),
        "{r}"
    );
    // Same chunks: nothing was repacked.
    let m: Value = serde_json::from_str(
        &fx.env
            .git("srv/origin.git", ["show", "art-cache:warmstart.json"]),
    )
    .unwrap();
    let files: Vec<&Value> = m["keys"]["art-1"]["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .collect();
    assert_eq!(files.len(), chunks_before.as_array().unwrap().len());
    for (a, b) in files.iter().zip(chunks_before.as_array().unwrap()) {
        assert_eq!(a["sha256"], b["sha256"]);
    }
}

/// Rollback: once this machine saw a newer signed statement of a key, an
/// older one (validly signed) is refused; a fresh machine accepts it.
#[test]
fn a_rollback_to_an_older_signed_statement_is_refused() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    let old = fx.env.git("srv/origin.git", ["rev-parse", "art-cache"]);
    // created_at has second precision: the newer statement is a second later.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    content(&fx, "work", "v2");
    publish(&fx, "work", Some("ci"), &[]).ok();
    restore(&fx).ok();
    assert!(
        std::fs::read_to_string(target(&fx).join("bin/tool"))
            .unwrap()
            .contains("v2")
    );
    let before = installed(&fx);
    fx.env.git(
        "srv/origin.git",
        ["update-ref", "refs/heads/art-cache", old.trim()],
    );
    let r = xtask(&fx, "work", &["cache", "restore", CACHE, "--verify"]);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(r.stderr().contains("(rollback)"), "{}", r.stderr());
    assert_eq!(installed(&fx), before);
    // A fresh machine has no history: the newest it sees is the old one.
    std::fs::remove_dir_all(fx.work.join(".git/warmstart")).unwrap();
    std::fs::remove_dir_all(fx.work.join("restored")).unwrap();
    let r = json(&restore(&fx).ok());
    assert_eq!(r["trust"]["key"]["verdict"], "trusted");
    assert!(
        std::fs::read_to_string(target(&fx).join("bin/tool"))
            .unwrap()
            .contains("v1")
    );
}

/// No policy: `off`, one line naming trust.toml, and unsigned keys restore.
/// `warn` restores an untrusted key with a warning.
#[test]
fn no_policy_is_off_with_one_line_and_warn_restores_loudly() {
    let fx = trusted(None, &["ci"]);
    publish(&fx, "work", None, &[]).ok();
    let r = xtask(&fx, "work", &["cache", "restore", CACHE]).ok();
    let out = r.stdout();
    let notes: Vec<&str> = out.lines().filter(|l| l.contains("trust.toml")).collect();
    assert_eq!(notes.len(), 1, "{out}");
    assert!(notes[0].contains("policy off"), "{}", notes[0]);
    let r = json(
        &xtask(
            &fx,
            "work",
            &["cache", "restore", CACHE, "--verify", "--json"],
        )
        .ok(),
    );
    assert_eq!(r["signature_checks"], 0);
    assert_eq!(r["trust"]["policy"], "off");
    set_trust(&fx, Some("warn"), &["ci"], "");
    let r = xtask(
        &fx,
        "work",
        &["cache", "restore", CACHE, "--verify", "--json"],
    )
    .ok();
    assert!(
        r.stderr().contains("policy warn: restoring anyway"),
        "{}",
        r.stderr()
    );
    assert_eq!(json(&r)["trust"]["key"]["verdict"], "unsigned");
}

/// Never: a random single-field edit of a signed branch (a statement field
/// without re-signing, or warmstart.json's entry with SHA256SUMS made to
/// agree) restores. Each of the generated edits is exit 12, nothing installed.
#[test]
fn random_single_field_tampering_is_always_refused() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    restore(&fx).ok();
    let before = installed(&fx);
    pin(&fx, "2");
    publish(&fx, "work", Some("ci"), &[]).ok();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let fields = [
        "created_at",
        "source_commit",
        "source_tree",
        "ungated",
        "tar_sha256",
        "tar_size",
        "files",
        "gates",
        "chunk_sha",
        "chunk_order",
    ];
    let rounds = 12;
    for round in 0..rounds {
        let pick = next();
        let in_statement = pick % 3 == 0;
        let field = fields[(pick / 3 % fields.len() as u64) as usize];
        let seed = next();
        tamper(&fx, |d| {
            if in_statement {
                let f = d.join("art-2.statement");
                let text = std::fs::read_to_string(&f).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                let at = 1 + (seed % (lines.len() as u64 - 1)) as usize;
                let mut edited: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
                // Flip one character of the value (or the digest) on that line.
                let line = &mut edited[at];
                let back = (seed as usize >> 8) % line.len().min(8);
                let pos = line.len() - 1 - back;
                let c = line.as_bytes()[pos];
                let new = if c == b'0' { '1' } else { '0' };
                line.replace_range(pos..=pos, &new.to_string());
                std::fs::write(&f, edited.join("\n") + "\n").unwrap();
                return;
            }
            edit_manifest(d, "art-2", |e| match field {
                "created_at" => e["created_at"] = "2099-01-01T00:00:00Z".into(),
                "source_commit" => e["source_commit"] = "0".repeat(40).into(),
                "source_tree" => e["source_tree"] = Value::Null,
                "ungated" => e["ungated"] = true.into(),
                "tar_sha256" => e["tar_sha256"] = format!("{:064x}", seed as u128).into(),
                "tar_size" => {
                    e["tar_size"] = (e["tar_size"].as_u64().unwrap() + 512).into();
                    // Keep the chunks' raw sizes covering the tar, so that
                    // the signature (not warmstart.json's own check) is
                    // what refuses it.
                    let last = e["chunks"].as_array_mut().unwrap().last_mut().unwrap();
                    if let Some(raw) = last["raw_size"].as_u64() {
                        last["raw_size"] = (raw + 512).into();
                    }
                }
                "files" => e["files"] = (e["files"].as_u64().unwrap() + 1 + seed % 5).into(),
                "gates" => e["gates"] = serde_json::json!({"forged": "green"}),
                "chunk_sha" => {
                    let c = &mut e["chunks"][0];
                    let file = d.join(c["file"].as_str().unwrap());
                    let mut bytes = std::fs::read(&file).unwrap();
                    let at = (seed as usize) % bytes.len();
                    bytes[at] ^= 1;
                    std::fs::write(&file, &bytes).unwrap();
                    c["sha256"] = sha256_hex(&bytes).into();
                }
                _ => e["chunks"].as_array_mut().unwrap().swap(1, 2),
            });
        });
        let r = restore(&fx);
        assert_eq!(
            r.code(),
            12,
            "round {round}: {} edit of {field} was not refused\n{}",
            if in_statement {
                "statement"
            } else {
                "warmstart.json"
            },
            show(&r.out)
        );
        assert_eq!(installed(&fx), before, "round {round}: the install changed");
    }
}

/// `cache status` and `cache list` show the signer and verdict of every
/// key, and say what `require` would refuse when the policy is off.
#[test]
fn status_and_list_show_signer_and_verdict_of_every_key() {
    let fx = trusted(None, &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    manifest(&fx, "att", "2", "");
    publish(&fx, "att", Some("evil"), &[]).ok();
    for cmd in ["status", "list"] {
        let r = xtask(&fx, "work", &["cache", cmd]).ok();
        let out = r.stdout();
        assert!(
            out.contains("art-1") && out.contains("trusted") && out.contains("ci (SHA256:"),
            "{cmd}: {out}"
        );
        assert!(
            out.contains("art-2") && out.contains("untrusted"),
            "{cmd}: {out}"
        );
        assert!(out.contains("require would refuse"), "{cmd}: {out}");
        let j = json(&xtask(&fx, "work", &["cache", cmd, "--json"]).ok());
        let text = j.to_string();
        assert!(text.contains("\"verdict\":\"untrusted\""), "{cmd}: {text}");
    }
}

/// Gate records: a green record anyone pushed as a ref is worth nothing to
/// `gates check --require-signed` and to a publish whose manifest sets
/// `[trust] signed_gates = true`; entries signed by CI (`gates run --sign`)
/// are accepted.
#[test]
fn a_signed_gate_record_is_required_and_a_forged_one_is_refused() {
    let fx = trusted(Some("require"), &["ci"]);
    std::fs::write(
        fx.work.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"check\"\ncommand = [\"true\"]\ntimeout = \"30s\"\n",
    )
    .unwrap();
    let src = fx.env.join("src-work");
    std::fs::write(
        fx.work.join("cache-manifests/art.toml"),
        format!(
            "[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\ngates = [\"check\"]\n\n[restore]\npath = \"restored/art\"\n\n[trust]\nsigned_gates = true\n",
            src.display()
        ),
    )
    .unwrap();
    fx.env.git("work", ["add", "-A"]);
    fx.env
        .git("work", ["commit", "-q", "-m", "gated, signed gates"]);
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    fx.env.git(
        ".",
        ["clone", "-q", (&fx.daemon().url("origin.git")), "forger"],
    );

    // A forged record: green, unsigned, pushed as a ref by someone else.
    xtask(&fx, "forger", &["gates", "run"]).ok();
    xtask(&fx, "forger", &["gates", "push"]).ok();
    xtask(&fx, "work", &["gates", "check", "--fetch"]).ok();
    let r = xtask(&fx, "work", &["gates", "check", "--require-signed"]).expect_code(12);
    assert!(
        r.stderr().contains("gate check") && r.stderr().contains("not signed"),
        "{}",
        r.stderr()
    );
    let p = publish(&fx, "work", Some("ci"), &[]).expect_code(12);
    assert!(p.stderr().contains("signed_gates"), "{}", p.stderr());

    // Signed, but by a key the repository does not allow.
    let evil = key_path(&fx, "evil");
    xtask(
        &fx,
        "forger",
        &["gates", "run", "--signing-key", evil.to_str().unwrap()],
    )
    .ok();
    xtask(&fx, "forger", &["gates", "push"]).ok();
    let r = xtask(
        &fx,
        "work",
        &["gates", "check", "--fetch", "--require-signed"],
    )
    .expect_code(12);
    assert!(
        r.stderr().contains("signer seen: SHA256:"),
        "{}",
        r.stderr()
    );
    publish(&fx, "work", Some("ci"), &[]).expect_code(12);
    assert_eq!(
        Command::new("git")
            .args(["-C", fx.env.join("srv/origin.git").to_str().unwrap()])
            .args(["rev-parse", "--verify", "-q", "refs/heads/art-cache"])
            .output()
            .unwrap()
            .status
            .code(),
        Some(1),
        "a cache was published on a forged record"
    );

    // CI runs the gates and signs: accepted, and the publish goes through.
    let ci = key_path(&fx, "ci");
    let mut gates = fx.env.xtask_in("work");
    gates
        .env("WARMSTART_SIGNING_KEY", &ci)
        .args(["gates", "run", "--sign"]);
    run(&mut gates).ok();
    xtask(&fx, "work", &["gates", "check", "--require-signed"]).ok();
    let p = json(&publish(&fx, "work", Some("ci"), &[]).ok());
    assert_eq!(p["status"], "published");
    assert_eq!(p["ungated"], false);
}

/// `init` writes `require` only together with a signer (`--signer
/// ci=KEY.pub`); without one it writes no policy and prints the steps;
/// a private key or a malformed spec is refused (exit 2) before anything is
/// written.
#[test]
fn init_writes_require_only_with_a_first_signer() {
    let env = TestEnv::new();
    env.work_repo("r");
    let key = env.join("ci");
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f"])
        .arg(&key)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    let init = |args: &[&str]| {
        run(env
            .xtask_in("r")
            .args(["init", "--binary", "standalone"])
            .args(args))
    };
    let trust = env.join("r/cache-manifests/trust.toml");
    let signers = env.join("r/cache-manifests/allowed_signers");

    for bad in [
        format!("ci={}", key.display()),
        "ci".into(),
        format!("two words={}.pub", key.display()),
    ] {
        let r = init(&["--signer", &bad]).expect_code(2);
        assert!(r.stderr().contains("--signer"), "{}", r.stderr());
        assert!(
            !env.join("r/cache-manifests").exists(),
            "{bad}: wrote something"
        );
    }
    let r = init(&[]).ok();
    assert!(!trust.exists() && !signers.exists());
    assert!(
        r.stdout().contains("init --signer ci=ci_signing_key.pub"),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout().contains("WARMSTART_SIGNING_KEY="),
        "{}",
        r.stdout()
    );

    let spec = format!("ci={}.pub", key.display());
    init(&["--signer", &spec]).ok();
    // Gate records then count only when an allowed signer signed them.
    let text = std::fs::read_to_string(&trust).unwrap();
    let fields: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(
        fields,
        ["policy = \"require\"", "signed_gates = true"],
        "{text}"
    );
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    assert_eq!(
        std::fs::read_to_string(&signers).unwrap(),
        format!("ci {}\n", public.trim())
    );
    // Idempotent: the same signer is not added twice.
    init(&["--signer", &spec]).ok();
    assert_eq!(
        std::fs::read_to_string(&signers).unwrap().lines().count(),
        1
    );
}

/// Fallback keys under `require`: a candidate that fails the
/// trust policy is skipped with a warning and the next one is tried; when
/// none passes, exit 12 names each skipped key and the install stays.
#[test]
fn an_untrusted_fallback_candidate_is_skipped_and_the_next_tried() {
    let fx = trusted(Some("require"), &["ci"]);
    let fallback = "fallback = [{ prefix = \"art-\" }]\nrecheck = \"1ms\"\n";
    publish(&fx, "work", Some("ci"), &[]).ok();
    // The attacker's newer key: the newest candidate, signed by evil.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    manifest(&fx, "att", "2", "");
    content(&fx, "att", "evil");
    publish(&fx, "att", Some("evil"), &[]).ok();
    // Today's pins give art-3, which nobody published.
    manifest(&fx, "work", "3", fallback);
    let r = restore(&fx).ok();
    let j = json(&r);
    assert_eq!(j["state"], "partial", "{j}");
    assert_eq!(j["key"], "art-1", "{j}");
    assert_eq!(j["partial"]["wanted"], "art-3", "{j}");
    assert_eq!(j["trust"]["key"]["verdict"], "trusted", "{j}");
    let err = r.stderr();
    let warning = err
        .lines()
        .find(|l| l.starts_with("warning: untrusted: key art-2"))
        .unwrap_or_else(|| panic!("no warning for the skipped key\n{err}"));
    assert!(
        warning.contains("(untrusted)") && warning.contains("trying the next"),
        "{warning}"
    );
    assert!(
        std::fs::read_to_string(target(&fx).join("bin/tool"))
            .unwrap()
            .contains("v1")
    );

    // Every candidate untrusted: art-1 re-signed by the attacker too.
    manifest(&fx, "att", "1", "");
    publish(&fx, "att", Some("evil"), &[]).ok();
    let before = installed(&fx);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let r = restore(&fx);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    let err = r.stderr();
    let line = err
        .lines()
        .find(|l| l.contains("no fallback key passes the trust policy"))
        .unwrap_or_else(|| panic!("no refusal line\n{err}"));
    for want in [
        "cache art",
        "no key art-3",
        "art-2 (untrusted; signer seen: SHA256:",
        "art-1 (untrusted; signer seen: SHA256:",
        "cache-manifests/allowed_signers at HEAD",
    ] {
        assert!(line.contains(want), "{want}: {line}");
    }
    assert_eq!(installed(&fx), before, "the install changed");
    // An untrusted exact key is still refused, never passed over for a
    // fallback: the pin of the attacker's key.
    manifest(&fx, "work", "2", fallback);
    let r = restore(&fx);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(
        r.stderr().contains("untrusted: key art-2"),
        "{}",
        r.stderr()
    );
    assert!(!r.stderr().contains("trying the next"), "{}", r.stderr());
    assert_eq!(installed(&fx), before, "the install changed");
}

/// `restore` (restore.toml) with a cache step whose key the trust policy
/// refuses: `--strict` is exit 12, like `cache restore`, and the table says
/// `untrusted`. The step that stops the restore decides the code: 11 for
/// any other step's failure, even after a fail-open trust refusal.
#[test]
fn restore_strict_exits_12_when_a_cache_step_is_refused_by_trust() {
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "att", Some("evil"), &[]).ok();
    let plan = |first: &str, second: &str| {
        std::fs::write(
            fx.work.join("cache-manifests/restore.toml"),
            format!("{first}\n{second}"),
        )
        .unwrap()
    };
    let art = |extra: &str| {
        format!("[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\n{extra}")
    };
    let boom = |extra: &str| {
        format!(
            "[[step]]\nname = \"boom\"\nkind = \"command\"\nrun = \"false\"\ncreates = \"never\"\n{extra}"
        )
    };
    let restore = |args: &[&str]| {
        let mut a = vec!["restore"];
        a.extend(args);
        xtask(&fx, "work", &a)
    };

    plan(&art(""), &boom(""));
    // Fail-open: exit 0, and the row reads `untrusted: key art-1 ...`.
    let r = restore(&[]).ok();
    let row = r
        .stdout()
        .lines()
        .find(|l| l.starts_with("art "))
        .map(str::to_string)
        .unwrap_or_else(|| panic!("no art row\n{}", r.stdout()));
    assert!(
        row.contains("failed-open") && row.contains("untrusted: key art-1"),
        "{row}"
    );
    let j = json(&restore(&["--json"]).ok());
    assert_eq!(j["steps"][0]["state"], "failed-open", "{j}");
    assert!(
        j["steps"][0]["what"]
            .as_str()
            .unwrap()
            .starts_with("untrusted: key art-1 of cache art"),
        "{j}"
    );
    assert!(j.get("code").is_none(), "{j}");
    // --strict: 12, in the exit status and in --json.
    let r = restore(&["--strict"]);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(
        r.stderr().contains("untrusted: key art-1"),
        "{}",
        r.stderr()
    );
    let r = restore(&["--strict", "--json"]);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert_eq!(json(&r)["code"], 12);
    // `fail_open = false` on the cache step: the same, without --strict.
    plan(&art("fail_open = false\n"), &boom(""));
    assert_eq!(restore(&[]).code(), 12);
    // Another step stops the restore first: 11, the cache step not run.
    plan(&boom(""), &art(""));
    let r = restore(&["--strict"]);
    assert_eq!(r.code(), 11, "{}", show(&r.out));
    // A fail-open trust refusal, then a fatal other step: that step's 11.
    plan(&art(""), &boom("fail_open = false\n"));
    let r = restore(&[]);
    assert_eq!(r.code(), 11, "{}", show(&r.out));
    assert!(
        r.stderr().contains("untrusted: key art-1"),
        "{}",
        r.stderr()
    );
    assert!(!target(&fx).exists(), "installed anyway");
}

/// The blob id of each `<key>.statement` and `.sig` on origin's branch.
fn statement_blobs(fx: &Fixture) -> std::collections::BTreeMap<String, String> {
    let mut out = std::collections::BTreeMap::new();
    for l in fx
        .env
        .git("srv/origin.git", ["ls-tree", "art-cache"])
        .lines()
    {
        let (meta, name) = l.split_once('\t').unwrap();
        if name.contains(".statement") {
            out.insert(
                name.to_string(),
                meta.split(' ').nth(2).unwrap().to_string(),
            );
        }
    }
    out
}

/// Prune and `[publish] keep` under `require`: the kept
/// keys' statements and signatures stay byte for byte and still verify on
/// another clone; a dropped key's go with it; a tampered kept signature is
/// named at prune and at publish time, and kept as it is (never re-signed).
#[test]
fn prune_and_publish_keep_the_other_keys_signatures_and_check_them() {
    let fx = trusted(Some("require"), &["ci"]);
    for v in ["1", "2", "3", "4"] {
        pin(&fx, v);
        publish(&fx, "work", Some("ci"), &[]).ok();
    }
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    let before = statement_blobs(&fx);
    assert_eq!(before.len(), 8, "{before:?}");
    let p = json(
        &xtask(
            &fx,
            "work",
            &["cache", "prune", CACHE, "--keep", "3", "--json"],
        )
        .ok(),
    );
    assert_eq!(p["status"], "pruned", "{p}");
    let after = statement_blobs(&fx);
    let mut expected = before.clone();
    expected.retain(|name, _| !name.starts_with("art-1."));
    assert_eq!(
        after, expected,
        "kept statements changed, or art-1's stayed"
    );

    // Another clone, with the same trust root at HEAD, restores kept keys.
    fx.env.git(
        ".",
        ["clone", "-q", (&fx.daemon().url("origin.git")), "other"],
    );
    for k in ["art-2", "art-4"] {
        let r = json(
            &xtask(
                &fx,
                "other",
                &["cache", "restore", CACHE, "--key", k, "--json"],
            )
            .ok(),
        );
        assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{k}: {r}");
    }

    // The attacker swaps art-3's signature for one by evil over the same
    // statement: a prune keeping art-3 names it, and keeps its bytes.
    let evil = key_path(&fx, "evil");
    tamper(&fx, |d| {
        std::fs::remove_file(d.join("art-3.statement.sig")).unwrap();
        let out = Command::new("ssh-keygen")
            .args(["-q", "-Y", "sign", "-n", "warmstart-cache", "-f"])
            .arg(&evil)
            .arg(d.join("art-3.statement"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
    });
    let tampered = statement_blobs(&fx);
    let r = xtask(
        &fx,
        "work",
        &["cache", "prune", CACHE, "--keep", "2", "--json"],
    )
    .ok();
    assert_eq!(json(&r)["status"], "pruned");
    assert!(
        r.stderr().contains("kept key art-3") && r.stderr().contains("untrusted"),
        "{}",
        r.stderr()
    );
    let mut expected = tampered.clone();
    expected.retain(|name, _| !name.starts_with("art-2."));
    assert_eq!(statement_blobs(&fx), expected);
    let r = xtask(&fx, "other", &["cache", "restore", CACHE, "--key", "art-3"]);
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    // `cache resign --key art-4` re-signs only art-4: art-3 is named, and
    // its bytes stay.
    let ci = key_path(&fx, "ci");
    let before_resign = statement_blobs(&fx);
    let r = xtask(
        &fx,
        "work",
        &[
            "cache",
            "resign",
            CACHE,
            "--key",
            "art-4",
            "--signing-key",
            ci.to_str().unwrap(),
            "--json",
        ],
    )
    .ok();
    assert!(r.stderr().contains("kept key art-3"), "{}", r.stderr());
    assert_eq!(json(&r)["resigned"], serde_json::json!(["art-4"]));
    let after_resign = statement_blobs(&fx);
    assert_eq!(
        after_resign.get("art-3.statement.sig"),
        before_resign.get("art-3.statement.sig")
    );
    // (An ed25519 signature of the same statement by the same key is the
    // same bytes, so art-4's is too.)
    assert_eq!(after_resign, before_resign);

    // A publish with `[publish] keep = 3` (pin 6): drops art-3 (art-4 is
    // among the newest), names nothing it keeps as bad, and keeps art-4's
    // statement bytes; a publish without keep names the tampered art-3.
    let src = fx.env.join("src-work");
    let manifest = |literal: &str, keep: &str| {
        std::fs::write(
            fx.work.join("cache-manifests/art.toml"),
            format!(
                "[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 20000\n{keep}\n[restore]\npath = \"restored/art\"\n",
                src.display()
            ),
        )
        .unwrap()
    };
    manifest("5", "");
    let r = publish(&fx, "work", Some("ci"), &[]).ok();
    assert!(r.stderr().contains("kept key art-3"), "{}", r.stderr());
    let before_keep = statement_blobs(&fx);
    manifest("6", "keep = 3\n");
    let r = publish(&fx, "work", Some("ci"), &[]).ok();
    let j = json(&r);
    assert!(
        j["pruned"].to_string().contains("art-3"),
        "{j}\n{}",
        r.stderr()
    );
    let after_keep = statement_blobs(&fx);
    for name in [
        "art-4.statement",
        "art-4.statement.sig",
        "art-5.statement",
        "art-5.statement.sig",
    ] {
        assert_eq!(after_keep.get(name), before_keep.get(name), "{name}");
    }
    assert!(
        !after_keep.keys().any(|n| n.starts_with("art-3.")),
        "{after_keep:?}"
    );
    for k in ["art-4", "art-5", "art-6"] {
        let r = json(
            &xtask(
                &fx,
                "other",
                &["cache", "restore", CACHE, "--key", k, "--verify", "--json"],
            )
            .ok(),
        );
        assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{k}: {r}");
    }
}

/// A git older than 2.47, for the test below: `TEST_OLD_GIT`, else
/// `/usr/bin/git` (Debian 12's own git, 2.39, on this project's machines).
fn old_git() -> PathBuf {
    let git = std::env::var_os("TEST_OLD_GIT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/git"));
    let out = Command::new(&git).arg("version").output();
    let text = out
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let minor: Option<u32> = text
        .strip_prefix("git version 2.")
        .and_then(|v| v.split('.').next())
        .and_then(|m| m.parse().ok());
    assert!(
        minor.is_some_and(|m| m < 47),
        "this test needs a git older than 2.47 at {} (Debian 12's apt git is 2.39), or TEST_OLD_GIT naming one; found {text:?}",
        git.display()
    );
    git
}

/// Old git: with Debian 12's git 2.39, whose `ls-tree -l` and `cat-file
/// --batch-check` die on a blob a filtered fetch left out, a signed cache
/// restores (its chunks fetched by id), publishes from a clone that lacks
/// the other key's chunks, prunes, and verifies.
#[test]
fn cache_commands_work_with_git_2_39() {
    let old = old_git();
    let fx = trusted(Some("require"), &["ci"]);
    publish(&fx, "work", Some("ci"), &[]).ok();
    fx.env.git("work", ["push", "-q", "origin", "main"]);
    let bin = fx.env.join("old-git-bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(&old, bin.join("git")).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let with_old_git = |repo: &str, args: &[&str]| {
        let mut cmd = fx.env.xtask_in(repo);
        // Chunks (20 kB) stay out of the branch fetch, as big ones do.
        cmd.env("PATH", &path)
            .env("WARMSTART_FETCH_BLOB_LIMIT", "12k")
            .args(args);
        run(&mut cmd)
    };
    for clone in ["other", "third"] {
        fx.env.git(
            ".",
            ["clone", "-q", (&fx.daemon().url("origin.git")), clone],
        );
    }
    let r = json(&with_old_git("other", &["cache", "restore", CACHE, "--json"]).ok());
    assert_eq!(r["state"], "restored", "{r}");
    assert_eq!(r["trust"]["key"]["verdict"], "trusted", "{r}");
    // The clone holds the cache branch's blobs: they are copied out of it
    // (hashed) rather than fetched again.
    assert!(r["chunks_from_clone"].as_u64().unwrap() >= 1, "{r}");
    assert_eq!(
        std::fs::read_to_string(fx.env.join("other/restored/art/bin/tool")).unwrap(),
        "#!/bin/sh\necho v1\n"
    );
    // A publish from a clone whose store lacks art-1's chunks keeps them.
    manifest(&fx, "third", "2", "");
    content(&fx, "third", "v2");
    let ci = key_path(&fx, "ci");
    let p = with_old_git(
        "third",
        &[
            "cache",
            "publish",
            CACHE,
            "--signing-key",
            ci.to_str().unwrap(),
            "--json",
        ],
    )
    .ok();
    assert_eq!(json(&p)["status"], "published", "{}", show(&p.out));
    let r = json(
        &with_old_git(
            "other",
            &[
                "cache", "restore", CACHE, "--key", "art-1", "--verify", "--json",
            ],
        )
        .ok(),
    );
    assert_eq!(r["state"], "verified", "{r}");
    let s = with_old_git("third", &["cache", "status", CACHE]).ok();
    assert!(s.stdout().contains("art-1"), "{}", s.stdout());
    let pr = json(&with_old_git("third", &["cache", "prune", CACHE, "--keep", "1", "--json"]).ok());
    assert_eq!(pr["status"], "pruned", "{pr}");
    let r = json(
        &with_old_git(
            "other",
            &["cache", "restore", CACHE, "--key", "art-2", "--json"],
        )
        .ok(),
    );
    assert_eq!(r["state"], "restored", "{r}");
    let l = with_old_git("other", &["cache", "list"]).ok();
    assert!(l.stdout().contains("art-2"), "{}", l.stdout());
}
