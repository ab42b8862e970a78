//! `cargo xtask cache publish` against real remotes: bare repositories over file://, `git daemon`, smart HTTP.
//!
//! What a publish must guarantee, checked from the outside: the branch is
//! one root commit after every publish; the coreutils path of docs/format.md
//! restores what was published (`sha256sum -c SHA256SUMS` passes in a
//! checkout of the branch); an unchanged artifact makes no commit and no
//! push; the same tree packs to the same bytes; bad input is refused with its
//! own exit code and leaves the remote as it was.

use crate::util::git_daemon::GitDaemon;
use crate::util::http_backend::HttpGit;
use crate::util::tree::{BIG_FILE_BYTES, assert_same_tree, make_tricky_tree};
use crate::util::{Run, TestEnv, run, show};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A work repository whose `origin` is `origin` (a URL or a path), with
/// `cache-manifests/<name>.toml` packing `src`.
fn work_with_manifest(env: &TestEnv, rel: &str, origin: &str, name: &str, body: &str) -> PathBuf {
    let work = env.work_repo(rel);
    env.git(rel, ["remote", "add", "origin", origin]);
    write_manifest(&work, name, body);
    work
}

fn write_manifest(work: &Path, name: &str, body: &str) {
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(work.join(format!("cache-manifests/{name}.toml")), body).unwrap();
}

/// A manifest packing `src` with key `<name>-<literal>`.
fn manifest(src: &Path, literal: &str, extra: &str) -> String {
    format!(
        "[cache]\ndescription = \"test artifact\"\n\n[[key]]\nname = \"v\"\nliteral = \"{literal}\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored\"\n{extra}",
        src.display()
    )
}

/// The common setup: a tricky tree in `src`, a bare `origin.git`, and a work
/// repository whose manifest `name` packs `src` with key `<name>-<literal>`.
fn tricky_setup(name: &str, literal: &str, extra: &str) -> (TestEnv, PathBuf, PathBuf) {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    let work = work_with_manifest(
        &env,
        "work",
        "../origin.git",
        name,
        &manifest(&src, literal, extra),
    );
    (env, src, work)
}

fn publish(env: &TestEnv, work: &str, args: &[&str]) -> Run {
    let mut cmd = env.xtask_in(work);
    cmd.args(["cache", "publish"]).args(args);
    run(&mut cmd)
}

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_str(&r.stdout())
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", show(&r.out)))
}

/// The branch tip on a bare remote, or None.
fn remote_ref(env: &TestEnv, bare: &str, branch: &str) -> Option<String> {
    let mut cmd = Command::new("git");
    cmd.current_dir(env.join(bare))
        .args(["rev-parse", "--verify", "--quiet"])
        .arg(format!("refs/heads/{branch}"));
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Loose and packed object counts and the pack count of a bare remote.
fn object_counts(env: &TestEnv, bare: &str) -> String {
    env.git(bare, ["count-objects", "-v"])
        .lines()
        .filter(|l| l.starts_with("count:") || l.starts_with("in-pack:") || l.starts_with("packs:"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The branch is exactly one commit, and that commit has no parent.
fn assert_one_root_commit(env: &TestEnv, bare: &str, branch: &str) {
    let count = env.git(
        bare,
        ["rev-list", "--count", &format!("refs/heads/{branch}")],
    );
    assert_eq!(count.trim(), "1", "{branch} should be one commit");
    let parents = env.git(
        bare,
        [
            "rev-list",
            "--parents",
            "-n",
            "1",
            &format!("refs/heads/{branch}"),
        ],
    );
    assert_eq!(
        parents.split_whitespace().count(),
        1,
        "{branch} tip has a parent: {parents}"
    );
}

/// The branch README's coreutils path, verbatim (plus `pipefail`), in a fresh clone
/// with `url` as origin: fetch, `git archive | tar -x`, `sha256sum -c`,
/// then `cat parts | zstd -d | tar -x` into `dest`. Returns sha256sum's output.
fn coreutils_restore(env: &TestEnv, url: &str, branch: &str, key: &str, dest: &Path) -> String {
    let clone = env.join(format!(
        "coreutils-{}",
        dest.file_name().unwrap().to_string_lossy()
    ));
    std::fs::create_dir_all(&clone).unwrap();
    env.git(&clone, ["init", "-q"]);
    env.git(&clone, ["remote", "add", "origin", url]);
    std::fs::create_dir_all(clone.join("tmp")).unwrap();
    std::fs::create_dir_all(dest).unwrap();
    let script = format!(
        "set -o pipefail; git fetch origin {branch} && git archive FETCH_HEAD | tar -x -C tmp && (cd tmp && sha256sum -c SHA256SUMS) && cat tmp/{key}.tar.zst.part* | zstd -d | tar -x -C \"$DEST\""
    );
    let mut cmd = Command::new("bash");
    cmd.current_dir(&clone)
        .args(["-c", &script])
        .env("DEST", dest);
    env.isolate(&mut cmd);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "coreutils restore failed\n{}",
        show(&out)
    );
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(said.contains(": OK"), "sha256sum -c said nothing: {said}");
    assert!(!said.contains("FAILED"), "{said}");
    said
}

fn branch_manifest(env: &TestEnv, bare: &str, branch: &str) -> serde_json::Value {
    let text = env.git(
        bare,
        ["show", &format!("refs/heads/{branch}:warmstart.json")],
    );
    serde_json::from_str(&text).unwrap()
}

#[test]
fn tricky_tree_over_file_url_restores_with_coreutils() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    let url = format!("file://{}", env.join("origin.git").display());
    // Small chunks so that chunk boundaries fall inside files and headers.
    work_with_manifest(
        &env,
        "work",
        &url,
        "tricky",
        &manifest(&src, "1", "\n[publish]\nchunk_bytes = 500\n"),
    );
    let r = publish(&env, "work", &["tricky", "--json"]).ok();
    let s = json(&r);
    assert_eq!(s["status"], "published");
    assert_eq!(s["key"], "tricky-1");
    let chunks = s["chunks"].as_array().unwrap();
    assert!(chunks.len() >= 3, "expected several chunks: {chunks:?}");
    assert!(chunks.iter().all(|c| c["size"].as_u64().unwrap() <= 500));
    assert_one_root_commit(&env, "origin.git", "tricky-cache");

    let files = env.git(
        "origin.git",
        ["ls-tree", "--name-only", "refs/heads/tricky-cache"],
    );
    let mut names: Vec<&str> = files.lines().collect();
    names.sort();
    assert_eq!(
        &names[..4],
        [
            "README.md",
            "SHA256SUMS",
            "tricky-1.files.zst.part000",
            "tricky-1.tar.zst.part000"
        ]
    );
    assert_eq!(names.last(), Some(&"warmstart.json"));
    let m = branch_manifest(&env, "origin.git", "tricky-cache");
    assert_eq!(m["format"], 1);
    let entry = &m["keys"]["tricky-1"];
    assert_eq!(entry["compression"], "zstd");
    assert_eq!(entry["archive"], "tricky-1.tar.zst");
    assert_eq!(entry["ungated"], false);
    assert_eq!(entry["key_parts"][0]["value"], "1");
    let head = env.git("work", ["rev-parse", "HEAD"]);
    assert_eq!(entry["source_commit"], head.trim());
    let readme = env.git("origin.git", ["show", "refs/heads/tricky-cache:README.md"]);
    assert!(readme.contains("sha256sum -c SHA256SUMS"), "{readme}");

    let dest = env.join("restored-by-coreutils");
    coreutils_restore(&env, &url, "tricky-cache", "tricky-1", &dest);
    assert_same_tree(&src, &dest);
    // The tar digest on the branch is the digest of what zstd -d gives.
    let tar = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -o pipefail; cat {}/tmp/tricky-1.tar.zst.part* | zstd -d | sha256sum",
            env.join("coreutils-restored-by-coreutils").display()
        ))
        .output()
        .unwrap();
    assert!(tar.status.success(), "{}", show(&tar));
    assert!(
        String::from_utf8_lossy(&tar.stdout).starts_with(entry["tar_sha256"].as_str().unwrap())
    );
}

