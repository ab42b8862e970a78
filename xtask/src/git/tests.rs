//! Unit tests of the git plumbing: parsers of git's output, and real git in temporary stores.

use super::*;
use crate::exit::{Code, fail};
use crate::repo::Repo;
use anyhow::anyhow;
use std::path::Path;
use std::process::Command;
use xshell::{Shell, cmd};

#[test]
fn git_versions_and_old_git_listings_parse() {
    assert_eq!(git_version("git version 2.39.5\n"), Some((2, 39)));
    assert_eq!(git_version("git version 2.47.3.windows.1"), Some((2, 47)));
    assert_eq!(git_version("git version 2.50.0-rc1"), Some((2, 50)));
    assert_eq!(git_version("hub version 2.14"), None);
    assert_eq!(git_version(""), None);
    // Without `-l`: three fields, no size.
    let e = parse_ls_tree(b"100644 blob 5716ca5987cbf97d6bb54920bea6adde242d87e6\ta b\0").unwrap();
    assert_eq!((e[0].name.as_str(), e[0].size), ("a b", None));
    let sizes = parse_blob_sizes("aa commit 3\nbb blob 12\ncc tree 40\ndd blob x\n");
    assert_eq!(sizes.len(), 1);
    assert_eq!(sizes["bb"], 12);
}

#[test]
fn ls_tree_lines_parse() {
    let out = b"100644 blob 3b18e512dba79e4c8300dd08aeb37f8e728b8dad      12\tREADME.md\x00040000 tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904       -\tsub dir\0";
    let e = parse_ls_tree(out).unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].size, Some(12));
    assert_eq!(e[0].name, "README.md");
    assert_eq!(e[1].kind, "tree");
    assert_eq!(e[1].size, None);
    assert_eq!(e[1].name, "sub dir");
}

#[test]
fn locations_are_told_from_names() {
    assert!(!looks_like_location("origin"));
    assert!(looks_like_location("https://example.com/x.git"));
    assert!(looks_like_location("git@github.com:o/r.git"));
    assert!(looks_like_location("../origin.git"));
    assert!(looks_like_location("/srv/origin.git"));
    let root = Path::new("/work/repo");
    assert_eq!(absolutize(root, "../o.git"), "/work/repo/../o.git");
    assert_eq!(absolutize(root, "git@h:o/r.git"), "git@h:o/r.git");
    assert_eq!(absolutize(root, "file:///srv/o.git"), "file:///srv/o.git");
}

#[test]
fn branch_names_are_checked() {
    assert!(check_branch("xtask-bin-cache").is_ok());
    assert!(check_branch("caches/rust").is_ok());
    for bad in ["", "-x", "a..b", "a b", "a:b", "a^", "a~1"] {
        assert!(check_branch(bad).is_err(), "{bad}");
    }
}

#[test]
fn progress_is_parsed_from_carriage_returns() {
    let text = b"Enumerating objects: 5, done.\rWriting objects:  40% (2/5)\rWriting objects: 100% (5/5), 1.00 MiB | 2 MiB/s, done.\nTotal 5\nerror: boom\n";
    let mut seen = Vec::new();
    let mut parser = ProgressParser::default();
    for piece in text.chunks(7) {
        parser.feed(piece, &mut |p| seen.push(p));
    }
    let rest = final_lines(text);
    let at = |percent, bytes| PushProgress { percent, bytes };
    assert_eq!(seen, [at(40, None), at(100, Some(1 << 20))]);
    assert!(rest.contains("error: boom"));
    assert!(!rest.contains("Writing objects"));
}

