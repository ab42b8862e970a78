#!/usr/bin/env bash
# Benchmark: a cold `restore` of one plan run serially (file order, the
# default) and with `parallel = true`, interleaved in one run; medians and
# the ratio parallel / serial.
#
#   tools/bench-restore-parallel.sh              # dev build (what `cargo xtask` runs)
#   XTASK=target/release/warmstart RUNS=7 tools/bench-restore-parallel.sh
#
# The plan is shaped like the bootstrap issue 17 replaces, whose cold run
# is a sum of independent waits: a submodules step (4 suites of ~3 MB
# history each, served by `git daemon` on 127.0.0.1), two pinned downloads
# (8 MB each, python3 -m http.server on 127.0.0.1), a links farm, a pin,
# two commands that stand in for installs waiting on a registry
# (`sleep 1.5` and `sleep 1`: npm ci, opam install), and one CPU-bound build
# command (`gzip -1` of 24 MB) `after` the first of them. Each run starts from
# a fresh clone with no state (cold); the two plans differ only in the
# `parallel = true` line (the serial one also drops its `after`, which file
# order already satisfies). Nothing asserts a time: it prints numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}

for tool in python3 git; do
  command -v "$tool" >/dev/null || { echo "bench-restore-parallel: $tool is needed" >&2; exit 1; }
done
git daemon -h >/dev/null 2>&1 || [ $? -eq 129 ] || {
  echo "bench-restore-parallel: git daemon is needed (apt-get install git-daemon-sysvinit, or tools/test.sh)" >&2
  exit 1
}
if [ -z "${XTASK:-}" ]; then
  cargo build --quiet -p warmstart
  XTASK=$(tools/target-dir.sh)/debug/warmstart
fi
XTASK=$(realpath "$XTASK")

work=$(mktemp -d /tmp/bench-restore-parallel-XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=$work
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid
g() { git "$@" >/dev/null 2>&1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; return 1; }

# Suites with history: 6 commits, each rewriting a 512 KiB random file.
mkdir -p srv
for s in s1 s2 s3 s4; do
  g init -q --bare -b main "srv/$s.git"
  g init -q -b main "src-$s"
  for c in 1 2 3 4 5 6; do
    head -c 524288 /dev/urandom > "src-$s/data.bin"
    echo "suite $s rev $c" > "src-$s/run.sh"
    g -C "src-$s" add -A && g -C "src-$s" commit -q -m "rev $c"
  done
  g -C "src-$s" push -q "$work/srv/$s.git" main
done
gport=$(free_port)
git daemon --reuseaddr --export-all --listen=127.0.0.1 --port="$gport" \
  --base-path="$work/srv" "$work/srv" >/dev/null 2>&1 &
pids+=($!)
wait_port "$gport"

mkdir -p files
head -c 8388608 /dev/urandom > files/one.bin
head -c 8388608 /dev/urandom > files/two.bin
hport=$(free_port)
python3 -m http.server "$hport" --bind 127.0.0.1 --directory files >/dev/null 2>&1 &
pids+=($!)
wait_port "$hport"

g init -q --bare -b main origin.git
g init -q -b main dev
mkdir -p dev/skills
for i in $(seq -w 1 20); do mkdir -p "dev/skills/skill$i"; echo "skill $i" > "dev/skills/skill$i/SKILL.md"; done
for s in s1 s2 s3 s4; do g -C dev submodule add -q "git://127.0.0.1:$gport/$s.git" "vendor/$s"; done
g -C dev add -A && g -C dev commit -q -m "bench repository"
g -C dev push -q "$work/origin.git" main

sha() { sha256sum "$1" | cut -d' ' -f1; }
cat > plan-parallel.toml <<EOF
parallel = true

[[step]]
name = "suites"
kind = "submodules"
paths = ["vendor/s1", "vendor/s2", "vendor/s3", "vendor/s4"]
sentinel = [{ suite = "s1", path = "vendor/s1/run.sh", breaks = "make test-s1" }]

[[step]]
name = "npm"
kind = "command"
run = "sleep 1.5 && mkdir -p build/npm && touch build/npm/ready"
creates = "build/npm/ready"

[[step]]
name = "opam"
kind = "command"
run = "sleep 1 && mkdir -p build/opam && touch build/opam/ready"
creates = "build/opam/ready"

[[step]]
name = "build"
kind = "command"
after = ["npm"]
run = "head -c 25165824 /dev/urandom | gzip -1 > build/out.gz"
creates = "build/out.gz"

[[step]]
name = "tool-one"
kind = "download"
url = "http://127.0.0.1:$hport/one.bin"
sha256 = "$(sha files/one.bin)"
dest = "tools/bin/one"
executable = true

[[step]]
name = "tool-two"
kind = "download"
url = "http://127.0.0.1:$hport/two.bin"
sha256 = "$(sha files/two.bin)"
dest = "tools/bin/two"

[[step]]
name = "skills"
kind = "links"
source = "skills"
farm = ".farm/skills"
entries = "dirs"

[[step]]
name = "shell"
kind = "pin"
tool = "bash"
expect = '^GNU bash, version [45]\.'
EOF
grep -v -e '^parallel = ' -e '^after = ' plan-parallel.toml > plan-serial.toml

# One cold run of a plan: a fresh clone (not timed), then the restore (timed).
cold() {
  rm -rf box
  g clone -q "$work/origin.git" box
  mkdir -p box/cache-manifests
  cp "plan-$1.toml" box/cache-manifests/restore.toml
  local t0 t1
  t0=$(date +%s%N)
  (cd box && "$XTASK" restore --strict --json > "$work/out-$1.json") || {
    echo "bench-restore-parallel: the $1 run failed" >&2
    cat "$work/out-$1.json" >&2
    exit 1
  }
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000)) >> "times-$1"
}

echo "bench-restore-parallel: $runs interleaved cold runs of each plan (8 steps); binary $XTASK" >&2
cold serial # warm the caches of the machine (page cache, git daemon), not counted
rm -f times-serial
for i in $(seq "$runs"); do
  if [ $((i % 2)) = 1 ]; then cold serial; cold parallel; else cold parallel; cold serial; fi
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ms=$(median times-serial)
mp=$(median times-parallel)
echo "runs (ms): serial $(tr '\n' ' ' < times-serial)| parallel $(tr '\n' ' ' < times-parallel)"
echo "median ms: serial $ms, parallel $mp"
for c in serial parallel; do
  echo "last $c run, ms per step: $(python3 -c 'import json,sys; print(" ".join("%s=%s" % (r["step"], r["ms"]) for r in json.load(open(sys.argv[1]))["steps"]))' "out-$c.json")"
done
awk -v s="$ms" -v p="$mp" 'BEGIN { printf "ratio parallel / serial: %.2f\n", p / s }'