/// The one big case: a 210 MB incompressible file spans the ramp (8 and 32
/// MiB) and two default-size (99 MiB) chunks; published and restored
/// through `git daemon`.
#[test]
fn big_file_crosses_default_chunks_over_git_daemon() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, true);
    env.bare_remote("origin.git");
    let daemon = GitDaemon::start(env.path());
    let url = daemon.url("origin.git");
    work_with_manifest(&env, "work", &url, "big", &manifest(&src, "1", ""));
    let s = json(&publish(&env, "work", &["big", "--json"]).ok());
    let chunks = s["chunks"].as_array().unwrap();
    // Content-defined chunks of 1 to 16 MiB of tar (4 MiB on average),
    // each one zstd frame: random bytes do not shrink, so a chunk file is
    // its raw size plus zstd's few bytes of framing.
    let mib = 1024 * 1024;
    assert!(
        (BIG_FILE_BYTES / (16 * mib)..=BIG_FILE_BYTES / mib).contains(&(chunks.len() as u64)),
        "{} chunks",
        chunks.len()
    );
    for c in chunks {
        assert!(c["size"].as_u64().unwrap() <= 16 * mib + 64 * 1024, "{c}");
    }
    assert!(s["compressed_bytes"].as_u64().unwrap() > BIG_FILE_BYTES);
    assert_one_root_commit(&env, "origin.git", "big-cache");
    let dest = env.join("dest");
    coreutils_restore(&env, &url, "big-cache", "big-1", &dest);
    assert_same_tree(&src, &dest);
    // The restore half on the same branch (kept in this one big test):
    // fetched over git daemon, every chunk verified, swapped in.
    let r = run(env
        .xtask_in("work")
        .args(["cache", "restore", "big", "--json"]));
    let j = json(&r.ok());
    assert_eq!(j["state"], "restored", "{j}");
    assert!(j["compressed_bytes"].as_u64().unwrap() > BIG_FILE_BYTES);
    assert_same_tree(&src, &env.join("work/restored"));
}

#[test]
fn unchanged_artifact_makes_no_commit_and_no_push() {
    let (env, src, _) = tricky_setup("tricky", "1", "\n[publish]\nchunk_bytes = 300\n");
    publish(&env, "work", &["tricky"]).ok();
    let tip = remote_ref(&env, "origin.git", "tricky-cache").unwrap();
    let counts = object_counts(&env, "origin.git");

    // Touching files changes mtimes, which the tar ignores by default.
    std::fs::write(src.join("plain.txt"), "plain text\n").unwrap();
    let r = publish(&env, "work", &["tricky"]).ok();
    assert!(r.stdout().contains("unchanged"), "{}", r.stdout());
    assert!(r.stdout().contains("no commit, no push"), "{}", r.stdout());
    assert_eq!(remote_ref(&env, "origin.git", "tricky-cache").unwrap(), tip);
    assert_eq!(object_counts(&env, "origin.git"), counts);
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "unchanged");
    assert_eq!(s["commit"], tip.as_str());
    assert!(
        s["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["reused"] == true)
    );
    // Not a tty: plain lines, no progress-bar escapes.
    assert!(
        !r.stderr().contains('\u{1b}') && !r.stderr().contains('\r'),
        "{}",
        r.stderr()
    );

    // A change in the last file makes a new root commit; the leading
    // chunks are the same bytes and are not stored again.
    std::fs::write(src.join("zz-new-file"), "new\n").unwrap();
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "published");
    assert_eq!(s["previous_commit"], tip.as_str());
    assert_ne!(remote_ref(&env, "origin.git", "tricky-cache").unwrap(), tip);
    assert_one_root_commit(&env, "origin.git", "tricky-cache");
    let reused = s["chunks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["reused"] == true)
        .count();
    assert!(reused >= 1, "{}", s["chunks"]);
}

