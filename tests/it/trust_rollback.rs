//! Rollback through the generated bootstrap (`tools/warmstart-bootstrap.sh`):
//! a machine that installed a newer signed statement of a cache key refuses
//! an older one, validly signed, that an attacker with push access puts
//! back (exit 12, one line, the install as it was, on to the next
//! fallback). The script and the binary keep one record of what this
//! clone has seen (`.git/warmstart/trust/seen`), so either refuses what
//! the other saw. A fresh clone has no history and accepts the older one.
//! Real ssh-keygen keys, a real `git daemon`.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::{Run, run, show, source_root};
use std::path::PathBuf;
use std::process::Command;

/// Repository `work`: the generated bootstrap, a binary cache `tool`
/// (its executable a shell script) with a [bootstrap] table, policy
/// require, `ci` the one allowed signer, origin served by git daemon.
fn signed_tool_cache() -> Fixture {
    let fx = Fixture::served();
    let key = fx.env.join("keys/ci");
    std::fs::create_dir_all(key.parent().unwrap()).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "ci", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (tools/test.sh installs openssh-client)");
    assert!(out.status.success(), "{}", show(&out));
    let repo = &fx.work;
    let tools = repo.join("tools");
    std::fs::create_dir_all(&tools).unwrap();
    std::fs::copy(
        source_root().join("tools/warmstart-bootstrap.sh"),
        tools.join("warmstart-bootstrap.sh"),
    )
    .unwrap();
    Manifest::literal("1", fx.env.join("src"))
        .restore_path("inst/tool")
        .extra("\n[bootstrap]\nexec = \"tool\"\n")
        .write(repo, "tool");
    fx.write("cache-manifests/trust.toml", "policy = \"require\"\n");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    fx.write("cache-manifests/allowed_signers", &format!("ci {public}"));
    fx.write(".gitignore", "/inst\n");
    fx.env.git(repo, ["add", "-A"]);
    fx.env.git(repo, ["commit", "-q", "-m", "binary cache"]);
    fx
}

