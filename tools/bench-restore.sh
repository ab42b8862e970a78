#!/usr/bin/env bash
# Benchmark: a warm `xtask restore` of 11 steps, against baselines in the same run.
#
#   tools/bench-restore.sh                 # release build of xtask (what bootstrap.sh runs)
#   XTASK=target/debug/warmstart tools/bench-restore.sh   # any other binary
#   RUNS=100 tools/bench-restore.sh
#
# Builds a throwaway repository (origin + clone) with ten steps, one or more of
# every kind: 2 submodules steps (one submodule each, from local bare repos),
# links (20 entries + index), 3 commands (2 `creates`, 1 `unless`),
# 2 downloads (from python3 -m http.server on 127.0.0.1), 1 pin and
# 1 freshness, and 1 service (a python3 HTTP server on 127.0.0.1, ready by
# port, stopped with `restore stop` at the end). One cold run brings everything in; the HTTP server is then
# stopped, so the warm runs prove they need no network. hyperfine then times
# the warm restore, `true` (process start floor) and `git status` (what a
# person would call instant), and the script prints the medians and ratios.
# Goal (issue 5): warm restore <= 50 ms. The plan also exports (`[env]`, a
# `path` on tool-one), and `restore env` is timed beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${RUNS:-40}

if ! command -v hyperfine >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine
  else
    echo "bench-restore: hyperfine is missing; run as root or install it (apt-get install hyperfine)" >&2
    exit 1
  fi
fi
for tool in python3 git jq; do
  command -v "$tool" >/dev/null || {
    [ "$(id -u)" = 0 ] && [ "$tool" = jq ] && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq
    command -v "$tool" >/dev/null || { echo "bench-restore: $tool is needed" >&2; exit 1; }
  }
done

if [ -z "${XTASK:-}" ]; then
  cargo build --release --quiet -p warmstart
  XTASK=$(tools/target-dir.sh)/release/warmstart
fi
XTASK=$(realpath "$XTASK")

work=$(mktemp -d /tmp/bench-restore-XXXXXX)
server_pid=""
cleanup() {
  [ -z "$server_pid" ] || kill "$server_pid" 2>/dev/null || true
  [ ! -d "$work/box" ] || (cd "$work/box" && "$XTASK" restore stop >/dev/null 2>&1) || true
  rm -rf "$work"
}
trap cleanup EXIT
cd "$work"
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null HOME=$work
export GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@invalid GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@invalid
g() { git -c protocol.file.allow=always "$@" >/dev/null 2>&1; }

for s in alpha beta; do
  g init -q --bare -b main "$s.git"
  g init -q -b main "$s-src"
  echo "run $s" > "$s-src/run.sh"
  g -C "$s-src" add -A && g -C "$s-src" commit -q -m "$s"
  g -C "$s-src" push -q "$work/$s.git" main
done
g init -q --bare -b main origin.git
g init -q -b main dev
mkdir -p dev/skills dev/cache-manifests dev/versions
for i in $(seq -w 1 20); do mkdir -p "dev/skills/skill$i"; echo "skill $i" > "dev/skills/skill$i/SKILL.md"; echo "- skill$i" >> dev/skills/INDEX.md; done
g -C dev submodule add -q "$work/alpha.git" vendor/alpha
g -C dev submodule add -q "$work/beta.git" vendor/beta