#[test]
fn keys_are_kept_merged_and_sorted() {
    let (env, src, work) = tricky_setup("multi", "b", "");
    publish(&env, "work", &["multi"]).ok();
    write_manifest(&work, "multi", &manifest(&src, "a", ""));
    publish(&env, "work", &["multi"]).ok();
    assert_one_root_commit(&env, "origin.git", "multi-cache");
    let m = branch_manifest(&env, "origin.git", "multi-cache");
    let keys: Vec<&String> = m["keys"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["multi-a", "multi-b"]);
    let sums = env.git("origin.git", ["show", "refs/heads/multi-cache:SHA256SUMS"]);
    assert!(
        sums.contains("multi-a.tar.zst.part000") && sums.contains("multi-b.tar.zst.part000"),
        "{sums}"
    );
    // Both keys restore through the coreutils path (sha256sum -c checks all chunks).
    let url = env.join("origin.git").display().to_string();
    for key in ["multi-a", "multi-b"] {
        let dest = env.join(format!("dest-{key}"));
        coreutils_restore(&env, &url, "multi-cache", key, &dest);
        assert_same_tree(&src, &dest);
    }
    // Republishing b with other content replaces b only.
    std::fs::write(src.join("plain.txt"), "changed\n").unwrap();
    write_manifest(&work, "multi", &manifest(&src, "b", ""));
    publish(&env, "work", &["multi"]).ok();
    assert_one_root_commit(&env, "origin.git", "multi-cache");
    let m2 = branch_manifest(&env, "origin.git", "multi-cache");
    assert_eq!(m2["keys"]["multi-a"], m["keys"]["multi-a"]);
    assert_ne!(
        m2["keys"]["multi-b"]["tar_sha256"],
        m["keys"]["multi-b"]["tar_sha256"]
    );
}

/// Same input, same bytes: two trees made apart in time (other mtimes,
/// inodes and creation order), published from two repositories to two
/// remotes, give the same chunk blobs.
#[test]
fn pack_is_deterministic_across_trees_and_clones() {
    let env = TestEnv::new();
    make_tricky_tree(&env.join("src1"), false);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    make_tricky_tree(&env.join("src2"), false);
    let mut oids = Vec::new();
    for i in ["1", "2"] {
        let bare = format!("origin{i}.git");
        env.bare_remote(&bare);
        let body = manifest(
            &env.join(format!("src{i}")),
            "x",
            "\n[publish]\nchunk_bytes = 400\n",
        );
        work_with_manifest(
            &env,
            &format!("work{i}"),
            &format!("../{bare}"),
            "det",
            &body,
        );
        let s = json(&publish(&env, &format!("work{i}"), &["det", "--json"]).ok());
        oids.push((
            s["tar_sha256"].clone(),
            s["chunks"].clone(),
            env.git(&bare, ["ls-tree", "refs/heads/det-cache"])
                .lines()
                .filter(|l| l.contains(".part"))
                .map(str::to_string)
                .collect::<Vec<_>>(),
        ));
    }
    assert_eq!(oids[0], oids[1]);
    assert!(oids[0].2.len() >= 2);
}

#[test]
fn dry_run_and_key_only_write_nothing() {
    let (env, _, work) = tricky_setup("tricky", "7", "");
    let r = publish(&env, "work", &["tricky", "--dry-run"]).ok();
    let out = r.stdout();
    for want in [
        "key      tricky-7",
        "v = 7",
        "branch   tricky-cache",
        "remote   origin",
        "entries",
    ] {
        assert!(out.contains(want), "dry run lacks {want:?}:\n{out}");
    }
    let s = json(&publish(&env, "work", &["tricky", "--dry-run", "--json"]).ok());
    assert_eq!(s["status"], "dry-run");
    assert!(s["entries"].as_u64().unwrap() > 20);
    let r = publish(&env, "work", &["tricky", "--key-only"]).ok();
    assert_eq!(r.stdout().lines().next(), Some("tricky-7"));
    assert!(
        !work.join(".git/warmstart").exists(),
        "dry run created state"
    );
    assert_eq!(remote_ref(&env, "origin.git", "tricky-cache"), None);
}

/// With `[publish] gates`: refused (exit 9, naming the gate) until `gates
/// run` records them green for HEAD's tree; then the record is embedded in
/// warmstart.json. `--allow-ungated` is loud and recorded.
#[test]
fn required_gates_refuse_until_green_and_allow_ungated_is_loud_and_recorded() {
    let (env, _, work) = tricky_setup("gated", "1", "\n[publish]\ngates = [\"check\"]\n");
    std::fs::write(
        work.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"check\"\ncommand = [\"true\"]\ntimeout = \"30s\"\n",
    )
    .unwrap();
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "cache and gates manifests"]);

    let r = publish(&env, "work", &["gated"]).expect_code(9);
    assert!(r.stderr().contains("check"), "{}", r.stderr());
    assert_eq!(remote_ref(&env, "origin.git", "gated-cache"), None);

    let r = publish(&env, "work", &["gated", "--allow-ungated", "--quiet"]).ok();
    assert!(
        r.stderr().contains("PUBLISHING WITHOUT GATES"),
        "{}",
        r.stderr()
    );
    assert_eq!(r.stdout(), "", "--quiet printed to stdout");
    let m = branch_manifest(&env, "origin.git", "gated-cache");
    assert_eq!(m["keys"]["gated-1"]["ungated"], true);
    assert_eq!(m["keys"]["gated-1"]["gates"], serde_json::Value::Null);

    let mut gates = env.xtask_in("work");
    gates.args(["gates", "run"]);
    run(&mut gates).ok();
    // Same bytes, but now gated: republished to record the gates.
    let s = json(&publish(&env, "work", &["gated", "--json"]).ok());
    assert_eq!(s["status"], "published");
    assert_eq!(s["ungated"], false);
    let m = branch_manifest(&env, "origin.git", "gated-cache");
    let entry = &m["keys"]["gated-1"];
    assert_eq!(entry["ungated"], false);
    let record = entry["gates"].to_string();
    assert!(
        record.contains("check"),
        "no gate record in warmstart.json: {record}"
    );
    // --allow-ungated on a green tree bypasses nothing: no warning, unchanged.
    let r = publish(&env, "work", &["gated", "--allow-ungated"]).ok();
    assert!(!r.stderr().contains("WITHOUT GATES"), "{}", r.stderr());
    assert!(r.stdout().contains("unchanged"), "{}", r.stdout());
    // And a dirty worktree is not green.
    std::fs::write(work.join("untracked.txt"), "dirty\n").unwrap();
    publish(&env, "work", &["gated"]).expect_code(9);
}

