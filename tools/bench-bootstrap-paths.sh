#!/usr/bin/env bash
# Benchmark: fresh clone -> restored machine through each bootstrap path,
# interleaved in one run, medians (issue 15):
#   binary cache  git clone + the bootstrap script (prebuilt binary from the
#                 repository's binary-cache branch, git + coreutils + zstd)
#   fetch         `git fetch --depth 1` of that branch alone, in a fresh clone
#                 (the binary path minus this, per run, must be <= 0.5 s)
#   wheel         git clone + a fresh venv + pip install --no-cache-dir of
#                 warmstart==VER from a PEP 503 index on 127.0.0.1 + restore
#                 (must be <= 5 s): by hand (registry_install below), and
#   registry      through the bootstrap script's registry step: an origin
#                 without the binary cache whose [bootstrap] table pins the
#                 wheel (pip, pip_hashes), PIP_INDEX_URL the loopback index
#   compile       git clone + the bootstrap script with no binary cache: cargo
#                 build --release into the clone's empty target/, with
#                 ~/.cargo/registry warm (fewer runs: minutes each)
#
#   tools/bench-bootstrap-paths.sh                    # RUNS=5 COMPILE_RUNS=1
#   WHEEL=target/wheels/warmstart-*.whl tools/bench-bootstrap-paths.sh   # reuse a built wheel
#   RUNS=3 COMPILE_RUNS=0 tools/bench-bootstrap-paths.sh                 # no compile path
#
# The binary published to the binary cache is the one inside the wheel: the
# run's one release build (tools/build-wheel.sh), as in tools/test.sh.
# Everything is local: a bare origin set up like a hosting server, HEAD pushed
# to it. Background restore steps are started, not awaited (that is what a
# bootstrap does); their worker is waited for before the next run.
set -euo pipefail
cd "$(dirname "$0")/.."
src_root=$PWD
runs=${RUNS:-5}
compile_runs=${COMPILE_RUNS:-1}
bootstrap=${BOOTSTRAP:-tools/warmstart-bootstrap.sh}
say() { echo "bench-bootstrap-paths: $*" >&2; }
if [ -n "$(git status --porcelain -- xtask Cargo.toml Cargo.lock "$bootstrap")" ]; then
  say "commit xtask/, Cargo.toml, Cargo.lock and $bootstrap first (the cache key covers HEAD)"
  exit 1
fi
if [ -z "${WHEEL:-}" ]; then
  WHEEL=$(tools/build-wheel.sh)
