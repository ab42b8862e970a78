#!/usr/bin/env bash
# Builds the `warmstart` Python wheel: the release binary, packed by maturin's
# binary mode (as ruff and uv ship theirs), linked through zig against glibc
# 2.17 so that it installs on machines older than this one (manylinux_2_17).
#
#   tools/build-wheel.sh            # -> $target/wheels/warmstart-VER-py3-none-manylinux_2_17_x86_64.whl
#
# It is the one release build of a test run: tools/test.sh hands the wheel to
# the tests (WARMSTART_TEST_WHEEL), and the binary inside it serves the
# adopter test and tools/bench-bootstrap-paths.sh too.
#
# 1. The tools (maturin, ziglang, auditwheel) go into $target/wheel-venv from
#    tools/wheel-requirements.txt, pinned with hashes (pip --require-hashes).
# 2. maturin build --release --zig (tools/wheel/pyproject.toml).
# 3. Checks, each of which fails the build: auditwheel names the wheel
#    manylinux_2_17 compatible, and no symbol the binary imports needs a
#    glibc newer than 2.17 (objdump -T, read independently of auditwheel).
# 4. Writes $target/wheels/warmstart.requirements.txt: the exact version and
#    sha256 line that `pip install --require-hashes -r` takes (tools/wheel-requirement.sh).
# Prints the wheel's path on stdout; everything else goes to stderr.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
venv=$target/wheel-venv
out=$target/wheels
say() { echo "build-wheel: $*" >&2; }

# The venv is remade when the requirements change (their digest is its stamp).
want=$(sha256sum < "$root/tools/wheel-requirements.txt" | cut -c1-64)
if [ "$(cat "$venv/.requirements-sha256" 2>/dev/null)" != "$want" ]; then
  say "installing maturin, ziglang and auditwheel into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --only-binary :all: \
    -r "$root/tools/wheel-requirements.txt" >&2
  echo "$want" > "$venv/.requirements-sha256"
fi

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/xtask/Cargo.toml" | head -1)
[ -n "$version" ] || { say "no version line in xtask/Cargo.toml"; exit 1; }
# Old wheels of other versions would make "the wheel" ambiguous.
rm -f "$out"/warmstart-*.whl
# maturin finds zig as `python -m ziglang` of the first python on PATH.
(cd "$root/tools/wheel" && PATH=$venv/bin:$PATH nice maturin build --release --zig --quiet -o "$out" >&2)
wheel=$(ls "$out"/warmstart-"$version"-*.whl)
[ "$(echo "$wheel" | wc -l)" = 1 ] || { say "expected one wheel in $out, found: $wheel"; exit 1; }

# auditwheel: the platform tag the wheel's binary is consistent with.
report=$("$venv/bin/auditwheel" show "$wheel")
if ! grep -qE '"manylinux_2_17_x86_64"|manylinux_2_17_x86_64' <<<"$report"; then
  say "auditwheel does not call $wheel manylinux_2_17 compatible:"
  echo "$report" >&2
  exit 1
fi
# objdump: the newest GLIBC_x.y among the binary's imported symbol versions.
stage=$(mktemp -d "$out/.check-XXXXXX")
trap 'rm -rf "$stage"' EXIT
unzip -q -o -j "$wheel" "warmstart-$version.data/scripts/*" -d "$stage"
newest=$(objdump -T "$stage"/* | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -t. -k1,1n -k2,2n -k3,3n | tail -1)
if [ -z "$newest" ] || [ "$(printf '%s\n2.17\n' "$newest" | sort -t. -k1,1n -k2,2n | tail -1)" != 2.17 ]; then
  say "the binary in $wheel needs GLIBC_${newest:-?}, newer than manylinux_2_17 allows"
  exit 1
fi
"$root/tools/wheel-requirement.sh" "$wheel" > "$out/warmstart.requirements.txt"
say "$(basename "$wheel"): auditwheel manylinux_2_17, newest glibc symbol GLIBC_$newest"
echo "$wheel"