/// Publishes `tool` (a script printing `version`), signed by ci, and
/// returns the branch's commit on the origin.
fn publish(fx: &Fixture, version: &str) -> String {
    let exe = fx.env.join("src/tool");
    std::fs::create_dir_all(exe.parent().unwrap()).unwrap();
    std::fs::write(&exe, format!("#!/bin/sh\necho \"tool {version} $*\"\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = fx.env.xtask_in("work");
    cmd.args(["cache", "publish", "tool", "--quiet", "--signing-key"])
        .arg(fx.env.join("keys/ci"));
    run(&mut cmd).ok();
    origin_branch(fx)
}

fn origin_branch(fx: &Fixture) -> String {
    let out = fx
        .env
        .git("srv/origin.git", ["rev-parse", "refs/heads/tool-cache"]);
    out.trim().to_string()
}

/// What an attacker with push access does: the branch back to `commit`.
fn push_back(fx: &Fixture, commit: &str) {
    fx.env.git(
        "srv/origin.git",
        ["update-ref", "refs/heads/tool-cache", commit],
    );
}

/// The bootstrap, cold (its and the binary's warm stamps removed),
/// binary cache only.
fn bootstrap(fx: &Fixture) -> Run {
    for stamp in ["bootstrap/tool.key", "cache/stamps/tool.json"] {
        let _ = std::fs::remove_file(fx.work.join(".git/warmstart").join(stamp));
    }
    let mut cmd = Command::new("bash");
    cmd.arg(fx.work.join("tools/warmstart-bootstrap.sh"))
        .arg("--prebuilt-only")
        .current_dir(&fx.work);
    fx.env.isolate(&mut cmd);
    run(&mut cmd)
}

fn installed(fx: &Fixture) -> String {
    std::fs::read_to_string(fx.work.join("inst/tool/tool")).unwrap()
}

fn seen_path(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart/trust/seen")
}

/// Refused as a rollback: exit 12, one line saying so, nothing run,
/// the install as it was, and the next fallback reached.
fn refused_as_rollback(fx: &Fixture, what: &str) {
    let before = installed(fx);
    let r = bootstrap(fx);
    assert_eq!(r.code(), 12, "{what}\n{}", show(&r.out));
    let err = r.stderr();
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("rollback")).collect();
    assert_eq!(lines.len(), 1, "{what}: one rollback line\n{err}");
    assert!(
        lines[0].contains(
            "binary cache: untrusted: rollback: tool-1 on refs/heads/tool-cache was signed at 2"
        ) && lines[0].contains(".git/warmstart/trust/seen"),
        "{what}: {}",
        lines[0]
    );
    assert!(
        !r.stdout().contains("tool v"),
        "{what}: ran a tool\n{}",
        show(&r.out)
    );
    assert!(
        err.contains("compile: skipped (--prebuilt-only)"),
        "{what}: no fallback\n{err}"
    );
    assert_eq!(installed(fx), before, "{what}: the install changed");
}

#[test]
fn trust_rollback_the_bootstrap_refuses_an_older_signed_statement_than_it_installed() {
    let fx = signed_tool_cache();
    let old = publish(&fx, "v1");
    // created_at has second precision: the newer statement is a second later.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let v2 = publish(&fx, "v2");
    let r = bootstrap(&fx).ok();
    assert!(r.stdout().contains("tool v2 restore"), "{}", show(&r.out));
    assert!(
        r.stderr().contains("binary cache: tool-1 is signed by ci"),
        "{}",
        show(&r.out)
    );
    let seen = std::fs::read_to_string(seen_path(&fx)).unwrap();
    assert!(seen.starts_with("tool tool-1 2"), "{seen}");

    // The older, validly signed branch pushed back: refused by the script,
    // and by the binary, which reads the record the script wrote.
    push_back(&fx, &old);
    refused_as_rollback(&fx, "after the script installed v2");
    let r = run(fx
        .env
        .xtask_in("work")
        .args(["cache", "restore", "tool", "--verify"]));
    assert_eq!(r.code(), 12, "{}", show(&r.out));
    assert!(r.stderr().contains("(rollback)"), "{}", r.stderr());
    assert_eq!(installed(&fx), "#!/bin/sh\necho \"tool v2 $*\"\n");

    // The other way round: the binary installed v2 on a clone with no
    // record yet; the script refuses the rollback from what it recorded.
    std::fs::remove_dir_all(fx.work.join(".git/warmstart")).unwrap();
    push_back(&fx, &v2);
    run(fx.env.xtask_in("work").args(["cache", "restore", "tool"])).ok();
    assert!(
        seen_path(&fx).is_file(),
        "the binary records what it trusted"
    );
    push_back(&fx, &old);
    refused_as_rollback(&fx, "after the binary installed v2");

    // A record the script cannot read is not ignored (that would re-open
    // rollbacks): refused, saying which file and how to recover.
    let record = std::fs::read_to_string(seen_path(&fx)).unwrap();
    for bad in [
        "tool tool-1 yesterday\n",
        "tool tool-1 2026-12-01 10:00:00Z\n",
    ] {
        std::fs::write(seen_path(&fx), bad).unwrap();
        let r = bootstrap(&fx);
        assert_eq!(r.code(), 12, "{bad:?}\n{}", show(&r.out));
        assert!(r.stderr().contains("is corrupt"), "{bad:?}: {}", r.stderr());
        let r = run(fx
            .env
            .xtask_in("work")
            .args(["cache", "restore", "tool", "--verify"]));
        assert_eq!(r.code(), 5, "{bad:?}\n{}", show(&r.out));
    }
    std::fs::write(seen_path(&fx), record).unwrap();

    // A fresh machine has no history: the newest it sees is the old one.
    std::fs::remove_dir_all(fx.work.join(".git/warmstart")).unwrap();
    std::fs::remove_dir_all(fx.work.join("inst")).unwrap();
    let r = bootstrap(&fx).ok();
    assert!(r.stdout().contains("tool v1 restore"), "{}", show(&r.out));
}
