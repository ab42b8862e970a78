//! `cache publish --missing`, the mode `tools/ci-gates.sh` publishes with:
//! a key the remote holds and HEAD's trust policy accepts is skipped
//! without reading the pack root, packing or pushing; a key the branch
//! holds under its name but the policy refuses counts as missing and is
//! replaced. Real ssh-keygen keys, a real `git daemon` on 127.0.0.1 (the
//! fixture of `trust.rs`), and the real CI script.

use crate::trust::{
    CACHE, content, edit_manifest, json, publish, set_trust, tamper, trusted, xtask,
};
use crate::util::rng::Rng;
use crate::util::{Run, TestEnv, run, show, source_root};
use serde_json::Value;
use std::process::Command;

/// The tip of `art-cache` on the served origin.
fn tip(fx: &crate::util::fixture::Fixture) -> String {
    fx.env
        .git("srv/origin.git", ["rev-parse", "art-cache"])
        .trim()
        .to_string()
}

/// A re-run with nothing missing: one `present:` line, no walk of the pack
/// root (it is gone), no pack, no push, the branch as it was.
#[test]
fn a_rerun_with_nothing_missing_reads_no_pack_root_and_pushes_nothing() {
    let fx = trusted(Some("require"), &["ci"]);
    let first = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
    assert_eq!(first["status"], "published", "{first:#}");
    assert_eq!(first["missing"]["present"], false, "{first:#}");
    assert!(
        first["missing"]["why"]
            .as_str()
            .unwrap()
            .contains("does not exist"),
        "{first:#}"
    );
    let before = tip(&fx);

    // Nothing to pack from: a walk of the pack root would fail.
    std::fs::remove_dir_all(fx.env.join("src-work")).unwrap();
    let again = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
    assert_eq!(again["status"], "present", "{again:#}");
    assert_eq!(again["missing"]["present"], true, "{again:#}");
    assert_eq!(again["missing"]["policy"], "require", "{again:#}");
    assert_eq!(again["missing"]["verdict"], "trusted", "{again:#}");
    assert_eq!(again["commit"].as_str(), Some(before.as_str()), "{again:#}");
    assert_eq!(again["push"], Value::Null, "{again:#}");
    let phases: Vec<&String> = again["timings_ms"].as_object().unwrap().keys().collect();
    assert_eq!(
        phases,
        ["fetch", "verify"],
        "only the branch fetch and the check of its bytes: {again:#}"
    );
    assert_eq!(tip(&fx), before, "the branch moved");

    // In words: one line that says so, nothing about packing.
    let said = xtask(&fx, "work", &["cache", "publish", CACHE, "--missing"]).ok();
    let out = said.stdout();
    assert_eq!(out.matches("present: ").count(), 1, "{out}");
    assert!(
        out.contains("holds key art-1") && out.contains("nothing built, packed or pushed"),
        "{out}"
    );
    assert!(!out.contains("pushing "), "{out}");
    assert_eq!(tip(&fx), before);
}