/// `push` shows bytes and a rate: git's throughput is read, in every
/// unit git prints, and a line without it falls back to the percentage.
#[test]
fn push_progress_reads_the_bytes_git_sent() {
    for (line, want) in [
        ("Writing objects:  12% (1/8)", (12, None)),
        (
            "Writing objects:  50% (4/8), 512 bytes | 512.00 KiB/s",
            (50, Some(512)),
        ),
        (
            "Writing objects: 100% (1/1), 1 byte | 1 byte/s, done.",
            (100, Some(1)),
        ),
        (
            "Writing objects:  75% (3/4), 1.50 KiB | 1.00 MiB/s",
            (75, Some(1536)),
        ),
        (
            "Writing objects:  80% (4/5), 23.50 MiB | 11.75 MiB/s",
            (80, Some(47 << 19)),
        ),
        (
            "Writing objects: 100% (5/5), 1.25 GiB | 90.00 MiB/s, done.",
            (100, Some(5 << 28)),
        ),
        ("remote: Writing objects:  3% (1/30)", (3, None)),
    ] {
        let got = push_progress(line).unwrap_or_else(|| panic!("{line}"));
        assert_eq!((got.percent, got.bytes), want, "{line}");
    }
    for not in [
        "Counting objects: 40% (2/5)",
        "Writing objects: lots",
        "Writing objects:  40% (2/5), many MiB | 1 MiB/s",
        "",
    ] {
        assert!(
            push_progress(not).is_none_or(|p| p.bytes.is_none()),
            "{not}"
        );
    }
    let p = PushProgress {
        percent: 40,
        bytes: None,
    };
    assert_eq!(p.bytes_of(1000), 400);
    let p = PushProgress {
        percent: 40,
        bytes: Some(7),
    };
    assert_eq!(p.bytes_of(1000), 7);
}

#[test]
fn porcelain_push_verdicts_are_read_for_our_ref_only() {
    let dst = "refs/heads/c-cache";
    let stale =
        "To git://127.0.0.1/o.git\n!\tabc:refs/heads/c-cache\t[rejected] (stale info)\nDone\n";
    assert_eq!(
        push_rejection(stale, dst).as_deref(),
        Some("[rejected] (stale info)")
    );
    let raced = "!\tabc:refs/heads/c-cache\t[remote rejected] (cannot lock ref 'refs/heads/c-cache': is at 1 but expected 2)\n";
    assert!(is_lease_reason(&push_rejection(raced, dst).unwrap()));
    let first = "!\tabc:refs/heads/c-cache\t[rejected] (fetch first)\n";
    assert!(is_lease_reason(&push_rejection(first, dst).unwrap()));
    // A hook's refusal is the remote's verdict, not contention.
    let hook = "!\tabc:refs/heads/c-cache\t[remote rejected] (pre-receive hook declined)\n";
    assert!(!is_lease_reason(&push_rejection(hook, dst).unwrap()));
    // Another ref's line, or an accepted push, is no verdict on ours.
    let other = "!\tabc:refs/heads/c-cache-2\t[rejected] (stale info)\n+\tabc:refs/heads/c-cache\t1...2 (forced update)\n";
    assert_eq!(push_rejection(other, dst), None);
}

use crate::test_rng::Rng;

