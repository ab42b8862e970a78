#!/usr/bin/env python3
"""Benchmark of `cache publish` and `cache restore` against the shell recipe and two floors.

BENCHMARKS.md has the results. The workload is the machine's own
Rust toolchain (`rustc --print sysroot`, ~1.4 GB, ~58k files), published to a
local bare repository set up like a hosting server (receive.unpackLimit 1, so
pushes stay packs; uploadpack.allowFilter true; no gc on receive) and restored
into an empty directory. In the same run, interleaved round by round so that
a busy machine slows all of them alike (each starts after a `sync`, so none
pays for another's writeback), it times:

- ../shared/bench/seed_recipe.sh (zstd, and gzip unless --no-gzip) on the
  same data;
- the floor `tar -C SRC -cf - . | tar -C DEST -xf -`, and the physical
  floor: the same bytes written as one file while the same number of empty
  files is created in parallel (one process per core);
- bytes on the wire: for a publish, the pack bytes the bare repository
  received; for a local restore, the growth of the clone's private stores
  (`.git/warmstart`), and for the seed recipe the pack it fetches; through
  the relay, the bytes the relay carried;
- restores through a local relay limited to --relay-mbps (default 50 MB/s):
  a TCP proxy (asyncio, one token bucket per direction) in front of a smart
  HTTP server (`git http-backend`), so warmstart takes the path it takes to
  GitHub; the relay's own CPU time (getrusage in the relay process) is
  reported per restore;
- an incremental round: 1% of the files (about 1% of the bytes) rewritten
  with new content of the same size, in 3 contiguous ranges of the path
  order, one early in the tar, under a new cache key; publish it (bytes
  pushed), then restore the new key into the clones that have the old key
  installed (bytes fetched, time; locally and through the relay); the seed
  recipe's refresh (publish and restore again) for comparison. The same
  change is also published from a fresh clone of the work repository (no
  record of the last publish: it reads everything) to a copy of the remote
  as the full publish left it; then a second change (the same files
  rewritten again) is published and restored over the first delta's
  install: the delta after a delta.

--workload many-files replaces the sysroot with a generated tree of many
small files (make_many_files_tree: about 50,000 HTML-like pages of 2-20 KB
that compress 30-50x, in directories 3-6 deep of 20-200 pages, and 300 pages
of 100 KB - 2 MB; a fixed seed, so every run builds the same tree).

It reports medians, ratios from this run only (and the issue's targets),
peak RSS (wait4's ru_maxrss: the largest single process of the contender's
tree, which is what bounds memory), also at a second, small size (a
generated ~40 MB tree), the warm `cache restore` (median of 15 runs), and
with --cold-build a truly cold `cargo build -p warmstart` (fresh
CARGO_TARGET_DIR, --timings; wall, user and sys CPU seconds).

--variant NAME='TOML' (repeatable) measures several publish settings in one
run: each variant is its own cache (work repository, remote, clones) with
TOML appended to its manifest's [publish] table (`;` separates lines), e.g.
--variant l3='level = 3' --variant l19='level = 19'. The targets use the
first variant.

It measures the DEV build of xtask by default, because that is what users run
through the `cargo xtask` alias (root Cargo.toml optimises the hashing and
compression crates even there); --release measures the release build.

    tools/bench-cache.py                      # full run on the sysroot, 3 rounds
    tools/bench-cache.py --quick              # small generated tree, 1 round (CI smoke test, ~25 s)
    tools/bench-cache.py --workload many-files --no-gzip   # the many-small-files tree, 3 rounds
    tools/bench-cache.py --source DIR --runs 5 --json out.json
    tools/bench-cache.py --cold-build         # also the cold build of xtask
    TMPDIR=/dev/shm tools/bench-cache.py --runs 2 --no-gzip   # scratch on tmpfs

On tmpfs (TMPDIR=/dev/shm) each restored tree is deleted as soon as it is
measured; elsewhere they are kept until the end (see the comment in main).

It asserts nothing about times: it measures and prints Markdown tables and JSON
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
MB = 1e6


def cargo_target_dir():
    """Cargo's target directory as cargo resolves it (CARGO_TARGET_DIR, config, or ./target)."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps"], cwd=ROOT, capture_output=True, text=True
    )
    if out.returncode != 0:
        sys.exit(f"bench-cache: cargo metadata failed: {out.stderr.strip()}")
    return Path(json.loads(out.stdout)["target_directory"])


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def find_seed_recipe():
    env = os.environ.get("SEED_RECIPE")
    cands = [Path(env)] if env else []
    cands += [ROOT.parent / "shared/bench/seed_recipe.sh", Path("/work/shared/bench/seed_recipe.sh")]
    # The tests' verbatim copy: a clone on its own (GitHub's runners) has no shared/.
    cands += [ROOT / "tests/it/cache_restore/seed_recipe.sh"]
    for cand in cands:
        if cand.exists():
            return cand.resolve()
    sys.exit("bench-cache: ../shared/bench/seed_recipe.sh not found; set SEED_RECIPE")


def git_env(home):
    env = dict(os.environ)
    for k in list(env):
        if k.startswith(("GIT_", "WARMSTART_", "BENCH_CACHE_")):
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


class Sample(dict):
    """One timed run: wall s, peak RSS MiB, CPU s, and what else was measured
    (wire bytes, relay CPU, the binary's --json)."""

    @property
    def wall(self):
        return self["wall"]


def run_timed(argv, env, cwd=None, shell=False):
    """Runs a command to completion; returns a Sample with wall, rss, cpu and its stdout.

    Every contender starts with nothing dirty in the page cache (`sync`,
    untimed): otherwise the contender after a big writer pays for that
    writer's writeback. In one run without it, the seed recipe's restore
    (early in the round) and ours (late, right after the seed recipe's gzip
    restore wrote 1.3 GB) measured 17.9 and 4.2 s in round 1, then 18.1 and
    6.8 s in round 2, the floor (also late) 4.6 then 12.3 s."""
    subprocess.run(["sync"], check=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as errf:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, shell=shell, stdout=out, stderr=errf)
        _, status, ru = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        errf.seek(0)
        stdout, err = out.read(), errf.read()
    if proc.returncode != 0:
        raise SystemExit(
            f"bench-cache: {argv!r} failed with exit code {proc.returncode}:\n{err.decode(errors='replace')}"
        )
    if err.strip():
        log(err.decode(errors="replace").rstrip())
    return Sample(wall=elapsed, rss=ru.ru_maxrss / 1024.0, cpu=ru.ru_utime + ru.ru_stime, stdout=stdout)


