#!/usr/bin/env bash
# Builds the warmstart of an earlier commit (default: the release the
# compatibility tests pin, tools/compat-commit.txt) and prints the path of
# its binary. tools/test.sh exports it as WARMSTART_COMPAT_BIN for
# tests/it/cache_files_parts.rs, which checks that branches this tree
# publishes are read correctly by the binaries adopters already run.
#
# The build shares CARGO_TARGET_DIR with the main one so that every
# dependency is reused (only the old crate itself compiles), and is cached
# by commit under $CARGO_TARGET_DIR/compat/<commit>/. The old crate is
# renamed (package warmstart-compat, lib warmstart_compat, binary
# warmstart-compat) so that it never overwrites the main build's
# target/debug/warmstart or libwarmstart.rlib. It needs the commit in this
# clone's history (a shallow CI checkout: fetch with --unshallow first).
set -euo pipefail
cd "$(dirname "$0")/.."
commit=${1:-$(tr -d '[:space:]' <tools/compat-commit.txt)}
target_dir=${CARGO_TARGET_DIR:-$(tools/target-dir.sh)}
dir=$target_dir/compat/$commit
bin=$dir/warmstart
if [ -x "$bin" ]; then
  echo "$bin"
  exit 0
fi
git cat-file -e "$commit^{commit}" 2>/dev/null || {
  echo "tools/compat-bin.sh: commit $commit is not in this clone (a shallow checkout? run git fetch --unshallow)" >&2
  exit 1
}
rm -rf "$dir"
mkdir -p "$dir/src"
git archive "$commit" | tar -x -C "$dir/src"
sed -i -e '0,/^name = "warmstart"$/s//name = "warmstart-compat"/' \
  -e 's/^name = "warmstart"$/name = "warmstart_compat"/' \
  -e '/^\[\[test\]\]$/,/^path = /d' "$dir/src/xtask/Cargo.toml"
sed -i -e '/^\[\[bin\]\]$/{n;s/^name = "warmstart_compat"$/name = "warmstart-compat"/}' "$dir/src/xtask/Cargo.toml"
sed -i 's/warmstart::main()/warmstart_compat::main()/' "$dir/src/xtask/src/main.rs"
t0=${EPOCHREALTIME/./}
CARGO_TARGET_DIR=$target_dir cargo build --offline --quiet \
  --manifest-path "$dir/src/Cargo.toml" -p warmstart-compat --bin warmstart-compat >&2
us=$((${EPOCHREALTIME/./} - t0))
cp "$target_dir/debug/warmstart-compat" "$bin.tmp"
mv "$bin.tmp" "$bin"
rm -rf "$dir/src"
echo "tools/compat-bin.sh: built warmstart $commit in $((us / 1000000)).$((us / 100000 % 10)) s" >&2
echo "$bin"