/// "Lacks" is the policy's word, not the name's: a key the branch holds
/// but `require` refuses (unsigned; signed by a signer taken out of
/// allowed_signers) is missing, and `--missing` lands it anew, signed, even
/// though its bytes are the same; restore then accepts it. Without a
/// signing key that replacement is refused (exit 10) and the branch stays.
#[test]
fn a_key_present_by_name_but_refused_by_the_policy_counts_as_missing() {
    // Unsigned, published while the policy was `warn`.
    let fx = trusted(Some("warn"), &["ci", "alice"]);
    publish(&fx, "work", None, &[]).ok();
    set_trust(&fx, Some("require"), &["ci", "alice"], "");
    let unsigned = tip(&fx);
    xtask(&fx, "work", &["cache", "restore", CACHE]).expect_code(12);

    let r = publish(&fx, "work", None, &["--missing"]).expect_code(10);
    assert!(r.stderr().contains("no signing key"), "{}", show(&r.out));
    assert_eq!(tip(&fx), unsigned, "a refused publish moved the branch");

    let p = json(&publish(&fx, "work", Some("alice"), &["--missing"]).ok());
    assert_eq!(p["status"], "published", "{p:#}");
    assert_eq!(p["missing"]["present"], false, "{p:#}");
    assert_eq!(p["missing"]["verdict"], "unsigned", "{p:#}");
    assert_ne!(tip(&fx), unsigned, "the refused key was not replaced");
    xtask(&fx, "work", &["cache", "restore", CACHE]).ok();

    // Signed by alice, then alice is no longer allowed: missing again.
    set_trust(&fx, Some("require"), &["ci"], "");
    let by_alice = tip(&fx);
    let p = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
    assert_eq!(p["status"], "published", "{p:#}");
    assert_eq!(p["missing"]["verdict"], "untrusted", "{p:#}");
    assert!(
        p["signed_by"].as_str().unwrap().starts_with("ci (SHA256:"),
        "{p:#}"
    );
    assert_ne!(tip(&fx), by_alice);
    // And now it is present: the next run touches nothing.
    let p = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
    assert_eq!(p["status"], "present", "{p:#}");

    // A key whose pins moved is missing by name, as before.
    content(&fx, "work", "v2");
    std::fs::write(
        fx.work.join("cache-manifests/art.toml"),
        std::fs::read_to_string(fx.work.join("cache-manifests/art.toml"))
            .unwrap()
            .replace("literal = \"1\"", "literal = \"2\""),
    )
    .unwrap();
    let p = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
    assert_eq!(p["status"], "published", "{p:#}");
    assert!(
        p["missing"]["why"]
            .as_str()
            .unwrap()
            .contains("holds no key art-2"),
        "{p:#}"
    );
}

/// The CI script publishes with `--missing`: its second run after an
/// unchanged landing says `present:` for the cache and pushes nothing.
#[test]
fn the_ci_script_rerun_with_nothing_missing_pushes_nothing() {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    env.work_repo("work");
    let write = |rel: &str, text: &str| {
        let p = env.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "work/cache-manifests/gates.toml",
        "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
    );
    write("src/hello.txt", "hello\n");
    write(
        "work/cache-manifests/art.toml",
        &format!(
            "[cache]\ndescription = \"ci\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored/art\"\n",
            env.join("src").display()
        ),
    );
    let script = std::fs::read_to_string(source_root().join("tools/ci-gates.sh")).unwrap();
    write("work/tools/ci-gates.sh", &script);
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "ci"]);
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    env.git("work", ["push", "-q", "origin", "HEAD:refs/heads/main"]);
    let ci = || -> Run {
        let mut bash = Command::new("bash");
        bash.arg(env.join("work/tools/ci-gates.sh"))
            .current_dir(env.join("work"))
            .env("XTASK", crate::util::bin());
        env.isolate(&mut bash);
        run(&mut bash).ok()
    };
    let first = ci();
    assert!(
        first.stdout().contains("published art-1"),
        "{}",
        show(&first.out)
    );
    let tip = || env.git("origin.git", ["rev-parse", "art-cache"]);
    let before = tip();
    let again = ci();
    assert!(
        again.stdout().contains("present: art-cache") && !again.stdout().contains("published"),
        "{}",
        show(&again.out)
    );
    assert_eq!(tip(), before, "the re-run pushed");
}