/// Never: a push that lost its lease (on the client or on the server,
/// whatever else git printed around it, other refs' verdicts included)
/// is classified as anything but a lost lease (exit 3), and a push
/// refused for another reason, or never answered, as one.
#[test]
fn a_lost_lease_is_never_taken_for_an_unreachable_remote() {
    let lease = [
        "[rejected] (stale info)",
        "[rejected] (fetch first)",
        "[remote rejected] (cannot lock ref 'refs/heads/b': is at 1 but expected 2)",
        "[remote rejected] (failed to update ref)",
        "[remote rejected] (cannot lock ref 'refs/heads/b': reference already exists)",
    ];
    let other = [
        "[remote rejected] (pre-receive hook declined)",
        "[remote rejected] (unpacker error)",
        "[remote rejected] (shallow update not allowed)",
        "[rejected] (non-fast-forward)",
    ];
    let noise_out = [
        "To git://127.0.0.1/o.git",
        "Done",
        "*\tabc:refs/heads/new\t[new branch]",
        "=\tabc:refs/heads/b2\t[up to date]",
        "!\tabc:refs/heads/b-other\t[rejected] (stale info)",
        "!\tabc:refs/heads/b-other\t[remote rejected] (pre-receive hook declined)",
    ];
    let network = [
        "fatal: unable to connect to 127.0.0.1:",
        "fatal: the remote end hung up unexpectedly",
        "fatal: Could not read from remote repository.",
        "error: RPC failed; HTTP 502",
        "fatal: unable to access 'https://h/o.git/': Failed to connect",
    ];
    let dst = "refs/heads/b";
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for case in 0..2000 {
        let mut out = Vec::new();
        for _ in 0..rng.next() % 4 {
            out.push(rng.pick(&noise_out).to_string());
        }
        let want_lease = rng.next().is_multiple_of(2);
        let why = if want_lease {
            rng.pick(&lease)
        } else {
            rng.pick(&other)
        };
        let ours = format!("!\tdeadbeef:{dst}\t{why}");
        out.insert((rng.next() % (out.len() as u64 + 1)) as usize, ours);
        let mut err: Vec<String> = (0..rng.next() % 3)
            .map(|_| rng.pick(&network).to_string())
            .collect();
        if rng.next().is_multiple_of(2) {
            // Servers echo their reasons on stderr too.
            err.push(format!("remote: error: {}", rng.pick(&lease)));
        }
        let (out, err) = (out.join("\n"), err.join("\n"));
        assert_eq!(
            lease_lost(&out, &err, dst).is_some(),
            want_lease,
            "case {case}:\n{out}\n--\n{err}"
        );
        // No porcelain verdict (the transport died first): stderr decides.
        let bare = format!("{err}\nerror: failed to push some refs");
        let from_stderr = lease_lost("", &bare, dst).is_some();
        assert_eq!(
            from_stderr,
            err.contains("remote: error:"),
            "case {case}: {bare}"
        );
        let unreachable = rng.pick(&network);
        assert!(lease_lost("", unreachable, dst).is_none(), "{unreachable}");
    }
}

#[test]
fn a_bad_config_line_is_damage_only_in_the_stores_own_config() {
    let dir = Path::new("/c/.git/warmstart/cache.git");
    assert!(super::heal::says_config_damaged(
        dir,
        "fatal: bad config line 1 in file /c/.git/warmstart/cache.git/config"
    ));
    for theirs in [
        "fatal: bad config line 3 in file /home/u/.gitconfig",
        "fatal: bad config line 1 in file /c/.git/config",
        "remote: fatal: bad config line 1 in file /c/.git/warmstart/cache.git/config",
    ] {
        assert!(!super::heal::says_config_damaged(dir, theirs), "{theirs}");
        assert!(!says_damaged(theirs), "{theirs}");
    }
    assert!(says_damaged("fatal: bad shallow line: garbage"));
}

#[test]
fn damage_is_told_from_git_words_but_never_from_the_server() {
    for said in [
        "fatal: missing blob object 'c145610e257d7c774d4caf5614a89aa0b062a86c'\nerror: remote did not send all necessary objects",
        "fatal: bad object refs/warmstart/c-cache",
        "error: packfile .git/objects/pack/pack-1.pack cannot be accessed",
        "error: object file .git/objects/ab/cdef is empty",
        "fatal: loose object abc (stored in x) is corrupt",
        "fatal: unable to rename temporary '*.pack' file to 'x.pack'\nfatal: fetch-pack: invalid index-pack output",
    ] {
        assert!(says_damaged(said), "{said}");
    }
    assert!(says_locked(
        "error: cannot lock ref 'refs/warmstart/b': Unable to create '/x/refs/warmstart/b.lock': File exists."
    ));
    assert!(!says_locked(
        "remote: error: cannot lock ref 'refs/heads/b'"
    ));
    for said in [
        "fatal: unable to access 'https://h/o.git/': Could not resolve host: h",
        "fatal: Could not read from remote repository.",
        "fatal: couldn't find remote ref refs/heads/x",
        "remote: fatal: bad object 1234\nfatal: the remote end hung up unexpectedly",
        "",
    ] {
        assert!(!says_damaged(said), "{said}");
    }
    // Never from the server's lines, whatever they say; always from a
    // local line, wherever it falls among them.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let noise = [
        "fatal: the remote end hung up unexpectedly",
        "error: RPC failed; curl 18",
        "hint: see git help fetch",
        "",
    ];
    for case in 0..1000 {
        let mut lines: Vec<String> = (0..rng.next() % 5)
            .map(|_| {
                let w = rng.pick(&DAMAGE);
                format!("remote: fatal: {w} 0123abcd")
            })
            .collect();
        lines.extend((0..rng.next() % 3).map(|_| rng.pick(&noise).to_string()));
        let text = lines.join("\n");
        assert!(!says_damaged(&text), "case {case}: {text}");
        let local = format!("fatal: {} 0123abcd", rng.pick(&DAMAGE));
        lines.insert((rng.next() % (lines.len() as u64 + 1)) as usize, local);
        let text = lines.join("\n");
        assert!(says_damaged(&text), "case {case}: {text}");
    }
}

