//! A full disk under the private stores is named as a full disk (exit 1, `No space left on device` and the path), never as an unreachable remote (exit 8).
//!
//! The clone's state directory is put on a tmpfs of 512 KiB (`mount -t
//! tmpfs`, which needs root: CI runs as root; elsewhere the test fails
//! saying so, it never skips).

use crate::util::fixture::{Fixture, Manifest};
use crate::util::tree::write_pseudo_random;
use crate::util::{run, show};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs mounted at a path for as long as this lives.
pub(crate) struct Tmpfs(PathBuf);

impl Tmpfs {
    pub(crate) fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "this test needs a small full file system: `mount -t tmpfs` at {} failed (run it as root, as CI does): {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(at.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn store_disk_full_a_full_disk_under_cache_git_is_exit_1_naming_it_never_unreachable() {
    for limit in ["1m", "8k"] {
        // 1m: the chunks come with the branch fetch; 8k: by id, after it.
        let fx = Fixture::new().with_var("WARMSTART_FETCH_BLOB_LIMIT", limit);
        let src = fx.env.join("src");
        std::fs::create_dir_all(&src).unwrap();
        write_pseudo_random(&src.join("big.bin"), 3_000_000, 9);
        fx.write_manifest("art", &Manifest::literal("1", &src).chunk_bytes(200_000));
        fx.publish("art");
        fx.forget();
        let state = fx.work.join(".git/warmstart");
        let _full = Tmpfs::mount(&state, "512k");
        let r = run(&mut fx.command(&["cache", "restore", "art"]));
        let err = r.stderr();
        assert_eq!(r.code(), 1, "{limit}: {}", show(&r.out));
        assert!(err.contains("No space left on device"), "{limit}: {err}");
        assert!(
            err.contains(&state.display().to_string()),
            "{limit}: names the place: {err}"
        );
        assert!(!err.contains("unreachable"), "{limit}: {err}");
        assert!(!fx.work.join("restored/art/big.bin").exists(), "{limit}");
    }
}

#[test]
fn store_disk_full_gc_removes_the_partial_packs_a_dead_git_left_and_keeps_a_live_ones() {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("small.txt"), "small\n").unwrap();
    fx.write_manifest("art", &Manifest::literal("1", &src));
    fx.publish("art");
    let pack = fx.work.join(".git/warmstart/cache.git/objects/pack");
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    let plant = |name: &str, aged: bool| {
        let path = pack.join(name);
        let f = std::fs::File::create(&path).unwrap();
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        if aged {
            f.set_modified(old).unwrap();
        }
        path
    };
    // What index-pack leaves when the disk fills or it is killed.
    let dead = plant("tmp_pack_dead01", true);
    let dead_idx = plant("tmp_idx_dead01", true);
    // A fetch of blobs by id writing now (it takes no store lock).
    let live = plant("tmp_pack_live01", true);
    let mut holder = Command::new("sh")
        .arg("-c")
        .arg("exec 3<\"$1\"; echo held; exec sleep 60")
        .arg("sh")
        .arg(&live)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    // A git that has just begun one.
    let fresh = plant("tmp_pack_fresh01", false);
    let r = run(&mut fx.command(&["cache", "gc"]));
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(r.code(), 0, "{}", show(&r.out));
    assert!(!dead.exists() && !dead_idx.exists(), "{}", show(&r.out));
    assert!(live.exists(), "a partial pack held open stays");
    assert!(
        fresh.exists(),
        "a partial pack younger than the grace stays"
    );
}

#[test]
fn store_disk_full_a_full_disk_under_a_publish_is_exit_1_naming_it_and_leaves_no_scratch() {
    let fx = Fixture::new();
    let src = fx.env.join("src");
    std::fs::create_dir_all(&src).unwrap();
    write_pseudo_random(&src.join("big.bin"), 3_000_000, 4);
    fx.write_manifest("art", &Manifest::literal("1", &src).chunk_bytes(200_000));
    let state = fx.work.join(".git/warmstart");
    let full = Tmpfs::mount(&state, "1m");
    let r = run(&mut fx.command(&["cache", "publish", "art"]));
    let err = r.stderr();
    assert_eq!(r.code(), 1, "{}", show(&r.out));
    assert!(err.contains("No space left on device"), "{err}");
    assert!(
        err.contains(&state.display().to_string()),
        "names the place: {err}"
    );
    // No scratch chunk and no partial pack of git's is left on the full disk.
    let mut left = Vec::new();
    let mut dirs = vec![state.clone()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if ["warmstart-publish-", "tmp_pack_", "tmp_obj_", "chunk-"]
                .iter()
                .any(|p| name.starts_with(p))
            {
                left.push(e.path());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(e.path());
            }
        }
    }
    assert!(left.is_empty(), "left on the full disk: {left:?}");
    assert!(
        !fx.origin_git(&["branch", "--list", "art-cache"])
            .contains("art-cache"),
        "nothing was published"
    );
    // With room again, the next publish succeeds.
    drop(full);
    fx.publish("art");
}