def git(env, *args, cwd=None):
    subprocess.run(["git", *args], env=env, cwd=cwd, check=True, stdout=subprocess.DEVNULL)


def bare_remote(env, path):
    rm(path)
    git(env, "init", "-q", "--bare", str(path))
    git(env, "config", "receive.unpackLimit", "1", cwd=path)
    # Partial clone, as on GitHub and GitLab: `cache restore` fetches the
    # branch without its chunks, then the chunks by id while unpacking.
    git(env, "config", "uploadpack.allowFilter", "true", cwd=path)
    # The received packs are what a publish sent: no gc may repack them.
    git(env, "config", "receive.autogc", "false", cwd=path)
    git(env, "config", "gc.auto", "0", cwd=path)


def pack_bytes(repo):
    """Bytes of the packs in a bare repository (with unpackLimit 1, what pushes sent)."""
    return sum(p.stat().st_size for p in (repo / "objects/pack").glob("*.pack"))


def dir_bytes(path):
    """Apparent size of every file under path (0 when it does not exist)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


def rm(path):
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)


def on_tmpfs(path):
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "tmpfs"


def make_small_tree(dest, dirs=20, big=8 << 20):
    """About 40 MB of mixed files (with the defaults): random (incompressible) and repetitive text."""
    rng = random.Random(7)
    for d in range(dirs):
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
    (dest / "big.bin").write_bytes(rng.randbytes(big) * 2)


WORDS = (
    "the of and to in is for on with as by at from that this which cache restore branch chunk commit key "
    "tree file index record delta publish verify signer gate remote clone store frame stream hash link"
).split()


def make_many_files_tree(dest, seed=27, files=50_000, big=300):
    """The many-files workload, from a fixed seed: `files` HTML-like pages of
    2-20 KB (log-uniform: 7.8 KB on average) in directories 3-6 deep whose
    pages number 20-200 each, and `big` larger pages of 100 KB - 2 MB
    (log-uniform). A page is a shared head and navigation, then paragraphs
    drawn from a pool of 200 (a site's pages repeat each other's text), each
    with a page-specific anchor: the tar compresses about 30-50x with zstd.
    Paths, sizes and contents depend only on the seed."""
    rng = random.Random(seed)
    head = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<link rel="stylesheet" href="/static/site.css"><script src="/static/site.js"></script>'
    )
    nav = "".join(f'<a href="/{w}/index.html">{w}</a> ' for w in WORDS[:24])
    pool = []
    for _ in range(200):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(100, 300)))
        pool.append(f'<p class="c{rng.randrange(8)}">{words}</p>\n')

    def page(n, title):
        out = [head, f"<title>{title}</title></head><body><nav>{nav}</nav><main>\n"]
        size = sum(len(x) for x in out)
        while size < n:
            line = rng.choice(pool)
            if rng.random() < 0.1:
                line = f'<h2 id="s{size}">{title}</h2>\n' + line
            out.append(line)
            size += len(line)
        out.append("</main></body></html>\n")
        return "".join(out).encode()[:n]

    def log_uniform(lo, hi):
        return int(lo * (hi / lo) ** rng.random())

    dirs = [(dest, 0)]
    leaves = []
    # Breadth-first: directories above depth 3 hold only directories; from
    # depth 3 to 6 a directory holds pages, and half of those above depth 6
    # one to three sub-directories too.
    while dirs:
        d, depth = dirs.pop(0)
        d.mkdir(parents=True, exist_ok=True)
        if depth < 3:
            dirs.extend((d / f"{rng.choice(WORDS)}-{i}", depth + 1) for i in range(rng.randrange(3, 6)))
            continue
        leaves.append(d)
        if depth < 6 and rng.random() < 0.5:
            dirs.extend((d / f"part-{i}", depth + 1) for i in range(rng.randrange(1, 4)))
    counts = [rng.randrange(20, 201) for _ in leaves]
    scale = files / sum(counts)
    counts = [max(20, min(200, round(c * scale))) for c in counts]
    made = 0
    for d, count in zip(leaves, counts):
        for i in range(count):
            (d / f"page-{i:03}.html").write_bytes(page(log_uniform(2_000, 20_000), f"{d.name} {i}"))
            made += 1
    # Rounding left the count short or over: top up, or stop, at the leaves in turn.
    i = 0
    while made < files:
        d = leaves[i % len(leaves)]
        (d / f"more-{i:05}.html").write_bytes(page(log_uniform(2_000, 20_000), f"more {i}"))
        made += 1
        i += 1
    for i in range(big):
        d = leaves[rng.randrange(len(leaves))]
        (d / f"big-{i:03}.html").write_bytes(page(log_uniform(100_000, 2_000_000), f"big {i}"))


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


def regular_files_in_tar_order(src):
    """(relative path, size) of every non-empty regular file, sorted by path bytes as the tar is."""
    out = []
    for dirpath, _, filenames in os.walk(src):
        for name in filenames:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if st.st_size > 0 and (st.st_mode & 0o170000) == 0o100000:
                out.append((os.path.relpath(full, src), st.st_size))
    out.sort(key=lambda e: os.fsencode(e[0]))
    return out


def pick_change(files, share=0.01, ranges=3):
    """The incremental round's change: `ranges` contiguous runs of the path
    order holding about `share` of the files and of the bytes, the first
    one early in the tar (the earliest run within half its share of the
    bytes that starts in the first 10% of bytes or 5% of files), the others
    starting in 35-55% and 70-90% of the files. Each run is the one there
    that comes closest to its share of the bytes: the sysroot mixes tiny and
    200 MB files (its first 10% of bytes are a dozen binaries), so file
    count and bytes only agree where chosen. The early run may hold fewer
    files; the others then share the rest of the count."""
    n = len(files)
    want_files = max(ranges, round(n * share))
    want_bytes = sum(s for _, s in files) * share
    cum = [0]
    for _, s in files:
        cum.append(cum[-1] + s)
    total = cum[-1]
    per = max(1, want_files // ranges)
    early = [i for i in range(n) if cum[i] <= 0.10 * total or i < max(1, n // 20)]

    def off(c):
        return abs(cum[c[0] + c[1]] - cum[c[0]] - want_bytes / ranges)

    # The earliest run within half its share of the bytes, else the closest.
    lo, length = min(
        ((i, k) for i in early for k in range(1, min(per, n - i) + 1)),
        key=lambda c: (off(c) > want_bytes / ranges / 2, cum[c[0]] if off(c) <= want_bytes / ranges / 2 else 0, off(c)),
    )
    picked = [(lo, lo + length)]
    rest = ranges - 1
    if rest:
        per = max(1, (want_files - length) // rest)
        want = max(0.0, want_bytes - (cum[lo + length] - cum[lo])) / rest
        for zlo, zhi in [(0.35, 0.55), (0.70, 0.90)][:rest]:
            first = max(int(n * zlo), picked[-1][1])
            last = max(first, min(int(n * zhi), n - per))
            best = min(range(first, last + 1), key=lambda i: abs(cum[i + per] - cum[i] - want))
            picked.append((best, min(n, best + per)))
    return picked


def rewrite(path, seed, flip=0xFF):
    """New content of the same size and about the same compressibility: one
    byte in every 4 KiB flipped, so no 4 KiB of the file is as before. The
    second change flips with another mask, so its files differ from both
    earlier versions."""
    data = bytearray(Path(path).read_bytes())
    for i in range(seed % 4096 % max(1, len(data)), len(data), 4096):
        data[i] ^= flip
    Path(path).write_bytes(bytes(data))


def make_changed_copy(src, dest, flip=0xFF):
    """A copy of src with the incremental round's change; returns the changed paths and a description."""
    subprocess.run(["cp", "-a", f"{src}/.", str(dest)], check=True)
    files = regular_files_in_tar_order(dest)
    ranges = pick_change(files)
    changed_files = changed_bytes = 0
    for lo, hi in ranges:
        for i in range(lo, hi):
            rewrite(dest / files[i][0], i, flip)
            changed_files += 1
            changed_bytes += files[i][1]
    total = sum(s for _, s in files)
    paths = [files[i][0] for lo, hi in ranges for i in range(lo, hi)]
    return paths, {
        "ranges": [{"first": files[lo][0], "last": files[hi - 1][0], "files": hi - lo, "at_file": lo} for lo, hi in ranges],
        "files": changed_files,
        "bytes": changed_bytes,
        "share_of_files": changed_files / max(1, len(files)),
        "share_of_bytes": changed_bytes / max(1, total),
    }