#[test]
fn bad_input_is_refused_with_its_code_and_the_remote_kept() {
    let (env, src, work) = tricky_setup("c", "1", "");
    publish(&env, "work", &["c"]).ok();
    let tip = remote_ref(&env, "origin.git", "c-cache").unwrap();

    // No such manifest.
    let r = publish(&env, "work", &["nope"]).expect_code(4);
    assert!(r.stderr().contains("nope.toml"), "{}", r.stderr());
    // A pack root that does not exist.
    write_manifest(&work, "missing", &manifest(&env.join("not-built"), "1", ""));
    let r = publish(&env, "work", &["missing"]).expect_code(4);
    assert!(r.stderr().contains("not-built"), "{}", r.stderr());
    // A fifo in the tree is named, and nothing is pushed.
    let fifo = src.join("dir/a-fifo");
    assert!(
        Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap()
            .success()
    );
    std::fs::write(src.join("plain.txt"), "changed so a publish would push\n").unwrap();
    let r = publish(&env, "work", &["c"]).expect_code(7);
    assert!(r.stderr().contains("a-fifo"), "{}", r.stderr());
    assert!(r.stderr().contains("pack.exclude"), "{}", r.stderr());
    std::fs::remove_file(&fifo).unwrap();
    // An unknown remote name.
    let r = publish(&env, "work", &["c", "--remote", "upstream"]).expect_code(10);
    assert!(
        r.stderr().contains("git remote add upstream"),
        "{}",
        r.stderr()
    );
    // An unreachable remote.
    let gone = env.join("gone.git").display().to_string();
    let r = publish(&env, "work", &["c", "--remote", &gone]).expect_code(8);
    assert!(r.stderr().contains("gone.git"), "{}", r.stderr());
    // A branch with history is not a cache branch: never replaced.
    env.git("work", ["push", "-q", "origin", "main:refs/heads/main"]);
    env.git("work", ["commit", "-q", "--allow-empty", "-m", "second"]);
    env.git("work", ["push", "-q", "origin", "main:refs/heads/main"]);
    let main_tip = remote_ref(&env, "origin.git", "main").unwrap();
    write_manifest(
        &work,
        "clobber",
        &manifest(&src, "1", "").replace("[cache]\n", "[cache]\nbranch = \"main\"\n"),
    );
    let r = publish(&env, "work", &["clobber"]).expect_code(10);
    assert!(r.stderr().contains("has history"), "{}", r.stderr());
    assert_eq!(remote_ref(&env, "origin.git", "main").unwrap(), main_tip);
    // An invalid manifest.
    write_manifest(&work, "bad", "[pack]\nroot = \"x\"\n");
    publish(&env, "work", &["bad"]).expect_code(10);

    assert_eq!(remote_ref(&env, "origin.git", "c-cache").unwrap(), tip);
    assert_one_root_commit(&env, "origin.git", "c-cache");
}

#[test]
fn unreadable_branch_manifest_is_refused_not_replaced() {
    let (env, _, _) = tricky_setup("c", "1", "");
    // A root commit on c-cache whose warmstart.json is not JSON.
    let hand = env.join("hand");
    env.git(".", ["init", "-q", "-b", "c-cache", "hand"]);
    std::fs::write(hand.join("warmstart.json"), "{ not json").unwrap();
    env.git("hand", ["add", "-A"]);
    env.git("hand", ["commit", "-q", "-m", "broken"]);
    env.git(
        "hand",
        [
            "push",
            "-q",
            env.join("origin.git").to_str().unwrap(),
            "c-cache",
        ],
    );
    let tip = remote_ref(&env, "origin.git", "c-cache").unwrap();
    let r = publish(&env, "work", &["c"]).expect_code(5);
    assert!(r.stderr().contains("warmstart.json"), "{}", r.stderr());
    assert_eq!(remote_ref(&env, "origin.git", "c-cache").unwrap(), tip);
}

/// Two publishers of different keys race for one branch: the lease makes
/// the loser merge again, and both keys end up on the single root commit.
#[test]
fn concurrent_publishers_of_two_keys_both_land() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    for (w, k) in [("w1", "one"), ("w2", "two")] {
        work_with_manifest(&env, w, "../origin.git", "race", &manifest(&src, k, ""));
    }
    let children: Vec<_> = ["w1", "w2"]
        .iter()
        .map(|w| {
            let mut cmd = env.xtask_in(w);
            cmd.args(["cache", "publish", "race"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped());
            cmd.spawn().unwrap()
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", show(&out));
    }
    assert_one_root_commit(&env, "origin.git", "race-cache");
    let m = branch_manifest(&env, "origin.git", "race-cache");
    let keys: Vec<&String> = m["keys"].as_object().unwrap().keys().collect();
    assert_eq!(keys, ["race-one", "race-two"]);
}

/// Publish over smart HTTP (`git http-backend`), then restore over HTTP
/// with the coreutils path and with `cache restore` in a fresh clone.
#[test]
fn smart_http_round_trip() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    let server = HttpGit::start(env.path());
    let url = server.url("origin.git");
    work_with_manifest(
        &env,
        "work",
        &url,
        "web",
        &manifest(&src, "1", "\n[publish]\nchunk_bytes = 400\n"),
    );
    let s = json(&publish(&env, "work", &["web", "--json"]).ok());
    assert_eq!(s["status"], "published");
    assert_eq!(s["remote"]["url"], url.as_str());
    assert_one_root_commit(&env, "origin.git", "web-cache");
    let served = server.requests.load(std::sync::atomic::Ordering::SeqCst);
    assert!(served >= 2, "only {served} HTTP requests");
    let dest = env.join("dest");
    coreutils_restore(&env, &url, "web-cache", "web-1", &dest);
    assert_same_tree(&src, &dest);
    // Our restore, in a clone made over HTTP.
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "add the cache manifest"]);
    env.git("work", ["push", "-q", "origin", "main"]);
    env.git(".", ["clone", "-q", &url, "clone"]);
    let mut cmd = env.xtask_in("clone");
    cmd.args(["cache", "restore", "web"]);
    run(&mut cmd).ok();
    assert_same_tree(&src, &env.join("clone/restored"));
    // Unchanged over HTTP too.
    let s = json(&publish(&env, "work", &["web", "--json"]).ok());
    assert_eq!(s["status"], "unchanged");
}

