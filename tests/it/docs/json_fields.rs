//! What each field of every `--json` document means, for the generated
//! `docs/reference/json-shapes.md`: the fields and their types come from the
//! snapshot files `json_contract.rs` checks against the real binary, the
//! meanings from the table below. A field the snapshots hold and the table
//! lacks, or a row that names a field no snapshot holds, fails the docs test,
//! so a renamed field cannot keep a stale meaning.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// `(commands, path, meaning)`. `commands` is `*` (the field means the same
/// in every command that has it) or a comma list of snapshot names
/// (`cache-list,cache-status`); a command's own row wins over `*`. A path
/// walks objects with `.` and an array's items with `[]`. A map whose keys
/// are names (a gate, a variable) is described at the map.
const MEANINGS: &[(&str, &str, &str)] = &[
    // The envelope and the shared concepts (json.md explains them at length).
    ("*", "schema", "the version of these shapes, now 1"),
    ("*", "command", "the command as typed, without flags"),
    ("*", "ok", "true exactly when the exit status is 0"),
    (
        "*",
        "error",
        "on failure only: the one-line message also printed on stderr, credentials redacted",
    ),
    ("*", "code", "on failure only: the exit status"),
    ("*", "name", "the cache (its manifest's `name`)"),
    ("*", "remote", "the remote, `{name, url}`"),
    (
        "*",
        "remote.name",
        "the remote's name as configured, or the URL when it was given as one",
    ),
    ("*", "remote.url", "the remote's URL without credentials"),
    (
        "*",
        "branch",
        "the cache branch (a ref under `refs/heads/` or the manifest's `ref`)",
    ),
    (
        "*",
        "commit",
        "the cache branch's commit this command wrote or read; null when there is none",
    ),
    ("*", "key", "the cache key: the manifest's pins, joined"),
    ("*", "key_parts", "the pins that make the key, in order"),
    ("*", "key_parts[]", "one pin"),
    ("*", "key_parts[].name", "the pin's name"),
    (
        "*",
        "key_parts[].value",
        "the value it computed on this machine",
    ),
    (
        "*",
        "entries",
        "tar entries: files, directories and links; null where nothing was counted",
    ),
    (
        "*",
        "file_bytes",
        "bytes of regular files; null where nothing was counted",
    ),
    ("*", "tar_bytes", "size of the uncompressed tar"),
    (
        "*",
        "tar_sha256",
        "SHA-256 of the uncompressed tar, as the signed statement records it",
    ),
    ("*", "compressed_bytes", "size of the compressed chunks"),
    (
        "*",
        "duration_ms",
        "how long it took, in whole milliseconds",
    ),
    (
        "*",
        "timings_ms",
        "the phases of `duration_ms`, in milliseconds (never a total)",
    ),
    (
        "*",
        "tree",
        "the git tree id the gate record is for (the commit's tree, with the worktree's changes when dirty)",
    ),
    ("*", "head", "the commit checked out"),
    (
        "*",
        "layout",
        "the branch's format: `v1`, `legacy-gzip` or `legacy-zstd`",
    ),
    (
        "*",
        "bytes_hashed",
        "bytes that went through SHA-256 in this run (0 on the warm path)",
    ),
    // cache gc
    (
        "cache-gc",
        "dry_run",
        "true with `--dry-run`: nothing was removed, the counts say what would be",
    ),
    (
        "cache-gc",
        "max_bytes",
        "the size the chunk store is trimmed to",
    ),
    (
        "cache-gc",
        "keep",
        "the age under which nothing is removed, as given (`2w`)",
    ),
    ("cache-gc", "before_bytes", "bytes of every store before"),
    ("cache-gc", "after_bytes", "bytes of every store after"),
    (
        "cache-gc",
        "chunks",
        "the shared chunk store: an object of counts, not an array",
    ),
    ("cache-gc", "chunks.kept", "chunks kept"),
    ("cache-gc", "chunks.kept_bytes", "their bytes"),
    (
        "cache-gc",
        "chunks.protected",
        "chunks kept because an installed key or a recent run needs them",
    ),
    ("cache-gc", "chunks.protected_bytes", "their bytes"),
    (
        "cache-gc",
        "chunks.removed",
        "chunks removed (or that would be, with `--dry-run`)",
    ),
    ("cache-gc", "chunks.removed_bytes", "their bytes"),
    (
        "cache-gc",
        "chunks.unknown_installs",
        "installed caches whose key's chunks could not be listed, so nothing of theirs was removed",
    ),
    (
        "cache-gc",
        "stores",
        "each private git store (`cache.git` per cache)",
    ),
    ("cache-gc", "stores[]", "one store"),
    ("cache-gc", "stores[].store", "its path"),
    (
        "cache-gc",
        "stores[].refs_dropped",
        "refs removed from it (old keys' fetch refs)",
    ),
    (
        "cache-gc",
        "stores[].objects_dropped",
        "objects removed by its repack",
    ),
    ("cache-gc", "stores[].before_bytes", "its bytes before"),
    ("cache-gc", "stores[].after_bytes", "its bytes after"),
    (
        "cache-gc",
        "logs",
        "the per-step logs under the state directory",
    ),
    (
        "cache-gc",
        "logs.removed",
        "logs removed (older than `keep`)",
    ),
    (
        "cache-gc",
        "logs.trimmed",
        "logs cut down to their last part",
    ),
    (
        "cache-gc",
        "lock_wait_ms",
        "time spent waiting for the stores' locks",
    ),
    // cache list, cache status
    (
        "cache-list,cache-status",
        "caches",
        "every cache manifest, by name; one that does not load is `{name, error}`",
    ),
    ("cache-list,cache-status", "caches[]", "one cache"),
    ("cache-list,cache-status", "caches[].name", "the cache"),
    (
        "cache-list,cache-status",
        "caches[].error",
        "for a manifest that does not load: why, in one line (its other fields are absent)",
    ),
    (
        "cache-list,cache-status",
        "caches[].description",
        "the manifest's `description`",
    ),
    ("cache-list,cache-status", "caches[].branch", "its branch"),
    (
        "cache-list,cache-status",
        "caches[].target",
        "where it installs",
    ),
    (
        "cache-list,cache-status",
        "caches[].mode",
        "`replace` or `overlay`",
    ),
    (
        "cache-list,cache-status",
        "caches[].key",
        "the key this machine computes now",
    ),
    (
        "cache-list,cache-status",
        "caches[].key_parts",
        "the pins of that key",
    ),
    ("cache-list,cache-status", "caches[].key_parts[]", "one pin"),
    (
        "cache-list,cache-status",
        "caches[].key_parts[].name",
        "its name",
    ),
    (
        "cache-list,cache-status",
        "caches[].key_parts[].value",
        "its value here",
    ),
    (
        "cache-list,cache-status",
        "caches[].local",
        "what is installed here, from the stamps (nothing hashed)",
    ),
    (
        "cache-list,cache-status",
        "caches[].local.state",
        "`installed` (the current key, ready), `built` (the current key, built here and not published: `why` says what to run), `stale` (another key or target), `not ready` (the ready probe fails), `not installed` or `corrupt stamp`",
    ),
    (
        "cache-list,cache-status",
        "caches[].local.installed_key",
        "the key installed, when one is",
    ),
    (
        "cache-list,cache-status",
        "caches[].local.restored_at",
        "when it was installed (RFC 3339 UTC)",
    ),
    (
        "cache-list,cache-status",
        "caches[].local.commit",
        "the branch commit it came from",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state",
        "what the branch holds; null with `--offline`, and in `cache list`, which never asks the remote",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.state",
        "`has key`, `key missing`, `legacy` (one archive, no keys), `no branch`, `unreachable` or `damaged`",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.remote",
        "the remote asked",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.remote.name",
        "its name, or the URL",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.remote.url",
        "its URL without credentials",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.commit",
        "the branch's commit",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys",
        "every key on the branch",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[]",
        "one key",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].key",
        "the key",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].created_at",
        "when it was published (RFC 3339 UTC)",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].tar_bytes",
        "its uncompressed tar size",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].chunk_count",
        "its number of chunks",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].parts",
        "its pins, as the publisher computed them",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].parts[]",
        "one pin",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].parts[].name",
        "its name",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].parts[].value",
        "its value on the publisher",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].trust",
        "the signature check of this key, made whatever the policy",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].trust.key",
        "the key checked",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].trust.signer",
        "who signed it (principal and fingerprint); null when unsigned or not trusted",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].trust.verdict",
        "`trusted`, `untrusted` (a valid signature by a key not allowed), `invalid`, `mismatch` (the statement does not describe these chunks) or `unsigned`",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.keys[].trust.reason",
        "the verdict in words",
    ),
    (
        "cache-list,cache-status",
        "caches[].remote_state.policy",
        "the trust policy in force: `off`, `warn` or `require`",
    ),
    // cache migrate
    (
        "cache-migrate",
        "from",
        "the legacy branch the archive was read from",
    ),
    ("cache-migrate", "ref", "the new branch written"),
    (
        "cache-migrate",
        "state",
        "`migrated`, or `already` when the new branch was there and the old one gone",
    ),
    // cache prune
    (
        "cache-prune",
        "status",
        "`pruned`, `nothing to prune` or `dry-run`",
    ),
    (
        "cache-prune",
        "previous_commit",
        "the branch's commit before",
    ),
    (
        "cache-prune",
        "dropped",
        "the keys dropped (or that would be, with `--dry-run`), each as in `kept`",
    ),
    ("cache-prune", "kept", "the keys kept"),
    ("cache-prune", "kept[]", "one key"),
    ("cache-prune", "kept[].key", "the key"),
    ("cache-prune", "kept[].created_at", "when it was published"),
    (
        "cache-prune",
        "kept[].platform",
        "the platform pin it was published for",
    ),
    (
        "cache-prune",
        "kept[].compressed_bytes",
        "its compressed size",
    ),
    (
        "cache-prune",
        "compressed_bytes_dropped",
        "compressed bytes of the dropped keys' chunks no kept key shares",
    ),
    (
        "cache-prune",
        "retries",
        "times the branch moved under the prune and it was redone",
    ),
    // cache publish
    (
        "cache-publish",
        "status",
        "`published`, `unchanged` (the branch already holds this tree), `present` (`--missing`: the remote holds a key HEAD's trust policy accepts; nothing walked, packed or pushed), `dry-run` or `key-only`",
    ),
    (
        "cache-publish",
        "commit",
        "the branch's commit after the publish (the new one or the unchanged one); null on a dry run",
    ),
    (
        "cache-publish",
        "previous_commit",
        "the branch's commit before (null on a first publish)",
    ),
    (
        "cache-publish",
        "entries",
        "tar entries packed (planned, on a dry run); null with `--key-only`",
    ),
    (
        "cache-publish",
        "file_bytes",
        "bytes of regular files packed; null with `--key-only`",
    ),
    (
        "cache-publish",
        "unchanged_by",
        "how an `unchanged` publish knew: `stat` (nothing read), `digest` (the tar's SHA-256 equals the branch's) or `pack`; null otherwise",
    ),
    (
        "cache-publish",
        "tar_bytes",
        "the tar's size; null when no tar was made",
    ),
    (
        "cache-publish",
        "tar_sha256",
        "the tar's SHA-256; null when no tar was made",
    ),
    (
        "cache-publish",
        "compressed_bytes",
        "the chunks' total size; null when no tar was made",
    ),
    (
        "cache-publish",
        "chunks",
        "the key's chunks, in order (an array, as on the branch)",
    ),
    ("cache-publish", "chunks[]", "one chunk"),
    (
        "cache-publish",
        "chunks[].file",
        "its file name on the branch",
    ),
    ("cache-publish", "chunks[].size", "its size"),
    (
        "cache-publish",
        "chunks[].sha256",
        "its SHA-256, as `SHA256SUMS` lists it",
    ),
    (
        "cache-publish",
        "chunks[].reused",
        "true when the branch already held this exact chunk (nothing written)",
    ),
    (
        "cache-publish",
        "chunks_reused",
        "chunks not compressed by this publish: their frame was an earlier key's, from cache.git or fetched by id, checked to decode to the chunk (every chunk when `unchanged` by `stat` or `digest`); null when no tar was made",
    ),
    (
        "cache-publish",
        "frames_fetched",
        "of those, frames fetched by id for this publish (a fresh clone at zstd level 5 or more); null when no tar was made",
    ),
    (
        "cache-publish",
        "chunks_unchanged",
        "of those, chunks whose files this clone's last publish packed and that are unchanged since (same lstat, ctime included, outside the racy window): taken whole, not cut, hashed or stored again, the files read only for the tar's digest; null when no tar was made",
    ),
    (
        "cache-publish",
        "keys_on_branch",
        "every key on the branch after the publish",
    ),
    ("cache-publish", "keys_on_branch[]", "one key"),
    (
        "cache-publish",
        "pruned",
        "keys this publish dropped (`[publish] keep`)",
    ),
    (
        "cache-publish",
        "gates_required",
        "the gates that had to be green for this publish",
    ),
    (
        "cache-publish",
        "ungated",
        "true with `--ungated`: published without the gate check",
    ),
    (
        "cache-publish",
        "signed_by",
        "who signed the key's statement (principal and fingerprint); null when unsigned",
    ),
    (
        "cache-publish",
        "duration_ms",
        "the whole publish; null on a dry run",
    ),
    (
        "cache-publish",
        "timings_ms.plan",
        "reading the manifest, computing the key, walking the tree",
    ),
    (
        "cache-publish",
        "timings_ms.fetch",
        "fetching the branch as it was",
    ),
    (
        "cache-publish",
        "timings_ms.verify",
        "with --missing: judging the key on the branch (trust check, and a present key's chunks streamed through the restore's verification)",
    ),
    (
        "cache-publish",
        "timings_ms.pack",
        "tar, chunking, compression and hashing",
    ),
    ("cache-publish", "timings_ms.sign", "signing the statement"),
    (
        "cache-publish",
        "timings_ms.commit",
        "writing blobs and the root commit",
    ),
    (
        "cache-publish",
        "timings_ms.push",
        "pushing, batches included",
    ),
    (
        "cache-publish",
        "timings_ms.stamp",
        "recording the publish in this clone",
    ),
    (
        "cache-publish",
        "push",
        "how the push went; null without a push",
    ),
    (
        "cache-publish",
        "push.limit_bytes",
        "the per-push limit in force",
    ),
    (
        "cache-publish",
        "push.new_bytes",
        "bytes of blobs the remote did not have before this publish",
    ),
    (
        "cache-publish",
        "push.batches",
        "pushes of blobs through temporary refs before the root commit's (0: one push did it all)",
    ),
    (
        "cache-publish",
        "push.reused_bytes",
        "bytes an interrupted earlier publish had already landed, not sent again",
    ),
    (
        "cache-publish",
        "push.temp_refs_removed",
        "temporary refs deleted after the root push, this run's and leftovers",
    ),
    (
        "cache-publish",
        "missing",
        "what `--missing` found on the remote before anything was walked or packed; null without `--missing`",
    ),
    (
        "cache-publish",
        "missing.present",
        "true when the branch holds the key and HEAD's trust policy accepts it: nothing was built, packed or pushed (status `present`)",
    ),
    (
        "cache-publish",
        "missing.policy",
        "the trust policy the key was judged by (`off`, `warn`, `require`); null when the branch does not hold the key",
    ),
    (
        "cache-publish",
        "missing.verdict",
        "the key's trust verdict (`trusted`, `unsigned`, `untrusted`, ...); null with policy `off` or when the branch does not hold the key",
    ),
    (
        "cache-publish",
        "missing.why",
        "why the key counts as missing (no branch, no such key, or the policy's refusal line); null when present",
    ),
    // cache resign
    (
        "cache-resign",
        "signed_by",
        "the signer of the new statements",
    ),
    ("cache-resign", "resigned", "the keys signed again"),
    ("cache-resign", "resigned[]", "one key"),
    (
        "cache-resign",
        "skipped",
        "keys left as they were, each `{key, reason}`",
    ),
    // cache restore
    (
        "cache-restore",
        "state",
        "`restored` (fetched, verified, installed), `warm` (nothing done), `reused` (another restorer of the target finished first), `verified` or `repaired` (with `--verify`), `partial` (a fallback key stands in; see `partial`)",
    ),
    ("cache-restore", "target", "where it installed"),
    ("cache-restore", "mode", "`replace` or `overlay`"),
    (
        "cache-restore",
        "remote",
        "the remote the install came from (on a warm run, the one the stamp records)",
    ),
    (
        "cache-restore",
        "tar_bytes",
        "uncompressed bytes unpacked (0 when nothing was)",
    ),
    (
        "cache-restore",
        "compressed_bytes",
        "compressed chunk bytes read",
    ),
    (
        "cache-restore",
        "chunk_source",
        "how the chunks reached the store: `present`, `byid` (fetched while unpacking) or `refetch` (the server refuses objects by id); null when nothing was unpacked",
    ),
    (
        "cache-restore",
        "chunks_reused",
        "chunks this machine already had (the shared chunk store)",
    ),
    (
        "cache-restore",
        "chunks_from_clone",
        "chunks found in the user's own clone",
    ),
    (
        "cache-restore",
        "chunks_fetched",
        "chunks fetched from the remote",
    ),
    ("cache-restore", "bytes_fetched", "their bytes"),
    (
        "cache-restore",
        "chunks_direct",
        "of those, chunks read straight from the pack the server sent, without `git fetch`",
    ),
    (
        "cache-restore",
        "direct_fallback",
        "why the rest went through `git fetch` after all, or why the direct reader was skipped; null when it read every chunk or none was fetched",
    ),
    (
        "cache-restore",
        "entries",
        "entries installed, as the stamp records",
    ),
    (
        "cache-restore",
        "signature_checks",
        "`ssh-keygen` signature checks in this run (0 on the warm path)",
    ),
    (
        "cache-restore",
        "trust",
        "the trust policy and this key's verdict; null when warm or reused",
    ),
    (
        "cache-restore",
        "trust.policy",
        "`off`, `warn` or `require`",
    ),
    (
        "cache-restore",
        "trust.key",
        "the key's verdict (null with policy `off`)",
    ),
    (
        "cache-restore",
        "trust.note",
        "when no policy is set at all: the line the restore prints",
    ),
    ("cache-restore", "duration_ms", "the whole restore"),
    (
        "cache-restore",
        "timings_ms.lock_wait",
        "waiting for the target's and the store's locks",
    ),
    (
        "cache-restore",
        "timings_ms.fetch",
        "fetching the branch's small files",
    ),
    (
        "cache-restore",
        "timings_ms.trust",
        "checking the statement's signature",
    ),
    (
        "cache-restore",
        "timings_ms.unpack",
        "decoding and writing the tree into staging",
    ),
    (
        "cache-restore",
        "timings_ms.chunk_fetch",
        "fetching chunks (overlaps `unpack`)",
    ),
    (
        "cache-restore",
        "timings_ms.chunk_wait",
        "time the unpack waited on a chunk not yet there",
    ),
    (
        "cache-restore",
        "timings_ms.install",
        "the swap into the target and the stamp",
    ),
    (
        "cache-restore",
        "reason",
        "why the stamp did not make the run warm, e.g. `installed key tc-1 differs: v 1 -> 2`",
    ),
    (
        "cache-restore",
        "files_linked",
        "files the delta install linked from the installed tree instead of writing them",
    ),
    ("cache-restore", "bytes_linked", "their bytes"),
    (
        "cache-restore",
        "chunks_skipped",
        "chunks of the key the delta install did not decode at all",
    ),
    (
        "cache-restore",
        "files_hashed",
        "installed files the delta install read to check their bytes before linking them (0 when the record vouches for them)",
    ),
    (
        "cache-restore",
        "delta_fallback",
        "why a delta install was possible but a full one was made; null when not",
    ),
    // cache verify
    ("cache-verify", "keys", "each key checked"),
    ("cache-verify", "keys[]", "one key"),
    ("cache-verify", "keys[].key", "the key"),
    (
        "cache-verify",
        "keys[].current",
        "true for the key this machine computes",
    ),
    (
        "cache-verify",
        "keys[].ok",
        "true when every chunk and the tar matched their digests",
    ),
    ("cache-verify", "keys[].chunk_count", "its chunks"),
    ("cache-verify", "keys[].compressed_bytes", "their size"),
    ("cache-verify", "keys[].tar_bytes", "its tar's size"),
    ("cache-verify", "keys[].tar_sha256", "its tar's SHA-256"),
    ("cache-verify", "keys[].entries", "its tar entries"),
    (
        "cache-verify",
        "installed",
        "the installed copy, checked against the current key's tar",
    ),
    ("cache-verify", "installed.target", "its path"),
    (
        "cache-verify",
        "installed.state",
        "`matches`, `differs` (with the first difference) or `not installed`",
    ),
    // conda info, conda unpack
    ("conda-info", "file", "the package file read"),
    ("conda-info", "package_bytes", "its size"),
    (
        "conda-info,conda-unpack",
        "format",
        "`conda` (zip of zstd tars) or `tar.bz2`",
    ),
    (
        "conda-info,conda-unpack",
        "name",
        "the package's name, from its metadata",
    ),
    ("conda-info,conda-unpack", "version", "its version"),
    ("conda-info,conda-unpack", "build", "its build string"),
    ("conda-info", "build_number", "its build number"),
    (
        "conda-info",
        "subdir",
        "its platform subdirectory (`linux-64`, `noarch`)",
    ),
    (
        "conda-info",
        "placeholder_source",
        "where the prefix placeholders were listed: `paths.json` or `has_prefix`",
    ),
    (
        "conda-info",
        "placeholders",
        "files whose text or bytes carry the build prefix, rewritten on unpack",
    ),
    ("conda-info", "placeholders[]", "one file"),
    (
        "conda-info",
        "placeholders[].path",
        "its path in the package",
    ),
    (
        "conda-info",
        "placeholders[].placeholder",
        "the prefix string to replace",
    ),
    (
        "conda-info",
        "placeholders[].mode",
        "`text` or `binary` (binary keeps the length, padding with NULs)",
    ),
    ("conda-info", "paths", "entries the package lists"),
    (
        "conda-info",
        "file_bytes",
        "bytes of regular files in the package; null when not counted",
    ),
    (
        "conda-info",
        "members",
        "the outer archive's members (a `.conda`'s zip entries)",
    ),
    ("conda-info", "members[]", "one member"),
    ("conda-info", "members[].name", "its name"),
    (
        "conda-info",
        "members[].kind",
        "`metadata`, `info`, `pkg` or `other`",
    ),
    ("conda-info", "members[].size", "its size"),
    ("conda-info", "members[].offset", "its offset in the file"),
    (
        "conda-info",
        "members[].zstd_window",
        "for a zstd member: the window its first frame declares, in bytes",
    ),
    ("conda-unpack", "prefix", "the prefix it was unpacked into"),
    ("conda-unpack", "files", "regular files written"),
    ("conda-unpack", "dirs", "directories made"),
    ("conda-unpack", "symlinks", "symbolic links made"),
    ("conda-unpack", "hardlinks", "hard links made"),
    ("conda-unpack", "file_bytes", "bytes written"),
    (
        "conda-unpack",
        "rewritten",
        "files whose prefix placeholder was rewritten",
    ),
    (
        "conda-unpack",
        "rewritten[]",
        "one path, relative to the prefix",
    ),
    // demo
    ("demo", "source", "the tree published"),
    ("demo", "scratch", "the scratch directory (remote, clones)"),
    (
        "demo",
        "kept",
        "true with `--keep`: the scratch directory is left for you",
    ),
    ("demo", "chunk_count", "chunks published"),
    (
        "demo",
        "restored_tar_sha256",
        "SHA-256 of the tar of the restored tree",
    ),
    (
        "demo",
        "equal",
        "true when the restored tree equals the source",
    ),
    ("demo", "timings_ms.compare", "comparing the trees"),
    ("demo", "timings_ms.publish", "the first publish"),
    (
        "demo",
        "timings_ms.publish_unchanged",
        "publishing again, unchanged",
    ),
    (
        "demo",
        "timings_ms.restore",
        "the cold restore into a fresh clone",
    ),
    ("demo", "timings_ms.restore_warm", "the warm re-run"),
    // gates
    (
        "gates-check,gates-status",
        "green",
        "true when every required gate has a trusted passing entry for this tree",
    ),
    (
        "gates-check,gates-status",
        "dirty",
        "paths changed against HEAD, which make the tree differ from the commit's",
    ),
    (
        "gates-check",
        "missing",
        "required gates with no trusted passing entry",
    ),
    ("gates-check", "missing[]", "one gate"),
    (
        "gates-check",
        "record",
        "the record for this tree (null when there is none)",
    ),
    ("gates-check", "record.format", "the record's format"),
    ("gates-check", "record.tree", "the tree it is for"),
    (
        "gates-check",
        "record.gates",
        "one entry per gate, keyed by the gate's name (here a gate named `ok`)",
    ),
    (
        "gates-check",
        "record.gates.ok",
        "the entry of the gate `ok`: the fields below",
    ),
    (
        "gates-check",
        "record.gates.ok.digest",
        "digest of the gate's definition (command, cwd) when it ran",
    ),
    ("gates-check", "record.gates.ok.command", "the command run"),
    (
        "gates-check",
        "record.gates.ok.cwd",
        "where it ran, relative to the root",
    ),
    (
        "gates-check",
        "record.gates.ok.duration_ms",
        "how long it ran",
    ),
    (
        "gates-check",
        "record.gates.ok.host",
        "the machine it ran on",
    ),
    (
        "gates-check",
        "record.gates.ok.tool",
        "the warmstart version that ran it",
    ),
    (
        "gates-check",
        "record.gates.ok.finished_at",
        "when it passed (RFC 3339 UTC)",
    ),
    (
        "gates-check",
        "record.gates.ok.commit",
        "the commit checked out when it ran",
    ),
    (
        "gates-fetch",
        "result",
        "`none-on-remote`, `up-to-date`, `fast-forward` or `merged`",
    ),
    (
        "gates-push",
        "result",
        "`created`, `updated` or `up-to-date`",
    ),
    (
        "gates-fetch,gates-push",
        "gates",
        "the gates the record now holds for this tree",
    ),
    ("gates-fetch,gates-push", "gates[]", "one gate"),
    (
        "gates-push,gates-run",
        "ref",
        "the ref that holds this tree's record",
    ),
    ("gates-run,gates-status", "gates", "each gate"),
    ("gates-run,gates-status", "gates[]", "one gate"),
    ("gates-run,gates-status", "gates[].name", "its name"),
    (
        "gates-run",
        "gates[].result",
        "`passed`, `already-green`, `failed`, `timed-out`, `interrupted` or `not-run`",
    ),
    ("gates-run", "gates[].duration_ms", "how long it ran"),
    (
        "gates-run",
        "gates[].recorded",
        "true when its pass was written to the record",
    ),
    (
        "gates-run",
        "gates[].reason",
        "why it was skipped or not recorded (a dirty tree is never recorded)",
    ),
    (
        "gates-run",
        "gates[].note",
        "anything else worth saying; null when nothing",
    ),
    (
        "gates-run",
        "gates[].log",
        "its full output, under the state directory",
    ),
    (
        "gates-status",
        "clean",
        "true when the worktree has no changes",
    ),
    (
        "gates-status",
        "gates[].state",
        "`green`, `missing` (no entry) or `stale` (its command, cwd or env changed since)",
    ),
    (
        "gates-status",
        "gates[].entry",
        "its entry in the record, as `gates check` shows it; null when none",
    ),
    (
        "gates-status",
        "gates[].entry.digest",
        "digest of the gate's definition when it ran",
    ),
    ("gates-status", "gates[].entry.command", "the command run"),
    ("gates-status", "gates[].entry.cwd", "where it ran"),
    (
        "gates-status",
        "gates[].entry.duration_ms",
        "how long it ran",
    ),
    (
        "gates-status",
        "gates[].entry.host",
        "the machine it ran on",
    ),
    (
        "gates-status",
        "gates[].entry.tool",
        "the warmstart version that ran it",
    ),
    (
        "gates-status",
        "gates[].entry.finished_at",
        "when it passed",
    ),
    (
        "gates-status",
        "gates[].entry.commit",
        "the commit checked out when it ran",
    ),
    // init
    ("init", "files", "every file init writes or checks"),
    ("init", "files[]", "one file"),
    ("init", "files[].path", "its path from the repository root"),
    (
        "init",
        "files[].state",
        "`created`, `updated`, `current`, `missing` (with `--check`) or `yours` (edited by you: left as it is)",
    ),
    ("init", "files[].detail", "what differs, or why it was left"),
    (
        "init",
        "registry_step",
        "true when the generated CI installs warmstart from a registry",
    ),
    (
        "init",
        "post_create_command",
        "the command a dev container or session hook runs (the bootstrap script)",
    ),
    (
        "init",
        "stale",
        "with `--check`: the files that are not as init would write them",
    ),
    ("init", "stale[]", "one path"),
    (
        "init",
        "test_command",
        "the test gate's command init detected (what it writes into a gates.toml it generates), as argv; null when none is unambiguous and the gate is a placeholder that fails",
    ),
    ("init", "test_command[]", "one argument"),
    (
        "init",
        "test_command_detected_from",
        "what init found that made it sure (`Cargo.toml and Cargo.lock at the root`); null with no command",
    ),
    // restore and its subcommands
    (
        "restore",
        "all_steps_ok",
        "false when a step failed open (the exit is still 0); `ok` is the exit status",
    ),
    (
        "restore,restore-status",
        "steps",
        "each step of the plan, in plan order (with `--background`, their names)",
    ),
    ("restore,restore-status", "steps[]", "one step"),
    ("restore,restore-status", "steps[].step", "its name"),
    (
        "restore,restore-status",
        "steps[].kind",
        "`cache`, `submodules`, `links`, `pin`, `download`, `command`, `service` or `freshness`",
    ),
    (
        "restore,restore-status",
        "steps[].source",
        "the file that defines it",
    ),
    (
        "restore,restore-status",
        "steps[].state",
        "`done`, `warm` (its probe said done), `warned`, `failed-open` (the restore went on), `failed`, `background`, `skipped`, `running` or `partial` (a cache fallback key)",
    ),
    (
        "restore,restore-status",
        "steps[].what",
        "what it did, in words",
    ),
    (
        "restore,restore-status",
        "steps[].duration_ms",
        "how long it took this time",
    ),
    (
        "restore,restore-status",
        "steps[].last_cold_ms",
        "how long its last cold run took",
    ),
    (
        "restore,restore-status",
        "steps[].cache_hint",
        "the 10-minute rule (`slow_uncached`): its cold time, that no cache holds its result, and the command that would cache it; null when not flagged (always null in `restore status`)",
    ),
    (
        "restore,restore-status",
        "steps[].log",
        "its log file; null when it wrote none",
    ),
    (
        "restore,restore-status",
        "steps[].pid",
        "a service's process id; null for other steps",
    ),
    (
        "restore",
        "background_pid",
        "with `--background`: the process that goes on with the plan",
    ),
    ("restore", "log", "with `--background`: the log it writes"),
    ("restore", "file", "with `--dry-run`: the plan file read"),
    (
        "restore",
        "parallel",
        "with `--dry-run`: how many steps may run at once; null: the default",
    ),
    (
        "restore",
        "env",
        "with `--dry-run`: the plan's exports, as `restore env` prints them",
    ),
    ("restore", "env.path", "directories put before `PATH`"),
    ("restore", "env.env", "variables set, by name"),
    (
        "restore",
        "steps[].background",
        "with `--dry-run`: true when the step runs after the restore returns",
    ),
    (
        "restore",
        "steps[].fail_open",
        "with `--dry-run`: true when its failure does not fail the restore",
    ),
    (
        "restore",
        "steps[].after",
        "with `--dry-run`: the steps it waits for",
    ),
    (
        "restore",
        "steps[].detail",
        "with `--dry-run`: its settings as the plan gives them (fields per kind)",
    ),
    ("restore", "steps[].detail.cache", "a cache step's cache"),
    ("restore", "steps[].detail.manifest", "its manifest file"),
    (
        "restore",
        "steps[].detail.remote_name",
        "the remote as configured (a name or URL, not resolved)",
    ),
    ("restore", "steps[].detail.run", "a command step's command"),
    (
        "restore",
        "steps[].detail.creates",
        "the path whose presence makes it warm",
    ),
    (
        "restore",
        "steps[].detail.unless",
        "a command whose success makes it warm; null when none",
    ),
    ("restore", "steps[].detail.cwd", "where it runs"),
    (
        "restore",
        "steps[].detail.timeout_ms",
        "its time limit; null: none",
    ),
    (
        "restore",
        "steps[].detail.retries",
        "how often it is retried",
    ),
    (
        "restore",
        "steps[].detail.backoff_ms",
        "the first wait between tries",
    ),
    (
        "restore",
        "steps[].detail.paths",
        "a submodules step's paths",
    ),
    ("restore", "steps[].detail.paths[]", "one path"),
    (
        "restore",
        "steps[].detail.sentinels",
        "files whose absence marks a submodule checkout as broken",
    ),
    ("restore", "steps[].detail.sentinels[]", "one sentinel"),
    (
        "restore",
        "steps[].detail.sentinels[].suite",
        "the submodule it belongs to",
    ),
    (
        "restore",
        "steps[].detail.sentinels[].path",
        "the file that must exist",
    ),
    (
        "restore",
        "steps[].detail.sentinels[].breaks",
        "what is broken without it, in words",
    ),
    (
        "restore",
        "steps[].detail.allow_file_protocol",
        "submodules served from local paths are allowed",
    ),
    (
        "restore",
        "steps[].detail.jobs",
        "submodules cloned at once",
    ),
    (
        "restore",
        "steps[].detail.shallow",
        "submodules cloned with `--depth 1`",
    ),
    (
        "restore",
        "steps[].detail.source",
        "a links step's scanned directory",
    ),
    ("restore", "steps[].detail.farm", "its directory of links"),
    (
        "restore",
        "steps[].detail.index",
        "a file that should mention every entry; null when none",
    ),
    (
        "restore",
        "steps[].detail.entries",
        "which entries are linked: `dirs`, `files` or `all`",
    ),
    (
        "restore",
        "steps[].detail.include",
        "globs of the entries linked; null: every entry",
    ),
    (
        "restore",
        "steps[].detail.url",
        "a download step's URL (credentials redacted)",
    ),
    (
        "restore",
        "steps[].detail.sha256",
        "the SHA-256 the file must have",
    ),
    (
        "restore",
        "steps[].detail.dest",
        "where the checked file goes",
    ),
    (
        "restore",
        "steps[].detail.executable",
        "true when it is made executable",
    ),
    (
        "restore",
        "steps[].detail.unpack_into",
        "a conda package's prefix; null when the file is kept as it is",
    ),
    (
        "restore",
        "steps[].detail.only",
        "with `unpack_into`: the directories unpacked; null: everything",
    ),
    (
        "restore",
        "steps[].detail.connect_timeout_ms",
        "the connect deadline",
    ),
    (
        "restore",
        "steps[].detail.read_timeout_ms",
        "no byte for this long: abandon and retry",
    ),
    (
        "restore",
        "steps[].detail.max_time_ms",
        "the bound on each attempt; null: none",
    ),
    (
        "restore",
        "steps[].detail.tool",
        "a pin step's tool, looked up in PATH or a path",
    ),
    ("restore", "steps[].detail.args", "its arguments"),
    ("restore", "steps[].detail.args[]", "one argument"),
    (
        "restore",
        "steps[].detail.expect",
        "the regex its output must match",
    ),
    (
        "restore",
        "steps[].detail.fix",
        "the fix when it does not match: `{symlink, target}` or `{run}`; null when none",
    ),
    (
        "restore",
        "steps[].detail.fix.run",
        "the command the fix runs",
    ),
    (
        "restore",
        "steps[].detail.branch",
        "a freshness step's branch; null: the branch's upstream",
    ),
    (
        "restore",
        "steps[].detail.interval_ms",
        "a check younger than this is warm",
    ),
    ("restore", "steps[].detail.pidfile", "a service's pidfile"),
    ("restore", "steps[].detail.log", "its log, appended"),
    (
        "restore",
        "steps[].detail.ready_port",
        "ready once 127.0.0.1 accepts a connection on this port; null when not used",
    ),
    (
        "restore",
        "steps[].detail.ready_cmd",
        "ready once this command exits 0; null when not used",
    ),
    (
        "restore",
        "steps[].detail.ready_timeout_ms",
        "not ready by then: stopped, and the step fails",
    ),
    (
        "restore",
        "steps[].detail.watch",
        "files whose change restarts it",
    ),
    (
        "restore",
        "steps[].detail.kill_grace_ms",
        "`restore stop`: SIGTERM, then SIGKILL after this",
    ),
    (
        "restore-status",
        "running",
        "true while a restore (or its background part) is running",
    ),
    (
        "restore-status",
        "steps[].alive",
        "a service's process is alive",
    ),
    (
        "restore-status",
        "steps[].started_at",
        "when the step started (RFC 3339 UTC)",
    ),
    ("restore-status", "steps[].finished_at", "when it finished"),
    (
        "restore-status",
        "state_file",
        "the file these states are read from",
    ),
    ("restore-env", "path", "directories to put before `PATH`"),
    ("restore-env", "env", "variables to set, by name"),
    ("restore-env", "from", "the steps that contributed"),
    (
        "restore-env",
        "left_out",
        "steps whose exports were left out, each `{step, state, why}` (a step not done)",
    ),
    ("restore-stop", "services", "each service step"),
    ("restore-stop", "services[]", "one service"),
    ("restore-stop", "services[].step", "its step"),
    ("restore-stop", "services[].pidfile", "its pidfile"),
    (
        "restore-stop",
        "services[].was_running",
        "true when it was running",
    ),
    (
        "restore-stop",
        "services[].pid",
        "its process id; null when none ran",
    ),
    (
        "restore-stop",
        "services[].signal",
        "the signal that ended it; null when none was sent",
    ),
    ("restore-stop", "services[].note", "what happened, in words"),
    (
        "restore-stop",
        "services[].ok",
        "true when it is no longer running",
    ),
    (
        "restore-stop",
        "services[].duration_ms",
        "how long stopping it took",
    ),
    // resume (the entries are the JavaScript tool's, as stored)
    (
        "resume-list",
        "entries",
        "the index entries as stored, every field kept",
    ),
    ("resume-list", "entries[]", "one entry"),
    ("resume-list", "entries[].surfaceId", "the terminal surface"),
    (
        "resume-list",
        "entries[].sessionId",
        "the agent session it maps to",
    ),
    ("resume-list", "entries[].repo", "the repository it was in"),
    ("resume-list", "entries[].role", "the agent's role"),
    (
        "resume-list",
        "entries[].captured_at",
        "when the entry was made, epoch milliseconds (the JavaScript format)",
    ),
    (
        "resume-list",
        "entries[].last_active",
        "when it was last active, epoch milliseconds",
    ),
    ("resume-lookup", "surfaceId", "the terminal surface"),
    ("resume-lookup", "sessionId", "the agent session it maps to"),
    ("resume-lookup", "repo", "the repository it was in"),
    ("resume-lookup", "role", "the agent's role"),
    (
        "resume-lookup",
        "captured_at",
        "when the entry was made, epoch milliseconds (the JavaScript format)",
    ),
    (
        "resume-lookup",
        "last_active",
        "when it was last active, epoch milliseconds",
    ),
    ("resume-resume-cmd", "launcher", "the agent launcher to run"),
    ("resume-resume-cmd", "sessionId", "the session to resume"),
    (
        "resume-resume-cmd",
        "cwd",
        "the directory to run it in; null when the entry has none",
    ),
    (
        "resume-resume-cmd",
        "shell_command",
        "the whole command line, quoted for a POSIX shell",
    ),
    ("resume-prune", "path", "the index file"),
    ("resume-prune", "pruned", "the surfaces removed"),
    ("resume-prune", "remaining", "entries left"),
    (
        "doctor",
        "hosts",
        "every host and transport the restore reaches, one row each, in transport then host order",
    ),
    ("doctor", "hosts[]", "one host by one transport"),
    (
        "doctor",
        "hosts[].host",
        "the host name or address, lower case",
    ),
    (
        "doctor",
        "hosts[].port",
        "the port (the scheme's default when the URL names none)",
    ),
    (
        "doctor",
        "hosts[].transport",
        "`git-https`, `ssh`, `git` (a git daemon), `https` (a download) or `registry` (a package registry a command step uses)",
    ),
    (
        "doctor",
        "hosts[].url",
        "the first URL naming it, without credentials or secret query values",
    ),
    (
        "doctor",
        "hosts[].used_by",
        "who needs it: `remote NAME`, `cache NAME`, `submodule NAME`, `step NAME (KIND)`",
    ),
    ("doctor", "hosts[].used_by[]", "one of them"),
    (
        "doctor",
        "hosts[].route",
        "`direct`, `proxy`, or `ssh-proxy-command` (ssh's own ProxyCommand or ProxyJump: not probed)",
    ),
    (
        "doctor",
        "hosts[].proxy",
        "the proxy the client uses for it, without credentials; null when direct",
    ),
    (
        "doctor",
        "hosts[].proxy_from",
        "where that proxy is set: the variable (`HTTPS_PROXY`, `https_proxy`, `ALL_PROXY`...) or `http.proxy`; null when direct",
    ),
    (
        "doctor",
        "hosts[].no_proxy_from",
        "when a proxy is set but this host goes direct: the variable whose list names it (`NO_PROXY` or `no_proxy`); else null",
    ),
    (
        "doctor",
        "hosts[].result",
        "`answered`, `connected`, `proxy-refused`, `proxy-down`, `refused`, `timed-out`, `dns-failure`, `tls-failure`, `failed` or `not-probed`",
    ),
    (
        "doctor",
        "hosts[].status_line",
        "the status line that decided it (`HTTP/1.1 403 Forbidden`, an ssh banner); null when nothing answered",
    ),
    (
        "doctor",
        "hosts[].status_from",
        "who sent `status_line`: `proxy` or `origin` (the host itself); null with it",
    ),
    (
        "doctor",
        "hosts[].detail",
        "what the client said, redacted; null when it said nothing",
    ),
    (
        "doctor",
        "hosts[].reached",
        "true when the host itself answered or accepted the connection",
    ),
    (
        "doctor",
        "hosts[].meaning",
        "what the result means, in one line that says what to do",
    ),
    (
        "doctor",
        "hosts[].duration_ms",
        "how long its probe took, in whole milliseconds",
    ),
    ("doctor", "reached", "how many rows reached their host"),
    (
        "doctor",
        "not_reached",
        "how many did not (not counting `not-probed`); more than 0 is exit 8",
    ),
];