# ---- helper processes: the smart HTTP server, the relay, the physical floor.


def serve_http(base):
    """`--serve-http BASE`: smart HTTP for every repository under BASE
    (`git http-backend` as CGI, one thread per request, protocol v2 passed
    through), on 127.0.0.1; prints its port, serves until killed."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            self.cgi()

        def do_POST(self):
            self.cgi()

        def body(self):
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        self.rfile.readline()
                        return b"".join(parts)
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def cgi(self):
            path, _, query = self.path.partition("?")
            body = self.body()
            env = dict(
                os.environ,
                GIT_PROJECT_ROOT=base,
                GIT_HTTP_EXPORT_ALL="1",
                PATH_INFO=path,
                QUERY_STRING=query,
                REQUEST_METHOD=self.command,
                CONTENT_TYPE=self.headers.get("Content-Type", ""),
                CONTENT_LENGTH=str(len(body)),
                REMOTE_ADDR="127.0.0.1",
            )
            for header, var in [("Git-Protocol", "GIT_PROTOCOL"), ("Content-Encoding", "HTTP_CONTENT_ENCODING")]:
                if self.headers.get(header):
                    env[var] = self.headers[header]
            proc = subprocess.Popen(["git", "http-backend"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)

            def feed():
                proc.stdin.write(body)
                proc.stdin.close()

            threading.Thread(target=feed, daemon=True).start()
            status, headers = 200, []
            while True:
                line = proc.stdout.readline()
                if line in (b"\r\n", b"\n", b""):
                    break
                k, v = line.decode().split(":", 1)
                if k.lower() == "status":
                    status = int(v.split()[0])
                else:
                    headers.append((k, v.strip()))
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            while chunk := proc.stdout.read1(1 << 16):
                self.wfile.write(chunk)
            proc.wait()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def serve_relay(target_port, mbps):
    """`--serve-relay PORT MBPS`: a TCP proxy on 127.0.0.1 in front of
    127.0.0.1:PORT, each direction limited to MBPS (1 MB = 10^6 bytes) by one
    token bucket shared by all connections, as one link would be. Prints
    its port; on each `stats` line on stdin prints one JSON line: bytes
    each way so far and its own CPU seconds (getrusage)."""
    import asyncio
    import resource
    import threading

    rate = mbps * MB
    counters = {"down": 0, "up": 0}

    class Bucket:
        # Debt-based: a reader takes its bytes at once and sleeps off the
        # debt, so concurrent connections share the rate in arrival order.
        burst = 256 << 10

        def __init__(self):
            self.tokens = float(self.burst)
            self.at = time.monotonic()

        async def take(self, n):
            now = time.monotonic()
            self.tokens = min(self.burst, self.tokens + (now - self.at) * rate) - n
            self.at = now
            if self.tokens < 0:
                await asyncio.sleep(-self.tokens / rate)

    buckets = {"down": Bucket(), "up": Bucket()}

    async def pipe(reader, writer, way):
        try:
            while data := await reader.read(64 << 10):
                await buckets[way].take(len(data))
                counters[way] += len(data)
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
        except (ConnectionError, OSError):
            pass

    async def handle(creader, cwriter):
        try:
            sreader, swriter = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(pipe(creader, swriter, "up"), pipe(sreader, cwriter, "down"))
        for w in (swriter, cwriter):
            w.close()

    def control():
        for line in sys.stdin:
            if line.strip() == "stats":
                ru = resource.getrusage(resource.RUSAGE_SELF)
                print(json.dumps(dict(counters, cpu=ru.ru_utime + ru.ru_stime)), flush=True)
        os._exit(0)

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        threading.Thread(target=control, daemon=True).start()
        await server.serve_forever()

    asyncio.run(main())


def physical_floor(dest, nbytes, nfiles):
    """`--physical-floor DEST BYTES FILES`: BYTES written as one file while
    FILES empty files (1,000 a directory) are created by one process per
    core: what any restore must at least do to the file system."""
    dest = Path(dest)
    dest.mkdir()
    dirs = [dest / f"d{i}" for i in range((nfiles + 999) // 1000)]
    for d in dirs:
        d.mkdir()
    procs = os.cpu_count() or 1
    pids = []
    for w in range(procs):
        pid = os.fork()
        if pid == 0:
            for i in range(w, nfiles, procs):
                os.close(os.open(f"{dirs[i // 1000]}/f{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            os._exit(0)
        pids.append(pid)
    buf = bytes(8 << 20)
    fd = os.open(dest / "data", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    left = nbytes
    while left > 0:
        left -= os.write(fd, buf[: min(left, len(buf))])
    os.close(fd)
    status = 0
    for pid in pids:
        status |= os.waitpid(pid, 0)[1]
    sys.exit(1 if status else 0)


class Helper:
    """A helper process of this script (the HTTP server or the relay) that
    prints its port first; stopped by its own pid."""

    def __init__(self, args, env):
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.strip().isdigit():
            raise SystemExit(f"bench-cache: helper {args[0]} did not start")
        self.port = int(line)

    def stats(self):
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def stop(self):
        self.proc.kill()
        self.proc.wait()


class Relay:
    """The smart HTTP server on BASE and the rate-limited relay in front of it."""

    def __init__(self, base, env, mbps):
        self.http = Helper(["--serve-http", str(base)], env)
        self.relay = Helper(["--serve-relay", str(self.http.port), str(mbps)], env)
        self.base = base

    def url(self, repo):
        return f"http://127.0.0.1:{self.relay.port}/{repo.relative_to(self.base)}"

    def measure(self, run):
        """Runs run() (which returns a Sample) and adds the relay's bytes and CPU to it."""
        before = self.relay.stats()
        s = run()
        after = self.relay.stats()
        s["wire_bytes"] = after["down"] - before["down"]
        s["wire_bytes_up"] = after["up"] - before["up"]
        s["relay_cpu"] = after["cpu"] - before["cpu"]
        return s

    def stop(self):
        self.relay.stop()
        self.http.stop()


