#!/usr/bin/env bash
# The build half of a release: everything .github/workflows/release.yml
# uploads, made here, so that tools/test.sh builds a release on every run
# and the workflow adds only the uploads.
#
#   tools/release-build.sh        # prints the directory, $target/dist, holding:
#     warmstart-VER.crate                   what `cargo publish` uploads (cargo package)
#     warmstart-VER-py3-none-manylinux_2_17_x86_64.whl   the wheel (tools/build-wheel.sh)
#     warmstart-VER-x86_64-linux.tar.gz     the standalone binary (the one inside the wheel)
#     SHA256SUMS                            of the three, checked with sha256sum -c
#
# WHEEL=FILE takes a wheel tools/build-wheel.sh already built (tools/test.sh
# passes the run's one release build). RELEASE_VERIFY=1 also builds the crate
# from its tarball, as `cargo publish` will (about 3 minutes: every dependency
# again, under the package's own profile); without it the crate is packed
# with --no-verify, and tools/test.sh's `cargo package --list` checks its files.
# Either way the crate is then checked from its own tarball (`cargo check`,
# about 20 s): it must compile without the workspace's tests/ and tools/, in
# a scratch workspace that has only the root's profiles and lockfile, so the
# dependencies already checked by clippy are reused.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
dist=$target/dist
say() { echo "release-build: $*" >&2; }

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/xtask/Cargo.toml" | head -1)
[ -n "$version" ] || { say "no version line in xtask/Cargo.toml"; exit 1; }
rm -rf "$dist"
mkdir -p "$dist"

verify=(--no-verify)
[ "${RELEASE_VERIFY:-}" != 1 ] || verify=()
(cd "$root" && cargo package --quiet --locked -p warmstart --allow-dirty "${verify[@]}" >&2)
cp "$target/package/warmstart-$version.crate" "$dist/"

stage=$(mktemp -d "$target/.release-XXXXXX")
trap 'rm -rf "$stage"' EXIT
tar -C "$stage" -xzf "$dist/warmstart-$version.crate"
{
  printf '[workspace]\nmembers = ["warmstart-%s"]\n' "$version"
  sed -n 's/^resolver = .*/&/p' "$root/Cargo.toml"
  sed -n '/^\[profile/,$p' "$root/Cargo.toml"
} > "$stage/Cargo.toml"
cp "$root/Cargo.lock" "$stage/"
(cd "$stage" && CARGO_TARGET_DIR=$target cargo check --quiet --locked --offline >&2) ||
  { say "the crate does not build from its own tarball ($dist/warmstart-$version.crate)"; exit 1; }

wheel=${WHEEL:-$("$root/tools/build-wheel.sh")}
cp "$wheel" "$dist/"

# The standalone binary: the wheel's own (one release build, glibc 2.17).
name=warmstart-$version-x86_64-linux
mkdir "$stage/$name"
unzip -q -j "$wheel" "warmstart-$version.data/scripts/warmstart" -d "$stage/$name"
chmod 755 "$stage/$name/warmstart"
"$stage/$name/warmstart" --version >&2
tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -czf "$dist/$name.tar.gz" "$name"

(cd "$dist" && sha256sum -- *.crate *.whl *.tar.gz > SHA256SUMS && sha256sum --quiet -c SHA256SUMS)
say "$(wc -l < "$dist/SHA256SUMS") files in $dist"
echo "$dist"
