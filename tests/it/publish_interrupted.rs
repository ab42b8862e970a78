//! `cache publish` stopped by SIGINT (Ctrl-C) or SIGTERM while it packs
//! and while it pushes to a remote on this machine: it leaves no scratch
//! chunk (`warmstart-publish-<pid>/`), no partial pack of git's in its
//! private store and no `tmp_objdir-incoming-*` in the remote, says only
//! what it did, and the next publish succeeds.

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use crate::util::{child_stderr, signal_and_wait};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// Names under `dir` (recursively) that start with one of `prefixes`.
fn named(dir: &Path, prefixes: &[&str]) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if prefixes.iter().any(|p| name.starts_with(p)) {
                found.push(e.path());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    found
}

fn store(fx: &Fixture) -> PathBuf {
    fx.work.join(".git/warmstart/cache.git")
}

/// Everything of ours or git's that an interrupted publish could leave.
fn leftovers(fx: &Fixture) -> Vec<PathBuf> {
    let mut left = named(
        &store(fx),
        &["warmstart-publish-", "tmp_pack_", "tmp_idx_", "tmp_objdir"],
    );
    left.extend(named(
        &fx.origin.join("objects"),
        &["tmp_objdir", "tmp_pack_", "incoming-"],
    ));
    left
}

/// Starts `cache publish art`, waits until `ready` holds (or fails if the
/// publish ends first) and `settle` more, sends `sig` to warmstart alone,
/// and returns its
/// exit code and stderr.
fn interrupt_when(
    fx: &Fixture,
    sig: libc::c_int,
    what: &str,
    ready: &dyn Fn() -> bool,
    settle: Duration,
) -> (Option<i32>, String) {
    let mut child = fx
        .command(&["cache", "publish", "art"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let until = Instant::now() + Duration::from_secs(60);
    while !ready() {
        if let Some(status) = child.try_wait().unwrap() {
            let err = child_stderr(&mut child);
            panic!("the publish ended ({status}) before it was {what}: {err}");
        }
        assert!(Instant::now() < until, "the publish was never {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    // The watchdog notes a push's quarantine at its next look (every
    // 100 ms): `settle` gives it three.
    std::thread::sleep(settle);
    let (status, err) = signal_and_wait(&mut child, sig);
    (status.code(), err)
}

#[test]
fn publish_interrupted_while_packing_or_pushing_leaves_no_temporary_file() {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 48 MB of noise in 1 MB chunks: long enough to be caught packing, and
    // a pack big enough to be caught on its way into the remote.
    write_pseudo_random(&src.join("noise.bin"), 48_000_000, 3);
    fx.write_manifest("art", &Manifest::literal("1", &src).chunk_bytes(1_000_000));
    let packing = || !named(&store(&fx), &["chunk-"]).is_empty();
    let pushing = || !named(&fx.origin.join("objects"), &["tmp_objdir", "incoming-"]).is_empty();
    let (now, settle) = (Duration::ZERO, Duration::from_millis(300));
    for (sig, what, ready, wait) in [
        (libc::SIGINT, "packing", &packing as &dyn Fn() -> bool, now),
        (libc::SIGTERM, "packing", &packing, now),
        (libc::SIGINT, "pushing", &pushing, settle),
        (libc::SIGTERM, "pushing", &pushing, settle),
    ] {
        let (code, err) = interrupt_when(&fx, sig, what, ready, wait);
        assert_eq!(code, Some(128 + sig), "{what}: {err}");
        // Whatever it says is true: nothing of ours or git's is left.
        let left = leftovers(&fx);
        assert!(
            left.is_empty(),
            "{what}, signal {sig}: left {left:?}\n{err}"
        );
        assert!(
            err.contains("interrupted") || err.contains("terminated"),
            "{what}: it says it was stopped: {err}"
        );
        assert!(
            !fx.origin_git(&["branch", "--list", "art-cache"])
                .contains("art-cache"),
            "{what}: nothing was published"
        );
    }
    // The next publish succeeds, and leaves nothing either.
    fx.publish("art");
    assert!(leftovers(&fx).is_empty(), "{:?}", leftovers(&fx));
}

/// Regression: Ctrl-C on a terminal while the pack bar was drawn left the
/// interrupted message glued to the half bar (`   pack [===>  ] 3 MiB/...
/// warmstart: interrupted`). The line is cleared first; a real pty, a
/// real Ctrl-C typed at it.
#[test]
fn publish_ctrl_c_on_a_terminal_clears_the_progress_line_before_its_message() {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), 48_000_000, 4);
    fx.write_manifest("art", &Manifest::literal("1", &src).chunk_bytes(1_000_000));
    let mut cmd = fx.command(&["cache", "publish", "art"]);
    cmd.env("TERM", "xterm");
    let mut pty = crate::util::pty::Pty::spawn(cmd);
    let drawn_bar = pty.wait_for(Duration::from_secs(60), |d| d.contains("   pack ["));
    assert!(drawn_bar, "no pack bar: {:?}", pty.drawn());
    pty.type_bytes(b"\x03");
    let (status, drawn) = pty.finish();
    assert_eq!(status.code(), Some(128 + libc::SIGINT), "{drawn:?}");
    let at = drawn
        .find("warmstart: interrupted (SIGINT)")
        .unwrap_or_else(|| panic!("no interrupted message: {drawn:?}"));
    // What the message shares its line with: from the last line break
    // before it, everything up to the last "return to column 0, clear the
    // line".
    let line = &drawn[..at];
    let line = &line[line.rfind('\n').map_or(0, |i| i + 1)..];
    let left = line
        .rsplit_once("\r\x1b[2K")
        .map_or(line, |(_, after)| after);
    assert!(
        left.is_empty(),
        "the message shares its line with {left:?}: {drawn:?}"
    );
    assert!(leftovers(&fx).is_empty(), "{:?}", leftovers(&fx));
}