/// Adoption: another repository with its own `cache-manifests/` (relative
/// pack root, key pins from a JSON file and a regex, restore path under `~`)
/// publishes with the built binary, and a fresh clone restores with it; a
/// version bump is a new key.
#[test]
fn another_repository_publishes_and_restores_with_the_built_binary() {
    let env = TestEnv::new();
    env.bare_remote("other.git");
    let daemon = GitDaemon::start(env.path());
    let url = daemon.url("other.git");
    let other = env.work_repo("other");
    env.git("other", ["remote", "add", "origin", &url]);
    std::fs::write(
        other.join("build-info.json"),
        r#"{"tool": {"version": "1.2.0"}}"#,
    )
    .unwrap();
    std::fs::write(other.join("toolchain.txt"), "channel = 2026-11\n").unwrap();
    write_manifest(
        &other,
        "tool",
        r#"
[cache]
description = "the other project's built tool"

[[key]]
name = "version"
json = { file = "build-info.json", pointer = "/tool/version" }

[[key]]
name = "channel"
regex = { file = "toolchain.txt", pattern = 'channel = (\S+)' }

[[key]]
name = "platform"
platform = true

[pack]
root = "build/out"
exclude = ["**/*.tmp"]

[restore]
path = "~/.cache/other-tool"

[ready]
path = "bin/tool"
"#,
    );
    std::fs::write(other.join(".gitignore"), "build/\n").unwrap();
    make_tricky_tree(&other.join("build/out"), false);
    std::fs::write(other.join("build/out/scratch.tmp"), "not packed\n").unwrap();
    env.git("other", ["add", "-A"]);
    env.git("other", ["commit", "-q", "-m", "adopt warmstart"]);
    env.git("other", ["push", "-q", "origin", "main"]);

    // Publish from a subdirectory: the repository is found from there.
    std::fs::create_dir_all(other.join("docs")).unwrap();
    let s = json(&publish(&env, "other/docs", &["tool", "--json"]).ok());
    let key = s["key"].as_str().unwrap().to_string();
    assert!(key.starts_with("tool-1.2.0-2026_11-"), "{key}");

    env.git(".", ["clone", "-q", &url, "clone"]);
    let restore = |cwd: &str| {
        let mut cmd = env.xtask_in(cwd);
        cmd.args(["cache", "restore", "tool"]);
        run(&mut cmd)
    };
    restore("clone").ok();
    let installed = env.home().join(".cache/other-tool");
    std::fs::remove_file(other.join("build/out/scratch.tmp")).unwrap();
    assert_same_tree(&other.join("build/out"), &installed);

    // A version bump is a new key: not on the branch until published.
    std::fs::write(
        other.join("build-info.json"),
        r#"{"tool": {"version": "1.3.0"}}"#,
    )
    .unwrap();
    std::fs::write(other.join("build/out/plain.txt"), "built by 1.3.0\n").unwrap();
    env.git("other", ["commit", "-q", "-am", "1.3.0"]);
    env.git("other", ["push", "-q", "origin", "main"]);
    env.git("clone", ["pull", "-q", "origin", "main"]);
    let r = restore("clone");
    assert_eq!(
        r.code(),
        4,
        "restoring an unpublished key\n{}",
        show(&r.out)
    );
    publish(&env, "other", &["tool"]).ok();
    restore("clone").ok();
    assert_same_tree(&other.join("build/out"), &installed);
    assert_one_root_commit(&env, "other.git", "tool-cache");
    let m = branch_manifest(&env, "other.git", "tool-cache");
    assert_eq!(m["keys"].as_object().unwrap().len(), 2);
}

