//! Tests of git's error text: real samples (captured from git 2.47.3 and
//! OpenSSH 9.2 against servers on 127.0.0.1) and generated mixtures of them.

use super::*;
use crate::exit::Code;

/// (what git printed, the line that must be kept, whether it is exit 13)
const SAMPLES: [(&str, &str, bool); 11] = [
    // http, 401 without credentials (GIT_TERMINAL_PROMPT=0).
    (
        "fatal: could not read Username for 'http://127.0.0.1:18401': terminal prompts disabled\n",
        "could not read Username for 'http://127.0.0.1:18401': terminal prompts disabled",
        true,
    ),
    // http, 401 with a wrong password.
    (
        "fatal: Authentication failed for 'http://127.0.0.1:18401/x.git/'\n",
        "Authentication failed for 'http://127.0.0.1:18401/x.git/'",
        true,
    ),
    (
        "fatal: unable to access 'http://127.0.0.1:18403/x.git/': The requested URL returned error: 403\n",
        "The requested URL returned error: 403",
        true,
    ),
    // A proxy's 407, for http and for https (CONNECT), and with wrong
    // proxy credentials.
    (
        "fatal: unable to access 'http://127.0.0.1:1/x.git/': The requested URL returned error: 407\n",
        "The requested URL returned error: 407",
        true,
    ),
    (
        "fatal: unable to access 'https://127.0.0.1:1/x.git/': CONNECT tunnel failed, response 407\n",
        "CONNECT tunnel failed, response 407",
        true,
    ),
    (
        "fatal: unable to access 'https://127.0.0.1:1/x.git/': Proxy CONNECT aborted\n",
        "Proxy CONNECT aborted",
        true,
    ),
    // An unknown CA (Debian's git is built on libcurl-gnutls).
    (
        "fatal: unable to access 'https://127.0.0.1:18443/x.git/': server certificate verification failed. CAfile: /etc/ssl/certs/ca-certificates.crt CRLfile: none\n",
        "server certificate verification failed",
        true,
    ),
    // OpenSSH: a key the server does not accept.
    (
        "Warning: Permanently added '[127.0.0.1]:18422' (ED25519) to the list of known hosts.\nroot@127.0.0.1: Permission denied (publickey).\nfatal: Could not read from remote repository.\n\nPlease make sure you have the correct access rights\nand the repository exists.\n",
        "root@127.0.0.1: Permission denied (publickey).",
        true,
    ),
    // OpenSSH: a host key that changed.
    (
        "@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\nHost key for [127.0.0.1]:18422 has changed and you have requested strict checking.\nHost key verification failed.\nfatal: Could not read from remote repository.\n\nPlease make sure you have the correct access rights\nand the repository exists.\n",
        "Host key verification failed.",
        true,
    ),
    // Not authentication: a closed port, and a server that went away.
    (
        "ssh: connect to host 127.0.0.1 port 1: Connection refused\nfatal: Could not read from remote repository.\n\nPlease make sure you have the correct access rights\nand the repository exists.\n",
        "ssh: connect to host 127.0.0.1 port 1: Connection refused",
        false,
    ),
    (
        "Receiving objects:  40% (2/5)\rReceiving objects:  40% (2/5), 1.00 MiB | 1.00 MiB/s\rerror: RPC failed; curl 18 transfer closed with outstanding read data remaining\nfatal: early EOF\nfatal: the remote end hung up unexpectedly\n",
        "error: RPC failed; curl 18 transfer closed with outstanding read data remaining; fatal: early EOF",
        false,
    ),
];

#[test]
fn git_errors_keep_the_cause_and_drop_the_boilerplate() {
    for (stderr, kept, auth) in SAMPLES {
        let line = cause(stderr);
        assert!(line.contains(kept), "{line:?} lacks {kept:?}");
        for gone in [
            "Please make sure",
            "repository exists",
            "Could not read from",
            "objects:",
        ] {
            assert!(!line.contains(gone), "{line:?} keeps {gone:?}");
        }
        let err = remote_failure("cannot fetch x-cache from origin", stderr);
        let code = crate::exit::code_of(&err);
        let msg = format!("{err:#}");
        assert_eq!(code == Code::AuthRefused, auth, "{msg}");
        if !auth {
            assert_eq!(code, Code::Remote, "{msg}");
        }
        assert!(msg.contains(kept), "{msg}");
        assert!(!msg.contains('\n'), "one line: {msg:?}");
        assert!(
            msg.starts_with("cannot fetch x-cache from origin: "),
            "{msg}"
        );
    }
    assert_eq!(
        cause("fatal: the remote end hung up unexpectedly\n"),
        "fatal: the remote end hung up unexpectedly"
    );
    assert_eq!(cause(""), "no message from git");
}

#[test]
fn local_permission_errors_are_not_authentication() {
    let s = "error: unable to create temporary file: Permission denied\nfatal: failed to write object\n";
    assert!(auth_refused(s).is_none());
}

#[test]
fn branch_protection_refusals_are_recognised() {
    for said in [
        "remote: error: GH006: Protected branch update failed for refs/heads/x-cache.\n",
        "remote: error: GH013: Repository rule violations found for refs/heads/x-cache.\nremote: - Cannot force-push to this branch\n",
        "remote: GitLab: You are not allowed to force push code to a protected branch on this project.\n! abc:refs/heads/x [remote rejected] (pre-receive hook declined)\n",
        "! abc:refs/heads/x [remote rejected] (protected branch hook declined)\n",
        "remote: error: denying non-fast-forward refs/heads/x-cache (you should fetch first)\n",
    ] {
        assert!(protected_refusal(said).is_some(), "{said}");
    }
    assert!(protected_refusal("! a:b [rejected] (stale info)\n").is_none());
}

