#!/usr/bin/env bash
# Publish timings: `cargo xtask cache publish` against the shell recipe it replaces, same data, same run.
#
#   tools/bench-publish.sh [SRC] [RUNS]
#
# SRC defaults to the whole Rust sysroot ($(rustc --print sysroot), ~1.4 GB);
# RUNS (default 3) rounds of, interleaved:
#   A  warmstart publish to a fresh bare origin (receive.unpackLimit 1), from a
#      fresh clone state (no cache.git): a cold publish;
#   B  the seed recipe's zstd publish (../shared/bench/seed_recipe.sh) of SRC;
#   A' warmstart publish again with nothing changed (no commit, no push).
# Prints one Markdown table of medians, ratios and peak RSS (of the whole
# process tree, via /usr/bin/time). It measures; it never asserts a time.
# Runs the dev build, as `cargo xtask` does. Needs about 3x SRC compressed of disk in $TMPDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-$(rustc --print sysroot)}
runs=${2:-3}
seed=${SEED_RECIPE:-$PWD/../shared/bench/seed_recipe.sh}
[ -f "$seed" ] || seed=/work/shared/bench/seed_recipe.sh
[ -f "$seed" ] || { echo "bench-publish: seed recipe not found; set SEED_RECIPE" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "bench-publish: /usr/bin/time is needed for peak RSS (apt-get install time)" >&2; exit 1; }
cargo build -q -p xtask
xtask=$PWD/target/debug/xtask
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT

# Warm the source tree so that every contender reads from the page cache.
tar -C "$src" -cf - . >/dev/null

git init -q -b main "$work/w"
mkdir "$work/w/cache-manifests"
printf '[[key]]\nname = "v"\nliteral = "bench"\n\n[pack]\nroot = "%s"\n\n[restore]\npath = "restored"\n' "$src" \
  >"$work/w/cache-manifests/bench.toml"

measure() { # label cmd... -> appends "label seconds rss_kb" to $work/results
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  echo "$label $(cat "$work/time")" >>"$work/results"
  echo "  $label: $(cut -d' ' -f1 "$work/time") s, $(cut -d' ' -f2 "$work/time") KB" >&2
}

: >"$work/results"
for i in $(seq "$runs"); do
  echo "round $i/$runs" >&2
  rm -rf "$work/a.git" "$work/b.git" "$work/w/.git/warmstart"
  git init -q --bare "$work/a.git"; git -C "$work/a.git" config receive.unpackLimit 1
  git init -q --bare "$work/b.git"; git -C "$work/b.git" config receive.unpackLimit 1
  (cd "$work/w" && measure publish "$xtask" cache publish bench --quiet --remote "$work/a.git")
  measure seed_zst bash "$seed" publish "$src" "$work/b.git" bench-cache zst
  (cd "$work/w" && measure republish "$xtask" cache publish bench --quiet --remote "$work/a.git")
done

python3 - "$work/results" "$src" "$runs" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    label, secs, rss = line.split()
    rows.setdefault(label, []).append((float(secs), int(rss)))
med = {k: statistics.median(s for s, _ in v) for k, v in rows.items()}
rss = {k: max(r for _, r in v) for k, v in rows.items()}
print(f"publish of {sys.argv[2]}, {sys.argv[3]} interleaved rounds, medians\n")
print("| contender | median s | vs seed zstd publish | vs warmstart publish | peak RSS MB |")
print("|---|---:|---:|---:|---:|")
for k, name in [("publish", "warmstart cache publish"), ("seed_zst", "seed recipe publish (zstd)"),
                ("republish", "warmstart re-publish, unchanged")]:
    print(f"| {name} | {med[k]:.1f} | {med[k] / med['seed_zst']:.2f} | {med[k] / med['publish']:.2f} | {rss[k] / 1024:.0f} |")
EOF
