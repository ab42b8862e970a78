#!/usr/bin/env bash
# Prints cargo's target directory for this workspace, as cargo resolves it
# (CARGO_TARGET_DIR, a target-dir in cargo's config, or ./target): the one
# place the scripts in tools/ learn where the build output is.
set -euo pipefail
meta=$(cargo metadata --format-version 1 --no-deps --manifest-path "$(dirname "$0")/../Cargo.toml")
# cargo prints compact JSON; a path that needs JSON escapes is not supported.
dir=$(printf '%s\n' "$meta" | sed -n 's/.*"target_directory":"\([^"\\]*\)".*/\1/p')
if [ -z "$dir" ]; then
  echo "tools/target-dir.sh: no plain target_directory in cargo metadata's output" >&2
  exit 1
fi
printf '%s\n' "$dir"
