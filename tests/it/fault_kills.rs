//! A fault property test: SIGKILL at a random moment (of warmstart alone,
//! or of its whole process group, as a container stop or a CI cancel
//! does) during a cold `cache restore`, a delta restore (the old key
//! installed, the new one restored), a `cache publish` and a `cache gc`,
//! each followed by a plain re-run that must succeed, and a final tree
//! equal to what a cold restore of the same key gives (file lists, modes,
//! contents, symlink targets).
//!
//! The moments are drawn from 0 to the operation's own duration, measured
//! on this machine first. `FAULT_ROUNDS` sets the number of rounds
//! (default 20, about 20 s on this 2-core machine), `FAULT_SEED` the seed
//! (printed on failure).

use crate::util::fixture::{Fixture, Manifest};
use crate::util::rng::Rng;
use crate::util::show;
use crate::util::tree::{assert_same_tree, make_tricky_tree, write_pseudo_random};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug)]
enum Op {
    ColdRestore,
    DeltaRestore,
    Publish,
    Gc,
}

const OPS: [Op; 4] = [Op::ColdRestore, Op::DeltaRestore, Op::Publish, Op::Gc];

/// Two published keys of one cache, whose trees differ a little (the
/// delta restore has something to change) and whose sources are the
/// reference: in setup, a cold restore of each equals its source.
struct World {
    fx: Fixture,
    src: [PathBuf; 2],
    target: PathBuf,
}

impl World {
    fn new() -> World {
        let fx = Fixture::new();
        let src = [fx.env.join("src1"), fx.env.join("src2")];
        for (i, s) in src.iter().enumerate() {
            make_tricky_tree(s, false);
            // Big enough that each operation takes a measurable while.
            write_pseudo_random(&s.join("noise.bin"), 3_000_000, 5);
            std::fs::write(s.join("version.txt"), format!("{i}\n")).unwrap();
        }
        write_pseudo_random(&src[1].join("extra.bin"), 300_000, 9);
        let target = fx.work.join("restored/art");
        let w = World { fx, src, target };
        for k in 0..2 {
            w.manifest(&format!("{k}"), k);
            w.fx.publish("art");
        }
        w
    }

    /// The manifest with literal key `literal` packing source `k`.
    fn manifest(&self, literal: &str, k: usize) {
        let m = Manifest::literal(literal, &self.src[k]).chunk_bytes(256_000);
        self.fx.write_manifest("art", &m);
    }

    fn ok(&self, args: &[&str]) {
        self.fx.xtask(args).ok();
    }

    fn restore_fresh(&self) {
        let _ = std::fs::remove_dir_all(self.fx.work.join(".git/warmstart"));
        let _ = std::fs::remove_dir_all(&self.target);
    }

    /// Sets up the state `op` starts from, and returns its arguments and the
    /// source whose tree the target must hold once it (re-)ran.
    fn prepare(&self, op: Op, round: usize) -> (Vec<String>, usize) {
        let restore = ["cache", "restore", "art"].map(String::from).to_vec();
        match op {
            Op::ColdRestore => {
                self.manifest("1", 1);
                self.restore_fresh();
                (restore, 1)
            }
            Op::DeltaRestore => {
                self.manifest("0", 0);
                self.ok(&["cache", "restore", "art"]);
                self.manifest("1", 1);
                (restore, 1)
            }
            Op::Publish => {
                // A key not on the remote yet: the publish packs and pushes.
                let k = round % 2;
                self.manifest(&format!("p{round}-{}", std::process::id()), k);
                (["cache", "publish", "art"].map(String::from).to_vec(), k)
            }
            Op::Gc => {
                self.manifest("1", 1);
                self.ok(&["cache", "restore", "art"]);
                let gc = ["cache", "gc", "--keep-for", "0s", "--max-size", "0"];
                (gc.map(String::from).to_vec(), 1)
            }
        }
    }

    /// Runs `args` and SIGKILLs it (alone, or its whole group) after
    /// `delay`, or lets it end first; returns whether the kill landed.
    fn kill_after(&self, args: &[String], delay: Duration, group: bool) -> bool {
        use std::os::unix::process::CommandExt;
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut cmd = self.fx.command(&args);
        cmd.stdout(Stdio::null()).stderr(Stdio::null());
        if group {
            cmd.process_group(0);
        }
        let mut child = cmd.spawn().unwrap();
        let start = Instant::now();
        while start.elapsed() < delay {
            if child.try_wait().unwrap().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let pid = child.id() as libc::pid_t;
        // SAFETY: kill(2) on our own child, or the group it leads.
        unsafe { libc::kill(if group { -pid } else { pid }, libc::SIGKILL) };
        child.wait().unwrap();
        true
    }

    /// After a killed `op`: a plain re-run succeeds, and the target holds
    /// source `k`'s tree (after a restore, for a publish or a gc).
    fn check(&self, op: Op, args: &[String], k: usize) {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let r = self.fx.xtask(&args);
        assert_eq!(
            r.code(),
            0,
            "the re-run of {args:?} failed\n{}",
            show(&r.out)
        );
        if matches!(op, Op::Publish) {
            // What was published restores cold to the source.
            self.restore_fresh();
        }
        if !matches!(op, Op::ColdRestore | Op::DeltaRestore) {
            let r = self.fx.xtask(&["cache", "restore", "art"]);
            assert_eq!(r.code(), 0, "the restore after {op:?}\n{}", show(&r.out));
        }
        assert_same_tree(&self.src[k], &self.target);
    }

    /// How long `op` takes here, run plainly once.
    fn measure(&self, op: Op) -> Duration {
        let (args, k) = self.prepare(op, 1000);
        let args_s: Vec<&str> = args.iter().map(String::as_str).collect();
        let start = Instant::now();
        self.fx.xtask(&args_s).ok();
        let took = start.elapsed();
        self.check(op, &args, k);
        took
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn fault_kills_at_random_moments_are_repaired_by_a_plain_rerun_that_matches_a_cold_restore() {
    let seed = env_or(
        "FAULT_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1,
    );
    let rounds = env_or("FAULT_ROUNDS", 20usize);
    let w = World::new();
    // In setup, a cold restore of each key is its source: the sources are
    // the reference from here on.
    for k in 0..2 {
        w.manifest(&format!("{k}"), k);
        w.restore_fresh();
        w.ok(&["cache", "restore", "art"]);
        assert_same_tree(&w.src[k], &w.target);
    }
    let took: Vec<Duration> = OPS.iter().map(|&op| w.measure(op)).collect();
    let mut rng = Rng(seed);
    let mut landed = 0;
    for round in 0..rounds {
        let i = round % OPS.len();
        let op = OPS[i];
        let group = rng.chance(50);
        let delay = Duration::from_millis(rng.below(took[i].as_millis() as usize + 1) as u64);
        let context = format!(
            "seed {seed} (FAULT_SEED={seed} FAULT_ROUNDS={rounds}), round {round}: {op:?} killed{} after {delay:?} (it takes {:?})",
            if group { " with its group" } else { " alone" },
            took[i]
        );
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let (args, k) = w.prepare(op, round);
            let killed = w.kill_after(&args, delay, group);
            w.check(op, &args, k);
            killed
        }));
        match run {
            Ok(killed) => landed += usize::from(killed),
            Err(e) => {
                let msg = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                panic!("{context}:\n{msg}");
            }
        }
    }
    // Most delays fall inside the operation: the kills are real.
    assert!(
        landed * 2 >= rounds,
        "seed {seed}: only {landed} of {rounds} kills landed before the operation ended"
    );
}
