#!/usr/bin/env bash
# Session-start entry point: bring this machine back with `xtask restore`,
# fast even before Rust is warm.
#
#   tools/bootstrap.sh [RESTORE-ARGS...]      e.g. tools/bootstrap.sh --background
#   tools/bootstrap.sh --print-key            the xtask-bin cache key of this source
#   tools/bootstrap.sh --prebuilt-only ...    fail (exit 1) instead of compiling
#   tools/bootstrap.sh --no-prebuilt ...      always compile
#
# 1. If target/warmstart-bin/warmstart was installed for this exact source (the
#    key below; by this script or by the cache module's xtask-bin restore),
#    exec it: no network, no compiler.
# 2. Else, if origin's `xtask-bin-cache` branch holds the key, fetch it with git
#    and coreutils only (DESIGN.md "Coreutils path"): git fetch --depth 1,
#    git archive | tar -x, sha256sum -c, cat parts | zstd -d | tar -x. Nothing
#    unverified is decompressed; the install is a rename.
# 3. Else compile: cargo build --release -p warmstart.
# Then: exec xtask restore "$@".
set -euo pipefail

say() { echo "bootstrap: $*" >&2; }

root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
cd "$root"
git_dir=$(git rev-parse --absolute-git-dir)
remote=${WARMSTART_BOOTSTRAP_REMOTE:-origin}
branch=xtask-bin-cache                    # cache-manifests/xtask-bin.toml [cache] branch
install_dir=$root/target/warmstart-bin    # cache-manifests/xtask-bin.toml [restore] path
stamp=$git_dir/warmstart/bootstrap/xtask-bin.key
cache_stamp=$git_dir/warmstart/cache/stamps/xtask-bin.json   # warmstart::cache::stamp::path
fetch_timeout=${WARMSTART_BOOTSTRAP_FETCH_TIMEOUT:-60}

# ---- the cache key: keep in step with cache-manifests/xtask-bin.toml and
# ---- warmstart::cache::manifest::compute_key (tests/it/restore.rs checks that both agree).
# Key = sanitize(name) "-" sanitize(platform) "-" git-tree digest, where
#   platform = `{arch}-{os}` as Rust's std::env::consts spell them,
#   digest   = first 16 hex of sha256 over `git rev-parse HEAD:xtask HEAD:Cargo.toml HEAD:Cargo.lock`,
#   sanitize = every character outside [A-Za-z0-9._+] becomes `_`.
xtask_bin_key() {
  local arch os digest
  arch=$(uname -m)
  case "$arch" in arm64) arch=aarch64 ;; esac
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=macos ;;
    FreeBSD) os=freebsd ;;
    *) os=$(uname -s | tr '[:upper:]' '[:lower:]') ;;
  esac
  digest=$(git rev-parse HEAD:xtask HEAD:Cargo.toml HEAD:Cargo.lock | sha256sum | cut -c1-16)
  printf '%s-%s-%s\n' "xtask_bin" "$(printf '%s' "$arch-$os" | tr -c 'A-Za-z0-9._+' '_')" "$digest"
}
# ---- end of the key

prebuilt=auto
case "${1:-}" in
  --print-key) xtask_bin_key; exit 0 ;;
  --prebuilt-only) prebuilt=only; shift ;;
  --no-prebuilt) prebuilt=never; shift ;;
esac

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT

run_restore() {
  local bin=$1; shift
  [ -z "$tmp" ] || rm -rf "$tmp"   # exec skips the EXIT trap
  say "running $bin restore $*"
  exec "$bin" restore "$@"
}

build() {
  if [ "$prebuilt" = only ]; then
    say "no prebuilt warmstart for this source, and --prebuilt-only was given"
    exit 1
  fi
  say "compiling warmstart (cargo build --release -p warmstart)"
  cargo build --release --quiet -p warmstart
  run_restore "$root/target/release/warmstart" "$@"
}

[ "$prebuilt" = never ] && build "$@"