/// Every field path of one command's snapshots, in first-seen order, with
/// the types the snapshots give it (several when a variant differs, e.g.
/// `object` and `null`).
pub type Fields = Vec<(String, BTreeSet<String>)>;

/// The fields of each command (a snapshot file's name up to its first `.`).
pub fn fields_by_command(dir: &Path) -> BTreeMap<String, Fields> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    let mut out: BTreeMap<String, Fields> = BTreeMap::new();
    for f in files {
        let stem = f.file_stem().unwrap().to_string_lossy().into_owned();
        let command = stem.split('.').next().unwrap().to_string();
        let doc: Value = serde_json::from_str(&std::fs::read_to_string(&f).unwrap()).unwrap();
        let fields = out.entry(command).or_default();
        walk(&doc, "", fields);
    }
    out
}

fn walk(v: &Value, path: &str, fields: &mut Fields) {
    let ty = match v {
        Value::Object(_) => "object",
        Value::Array(_) => "array",
        // A snapshot holds each scalar's type as a string: `"number"`.
        Value::String(s) => s.as_str(),
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
    };
    if !path.is_empty() {
        match fields.iter_mut().find(|(p, _)| p == path) {
            Some((_, types)) => {
                types.insert(ty.to_string());
            }
            None => fields.push((path.to_string(), BTreeSet::from([ty.to_string()]))),
        }
    }
    match v {
        Value::Object(map) => {
            for (k, x) in map {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                walk(x, &p, fields);
            }
        }
        Value::Array(items) => {
            for x in items {
                walk(x, &format!("{path}[]"), fields);
            }
        }
        _ => {}
    }
}

