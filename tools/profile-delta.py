#!/usr/bin/env python3
"""Profiles one own-clone incremental publish and one incremental restore of
bench-cache.py's many-files tree under `perf record --call-graph dwarf`.

It builds the tree and its 1% change as the benchmark does (same seed, same
ranges), publishes the old tree and restores it into a clone, rewrites the
changed files in the publisher's working tree in place, then records
`cache publish` of the new key and `cache restore` of it into that clone.
The two profiles are left in DIR as publish.data and restore.data:

    tools/profile-delta.py /dev/shm/prof target/debug/warmstart
    perf report -i /dev/shm/prof/restore.data --children --sort sym -g none

BENCHMARKS.md quotes what they showed.
"""
import importlib.util
import subprocess
import sys
import time
from pathlib import Path

here = Path(__file__).resolve().parent
spec = importlib.util.spec_from_file_location("bench", here / "bench-cache.py")
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tools/profile-delta.py DIR XTASK_BINARY")
    base, xtask = Path(sys.argv[1]), str(Path(sys.argv[2]).resolve())
    b.rm(base)
    base.mkdir(parents=True)
    home = base / "home"
    home.mkdir()
    env = b.git_env(home)
    (home / ".gitconfig").write_text("[init]\n\tdefaultBranch = main\n")
    src = base / "src"
    b.make_many_files_tree(src)
    paths, desc = b.make_changed_copy(src, base / "changed")
    print(f"{desc['files']} files changed", flush=True)
    o = b.Ours(base, "ours", xtask, env)
    o.make_tree(src)
    time.sleep(2.5)  # past the record's racy window
    print(f"full publish {o.publish(o.tree)['wall']:.2f} s", flush=True)
    clone = o.clone(base / "clone")
    print(f"cold restore {o.restore(clone, 'old', o.tree, base / 'dest')['wall']:.2f} s", flush=True)
    o.set_tree(base / "changed", paths)

    def perf(name, argv, runenv, cwd):
        t = time.time()
        record = ["perf", "record", "-F", "299", "--call-graph", "dwarf,16384", "-o", str(base / f"{name}.data"), "--"]
        subprocess.run(record + argv, env=runenv, cwd=cwd, check=True, stdout=subprocess.DEVNULL)
        print(f"{name} {time.time() - t:.2f} s (under perf)", flush=True)

    remote = ["--remote", str(o.remote)]
    perf("publish", [xtask, "cache", "publish", "bench", "--json"] + remote, o.run_env("new", o.tree, base / "unused"), o.work)
    perf("restore", [xtask, "cache", "restore", "bench", "--json"] + remote, o.run_env("new", o.tree, base / "dest"), clone)


if __name__ == "__main__":
    main()
