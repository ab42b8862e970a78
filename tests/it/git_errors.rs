//! A git failure keeps the lines that say why and drops git's frame: a
//! push refused by a real pre-receive hook on a bare remote ends in one
//! line with every line of the hook's message, and without `To <url>`,
//! the pack's `Total` line or `failed to push some refs`.

use crate::util::tree::write_pseudo_random;
use crate::util::{TestEnv, run};

#[test]
fn git_errors_a_push_refused_by_a_hook_keeps_the_hooks_lines() {
    let env = TestEnv::new();
    let remote = env.bare_remote("origin.git");
    let hook = remote.join("hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\n\
         echo \"cache branches need the release team's approval\" >&2\n\
         echo 'ask in #releases, or see https://wiki.example.invalid/caches' >&2\n\
         echo \"policy 42 refused $(cut -d' ' -f3)\" >&2\n\
         exit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = env.work_repo("work");
    env.git(
        "work",
        ["remote", "add", "origin", remote.to_str().unwrap()],
    );
    let src = env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("noise.bin"), 100_000, 5);
    std::fs::create_dir_all(work.join("cache-manifests")).unwrap();
    std::fs::write(
        work.join("cache-manifests/art.toml"),
        format!(
            "[cache]\n\n[[key]]\nname = \"v\"\nliteral = \"1\"\n\n[pack]\nroot = \"{}\"\n\n[restore]\npath = \"restored/art\"\n",
            src.display()
        ),
    )
    .unwrap();
    let r = run(env.xtask_in("work").args(["cache", "publish", "art"])).expect_code(8);
    let err = r.stderr();
    let err = err.trim_end();
    assert!(!err.contains('\n'), "one line: {err:?}");
    for kept in [
        "pre-receive hook declined",
        "cache branches need the release team's approval",
        "ask in #releases, or see https://wiki.example.invalid/caches",
        "policy 42 refused refs/heads/art-cache",
    ] {
        assert!(err.contains(kept), "{err:?} lacks {kept:?}");
    }
    for dropped in [
        "To /",
        "Total ",
        "failed to push some refs",
        "Done",
        "objects:",
    ] {
        assert!(!err.contains(dropped), "{err:?} keeps {dropped:?}");
    }
}