fn applies(commands: &str, command: &str) -> bool {
    commands.split(',').any(|c| c == command)
}

/// The meaning of `path` in `command`: its own row, else the `*` row.
pub fn meaning(command: &str, path: &str) -> Option<&'static str> {
    let own = MEANINGS
        .iter()
        .find(|(c, p, _)| *p == path && applies(c, command));
    own.or_else(|| MEANINGS.iter().find(|(c, p, _)| *c == "*" && *p == path))
        .map(|(_, _, m)| *m)
}

/// The table of one command's fields, and the fields with no meaning.
pub fn table(command: &str, fields: &Fields) -> (String, Vec<String>) {
    let mut s = String::from("| field | type | meaning |\n|---|---|---|\n");
    let mut missing = Vec::new();
    for (path, types) in fields {
        let types: Vec<&str> = types.iter().map(String::as_str).collect();
        let m = meaning(command, path).unwrap_or_else(|| {
            missing.push(format!("{command}: `{path}`"));
            ""
        });
        s.push_str(&format!("| `{path}` | {} | {m} |\n", types.join(" or ")));
    }
    (s, missing)
}

/// Rows of the table that no snapshot field uses: a renamed or removed
/// field whose meaning stayed behind.
pub fn unused(by_command: &BTreeMap<String, Fields>) -> Vec<String> {
    MEANINGS
        .iter()
        .filter(|(commands, path, _)| {
            let used = |command: &str, fields: &Fields| {
                fields.iter().any(|(p, _)| p == path)
                    && (*commands == "*" || applies(commands, command))
            };
            !by_command.iter().any(|(c, f)| used(c, f))
        })
        .map(|(c, p, _)| format!("{c}: `{p}`"))
        .collect()
}
