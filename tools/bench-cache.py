#!/usr/bin/env python3
"""Benchmark of `cache publish` and `cache restore` against the shell recipe and the tar floor.

DESIGN.md "Benchmarks", issue 7. The workload is the machine's own Rust
toolchain (`rustc --print sysroot`, ~1.4 GB, ~58k files), published to a local
bare repository set up like a hosting server (receive.unpackLimit 1,
uploadpack.allowFilter true) and
restored into an empty directory. In the same run it times
../shared/bench/seed_recipe.sh (zstd and gzip) on the same data and the floor
`tar -C SRC -cf - . | tar -C DEST -xf -`, interleaving the contenders round by
round so that a busy machine slows all of them alike (each starts after a
`sync`, so none pays for another's writeback), and reports medians,
ratios from this run only, and peak RSS (wait4's ru_maxrss: the largest single
process of the contender's tree, which is what bounds memory).

It also measures peak RSS of publish and restore at a second, small size (a
generated ~40 MB tree), the warm `cache restore` (median of 15 runs), and with
--cold-build a truly cold `cargo build -p warmstart` (fresh CARGO_TARGET_DIR,
--timings; wall, user and sys CPU seconds).

It measures the DEV build of xtask by default, because that is what users run
through the `cargo xtask` alias (root Cargo.toml optimises the hashing and
compression crates even there); --release measures the release build.

    tools/bench-cache.py                      # full run on the sysroot, 3 rounds
    tools/bench-cache.py --quick              # small generated tree, 1 round (CI smoke test, ~20 s)
    tools/bench-cache.py --source DIR --runs 5 --json out.json
    tools/bench-cache.py --cold-build         # also the cold build of xtask

It asserts nothing about times: it measures and prints a Markdown table and JSON
(to stdout; progress to stderr). It exits non-zero only when a contender fails.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def find_seed_recipe():
    env = os.environ.get("SEED_RECIPE")
    cands = [Path(env)] if env else []
    cands += [ROOT.parent / "shared/bench/seed_recipe.sh", Path("/work/shared/bench/seed_recipe.sh")]
    for cand in cands:
        if cand.exists():
            return cand.resolve()
    sys.exit("bench-cache: ../shared/bench/seed_recipe.sh not found; set SEED_RECIPE")


def git_env(home):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("GIT_", "WARMSTART_")):
            del env[k]
    env.update(
        HOME=str(home),
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL=str(home / ".gitconfig"),
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@warmstart.invalid",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@warmstart.invalid",
        NO_COLOR="1",
    )
    return env


def run_timed(argv, env, cwd=None, shell=False):
    """Runs a command to completion; returns (wall seconds, peak RSS MiB, user+sys s).

    Every contender starts with nothing dirty in the page cache (`sync`,
    untimed): otherwise the contender after a big writer pays for that
    writer's writeback. In one run without it, the seed recipe's restore
    (early in the round) and ours (late, right after the seed recipe's gzip
    restore wrote 1.3 GB) measured 17.9 and 4.2 s in round 1, then 18.1 and
    6.8 s in round 2, the floor (also late) 4.6 then 12.3 s."""
    subprocess.run(["sync"], check=True)
    start = time.perf_counter()
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, shell=shell, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    err = proc.stderr.read()
    _, status, ru = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(
            f"bench-cache: {argv!r} failed with exit code {proc.returncode}:\n{err.decode(errors='replace')}"
        )
    if err.strip():
        log(err.decode(errors="replace").rstrip())
    return elapsed, ru.ru_maxrss / 1024.0, ru.ru_utime + ru.ru_stime


def git(env, *args, cwd=None):
    subprocess.run(["git", *args], env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def bare_remote(env, path):
    rm(path)
    git(env, "init", "-q", "--bare", str(path))
    git(env, "config", "receive.unpackLimit", "1", cwd=path)
    # Partial clone, as on GitHub and GitLab: `cache restore` fetches the
    # branch without its chunks, then the chunks by id while unpacking.
    git(env, "config", "uploadpack.allowFilter", "true", cwd=path)


def rm(path):
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def make_small_tree(dest):
    """About 40 MB of mixed files: random (incompressible) and repetitive text."""
    rng = random.Random(7)
    for d in range(20):
        sub = dest / f"dir{d:02}"
        sub.mkdir(parents=True)
        for f in range(25):
            n = rng.randrange(1, 160_000)
            if f % 3 == 0:
                data = rng.randbytes(n)
            else:
                data = (f"line {d} {f} " * (n // 12 + 1)).encode()[:n]
            (sub / f"file{f:02}.bin").write_bytes(data)
        (sub / "run.sh").write_text("#!/bin/sh\necho hi\n")
        (sub / "run.sh").chmod(0o755)
        (sub / "link").symlink_to("file00.bin")
    (dest / "big.bin").write_bytes(rng.randbytes(8 << 20) * 2)


def tree_stats(src):
    files = size = 0
    for dirpath, _, filenames in os.walk(src):
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except OSError:
                continue
            files += 1
            size += st.st_size
    return files, size


def warm(src):
    subprocess.run(f"tar -C '{src}' -cf - . | cat > /dev/null", shell=True, check=True)


class Ours:
    """warmstart's publish and restore of one source tree, through the real binary."""

    def __init__(self, base, name, src, xtask, env):
        self.base = base / name
        self.base.mkdir(parents=True)
        self.xtask = str(xtask)
        self.env = env
        self.work = self.base / "work"
        self.remote = self.base / "remote.git"
        self.dest = self.base / "dest"
        git(env, "init", "-q", "-b", "main", str(self.work))
        (self.work / "cache-manifests").mkdir()
        (self.work / "cache-manifests/bench.toml").write_text(
            '[[key]]\nname = "v"\nliteral = "bench"\n\n'
            f"[pack]\nroot = {json.dumps(str(src))}\n\n"
            '[restore]\npath = "${WARMSTART_BENCH_DEST}"\n'
        )
        git(env, "add", "-A", cwd=self.work)
        git(env, "commit", "-q", "-m", "bench", cwd=self.work)
        self.run_env = dict(env, WARMSTART_BENCH_DEST=str(self.dest))

    def publish(self):
        """A cold publish: fresh remote, no local cache state."""
        bare_remote(self.env, self.remote)
        rm(self.work / ".git/warmstart")
        return self.republish()

    def republish(self):
        argv = [self.xtask, "cache", "publish", "bench", "--quiet", "--remote", str(self.remote)]
        return run_timed(argv, self.run_env, cwd=self.work)

    def restore(self, warm_runs=0, keep=False):
        """A cold restore into an empty directory from a fresh clone; then
        warm runs. `keep` leaves the restored tree for the caller to delete."""
        clone = self.base / "clone"
        rm(clone)
        rm(self.dest)
        git(self.env, "clone", "-q", str(self.work), str(clone))
        argv = [self.xtask, "cache", "restore", "bench", "--quiet", "--remote", str(self.remote)]
        cold = run_timed(argv, self.run_env, cwd=clone)
        warms = [run_timed(argv, self.run_env, cwd=clone) for _ in range(warm_runs)]
        rm(clone)
        if not keep:
            rm(self.dest)
        return cold, warms