mkdir -p files
head -c 300000 /dev/urandom > files/one.bin
head -c 50000 /dev/urandom > files/two.bin
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(free_port)
service_port=$(free_port)
python3 -m http.server "$port" --bind 127.0.0.1 --directory files >/dev/null 2>&1 &
server_pid=$!
for _ in $(seq 100); do (echo > "/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.05; done

sha() { sha256sum "$1" | cut -d' ' -f1; }
cat > dev/cache-manifests/restore.toml <<EOF
[env]
env = { BENCH_MODE = "warm it's" }

[[step]]
name = "suite-alpha"
kind = "submodules"
paths = ["vendor/alpha"]
allow_file_protocol = true
sentinel = [{ suite = "alpha", path = "vendor/alpha/run.sh", breaks = "make test-alpha" }]

[[step]]
name = "suite-beta"
kind = "submodules"
paths = ["vendor/beta"]
allow_file_protocol = true
sentinel = [{ suite = "beta", path = "vendor/beta/run.sh", breaks = "make test-beta" }]

[[step]]
name = "skills"
kind = "links"
source = "skills"
farm = ".farm/skills"
index = "skills/INDEX.md"
entries = "dirs"

[[step]]
name = "deps"
kind = "command"
run = "mkdir -p build/deps && touch build/deps/ready"
creates = "build/deps/ready"

[[step]]
name = "codegen"
kind = "command"
run = "mkdir -p build/gen && touch build/gen/out.rs"
creates = "build/gen/out.rs"

[[step]]
name = "hooks"
kind = "command"
run = "mkdir -p .hooks && touch .hooks/installed"
unless = "test -f .hooks/installed"

[[step]]
name = "tool-one"
kind = "download"
url = "http://127.0.0.1:$port/one.bin"
sha256 = "$(sha files/one.bin)"
dest = "tools/bin/one"
executable = true
path = ["tools/bin"]

[[step]]
name = "tool-two"
kind = "download"
url = "http://127.0.0.1:$port/two.bin"
sha256 = "$(sha files/two.bin)"
dest = "tools/bin/two"

[[step]]
name = "shell"
kind = "pin"
tool = "bash"
expect = '^GNU bash, version [45]\.'

[[step]]
name = "fresh"
kind = "freshness"
timeout = "5s"
interval = "1h"

[[step]]
name = "docs-server"
kind = "service"
run = ["python3", "-m", "http.server", "$service_port", "--bind", "127.0.0.1"]
ready_port = $service_port
watch = ["skills/INDEX.md"]
EOF
g -C dev add -A && g -C dev commit -q -m "bench repository"
g -C dev push -q "$work/origin.git" main
g clone -q "$work/origin.git" box
cd box

echo "bench-restore: cold run (11 steps)" >&2
"$XTASK" restore --strict >&2
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=""

states=$("$XTASK" restore --json | jq -r '[.steps[].state] | unique | join(",")')
steps=$("$XTASK" restore --json | jq '.steps | length')
if [ "$states" != warm ] || [ "$steps" != 11 ]; then
  echo "bench-restore: the warm run is not an 11-step no-op (states: $states, steps: $steps)" >&2
  exit 1
fi

echo "bench-restore: warm runs with the HTTP server stopped; binary $XTASK" >&2
hyperfine -N --warmup 5 --runs "$runs" --export-json "$work/bench.json" \
  -n "restore (warm, 11 steps)" "$XTASK restore" \
  -n "restore env" "$XTASK restore env --shell sh" \
  -n "true" "true" \
  -n "git status" "git status" >&2

jq -r '
  (.results | map({(.command): .median}) | add) as $m
  | "median ms: restore \($m["restore (warm, 11 steps)"] * 1000 | . * 100 | round / 100)"
    + ", true \($m["true"] * 1000 | . * 100 | round / 100)"
    + ", git status \($m["git status"] * 1000 | . * 100 | round / 100)",
    "ratio restore / true: \($m["restore (warm, 11 steps)"] / $m["true"] | . * 100 | round / 100)",
    "ratio restore / git status: \($m["restore (warm, 11 steps)"] / $m["git status"] | . * 100 | round / 100)",
    "median ms: restore env \($m["restore env"] * 1000 | . * 100 | round / 100), ratio to true \($m["restore env"] / $m["true"] | . * 10 | round / 10)",
    "goal: warm restore <= 50 ms: \(if $m["restore (warm, 11 steps)"] <= 0.050 then "met" else "NOT met" end)"
' "$work/bench.json"