# A prebuilt binary is only right for the committed source: local edits to
# what goes into the build mean compiling.
if [ -n "$(git status --porcelain -- xtask Cargo.toml Cargo.lock)" ]; then
  say "xtask/, Cargo.toml or Cargo.lock has local changes: the prebuilt binary does not match"
  build "$@"
fi
key=$(xtask_bin_key)

# Warm: installed for this key already, by this script (its key file) or by
# `xtask cache restore xtask-bin` / restore.toml's xtask-bin step (the cache
# module's stamp, a JSON file that names the installed key).
if [ -x "$install_dir/warmstart" ] && { [ "$(cat "$stamp" 2>/dev/null)" = "$key" ] ||
  grep -qF "\"key\": \"$key\"," "$cache_stamp" 2>/dev/null; }; then
  run_restore "$install_dir/warmstart" "$@"
fi

# Fetches and installs the prebuilt binary for $key. Called in an `if`, where
# bash ignores `set -e`: every step checks its own status.
fetch_prebuilt() {
  command -v zstd >/dev/null || { say "zstd is not installed: cannot unpack the prebuilt binary"; return 1; }
  timeout "$fetch_timeout" git fetch --quiet --depth 1 --no-tags "$remote" "refs/heads/$branch" 2>/dev/null ||
    { say "no $branch branch on $remote (or $remote unreachable within ${fetch_timeout}s)"; return 1; }
  local commit name prefix="$key.tar.zst.part"
  local parts=()
  commit=$(git rev-parse FETCH_HEAD) || return 1
  while IFS= read -r name; do
    case "$name" in
      "$prefix"*) [[ ${name#"$prefix"} =~ ^[0-9]+$ ]] && parts+=("$name") ;;
    esac
  done < <(git ls-tree --name-only "$commit" | LC_ALL=C sort)
  [ ${#parts[@]} -gt 0 ] || { say "$branch has no $key (it was published for another source)"; return 1; }

  mkdir -p "$root/target" || return 1
  tmp=$(mktemp -d "$root/target/.bootstrap-XXXXXX") || return 1
  mkdir -p "$tmp/branch" "$tmp/stage" || return 1
  git archive "$commit" SHA256SUMS "${parts[@]}" | tar -x -C "$tmp/branch" || return 1
  # Every part needs its own line in SHA256SUMS, and every line must check,
  # before a single byte reaches zstd.
  awk -v p="$prefix" 'length($1) == 64 && index($2, p) == 1 && substr($2, length(p) + 1) ~ /^[0-9]+$/' \
    "$tmp/branch/SHA256SUMS" > "$tmp/key.sums" || return 1
  [ "$(wc -l < "$tmp/key.sums")" -eq ${#parts[@]} ] ||
    { say "SHA256SUMS on $branch does not list every part of $key: not installing"; return 1; }
  (cd "$tmp/branch" && sha256sum --quiet -c "$tmp/key.sums" >&2) ||
    { say "sha256sum -c failed for $key on $branch: not installing"; return 1; }
  (cd "$tmp/branch" && cat "${parts[@]}") | zstd -d -q | tar -x -C "$tmp/stage" --no-same-owner ||
    { say "unpacking $key failed: not installing"; return 1; }
  [ -x "$tmp/stage/warmstart" ] || { say "$key does not hold an executable warmstart"; return 1; }
  # Swap in by rename; the old copy goes only once the new one is in place.
  mkdir -p "$(dirname "$install_dir")" "$(dirname "$stamp")" || return 1
  if [ -e "$install_dir" ]; then mv "$install_dir" "$tmp/old" || return 1; fi
  mv "$tmp/stage" "$install_dir" || return 1
  printf '%s\n' "$key" > "$stamp.tmp" && mv "$stamp.tmp" "$stamp" || return 1
  say "installed prebuilt $key from $remote $branch@${commit:0:12}"
}

if fetch_prebuilt; then
  run_restore "$install_dir/warmstart" "$@"
fi
build "$@"
