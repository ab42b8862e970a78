//! The bodies `init` generates: the binary-cache manifest, `restore.toml`, the
//! example cache, the bootstrap script and the CI workflow.
//!
//! The script and the CI files are embedded from one file each
//! (`bootstrap.sh` here; `gates.yml` and `ci-gates.sh` are links to this
//! repository's own `.github/workflows/gates.yml` and `tools/ci-gates.sh`),
//! so that this repository runs exactly what `init` writes elsewhere. Nothing here touches the file system.

use crate::cli::init::Binary;

/// The generic bootstrap script (`tools/warmstart-bootstrap.sh`).
pub const BOOTSTRAP: &str = include_str!("bootstrap.sh");
/// The CI gate-and-publish workflow (`.github/workflows/gates.yml`).
pub const WORKFLOW: &str = include_str!("gates.yml");
/// What the workflow runs: gates, then publish (`tools/ci-gates.sh`, a link).
pub const CI_GATES: &str = include_str!("ci-gates.sh");

/// The test command `init` detected for the `test` gate, and why; `None`
/// when nothing is unambiguous (the gate is then a placeholder that fails).
pub struct TestCommand {
    pub argv: Vec<String>,
    /// What was found, for init's line and the file's comment.
    pub because: String,
}

/// The line the placeholder gate fails with: a gate that passed without
/// testing anything would let CI publish untested caches.
pub const PLACEHOLDER_GATE: &str = "gate test is a placeholder: init found no test command it could be sure of; edit cache-manifests/gates.toml to run your tests";

/// `cache-manifests/gates.toml`: what CI proves before it publishes.
pub fn gates_toml(test: Option<&TestCommand>) -> String {
    let (why, command) = match test {
        Some(t) => (format!("# init detected {}.", t.because), quoted(&t.argv)),
        None => (
            "# init found no test command it could be sure of: this gate fails, and so\n\
# every publish waits, until you replace it with your own."
                .to_string(),
            quoted(&[
                "sh",
                "-c",
                &format!("echo '{PLACEHOLDER_GATE}' >&2; exit 1"),
            ]),
        ),
    };
    format!(
        "# Gates: commands that must pass on a clean tree before a cache is published\n\
# from it (`warmstart gates --help`). tools/ci-gates.sh runs them in CI,\n\
# records them green for the tree, then publishes every cache. A cache\n\
# requires the gates its manifest lists under [publish] gates.\n\
{why}\n\
\n\
[[gate]]\n\
name = \"test\"\n\
command = {command}\n\
timeout = \"40m\"\n"
    )
}

/// What the binary-cache manifest needs to know about the repository.
pub struct BinCache<'a> {
    pub binary: Binary,
    /// The xtask crate's package name (xtask mode).
    pub package: &'a str,
    /// Paths whose git trees key the xtask crate's binary.
    pub tree_paths: &'a [String],
    /// `pip --require-hashes` hashes of the published wheel, if any.
    pub pip_hashes: &'a [String],
}

/// The manifest's name (`cache-manifests/<name>.toml`).
pub fn bin_cache_name(binary: Binary) -> &'static str {
    match binary {
        Binary::Xtask => "xtask-bin",
        Binary::Standalone => "warmstart-bin",
    }
}

fn quoted(items: &[impl AsRef<str>]) -> String {
    let v: Vec<String> = items
        .iter()
        .map(|s| format!("\"{}\"", s.as_ref()))
        .collect();
    format!("[{}]", v.join(", "))
}

/// What differs between the xtask binary's cache and the standalone one's.
struct BinParts {
    /// The manifest's opening comment.
    what: String,
    /// The `[[key]]` tables.
    key: String,
    pack_root: String,
    /// The executable, relative to the pack root.
    exec: String,
    /// The compile fallback's command, as a TOML array.
    build: String,
    /// Where the compile fallback leaves the executable.
    built: String,
}

/// The standalone compile fallback. No warmstart release exists on any
/// registry yet and the project has no public address to `cargo install
/// --git` from, so the honest fallback says so and names the build that
/// works, rather than a version no registry has. Kept to the subset the
/// bootstrap's reader allows (no `"` or backslash).
pub const NO_RELEASE: &str = "echo 'no warmstart release exists to install: build it from a checkout of warmstart with cargo build --release, and copy target/release/warmstart to target/warmstart-build/bin/warmstart' >&2; exit 1";

fn bin_parts(b: &BinCache) -> BinParts {
    let version = env!("CARGO_PKG_VERSION");
    let (what, key, pack_root, exec, build, built) = match b.binary {
        Binary::Xtask => (
            format!(
                "The prebuilt binary of this repository's xtask crate (package `{}`).\n\
# CI publishes it after `cargo build --release -p {}`; it is keyed by the git\n\
# trees of the crate and its lockfile plus the platform, so any change to\n\
# them makes a new key.",
                b.package, b.package
            ),
            format!(
                "[[key]]\nname = \"platform\"\nplatform = true\n\n[[key]]\nname = \"src\"\ngit_tree = {}\n",
                quoted(b.tree_paths)
            ),
            "target/release".to_string(),
            b.package.to_string(),
            quoted(&["cargo", "build", "--release", "--locked", "-p", b.package]),
            format!("target/release/{}", b.package),
        ),
        Binary::Standalone => (
            format!(
                "The standalone warmstart binary, version {version}, keyed by the version\n\
# plus the platform. CI publishes what the build command below leaves at\n\
# `built`; no warmstart release exists yet, so that command only says how\n\
# to build one from source: replace it with your own build, or put the\n\
# binary there before tools/ci-gates.sh runs."
            ),
            format!(
                "[[key]]\nname = \"version\"\nliteral = \"{version}\"\n\n[[key]]\nname = \"platform\"\nplatform = true\n"
            ),
            "target/warmstart-build/bin".to_string(),
            "warmstart".to_string(),
            quoted(&["sh", "-c", NO_RELEASE]),
            "target/warmstart-build/bin/warmstart".to_string(),
        ),
    };
    BinParts {
        what,
        key,
        pack_root,
        exec,
        build,
        built,
    }
}