def cold_build(base, release):
    """A truly cold build of xtask: an empty target dir, with --timings."""
    target = base / "cold-target"
    argv = ["cargo", "build", "-p", "warmstart", "--timings"] + (["--release"] if release else [])
    env = dict(os.environ, CARGO_TARGET_DIR=str(target))
    log(f"bench-cache: cold build: {' '.join(argv)} (CARGO_TARGET_DIR={target})")
    t = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit("bench-cache: cold cargo build failed")
    timings = sorted((target / "cargo-timings").glob("cargo-timing-*.html"))
    kept = None
    if timings:
        kept = Path(tempfile.gettempdir()) / timings[-1].name
        shutil.copy(timings[-1], kept)
    rm(target)
    return {"wall_s": wall, "user_s": ru.ru_utime, "sys_s": ru.ru_stime, "timings_html": str(kept) if kept else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small generated tree, one round, no gzip (CI smoke test)")
    ap.add_argument("--source", help="tree to publish (default: rustc --print sysroot)")
    ap.add_argument("--runs", type=int, help="interleaved rounds (default 3, or 1 with --quick)")
    ap.add_argument("--no-gzip", action="store_true", help="skip the seed recipe's gzip variant")
    ap.add_argument("--release", action="store_true", help="measure the release build instead of the dev build")
    ap.add_argument("--xtask", help="measure this xtask binary (no build)")
    ap.add_argument("--cold-build", action="store_true", help="also time a cold `cargo build -p warmstart`")
    ap.add_argument("--json", help="also write the JSON result to this file")
    args = ap.parse_args()
    runs = args.runs or (1 if args.quick else 3)
    gzip = not (args.no_gzip or args.quick)

    seed = find_seed_recipe()
    for tool in ["git", "tar", "zstd", "gzip", "split", "sha256sum"]:
        if shutil.which(tool) is None:
            sys.exit(f"bench-cache: {tool} is needed (tools/test.sh installs it)")
    if args.xtask:
        xtask, build = Path(args.xtask).resolve(), "given (" + args.xtask + ")"
    else:
        prof = ["--release"] if args.release else []
        subprocess.run(["cargo", "build", "--quiet", "-p", "warmstart", *prof], cwd=ROOT, check=True)
        build = "release" if args.release else "dev"
        xtask = ROOT / "target" / ("release" if args.release else "debug") / "warmstart"

    base = Path(tempfile.mkdtemp(prefix="warmstart-bench-"))
    try:
        home = base / "home"
        home.mkdir()
        env = git_env(home)
        small_src = base / "small-src"
        make_small_tree(small_src)
        if args.quick:
            src = small_src
        else:
            src = Path(
                args.source
                or subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
            )
        files, size = tree_stats(src)
        log(f"bench-cache: source {src} ({files} files, {size / 1e6:.0f} MB), {runs} round(s), {build} build {xtask}")
        warm(src)

        ours = Ours(base, "big", src, xtask, env)
        seed_remote = base / "seed.git"
        samples = {}

        def record(name, result):
            samples.setdefault(name, []).append(result)
            log(f"  {name}: {result[0]:.2f} s, {result[1]:.0f} MiB, cpu {result[2]:.1f} s")

        comps = ["zst", "gz"] if gzip else ["zst"]
        # Restored trees are kept until the end of the run: on ext4 without
        # a journal (this machine's /) inode allocation skips inodes freed in
        # the last 60-300 s one by one (fs/ext4/ialloc.c, recently_deleted),
        # so a restore made within minutes of an `rm -rf` of a 58k-file tree
        # pays for the deletion (perf: 45% of a restore's samples; a round
        # that deleted the previous round's trees first measured every
        # restore 2-5x slower). Only when the disk is too small are they
        # deleted at the start of each round (and synced), which the log and
        # the JSON say.
        restored_per_round = (len(comps) + 2) * size
        keep_trees = shutil.disk_usage(base).free > runs * restored_per_round * 1.3 + (4 << 30)
        if not keep_trees:
            log(
                f"bench-cache: not enough free disk to keep {runs} round(s) of restored trees "
                f"({runs * restored_per_round / 1e9:.0f} GB); deleting them at the start of each round, "
                "which slows the restores that follow (see the comment in the code)"
            )
        for r in range(runs):
            log(f"round {r + 1}/{runs}")
            dests = base / f"dests-{r}"
            if not keep_trees:
                rm(base / f"dests-{r - 1}")
                subprocess.run(["sync"], check=True)
            dests.mkdir()
            # Every contender that reads the source starts from a warm page cache.
            warm(src)
            record("publish: warmstart", ours.publish())
            for comp in comps:
                bare_remote(env, seed_remote)
                warm(src)
                record(
                    f"publish: seed recipe {comp}",
                    run_timed(["bash", str(seed), "publish", str(src), str(seed_remote), f"seed-{comp}", comp], env),
                )
                record(
                    f"restore: seed recipe {comp}",
                    run_timed(
                        ["bash", str(seed), "restore", str(seed_remote), f"seed-{comp}", str(dests / comp), comp], env
                    ),
                )
            rm(seed_remote)
            warm(src)
            record("re-publish unchanged: warmstart", ours.republish())
            ours.dest = dests / "warmstart"
            ours.run_env["WARMSTART_BENCH_DEST"] = str(ours.dest)
            cold, warms = ours.restore(warm_runs=15 if r == 0 else 0, keep=True)
            record("restore: warmstart", cold)
            for w in warms:
                samples.setdefault("warm restore: warmstart", []).append(w)
            (dests / "floor").mkdir()
            warm(src)
            record(
                "floor: tar | tar",
                run_timed(f"tar -C '{src}' -cf - . | tar -C '{dests / 'floor'}' -xf -", env, shell=True),
            )
        if "warm restore: warmstart" in samples:
            w = samples["warm restore: warmstart"]
            log(f"  warm restore: warmstart: median {statistics.median(x[0] for x in w) * 1000:.1f} ms of {len(w)}")

        small_files, small_size = tree_stats(small_src)
        if not args.quick:
            log(f"small size for peak RSS: {small_files} files, {small_size / 1e6:.0f} MB")
            small = Ours(base, "small", small_src, xtask, env)
            record("publish: warmstart (small tree)", small.publish())
            record("restore: warmstart (small tree)", small.restore()[0])

        build_result = cold_build(base, args.release) if args.cold_build else None

        med = {k: statistics.median(x[0] for x in v) for k, v in samples.items()}
        rss = {k: max(x[1] for x in v) for k, v in samples.items()}
        cpu = {k: statistics.median(x[2] for x in v) for k, v in samples.items()}

        def ratio(a, b):
            return med[a] / med[b] if a in med and b in med and med[b] > 0 else None

        targets = [
            ("restore / seed zstd restore", ratio("restore: warmstart", "restore: seed recipe zst"), 0.35),
            ("restore / floor", ratio("restore: warmstart", "floor: tar | tar"), 1.5),
            ("publish / seed zstd publish", ratio("publish: warmstart", "publish: seed recipe zst"), 0.35),
            ("re-publish unchanged / publish", ratio("re-publish unchanged: warmstart", "publish: warmstart"), 0.15),
            ("peak RSS publish, MiB", max(v for k, v in rss.items() if k.startswith("publish: warmstart")), 256),
            ("peak RSS restore, MiB", max(v for k, v in rss.items() if k.startswith("restore: warmstart")), 256),
            ("warm restore, ms", med["warm restore: warmstart"] * 1000 if "warm restore: warmstart" in med else None, 50),
        ]
        if build_result:
            targets.append(("cold cargo build -p warmstart, s (wall)", build_result["wall_s"], 60))
        result = {
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "cores": os.cpu_count(),
            "build": build,
            "xtask": str(xtask),
            "source": str(src),
            "files": files,
            "bytes": size,
            "small_tree": {"files": small_files, "bytes": small_size},
            "runs": runs,
            "restored_trees_kept_until_the_end": keep_trees,
            "synced_before_each_contender": True,
            "median_seconds": med,
            "median_cpu_seconds": cpu,
            "peak_rss_mib": rss,
            "targets": [{"what": w, "value": v, "target": t, "met": v is not None and v <= t} for w, v, t in targets],
            "cold_build": build_result,
        }
        print(
            f"\n{files} files, {size / 1e6:.0f} MB from `{src}`; {runs} interleaved round(s); "
            f"{build} build of xtask; {os.cpu_count()} cores; {result['date']}\n"
        )
        print("| contender | median s | median CPU s | peak RSS MiB | runs |")
        print("|---|---:|---:|---:|---:|")
        for k in samples:
            label = k.replace("|", "\\|")
            print(f"| {label} | {med[k]:.3f} | {cpu[k]:.1f} | {rss[k]:.0f} | {len(samples[k])} |")
        print("\n| target (same run) | value | target | met |")
        print("|---|---:|---:|---|")
        for w, v, t in targets:
            val = "n/a" if v is None else f"{v:.2f}"
            print(f"| {w} | {val} | ≤ {t} | {'yes' if v is not None and v <= t else 'NO'} |")
        if build_result:
            b = build_result
            print(f"\ncold build: {b['wall_s']:.1f} s wall, {b['user_s']:.1f} s user, {b['sys_s']:.1f} s sys")
        print()
        print(json.dumps(result, indent=2))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