/// A failure whose words say damage carries the store, under any
/// context a caller adds, and inside an I/O error too.
#[test]
fn damage_is_found_anywhere_in_the_chain() {
    let dir = Path::new("/nonexistent/cache.git");
    let e = damaged_or(
        dir,
        "fatal: bad object x",
        fail(Code::Remote, "cannot fetch"),
    )
    .context("restoring cache c");
    assert_eq!(damage_of(&e).unwrap().dir, dir);
    assert_eq!(crate::exit::code_of(&e), Code::Remote);
    let io = std::io::Error::other(StoreDamaged::of(dir, "fatal: bad object x").unwrap());
    let e = anyhow!(io).context("reading chunk 0");
    assert_eq!(damage_of(&e).unwrap().dir, dir);
    let plain = damaged_or(
        dir,
        "fatal: Could not read from remote repository.",
        anyhow!("x"),
    );
    assert!(damage_of(&plain).is_none());
}

#[test]
fn filter_support_is_read_from_the_advertisement() {
    let v2 = "12:00 pkt-line.c:86 packet: ls-remote< version 2\n12:00 pkt-line.c:86 packet: ls-remote< fetch=shallow wait-for-done filter\n";
    assert!(advertises_filter(v2));
    assert!(!advertises_filter(&v2.replace(" filter", "")));
    assert!(!advertises_filter(&v2.replace(" filter", " filterx")));
    let v0 =
        "packet: ls-remote< e543 refs/heads/main\\0multi_ack thin-pack filter agent=git/2.47.3\n";
    assert!(advertises_filter(v0));
    assert!(!advertises_filter(&v0.replace(" filter", "")));
    // A ref named like the capability is not the capability.
    assert!(!advertises_filter(
        "packet: ls-remote< e543 refs/heads/filter\n"
    ));
    assert!(!advertises_filter(""));
}

#[test]
fn refusals_by_host_rules_get_the_setting_to_change() {
    let hook = "remote: refusing ref\n ! [remote rejected] x -> x (pre-receive hook declined)";
    let h = refusal_hint("refs/warmstart/cache/rust", hook).unwrap();
    assert!(h.contains("cache.branch (e.g. \"rust-cache\")"), "{h}");
    let gh = "remote: error: GH006: Protected branch update failed for refs/heads/rust-cache.";
    let h = refusal_hint("refs/heads/rust-cache", gh).unwrap();
    assert!(h.contains("refs/warmstart/cache/rust"), "{h}");
    assert!(h.contains("cache migrate rust"), "{h}");
    // Not a rule: no advice about settings.
    let other = " ! [remote rejected] x -> x (missing necessary objects)";
    assert_eq!(refusal_hint("refs/heads/rust-cache", other), None);
    assert_eq!(
        refusal_hint("refs/heads/x", "fatal: unable to access"),
        None
    );
    assert!(refusal_hint("refs/warmstart/cache/x", other).is_some());
    // A batch's temporary ref names its cache, not its batch number.
    let h = refusal_hint("refs/warmstart/tmp/rust/1764590000-0a1b2c3d/001", hook).unwrap();
    assert!(h.contains("cache.branch (e.g. \"rust-cache\")"), "{h}");
    let h = refusal_hint(
        "refs/heads/warmstart-tmp/rust/1764590000-0a1b2c3d/001",
        hook,
    )
    .unwrap();
    assert!(
        h.contains("exempt warmstart-tmp/**") && h.contains("cache rust's"),
        "{h}"
    );
    assert_eq!(
        refusal_hint("refs/heads/warmstart-tmp/rust/1/001", other),
        None
    );
}

