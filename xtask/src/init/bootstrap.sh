#!/usr/bin/env bash
# Session-start entry point: get this repository's warmstart binary with no
# compiler when possible, then bring the machine back with `<binary> restore`.
# Needs git, coreutils and zstd (python3 for the registry step only, ssh-keygen
# where the trust policy asks for signed caches).
#
#   tools/warmstart-bootstrap.sh [RESTORE-ARGS...]    e.g. --background
#   tools/warmstart-bootstrap.sh --print-key          the binary cache key of this checkout
#   tools/warmstart-bootstrap.sh --prebuilt-only ...  fail (exit 1; 12 after a refusal, 8 after a deadline) rather than compile
#   tools/warmstart-bootstrap.sh --no-prebuilt ...    always compile
#   tools/warmstart-bootstrap.sh --build-only         compile, print the binary's path, restore nothing (CI)
#
# Everything it knows comes from the one cache manifest with a [bootstrap]
# table (cache-manifests/*.toml): the ref, the key pins, the restore path,
# the executable, the registry pin and the compile command. `warmstart init`
# wrote this file (`warmstart init --help`).
#
# The order, each step saying which happened:
# 0. warm: the executable was installed for this exact key (by this script, or
#    by `cache restore` of that manifest): exec it, no network;
# 1. binary cache: fetch the key from the cache ref with git alone (one
#    bootstrap at a time per clone: a second one started meanwhile waits for
#    the first, then finds the binary installed); where
#    the trust policy asks, check its signed statement with `ssh-keygen -Y
#    verify` (no ssh-keygen and policy require: refused, on to the next
#    step); read only regular blobs of the sizes warmstart.json names (never
#    a symlink, gitlink, tree or executable where a part is expected); check
#    every part with `sha256sum -c` before a byte is decompressed, every
#    step that reads data under a deadline; install by rename;
# 2. registry: `pip install --require-hashes` of the exact version and hashes
#    the manifest pins (omitted until a version is published);
# 3. compile: the manifest's build command.
# Then: exec <binary> restore "$@".
set -euo pipefail
# warmstart-bootstrap-reads: regular-blobs deadline head-trust
# (`warmstart init --check` reads this line: a bootstrap without it predates
# those checks and is reported stale.)

say() { echo "bootstrap: $*" >&2; }
die() { say "$*"; exit 1; }
# The last fallback failed: exit 12 when a binary cache was refused on the
# way (untrusted, or a part that is not a regular blob of its size), 8 when
# a step ran past its deadline (the codes warmstart itself exits with for these), else 1.
give_up() {
  say "$*"
  if [ -n "${untrusted:-}" ]; then exit 12; fi
  if [ -n "${timed_out:-}" ]; then exit 8; fi
  exit 1
}

root=$(git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel)
cd "$root"
git_dir=$(git rev-parse --absolute-git-dir)

# ---- the manifest
found=()
for f in cache-manifests/*.toml; do
  if grep -q '^\[bootstrap\]' "$f"; then found+=("$f"); fi
done
[ ${#found[@]} -eq 1 ] ||
  die "need exactly one cache manifest with a [bootstrap] table in cache-manifests/, found ${#found[@]}: run \`warmstart init\`"
manifest=${found[0]}
name=$(basename "$manifest" .toml)

# The TOML subset the binary allows in this manifest (warmstart refuses any
# other form there with exit 10): `[table]`, `[[key]]`, and `name = "text"`,
# `= true|false`, `= 123` or `= ["a", "b"]` on one line, strings without `"`
# or `\`, comments. Prints one record per value: table, index, field, value
# (array items separated by \037).
records() {
  LC_ALL=C awk '
    function fail(why) { printf "%s:%d: %s\n", FILENAME, NR, why > "/dev/stderr"; bad = 1; exit 1 }
    /[^\t -~]/ { fail("not printable ASCII (the key is sanitised byte by byte here)") }
    /^[ \t]*(#.*)?$/ { next }
    /^\[\[key\]\][ \t]*(#.*)?$/ { table = "key"; n++; next }
    /^\[[A-Za-z_]+\][ \t]*(#.*)?$/ { table = $0; sub(/^\[/, "", table); sub(/\].*$/, "", table); next }
    /^[A-Za-z_]+[ \t]*=/ {
      field = $0; sub(/[ \t]*=.*$/, "", field)
      rest = $0; sub(/^[A-Za-z_]+[ \t]*=[ \t]*/, "", rest)
      tail = "[ \t]*(#.*)?$"
      str = "\"[^\"\\\\]*\""
      arr = "\\[[ \t]*(" str "[ \t]*,[ \t]*)*(" str "[ \t]*)?\\]"
      if (match(rest, "^" str tail)) {
        match(rest, "^" str); v = substr(rest, 2, RLENGTH - 2)
      } else if (match(rest, "^(true|false|-?[0-9]+)" tail)) {
        v = rest; sub(/[ \t#].*$/, "", v)
      } else if (match(rest, "^" arr tail)) {
        match(rest, "^" arr); s = substr(rest, 1, RLENGTH); v = ""; k = 0
        while (match(s, /"[^"]*"/)) {
          item = substr(s, RSTART + 1, RLENGTH - 2); s = substr(s, RSTART + RLENGTH)
          v = (k++ ? v "\037" : "") item
        }
      } else fail("outside the TOML subset the bootstrap reads (one-line values, no escapes)")
      printf "%s\t%d\t%s\t%s\n", table, (table == "key" ? n : 0), field, v
      next
    }
    { fail("outside the TOML subset the bootstrap reads") }
  ' "$1"
}

