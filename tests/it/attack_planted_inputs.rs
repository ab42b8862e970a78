//! A hostile local user plants files where warmstart appends: the service
//! `log` and `restore env --append FILE`. Whatever is planted (a symlink to a
//! victim file, a dangling symlink, a symlink to a directory, a FIFO, a file
//! another user owns), warmstart never writes through it, never hangs on it,
//! and says why.

use crate::util::rng::Rng;
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
fn planted_service_log_is_never_written_through_a_planted_path() {
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
fn planted_restore_env_append_never_writes_through_a_planted_path() {
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

/// A confused writer's legacy `seen.json` (names and times with line
/// breaks, spaces, tabs, other shapes): merging it never writes a line into
/// `seen` that is not one well-formed `<cache> <key> <created_at>`, and never
/// lowers the newest time recorded for an entry.
#[test]
fn planted_seen_legacy_record_never_injects_lines() {
    use warmstart::trust::seen;
    let pieces = [
        "c",
        "k",
        "x",
        " ",
        "\n",
        "\r",
        "\t",
        "",
        "c k",
        "1999-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
        "2026-01-01T00:00:00Z\nc k 1970-01-01T00:00:00Z",
        "\nc k 0001-01-01T00:00:00Z",
        "2026-1-1T0:0:0Z",
        "2026-01-01 00:00:00Z",
        "2026-01-01T00:00:00+01:00",
        "02026-01-01T00:00:00Z",
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("trust/seen");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    let mut rng = Rng(0x5eed_a77a_c4c4);
    let (mut merged, mut refused) = (0, 0);
    for case in 0..400 {
        let _ = std::fs::remove_file(&file);
        let mut entries = serde_json::Map::new();
        for _ in 0..1 + rng.next() % 3 {
            let (k, v): (String, String) = if !rng.next().is_multiple_of(4) {
                let k = rng.pick(&["c k", "c x", "d k"]).to_string();
                let v = rng.pick(&[
                    "1999-01-01T00:00:00Z",
                    "2026-06-01T00:00:00Z",
                    "9999-12-31T23:59:59Z",
                ]);
                (k, v.to_string())
            } else {
                (
                    (0..1 + rng.next() % 4)
                        .map(|_| *rng.pick(&pieces))
                        .collect(),
                    (0..1 + rng.next() % 2)
                        .map(|_| *rng.pick(&pieces))
                        .collect(),
                )
            };
            entries.insert(k, serde_json::Value::String(v));
        }
        let legacy = serde_json::json!({ "format": 1, "seen": entries });
        std::fs::write(file.with_file_name("seen.json"), legacy.to_string()).unwrap();
        let at = "2026-06-01T00:00:00Z";
        if seen::record(&file, "c", "k", at).is_err() {
            // Refused as corrupt: nothing was written, the legacy file stays.
            assert!(!file.exists(), "case {case}: {legacy}");
            refused += 1;
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let mut newest_ck = String::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            // As the bootstrap's awk splits it: on any whitespace.
            let f: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(f.len(), 3, "case {case}: line {line:?} from {legacy}");
            assert_eq!(line, f.join(" "), "case {case}: line {line:?}");
            warmstart::trust::statement::check_timestamp(f[2])
                .unwrap_or_else(|e| panic!("case {case}: {e} in {line:?} from {legacy}"));
            if f[0] == "c" && f[1] == "k" {
                assert!(newest_ck.is_empty(), "case {case}: c k twice in {text:?}");
                newest_ck = f[2].to_string();
            }
        }
        assert!(
            newest_ck.as_str() >= at,
            "case {case}: c k went back to {newest_ck:?}"
        );
        seen::load(&file).unwrap();
        merged += 1;
    }
    // Both ways were taken: the cases are not all refused or all clean.
    assert!(
        merged > 20 && refused > 20,
        "merged {merged}, refused {refused}"
    );
}

/// A hostile pusher cannot sign, but can edit the branch manifest: the
/// `key_parts` of a signed key are not in its statement. Relabelled parts
/// (another platform's key claiming today's platform) never make a
/// `drop` fallback choose that key; honest entries still match.
#[test]
fn planted_fallback_never_chooses_a_key_its_parts_do_not_spell() {
    use warmstart::cache::format::fallback::candidates;
    use warmstart::cache::format::manifest::{Fallback, key_from_parts};
    use warmstart::cache::format::{BranchManifest, Chunk, KeyEntry, KeyPart};
    let part = |n: &str, v: &str| KeyPart {
        name: n.into(),
        value: v.into(),
    };
    let entry = |parts: Vec<KeyPart>, n: u64| KeyEntry {
        archive: "k.tar.zst".into(),
        compression: "zstd".into(),
        chunks: vec![Chunk {
            file: "k.tar.zst.part000".into(),
            size: 1,
            sha256: "a".repeat(64),
            raw_size: None,
            raw_sha256: None,
        }],
        tar_sha256: "b".repeat(64),
        tar_size: 1,
        files: 1,
        key_parts: parts,
        source_commit: None,
        source_tree: None,
        gates: serde_json::Value::Null,
        ungated: false,
        created_at: format!("2026-01-{:02}T00:00:00Z", 1 + n % 28),
        tool_version: "t".into(),
        frames: None,
        index: None,
        index_parts: Vec::new(),
    };
    let values = [
        "1",
        "2",
        "x",
        "y",
        "linux-x86_64",
        "mac/arm64",
        "a b",
        "a_b",
        ".",
    ];
    let mut rng = Rng(0x0bad_5eed_f00d_0001);
    let (mut honest_chosen, mut forged_tried) = (0, 0);
    for case in 0..500 {
        let wanted = key_from_parts(
            "vc",
            vec![
                part("src", values[rng.below(values.len())]),
                part("platform", values[rng.below(values.len())]),
            ],
        );
        let mut branch = BranchManifest::new();
        for n in 0..1 + rng.next() % 5 {
            let real = vec![
                part("src", values[rng.below(values.len())]),
                part("platform", values[rng.below(values.len())]),
            ];
            let name = key_from_parts("vc", real.clone()).value;
            let parts = if rng.next().is_multiple_of(2) {
                // Relabelled: claims today's platform and some source.
                let claimed = vec![
                    part("src", values[rng.below(values.len())]),
                    wanted.parts[1].clone(),
                ];
                if key_from_parts("vc", claimed.clone()).value != name {
                    forged_tried += 1;
                }
                claimed
            } else {
                real
            };
            branch.keys.insert(name, entry(parts, n));
        }
        let drop_src = [Fallback::Drop(vec!["src".into()])];
        for c in candidates(&drop_src, &wanted, &branch) {
            let e = &branch.keys[&c.key];
            assert_eq!(
                key_from_parts("vc", e.key_parts.clone()).value,
                c.key,
                "case {case}: chose {} for {} by parts it does not have",
                c.key,
                wanted.value
            );
            honest_chosen += 1;
        }
    }
    assert!(
        honest_chosen > 20 && forged_tried > 20,
        "{honest_chosen} {forged_tried}"
    );
}
