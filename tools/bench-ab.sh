#!/usr/bin/env bash
# A/B of the restore path: two warmstart binaries restore the same published
# cache in one run, interleaved, and the medians are compared.
#
#   tools/bench-ab.sh BASE_BIN NEW_BIN [SRC]
#   ROUNDS=5 WARM=21 TTY=0 tools/bench-ab.sh old/warmstart target/debug/warmstart
#
# SRC is the tree to cache (default: `rustc --print sysroot`, BENCHMARKS.md's
# workload, about 1.3 GB). It is published once, by BASE_BIN, to a local bare
# repository set up like a hosting server (receive.unpackLimit 1,
# uploadpack.allowFilter true). Then, ROUNDS times (default 3), each binary
# does a cold `cache restore` (a fresh clone, an empty target) with stderr
# to a pipe, as BENCHMARKS.md measures it, and, with TTY=1 (the default),
# a second cold restore on a pseudo-terminal (util-linux `script`), where
# the progress bars are drawn. The order alternates per round (A B, then
# B A), after one untimed restore of each. Then WARM warm restores (default 15) of each, interleaved. Each is
# timed as wall and CPU (user+sys, git's children included). Every
# restored tree is kept until the end (BENCHMARKS.md, "Method notes":
# deleting a big tree slows the restores that follow), and `sync` runs,
# untimed, before each timed command. Prints the medians and NEW/BASE;
# exits 1 when a ratio is above MAX_RATIO (default 1.05). On a busy machine
# the wall times swing by 2x between runs of the same binary; trust the
# CPU ratios then, and run again when the wall ratios disagree with them.
#
# INSNS=1 counts instructions instead (see below; needs valgrind).
#
# The machine is shared: run it under `nice`, and compare only the ratios
# of one run.
set -euo pipefail
shopt -s inherit_errexit

if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: tools/bench-ab.sh BASE_BIN NEW_BIN [SRC]" >&2
  exit 2
fi
base=$(realpath "$1")
new=$(realpath "$2")
for b in "$base" "$new"; do
  [ -x "$b" ] || { echo "bench-ab: $b is not an executable warmstart binary" >&2; exit 2; }
done
src=${3:-$(rustc --print sysroot)}
src=$(realpath "$src")
[ -d "$src" ] || { echo "bench-ab: $src is not a directory" >&2; exit 2; }
rounds=${ROUNDS:-3}
warm=${WARM:-15}
tty=${TTY:-1}
max_ratio=${MAX_RATIO:-1.05}
case "$rounds$warm" in *[!0-9]*) echo "bench-ab: ROUNDS and WARM take whole numbers" >&2; exit 2 ;; esac
case "$tty" in 0 | 1) ;; *) echo "bench-ab: TTY takes 0 or 1, not $tty" >&2; exit 2 ;; esac
if [ "$tty" = 1 ] && ! command -v script >/dev/null; then
  echo "bench-ab: TTY=1 needs util-linux script (apt-get install bsdutils), or run with TTY=0" >&2
  exit 2
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-ab-XXXXXX")
trap 'rm -rf "$work"' EXIT
for v in $(env | sed -n 's/^\(\(GIT\|WARMSTART\)_[A-Za-z0-9_]*\)=.*/\1/p'); do unset "$v"; done
export HOME=$work GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=$work/.gitconfig NO_COLOR=1 \
  GIT_AUTHOR_NAME=bench GIT_AUTHOR_EMAIL=bench@warmstart.invalid \
  GIT_COMMITTER_NAME=bench GIT_COMMITTER_EMAIL=bench@warmstart.invalid

log() { printf 'bench-ab: %s\n' "$*" >&2; }

git init -q --bare "$work/remote.git"
git -C "$work/remote.git" config receive.unpackLimit 1
git -C "$work/remote.git" config uploadpack.allowFilter true
git init -q -b main "$work/repo"
mkdir "$work/repo/cache-manifests"
# BENCH_AB_DEST, not a WARMSTART_* name: the binary refuses unknown ones.
# shellcheck disable=SC2016 # ${BENCH_AB_DEST} is for the binary to expand
printf '[[key]]\nname = "v"\nliteral = "bench"\n\n[pack]\nroot = "%s"\n\n[restore]\npath = "${BENCH_AB_DEST}"\n' \
  "$src" >"$work/repo/cache-manifests/bench.toml"
git -C "$work/repo" add -A
git -C "$work/repo" commit -q -m bench

# A file every restore must have brought back.
probe=$(cd "$src" && find . -type f -print -quit)
[ -n "$probe" ] || { echo "bench-ab: $src has no files" >&2; exit 2; }

log "publishing $src with $base"
(cd "$work/repo" && BENCH_AB_DEST=$work/unused "$base" cache publish bench --quiet --remote "$work/remote.git")

# "WALL CPU" seconds of "$@" (its output to $work/out), after an untimed
# sync. CPU is user+sys of the process and the children it waited for
# (git's): on a busy machine it moves far less than the wall time.
timed() {
  sync
  local TIMEFORMAT='%R %U %S' rc=0
  { time "$@" >"$work/out" 2>&1 || rc=$?; } 2>"$work/time"
  if [ "$rc" != 0 ]; then
    log "$* failed (exit $rc): $(tail -n 5 "$work/out")"
    exit 1
  fi
  awk '{ printf "%.4f %.4f\n", $1, $2 + $3 }' "$work/time"
}

