//! Publishes over the per-push limit (GitHub refuses a push over 2 GiB):
//! with `WARMSTART_PUSH_LIMIT` lowered to 600 KiB over 3 MiB of
//! incompressible chunks, the new blobs go in batches through temporary
//! refs, then the root commit, then the temporary refs are deleted. The
//! server (`receive.unpackLimit = 1`) keeps one pack per push, which is how
//! the batches are counted on its side. An interrupted batched publish
//! (SIGKILL after its first batch) leaves a temporary ref that the next
//! publish reuses (it sends fewer bytes) and removes, leaving alone the
//! refs in that namespace that are not ours. Over git daemon, smart HTTP
//! (nginx + `git http-backend`) and ssh.

use crate::transports::{Fx, json_of};
use crate::util::git_daemon::GitDaemon;
use crate::util::servers::{GIT_PASSWORD, GIT_USER, Nginx, Sshd};
use crate::util::tree::{assert_same_tree, write_pseudo_random};
use crate::util::{Run, run, show};
use serde_json::Value;
use std::path::Path;

const LIMIT: u64 = 600 << 10;

/// 3 MiB of noise in chunks of 256 KiB: about 12 new chunks, two per batch.
fn fixture() -> Fx {
    Fx::with(3 << 20, 256 << 10)
}

