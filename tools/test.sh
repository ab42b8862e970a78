#!/usr/bin/env bash
# The one command that runs every test (README, "Two commands"); .ci/run calls exactly this.
# It installs what the tests need on a fresh machine, then checks formatting,
# lints, and runs the whole test suite against real git, zstd, zip and node.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v zstd >/dev/null || need_apt+=(zstd)
command -v zip >/dev/null || need_apt+=(zip)
command -v unzip >/dev/null || need_apt+=(unzip)
command -v node >/dev/null || need_apt+=(nodejs)
command -v curl >/dev/null || need_apt+=(curl)
command -v objdump >/dev/null || need_apt+=(binutils)
command -v python3 >/dev/null || need_apt+=(python3 python3-pip)
python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
[ -x "$(git --exec-path)/git-daemon" ] || need_apt+=(git-daemon-sysvinit)
[ -x "$(git --exec-path)/git-http-backend" ] || need_apt+=(git)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "tools/test.sh: installing ${need_apt[*]}" >&2
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"
  else
    echo "tools/test.sh: missing ${need_apt[*]}; run as root or install them" >&2
    exit 1
  fi
fi
if ! cargo nextest --version >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi
if [ -f tools/test-requirements.txt ]; then
  python3 -m pip install -q --disable-pip-version-check -r tools/test-requirements.txt
fi

# TEST_SH_DEPS_ONLY=1: stop here, with the test tools installed (CI gate jobs,
# see tools/ci-gates.sh and .github/workflows/gates.yml, then run the checks as gates).
if [ "${TEST_SH_DEPS_ONLY:-}" = 1 ]; then
  exit 0
fi

cargo fmt --all -- --check
cargo clippy --all-targets --quiet -- -D warnings
# The run's one release build: the warmstart wheel (tools/build-wheel.sh,
# maturin --zig, checked manylinux_2_17). tests/it/wheel.rs installs it, and
# the release binary inside it serves the adopter test and
# tools/bench-bootstrap-paths.sh.
WARMSTART_TEST_WHEEL=$(tools/build-wheel.sh)
export WARMSTART_TEST_WHEEL
# Smoke test of the cache benchmark on a small generated tree (~20 s): it
# must run end to end; it never asserts a time. Before nextest, so that
# nextest's summary stays the last thing printed.
python3 tools/bench-cache.py --quick >/dev/null
# Rounds of each 8-publisher race in tests/it/cache_concurrency.rs (one
# clone, eight clones); set it higher by hand to hunt for a rare loss.
export WARMSTART_TEST_CONCURRENT_ROUNDS="${WARMSTART_TEST_CONCURRENT_ROUNDS:-2}"
# The containment property test (tests/it/containment_property.rs) runs this
# many hostile archive sequences through each resolver (openat2, the walk).
export WARMSTART_CONTAINMENT_SEQUENCES="${WARMSTART_CONTAINMENT_SEQUENCES:-500}"
cargo nextest run --workspace --no-fail-fast "$@"