/// Many hostile mixtures of git's output (progress with carriage returns,
/// hints, boilerplate, blank lines, server lines, an auth line anywhere or
/// nowhere): the cause is always one line without boilerplate, and exit 13
/// exactly when an authentication line was in it.
#[test]
fn any_mixture_of_git_output_gives_one_clean_line_and_the_right_code() {
    let noise = [
        "Receiving objects:  12% (1/8)\r",
        "remote: Counting objects: 100% (3/3), done.\r\n",
        "hint: see 'git help config'\n",
        "\n",
        "   \n",
        "Please make sure you have the correct access rights\n",
        "and the repository exists.\n",
        "fatal: Could not read from remote repository.\n",
        "fatal: the remote end hung up unexpectedly\n",
        "remote: warning: something happened\n",
        "error: RPC failed; HTTP 502 curl 22 The requested URL returned error: 502\n",
        "Warning: Permanently added '[127.0.0.1]:22' (ED25519) to the list of known hosts.\n",
    ];
    let auth: Vec<&str> = SAMPLES.iter().filter(|s| s.2).map(|s| s.0).collect();
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    for _ in 0..2000 {
        let mut text = String::new();
        let with_auth = next(2) == 0;
        let pieces = next(8);
        let at = next(pieces + 1);
        for i in 0..=pieces {
            if with_auth && i == at {
                text.push_str(auth[next(auth.len())]);
            }
            if i < pieces {
                text.push_str(noise[next(noise.len())]);
            }
        }
        let err = remote_failure("cannot fetch b from r", &text);
        let msg = format!("{err:#}");
        assert!(
            !msg.contains('\n') && !msg.contains('\r'),
            "{msg:?} from {text:?}"
        );
        for gone in [
            "Please make sure",
            "repository exists.",
            "objects:",
            "hint:",
        ] {
            assert!(!msg.contains(gone), "{msg:?} from {text:?}");
        }
        let code = crate::exit::code_of(&err);
        assert_eq!(
            code == Code::AuthRefused,
            with_auth,
            "{msg:?} from {text:?}"
        );
        if !with_auth {
            assert_eq!(code, Code::Remote);
        }
    }
}

/// Regression: a push refused by a server hook kept only git's
/// last line or two, losing the hook's message. All of the hook's lines
/// are kept, git's frame around the push is dropped.
#[test]
fn a_refused_push_keeps_every_line_of_the_hook_and_drops_the_frame() {
    let said = "To /srv/o.git\n!\tHEAD:refs/heads/art-cache\t[remote rejected] (pre-receive hook declined)\nDone\n\
Enumerating objects: 2, done.\nCounting objects:  50% (1/2)\rCounting objects: 100% (2/2), done.\n\
Writing objects: 100% (2/2), 136 bytes | 12.00 KiB/s, done.\nTotal 2 (delta 0), reused 0 (delta 0), pack-reused 0 (from 0)\n\
remote: cache branches need the release team's approval        \nremote:\n\
remote: ask in #releases, or see https://wiki.example.invalid/caches        \n\
remote: policy 42 refused refs/heads/art-cache        \n\
hint: Updates were rejected because the remote contains work that you do not\n\
error: failed to push some refs to '/srv/o.git'\n";
    let line = cause(said);
    assert_eq!(
        line,
        "! HEAD:refs/heads/art-cache [remote rejected] (pre-receive hook declined); \
remote: cache branches need the release team's approval; \
remote: ask in #releases, or see https://wiki.example.invalid/caches; \
remote: policy 42 refused refs/heads/art-cache"
    );
    // A fetch's frame too; and the cause stays the last lines when git says more.
    let fetch = "From /srv/o.git\n ! [rejected] a -> b (non-fast-forward)\n";
    assert_eq!(cause(fetch), "! [rejected] a -> b (non-fast-forward)");
    let many: String = (1..=9).map(|i| format!("remote: line {i}\n")).collect();
    assert_eq!(
        cause(&many),
        "remote: line 4; remote: line 5; remote: line 6; remote: line 7; remote: line 8; remote: line 9"
    );
}

#[test]
fn a_full_disk_is_told_from_our_side_only() {
    assert_eq!(
        disk_full_line(
            "fatal: write error: No space left on device\nfatal: fetch-pack: invalid index-pack output"
        )
        .as_deref(),
        Some("fatal: write error: No space left on device")
    );
    assert!(
        disk_full_line("fatal: sha1 file 'x/tmp_pack_1' write error. Out of diskspace").is_some()
    );
    // The server's full disk is the server's.
    assert_eq!(
        disk_full_line("remote: fatal: write error: No space left on device\nfatal: early EOF"),
        None
    );
    let e = disk_full_error(
        "cannot fetch b from origin",
        std::path::Path::new("/c/.git/warmstart/cache.git"),
        "fatal: write error: No space left on device",
    );
    assert_eq!(crate::exit::code_of(&e), crate::exit::Code::Failed);
    let said = format!("{e:#}");
    assert!(
        said.contains("No space left on device under /c/.git/warmstart/cache.git"),
        "{said}"
    );
}