branch=$name-cache cache_ref="" remote="" restore_path="" exec_name="" built="" pip_req=""
build=() pip_hashes=() pin_names=() pin_kinds=() pin_values=()
trust_policy="" trust_allow_ungated=false trust_principals=()
rows=$(records "$manifest") || die "$manifest cannot be read by this script (see above)"
while IFS=$'\t' read -r table idx field value; do
  case "$table.$field" in
    cache.branch) branch=$value ;;
    cache.ref) cache_ref=$value ;;
    cache.remote) remote=$value ;;
    restore.path) restore_path=$value ;;
    bootstrap.exec) exec_name=$value ;;
    bootstrap.built) built=$value ;;
    bootstrap.build) IFS=$'\037' read -r -a build <<<"$value" ;;
    bootstrap.pip) pip_req=$value ;;
    bootstrap.pip_hashes) IFS=$'\037' read -r -a pip_hashes <<<"$value" ;;
    trust.*) ;; # read from HEAD's copy of the manifest below
    key.name) pin_names[idx]=$value ;;
    key.literal | key.platform | key.git_tree | key.file)
      pin_kinds[idx]=$field pin_values[idx]=$value ;;
    key.*) die "$manifest: key pin field \`$field\` cannot be computed in shell (literal, platform, git_tree and file can)" ;;
  esac
done <<<"$rows"
if [ -z "$exec_name" ] || [ -z "$restore_path" ]; then die "$manifest needs [bootstrap] exec and [restore] path"; fi
remote=${WARMSTART_BOOTSTRAP_REMOTE:-${remote:-origin}}
# `[cache] ref` (a full ref outside refs/heads/, which a plain clone never
# downloads) wins; else the branch, as warmstart reads the manifest.
# Both are checked as the binary checks them (exit 10 there), before git
# sees them: a manifest on any branch someone pushed can name them, and a
# `src:dst` refspec would write this clone's refs, a leading `-` would be
# an option of `git fetch` (`--upload-pack=<command>`).
if [ -n "$cache_ref" ]; then
  ref=$cache_ref field=cache.ref
  case "$ref" in
    refs/tags/* | refs/remotes/* | refs/warmstart/gates/*)
      die "$manifest: cache.ref \"$ref\" is under a place clones, fetches or gate records use: choose e.g. \"refs/warmstart/cache/$name\"" ;;
    refs/*/*) ;;
    *) ref="" ;;
  esac