/// A publish killed with SIGKILL while packing leaves its chunk directory
/// behind and the remote untouched; the next publish removes the leftovers
/// and succeeds.
#[test]
fn killed_publish_leaves_the_remote_and_is_cleaned_up() {
    let env = TestEnv::new();
    let src = env.join("src");
    make_tricky_tree(&src, false);
    crate::util::tree::write_pseudo_random(&src.join("big/noise.bin"), 12 << 20, 7);
    env.bare_remote("origin.git");
    let work = work_with_manifest(
        &env,
        "work",
        "../origin.git",
        "k",
        &manifest(&src, "1", "\n[publish]\nchunk_bytes = 524288\n"),
    );
    let cache_git = work.join(".git/warmstart/cache.git");
    let mut child = env
        .xtask_in("work")
        .args(["cache", "publish", "k", "--quiet"])
        .spawn()
        .unwrap();
    let scratch = cache_git.join(format!("warmstart-publish-{}", child.id()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    // The chunk directory is made when packing starts; its chunk files
    // live only while git stores each one, too briefly to wait for.
    while !scratch.exists() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "publish ended before it could be killed mid-pack"
        );
        assert!(std::time::Instant::now() < deadline, "no chunk appeared");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(scratch.exists(), "the killed publish left nothing to clean");
    assert_eq!(remote_ref(&env, "origin.git", "k-cache"), None);

    publish(&env, "work", &["k"]).ok();
    assert!(!scratch.exists(), "{} was not removed", scratch.display());
    let left: Vec<_> = std::fs::read_dir(&cache_git)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("warmstart-publish-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_one_root_commit(&env, "origin.git", "k-cache");
    let dest = env.join("dest");
    coreutils_restore(
        &env,
        env.join("origin.git").to_str().unwrap(),
        "k-cache",
        "k-1",
        &dest,
    );
    assert_same_tree(&src, &dest);
}

/// Compares `text` with `tests/it/snapshots/<name>`; `UPDATE_SNAPSHOTS=1`
/// rewrites it (review the diff).
fn snapshot(name: &str, text: &str) {
    let path = crate::util::source_root()
        .join("tests/it/snapshots")
        .join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        want == text,
        "{} is stale: rerun with UPDATE_SNAPSHOTS=1 and review the diff\n--- now:\n{text}",
        path.display()
    );
}

/// What users read: the help of `cache publish` and `demo`, and the shape
/// (field names) of `cache publish --json`.
#[test]
fn publish_help_and_json_shape_snapshots() {
    let env = TestEnv::new();
    for (file, args) in [
        (
            "cache-publish-help.txt",
            &["cache", "publish", "--help"][..],
        ),
        ("demo-help.txt", &["demo", "--help"][..]),
    ] {
        let r = run(env.xtask().args(args).env("COLUMNS", "100")).ok();
        snapshot(file, &r.stdout());
    }
    let src = env.join("src");
    make_tricky_tree(&src, false);
    env.bare_remote("origin.git");
    work_with_manifest(
        &env,
        "work",
        "../origin.git",
        "shape",
        &manifest(&src, "1", ""),
    );
    let s = json(&publish(&env, "work", &["shape", "--json"]).ok());
    let mut shape = String::new();
    for (k, v) in s.as_object().unwrap() {
        let kind = match v {
            serde_json::Value::Null => "null",
            serde_json::Value::Bool(_) => "bool",
            serde_json::Value::Number(_) => "number",
            serde_json::Value::String(_) => "string",
            serde_json::Value::Array(_) => "array",
            serde_json::Value::Object(_) => "object",
        };
        shape.push_str(&format!("{k}: {kind}\n"));
    }
    let chunk = &s["chunks"][0];
    for k in chunk.as_object().unwrap().keys() {
        shape.push_str(&format!("chunks[].{k}\n"));
    }
    for k in s["timings_ms"].as_object().unwrap().keys() {
        shape.push_str(&format!("timings_ms.{k}\n"));
    }
    snapshot("cache-publish-json-shape.txt", &shape);
}

/// The cheap unchanged test (cache::publish::packed): a re-publish of the same tree
/// hashes the tar and compresses nothing; a content change that keeps size
/// and mtime is still seen (contents are hashed, not stat'ed); a record that
/// no longer vouches for the branch (other pack params, gone, corrupt)
/// falls back to the full pack. A file dated in the future keeps the tree
/// "racily clean" (module packed) throughout, so the stat shortcut never
/// applies here and every re-publish hashes.
#[test]
fn unchanged_republish_hashes_instead_of_packing() {
    let (env, src, work) = tricky_setup("tricky", "1", "\n[publish]\nchunk_bytes = 300\n");
    date_in_the_future(&src.join("empty-file"));
    let first = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(first["status"], "published");
    let record = work.join(".git/warmstart/cache/packed/tricky.json");
    let rec: serde_json::Value = serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert_eq!(rec["commit"], first["commit"]);
    assert_eq!(rec["tar_sha256"], first["tar_sha256"]);
    let timings = |s: &serde_json::Value| {
        let t = s["timings_ms"].as_object().unwrap();
        (t.contains_key("digest"), t.contains_key("pack"))
    };

    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "unchanged");
    assert_eq!(s["commit"], first["commit"]);
    let sums = |s: &serde_json::Value| -> Vec<serde_json::Value> {
        s["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["sha256"].clone())
            .collect()
    };
    assert_eq!(sums(&s), sums(&first));
    assert!(
        s["chunks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["reused"] == true)
    );
    assert_eq!(timings(&s), (true, false), "hashed, not packed: {s}");
    assert_eq!(s["unchanged_by"], "digest", "{s}");

    // Same size, same mtime, other bytes: a stat-based check would miss it.
    let f = src.join("plain.txt");
    let before = std::fs::metadata(&f).unwrap();
    let mut bytes = std::fs::read(&f).unwrap();
    bytes[0] ^= 0x20;
    std::fs::write(&f, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(&f)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
    assert_eq!(std::fs::metadata(&f).unwrap().len(), before.len());
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "published");
    assert_eq!(timings(&s), (true, true), "hashed, differed, packed: {s}");
    let tip = s["commit"].clone();

    // Another zstd level: the record no longer describes the chunks, so the
    // full pack runs (and makes other chunks from the same tar).
    write_manifest(
        &work,
        "tricky",
        &manifest(&src, "1", "\n[publish]\nchunk_bytes = 300\nlevel = 9\n"),
    );
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(timings(&s), (false, true), "{s}");
    assert_eq!(s["status"], "published");
    assert_ne!(s["commit"], tip);
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(
        (s["status"].as_str(), timings(&s)),
        (Some("unchanged"), (true, false))
    );

    // No record, or a corrupt one: the full pack decides, and writes a new one.
    for damage in ["remove", "corrupt"] {
        if damage == "remove" {
            std::fs::remove_file(&record).unwrap();
        } else {
            std::fs::write(&record, "{ not json").unwrap();
        }
        let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
        assert_eq!(s["status"], "unchanged", "{damage}");
        assert_eq!(s["unchanged_by"], "pack", "{damage}: {s}");
        assert_eq!(timings(&s), (false, true), "{damage}: {s}");
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(rec["commit"], s["commit"], "{damage}");
    }
}

/// Sets the mtime of `path` an hour ahead: the entry counts as changed
/// "just now" for the racy check, whatever time the test takes.
fn date_in_the_future(path: &Path) {
    let later = std::time::SystemTime::now() + std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(later)
        .unwrap();
}

/// Waits until every entry of a just-made tree is older than the racy
/// window (2 s, cache::publish::packed::RACY_WINDOW_NS) of any later publish.
fn let_the_tree_age() {
    std::thread::sleep(std::time::Duration::from_millis(2100));
}

/// How an `unchanged` publish knew, and whether it read or packed:
/// (`unchanged_by`, timings has `digest`, timings has `pack`).
fn how(s: &serde_json::Value) -> (String, bool, bool) {
    let t = s["timings_ms"].as_object().unwrap();
    (
        s["unchanged_by"].as_str().unwrap_or("null").to_string(),
        t.contains_key("digest"),
        t.contains_key("pack"),
    )
}

fn stat_path() -> (String, bool, bool) {
    ("stat".into(), false, false)
}

fn digest_path() -> (String, bool, bool) {
    ("digest".into(), true, false)
}

/// The stat shortcut (cache::publish::packed `tree`): once a tree is older than the
/// racy window, a re-publish reads no file: every entry's lstat (ctime,
/// inode, size, mode...) equals the record's, so the tar is the recorded
/// one. A record without `tree` (an older build's) hashes, then gains it.
#[test]
fn unchanged_republish_of_an_untouched_tree_reads_nothing() {
    let (env, _src, work) = tricky_setup("tricky", "1", "\n[publish]\nchunk_bytes = 300\n");
    let_the_tree_age();
    let first = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(first["status"], "published");
    let r = publish(&env, "work", &["tricky"]).ok();
    assert!(
        r.stdout().contains("nothing read, nothing compressed"),
        "{}",
        r.stdout()
    );
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "unchanged");
    assert_eq!(how(&s), stat_path(), "{s}");
    assert_eq!(s["commit"], first["commit"]);
    assert_eq!(s["tar_sha256"], first["tar_sha256"]);
    assert_eq!(s["chunks"], {
        let mut c = first["chunks"].clone();
        for chunk in c.as_array_mut().unwrap() {
            chunk["reused"] = true.into();
        }
        c
    });

    // A record from before `tree` existed: hash once, then stat again.
    let record = work.join(".git/warmstart/cache/packed/tricky.json");
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    assert!(rec["tree"]["stamp"].is_string(), "{rec}");
    rec.as_object_mut().unwrap().remove("tree");
    std::fs::write(&record, rec.to_string()).unwrap();
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(how(&s), digest_path(), "{s}");
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(how(&s), stat_path(), "{s}");
}

/// Writes `from`'s bytes, with byte `at` changed, to `to`, and sets `to`'s
/// mtime to `before`'s.
fn write_flipped(from: &Path, to: &Path, at: usize, before: &std::fs::Metadata) {
    let mut bytes = std::fs::read(from).unwrap();
    bytes[at] ^= 0x20;
    std::fs::write(to, &bytes).unwrap();
    std::fs::File::options()
        .write(true)
        .open(to)
        .unwrap()
        .set_modified(before.modified().unwrap())
        .unwrap();
}

/// What the stat shortcut must still see, each time from a tree the
/// shortcut trusted just before: an edit keeping size and mtime (ctime
/// moves), a file replaced by a copy with the same size and mtime (another
/// inode), a mode change, an added file. Each is published.
#[test]
fn the_stat_shortcut_still_sees_edits_that_keep_size_and_mtime() {
    let (env, src, _) = tricky_setup("tricky", "1", "\n[publish]\nchunk_bytes = 300\n");
    let_the_tree_age();
    publish(&env, "work", &["tricky"]).ok();
    let f = src.join("plain.txt");
    let edits: [(&str, &dyn Fn()); 4] = [
        ("edit with the mtime set back", &|| {
            let before = std::fs::metadata(&f).unwrap();
            write_flipped(&f, &f, 0, &before);
            assert_eq!(std::fs::metadata(&f).unwrap().len(), before.len());
        }),
        ("replaced by a same-size copy with the old mtime", &|| {
            let before = std::fs::metadata(&f).unwrap();
            let tmp = src.join("plain.txt.new");
            write_flipped(&f, &tmp, 1, &before);
            std::fs::rename(&tmp, &f).unwrap();
        }),
        ("mode change", &|| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o640)).unwrap();
        }),
        ("new file", &|| {
            std::fs::write(src.join("new.txt"), "new\n").unwrap()
        }),
    ];
    for (what, edit) in edits {
        let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
        assert_eq!(how(&s), stat_path(), "before the {what}: {s}");
        edit();
        // Aged, the edit is outside the racy window: only the stamp's
        // fields can reveal it.
        let_the_tree_age();
        let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
        assert_eq!(s["status"], "published", "{what}: {s}");
    }
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(how(&s), stat_path(), "after the edits: {s}");
}

