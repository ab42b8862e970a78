#!/usr/bin/env bash
# Times `cargo xtask cache restore` on a real tree against the seed recipe (zstd) and the tar|tar floor, interleaved.
#
# usage: tools/cache-restore-timing.sh [SRC] [RUNS]
#   SRC   tree to publish and restore (default: the Rust toolchain, `rustc --print sysroot`)
#   RUNS  interleaved rounds (default 3); each round: floor, ours cold, seed recipe, ours warm
# XTASK_BIN=path uses that binary instead of building the dev one (what `cargo xtask` runs).
# Prints one line per run, then medians, ratios and peak RSS. Never asserts times.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
src=$(cd "${1:-$(rustc --print sysroot)}" && pwd)
runs=${2:-3}
if [ -z "${XTASK_BIN:-}" ]; then
  cargo build -q --manifest-path "$root/Cargo.toml" -p xtask
  XTASK_BIN=$root/target/debug/xtask
fi
recipe=${SEED_RECIPE:-$root/tests/it/cache_restore/seed_recipe.sh}
work=$(mktemp -d "${TMPDIR:-/tmp}/warmstart-timing.XXXXXX")
trap 'chmod -R u+w "$work" 2>/dev/null; rm -rf "$work"' EXIT
export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=t GIT_AUTHOR_EMAIL=t@t GIT_COMMITTER_NAME=t GIT_COMMITTER_EMAIL=t@t

git init -q --bare -b main "$work/origin.git"
git -C "$work/origin.git" config receive.unpackLimit 1
git init -q -b main "$work/repo"
git -C "$work/repo" commit -q --allow-empty -m init
git -C "$work/repo" remote add origin "$work/origin.git"
mkdir -p "$work/repo/cache-manifests"
cat > "$work/repo/cache-manifests/tc.toml" <<EOF
[[key]]
name = "v"
literal = "1"
[pack]
root = "$src"
[restore]
path = "$work/dest/tc"
EOF
cd "$work/repo"

# seconds and peak RSS (KiB) of a command, appended to $work/<name>
timed() {
  local name=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/t" "$@" >/dev/null
  cat "$work/t" >> "$work/$name"
  printf '%-12s %6.2f s  %7d KiB\n' "$name" $(cat "$work/t")
}

echo "tree: $src ($(du -sh "$src" | cut -f1), $(find "$src" | wc -l) entries)"
timed publish "$XTASK_BIN" cache publish tc --allow-ungated --quiet
timed seed-publish bash "$recipe" publish "$src" "$work/origin.git" seed-zst zst
tar -C "$src" -cf - . > /dev/null   # warm the source tree

for _ in $(seq "$runs"); do
  rm -rf "$work/floor-dest"; mkdir "$work/floor-dest"
  timed floor sh -c "tar -C '$src' -cf - . | tar -C '$work/floor-dest' -xf -"
  chmod -R u+w "$work/dest" 2>/dev/null || true
  rm -rf "$work/dest" "$work/repo/.git/warmstart"   # cold: no cache.git, no stamp
  timed ours-cold "$XTASK_BIN" cache restore tc --quiet
  "$XTASK_BIN" cache restore tc --verify --json > "$work/verify.json"
  timed ours-warm "$XTASK_BIN" cache restore tc --quiet
  rm -rf "$work/seed-dest"
  timed seed-zst bash "$recipe" restore "$work/origin.git" seed-zst "$work/seed-dest" zst
done
chmod -R u+w "$work/dest"; rm -rf "$work/dest" "$work/repo/.git/warmstart"
echo "phases of one more cold run (ms):"
"$XTASK_BIN" cache restore tc --json | python3 -c 'import json,sys; j=json.load(sys.stdin); print(" ", j["phases"], "bytes", j["bytes"], "compressed", j["compressed_bytes"], "hashed", j["bytes_hashed"])'

median() { sort -n -k1 "$work/$1" | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
peak() { sort -n -k2 "$work/$1" | tail -1 | awk '{printf "%d", $2/1024}'; }
ours=$(median ours-cold); seed=$(median seed-zst); floor=$(median floor); warm=$(median ours-warm)
echo
echo "| what | median s | peak RSS MB |"
echo "|---|---|---|"
for n in ours-cold ours-warm seed-zst floor; do echo "| $n | $(median $n) | $(peak $n) |"; done
python3 - "$ours" "$seed" "$floor" "$warm" <<'EOF'
import sys
ours, seed, floor, warm = map(float, sys.argv[1:])
print(f"\nours/seed-zst = {ours/seed:.2f}   ours/floor = {ours/floor:.2f}   warm = {warm*1000:.0f} ms")
EOF