#[test]
fn git_errors_keep_their_last_lines() {
    assert_eq!(
        last_lines("hint: x\nfatal: one\nfatal: two\n"),
        "fatal: one; fatal: two"
    );
    assert_eq!(last_lines(""), "no message from git");
}

/// The whole publish path against a real bare remote: blobs, a root
/// tree and commit, a leased push, a shallow fetch back, a missing branch.
#[test]
fn publish_and_fetch_through_a_bare_remote() {
    let tmp = tempfile::tempdir().unwrap();
    let sh = Shell::new().unwrap();
    let root = tmp.path().join("work");
    let origin = tmp.path().join("origin.git");
    cmd!(sh, "git init -q {root}").run().unwrap();
    cmd!(sh, "git init -q --bare {origin}").run().unwrap();
    cmd!(sh, "git -C {root} remote add origin ../origin.git")
        .run()
        .unwrap();
    let repo = Repo::discover(&root).unwrap();
    let git = CacheGit::open(&sh, &repo).unwrap();
    assert!(repo.state_dir().join("cache.git/HEAD").is_file());
    let remote = git.resolve_remote(&sh, "origin").unwrap();
    assert_eq!(remote.url, root.join("../origin.git").to_string_lossy());
    assert_eq!(git.try_fetch_branch(&remote, "c-cache").unwrap(), None);
    let err = git.fetch_branch(&remote, "c-cache").unwrap_err();
    assert_eq!(crate::exit::code_of(&err), Code::NotFound);

    let chunk = tmp.path().join("chunk");
    std::fs::write(&chunk, vec![7u8; 3 << 20]).unwrap();
    let mut w = git.blob_writer().unwrap();
    let big = w.write_file(&chunk).unwrap();
    w.finish().unwrap();
    let small = git.write_blob_bytes(b"hello\n").unwrap();
    let entry = |oid: &str, name: &str| TreeEntry {
        mode: "100644".into(),
        kind: "blob".into(),
        oid: oid.into(),
        size: None,
        name: name.into(),
    };
    let tree = git
        .mktree(&[entry(&small, "README.md"), entry(&big, "k.part000")])
        .unwrap();
    let commit = git.commit_tree(&tree, "cache").unwrap();
    let mut seen = Vec::new();
    git.push_branch(&remote, "c-cache", &commit, None, &mut |p| seen.push(p))
        .unwrap();
    // A lease on "absent" now fails: the branch exists.
    let other = git.commit_tree(&tree, "another").unwrap();
    let err = git
        .push_branch(&remote, "c-cache", &other, None, &mut |_| {})
        .unwrap_err();
    assert_eq!(crate::exit::code_of(&err), Code::Busy, "{err:#}");
    assert!(is_stale_lease(&err), "{err:#}");

    assert_eq!(git.fetch_branch(&remote, "c-cache").unwrap(), commit);
    let listed = git.ls_tree(&commit).unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[1].size, Some(3 << 20));
    assert_eq!(git.read_blob_bytes(&small).unwrap(), b"hello\n");
    let mut n = 0u64;
    let mut r = git.read_blob(&big).unwrap();
    n += std::io::copy(&mut r, &mut std::io::sink()).unwrap();
    assert_eq!(n, 3 << 20);
    // Reading a missing object is an error, not an empty blob.
    let mut r = git.read_blob(&"0".repeat(40)).unwrap();
    assert!(std::io::copy(&mut r, &mut std::io::sink()).is_err());
}