/// Never by name alone, as a property: the accepted key on the branch is
/// damaged by a pusher in one generated way (signature dropped, statement
/// dropped, one statement byte flipped, re-signed by a key nobody allows,
/// an entry field edited with SHA256SUMS agreeing, a chunk digest edited
/// without, one byte of a chunk's blob flipped behind its signed digest)
/// and `--missing` must see it missing and land it anew, after
/// which a restore accepts it and the next `--missing` finds it present.
#[test]
fn a_damaged_key_of_the_right_name_is_never_present() {
    let fx = trusted(Some("require"), &["ci"]);
    let evil = fx.env.join("keys/evil");
    publish(&fx, "work", Some("ci"), &[]).ok();
    let mut rng = Rng(0x5eed_0f15_51e6 ^ 29);
    let kinds = [
        "no-sig",
        "no-statement",
        "flip",
        "evil",
        "field",
        "chunk-sha",
        "chunk-bytes",
    ];
    // Each kind once, at generated places (the byte flipped, the chunk).
    for (round, kind) in kinds.into_iter().enumerate() {
        let seed = rng.next();
        tamper(&fx, |d| {
            let st = d.join("art-1.statement");
            let sig = d.join("art-1.statement.sig");
            match kind {
                "no-sig" => std::fs::remove_file(&sig).unwrap(),
                "no-statement" => {
                    std::fs::remove_file(&st).unwrap();
                    std::fs::remove_file(&sig).unwrap();
                }
                "flip" => {
                    let mut b = std::fs::read(&st).unwrap();
                    let at = (seed as usize) % b.len();
                    b[at] = if b[at] == b'0' { b'1' } else { b'0' };
                    std::fs::write(&st, b).unwrap();
                }
                "evil" => {
                    std::fs::remove_file(&sig).unwrap();
                    let out = Command::new("ssh-keygen")
                        .args(["-q", "-Y", "sign", "-n", "warmstart-cache", "-f"])
                        .arg(&evil)
                        .arg(&st)
                        .output()
                        .unwrap();
                    assert!(out.status.success(), "{}", show(&out));
                }
                "field" => edit_manifest(d, "art-1", |e| {
                    e["created_at"] = "2099-01-01T00:00:00Z".into();
                }),
                "chunk-bytes" => {
                    // Every signature and digest stays; the blob lies.
                    let m: Value = serde_json::from_str(
                        &std::fs::read_to_string(d.join("warmstart.json")).unwrap(),
                    )
                    .unwrap();
                    let chunks = m["keys"]["art-1"]["chunks"].as_array().unwrap();
                    let file = chunks[(seed as usize) % chunks.len()]["file"]
                        .as_str()
                        .unwrap();
                    let mut b = std::fs::read(d.join(file)).unwrap();
                    let at = (seed as usize >> 8) % b.len();
                    b[at] ^= 1 << (seed % 8);
                    std::fs::write(d.join(file), b).unwrap();
                }
                _ => {
                    let f = d.join("warmstart.json");
                    let mut m: Value =
                        serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
                    let chunks = m["keys"]["art-1"]["chunks"].as_array_mut().unwrap();
                    let n = chunks.len();
                    chunks[(seed as usize) % n]["sha256"] = format!("{seed:064x}").into();
                    std::fs::write(&f, serde_json::to_string_pretty(&m).unwrap()).unwrap();
                }
            }
        });
        let damaged = tip(&fx);
        let p = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
        assert_eq!(p["status"], "published", "round {round} ({kind}): {p:#}");
        assert_eq!(p["missing"]["present"], false, "round {round} ({kind})");
        assert_ne!(tip(&fx), damaged, "round {round} ({kind}): not replaced");
        if kind == "chunk-sha" {
            // The branch itself does not cross-check: no verdict is made.
            assert_eq!(p["missing"]["verdict"], Value::Null, "{p:#}");
        } else if kind == "chunk-bytes" {
            // The signature holds; the bytes a restore would refuse do not.
            assert_eq!(p["missing"]["verdict"], "trusted", "{p:#}");
            let why = p["missing"]["why"].as_str().unwrap();
            assert!(why.contains("sha256"), "{p:#}");
        } else {
            assert_ne!(p["missing"]["verdict"], "trusted", "{p:#}");
        }
        xtask(&fx, "work", &["cache", "verify", CACHE]).ok();
        let p = json(&publish(&fx, "work", Some("ci"), &["--missing"]).ok());
        assert_eq!(p["status"], "present", "round {round} ({kind}): {p:#}");
    }
}
