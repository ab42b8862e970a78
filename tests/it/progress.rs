//! Progress for people, and nothing for logs: on a terminal (a real pty,
//! through util-linux `script`) the fetch spinner shows its message and a
//! restore draws two bars whose totals are the branch's compressed chunk
//! bytes and its tar size; with stderr in a file, no command draws a `\r`
//! or an escape sequence. A real published cache on a bare remote.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::show;
use crate::util::tree::write_pseudo_random;
use serde_json::Value;

use std::process::{Command, Stdio};

/// A work clone of `origin.git` with an `art` cache of 3 MB of noise
/// (several chunks), published.
fn published() -> Fixture {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    write_pseudo_random(&src.join("noise.bin"), 2_000_000, 7);
    write_pseudo_random(&src.join("sub/more.bin"), 1_000_000, 8);
    std::fs::write(src.join("hello.txt"), "hello\n").unwrap();
    let m = Manifest::literal("1", &src).cache("").chunk_bytes(700000);
    fx.write_manifest("art", &m);
    fx.xtask(&["cache", "publish", "art"]).ok();
    fx
}

/// The branch's own record of the key: (compressed bytes, tar bytes).
fn sizes(fx: &Fixture) -> (u64, u64) {
    let text = fx.origin_git(&["show", "art-cache:warmstart.json"]);
    let m: Value = serde_json::from_str(&text).unwrap();
    let keys = m["keys"].as_object().unwrap();
    assert_eq!(keys.len(), 1, "{m}");
    let k = keys.values().next().unwrap();
    let chunks = k["chunks"].as_array().unwrap();
    assert!(chunks.len() >= 3, "several chunks: {m}");
    let compressed = chunks.iter().map(|c| c["size"].as_u64().unwrap()).sum();
    (compressed, k["tar_size"].as_u64().unwrap())
}

/// Runs the binary with `args` on a pseudo-terminal and returns all it
/// drew there (stdout and stderr, as a terminal would show them).
fn on_a_terminal(fx: &Fixture, args: &[&str]) -> String {
    assert!(
        which("script"),
        "util-linux `script` is needed (apt-get install bsdutils)"
    );
    let bin = crate::util::bin();
    let line = std::iter::once(bin.to_str().unwrap())
        .chain(args.iter().copied())
        .collect::<Vec<_>>()
        .join(" ");
    assert!(!line.contains(['\'', '"', '$', '\\']), "{line}");
    let log = fx.env.join("typescript");
    let mut cmd = Command::new("script");
    fx.env.isolate(&mut cmd);
    cmd.current_dir(&fx.work)
        .env("TERM", "xterm")
        .args(["--quiet", "--return", "--command", &line])
        .arg(&log)
        .stdout(Stdio::null());
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", show(&out));
    String::from_utf8_lossy(&std::fs::read(&log).unwrap()).into_owned()
}

fn which(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Regression: the fetch spinner drew an empty full-width bar
/// without its message, and the restore bar, labelled `verifying`, had
/// twice the download as its total (so twice its rate).
#[test]
fn progress_on_a_terminal_shows_the_spinner_message_and_true_totals() {
    let fx = published();
    let (compressed, tar) = sizes(&fx);
    let drawn = on_a_terminal(&fx, &["cache", "restore", "art"]);
    assert!(
        drawn.contains("fetching art-cache from origin"),
        "{drawn:?}"
    );
    let fetch_total = format!("/{} ", warmstart::size::human(compressed));
    let unpack_total = format!("/{} ", warmstart::size::human(tar));
    let line_with = |label: &str| line_with_in(&drawn, label);
    let fetch = line_with("  fetch [");
    assert!(
        fetch.contains(&fetch_total),
        "{fetch:?} lacks {fetch_total}"
    );
    assert!(fetch.contains(", eta "), "{fetch:?}");
    let unpack = line_with(" unpack [");
    assert!(
        unpack.contains(&unpack_total),
        "{unpack:?} lacks {unpack_total}"
    );
    assert!(!drawn.contains("verifying"), "{drawn:?}");
    let doubled = format!("/{} ", warmstart::size::human(2 * compressed));
    assert!(!drawn.contains(&doubled), "{drawn:?}");
    // And it did restore.
    assert!(fx.work.join("restored/art/sub/more.bin").is_file());

    // A publish of new bytes: pack with an ETA, push with bytes and a rate
    // (it showed only a percentage).
    write_pseudo_random(&fx.env.join("src/noise.bin"), 2_000_000, 9);
    let drawn = on_a_terminal(&fx, &["cache", "publish", "art"]);
    let pack = line_with_in(&drawn, "   pack [");
    assert!(pack.contains(", eta "), "{pack:?}");
    let push = line_with_in(&drawn, "   push [");
    assert!(push.contains("B/s, eta "), "{push:?}");
    assert!(!push.contains('%'), "{push:?}");
}

fn line_with_in(drawn: &str, label: &str) -> String {
    drawn
        .split(['\r', '\n'])
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no {label} bar in {drawn:?}"))
        .to_string()
}

/// With stderr in a file, nothing is drawn: no carriage return, no escape
/// sequence, from any command that has bars or spinners.
#[test]
fn progress_draws_nothing_when_stderr_is_a_file() {
    let fx = published();
    std::fs::write(
        fx.work.join("cache-manifests/restore.toml"),
        "[[step]]\nname = \"art\"\nkind = \"cache\"\ncache = \"art\"\n",
    )
    .unwrap();
    let runs: [&[&str]; 5] = [
        &["cache", "publish", "art", "--dry-run"],
        &["cache", "restore", "art"],
        &["cache", "verify", "art"],
        &["restore"],
        &["cache", "status"],
    ];
    for (i, args) in runs.iter().enumerate() {
        let path = fx.env.join(format!("stderr-{i}"));
        let file = std::fs::File::create(&path).unwrap();
        let mut cmd = fx.env.xtask_in("work");
        cmd.env("TERM", "xterm").args(*args).stderr(file);
        let out = cmd.output().unwrap();
        let err = std::fs::read_to_string(&path).unwrap();
        assert!(out.status.success(), "{args:?}: {err}");
        for bytes in [&out.stdout[..], err.as_bytes()] {
            let text = String::from_utf8_lossy(bytes);
            assert!(
                !text.contains(['\r', '\x1b']),
                "{args:?} drew on a file: {text:?}"
            );
        }
    }
    // Publishing anew (nothing to push) and a real push of a new key.
    std::fs::write(fx.env.join("src/new.txt"), "new\n").unwrap();
    let path = fx.env.join("stderr-publish");
    let mut cmd = fx.env.xtask_in("work");
    cmd.env("TERM", "xterm")
        .args(["cache", "publish", "art"])
        .stderr(std::fs::File::create(&path).unwrap());
    let out = cmd.output().unwrap();
    let err = std::fs::read_to_string(&path).unwrap();
    assert!(out.status.success(), "{err}");
    assert!(!err.contains(['\r', '\x1b']), "{err:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("published"));
}
