//! Gate records on hosts that refuse refs outside `refs/heads/`: the refused
//! push is one line naming `records = "branches"` in gates.toml, and with
//! that setting records travel as branches under `refs/heads/warmstart-gates/`
//! from one clone to another. A real pre-receive hook in a bare remote.

use crate::util::{Run, TestEnv, run, show};
use std::os::unix::fs::PermissionsExt;

const GATES: &str = "[[gate]]\nname = \"ok\"\ncommand = \"true\"\n";

fn xt(env: &TestEnv, dir: &str, args: &[&str]) -> Run {
    run(env.xtask_in(dir).args(args))
}

fn setup(gates: &str) -> TestEnv {
    let env = TestEnv::new();
    env.bare_remote("origin.git");
    env.work_repo("work");
    let dir = env.join("work/cache-manifests");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("gates.toml"), gates).unwrap();
    env.git("work", ["add", "-A"]);
    env.git("work", ["commit", "-q", "-m", "gates"]);
    env.git("work", ["remote", "add", "origin", "../origin.git"]);
    env.git("work", ["push", "-q", "origin", "main"]);
    let hook = env.join("origin.git/hooks/pre-receive");
    std::fs::write(
        &hook,
        "#!/bin/sh\nwhile read old new ref; do case \"$ref\" in refs/heads/*|refs/tags/*) ;; *) echo \"refusing ref outside refs/heads: $ref\" >&2; exit 1;; esac; done\n",
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    env
}

#[test]
fn gates_refs_a_refused_record_push_names_the_records_setting() {
    let env = setup(GATES);
    xt(&env, "work", &["gates", "run"]).ok();
    let r = xt(&env, "work", &["gates", "push"]).expect_code(8);
    let err = r.stderr();
    assert_eq!(err.trim().lines().count(), 1, "{}", show(&r.out));
    assert!(err.contains("records = \"branches\""), "{err}");
    assert!(
        err.contains("refusing ref outside refs/heads"),
        "the host's words: {err}"
    );
    assert!(
        env.git("origin.git", ["for-each-ref"])
            .lines()
            .all(|l| l.contains("refs/heads/main"))
    );
}

#[test]
fn gates_refs_records_as_branches_travel_between_clones() {
    let env = setup(&format!("records = \"branches\"\n{GATES}"));
    let tree = env
        .git("work", ["rev-parse", "HEAD^{tree}"])
        .trim()
        .to_string();
    xt(&env, "work", &["gates", "run"]).ok();
    let r = xt(&env, "work", &["gates", "push", "--json"]).ok();
    assert!(r.stdout().contains("created"), "{}", show(&r.out));
    let refs = env.git("origin.git", ["for-each-ref", "--format=%(refname)"]);
    assert!(
        refs.contains(&format!("refs/heads/warmstart-gates/{tree}")),
        "{refs}"
    );
    assert!(!refs.contains("refs/warmstart/"), "{refs}");
    xt(&env, "work", &["gates", "push"]).ok();

    env.git(".", ["clone", "-q", "origin.git", "second"]);
    xt(&env, "second", &["gates", "check"]).expect_code(9);
    xt(&env, "second", &["gates", "fetch"]).ok();
    xt(&env, "second", &["gates", "check", "ok"]).ok();

    // A value that is not understood is an error, not the default.
    std::fs::write(
        env.join("work/cache-manifests/gates.toml"),
        format!("records = \"heads\"\n{GATES}"),
    )
    .unwrap();
    let r = xt(&env, "work", &["gates", "push"]).expect_code(10);
    assert!(
        r.stderr().contains("unknown variant `heads`"),
        "{}",
        show(&r.out)
    );
}
