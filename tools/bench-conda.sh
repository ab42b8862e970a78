#!/usr/bin/env bash
# Benchmark: `cargo xtask conda unpack` against conda-package-handling's
# `cph extract` on one package of at least 100 MB that this script makes.
#
# Usage: tools/bench-conda.sh [RUNS]   (default 3 timed runs of each, after
# one untimed warm-up of each; the contenders are interleaved A B A B ...)
# Env: BENCH_DIR (default: a new directory under ${TMPDIR:-/tmp}), KEEP=1 to
# keep it. Needs: zstd, zip, python3 and cph (pip install -r
# tools/test-requirements.txt), GNU time for peak memory.
#
# The package: 8 x 10 MiB of random bytes (incompressible, like stripped
# binaries) plus 3000 text files of 20 KiB (base64, compressible), packed
# by GNU tar, `zstd -3` and `zip -0`: about 126 MB on disk, 140 MB unpacked.
# Ours installs into an empty prefix (staging + checks + journaled merge);
# cph extracts into an empty directory. Both write to the same filesystem.
# Prints the median of each, their ratio (ours / cph; below 1 is faster),
# and the peak RSS of each.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}

for tool in zstd zip python3 cph; do
  command -v "$tool" >/dev/null || { echo "bench-conda: $tool is missing (tools/test.sh installs the test tools)" >&2; exit 1; }
done
TIME=/usr/bin/time
[ -x "$TIME" ] || TIME=""

cargo build --quiet -p warmstart
XTASK=$(pwd)/target/debug/warmstart   # what `cargo xtask` runs

DIR=${BENCH_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/bench-conda.XXXXXX")}
mkdir -p "$DIR"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$DIR"' EXIT
cd "$DIR"

PKG=benchpkg-1.0-0.conda
if [ ! -f "$PKG" ]; then
  echo "making $PKG ..." >&2
  rm -rf src && mkdir -p src/lib src/share/data info-root/info
  for i in $(seq 1 8); do head -c $((10 << 20)) /dev/urandom > "src/lib/libbench$i.so"; done
  chmod 755 src/lib/*.so
  python3 - <<'EOF'
import base64, os
for i in range(3000):
    d = f"src/share/data/d{i % 30:02d}"
    os.makedirs(d, exist_ok=True)
    with open(f"{d}/f{i:05d}.txt", "wb") as f:
        f.write(base64.encodebytes(os.urandom(15000))[:20480])
EOF
  echo '{"name": "benchpkg", "version": "1.0", "build": "0", "build_number": 0}' > info-root/info/index.json
  tar -C info-root -cf info.tar info
  zstd -q info.tar -o info-benchpkg-1.0-0.tar.zst
  tar -C src -cf - lib share | zstd -q -3 -T0 -o pkg-benchpkg-1.0-0.tar.zst
  printf '{"conda_pkg_format_version": 2}' > metadata.json
  zip -q -0 -X "$PKG" metadata.json info-benchpkg-1.0-0.tar.zst pkg-benchpkg-1.0-0.tar.zst
  rm -rf src info-root info.tar ./*.tar.zst metadata.json
fi
SIZE=$(stat -c %s "$PKG")
[ "$SIZE" -ge 100000000 ] || { echo "bench-conda: package is only $SIZE bytes" >&2; exit 1; }
echo "package: $PKG, $SIZE bytes" >&2

# run NAME -> prints "seconds peak_kib"
run() {
  rm -rf out && sync
  local start end mem=0
  start=$(date +%s.%N)
  case $1 in
    ours) if [ -n "$TIME" ]; then $TIME -f %M -o mem.txt "$XTASK" conda unpack "$PKG" --into "$DIR/out" >/dev/null; else "$XTASK" conda unpack "$PKG" --into "$DIR/out" >/dev/null; fi ;;
    cph)  if [ -n "$TIME" ]; then $TIME -f %M -o mem.txt cph extract "$PKG" --dest "$DIR/out" >/dev/null; else cph extract "$PKG" --dest "$DIR/out" >/dev/null; fi ;;
  esac
  end=$(date +%s.%N)
  [ -n "$TIME" ] && mem=$(tail -1 mem.txt)
  echo "$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.3f", b - a}') $mem"
}

run ours >/dev/null; run cph >/dev/null   # warm-up: page cache, Python imports
ours=(); cph=(); ours_mem=0; cph_mem=0
for i in $(seq 1 "$RUNS"); do
  read -r t m < <(run ours); ours+=("$t"); [ "$m" -gt "$ours_mem" ] && ours_mem=$m
  read -r t m < <(run cph); cph+=("$t"); [ "$m" -gt "$cph_mem" ] && cph_mem=$m
  echo "run $i: ours ${ours[-1]} s, cph ${cph[-1]} s" >&2
done
rm -rf out

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
mo=$(median "${ours[@]}"); mc=$(median "${cph[@]}")
printf 'conda unpack benchmark: %s (%s bytes), %s runs each, medians\n' "$PKG" "$SIZE" "$RUNS"
printf '  warmstart conda unpack  %8.2f s   peak %6d MiB\n' "$mo" $((ours_mem / 1024))
printf '  cph extract             %8.2f s   peak %6d MiB\n' "$mc" $((cph_mem / 1024))
printf '  ratio ours/cph          %8.2f\n' "$(awk -v a="$mo" -v b="$mc" 'BEGIN {print a / b}')"