# ---- the contenders.


class Ours:
    """warmstart's publish and restore of one source tree, through the real binary.

    The manifest's key is a `file` pin and its pack root a variable, so the
    same cache publishes the old tree under one key and the changed tree
    under another (the incremental round)."""

    def __init__(self, base, name, xtask, env, publish_toml=""):
        self.base = base / name
        self.base.mkdir(parents=True)
        self.xtask = str(xtask)
        self.env = env
        self.work = self.base / "work"
        self.remote = self.base / "remote.git"
        self.keys = {}
        for which in ("old", "new", "new2"):
            self.keys[which] = self.base / f"key-{which}"
            self.keys[which].write_text(which + "\n")
        git(env, "init", "-q", "-b", "main", str(self.work))
        (self.work / "cache-manifests").mkdir()
        publish = "".join(line.strip() + "\n" for line in publish_toml.split(";") if line.strip())
        (self.work / "cache-manifests/bench.toml").write_text(
            '[[key]]\nname = "v"\nfile = "${BENCH_CACHE_KEYFILE}"\n\n'
            '[pack]\nroot = "${BENCH_CACHE_SRC}"\n\n'
            '[restore]\npath = "${WARMSTART_BENCH_DEST}"\n' + (f"\n[publish]\n{publish}" if publish else "")
        )
        git(env, "add", "-A", cwd=self.work)
        git(env, "commit", "-q", "-m", "bench", cwd=self.work)

    def run_env(self, which, src, dest):
        return dict(
            self.env,
            BENCH_CACHE_KEYFILE=str(self.keys[which]),
            BENCH_CACHE_SRC=str(src),
            WARMSTART_BENCH_DEST=str(dest),
        )

    def make_tree(self, src):
        """The publisher's own working tree, a copy of src that each round
        edits in place as a publisher does (`set_tree`), so that its last
        publish's record (same root, same inodes) can vouch for the files
        that did not change."""
        self.tree = self.base / "tree"
        subprocess.run(["cp", "-a", f"{src}/.", str(self.tree)], check=True)

    def set_tree(self, root, paths):
        """Rewrites `paths` of the working tree in place (same inodes)
        with their content under `root`."""
        for p in paths:
            shutil.copyfile(root / p, self.tree / p)

    def publish(self, src):
        """A cold publish: fresh remote, no local cache state."""
        bare_remote(self.env, self.remote)
        rm(self.work / ".git/warmstart")
        return self.republish("old", src)

    def republish(self, which, src):
        """A publish from the same clone; wire_bytes is what the remote received."""
        argv = [self.xtask, "cache", "publish", "bench", "--json", "--remote", str(self.remote)]
        before = pack_bytes(self.remote)
        s = run_timed(argv, self.run_env(which, src, self.base / "unused"), cwd=self.work)
        s["wire_bytes"] = pack_bytes(self.remote) - before
        s["json"] = summary(s.pop("stdout"))
        return s

    def keep_remote(self):
        """A copy of the remote as the full publish left it, for the
        fresh-clone publisher, who publishes the same change to it."""
        self.remote_before = self.base / "remote-before.git"
        rm(self.remote_before)
        subprocess.run(["cp", "-a", str(self.remote), str(self.remote_before)], check=True)

    def publish_fresh_clone(self, which, src):
        """A publish of `which` from a fresh clone of the work repository
        (no record of an earlier publish: it reads everything), to the copy
        of the remote before the own-clone publish of the same key."""
        clone = self.clone(self.base / "fresh-publisher")
        argv = [self.xtask, "cache", "publish", "bench", "--json", "--remote", str(self.remote_before)]
        before = pack_bytes(self.remote_before)
        s = run_timed(argv, self.run_env(which, src, self.base / "unused"), cwd=clone)
        s["wire_bytes"] = pack_bytes(self.remote_before) - before
        s["json"] = summary(s.pop("stdout"))
        rm(clone)
        return s

    def clone(self, path):
        rm(path)
        git(self.env, "clone", "-q", str(self.work), str(path))
        return path

    def restore(self, clone, which, src, dest, remote=None):
        """A restore in `clone` into `dest` (cold when both are new, an
        update when another key is installed there); wire_bytes is the growth
        of the clone's private stores."""
        argv = [self.xtask, "cache", "restore", "bench", "--json", "--remote", remote or str(self.remote)]
        before = dir_bytes(clone / ".git/warmstart")
        s = run_timed(argv, self.run_env(which, src, dest), cwd=clone)
        s["store_bytes"] = dir_bytes(clone / ".git/warmstart") - before
        s.setdefault("wire_bytes", s["store_bytes"])
        s["json"] = summary(s.pop("stdout"))
        return s