fi
WHEEL=$(realpath "$WHEEL")
version=$(basename "$WHEEL" | cut -d- -f2)
work=$(mktemp -d /tmp/bench-bootstrap-paths-XXXXXX)
index_pid=""
cleanup() {
  [ -z "$index_pid" ] || kill "$index_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid
# pip sees only the loopback index: no user or site config, no cache.
for v in $(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p'); do unset "$v"; done
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# The wheel's executable (the crate's bin target).
exe=$(unzip -Z1 "$WHEEL" | sed -n "s|^warmstart-$version.data/scripts/||p")
[ -n "$exe" ] || { say "$WHEEL holds no executable under warmstart-$version.data/scripts/"; exit 1; }
mkdir -p "$work/bin"
unzip -q -o -j "$WHEEL" "warmstart-$version.data/scripts/$exe" -d "$work/bin"
BIN=$work/bin/$exe

now() { date +%s.%N; }
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
origin_like_a_host() {
  git init -q --bare -b main "$1"
  git -C "$1" config receive.unpackLimit 1
  git -C "$src_root" push -q "$1" HEAD:refs/heads/main
}
# The registry step of a bootstrap: the pinned wheel into a fresh venv $1
# (requirement file $2, extra pip arguments after). A venv without pip plus
# the host's `python3 -m pip --python` (pip 22.3+) takes about a second; a
# venv with its own pip (ensurepip) takes several, so it is the fallback.
registry_install() {
  local venv=$1 req=$2
  shift 2
  if python3 -m venv --without-pip "$venv" && python3 -m pip --python "$venv/bin/python" --version >/dev/null 2>&1; then
    python3 -m pip --python "$venv/bin/python" install -q --no-cache-dir --require-hashes -r "$req" "$@"
  else
    rm -rf "$venv" && python3 -m venv "$venv" &&
      "$venv/bin/pip" install -q --no-cache-dir --require-hashes -r "$req" "$@"
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

# Origins: one with the binary cache (published with the wheel's binary, as
# CI would), one without (the compile path).
origin_like_a_host "$work/with.git"
origin_like_a_host "$work/without.git"
origin_like_a_host "$work/registry.git"
git clone -q "$work/with.git" "$work/publisher"
mkdir -p "$work/publisher/target/release"
cp "$BIN" "$work/publisher/target/release/$exe"
(cd "$work/publisher" && "$BIN" cache publish xtask-bin --allow-ungated --quiet)
branch=$(sed -n 's/^branch = "\(.*\)"$/\1/p' cache-manifests/xtask-bin.toml | head -1)

# The package index: PEP 503 simple layout over python3 -m http.server.
mkdir -p "$work/index/simple/warmstart"
cp "$WHEEL" "$work/index/simple/warmstart/"
digest=$(sha256sum "$WHEEL" | cut -c1-64)
printf '<!DOCTYPE html>\n<html><body><a href="%s#sha256=%s">%s</a></body></html>\n' \
  "$(basename "$WHEEL")" "$digest" "$(basename "$WHEEL")" > "$work/index/simple/warmstart/index.html"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$work/index" "$port" >/dev/null 2>&1 &
index_pid=$!
for _ in $(seq 1 200); do curl -fs -o /dev/null "http://127.0.0.1:$port/simple/warmstart/" && break; sleep 0.05; done
tools/wheel-requirement.sh "$WHEEL" > "$work/requirement.txt"
# The registry origin: HEAD plus a commit that pins this wheel in the
# [bootstrap] table (the manifest's last table, so appending lands in it).
bin_manifest=cache-manifests/xtask-bin.toml
[ "$(grep '^\[' "$bin_manifest" | tail -1)" = "[bootstrap]" ] ||
  { say "$bin_manifest must end with its [bootstrap] table"; exit 1; }
git clone -q "$work/registry.git" "$work/pinner"
printf 'pip = "warmstart==%s"\npip_hashes = ["sha256:%s"]\n' "$version" "$digest" >> "$work/pinner/$bin_manifest"
git -C "$work/pinner" commit -q -am "bench: pin the wheel"
git -C "$work/pinner" push -q origin HEAD:main
echo "binary cache: $branch on $work/with.git; wheel: $(basename "$WHEEL") on http://127.0.0.1:$port/simple/"

binary_s=() fetch_s=() net_s=() wheel_s=() registry_s=() compile_s=()
for i in $(seq 1 "$runs"); do
  t0=$(now)
  (git clone -q "$work/with.git" "$work/bin$i" && cd "$work/bin$i" &&
    "$bootstrap" --prebuilt-only >/dev/null 2>"$work/bin$i.err")
  t1=$(now)
  grep -Eq "installed prebuilt|binary cache: installed" "$work/bin$i.err" || { cat "$work/bin$i.err" >&2; exit 1; }
  wait_worker "$work/bin$i"

  git clone -q "$work/with.git" "$work/fetch$i"
  t2=$(now)
  git -C "$work/fetch$i" fetch --quiet --depth 1 --no-tags origin "refs/heads/$branch"
  t3=$(now)
  binary_s+=("$(echo "$t1 - $t0" | bc)")
  fetch_s+=("$(echo "$t3 - $t2" | bc)")
  net_s+=("$(echo "($t1 - $t0) - ($t3 - $t2)" | bc)")

  t0=$(now)
  (git clone -q "$work/with.git" "$work/wheel$i" && cd "$work/wheel$i" &&
    registry_install target/warmstart-venv "$work/requirement.txt" --index-url "http://127.0.0.1:$port/simple/" &&
    "target/warmstart-venv/bin/$exe" restore >/dev/null 2>"$work/wheel$i.err")
  t1=$(now)
  wheel_s+=("$(echo "$t1 - $t0" | bc)")
  wait_worker "$work/wheel$i"

  t0=$(now)
  (git clone -q "$work/registry.git" "$work/reg$i" && cd "$work/reg$i" &&
    PIP_INDEX_URL="http://127.0.0.1:$port/simple/" PIP_NO_CACHE_DIR=1 "$bootstrap" >/dev/null 2>"$work/reg$i.err")
  t1=$(now)
  grep -q "registry: installed" "$work/reg$i.err" || { cat "$work/reg$i.err" >&2; exit 1; }
  registry_s+=("$(echo "$t1 - $t0" | bc)")
  wait_worker "$work/reg$i"

  if [ "$i" -le "$compile_runs" ]; then
    t0=$(now)
    (git clone -q "$work/without.git" "$work/build$i" && cd "$work/build$i" &&
      "$bootstrap" >/dev/null 2>"$work/build$i.err")
    t1=$(now)
    grep -Eq "compiling|compile:" "$work/build$i.err" || { cat "$work/build$i.err" >&2; exit 1; }
    compile_s+=("$(echo "$t1 - $t0" | bc)")
    wait_worker "$work/build$i"
    rm -rf "$work/build$i"
  fi
  rm -rf "${work:?}/bin$i" "${work:?}/fetch$i" "${work:?}/wheel$i" "${work:?}/reg$i"
done

m() { printf '%s\n' "$@" | median; }
binary=$(m "${binary_s[@]}") fetch=$(m "${fetch_s[@]}") net=$(m "${net_s[@]}") wheel=$(m "${wheel_s[@]}")
registry=$(m "${registry_s[@]}")
row() { printf '  %-44s %7.2f  %s\n' "$1" "$2" "$3"; }
echo "fresh clone -> restored machine (median of runs, seconds)"
row "binary cache ($bootstrap)" "$binary" "($runs runs)"
row "  git fetch --depth 1 of $branch alone" "$fetch" ""
row "  binary cache minus that fetch" "$net" "(median of per-run differences; goal <= 0.5)"
row "wheel (fresh venv + pip from 127.0.0.1)" "$wheel" "($runs runs; goal <= 5)"
row "wheel through $bootstrap's registry step" "$registry" "($runs runs; goal <= 5)"
echo "  each run: binary ${binary_s[*]}; fetch ${fetch_s[*]}; wheel ${wheel_s[*]}; registry ${registry_s[*]}${compile_s:+; compile ${compile_s[*]}}"
if [ "$compile_runs" -gt 0 ]; then
  compile=$(m "${compile_s[@]}")
  row "compile (cargo build --release)" "$compile" "($compile_runs runs, empty target/, warm registry)"
  printf '  ratio to compile: binary cache %.4f, wheel %.4f, registry step %.4f\n' \
    "$(echo "$binary / $compile" | bc -l)" "$(echo "$wheel / $compile" | bc -l)" "$(echo "$registry / $compile" | bc -l)"
fi
