//! The attacker-reviewer's breaks: each test is named after a hole found by
//! playing someone with push access to a cache remote, or control over a
//! package, an index file or a remote URL, and fails without its fix.

use crate::util::http_backend::HttpGit;
use crate::util::{TestEnv, run, show};

/// Git takes everything before the authority's `@` as the userinfo, quotes,
/// backslashes and spaces included (its own message shows the URL without
/// it), so such a password is really sent; our free-text rule stopped at
/// the quote and printed the rest of it, in plain and `--json` output.
#[test]
fn a_password_with_a_quote_or_backslash_was_printed() {
    let env = TestEnv::new();
    let work = env.work_repo("work");
    let payload = env.join("payload");
    std::fs::create_dir_all(&payload).unwrap();
    std::fs::write(payload.join("a"), "a\n").unwrap();
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(
        work.join("cache-manifests/art.toml"),
        format!(
            "[cache]\nbranch = \"art-cache\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored/art\"\n",
            payload.display()
        ),
    )
    .unwrap();
    for (i, pass) in [
        "pa\"SECRETq",
        "pa\\SECRETb",
        "pa`SECRETt",
        "pa SECRETs",
        "pa<SECRETl",
    ]
    .iter()
    .enumerate()
    {
        // Port 1 on loopback: refused at once, so the failure paths print.
        let url = format!("http://ci:{pass}@127.0.0.1:1/o{i}.git");
        for args in [
            &["cache", "publish", "art", "--dry-run"][..],
            &["cache", "publish", "art", "--dry-run", "--json"],
            &["cache", "restore", "art", "--json"],
            &["cache", "verify", "art"],
        ] {
            let r = run(env.xtask_in("work").args(args).args(["--remote", &url]));
            let all = format!("{}{}", r.stdout(), r.stderr());
            assert!(!all.contains("SECRET"), "{args:?} {url}:\n{}", show(&r.out));
            assert!(all.contains("127.0.0.1"), "{args:?}:\n{}", show(&r.out));
        }
    }
}

/// `gates push` and `gates fetch` with the remote given as a URL printed
/// it as given, password and all, on success (plain and `--json`), and
/// quoted it raw inside their error lines.
#[test]
fn gates_push_and_fetch_printed_the_password_of_a_remote_url() {
    let env = TestEnv::new();
    env.bare_remote("srv/origin.git");
    let secret = "PwGatesS3cretq";
    let server = HttpGit::start_with_auth(&env.join("srv"), Some(&format!("ci:{secret}")));
    let work = env.work_repo("work");
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(
        work.join("cache-manifests/gates.toml"),
        "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n",
    )
    .unwrap();
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "gates"]);
    run(env.xtask_in("work").args(["gates", "run"])).ok();
    let url = server
        .url("origin.git")
        .replace("http://", &format!("http://ci:{secret}@"));
    // A refused connection, with a backtick in the password: the error path.
    let down = format!("http://ci:pa`{secret}@127.0.0.1:1/x.git");
    for (args, ok) in [
        (&["gates", "push"][..], true),
        (&["gates", "push", "--json"], true),
        (&["gates", "fetch"], true),
        (&["gates", "fetch", "--json"], true),
    ] {
        for remote in [&url, &down] {
            let r = run(env.xtask_in("work").args(args).arg(remote));
            if remote == &url && ok {
                assert_eq!(r.code(), 0, "{args:?}:\n{}", show(&r.out));
            } else {
                assert_ne!(r.code(), 0, "{args:?}:\n{}", show(&r.out));
            }
            let all = format!("{}{}", r.stdout(), r.stderr());
            assert!(
                !all.contains(secret),
                "{args:?} {remote}:\n{}",
                show(&r.out)
            );
            assert!(all.contains("127.0.0.1"), "{args:?}:\n{}", show(&r.out));
        }
    }
}

/// A `remote` URL with a password on a cache or freshness step of
/// restore.toml was printed as written by `restore --dry-run` (plain and
/// `--json`) and, for freshness, in the `source` of `restore --json`.
#[test]
fn the_restore_plan_printed_a_step_remote_with_its_password() {
    let env = TestEnv::new();
    let work = env.work_repo("work");
    let m = work.join("cache-manifests");
    std::fs::create_dir_all(&m).unwrap();
    std::fs::write(
        m.join("art.toml"),
        "[cache]\nbranch = \"art-cache\"\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"p\"\n\n[restore]\npath = \"restored/art\"\n",
    )
    .unwrap();
    std::fs::write(
        m.join("restore.toml"),
        "[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\nremote = \"http://ci:PwStepS3cretc@127.0.0.1:1/x.git\"\n\n[[step]]\nname = \"fresh\"\nkind = \"freshness\"\nremote = \"http://ci:PwStepS3cretf@127.0.0.1:1/x.git\"\n",
    )
    .unwrap();
    for args in [
        &["restore", "--dry-run"][..],
        &["restore", "--dry-run", "--json"],
        &["restore", "--json"],
    ] {
        let r = run(env.xtask_in("work").args(args));
        let all = format!("{}{}", r.stdout(), r.stderr());
        assert!(!all.contains("PwStepS3cret"), "{args:?}:\n{}", show(&r.out));
        assert!(
            all.contains("127.0.0.1:1/x.git"),
            "{args:?}:\n{}",
            show(&r.out)
        );
    }
}