def summary(stdout):
    """The parts of a --json document worth keeping with a sample."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    keep = {}
    for k, v in doc.items():
        if k == "chunks" and isinstance(v, list):
            keep["chunk_count"] = len(v)
            keep["chunks_reused"] = sum(1 for c in v if c.get("reused"))
            # Which chunks a refresh shares with the publish before it.
            keep["chunk_sha256s"] = sorted({c.get("sha256") for c in v})
        elif k in ("trust", "remote", "key_parts", "keys_on_branch", "tar_sha256", "commit", "previous_commit"):
            continue
        elif not isinstance(v, (list, dict)) or k == "timings_ms":
            keep[k] = v
    return keep


class Seed:
    """../shared/bench/seed_recipe.sh with one compression, on its own bare repository."""

    def __init__(self, base, script, comp, env):
        self.script, self.comp, self.env = str(script), comp, env
        self.remote = base / f"seed-{comp}.git"
        self.branch = f"seed-{comp}"

    def publish(self, src, fresh=True):
        if fresh:
            bare_remote(self.env, self.remote)
        before = pack_bytes(self.remote)
        s = run_timed(["bash", self.script, "publish", str(src), str(self.remote), self.branch, self.comp], self.env)
        s["wire_bytes"] = pack_bytes(self.remote) - before
        self.last_pack = s["wire_bytes"]
        return s

    def restore(self, dest, remote=None):
        s = run_timed(["bash", self.script, "restore", remote or str(self.remote), self.branch, str(dest), self.comp], self.env)
        # A depth-1 fetch of the branch: the pack its publish sent.
        s["wire_bytes"] = self.last_pack
        return s
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




def parse_args():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small generated tree, one round, no gzip (CI smoke test)")
    ap.add_argument("--source", help="tree to publish (default: rustc --print sysroot)")
    ap.add_argument(
        "--workload",
        choices=["sysroot", "many-files"],
        default="sysroot",
        help="many-files: generate the many-small-files tree (54k HTML-like files, fixed seed) instead of the sysroot",
    )
    ap.add_argument("--runs", type=int, help="interleaved rounds (default 3, or 1 with --quick)")
    ap.add_argument("--no-gzip", action="store_true", help="skip the seed recipe's gzip variant")
    ap.add_argument("--release", action="store_true", help="measure the release build instead of the dev build")
    ap.add_argument("--xtask", help="measure this xtask binary (no build)")
    ap.add_argument("--cold-build", action="store_true", help="also time a cold `cargo build -p warmstart`")
    ap.add_argument("--json", help="also write the JSON result to this file")
    ap.add_argument("--relay-mbps", type=float, default=50.0, help="the relay's limit each way, in MB/s (default 50)")
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=TOML",
        help="a warmstart contender whose manifest's [publish] table gets TOML (`;` between lines); repeatable",
    )
    skips = ["seed", "floor", "relay", "incremental", "small", "warm"]
    ap.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(skips)}")
    args = ap.parse_args()
    args.skip = {s for s in args.skip.split(",") if s}
    if args.skip - set(skips):
        ap.error(f"--skip takes {', '.join(skips)}, not {', '.join(sorted(args.skip - set(skips)))}")
    variants = []
    for v in args.variant:
        name, eq, toml = v.partition("=")
        if not eq or not name or not all(c.isalnum() or c in "-_." for c in name):
            ap.error(f"--variant takes NAME=TOML with a plain NAME, not {v!r}")
        variants.append((name, toml))
    if len({n for n, _ in variants}) != len(variants):
        ap.error("--variant names must differ")
    args.variants = variants or [("", "")]
    return args


def label(kind, name):
    return f"{kind}: warmstart" + (f" [{name}]" if name else "")


class Samples:
    def __init__(self):
        self.by = {}

    def record(self, name, s):
        s.pop("stdout", None)
        self.by.setdefault(name, []).append(s)
        extra = ""
        if "wire_bytes" in s:
            extra += f", {s['wire_bytes'] / MB:.1f} MB on the wire"
        if "relay_cpu" in s:
            extra += f", relay cpu {s['relay_cpu']:.1f} s"
        j = s.get("json") or {}
        for k in ("chunks_reused", "chunks_unchanged", "files_linked", "files_hashed", "delta_fallback"):
            if j.get(k) is not None:
                extra += f", {k} {j[k]}"
        log(f"  {name}: {s.wall:.2f} s, {s['rss']:.0f} MiB, cpu {s['cpu']:.1f} s{extra}")

    def med(self, name, key="wall"):
        vals = [s[key] for s in self.by.get(name, []) if s.get(key) is not None]
        return statistics.median(vals) if vals else None

    def ratio(self, a, b, key="wall"):
        x, y = self.med(a, key), self.med(b, key)
        return x / y if x is not None and y else None


def check_same(paths, want_root, got_root, what):
    """The incremental restore really installed the new content."""
    for p in paths:
        if (want_root / p).read_bytes() != (got_root / p).read_bytes():
            raise SystemExit(f"bench-cache: {what} left {p} with other content than the new key's")


def main():
    args = parse_args()
    runs = args.runs or (1 if args.quick else 3)
    gzip = not (args.no_gzip or args.quick)
    skip = args.skip

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
        xtask = cargo_target_dir() / ("release" if args.release else "debug") / "warmstart"

    base = Path(tempfile.mkdtemp(prefix="warmstart-bench-"))
    relay = None
    try:
        home = base / "home"
        home.mkdir()
        env = git_env(home)
        small_src = base / "small-src"
        # --quick runs every contender on a smaller tree (about 20 MB), to
        # stay a smoke test: about 25 s on a loaded 2-core machine.
        make_small_tree(small_src, *((8, 2 << 20) if args.quick else ()))
        if args.quick:
            src = small_src
        elif args.workload == "many-files" and not args.source:
            src = base / "many-files"
            log("bench-cache: generating the many-files tree")
            make_many_files_tree(src)
        else:
            src = Path(
                args.source
                or subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
            )
        files, size = tree_stats(src)
        log(f"bench-cache: source {src} ({files} files, {size / 1e6:.0f} MB), {runs} round(s), {build} build {xtask}")
        tmpfs = on_tmpfs(base)
        ctx = Context(args, base, env, src, files, size, xtask, seed, gzip, tmpfs)
        if "relay" not in skip:
            relay = Relay(base, env, args.relay_mbps)
            ctx.relay = relay
        ctx.prepare()
        for r in range(runs):
            log(f"round {r + 1}/{runs}")
            ctx.round(r)
        if "small" not in skip and not args.quick:
            small_files, small_size = tree_stats(small_src)
            log(f"small size for peak RSS: {small_files} files, {small_size / 1e6:.0f} MB")
            small = Ours(base, "small", xtask, env)
            ctx.s.record("publish: warmstart (small tree)", small.publish(small_src))
            clone = small.clone(base / "small-clone")
            ctx.s.record(
                "restore: warmstart (small tree)", small.restore(clone, "old", small_src, base / "small-dest")
            )
        build_result = cold_build(base, args.release) if args.cold_build else None
        report(ctx, build, build_result, runs)
    finally:
        if relay:
            relay.stop()
        shutil.rmtree(base, ignore_errors=True)


class Context:
    """One run: the contenders, their trees and the samples."""

    def __init__(self, args, base, env, src, files, size, xtask, seed, gzip, tmpfs):
        if (args.runs or 3) < 3 and not args.quick:
            log("bench-cache: fewer than 3 rounds: the publish ratios need medians of at least 3")
        self.args, self.base, self.env, self.src, self.files, self.size = args, base, env, src, files, size
        self.skip = args.skip
        self.tmpfs = tmpfs
        self.relay = None
        self.s = Samples()
        self.ours = [(name, Ours(base, f"ours-{i}", xtask, env, toml)) for i, (name, toml) in enumerate(args.variants)]
        self.seeds = [] if "seed" in self.skip else [Seed(base, seed, c, env) for c in (["zst", "gz"] if gzip else ["zst"])]
        self.change = None
        self.keep_trees = True
        self.runs = args.runs or (1 if args.quick else 3)

    def prepare(self):
        for _, o in self.ours:
            o.make_tree(self.src)
        # A file changed within 2 s before a publish planned is read again by
        # the next publish whatever its stat (the racy window): the copies
        # must be older than that when the first publish plans.
        t_trees = time.monotonic()
        if "incremental" not in self.skip:
            self.src2 = self.base / "src-changed"
            self.changed, self.change = make_changed_copy(self.src, self.src2)
            # The second change: the same share of files rewritten again
            # (another mask), over the first, for the delta after a delta.
            self.src3 = self.base / "src-changed-2"
            self.changed2, _ = make_changed_copy(self.src2, self.src3, flip=0x5A)
            time.sleep(max(0.0, 2.1 - (time.monotonic() - t_trees)))
            c = self.change
            log(
                f"incremental round: {c['files']} files ({c['share_of_files']:.2%}), {c['bytes'] / MB:.1f} MB "
                f"({c['share_of_bytes']:.2%}) rewritten in {len(c['ranges'])} ranges starting at files "
                + ", ".join(str(x["at_file"]) for x in c["ranges"])
            )
        # Restored trees are kept until the end of the run on a disk: on
        # ext4 without a journal (this machine's /) inode allocation skips
        # inodes freed in the last 60-300 s one by one (fs/ext4/ialloc.c,
        # recently_deleted), so a restore made within minutes of an `rm -rf`
        # of a 58k-file tree pays for the deletion (perf: 45% of a restore's
        # samples; a round that deleted the previous round's trees first
        # measured every restore 2-5x slower). On tmpfs nothing like it
        # happens, and the trees are memory: each is deleted once measured.
        # On a disk too small, they are deleted at the start of each round
        # (and synced), which the log and the JSON say.
        if self.tmpfs:
            log(f"bench-cache: scratch {self.base} is tmpfs: each restored tree is deleted once measured")
            return
        per_round = (len(self.seeds) * 2 + 4 * len(self.ours) + 2) * self.size
        self.keep_trees = shutil.disk_usage(self.base).free > self.runs * per_round * 1.3 + (4 << 30)
        if not self.keep_trees:
            log(
                "bench-cache: not enough free disk to keep every round's restored trees; deleting them at the "
                "start of each round, which slows the restores that follow (see the comment in the code)"
            )

    def done(self, *paths):
        if self.tmpfs:
            for p in paths:
                rm(p)

    def round(self, r):
        s, src, skip = self.s, self.src, self.skip
        dests = self.base / f"dests-{r}"
        if not self.keep_trees:
            rm(self.base / f"dests-{r - 1}")
            subprocess.run(["sync"], check=True)
        dests.mkdir()
        # Every contender that reads the source starts from a warm page cache.
        # Ours publishes its working tree (`Ours.make_tree`), set back to
        # the old content.
        for name, o in self.ours:
            if "incremental" not in skip:
                o.set_tree(src, self.changed)
            warm(o.tree)
            s.record(label("publish", name), o.publish(o.tree))
        for sd in self.seeds:
            warm(src)
            s.record(f"publish: seed recipe {sd.comp}", sd.publish(src))
            d = dests / f"seed-{sd.comp}"
            s.record(f"restore: seed recipe {sd.comp}", sd.restore(d))
            self.done(d)
        for name, o in self.ours:
            warm(o.tree)
            s.record(label("re-publish unchanged", name), o.republish("old", o.tree))
            if "incremental" not in skip:
                o.keep_remote()
        trees = {}
        for i, (name, o) in enumerate(self.ours):
            local = (o.clone(dests / f"clone-{i}-local"), dests / f"ours-{i}-local")
            s.record(label("restore", name), o.restore(local[0], "old", src, local[1]))
            if r == 0 and i == 0 and "warm" not in skip:
                for _ in range(15):
                    s.record("warm restore: warmstart", o.restore(local[0], "old", src, local[1]))
            trees[i] = [local]
        if "floor" not in skip:
            d = dests / "floor"
            d.mkdir()
            warm(src)
            s.record("floor: tar | tar", run_timed(f"tar -C '{src}' -cf - . | tar -C '{d}' -xf -", self.env, shell=True))
            self.done(d)
            d = dests / "physical"
            argv = [sys.executable, str(Path(__file__).resolve()), "--physical-floor", str(d), str(self.size), str(self.files)]
            s.record("floor: physical (one file + empty files)", run_timed(argv, self.env))
            self.done(d)
        zst = [sd for sd in self.seeds if sd.comp == "zst"]
        if self.relay:
            rl = self.relay
            for i, (name, o) in enumerate(self.ours):
                far = (o.clone(dests / f"clone-{i}-relay"), dests / f"ours-{i}-relay")
                s.record(
                    label("restore via relay", name),
                    rl.measure(lambda: o.restore(far[0], "old", src, far[1], rl.url(o.remote))),
                )
                trees[i].append(far)
            for sd in zst:
                d = dests / "seed-zst-relay"
                s.record("restore via relay: seed recipe zst", rl.measure(lambda: sd.restore(d, rl.url(sd.remote))))
                self.done(d)
        if "incremental" not in skip:
            self.incremental(dests, trees, zst)
        for i in trees:
            for clone, dest in trees[i]:
                self.done(clone, dest)

    def incremental(self, dests, trees, zst):
        s, src2, rl = self.s, self.src2, self.relay
        for name, o in self.ours:
            # The change made in place: the own clone's record vouches for
            # every other file.
            o.set_tree(src2, self.changed)
            warm(o.tree)
            s.record(label("publish incremental", name), o.republish("new", o.tree))
            warm(src2)
            s.record(label("publish incremental, fresh clone", name), o.publish_fresh_clone("new", src2))
        for sd in zst:
            warm(src2)
            s.record("publish incremental: seed recipe zst", sd.publish(src2, fresh=False))
        for i, (name, o) in enumerate(self.ours):
            clone, dest = trees[i][0]
            s.record(label("restore incremental", name), o.restore(clone, "new", src2, dest))
            check_same(self.changed, src2, dest, label("restore incremental", name))
            if rl:
                clone, dest = trees[i][1]
                s.record(
                    label("restore incremental via relay", name),
                    rl.measure(lambda: o.restore(clone, "new", src2, dest, rl.url(o.remote))),
                )
                check_same(self.changed, src2, dest, label("restore incremental via relay", name))
        # A delta after a delta: the second change published from the same
        # clone, restored over the first delta's install.
        for i, (name, o) in enumerate(self.ours):
            o.set_tree(self.src3, self.changed2)
            warm(o.tree)
            s.record(label("publish incremental, second", name), o.republish("new2", o.tree))
            clone, dest = trees[i][0]
            s.record(label("restore incremental, second", name), o.restore(clone, "new2", self.src3, dest))
            check_same(self.changed2, self.src3, dest, label("restore incremental, second", name))
        for sd in zst:
            d = dests / "seed-zst-inc"
            s.record("restore incremental: seed recipe zst", sd.restore(d))
            self.done(d)
            if rl:
                d = dests / "seed-zst-inc-relay"
                s.record("restore incremental via relay: seed recipe zst", rl.measure(lambda: sd.restore(d, rl.url(sd.remote))))
                self.done(d)


KINDS = [
    "publish",
    "re-publish unchanged",
    "restore",
    "restore via relay",
    "publish incremental",
    "publish incremental, fresh clone",
    "restore incremental",
    "restore incremental via relay",
    "publish incremental, second",
    "restore incremental, second",
]


def targets_of(ctx, build_result):
    """The targets (BENCHMARKS.md says where each comes from), for the first
    variant; the many-files tree has its own bound for bytes pushed, and
    some ratios are only reported there."""
    s, v = ctx.s, ctx.ours[0][0]

    def r(a, b, key="wall"):
        """a of the first variant over b: another contender's label, or a kind of the same variant."""
        return s.ratio(label(a, v), b if ":" in b else label(b, v), key)

    rss = [x["rss"] for kind in KINDS for x in s.by.get(label(kind, v), [])]
    warm = s.med("warm restore: warmstart")
    w = "wire_bytes"
    many = ctx.args.workload == "many-files" and not ctx.args.source
    t = [
        ("incremental restore / cold restore (local)", r("restore incremental", "restore"), 0.25),
        (
            "incremental restore / cold restore, through the relay",
            r("restore incremental via relay", "restore via relay"),
            0.2,
        ),
        ("second incremental restore (after a delta) / cold restore", r("restore incremental, second", "restore"), 0.25),
        ("incremental publish / full publish, time, publisher's own clone", r("publish incremental", "publish"), 0.15),
        ("incremental publish / full publish, time, fresh clone", r("publish incremental, fresh clone", "publish"), 0.5),
        (
            "bytes pushed, publish after the 1% change / full publish",
            r("publish incremental", "publish", w),
            0.1 if many else 0.05,
        ),
        ("publish / seed zstd publish", r("publish", "publish: seed recipe zst"), None if many else 0.3),
        ("cold restore / physical floor (local)", r("restore", "floor: physical (one file + empty files)"), None if many else 1.6),
        ("peak RSS of every warmstart run on the big tree, MiB", max(rss) if rss else None, 160),
        ("warm restore, ms", warm * 1000 if warm is not None else None, None if many else 10),
        (
            "bytes fetched, restore of the new key (old installed) / cold restore",
            r("restore incremental", "restore", w),
            0.05,
        ),
        ("the same through the relay", r("restore incremental via relay", "restore via relay", w), 0.05),
        (
            "cold restore through the relay / seed recipe through it",
            r("restore via relay", "restore via relay: seed recipe zst"),
            0.5,
        ),
        ("restore / seed zstd restore", r("restore", "restore: seed recipe zst"), 0.35),
        ("re-publish unchanged / publish", r("re-publish unchanged", "publish"), 0.15),
        ("cold restore / tar | tar (local; retired: reported only)", r("restore", "floor: tar | tar"), None),
    ]
    if build_result:
        t.append(("cold cargo build -p warmstart, s (wall)", build_result["wall_s"], 60))
    return t