/// The racy window: a record taken less than 2 s after an entry last
/// changed does not spare the hash (an edit in the same timestamp tick
/// could keep ctime), and neither does an entry dated in the future. The
/// hash then refreshes the record, after which an aged tree is trusted.
#[test]
fn a_record_taken_right_after_a_change_is_not_trusted() {
    use std::os::unix::fs::MetadataExt;
    let (env, src, work) = tricky_setup("tricky", "1", "\n[publish]\nchunk_bytes = 300\n");
    let_the_tree_age();
    publish(&env, "work", &["tricky"]).ok();
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(how(&s), stat_path(), "{s}");

    // As if the last publish had started 1 s after the tree's newest change.
    let mut newest = i64::MIN;
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let md = e.as_ref().unwrap().path().symlink_metadata().unwrap();
            for (s, ns) in [(md.ctime(), md.ctime_nsec()), (md.mtime(), md.mtime_nsec())] {
                newest = newest.max(s * 1_000_000_000 + ns);
            }
            if md.is_dir() {
                stack.push(e.unwrap().path());
            }
        }
    }
    let record = work.join(".git/warmstart/cache/packed/tricky.json");
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
    rec["tree"]["planned_at_ns"] = (newest + 1_000_000_000).into();
    std::fs::write(&record, rec.to_string()).unwrap();
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(s["status"], "unchanged");
    assert_eq!(how(&s), digest_path(), "racy record: {s}");
    let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
    assert_eq!(how(&s), stat_path(), "refreshed record: {s}");

    // An entry dated in the future is always "just changed".
    date_in_the_future(&src.join("empty-file"));
    for round in 0..2 {
        let s = json(&publish(&env, "work", &["tricky", "--json"]).ok());
        assert_eq!(s["status"], "unchanged");
        assert_eq!(how(&s), digest_path(), "future mtime, round {round}: {s}");
    }
}

