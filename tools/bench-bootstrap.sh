#!/usr/bin/env bash
# Benchmark: fresh clone -> restored machine, with and without the prebuilt
# xtask binary (issue 5). Everything local: a bare origin set up like a
# hosting server (receive.unpackLimit 1), this repository's HEAD pushed to it.
#
#   tools/bench-bootstrap.sh                  # RUNS=3 prebuilt runs, 1 build run
#   RUNS=5 BUILD_RUNS=0 tools/bench-bootstrap.sh   # skip the (minutes-long) build
#   XTASK=target/release/warmstart tools/bench-bootstrap.sh   # publish this binary
#   SHARED_TARGET=1 tools/bench-bootstrap.sh  # build into this checkout's target/
#                                             # (warm cargo cache) instead of a cold one
#
# 1. with:    origin has xtask-bin-cache for HEAD's key (published by
#             `xtask cache publish xtask-bin --allow-ungated` with the release
#             binary); time `git clone origin fresh && cd fresh && tools/bootstrap.sh`.
# 2. without: an origin without the branch: bootstrap.sh compiles
#             (`cargo build --release -p warmstart`), by default into the fresh
#             clone's own empty target/ (crates already in ~/.cargo/registry).
# Floor: `git clone` alone. Background restore steps are started, not awaited
# (that is what bootstrap does); their worker is waited for before cleanup.
set -euo pipefail
cd "$(dirname "$0")/.."
src_root=$PWD
runs=${RUNS:-3}
build_runs=${BUILD_RUNS:-1}
if [ -n "$(git status --porcelain -- xtask Cargo.toml Cargo.lock)" ]; then
  echo "bench-bootstrap: commit xtask/, Cargo.toml and Cargo.lock first (the key covers HEAD)" >&2
  exit 1
fi
if [ -z "${XTASK:-}" ]; then
  cargo build --release --quiet -p warmstart
  XTASK=$src_root/target/release/warmstart
fi
XTASK=$(realpath "$XTASK")
work=$(mktemp -d /tmp/bench-bootstrap-XXXXXX)
trap 'rm -rf "$work"' EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
origin_like_a_host() {
  git init -q --bare -b main "$1"
  git -C "$1" config receive.unpackLimit 1
  git -C "$src_root" push -q "$1" HEAD:refs/heads/main
}
# Waits for a background restore worker of clone $1 to finish.
wait_worker() {
  local i
  for i in $(seq 1 600); do
    (cd "$1" && "$XTASK" restore status --json 2>/dev/null) | grep -q '"running": true' || return 0
    sleep 0.5
  done
}

origin_like_a_host "$work/with.git"
origin_like_a_host "$work/without.git"
git clone -q "$work/with.git" "$work/publisher"
mkdir -p "$work/publisher/target/release"
cp "$XTASK" "$work/publisher/target/release/warmstart"
(cd "$work/publisher" && "$XTASK" cache publish xtask-bin --allow-ungated --quiet)
key=$(cd "$work/publisher" && tools/bootstrap.sh --print-key)
echo "published $key ($(du -h "$XTASK" | cut -f1) binary) to $work/with.git"

clone_s=() with_s=() without_s=()
for i in $(seq 1 "$runs"); do
  t0=$(now); git clone -q "$work/with.git" "$work/floor$i"; t1=$(now)
  clone_s+=("$(echo "$t1 - $t0" | bc)")
  t0=$(now)
  (git clone -q "$work/with.git" "$work/fresh$i" && cd "$work/fresh$i" && tools/bootstrap.sh --prebuilt-only >/dev/null 2>"$work/with$i.err")
  t1=$(now)
  with_s+=("$(echo "$t1 - $t0" | bc)")
  grep -q "binary cache: installed $key" "$work/with$i.err" || { cat "$work/with$i.err" >&2; exit 1; }
  wait_worker "$work/fresh$i"
done
for i in $(seq 1 "$build_runs"); do
  t0=$(now)
  if [ -n "${SHARED_TARGET:-}" ]; then
    (git clone -q "$work/without.git" "$work/build$i" && cd "$work/build$i" &&
      CARGO_TARGET_DIR=$src_root/target tools/bootstrap.sh >/dev/null 2>"$work/without$i.err")
  else
    (git clone -q "$work/without.git" "$work/build$i" && cd "$work/build$i" &&
      tools/bootstrap.sh >/dev/null 2>"$work/without$i.err")
  fi
  t1=$(now)
  without_s+=("$(echo "$t1 - $t0" | bc)")
  wait_worker "$work/build$i"
done

echo "fresh clone -> restored machine (median of runs, seconds)"
printf '  git clone alone (floor)      %6.2f  (%d runs)\n' "$(printf '%s\n' "${clone_s[@]}" | median)" "$runs"
printf '  clone + bootstrap, prebuilt  %6.2f  (%d runs)\n' "$(printf '%s\n' "${with_s[@]}" | median)" "$runs"
if [ "$build_runs" -gt 0 ]; then
  printf '  clone + bootstrap, compiling %6.2f  (%d runs, %s target dir)\n' \
    "$(printf '%s\n' "${without_s[@]}" | median)" "$build_runs" "${SHARED_TARGET:+shared warm}${SHARED_TARGET:-cold}"
fi