# One cold restore by binary $1 (label $2) in mode $3 (pipe or tty), run $4.
cold() {
  local bin=$1 label=$2 mode=$3 run=$4
  local clone=$work/clone-$label-$mode-$run dest=$work/dest-$label-$mode-$run
  git clone -q "$work/repo" "$clone"
  local t
  if [ "$mode" = tty ]; then
    t=$(cd "$clone" && BENCH_AB_DEST=$dest TERM=xterm timed script --quiet --return \
      --command "$bin cache restore bench --remote $work/remote.git" /dev/null)
  else
    t=$(cd "$clone" && BENCH_AB_DEST=$dest timed "$bin" cache restore bench --quiet \
      --remote "$work/remote.git")
  fi
  [ -f "$dest/$probe" ] || {
    log "$label did not restore $probe into $dest: $(tail -n 5 "$work/out")"
    exit 1
  }
  echo "$t" >>"$work/times-$mode-$label"
  log "round $run: $label $mode cold restore, wall and CPU s: $t"
  # The warm runs reuse the last pipe-mode clone.
  if [ "$mode" = pipe ]; then
    echo "$clone $dest" >"$work/last-$label"
  fi
}

warm_one() {
  local bin=$1 label=$2
  local clone dest t
  read -r clone dest <"$work/last-$label"
  t=$(cd "$clone" && BENCH_AB_DEST=$dest timed "$bin" cache restore bench --quiet \
    --remote "$work/remote.git")
  echo "$t" >>"$work/times-warm-$label"
}

if [ "${INSNS:-0}" = 1 ]; then
  # Instructions instead of times: one cold restore of each under
  # valgrind (cachegrind, no cache simulation), which counts warmstart's
  # own instructions only (git, the same for both, runs natively). Slow
  # (about 50x), but as good as deterministic on a busy machine: use a
  # tree of tens of MB.
  command -v valgrind >/dev/null || { echo "bench-ab: INSNS=1 needs valgrind (apt-get install valgrind)" >&2; exit 2; }
  for who in base new; do
    if [ "$who" = base ]; then bin=$base; else bin=$new; fi
    clone=$work/clone-$who-insns
    git clone -q "$work/repo" "$clone"
    (cd "$clone" && BENCH_AB_DEST=$work/dest-$who-insns timed valgrind --tool=cachegrind --cache-sim=no \
      --cachegrind-out-file=/dev/null "$bin" cache restore bench --quiet --remote "$work/remote.git") >/dev/null
    [ -f "$work/dest-$who-insns/$probe" ] || { log "$who did not restore under valgrind: $(tail -n 5 "$work/out")"; exit 1; }
    sed -n 's/.*I *refs: *\([0-9,]*\).*/\1/p' "$work/out" | tr -d , >"$work/insns-$who"
    log "$who: $(cat "$work/insns-$who") instructions"
  done
  b=$(cat "$work/insns-base")
  n=$(cat "$work/insns-new")
  ratio=$(awk -v n="$n" -v b="$b" 'BEGIN { printf "%.4f", n / b }')
  printf '\n| cold restore, instructions of the warmstart process | base | new | new / base |\n|---|---:|---:|---:|\n'
  printf '| %s | %s | %s | %s |\n' "$(basename "$src")" "$b" "$n" "$ratio"
  awk -v r="$ratio" -v m="$max_ratio" 'BEGIN { exit !(r <= m) }'
  exit
fi

modes=pipe
[ "$tty" = 1 ] && modes="pipe tty"
# One untimed restore each first: the first restores after the publish
# took twice the CPU of the later ones, for both binaries.
cold "$base" base pipe 0
cold "$new" new pipe 0
rm -f "$work/times-pipe-base" "$work/times-pipe-new"
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) = 1 ]; then order="base new"; else order="new base"; fi
  for mode in $modes; do
    for who in $order; do
      if [ "$who" = base ]; then cold "$base" base "$mode" "$r"; else cold "$new" new "$mode" "$r"; fi
    done
  done
done
for _ in $(seq 1 "$warm"); do
  warm_one "$base" base
  warm_one "$new" new
done

# The median of column $2 of file $1.
median() { cut -d' ' -f"$2" "$1" | sort -g | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

status=0
printf '\n| restore (%s rounds, warm: %s runs), medians | base s | new s | new / base | <= %s |\n|---|---:|---:|---:|---|\n' \
  "$rounds" "$warm" "$max_ratio"
for mode in $modes warm; do
  case $mode in
    pipe) what="cold, stderr to a pipe" ;;
    tty) what="cold, on a pty (bars drawn)" ;;
    warm) what="warm" ;;
  esac
  for col in 1 2; do
    b=$(median "$work/times-$mode-base" "$col")
    n=$(median "$work/times-$mode-new" "$col")
    ratio=$(awk -v n="$n" -v b="$b" 'BEGIN { printf "%.3f", (b > 0) ? n / b : 1 }')
    ok=$(awk -v r="$ratio" -v m="$max_ratio" 'BEGIN { print (r <= m) ? 1 : 0 }')
    [ "$ok" = 1 ] || status=1
    printf '| %s, %s | %.4f | %.4f | %s | %s |\n' "$what" "$([ "$col" = 1 ] && echo wall || echo CPU)" \
      "$b" "$n" "$ratio" "$([ "$ok" = 1 ] && echo yes || echo no)"
  done
done
printf '\nsource: %s (%s files, %s)\n' "$src" "$(find "$src" -type f | wc -l)" "$(du -sh "$src" | cut -f1)"
exit "$status"