/// A cache made from a commit the remote does not have describes a tree
/// nobody else can check out: refused with one line naming both commits
/// (exit 9, nothing pushed) unless `--allow-unpushed`, which says so even
/// with `--quiet`. A detached HEAD at a pushed commit (a CI checkout) and
/// a remote this clone tracks nothing of are not refused.
#[test]
fn publish_refuses_a_head_the_remote_does_not_have_naming_both_commits() {
    let (env, _src, _work) = tricky_setup("art", "1", "");
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "manifest"]);
    // Nothing of origin is tracked yet, then only its cache branch (an
    // orphan commit, which says nothing of this history): not judged.
    publish(&env, "work", &["art", "--quiet"]).ok();
    env.git("work", ["fetch", "-q", "origin"]);
    assert!(
        env.git("work", ["branch", "-r"])
            .contains("origin/art-cache")
    );
    publish(&env, "work", &["art", "--quiet"]).ok();
    env.git("work", ["push", "-q", "-u", "origin", "main"]);
    let pushed = env.git("work", ["rev-parse", "HEAD"]).trim().to_string();
    env.git(
        "work",
        ["commit", "-q", "--allow-empty", "-m", "local only"],
    );
    let head = env.git("work", ["rev-parse", "HEAD"]).trim().to_string();
    let before = remote_ref(&env, "origin.git", "art-cache");
    let r = publish(&env, "work", &["art", "--quiet"]).expect_code(9);
    let err = r.stderr();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("HEAD {} is not on origin", &head[..12]))
            && err.contains(&format!("origin/main is at {}", &pushed[..12]))
            && err.contains("--allow-unpushed"),
        "{err}"
    );
    assert_eq!(remote_ref(&env, "origin.git", "art-cache"), before);
    let r = publish(&env, "work", &["art", "--quiet", "--allow-unpushed"]).ok();
    assert!(
        r.stderr().contains("publishing anyway (--allow-unpushed)"),
        "{}",
        r.stderr()
    );
    // Once pushed, or checked out detached at a pushed commit, it publishes.
    env.git("work", ["push", "-q", "origin", "main"]);
    publish(&env, "work", &["art", "--quiet"]).ok();
    env.git("work", ["checkout", "-q", "--detach", &pushed]);
    publish(&env, "work", &["art", "--quiet"]).ok();
}

/// CI checks out a pushed commit as actions/checkout does by default (a
/// `--depth 1` fetch of that commit into `refs/remotes/origin/main`, then
/// `checkout -B main`): the shallow clone publishes, and so does a run whose
/// origin/main was fetched later, shallow, past it (nothing connects them in
/// this clone, so nothing is judged, and it says so in one warning naming
/// `--allow-unpushed`). With `--allow-unpushed --json` the
/// warning goes to stderr and stdout stays one JSON document.
#[test]
fn publish_from_a_depth_one_ci_checkout_of_a_pushed_commit_is_not_refused() {
    let (env, _src, _work) = tricky_setup("art", "1", "");
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "manifest"]);
    for i in 0..3 {
        let m = format!("more {i}");
        env.git("work", ["commit", "-q", "--allow-empty", "-m", &m]);
    }
    env.git("work", ["push", "-q", "-u", "origin", "main"]);
    let pushed = env.git("work", ["rev-parse", "HEAD"]).trim().to_string();
    let url = format!("file://{}", env.join("origin.git").display());
    env.git(".", ["init", "-q", "-b", "main", "ci"]);
    env.git("ci", ["remote", "add", "origin", &url]);
    let spec = format!("+{pushed}:refs/remotes/origin/main");
    env.git(
        "ci",
        [
            "fetch",
            "-q",
            "--no-tags",
            "--prune",
            "--no-recurse-submodules",
            "--depth=1",
            "origin",
            &spec,
        ],
    );
    env.git(
        "ci",
        [
            "checkout",
            "-q",
            "--force",
            "-B",
            "main",
            "refs/remotes/origin/main",
        ],
    );
    assert_eq!(
        env.git("ci", ["rev-parse", "--is-shallow-repository"])
            .trim(),
        "true"
    );
    publish(&env, "ci", &["art", "--quiet"]).ok();

    env.git("ci", ["commit", "-q", "--allow-empty", "-m", "local only"]);
    publish(&env, "ci", &["art", "--json"]).expect_code(9);
    let r = publish(&env, "ci", &["art", "--json", "--allow-unpushed"]).ok();
    assert!(r.stderr().contains("--allow-unpushed"), "{}", r.stderr());
    json(&r);
    env.git("ci", ["reset", "-q", "--hard", &pushed]);

    // main moves on; this run's origin/main is refetched shallow past HEAD.
    env.git("work", ["commit", "-q", "--allow-empty", "-m", "later"]);
    env.git("work", ["push", "-q", "origin", "main"]);
    env.git(
        "ci",
        [
            "fetch",
            "-q",
            "--depth=1",
            "origin",
            "+main:refs/remotes/origin/main",
        ],
    );
    // Nothing connects HEAD with origin/main in this shallow clone: the
    // publish says it could not judge, in one line, instead of nothing.
    let err = publish(&env, "ci", &["art", "--quiet"]).ok().stderr();
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("cannot tell whether HEAD"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    assert!(
        said[0].starts_with("warning: ")
            && said[0].contains("this clone is shallow")
            && said[0].contains("--allow-unpushed"),
        "{err}"
    );
    // With --allow-unpushed the user has said so already.
    env.git("ci", ["commit", "-q", "--allow-empty", "-m", "new key"]);
    let err = publish(&env, "ci", &["art", "--allow-unpushed", "--quiet"])
        .ok()
        .stderr();
    assert!(!err.contains("cannot tell"), "{err}");
}

/// The unpushed refusal is judged from this clone's remote-tracking
/// branches, which go stale when the commit reaches the remote another way
/// (pushed to its URL, or from another clone): the refusal says it judged
/// the remote as last fetched and names `git fetch`, after which it
/// publishes.
#[test]
fn publish_refusing_an_unpushed_head_says_it_judged_a_stale_view_and_how_to_refresh_it() {
    let (env, _src, _work) = tricky_setup("art", "1", "");
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "manifest"]);
    env.git("work", ["push", "-q", "-u", "origin", "main"]);
    env.git(
        "work",
        ["commit", "-q", "--allow-empty", "-m", "pushed by URL"],
    );
    let url = env.join("origin.git");
    env.git("work", ["push", "-q", url.to_str().unwrap(), "HEAD:main"]);
    let err = publish(&env, "work", &["art", "--quiet"])
        .expect_code(9)
        .stderr();
    assert!(
        err.contains("is not on origin as this clone last fetched it")
            && err.contains("`git fetch origin`"),
        "{err}"
    );
    env.git("work", ["fetch", "-q", "origin"]);
    publish(&env, "work", &["art", "--quiet"]).ok();
}