else
  ref=refs/heads/$branch field=cache.branch
  case "$branch" in refs/* | -*) ref="" ;; esac
fi
if [ -z "$ref" ] || ! git check-ref-format "$ref"; then
  die "$manifest: $field \"${cache_ref:-$branch}\" is not a usable ref: give a full ref such as \"refs/warmstart/cache/$name\" (warmstart refuses it too)"
fi
# A path may start with `$CARGO_TARGET_DIR/` (the one variable allowed in
# this manifest): the variable's value, else `target`, as the binary expands
# it (warmstart::cache::manifest::expand_path); relative to the root.
target_path() {
  local p=$1
  case "$p" in \$CARGO_TARGET_DIR/*) p=${CARGO_TARGET_DIR:-target}/${p#\$CARGO_TARGET_DIR/} ;; esac
  case "$p" in /*) printf '%s' "$p" ;; *) printf '%s/%s' "$root" "$p" ;; esac
}
install_dir=$(target_path "$restore_path")
stamp=$git_dir/warmstart/bootstrap/$name.key
cache_stamp=$git_dir/warmstart/cache/stamps/$name.json # warmstart::cache::stamp::path
# The newest signed created_at this clone has seen per cache key, shared
# with the binary: `<cache> <key> <created_at>` lines (warmstart::trust::seen).
seen_file=$git_dir/warmstart/trust/seen
untrusted="" # set by a refusal: giving up then exits 12 ("untrusted")
timed_out="" # set by a step past its deadline: giving up then exits 8
# The deadline of the fetch, and of each step that reads the fetched data.
fetch_timeout=${WARMSTART_BOOTSTRAP_FETCH_TIMEOUT:-60}
# `limited CMD...`: CMD under the deadline where `timeout` exists; 124 (and
# timed_out set) when it ran past it. `timeout` puts itself in a process
# group of its own, so a SIGKILL of this script (or of its group) would
# leave it and CMD running to their deadline: CMD runs under a watcher
# (`with_parent`, inside timeout's group) that ends it once this script is
# gone. CMD keeps this script's stdin (`<&0`: a background job would get
# /dev/null).
# shellcheck disable=SC2016 # expanded by the watcher's bash, not here
with_parent='p=$1; shift; "$@" <&0 & c=$!
{ while kill -0 "$p" 2>/dev/null; do sleep 0.2; done; kill -TERM "$c" 2>/dev/null; } </dev/null & w=$!
wait "$c"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"'
limited() {
  local rc=0
  if command -v timeout >/dev/null; then
    timeout "$fetch_timeout" bash -c "$with_parent" limited "$$" "$@" || rc=$?
  else
    "$@" || rc=$?
  fi
  if [ "$rc" = 124 ]; then timed_out=1; fi
  return "$rc"
}

# ---- the trust policy: the [trust] table of the manifest as committed at
# HEAD, else cache-manifests/trust.toml at HEAD (never the work tree, never a
# cache branch), else off.
if head_manifest=$(git show "HEAD:$manifest" 2>/dev/null); then
  head_rows=$(records <(printf '%s\n' "$head_manifest")) || die "$manifest at HEAD cannot be read by this script (see above)"
  while IFS=$'\t' read -r table idx field value; do
    case "$table.$field" in
      trust.policy) trust_policy=$value ;;
      trust.principals) IFS=$'\037' read -r -a trust_principals <<<"$value" ;;
      trust.allow_ungated) trust_allow_ungated=$value ;;
    esac
  done <<<"$head_rows"
fi
if [ -z "$trust_policy" ]; then
  trust_policy=off
  if trust_toml=$(git show HEAD:cache-manifests/trust.toml 2>/dev/null); then
    trust_rows=$(records <(printf '%s\n' "$trust_toml")) || die "cache-manifests/trust.toml at HEAD cannot be read by this script (see above)"
    # Top-level fields have an empty table column: split on every tab.
    trust_policy=$(printf '%s\n' "$trust_rows" | awk -F'\t' '$3 == "policy" { v = $4 } END { print (v == "" ? "off" : v) }')
  fi
fi
case "$trust_policy" in require | warn | off) ;; *) die "trust policy \"$trust_policy\" is not require, warn or off" ;; esac

# ---- the key: warmstart::cache::manifest::compute_key, in shell
# (tests/it/adopt.rs checks that both agree). Key = sanitize(name), then
# "-" sanitize(value) per pin, where sanitize turns every character outside
# [A-Za-z0-9._+] into `_` and prefixes `_` to an empty or dot-led result.
sanitize() {
  local s
  s=$(printf '%s' "$1" | LC_ALL=C tr -c 'A-Za-z0-9._+' '_')
  case "$s" in "" | .*) s=_$s ;; esac
  printf '%s' "$s"
}
platform() {
  local arch os
  arch=$(uname -m)
  case "$arch" in arm64) arch=aarch64 ;; esac
  case "$(uname -s)" in
    Linux) os=linux ;;
    Darwin) os=macos ;;
    FreeBSD) os=freebsd ;;
    *) os=$(uname -s | tr '[:upper:]' '[:lower:]') ;;
  esac
  printf '%s-%s' "$arch" "$os"
}
tree_paths=()
pin_value() {
  local kind=$1 value=$2 paths=()
  case "$kind" in
    literal) printf '%s' "$value" ;;
    platform) [ "$value" = true ] || die "$manifest: platform = $value (only true is a pin)"; platform ;;
    git_tree)
      IFS=$'\037' read -r -a paths <<<"$value"
      git rev-parse "${paths[@]/#/HEAD:}" | sha256sum | cut -c1-16 ;;
    file)
      local text
      text=$(cat "$value") || die "$manifest: cannot read pin file $value"
      case "$text" in *$'\n'*) die "$manifest: pin file $value has more than one line" ;; esac
      [ "$(wc -l <"$value")" -le 1 ] || die "$manifest: pin file $value has more than one line"
      if LC_ALL=C grep -q '[^ -~]' "$value"; then die "$manifest: pin file $value holds more than printable ASCII"; fi
      printf '%s' "$text" ;;
  esac
}
key=$(sanitize "$name")
for i in "${!pin_names[@]}"; do
  [ -n "${pin_kinds[i]:-}" ] || die "$manifest: key pin ${pin_names[i]} has no value kind"
  if [ "${pin_kinds[i]}" = git_tree ]; then IFS=$'\037' read -r -a more <<<"${pin_values[i]}"; tree_paths+=("${more[@]}"); fi
  v=$(pin_value "${pin_kinds[i]}" "${pin_values[i]}") || die "$manifest: key pin ${pin_names[i]} failed"
  key=$key-$(sanitize "$v")
done

mode=auto
case "${1:-}" in
  --print-key) printf '%s\n' "$key"; exit 0 ;;
  --prebuilt-only) mode=prebuilt; shift ;;
  --no-prebuilt) mode=compile; shift ;;
  --build-only) mode=build; shift ;;
esac

# ---- one bootstrap at a time per clone. Two session-start hooks of one
# clone at once would run two shallow fetches into it (git refuses the
# second: `.git/shallow.lock` exists) and install the binary twice; so the
# fetch and install run under a lock of this script's own, and a second
# bootstrap waits for the first, then finds the binary installed. The lock
# is a symlink whose target names its owner (`pid.start@host`, start being
# the process's start time in /proc/PID/stat, where there is a /proc): making
# one is atomic on every system (flock(1) is not on macOS), and an owner that
# died (kill -9, a recycled machine) names a dead pid on this host, or a pid
# that now runs another process (a different start time), so its lock is
# taken over rather than waited on.
lock=$git_dir/warmstart/bootstrap/fetch.lock
# `start_of PID`: field 22 of /proc/PID/stat (after the `(comm)`, which may
# hold spaces); nothing where there is no /proc or no such process.
start_of() {
  local stat rest
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  rest=${stat##*) }
  # shellcheck disable=SC2086 # the fields, split on spaces
  set -- $rest
  [ "$#" -ge 20 ] && printf '%s' "${20}"
}
lock_start=$(start_of $$)
lock_owner=$$${lock_start:+.$lock_start}@$(uname -n 2>/dev/null || echo localhost)
lock_held=""
release_lock() {
  if [ -n "$lock_held" ] && [ "$(readlink "$lock" 2>/dev/null)" = "$lock_owner" ]; then rm -f "$lock"; fi
  lock_held=""
}
# A lock whose owner is a dead pid of this host is set aside under a name of
# this run's own, and removed only if it is still the one judged dead (a
# waiter that took it over first has put its own there); one that is not is
# put back, never over another.
take_over() {
  local owner=$1 why=$2 aside=$lock.stale-$$
  mv "$lock" "$aside" 2>/dev/null || return 0
  if [ "$(readlink "$aside" 2>/dev/null)" = "$owner" ]; then
    say "binary cache: the bootstrap that held ${lock#"$git_dir"/} ($owner) is gone$why: taking the lock over"
  else
    ln -s "$(readlink "$aside")" "$lock" 2>/dev/null || true
  fi
  rm -f "$aside"
}
take_lock() {
  local owner="" pid start now tries=0 bound=$((fetch_timeout * 3)) said=""
  mkdir -p "$(dirname "$lock")" || return 1
  until ln -s "$lock_owner" "$lock" 2>/dev/null; do
    tries=$((tries + 1))
    if [ "$tries" -gt $((bound * 5)) ]; then
      timed_out=1
      say "binary cache: ${lock#"$git_dir"/} is still held by ${owner:-nobody} after ${bound}s (3 x WARMSTART_BOOTSTRAP_FETCH_TIMEOUT): not waiting longer"
      return 1
    fi
    owner=$(readlink "$lock" 2>/dev/null) || { owner=""; continue; } # released meanwhile
    pid=${owner%%@*} start=""
    case "$pid" in *.*) start=${pid#*.} pid=${pid%%.*} ;; esac
    if [ "${owner#*@}" = "${lock_owner#*@}" ] && [[ $pid =~ ^[0-9]+$ ]]; then
      if ! kill -0 "$pid" 2>/dev/null; then
        take_over "$owner" ""
        continue
      fi
      # A live pid that started at another time is not the owner: the
      # owner died and its pid went to an unrelated process.
      now=$(start_of "$pid")
      if [ -n "$start" ] && [ -n "$now" ] && [ "$now" != "$start" ]; then
        take_over "$owner" " (pid $pid now runs another process)"
        continue
      fi
    fi
    if [ -z "$said" ]; then
      say "binary cache: another bootstrap ($owner) is fetching into this clone: waiting for it (up to ${bound}s)"
      said=1
    fi
    sleep 0.2
  done
  lock_held=1
}

tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"; release_lock' EXIT
run_restore() {
  local bin=$1; shift
  [ -z "$tmp" ] || rm -rf "$tmp" # exec skips the EXIT trap
  release_lock
  say "running $bin restore $*"
  exec "$bin" restore "$@"
}

# ---- 3. compile
compile() {
  [ "$mode" != prebuilt ] || give_up "compile: skipped (--prebuilt-only): no prebuilt binary for $key"
  if [ ${#build[@]} -eq 0 ] || [ -z "$built" ]; then give_up "compile: $manifest has no [bootstrap] build and built"; fi
  say "compile: ${build[*]}"
  # Its output goes to stderr: --build-only prints only the path on stdout.
  "${build[@]}" >&2 || give_up "compile: \`${build[*]}\` failed"
  built_path=$(target_path "$built")
  [ -x "$built_path" ] || give_up "compile: \`${build[*]}\` left no executable $built"
  if [ "$mode" = build ]; then
    printf '%s\n' "$built_path"
    exit 0
  fi
  run_restore "$built_path" "$@"
}
case "$mode" in compile | build) compile "$@" ;; esac
# A prebuilt binary is only right for the committed source: local edits to
# what the key's git trees cover mean compiling.
if [ ${#tree_paths[@]} -gt 0 ] && [ -n "$(git status --porcelain -- "${tree_paths[@]}")" ]; then
  say "${tree_paths[*]} has local changes, so no prebuilt binary matches"
  compile "$@"
fi

# ---- 0. warm
warm() {
  [ -x "$install_dir/$exec_name" ] && { [ "$(cat "$stamp" 2>/dev/null)" = "$key" ] ||
    grep -qF "\"key\": \"$key\"," "$cache_stamp" 2>/dev/null; }
}
if warm; then
  say "warm: $key is installed"
  run_restore "$install_dir/$exec_name" "$@"
fi

# The signed statement of $key on the fetched commit: signed by a principal
# of allowed_signers at HEAD (and of the manifest's [trust] principals),
# naming this cache and key, and not ungated unless the manifest opts in.
# Each refusal says why, naming the signer seen.
trusted_statement() {
  local commit=$1 st sig who p ok="" seen
  command -v ssh-keygen >/dev/null ||
    { say "binary cache: policy $trust_policy needs ssh-keygen to check $key.statement, and it is not installed: refusing the binary cache"; return 1; }
  st=$tmp/branch/$key.statement sig=$tmp/branch/$key.statement.sig
  if ! { in_tree "$key.statement" && in_tree "$key.statement.sig"; }; then
    say "binary cache: untrusted: $key on $ref is unsigned (no $key.statement with its .sig): refusing it"
    return 1
  fi
  regular_blob "$commit" "$key.statement" 1048576 && regular_blob "$commit" "$key.statement.sig" 65536 || return 1
  git show HEAD:cache-manifests/allowed_signers >"$tmp/allowed_signers" 2>/dev/null ||
    { say "binary cache: untrusted: cache-manifests/allowed_signers is not in HEAD, so nobody may sign $key: refusing it"; return 1; }
  who=$(limited ssh-keygen -Y find-principals -f "$tmp/allowed_signers" -s "$sig" 2>/dev/null) || who=""
  for p in $who; do
    if [ ${#trust_principals[@]} -gt 0 ] && ! printf '%s\n' "${trust_principals[@]}" | grep -qxF -- "$p"; then continue; fi
    if limited ssh-keygen -Y verify -f "$tmp/allowed_signers" -I "$p" -n warmstart-cache -s "$sig" <"$st" >/dev/null 2>&1; then
      ok=$p
      break
    fi
  done
  if [ -z "$ok" ]; then
    seen=$(ssh-keygen -Y check-novalidate -n warmstart-cache -s "$sig" <"$st" 2>&1 | sed -n 's/.* key \(SHA256:[^ ]*\).*/\1/p')
    say "binary cache: untrusted: $key on $ref is not signed by an allowed signer (signer seen: ${seen:-none}; who may sign is listed in cache-manifests/allowed_signers at HEAD): refusing it"
    return 1
  fi
  # Versions 1 and 2 keep the same `field value` lines and the chunks'
  # sha256sum lines (version 2 only adds lines this script does not need);
  # a later version may mean something else by them, so it is refused.
  local magic
  magic=$(head -n 1 "$st")
  case "$magic" in
    "warmstart-statement 1" | "warmstart-statement 2") ;;
    "warmstart-statement "*)
      say "binary cache: untrusted: the statement of $key is version ${magic#warmstart-statement } and this script reads versions 1 and 2 only: refusing it (run \`warmstart init\` of a warmstart that reads statement version ${magic#warmstart-statement } to regenerate it)"
      return 1 ;;
    *)
      say "binary cache: untrusted: $key.statement on $ref is not a warmstart statement: refusing it"
      return 1 ;;
  esac
  if ! { grep -qxF "cache $name" "$st" && grep -qxF "key $key" "$st"; }; then
    say "binary cache: untrusted: the statement signed by $ok is not for cache $name key $key: refusing it"
    return 1
  fi
  if [ "$trust_allow_ungated" != true ] && grep -qxF "ungated true" "$st"; then
    say "binary cache: untrusted: $key was published --allow-ungated and $manifest does not set [trust] allow_ungated = true: refusing it"
    return 1
  fi
  not_a_rollback "$st" || return 1
  say "binary cache: $key is signed by $ok"
}

