#!/usr/bin/env bash
# Benchmark: `resume lookup` and `resume record` per call, each a whole process
# of the built xtask binary (dev profile, as `cargo xtask` builds it), on an
# index of 200 entries. Baselines in the same run: `cat` of the index (the floor
# for any process that reads it) and the JavaScript protocol fixture
# (tests/fixtures/crash-resume-index.js) doing the same call. Prints medians.
# Aim: lookup under 5 ms. `record` includes two fsyncs (file and directory),
# which the JavaScript tool skips.
#
# Usage: tools/bench-resume.sh [RUNS]   (default 200 lookups and 100 records per contender)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-200}

if ! command -v hyperfine >/dev/null; then
  if [ "$(id -u)" = 0 ]; then
    echo "bench-resume.sh: installing hyperfine" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq hyperfine
  else
    echo "bench-resume.sh: hyperfine is missing; install it (apt-get install hyperfine) and rerun" >&2
    exit 1
  fi
fi
for tool in node python3; do
  command -v "$tool" >/dev/null || { echo "bench-resume.sh: $tool is missing (tools/test.sh installs it)" >&2; exit 1; }
done

cargo build -q -p warmstart
bin=$PWD/target/debug/warmstart
js=$PWD/tests/fixtures/crash-resume-index.js
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CRASH_RESUME_INDEX_PATH=$work/golems/crash-resume-index.json
node "$js" record-many surface- 200 session-0123456789abcdef warmstart

# The machine is shared and its load swings, so contenders are interleaved:
# several short rounds, each running every contender, medians over all rounds.
rounds=10
for round in $(seq "$rounds"); do
  hyperfine -N --style none --warmup 3 --runs $((runs / rounds)) --export-json "$work/lookup-$round.json" \
    -n 'cat index (floor)' "cat $CRASH_RESUME_INDEX_PATH" \
    -n 'xtask resume lookup' "$bin resume lookup surface-100" \
    -n 'node fixture lookup' "node $js lookup surface-100" 2>>"$work/hyperfine.log"
  hyperfine -N --style none --warmup 2 --runs $((runs / rounds / 2)) --export-json "$work/record-$round.json" \
    -n 'true (floor)' "true" \
    -n 'xtask resume record' "$bin resume record surface-100 session-fedcba9876543210 warmstart" \
    -n 'node fixture record' "node $js record surface-100 session-fedcba9876543210 warmstart" 2>>"$work/hyperfine.log"
done

python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
print(f"{'command':<24} {'median':>10} {'p90':>10} {'runs':>5}")
for kind in ("lookup", "record"):
    times = {}
    for r in range(1, rounds + 1):
        for res in json.load(open(f"{work}/{kind}-{r}.json"))["results"]:
            times.setdefault(res["command"], []).extend(res["times"])
    med = {c: statistics.median(t) for c, t in times.items()}
    for c, t in times.items():
        p90 = statistics.quantiles(t, n=10)[-1]
        print(f"{c:<24} {med[c]*1000:>7.2f} ms {p90*1000:>7.2f} ms {len(t):>5}")
    xt = next(c for c in times if c.startswith("xtask"))
    for c in times:
        if c != xt:
            print(f"  {xt} / {c}: {med[xt] / med[c]:.2f}x")
PY