def fmt(v, digits=3):
    return "" if v is None else f"{v:.{digits}f}"


def report(ctx, build, build_result, runs):
    s = ctx.s
    targets = targets_of(ctx, build_result)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load_average": os.getloadavg(),
        "cores": os.cpu_count(),
        "build": build,
        "source": str(ctx.src),
        "files": ctx.files,
        "bytes": ctx.size,
        "runs": runs,
        "scratch_tmpfs": ctx.tmpfs,
        "restored_trees_kept_until_the_end": ctx.keep_trees and not ctx.tmpfs,
        "relay_mbps": None if ctx.relay is None else ctx.args.relay_mbps,
        "variants": [{"name": n, "publish_toml": t} for n, t in ctx.args.variants],
        "incremental_change": ctx.change,
        "samples": s.by,
        "median_seconds": {k: s.med(k) for k in s.by},
        "targets": [{"what": w, "value": v, "target": t, "met": None if t is None or v is None else v <= t} for w, v, t in targets],
        "cold_build": build_result,
    }
    print(
        f"\n{ctx.files} files, {ctx.size / 1e6:.0f} MB from `{ctx.src}`; {runs} interleaved round(s); "
        f"{build} build of xtask; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f} at the end; "
        f"{result['date']}; scratch on {'tmpfs' if ctx.tmpfs else 'disk'}"
        + ("" if ctx.relay is None else f"; relay {ctx.args.relay_mbps:g} MB/s each way")
        + "\n"
    )
    if ctx.change:
        c = ctx.change
        print(
            f"Incremental round: {c['files']} files ({c['share_of_files']:.2%}) and {c['bytes'] / MB:.1f} MB "
            f"({c['share_of_bytes']:.2%}) rewritten, ranges starting at "
            + "; ".join(f"`{x['first']}` ({x['files']} files)" for x in c["ranges"])
            + "\n"
        )
    print("| contender | median s | median CPU s | peak RSS MiB | median MB on the wire | relay CPU s | runs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k, xs in s.by.items():
        wire = s.med(k, "wire_bytes")
        print(
            f"| {k.replace('|', chr(92) + '|')} | {s.med(k):.3f} | {s.med(k, 'cpu'):.1f} | {max(x['rss'] for x in xs):.0f} "
            f"| {'' if wire is None else f'{wire / MB:.1f}'} | {fmt(s.med(k, 'relay_cpu'), 1)} | {len(xs)} |"
        )
    print("\n| target (same run) | value | target | met |")
    print("|---|---:|---:|---|")
    for w, v, t in targets:
        met = "" if t is None or v is None else ("yes" if v <= t else "NO")
        print(f"| {w.replace('|', chr(92) + '|')} | {'n/a' if v is None else f'{v:.2f}'} | {'' if t is None else f'≤ {t}'} | {met} |")
    restore_table(ctx)
    if len(ctx.ours) > 1:
        variant_table(ctx)
    if build_result:
        b = build_result
        print(f"\ncold build: {b['wall_s']:.1f} s wall, {b['user_s']:.1f} s user, {b['sys_s']:.1f} s sys")
    print()
    print(json.dumps(result, indent=2, default=str))
    if ctx.args.json:
        Path(ctx.args.json).write_text(json.dumps(result, indent=2, default=str) + "\n")


def restore_table(ctx):
    """What each warmstart restore reused, fetched and linked (its --json, last round)."""
    fields = ["chunks_fetched", "chunks_reused", "bytes_fetched", "files_linked", "bytes_linked", "chunks_skipped"]
    rows = []
    for name, _ in ctx.args.variants:
        for kind in KINDS:
            if not kind.startswith("restore") or not ctx.s.by.get(label(kind, name)):
                continue
            j = ctx.s.by[label(kind, name)][-1].get("json") or {}
            rows.append((label(kind, name), j))
    if not rows:
        return
    print("\n| restore (last round) | " + " | ".join(f.replace("_", " ") for f in fields) + " | delta fallback |")
    print("|---|" + "---:|" * len(fields) + "---|")
    for lab, j in rows:
        cells = []
        for f in fields:
            v = j.get(f)
            cells.append("" if v is None else (f"{v / MB:.1f} MB" if f.startswith("bytes") else str(v)))
        print(f"| {lab} | " + " | ".join(cells) + f" | {j.get('delta_fallback') or ''} |")


def variant_table(ctx):
    """One row per variant: what its settings cost and save (medians)."""
    s = ctx.s

    def json_med(lab, f):
        vals = [f(x["json"]) for x in s.by.get(lab, []) if x.get("json")]
        vals = [v for v in vals if v is not None]
        return statistics.median(vals) if vals else None

    def mb(v):
        return "" if v is None else f"{v / MB:.1f}"

    def new_chunks(L):
        """Chunks of the refresh that its round's full publish did not have (median over rounds)."""
        pairs = zip(s.by.get(L("publish"), []), s.by.get(L("publish incremental"), []))
        counts = [
            len(set(b["json"]["chunk_sha256s"]) - set(a["json"]["chunk_sha256s"]))
            for a, b in pairs
            if (a.get("json") or {}).get("chunk_sha256s") is not None and (b.get("json") or {}).get("chunk_sha256s") is not None
        ]
        return statistics.median(counts) if counts else None

    columns = [
        ("publish s", lambda L: fmt(s.med(L("publish")), 2)),
        ("publish CPU s", lambda L: fmt(s.med(L("publish"), "cpu"), 1)),
        ("pushed MB", lambda L: mb(s.med(L("publish"), "wire_bytes"))),
        ("chunks", lambda L: fmt(json_med(L("publish"), lambda j: j.get("chunk_count")), 0)),
        ("restore s", lambda L: fmt(s.med(L("restore")), 2)),
        ("restore CPU s", lambda L: fmt(s.med(L("restore"), "cpu"), 1)),
        ("via relay s", lambda L: fmt(s.med(L("restore via relay")), 2)),
        ("incr. pushed MB", lambda L: mb(s.med(L("publish incremental"), "wire_bytes"))),
        ("incr. new chunks", lambda L: fmt(new_chunks(L), 0)),
        ("incr. fetched MB", lambda L: mb(s.med(L("restore incremental"), "wire_bytes"))),
        ("incr. restore s", lambda L: fmt(s.med(L("restore incremental")), 2)),
        ("incr. via relay s", lambda L: fmt(s.med(L("restore incremental via relay")), 2)),
        ("peak RSS MiB", lambda L: fmt(max((x["rss"] for k in KINDS for x in s.by.get(L(k), [])), default=None), 0)),
    ]
    print("\n| variant | " + " | ".join(c for c, _ in columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name, toml in ctx.args.variants:

        def L(kind, name=name):
            return label(kind, name)

        print(f"| {name} (`{toml}`) | " + " | ".join(f(L) for _, f in columns) + " |")


if __name__ == "__main__":
    helpers = {"--serve-http": serve_http, "--serve-relay": serve_relay, "--physical-floor": physical_floor}
    if len(sys.argv) > 1 and sys.argv[1] in helpers:
        a = sys.argv[2:]
        if sys.argv[1] == "--serve-http":
            serve_http(a[0])
        elif sys.argv[1] == "--serve-relay":
            serve_relay(int(a[0]), float(a[1]))
        else:
            physical_floor(a[0], int(a[1]), int(a[2]))
    else:
        main()
