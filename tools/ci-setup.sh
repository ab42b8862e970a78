#!/usr/bin/env bash
# warmstart's own CI setup, which .github/workflows/gates.yml runs before the
# gates when this file exists (an adopter's repository has its own or none):
# the test tools that cache-manifests/gates.toml's gates need (cargo-nextest
# and the Python tools, in target/test-venv), installed as tools/test.sh
# does, their directories appended to $GITHUB_PATH for the steps after it.
set -euo pipefail
cd "$(dirname "$0")/.."
TEST_SH_DEPS_ONLY=1 TEST_SH_TOOLS_PATH="${GITHUB_PATH:?set by GitHub Actions: the file of PATH additions}" tools/test.sh