/// ssh gets BatchMode, a connect timeout and keep-alives only when the
/// user has no ssh command of their own; HTTP gets curl's low-speed
/// limit. (The machine's own ssh settings decide the first case.)
#[test]
fn ssh_and_http_belts_respect_the_users_own_ssh_command() {
    let tmp = tempfile::tempdir().unwrap();
    let sh = Shell::new().unwrap();
    let root = tmp.path().join("work");
    cmd!(sh, "git init -q {root}").run().unwrap();
    let repo = Repo::discover(&root).unwrap();
    let ssh_of = |git: &CacheGit, url: &str| {
        let mut c = Command::new("git");
        git.belts(&mut c, url);
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let env = c
            .get_envs()
            .find(|(k, _)| *k == "GIT_SSH_COMMAND")
            .and_then(|(_, v)| v)
            .map(|v| v.to_string_lossy().into_owned());
        (env, args)
    };
    let machine_has_one = ["GIT_SSH_COMMAND", "GIT_SSH", "GIT_SSH_VARIANT"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|x| !x.is_empty()))
        || cmd!(
            sh,
            "git config --get-regexp ^(core\\.sshcommand|ssh\\.variant)$"
        )
        .quiet()
        .ignore_status()
        .output()
        .unwrap()
        .status
        .success();
    let git = CacheGit::open(&sh, &repo).unwrap();
    for url in ["ssh://git@127.0.0.1/x.git", "git@127.0.0.1:x.git"] {
        let (env, args) = ssh_of(&git, url);
        assert!(args.is_empty(), "{args:?}");
        if machine_has_one {
            assert_eq!(env, None, "the machine's ssh command is left alone");
        } else {
            let env = env.expect("a GIT_SSH_COMMAND");
            assert!(
                env.contains("BatchMode=yes") && env.contains("ConnectTimeout=13"),
                "{env}"
            );
        }
    }
    let (env, args) = ssh_of(&git, "https://127.0.0.1/x.git");
    assert_eq!(env, None);
    assert!(
        args.contains(&"http.lowSpeedTime=33".to_string()),
        "{args:?}"
    );
    assert_eq!(ssh_of(&git, "/srv/x.git"), (None, vec![]));
    // The repository's own core.sshCommand (forwarded) wins.
    cmd!(
        sh,
        "git -C {root} config core.sshCommand 'ssh -i /nonexistent'"
    )
    .run()
    .unwrap();
    let git = CacheGit::open(&sh, &repo).unwrap();
    assert_eq!(ssh_of(&git, "ssh://git@127.0.0.1/x.git").0, None);
}

/// The shallow file gains and loses exactly the commits named, keeps
/// the others (a branch fetch's), and goes when it would be empty; a
/// `shallow.lock` found under the store's lock is a dead git's, and goes.
#[test]
fn shallow_marks_come_and_go_without_touching_the_others() {
    let tmp = tempfile::tempdir().unwrap();
    let sh = Shell::new().unwrap();
    let root = tmp.path().join("work");
    cmd!(sh, "git init -q {root}").run().unwrap();
    let git = CacheGit::open(&sh, &Repo::discover(&root).unwrap()).unwrap();
    let shallow = git.dir.join("shallow");
    let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
    git.set_shallow(std::slice::from_ref(&a), true).unwrap();
    git.set_shallow(&[b.clone(), c.clone(), a.clone()], true)
        .unwrap();
    let text = std::fs::read_to_string(&shallow).unwrap();
    assert_eq!(text, format!("{a}\n{b}\n{c}\n"));
    git.set_shallow(&[b.clone(), c.clone()], false).unwrap();
    assert_eq!(std::fs::read_to_string(&shallow).unwrap(), format!("{a}\n"));
    std::fs::write(git.dir.join("shallow.lock"), "").unwrap();
    git.set_shallow(std::slice::from_ref(&b), true).unwrap();
    assert!(!git.dir.join("shallow.lock").exists());
    assert_eq!(
        std::fs::read_to_string(&shallow).unwrap(),
        format!("{a}\n{b}\n")
    );
    git.set_shallow(std::slice::from_ref(&b), false).unwrap();
    git.set_shallow(std::slice::from_ref(&a), false).unwrap();
    assert!(!shallow.exists());
    // Nothing to change: no file appears.
    git.set_shallow(&[], true).unwrap();
    assert!(!shallow.exists());
}

#[test]
fn unknown_remote_names_are_config_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let sh = Shell::new().unwrap();
    let root = tmp.path();
    cmd!(sh, "git init -q {root}").run().unwrap();
    let err = resolve_remote(&sh, root, "upstream").unwrap_err();
    assert_eq!(crate::exit::code_of(&err), Code::Config);
    assert!(err.to_string().contains("git remote add upstream"), "{err}");
}