# Rollback: a validly signed statement older (by its signed created_at)
# than the newest this clone has seen for the key is refused; a newer one
# becomes the newest seen. Timestamps are fixed-width UTC, so their digits
# compare as numbers.
not_a_rollback() {
  local st=$1 created last ts='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$'
  created=$(sed -n 's/^created_at //p' "$st")
  if ! [[ $created =~ $ts ]]; then
    say "binary cache: untrusted: the statement of $key has no created_at of the form YYYY-MM-DDTHH:MM:SSZ: refusing it"
    return 1
  fi
  last=""
  if [ -f "$seen_file" ]; then
    last=$(LC_ALL=C awk -v c="$name" -v k="$key" '$1 == c && $2 == k && $3 > v { v = $3 } END { print v }' "$seen_file") ||
      { say "binary cache: cannot read $seen_file: refusing $key"; return 1; }
  fi
  if [ -n "$last" ] && ! [[ $last =~ $ts ]]; then
    say "binary cache: $seen_file is corrupt (it records the newest signed statement seen per cache key; delete it to trust the newest on the branch again): refusing $key"
    return 1
  fi
  if [ -n "$last" ] && [ $((10#${created//[!0-9]/})) -lt $((10#${last//[!0-9]/})) ]; then
    say "binary cache: untrusted: rollback: $key on $ref was signed at $created, older than the $last this clone has seen (${seen_file#"$root"/}): refusing it"
    return 1
  fi
  if [ "$created" = "$last" ]; then return 0; fi
  if ! { mkdir -p "$(dirname "$seen_file")" &&
    { if [ -f "$seen_file" ]; then awk -v c="$name" -v k="$key" '!($1 == c && $2 == k)' "$seen_file"; fi
      printf '%s %s %s\n' "$name" "$key" "$created"; } >"$seen_file.tmp-$$" &&
    mv "$seen_file.tmp-$$" "$seen_file"; }; then
    say "binary cache: cannot record $key's created_at in $seen_file: refusing it"
    return 1
  fi
}

# `git ls-tree -l` of the fetched commit, once: mode, type, size and name
# of each entry, in $tmp/tree.
tree_listing() {
  limited git ls-tree -l "$1" >"$tmp/tree" ||
    { say "binary cache: cannot list $ref@${1:0:12}: not installing"; return 1; }
}

# `regular_blob COMMIT NAME LIMIT [exact]`: NAME on the commit is a regular,
# non-executable file (mode 100644) of at most LIMIT bytes (exactly LIMIT
# with `exact`), then extracted into $tmp/branch; else one line, and the
# binary cache is refused (exit 12 with --prebuilt-only).
regular_blob() {
  local commit=$1 name=$2 limit=$3 exact=${4:-} mode type oid size
  read -r mode type oid size < <(awk -F'\t' -v n="$name" '$2 == n { print $1; exit }' "$tmp/tree") || true
  if [ -z "${mode:-}" ]; then say "binary cache: $ref has no $name: not installing"; return 1; fi
  if [ "$mode" != 100644 ] || [ "$type" != blob ]; then
    untrusted=1
    say "binary cache: refused: $name on $ref is mode $mode ($type), not a regular file (100644): not installing"
    return 1
  fi
  if ! [[ $limit =~ ^[0-9]+$ ]] || ! [[ $size =~ ^[0-9]+$ ]] ||
    { [ -n "$exact" ] && [ "$size" != "$limit" ]; } || [ "$size" -gt "$limit" ]; then
    untrusted=1
    say "binary cache: refused: $name on $ref is $size bytes where ${exact:+exactly }${limit:-a size in warmstart.json} is expected: not installing"
    return 1
  fi
  limited git cat-file blob "$oid" >"$tmp/branch/$name" ||
    { say "binary cache: reading $name from $ref failed${timed_out:+ (past ${fetch_timeout}s)}: not installing"; return 1; }
}

in_tree() { awk -F'\t' -v n="$1" '$2 == n { found = 1 } END { exit !found }' "$tmp/tree"; }

# The size of each part of $key, from warmstart.json's chunk entries
# (`"file": "<part>"`, then its `"size": N`, one field a line as warmstart
# writes it): `<part> TAB <size>` lines in $tmp/sizes; `part_size NAME`.
part_sizes() {
  LC_ALL=C awk -v p="$key.tar.zst.part" '
    match($0, /^[ \t]*"file": "[^"]*"/) { v = substr($0, RSTART, RLENGTH); sub(/^[ \t]*"file": "/, "", v); sub(/"$/, "", v); f = (index(v, p) == 1 ? v : ""); next }
    f != "" && match($0, /^[ \t]*"size": [0-9]+/) { v = substr($0, RSTART, RLENGTH); sub(/^[ \t]*"size": /, "", v); print f "\t" v; f = "" }
  ' "$tmp/branch/warmstart.json" >"$tmp/sizes"
}
part_size() { awk -F'\t' -v n="$1" '$1 == n { print $2; exit }' "$tmp/sizes"; }

# ---- 1. binary cache. Called in an `if`, where bash ignores `set -e`:
# every step checks its own status.
binary_cache() {
  command -v zstd >/dev/null || { say "binary cache: zstd is not installed"; return 1; }
  local rc=0 err=$git_dir/warmstart/bootstrap/fetch.err.$$
  # The ref is asked for by name: a plain clone never has it.
  limited git fetch --quiet --depth 1 --no-tags "$remote" "$ref" 2>"$err" || rc=$?
  if [ "$rc" != 0 ]; then
    if [ "$rc" = 124 ]; then
      say "binary cache: fetching $ref from $remote ran past ${fetch_timeout}s (WARMSTART_BOOTSTRAP_FETCH_TIMEOUT)"
    elif grep -q "couldn't find remote ref" "$err"; then
      say "binary cache: no $ref on $remote (nothing published there yet)"
    else
      say "binary cache: git fetch $remote $ref failed (exit $rc); git said:"
    fi
    sed 's/^/bootstrap:   /' "$err" >&2
    rm -f "$err"
    return 1
  fi
  rm -f "$err"
  local commit f prefix="$key.tar.zst.part"
  local parts=()
  commit=$(git rev-parse FETCH_HEAD) || return 1
  while IFS= read -r f; do
    case "$f" in "$prefix"*) [[ ${f#"$prefix"} =~ ^[0-9]+$ ]] && parts+=("$f") ;; esac
  done < <(git ls-tree --name-only "$commit" | LC_ALL=C sort)
  [ ${#parts[@]} -gt 0 ] || { say "binary cache: $ref has no $key (published for another source or platform)"; return 1; }

  mkdir -p "$(dirname "$install_dir")" || return 1
  tmp=$(mktemp -d "$(dirname "$install_dir")/.bootstrap-XXXXXX") || return 1
  mkdir -p "$tmp/branch" "$tmp/stage" || return 1
  # Only regular blobs, of the sizes warmstart.json names, are read: a
  # pusher's symlink part (`sha256sum` follows it, to /dev/zero say) or a
  # gitlink never reaches tar or sha256sum.
  # A branch of the first format has no warmstart.json: its parts are
  # held to the chunk limit (100 MiB) instead.
  tree_listing "$commit" || return 1
  : >"$tmp/sizes"
  if in_tree warmstart.json; then
    regular_blob "$commit" warmstart.json 16777216 && part_sizes || return 1
  fi
  regular_blob "$commit" SHA256SUMS 16777216 || return 1
  local size
  for f in "${parts[@]}"; do
    size=$(part_size "$f")
    if [ -n "$size" ]; then
      regular_blob "$commit" "$f" "$size" exact || return 1
    else
      regular_blob "$commit" "$f" 104857600 || return 1
    fi
  done

  # ---- trust: where the policy asks for signed caches, the key's signed
  # statement is checked (`ssh-keygen -Y verify` against
  # cache-manifests/allowed_signers at HEAD) before any sum is trusted and
  # before a byte is decompressed; then its own chunk lines, not
  # SHA256SUMS, are what `sha256sum -c` checks.
  local sums=$tmp/branch/SHA256SUMS
  if [ "$trust_policy" != off ]; then
    if trusted_statement "$commit"; then
      sums=$tmp/branch/$key.statement
    elif [ -n "$timed_out" ]; then
      return 1
    elif [ "$trust_policy" = require ]; then
      untrusted=1
      return 1
    else
      say "binary cache: policy warn: installing $key anyway"
    fi
  fi

  # Every part needs its own line in the sums, and every line must check,
  # before a single byte reaches zstd.
  awk -v p="$prefix" 'length($1) == 64 && index($2, p) == 1 && substr($2, length(p) + 1) ~ /^[0-9]+$/' \
    "$sums" >"$tmp/key.sums" || return 1
  [ "$(wc -l <"$tmp/key.sums")" -eq ${#parts[@]} ] ||
    { say "binary cache: $(basename "$sums") on $ref does not list every part of $key: not installing"; return 1; }
  # (A subshell's `timed_out` is lost: the deadline shows as status 124.)
  rc=0
  (cd "$tmp/branch" && limited sha256sum --quiet -c "$tmp/key.sums" >&2) || rc=$?
  if [ "$rc" = 124 ]; then
    timed_out=1
    say "binary cache: sha256sum -c of $key ran past ${fetch_timeout}s (WARMSTART_BOOTSTRAP_FETCH_TIMEOUT): not installing"
    return 1
  fi
  [ "$rc" = 0 ] || { say "binary cache: sha256sum -c failed for $key on $ref: not installing"; return 1; }
  (cd "$tmp/branch" && cat "${parts[@]}") | limited zstd -d -q | limited tar -x -C "$tmp/stage" --no-same-owner
  local unpacked=("${PIPESTATUS[@]}")
  case " ${unpacked[*]} " in
    *" 124 "*)
      timed_out=1
      say "binary cache: unpacking $key ran past ${fetch_timeout}s (WARMSTART_BOOTSTRAP_FETCH_TIMEOUT): not installing"
      return 1 ;;
    " 0 0 0 ") ;;
    *) say "binary cache: unpacking $key failed: not installing"; return 1 ;;
  esac
  [ -x "$tmp/stage/$exec_name" ] || { say "binary cache: $key holds no executable $exec_name"; return 1; }
  # Swap in by rename; the old copy goes only once the new one is in place.
  mkdir -p "$(dirname "$stamp")" || return 1
  if [ -e "$install_dir" ]; then mv "$install_dir" "$tmp/old" || return 1; fi
  mv "$tmp/stage" "$install_dir" || return 1
  printf '%s\n' "$key" >"$stamp.tmp" && mv "$stamp.tmp" "$stamp" || return 1
  say "binary cache: installed $key from $remote $ref@${commit:0:12}"
}
if take_lock; then
  if warm; then
    say "warm: $key is installed (by the bootstrap this one waited for)"
    run_restore "$install_dir/$exec_name" "$@"
  fi
  if binary_cache; then run_restore "$install_dir/$exec_name" "$@"; fi
fi

# ---- 2. registry: an exact version with its hashes, as init committed them.
registry() {
  [ -n "$pip_req" ] || { say "registry: skipped: $manifest pins no published version ([bootstrap] pip)"; return 1; }
  [ ${#pip_hashes[@]} -gt 0 ] || { say "registry: $manifest pins $pip_req without pip_hashes: not installing"; return 1; }
  command -v python3 >/dev/null || { say "registry: python3 is not installed"; return 1; }
  local dir=$root/target/warmstart-registry line h
  line=$pip_req
  for h in "${pip_hashes[@]}"; do line="$line --hash=$h"; done
  if [ -x "$dir/pkg/bin/warmstart" ] && [ "$(cat "$dir/requirement" 2>/dev/null)" = "$line" ]; then
    say "registry: warm: $pip_req is installed"
    return 0
  fi
  mkdir -p "$dir" || return 1
  tmp=$(mktemp -d "$dir/.install-XXXXXX") || return 1
  printf '%s\n' "$line" >"$tmp/requirements.txt" || return 1
  # The host's pip installs the wheel into a plain directory (`--target`;
  # the executable lands in its bin/): no venv, one interpreter, about two
  # seconds. A venv with its own pip (ensurepip) takes several more, so it
  # is only the fallback for a python3 without pip. `--target` also keeps
  # clear of an externally managed (PEP 668) system Python.
  local probe py="" version="" pip=()
  if probe=$(python3 -c 'import sys, pip; print(sys.executable); print(pip.__version__)' 2>/dev/null); then
    py=${probe%%$'\n'*} version=${probe#*$'\n'}
  fi
  if [ -n "$py" ] && [ -x "$py" ]; then
    say "registry: the host's pip $version installs it (pip install --target, no venv)"
    pip=(env PIP_ROOT_USER_ACTION=ignore "$py" -m pip install --target "$tmp/pkg")
  else
    say "registry: the host's python3 has no pip: a venv with its own pip (ensurepip, slower)"
    python3 -m venv "$tmp/pkg" >&2 || { say "registry: python3 -m venv failed"; return 1; }
    pip=("$tmp/pkg/bin/python" -m pip install)
  fi
  "${pip[@]}" --quiet --no-deps --require-hashes -r "$tmp/requirements.txt" >&2 ||
    { say "registry: pip install --require-hashes $pip_req failed"; return 1; }
  [ -x "$tmp/pkg/bin/warmstart" ] || { say "registry: $pip_req installed no warmstart executable"; return 1; }
  rm -rf "$dir/pkg" && mv "$tmp/pkg" "$dir/pkg" && printf '%s\n' "$line" >"$dir/requirement" || return 1
  say "registry: installed $pip_req"
}
if [ "$mode" != prebuilt ] && registry; then run_restore "$root/target/warmstart-registry/pkg/bin/warmstart" "$@"; fi
release_lock

compile "$@"