/// The `[bootstrap]` registry step's lines, or why it is omitted.
fn pip_lines(b: &BinCache) -> String {
    let version = env!("CARGO_PKG_VERSION");
    if b.pip_hashes.is_empty() {
        "# The registry step (`pip install --require-hashes`) is omitted: no\n\
# published version is pinned. `init --pip-hash sha256:...` adds it.\n"
            .to_string()
    } else {
        format!(
            "pip = \"warmstart=={version}\"\npip_hashes = {}\n",
            quoted(b.pip_hashes)
        )
    }
}

/// The binary cache that tools/warmstart-bootstrap.sh reads.
pub fn bin_cache(b: &BinCache) -> String {
    let name = bin_cache_name(b.binary);
    let BinParts {
        what,
        key,
        pack_root,
        exec,
        build,
        built,
    } = bin_parts(b);
    let pip = pip_lines(b);
    format!(
        "# {what}\n\
#\n\
# tools/warmstart-bootstrap.sh fetches it with git and coreutils alone, so a\n\
# fresh machine needs no compiler. The script parses this file in shell: keep\n\
# to one-line values, strings without quotes or backslashes, and key pins\n\
# `literal`, `platform`, `git_tree` or `file` (a one-line file); warmstart\n\
# refuses any other form in this manifest (exit 10).\n\
\n\
# A ref outside refs/heads/, so a plain clone never downloads the binary;\n\
# the bootstrap fetches it by name.\n\
[cache]\n\
ref = \"refs/warmstart/cache/{name}\"\n\
description = \"prebuilt {exec} binary for tools/warmstart-bootstrap.sh\"\n\
\n\
{key}\n\
[pack]\n\
root = \"{pack_root}\"\n\
include = [\"{exec}\"]\n\
\n\
[restore]\n\
path = \"target/warmstart-bin\"\n\
\n\
[ready]\n\
path = \"{exec}\"\n\
\n\
# CI publishes it only with these gates of gates.toml green for the tree.\n\
[publish]\n\
gates = [\"test\"]\n\
\n\
# The executable in the restored directory, and the compile fallback.\n\
[bootstrap]\n\
exec = \"{exec}\"\n\
build = {build}\n\
built = \"{built}\"\n\
{pip}"
    )
}

/// The line by which restore.toml records `init --no-agent-hook`, so that
/// later runs of init neither wire the hook nor call it missing.
pub const AGENT_HOOK_OFF: &str =
    "# warmstart-agent-hook: off (init --no-agent-hook; `init --agent-hook` wires it)";

/// `cache-manifests/restore.toml`: the binary cache, then the user's steps;
/// with `hook_off`, the line that records that no agent hook is wanted.
pub fn restore_toml(bin_cache: &str, hook_off: bool) -> String {
    let off = if hook_off {
        format!("{AGENT_HOOK_OFF}\n")
    } else {
        String::new()
    };
    format!(
        "{off}# The steps `restore` runs at session start, in order (`warmstart restore\n\
# --help`; `warmstart restore --dry-run` prints the plan they make).\n\
# tools/warmstart-bootstrap.sh runs it once it has the binary.\n\
\n\
# The binary itself: keeps the cache module's install and stamp of it current.\n\
# In the background: the bootstrap has just installed this key, so nothing\n\
# waits on this step (in front, it would fetch and unpack the binary again).\n\
[[step]]\n\
name = \"{bin_cache}\"\n\
kind = \"cache\"\n\
cache = \"{bin_cache}\"\n\
background = true\n\
\n\
# Add one step per cache of yours, e.g. for cache-manifests/toolchain.toml\n\
# (see example.toml.sample):\n\
#\n\
# [[step]]\n\
# name = \"toolchain\"\n\
# kind = \"cache\"\n\
# cache = \"toolchain\"\n"
    )
}

/// `cache-manifests/example.toml.sample`: a commented cache to copy.
pub const EXAMPLE: &str = r#"# An example cache: copy it to cache-manifests/<name>.toml and edit it.
# `warmstart cache --help` and `warmstart cache publish --help` say how a
# cache is published and restored; `warmstart cache status NAME` shows how
# its key is built from the fields below.

[cache]
# The ref that holds the cache: outside refs/heads/, so a plain clone never
# downloads it (without `ref`, the branch <name>-cache, which every clone does).
ref = "refs/warmstart/cache/toolchain"
description = "the project's toolchain"

# The key: its pins, in order, joined with "-". A changed pin is a new key.
[[key]]
name = "platform"
platform = true

[[key]]
name = "version"
# A one-line file in the repository, e.g. `1.2.3`.
file = "toolchain-version.txt"

[pack]
# What to pack: a root, and globs relative to it.
root = "~/.local/toolchain"
include = ["bin/**", "lib/**"]

[restore]
# Where it restores (`~` and $VARS expand); replace swaps the directory in.
path = "~/.local/toolchain"
mode = "replace"

[ready]
# The install is usable when this exists (relative to the restore path).
path = "bin"

[publish]
# Gates of cache-manifests/gates.toml that must be green before a publish.
gates = []
"#;
