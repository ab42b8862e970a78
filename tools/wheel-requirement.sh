#!/usr/bin/env bash
# Prints the pip requirement that pins a built warmstart wheel: its exact
# version and sha256, the form `pip install --require-hashes -r FILE` takes
# (the generated bootstrap script's registry step commits this line).
#
#   tools/wheel-requirement.sh target/wheels/warmstart-0.1.0-py3-none-manylinux_2_17_x86_64.whl
#   warmstart==0.1.0 --hash=sha256:<64 hex>
#
# The version is the wheel file name's (PEP 427: name-version-tags.whl).
# warmstart::wheel::requirement_line computes the same line in Rust
# (tests/it/wheel.rs checks that both agree).
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: tools/wheel-requirement.sh WHEEL" >&2; exit 2; }
wheel=$1
[ -f "$wheel" ] || { echo "wheel-requirement: $wheel is not a file: give the path of a built .whl" >&2; exit 1; }
base=$(basename "$wheel")
if ! [[ $base =~ ^warmstart-([0-9A-Za-z.+!]+)-[^-]+-[^-]+-[^-]+\.whl$ ]]; then
  echo "wheel-requirement: $base is not named warmstart-VERSION-PY-ABI-PLATFORM.whl" >&2
  exit 1
fi
digest=$(sha256sum "$wheel" | cut -c1-64)
printf 'warmstart==%s --hash=sha256:%s\n' "${BASH_REMATCH[1]}" "$digest"