fn publish(fx: &Fx, extra: &[(&str, &str)]) -> Run {
    let mut cmd = fx.command("work", &["cache", "publish", "art", "--json"]);
    cmd.env("WARMSTART_PUSH_LIMIT", LIMIT.to_string());
    for (k, v) in extra {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// The packs on the server, by name, with their sizes.
fn packs(bare: &Path) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = std::fs::read_dir(bare.join("objects/pack"))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                e.metadata().unwrap().len(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Packs in `after` that are not in `before`.
fn new_packs(before: &[(String, u64)], after: &[(String, u64)]) -> Vec<u64> {
    after
        .iter()
        .filter(|p| !before.contains(p))
        .map(|p| p.1)
        .collect()
}

/// Refs on the server under the two temporary namespaces.
fn temp_refs(fx: &Fx) -> Vec<String> {
    fx.env
        .git(
            "origin.git",
            [
                "for-each-ref",
                "--format=%(refname)",
                "refs/warmstart/tmp/",
                "refs/heads/warmstart-tmp/",
            ],
        )
        .lines()
        .map(str::to_string)
        .collect()
}

fn push_of(j: &Value) -> &Value {
    let p = &j["push"];
    assert!(p.is_object(), "{j}");
    p
}

/// A publish in batches: their count from --json and from the server's
/// packs, each pack under the limit (plus pack headers), no temporary ref
/// left, one root commit on `cache_ref`, `git fsck` clean, and a restore
/// from a fresh state that gives back the tree.
/// What the batched publish printed (stdout without `--json`, and stderr).
fn batched_round(fx: &Fx, url: &str, cache_ref: &str) -> String {
    fx.set_remote(url);
    let origin = fx.env.join("origin.git");
    let before = packs(&origin);
    let published = publish(fx, &[]).ok();
    let j = json_of(&published);
    assert_eq!(j["status"], "published", "{j}");
    let p = push_of(&j);
    let chunk_bytes: u64 = j["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["size"].as_u64().unwrap())
        .sum();
    let batches = p["batches"].as_u64().unwrap();
    assert!(batches >= chunk_bytes.div_ceil(LIMIT), "{j}");
    assert!(batches >= 4, "{j}");
    assert_eq!(p["limit_bytes"], LIMIT, "{j}");
    assert!(p["new_bytes"].as_u64().unwrap() >= chunk_bytes, "{j}");
    assert_eq!(p["reused_bytes"], 0, "{j}");
    assert_eq!(p["temp_refs_removed"], batches, "{j}");
    let added = new_packs(&before, &packs(&origin));
    // One pack per batch, one for the root commit.
    assert_eq!(added.len() as u64, batches + 1, "{added:?}\n{j}");
    for size in &added {
        assert!(
            *size <= LIMIT + (16 << 10),
            "a pack of {size} bytes: {added:?}"
        );
    }
    assert_eq!(temp_refs(fx), Vec::<String>::new());
    let commit = j["commit"].as_str().unwrap();
    assert_eq!(
        fx.env.git("origin.git", ["rev-parse", cache_ref]).trim(),
        commit
    );
    assert_eq!(
        fx.env
            .git("origin.git", ["rev-list", "--count", cache_ref])
            .trim(),
        "1"
    );
    fx.env
        .git("origin.git", ["fsck", "--full", "--no-progress"]);

    fx.forget();
    let r = json_of(&fx.xtask(&["cache", "restore", "art", "--json"]).ok());
    assert_eq!(r["state"], "restored", "{r}");
    assert_same_tree(&fx.src, &fx.target);

    // Under the limit, one push and no temporary ref: an unchanged
    // publish does not push at all, so change one small file.
    std::fs::write(fx.src.join("small-change.txt"), "one more file\n").unwrap();
    let j = json_of(&publish(fx, &[("WARMSTART_PUSH_LIMIT", "1G")]).ok());
    assert_eq!(push_of(&j)["batches"], 0, "{j}");
    assert!(push_of(&j)["new_bytes"].as_u64().unwrap() < LIMIT, "{j}");
    // The words, without --json, of a publish over the limit again.
    write_pseudo_random(&fx.src.join("more.bin"), 3 * LIMIT, 99);
    let mut cmd = fx.command("work", &["cache", "publish", "art"]);
    cmd.env("WARMSTART_PUSH_LIMIT", LIMIT.to_string());
    let r = run(&mut cmd).ok();
    let said = format!("{}{}{}", published.stderr(), r.stdout(), r.stderr());
    assert!(
        said.contains(" batches under the push limit of 600.00 KiB"),
        "{said}"
    );
    assert_eq!(temp_refs(fx), Vec::<String>::new());
    said
}

#[test]
fn cache_push_batches_over_git_daemon_on_branches() {
    let fx = fixture();
    let daemon = GitDaemon::start(fx.env.path());
    batched_round(&fx, &daemon.url("origin.git"), "refs/heads/art-cache");
}

#[test]
fn cache_push_batches_over_https_on_a_ref_outside_branches() {
    let fx = fixture();
    let manifest = fx.work.join("cache-manifests/art.toml");
    let mut text = std::fs::read_to_string(&manifest).unwrap();
    text.push_str("\n[cache]\nref = \"refs/warmstart/cache/art\"\n");
    std::fs::write(&manifest, text).unwrap();
    fx.env.git("work", ["commit", "-qam", "cache.ref"]);
    let server = Nginx::start(&fx.env.join("."));
    fx.global_config(&format!(
        "[http]\n\tsslCAInfo = {}\n",
        server.ca.cert.display()
    ));
    let url = server.url_with("origin.git", GIT_USER, GIT_PASSWORD);
    let said = batched_round(&fx, &url, "refs/warmstart/cache/art");
    // The URL's password never reaches the output.
    assert!(!said.contains(GIT_PASSWORD), "{said}");
    assert!(said.contains("refs/warmstart/tmp/art/"), "{said}");
}

/// Killed after its first batch; the next publish sends fewer bytes,
/// removes the leftover and its own temporary refs, and leaves alone the
/// refs in the namespace that are not ours.
#[test]
fn cache_push_after_an_interrupted_batched_publish_reuses_and_removes_leftovers_over_ssh() {
    let mut fx = fixture();
    let server = Sshd::start();
    fx.var("GIT_SSH_COMMAND", &server.ssh_command(&server.key));
    let origin = fx.env.join("origin.git");
    fx.set_remote(&server.url(&origin));
    let before = packs(&origin);
    let killed = publish(&fx, &[("WARMSTART_TEST_KILL_AT", "publish:batch-pushed")]);
    assert_eq!(killed.out.status.code(), None, "{}", show(&killed.out));
    let left = temp_refs(&fx);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(
        left[0].starts_with("refs/heads/warmstart-tmp/art/"),
        "{left:?}"
    );
    let first = new_packs(&before, &packs(&origin));
    assert_eq!(first.len(), 1, "{first:?}");

    // Not ours: a name of another shape, our shape on a commit that is not
    // a batch (and old enough to be stale), and another cache's namespace.
    let foreign = [
        "refs/heads/warmstart-tmp/art/notours",
        "refs/heads/warmstart-tmp/art/1700000000-0a1b2c3d/001",
        "refs/heads/warmstart-tmp/other/1700000000-0a1b2c3d/001",
    ];
    for r in foreign {
        fx.git("work", &["push", "-q", "origin", &format!("main:{r}")]);
    }

    let mid = packs(&origin);
    let r = publish(&fx, &[]).ok();
    let j = json_of(&r);
    assert_eq!(j["status"], "published", "{j}");
    let p = push_of(&j);
    let (new, reused) = (
        p["new_bytes"].as_u64().unwrap(),
        p["reused_bytes"].as_u64().unwrap(),
    );
    assert!(((256 << 10)..=LIMIT).contains(&reused), "{j}");
    let batches = p["batches"].as_u64().unwrap();
    assert!(batches >= 3, "{j}");
    assert_eq!(p["temp_refs_removed"], batches + 1, "{j}");
    let second = new_packs(&mid, &packs(&origin));
    let sent: u64 = second.iter().sum();
    // Only what had not landed: less than all new bytes by the first batch.
    assert!(sent < new - reused + (16 << 10), "{second:?}\n{j}");
    assert!(sent + first[0] >= new, "{second:?} {first:?}\n{j}");
    let mut left = temp_refs(&fx);
    left.sort();
    let mut want: Vec<String> = foreign.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(left, want);
    assert!(
        r.stderr().contains("warmstart-tmp/art/notours")
            && r.stderr().contains("does not hold a warmstart push batch"),
        "{}",
        show(&r.out)
    );
    fx.env
        .git("origin.git", ["fsck", "--full", "--no-progress"]);
    fx.forget();
    fx.xtask(&["cache", "restore", "art"]).ok();
    assert_same_tree(&fx.src, &fx.target);
    // No marker of a dead run is left: the next publish needs no look-up.
    let runs = fx.work.join(".git/warmstart/push-runs/art");
    let markers: Vec<_> = std::fs::read_dir(&runs)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(markers.is_empty(), "{markers:?}");
}

#[test]
fn cache_push_limits_that_are_not_sizes_are_refused_and_the_variable_wins() {
    let fx = fixture();
    fx.set_remote("../origin.git");
    for bad in ["0", "1.5GB", "lots"] {
        let r = publish(&fx, &[("WARMSTART_PUSH_LIMIT", bad)]).expect_code(10);
        assert!(
            r.stderr().contains("WARMSTART_PUSH_LIMIT"),
            "{}",
            show(&r.out)
        );
    }
    let manifest = fx.work.join("cache-manifests/art.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    for bad in ["\"1.5GB\"", "0", "-1"] {
        let edited = text.replace("[publish]\n", &format!("[publish]\npush_limit = {bad}\n"));
        std::fs::write(&manifest, edited).unwrap();
        let mut cmd = fx.command("work", &["cache", "publish", "art"]);
        let r = run(&mut cmd).expect_code(10);
        assert!(r.stderr().contains("push_limit"), "{}", show(&r.out));
        assert_eq!(temp_refs(&fx), Vec::<String>::new());
    }
    assert_eq!(fx.env.git("origin.git", ["for-each-ref"]), "");
    // The variable wins over the manifest, which wins over the default.
    let edited = text.replace("[publish]\n", "[publish]\npush_limit = \"600k\"\n");
    std::fs::write(&manifest, edited).unwrap();
    let j = json_of(&publish(&fx, &[("WARMSTART_PUSH_LIMIT", "1G")]).ok());
    assert_eq!(push_of(&j)["batches"], 0, "{j}");
    assert_eq!(push_of(&j)["limit_bytes"], 1u64 << 30, "{j}");
    write_pseudo_random(&fx.src.join("more.bin"), 3 * LIMIT, 5);
    let mut cmd = fx.command("work", &["cache", "publish", "art", "--json"]);
    let j = json_of(&run(&mut cmd).ok());
    assert_eq!(push_of(&j)["limit_bytes"], LIMIT, "{j}");
    assert!(push_of(&j)["batches"].as_u64().unwrap() >= 3, "{j}");
    std::fs::write(&manifest, &text).unwrap();
    std::fs::write(fx.src.join("small.txt"), "x\n").unwrap();
    let mut cmd = fx.command("work", &["cache", "publish", "art", "--json"]);
    let j = json_of(&run(&mut cmd).ok());
    assert_eq!(push_of(&j)["limit_bytes"], 1536u64 << 20, "{j}");
}

/// Leftovers this clone has no marker for (another clone's, as far as it
/// can tell): their blobs count as landed, even when this clone's store
/// lacks their commits (fetched without blobs), and only a day-old one is
/// removed; a recent one may be a live publisher's.
#[test]
fn cache_push_leftovers_of_another_clone_are_reused_and_removed_only_when_a_day_old() {
    let fx = fixture();
    fx.set_remote("../origin.git");
    let killed = publish(&fx, &[("WARMSTART_TEST_KILL_AT", "publish:batch-pushed")]);
    assert_eq!(killed.out.status.code(), None, "{}", show(&killed.out));
    let left = temp_refs(&fx);
    assert_eq!(left.len(), 1, "{left:?}");
    let batch = fx.env.git("origin.git", ["rev-parse", &left[0]]);
    let batch = batch.trim();
    std::fs::remove_dir_all(fx.work.join(".git/warmstart/push-runs")).unwrap();
    fx.forget();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let recent = format!("refs/heads/warmstart-tmp/art/{now}-0badc0de/001");
    let old = "refs/heads/warmstart-tmp/art/1700000000-0badc0de/001";
    for r in [recent.as_str(), old] {
        fx.env.git("origin.git", ["update-ref", r, batch]);
    }
    fx.env.git("origin.git", ["update-ref", "-d", &left[0]]);

    let before = packs(&fx.env.join("origin.git"));
    let j = json_of(&publish(&fx, &[]).ok());
    let p = push_of(&j);
    let reused = p["reused_bytes"].as_u64().unwrap();
    assert!(((256 << 10)..=LIMIT).contains(&reused), "{j}");
    let batches = p["batches"].as_u64().unwrap();
    assert_eq!(p["temp_refs_removed"], batches + 1, "{j}");
    assert_eq!(temp_refs(&fx), vec![recent]);
    let sent: u64 = new_packs(&before, &packs(&fx.env.join("origin.git")))
        .iter()
        .sum();
    let new = p["new_bytes"].as_u64().unwrap();
    assert!(sent < new - reused + (16 << 10), "sent {sent}\n{j}");
    fx.env
        .git("origin.git", ["fsck", "--full", "--no-progress"]);
    fx.forget();
    fx.xtask(&["cache", "restore", "art"]).ok();
    assert_same_tree(&fx.src, &fx.target);
}

/// A host whose rules refuse the temporary refs: exit 8, one line with the
/// setting to change, and the cache ref untouched.
#[test]
fn cache_push_a_host_that_refuses_temporary_refs_gets_the_fix() {
    for (on_ref, want) in [
        (
            true,
            "set cache.branch (e.g. \"art-cache\") instead of cache.ref",
        ),
        (false, "exempt warmstart-tmp/** from the rule"),
    ] {
        let fx = fixture();
        if on_ref {
            let manifest = fx.work.join("cache-manifests/art.toml");
            let mut text = std::fs::read_to_string(&manifest).unwrap();
            text.push_str("\n[cache]\nref = \"refs/warmstart/cache/art\"\n");
            std::fs::write(&manifest, text).unwrap();
            fx.env.git("work", ["commit", "-qam", "cache.ref"]);
        }
        let hook = fx.env.join("origin.git/hooks/pre-receive");
        std::fs::write(
            &hook,
            "#!/bin/sh\nwhile read old new ref; do\n  case \"$ref\" in\n    refs/warmstart/tmp/*|refs/heads/warmstart-tmp/*) echo \"refusing $ref\" >&2; exit 1;;\n  esac\ndone\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
        fx.set_remote("../origin.git");
        let r = publish(&fx, &[]).expect_code(8);
        let err = r.stderr();
        assert!(err.contains(want), "{}", show(&r.out));
        assert_eq!(err.trim().lines().count(), 1, "{}", show(&r.out));
        let refs = fx.env.git("origin.git", ["for-each-ref"]);
        assert_eq!(refs, "", "{refs}");
    }
}

/// A push that fails between batches (here the host refuses the second
/// batch once): exit 8, a warning that the temporary refs stay, and the
/// next publish reuses the first batch and removes it.
#[test]
fn cache_push_a_failure_between_batches_is_finished_by_the_next_publish() {
    let fx = fixture();
    let count = fx.env.join("pushes");
    let hook = fx.env.join("origin.git/hooks/pre-receive");
    std::fs::write(
        &hook,
        format!(
            "#!/bin/sh\necho x >> {count}\nif [ \"$(wc -l < {count})\" -eq 2 ]; then echo 'refusing once' >&2; exit 1; fi\n",
            count = count.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    fx.set_remote("../origin.git");
    let r = publish(&fx, &[]).expect_code(8);
    assert!(
        r.stderr().contains("pushing batch 2 of ")
            && r.stderr().contains("stay on")
            && r.stderr()
                .contains("the next publish reuses what they hold and removes them"),
        "{}",
        show(&r.out)
    );
    let left = temp_refs(&fx);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].ends_with("/001"), "{left:?}");
    let j = json_of(&publish(&fx, &[]).ok());
    let p = push_of(&j);
    assert!(p["reused_bytes"].as_u64().unwrap() >= 256 << 10, "{j}");
    assert_eq!(
        p["temp_refs_removed"].as_u64(),
        Some(p["batches"].as_u64().unwrap() + 1),
        "{j}"
    );
    assert_eq!(temp_refs(&fx), Vec::<String>::new());
    fx.forget();
    fx.xtask(&["cache", "restore", "art"]).ok();
    assert_same_tree(&fx.src, &fx.target);
}

/// Three caches on one branch, published at once from one clone (one
/// cache.git), each over the limit: every publish lands (lost leases are
/// retried on this run's temporary refs, never pushed again under the same
/// name), the other runs' live refs are left alone, and none remains.
#[test]
fn cache_push_concurrent_batched_publishes_to_one_branch_all_land() {
    let env = crate::util::TestEnv::new();
    env.bare_remote("origin.git");
    let work = env.work_repo("work");
    let daemon = GitDaemon::start(env.path());
    env.git(
        "work",
        ["remote", "add", "origin", &daemon.url("origin.git")],
    );
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    for i in 0..3 {
        let src = env.join(format!("src{i}"));
        std::fs::create_dir_all(&src).unwrap();
        write_pseudo_random(&src.join("noise.bin"), 1_500_000, 40 + i);
        std::fs::write(
            work.join(format!("cache-manifests/c{i}.toml")),
            format!(
                "[cache]\nbranch = \"shared-cache\"\n\n[[key]]\nname = \"v\"\nliteral = \"k\"\n\n[pack]\nroot = \"{}\"\n\n[publish]\nchunk_bytes = 262144\n\n[restore]\npath = \"restored-{i}\"\n",
                src.display()
            ),
        )
        .unwrap();
    }
    let children: Vec<_> = (0..3)
        .map(|i| {
            let mut cmd = env.xtask_in("work");
            cmd.args(["cache", "publish", &format!("c{i}"), "--json"])
                .env("WARMSTART_PUSH_LIMIT", LIMIT.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for c in children {
        let r = Run {
            out: c.wait_with_output().unwrap(),
        };
        let j = json_of(&r.ok());
        assert!(push_of(&j)["batches"].as_u64().unwrap() >= 2, "{j}");
    }
    let refs = env.git(
        "origin.git",
        ["for-each-ref", "--format=%(refname)", "refs/heads/"],
    );
    assert_eq!(refs.trim(), "refs/heads/shared-cache", "{refs}");
    let text = env.git("origin.git", ["show", "shared-cache:warmstart.json"]);
    for i in 0..3 {
        assert!(text.contains(&format!("\"c{i}-k\"")), "{text}");
    }
    env.git("origin.git", ["fsck", "--full", "--no-progress"]);
    for i in 0..3 {
        run(env
            .xtask_in("work")
            .args(["cache", "restore", &format!("c{i}")]))
        .ok();
        crate::util::tree::assert_same_tree(
            &env.join(format!("src{i}")),
            &work.join(format!("restored-{i}")),
        );
    }
}
