#!/usr/bin/env bash
# CI gate job for any CI system: prove HEAD's tree with the gates of
# cache-manifests/gates.toml, share the green record, then publish caches.
#
#   tools/ci-gates.sh [CACHE...]
#
# 1. fetch the record someone may already have pushed for this tree (a failed
#    fetch is only a warning: every gate then runs here);
# 2. run the gates not green yet for this tree; a failing gate stops the job
#    here (exit 11) and nothing is published. A fetched record skips a gate
#    only where trust.toml sets `signed_gates` and an allowed signer signed
#    its entry; otherwise only records this clone wrote itself skip one, so a
#    record someone pushed never skips a gate here. With WARMSTART_SIGNING_KEY
#    set, the entries this job records are signed with it;
# 3. push the green record, so other machines can check it;
# 4. `cache publish --missing` each CACHE (default: every cache manifest, i.e.
#    every cache-manifests/*.toml except gates, restore and trust.toml): a key
#    the remote holds and HEAD's trust policy accepts is skipped with one line
#    (nothing packed or pushed), so a re-run after an unchanged landing costs
#    seconds; publish itself refuses unless that cache's required gates are
#    green for this tree.
#
# Environment: WARMSTART_REMOTE (default origin), XTASK (how to run warmstart,
# default `cargo xtask`; .github/workflows/gates.yml sets it to the binary it
# built), WARMSTART_SIGNING_KEY (the private key of an allowed signer, when
# cache-manifests/allowed_signers lists one: gate records and published keys
# are signed with it). Build the artifacts the caches pack before calling it.
set -euo pipefail
cd "$(dirname "$0")/.."

remote=${WARMSTART_REMOTE:-origin}
read -r -a xtask <<<"${XTASK:-cargo xtask}"

if ! "${xtask[@]}" gates fetch "$remote"; then
  echo "tools/ci-gates.sh: could not fetch gate records from $remote; running every gate here" >&2
fi
sign=()
if [ -n "${WARMSTART_SIGNING_KEY:-}" ]; then
  sign=(--sign)
fi
"${xtask[@]}" gates run --skip-green ${sign[@]+"${sign[@]}"}
"${xtask[@]}" gates push "$remote"

caches=("$@")
if [ ${#caches[@]} -eq 0 ]; then
  for manifest in cache-manifests/*.toml; do
    name=$(basename "$manifest" .toml)
    case "$name" in
      gates | restore | trust) ;; # warmstart::cache::manifest::RESERVED
      *) caches+=("$name") ;;
    esac
  done
fi
for cache in "${caches[@]}"; do
  echo "tools/ci-gates.sh: publishing $cache" >&2
  "${xtask[@]}" cache publish --missing "$cache"
done
