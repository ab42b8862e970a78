//! A hostile local user plants files where warmstart appends: the service
//! `log` and `restore env --append FILE`. Whatever is planted (a symlink to a
//! victim file, a dangling symlink, a symlink to a directory, a FIFO, a file
//! another user owns), warmstart never writes through it, never hangs on it,
//! and says why.

use crate::util::{TestEnv, run};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kinds of plant; each is laid at `at`, aimed at files under `victims`.
const PLANTS: &[&str] = &[
    "symlink",
    "dangling",
    "dir-symlink",
    "fifo",
    "chain",
    "foreign",
];

/// Lays plant `kind` at `at`; returns the files that must stay as they were
/// (path, content) and the paths that must not come to exist.
fn plant(
    kind: &str,
    at: &Path,
    victims: &Path,
    n: usize,
) -> (Vec<(PathBuf, Vec<u8>)>, Vec<PathBuf>) {
    std::fs::create_dir_all(victims).unwrap();
    let victim = victims.join(format!("victim-{n}"));
    let content = format!("victim {n} content\n").into_bytes();
    std::fs::write(&victim, &content).unwrap();
    let mut keep = vec![(victim.clone(), content)];
    let mut absent = Vec::new();
    match kind {
        "symlink" => std::os::unix::fs::symlink(&victim, at).unwrap(),
        "dangling" => {
            let target = victims.join(format!("created-{n}"));
            std::os::unix::fs::symlink(&target, at).unwrap();
            absent.push(target);
        }
        "dir-symlink" => std::os::unix::fs::symlink(victims, at).unwrap(),
        "chain" => {
            let mid = victims.join(format!("mid-{n}"));
            std::os::unix::fs::symlink(&victim, &mid).unwrap();
            std::os::unix::fs::symlink(&mid, at).unwrap();
        }
        "fifo" => {
            let st = Command::new("mkfifo").arg(at).status().unwrap();
            assert!(st.success(), "mkfifo {}", at.display());
        }
        "foreign" => {
            std::fs::write(at, b"theirs\n").unwrap();
            std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o666)).unwrap();
            // Only root can give a file away; as another user the plant is
            // still a file this user does not own when the test runs as root
            // (tools/test.sh runs the suite as root in CI and here).
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } == 0 {
                std::os::unix::fs::chown(at, Some(65534), Some(65534)).unwrap();
                keep.push((at.to_path_buf(), b"theirs\n".to_vec()));
            } else {
                std::fs::remove_file(at).unwrap();
                std::os::unix::fs::symlink(&victim, at).unwrap();
            }
        }
        other => panic!("no plant {other}"),
    }
    (keep, absent)
}

fn check_untouched(kind: &str, keep: &[(PathBuf, Vec<u8>)], absent: &[PathBuf]) {
    for (p, c) in keep {
        assert_eq!(
            &std::fs::read(p).unwrap(),
            c,
            "{kind}: {} was written",
            p.display()
        );
    }
    for p in absent {
        assert!(!p.exists(), "{kind}: {} was created", p.display());
    }
}

#[test]
fn attack2_service_log_is_never_written_through_a_planted_path() {
    let env = TestEnv::new();
    env.work_repo("w");
    let victims = env.join("victims");
    for (n, kind) in PLANTS.iter().enumerate() {
        let log = env.join(format!("tmp/svc-{n}.log"));
        std::fs::create_dir_all(log.parent().unwrap()).unwrap();
        let (keep, absent) = plant(kind, &log, &victims, n);
        let text = format!(
            "[[step]]\nname = \"svc\"\nkind = \"service\"\nrun = \"exec sleep 600\"\npidfile = \"run/svc.pid\"\nlog = {:?}\n",
            log.display().to_string()
        );
        std::fs::create_dir_all(env.join("w/cache-manifests")).unwrap();
        std::fs::write(env.join("w/cache-manifests/restore.toml"), text).unwrap();
        let mut cmd = env.xtask_in("w");
        cmd.args(["restore", "--json"]);
        let r = run(&mut cmd);
        // Whatever the verdict, nothing this test may have started outlives it.
        let started = env.join("w/run/svc.pid").exists();
        let mut stop = env.xtask_in("w");
        stop.args(["restore", "stop"]);
        run(&mut stop).ok();
        let v: serde_json::Value = serde_json::from_str(&r.stdout()).unwrap();
        let row = &v["steps"][0];
        // A service fails open by default: the restore goes on, the step fails.
        assert_eq!(row["state"], "failed-open", "{kind}: {row:#}");
        let why = row.to_string();
        assert!(
            why.contains("the service log"),
            "{kind}: no reason named: {why}"
        );
        check_untouched(kind, &keep, &absent);
        // Nothing was started, so there is nothing to stop.
        assert!(!started, "{kind}: a pidfile was written");
        let _ = std::fs::remove_file(&log);
    }
}

#[test]
fn attack2_restore_env_append_never_writes_through_a_planted_path() {
    let env = TestEnv::new();
    env.work_repo("r");
    std::fs::create_dir_all(env.join("r/cache-manifests")).unwrap();
    std::fs::write(
        env.join("r/cache-manifests/restore.toml"),
        "[env]\nenv = { HOOKED = \"1\" }\n\n[[step]]\nname = \"t\"\nkind = \"command\"\nrun = \"true\"\ncreates = \"README.md\"\n",
    )
    .unwrap();
    let victims = env.join("victims");
    for (n, kind) in PLANTS.iter().enumerate() {
        let file = env.join(format!("tmp/env-{n}.sh"));
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let (keep, absent) = plant(kind, &file, &victims, n);
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "env", "--append"]).arg(&file);
        let r = run(&mut cmd);
        assert_ne!(r.code(), 0, "{kind}: appended: {}", r.stderr());
        assert!(
            r.stderr().contains(&file.display().to_string()),
            "{kind}: the file is not named: {}",
            r.stderr()
        );
        check_untouched(kind, &keep, &absent);
        let _ = std::fs::remove_file(&file);
    }
    // A plain new file is still written, and a second run appends to it.
    let file = env.join("tmp/plain.sh");
    for _ in 0..2 {
        let mut cmd = env.xtask_in("r");
        cmd.args(["restore", "env", "--append"]).arg(&file);
        run(&mut cmd).ok();
    }
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "export HOOKED='1'\nexport HOOKED='1'\n"
    );
}
