#!/usr/bin/env bash
# Benchmark: fresh clone -> restored machine through each bootstrap path, in
# a SECOND repository that adopted warmstart (issue 15), medians of one run:
#   binary cache  git clone + the adopter's generated bootstrap script, which
#                 installs its xtask binary from the binary-cache branch with
#                 git + coreutils + zstd, then restores
#   fetch         `git fetch --depth 1` of that branch alone, in a fresh clone
#                 (the binary path minus this, per run, must be <= 0.5 s)
#   wheel         git clone + the script's registry step: a fresh venv and
#                 pip install --require-hashes of warmstart==VER from a PEP 503
#                 index on 127.0.0.1 (the pin `init --pip-hash` committed),
#                 then restore (must be <= 5 s)
#   compile       git clone + the script with no binary cache and no pin: the
#                 manifest's `cargo build --release --locked -p xtask` into the
#                 clone's empty target/, ~/.cargo/registry warm, offline
#
#   nice tools/bench-bootstrap-paths.sh                          # RUNS=5 COMPILE_RUNS=1
#   WHEEL=target/wheels/warmstart-*.whl nice tools/bench-bootstrap-paths.sh   # reuse a built wheel
#   RUNS=3 COMPILE_RUNS=1 nice tools/bench-bootstrap-paths.sh
#
# The adopter, built in a scratch directory: its own `xtask` crate
# (`fn main() { warmstart::main() }`, warmstart = { path = this checkout }),
# `warmstart init` output, a small data cache of its own in restore.toml, and
# bare origins set up like a hosting server (receive.unpackLimit 1), served
# by `git daemon` on 127.0.0.1: every clone and fetch timed here is git://.
# The compile run comes first: its binary is what the publisher publishes
# (as CI would, after its release build). The wheel (tools/build-wheel.sh) is
# the run's other release build; its binary runs init and publish.
# Background restore steps are started, not awaited (that is what a
# bootstrap does); their worker is waited for before the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
src_root=$PWD
runs=${RUNS:-5}
compile_runs=${COMPILE_RUNS:-1}
say() { echo "bench-bootstrap-paths: $*" >&2; }
if [ -z "${WHEEL:-}" ]; then
  WHEEL=$(tools/build-wheel.sh)
