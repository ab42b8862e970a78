#!/usr/bin/env bash
# Benchmark: the `submodules` step with `jobs` and `shallow` against a plain
# `git submodule update --init`, interleaved in one run; medians and ratios.
#
#   tools/bench-submodules.sh                    # dev build (what `cargo xtask` runs)
#   SUITES=14 RUNS=7 XTASK=target/release/warmstart tools/bench-submodules.sh
#
# SUITES suites (default 8), each with 6 commits that rewrite a 1 MiB random
# file (6 MiB of history, 1 MiB at the tip: depth matters), served by
# `git daemon` on 127.0.0.1 (local-path submodules are hardlinked and ignore
# --depth, so they would measure nothing). Each run starts from a fresh clone
# of the superproject (not timed) and times one of:
#   plain    git submodule update --init
#   jobs     restore, submodules step with jobs = SUITES (capped at 8 by default)
#   shallow  restore, the same with shallow = true
# Nothing asserts a time: it prints numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-5}
suites=${SUITES:-8}
jobs=$((suites < 8 ? suites : 8))

command -v python3 >/dev/null || { echo "bench-submodules: python3 is needed" >&2; exit 1; }
git daemon -h >/dev/null 2>&1 || [ $? -eq 129 ] || {
  echo "bench-submodules: git daemon is needed (tools/test.sh installs it)" >&2
  exit 1
}
if [ -z "${XTASK:-}" ]; then
  cargo build --quiet -p warmstart
  XTASK=$(tools/target-dir.sh)/debug/warmstart
fi
XTASK=$(realpath "$XTASK")

work=$(mktemp -d /tmp/bench-submodules-XXXXXX)
daemon_pid=""
cleanup() {
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=$work
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid
g() { git "$@" >/dev/null 2>&1; }

mkdir -p srv
for i in $(seq "$suites"); do
  s=suite$i
  g init -q --bare -b main "srv/$s.git"
  g init -q -b main "src-$s"
  for c in 1 2 3 4 5 6; do
    head -c 1048576 /dev/urandom > "src-$s/data.bin"
    echo "suite $s rev $c" > "src-$s/run.sh"
    g -C "src-$s" add -A && g -C "src-$s" commit -q -m "rev $c"
  done
  g -C "src-$s" push -q "$work/srv/$s.git" main
done
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
git daemon --reuseaddr --export-all --listen=127.0.0.1 --port="$port" \
  --base-path="$work/srv" "$work/srv" >/dev/null 2>&1 &
daemon_pid=$!
for _ in $(seq 200); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done

g init -q --bare -b main origin.git
g init -q -b main dev
paths=()
for i in $(seq "$suites"); do
  g -C dev submodule add -q "git://127.0.0.1:$port/suite$i.git" "vendor/suite$i"
  paths+=("\"vendor/suite$i\"")
done
g -C dev commit -q -m "suites"
g -C dev push -q "$work/origin.git" main
list=$(IFS=,; echo "${paths[*]}")

step() {
  printf '[[step]]\nname = "suites"\nkind = "submodules"\npaths = [%s]\njobs = %s\n%s\n' "$list" "$jobs" "$1"
}
step "" > plan-jobs.toml
step "shallow = true" > plan-shallow.toml

one() {
  rm -rf box
  g clone -q "$work/origin.git" box
  local t0 t1
  t0=$(date +%s%N)
  case $1 in
    plain) git -C box submodule update --init -q ;;
    *)
      mkdir -p box/cache-manifests
      cp "plan-$1.toml" box/cache-manifests/restore.toml
      (cd box && "$XTASK" restore --strict --json > "$work/out-$1.json") || {
        echo "bench-submodules: the $1 run failed" >&2; cat "$work/out-$1.json" >&2; exit 1
      }
      ;;
  esac
  t1=$(date +%s%N)
  echo $(((t1 - t0) / 1000000)) >> "times-$1"
  du -sk box/.git/modules | cut -f1 > "kb-$1"
  git -C box submodule status > "status-$1"
}

echo "bench-submodules: $suites suites over git daemon, $runs interleaved runs each; binary $XTASK" >&2
one plain # warm the page cache and the daemon, not counted
rm -f times-plain
for i in $(seq "$runs"); do
  case $((i % 3)) in
    1) one plain; one jobs; one shallow ;;
    2) one jobs; one shallow; one plain ;;
    0) one shallow; one plain; one jobs ;;
  esac
done
for c in jobs shallow; do
  cmp -s status-plain "status-$c" || { echo "bench-submodules: $c checked out other commits than plain" >&2; exit 1; }
done
median() { sort -n "$1" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mp=$(median times-plain); mj=$(median times-jobs); ms=$(median times-shallow)
for c in plain jobs shallow; do echo "runs (ms) $c: $(tr '\n' ' ' < "times-$c")"; done
echo "median ms: plain $mp, jobs=$jobs $mj, jobs=$jobs+shallow $ms"
echo "submodule object store (KiB): plain $(cat kb-plain), jobs $(cat kb-jobs), shallow $(cat kb-shallow)"
awk -v p="$mp" -v j="$mj" -v s="$ms" 'BEGIN {
  printf "ratio jobs / plain: %.2f\nratio jobs+shallow / plain: %.2f\n", j / p, s / p }'
