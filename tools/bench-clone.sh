#!/usr/bin/env bash
# The table's labels are Markdown (backticks for code), not command substitutions.
# shellcheck disable=SC2016
# What a plain `git clone` costs next to a cache, with the cache on a branch
# (refs/heads/<name>-cache, a manifest without cache.ref) and on a ref
# outside refs/heads/ (cache.ref = "refs/warmstart/cache/<name>").
#
# One ~150 MB cache (random bytes, so zstd cannot shrink it) is published
# with the built xtask next to a small main branch, the remote is copied and
# migrated with `xtask cache migrate`, and both are served by `git daemon`
# on 127.0.0.1. Each clone runs ROUNDS times, interleaved; the table shows
# medians of the bytes received (the clone's .git/objects) and wall time.
# It measures and never asserts. Usage: tools/bench-clone.sh [MB] [ROUNDS]
set -euo pipefail

MB=${1:-150}
ROUNDS=${2:-3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
XTASK=${XTASK:-$ROOT/target/debug/warmstart}
[ -x "$XTASK" ] || { echo "bench-clone: build xtask first (cargo build), or set XTASK" >&2; exit 1; }
command -v git-daemon >/dev/null || [ -x "$(git --exec-path)/git-daemon" ] \
  || { echo "bench-clone: git daemon is missing (apt-get install git-daemon-sysvinit)" >&2; exit 1; }

T=$(mktemp -d "${TMPDIR:-/tmp}/bench-clone.XXXXXX")
DAEMON=
cleanup() { [ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=$T
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@localhost
export GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@localhost

mkdir -p "$T/srv" "$T/src"
git init -q --bare -b main "$T/srv/branch.git"
git -C "$T/srv/branch.git" config receive.unpackLimit 1
git init -q -b main "$T/work"
# A small main branch: ~0.26 MB of text.
for i in 1 2 3 4; do head -c 48000 /dev/urandom | base64 > "$T/work/file$i.txt"; done
git -C "$T/work" add -A && git -C "$T/work" commit -q -m main
git -C "$T/work" remote add origin "$T/srv/branch.git"
git -C "$T/work" push -q origin main
head -c "$((MB * 1024 * 1024))" /dev/urandom > "$T/src/blob.bin"
mkdir -p "$T/work/cache-manifests"
manifest() {
  cat > "$T/work/cache-manifests/big.toml" <<EOF
[cache]
$1

[[key]]
name = "v"
literal = "1"

[pack]
root = "$T/src"

[restore]
path = "$T/restored"
EOF
}
manifest ""
(cd "$T/work" && "$XTASK" cache publish big --quiet)
cp -a "$T/srv/branch.git" "$T/srv/ref.git"
manifest 'ref = "refs/warmstart/cache/big"'
(cd "$T/work" && "$XTASK" cache migrate big --remote "$T/srv/ref.git" --quiet)

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
git daemon --reuseaddr --export-all --listen=127.0.0.1 --port="$PORT" --base-path="$T/srv" "$T/srv" &
DAEMON=$!
for _ in $(seq 100); do git ls-remote "git://127.0.0.1:$PORT/branch.git" >/dev/null 2>&1 && break; sleep 0.1; done

# One clone: prints "bytes seconds".
run() {
  local name=$1; shift
  rm -rf "$T/c"
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$(du -sb "$T/c/.git/objects" | cut -f1) $(echo "$t1 - $t0" | bc)" >> "$T/$name.txt"
}
url() { echo "git://127.0.0.1:$PORT/$1"; }
for _ in $(seq "$ROUNDS"); do
  run branch-plain git clone -q "$(url branch.git)" "$T/c"
  run ref-plain git clone -q "$(url ref.git)" "$T/c"
  run branch-single git clone -q --single-branch "$(url branch.git)" "$T/c"
  run ref-fetch sh -c "git clone -q '$(url ref.git)' '$T/c' && git -C '$T/c' fetch -q origin refs/warmstart/cache/big"
done

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
row() {
  local bytes secs
  bytes=$(cut -d' ' -f1 < "$T/$1.txt" | median)
  secs=$(cut -d' ' -f2 < "$T/$1.txt" | median)
  printf '| %s | %s | %.2f s |\n' "$2" "$(echo "$bytes" | sed ':a;s/\B[0-9]\{3\}\>/,&/;ta')" "$secs"
}
echo "cache: $MB MiB on one key; main: $(du -sb "$T/work"/file*.txt | awk '{s+=$1} END {print s}') bytes; medians of $ROUNDS; git $(git --version | cut -d' ' -f3)"
echo
echo "| clone (git daemon on 127.0.0.1) | bytes received | time |"
echo "|---|---:|---:|"
row branch-plain 'cache on `refs/heads/big-cache`: plain `git clone`'
row branch-single 'cache on `refs/heads/big-cache`: `git clone --single-branch`'
row ref-plain 'cache on `refs/warmstart/cache/big`: plain `git clone`'
row ref-fetch 'cache on `refs/warmstart/cache/big`: plain clone, then `git fetch origin <ref>` (asked for by name)'