fi
WHEEL=$(realpath "$WHEEL")
version=$(basename "$WHEEL" | cut -d- -f2)
work=$(mktemp -d /tmp/bench-bootstrap-paths-XXXXXX)
index_pid="" daemon_pid=""
cleanup() {
  [ -z "$index_pid" ] || kill "$index_pid" 2>/dev/null || true
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid
# Loopback only: cargo builds from the warm registry, pip sees only the
# loopback index (no user or site config, no cache).
export CARGO_NET_OFFLINE=true
unset CARGO_TARGET_DIR
for v in $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 PIP_NO_CACHE_DIR=1

# The wheel's executable: it runs init and publish in the adopter.
exe=$(unzip -Z1 "$WHEEL" | sed -n "s|^warmstart-$version.data/scripts/||p")
[ -n "$exe" ] || { say "$WHEEL holds no executable under warmstart-$version.data/scripts/"; exit 1; }
mkdir -p "$work/bin"
unzip -q -o -j "$WHEEL" "warmstart-$version.data/scripts/$exe" -d "$work/bin"
BIN=$work/bin/$exe

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
bare() {
  git init -q --bare -b main "$1"
  git -C "$1" config receive.unpackLimit 1
}
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# Fails unless clone $1's bootstrap said $2 and, once its background
# worker is done, the data cache is restored.
restored() {
  wait_worker "$1"
  if ! grep -q "$2" "$1.err" || ! [ -f "$1/restored-data/hello.txt" ]; then
    say "$1: expected \"$2\" and restored-data/hello.txt"
    cat "$1.err" >&2
    exit 1
  fi
}
# Waits for a background restore worker of clone $1 to finish.
wait_worker() {
  local i
  for i in $(seq 1 600); do
    (cd "$1" && "$BIN" restore status --json 2>/dev/null) | grep -q '"running": true' || return 0
    sleep 0.5
  done
}

# ---- the adopter repository
a=$work/adopter
git init -q -b main "$a"
mkdir -p "$a/xtask/src" "$a/.cargo" "$a/target/data-src/docs"
printf '[workspace]\nmembers = ["xtask"]\nresolver = "3"\n' >"$a/Cargo.toml"
printf '[package]\nname = "xtask"\nversion = "0.1.0"\nedition = "2024"\npublish = false\n\n[dependencies]\nwarmstart = { path = "%s" }\n' \
  "$src_root/xtask" >"$a/xtask/Cargo.toml"
printf 'fn main() {\n    warmstart::main()\n}\n' >"$a/xtask/src/main.rs"
printf '[alias]\nxtask = "run --quiet --package xtask --"\n' >"$a/.cargo/config.toml"
printf '/target\n/restored-data\n' >"$a/.gitignore"
# This checkout's lockfile, so the offline build resolves the versions the
# registry already holds; cargo adds the adopter's own package to it.
cp Cargo.lock "$a/Cargo.lock"
(cd "$a" && cargo metadata --format-version 1 --offline >/dev/null)
(cd "$a" && "$BIN" init >/dev/null)
if ! cmp -s "$a/tools/warmstart-bootstrap.sh" tools/warmstart-bootstrap.sh; then
  say "the wheel's init writes another bootstrap script than tools/warmstart-bootstrap.sh: the wheel is older than the source; rebuild it (unset WHEEL)"
  exit 1
fi
for i in $(seq 1 40); do head -c 20000 /dev/urandom >"$a/target/data-src/docs/part$i.bin"; done
echo "restored by the adopter" >"$a/target/data-src/hello.txt"
printf '[pack]\nroot = "target/data-src"\n\n[restore]\npath = "restored-data"\n' >"$a/cache-manifests/data.toml"
# In the background, as every step of warmstart's own restore.toml: the
# timed path is the bootstrap's, and the data is checked once the worker is done.
printf '\n[[step]]\nname = "data"\nkind = "cache"\ncache = "data"\nbackground = true\n' >>"$a/cache-manifests/restore.toml"
git -C "$a" add -A
git -C "$a" commit -q -m "adopt warmstart"
bin_manifest=cache-manifests/xtask-bin.toml
branch=$(sed -n 's/^branch = "\(.*\)"$/\1/p' "$a/$bin_manifest" | head -1)
[ -n "$branch" ] || { say "$a/$bin_manifest names no branch"; exit 1; }

# Origins: `with` (the binary cache), `registry` (a commit pinning the wheel,
# no binary cache), `without` (neither: the compile path); each has the data
# cache, which the publisher publishes to `with` and pushes on.
for o in with registry without; do
  bare "$work/srv/$o.git"
  git -C "$a" push -q "$work/srv/$o.git" main
done
(cd "$a" && git remote add origin "$work/srv/with.git" && "$BIN" cache publish data --quiet)
for o in registry without; do git -C "$work/srv/with.git" push -q "$work/srv/$o.git" "refs/heads/data-cache"; done
git_port=$(free_port)
git daemon --reuseaddr --export-all --listen=127.0.0.1 --port="$git_port" --base-path="$work/srv" "$work/srv" &
daemon_pid=$!
for _ in $(seq 1 200); do git ls-remote "git://127.0.0.1:$git_port/with.git" >/dev/null 2>&1 && break; sleep 0.05; done
url=git://127.0.0.1:$git_port

# The package index: PEP 503 simple layout over python3 -m http.server.
mkdir -p "$work/index/simple/warmstart"
cp "$WHEEL" "$work/index/simple/warmstart/"
digest=$(sha256sum "$WHEEL" | cut -c1-64)
printf '<!DOCTYPE html>\n<html><body><a href="%s#sha256=%s">%s</a></body></html>\n' \
  "$(basename "$WHEEL")" "$digest" "$(basename "$WHEEL")" >"$work/index/simple/warmstart/index.html"
port=$(free_port)
python3 -m http.server --bind 127.0.0.1 --directory "$work/index" "$port" >/dev/null 2>&1 &
index_pid=$!
for _ in $(seq 1 200); do curl -fs -o /dev/null "http://127.0.0.1:$port/simple/warmstart/" && break; sleep 0.05; done
export PIP_INDEX_URL=http://127.0.0.1:$port/simple/
git clone -q "$work/srv/registry.git" "$work/pinner"
(cd "$work/pinner" && "$BIN" init --pip-hash "sha256:$digest" >/dev/null)
git -C "$work/pinner" commit -q -am "pin the warmstart wheel (init --pip-hash)"
git -C "$work/pinner" push -q origin HEAD:main

# ---- compile first: its binary is the one the binary cache gets.
compile_s=()
for i in $(seq 1 "$compile_runs"); do
  t0=$(now)
  (git clone -q "$url/without.git" "$work/build$i" && cd "$work/build$i" &&
    tools/warmstart-bootstrap.sh >/dev/null 2>"$work/build$i.err")
  t1=$(now)
  restored "$work/build$i" "compile: cargo build"
  compile_s+=("$(echo "$t1 - $t0" | bc)")
  wait_worker "$work/build$i"
done
mkdir -p "$a/target/release"
if [ "$compile_runs" -gt 0 ]; then
  cp "$work/build1/target/release/xtask" "$a/target/release/xtask"
else
  (cd "$a" && cargo build --quiet --release --locked -p xtask)
fi
rm -rf "$work"/build[0-9]*
(cd "$a" && "$BIN" cache publish xtask-bin --allow-ungated --quiet)
echo "adopter: $a; binary cache $branch on $url/with.git; wheel $(basename "$WHEEL") on $PIP_INDEX_URL"

binary_s=() fetch_s=() net_s=() wheel_s=()
for i in $(seq 1 "$runs"); do
  t0=$(now)
  (git clone -q "$url/with.git" "$work/bin$i" && cd "$work/bin$i" &&
    tools/warmstart-bootstrap.sh --prebuilt-only >/dev/null 2>"$work/bin$i.err")
  t1=$(now)
  restored "$work/bin$i" "binary cache: installed"
  wait_worker "$work/bin$i"

  git clone -q "$url/with.git" "$work/fetch$i"
  t2=$(now)
  git -C "$work/fetch$i" fetch --quiet --depth 1 --no-tags origin "refs/heads/$branch"
  t3=$(now)
  binary_s+=("$(echo "$t1 - $t0" | bc)")
  fetch_s+=("$(echo "$t3 - $t2" | bc)")
  net_s+=("$(echo "($t1 - $t0) - ($t3 - $t2)" | bc)")

  t0=$(now)
  (git clone -q "$url/registry.git" "$work/reg$i" && cd "$work/reg$i" &&
    tools/warmstart-bootstrap.sh >/dev/null 2>"$work/reg$i.err")
  t1=$(now)
  restored "$work/reg$i" "registry: installed"
  wheel_s+=("$(echo "$t1 - $t0" | bc)")
  wait_worker "$work/reg$i"
  rm -rf "${work:?}/bin$i" "${work:?}/fetch$i" "${work:?}/reg$i"
done
pip_way=$(grep -o "registry: the host's [^:]*" "$work/reg$runs.err" | head -1)

m() { printf '%s\n' "$@" | median; }
binary=$(m "${binary_s[@]}") fetch=$(m "${fetch_s[@]}") net=$(m "${net_s[@]}") wheel=$(m "${wheel_s[@]}")
row() { printf '  %-48s %7.2f  %s\n' "$1" "$2" "$3"; }
echo "fresh clone -> restored machine in the adopter repository (median of runs, seconds)"
row "binary cache (tools/warmstart-bootstrap.sh)" "$binary" "($runs runs)"
row "  git fetch --depth 1 of $branch alone" "$fetch" ""
row "  binary cache minus that fetch" "$net" "(median of per-run differences; goal <= 0.5)"
row "wheel (the script's registry step, 127.0.0.1)" "$wheel" "($runs runs; goal <= 5; ${pip_way#registry: })"
echo "  each run: binary ${binary_s[*]}; fetch ${fetch_s[*]}; net ${net_s[*]}; wheel ${wheel_s[*]}${compile_s:+; compile ${compile_s[*]}}"
if [ "$compile_runs" -gt 0 ]; then
  compile=$(m "${compile_s[@]}")
  row "compile (cargo build --release --locked -p xtask)" "$compile" "($compile_runs runs, empty target/, warm registry)"
  printf '  ratio to compile: binary cache %.4f, wheel %.4f\n' \
    "$(echo "$binary / $compile" | bc -l)" "$(echo "$wheel / $compile" | bc -l)"
fi
