//! Cache manifests: `cache-manifests/<name>.toml`, parsed into a validated plan.
//!
//! Two stages, as in ripgrep's flag handling: `Raw*` types are what the user
//! wrote (serde, unknown fields refused), `CacheManifest` is the resolved plan
//! (paths expanded, globs compiled, limits checked). Pure: the parsers take
//! text and never read a file or run git; `cache::manifests` reads the
//! manifest and the pin files, and asks git for tree ids.

use crate::hex;
use anyhow::{Context, Result, anyhow, bail};
use serde::Deserialize;
use std::path::{Path, PathBuf};

use super::place;

use crate::cache::format::chunk_sizes::Sizes;
use crate::cache::format::{DEFAULT_CHUNK_BYTES, MAX_CHUNK_BYTES};
use crate::repo::Repo;

pub use crate::cache::format::key::{Key, json_pin, key_from_parts, one_line, platform, regex_pin};

/// Files in `cache-manifests/` that are not cache manifests.
pub const RESERVED: [&str; 3] = ["restore", "gates", "trust"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManifest {
    #[serde(default)]
    cache: RawCache,
    #[serde(default)]
    key: Vec<RawPin>,
    pack: RawPack,
    restore: RawRestore,
    #[serde(default)]
    ready: Option<RawReady>,
    #[serde(default)]
    publish: RawPublish,
    /// Deadlines of this cache's fetches and pushes (see `crate::net`).
    #[serde(default)]
    network: crate::net::RawNetwork,
    #[serde(default)]
    trust: super::trust::CacheTrust,
    /// Only in the binary cache that tools/warmstart-bootstrap.sh reads.
    #[serde(default)]
    bootstrap: Option<crate::cache::format::bootstrap::RawBootstrap>,
    /// How the artifact is built from source (`cache build`).
    #[serde(default)]
    build: Option<crate::cache::format::build::RawBuild>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    branch: Option<String>,
    /// A full ref outside `refs/heads/` (`refs/warmstart/cache/<name>`),
    /// instead of `branch`: plain clones and fetches never download it.
    #[serde(rename = "ref")]
    full_ref: Option<String>,
    remote: Option<String>,
    /// A repository in an OCI registry (`host[:port]/repo`), instead of a
    /// git branch or ref and remote (`crate::oci`).
    registry: Option<String>,
    /// Registries asked for a registry cache's blobs before `registry`
    /// (`crate::oci::mirror`).
    mirrors: Option<Vec<String>>,
    description: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    name: String,
    literal: Option<String>,
    #[serde(default)]
    platform: bool,
    json: Option<RawJsonPin>,
    regex: Option<RawRegexPin>,
    git_tree: Option<Vec<String>>,
    file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJsonPin {
    file: String,
    pointer: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRegexPin {
    file: String,
    pattern: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPack {
    root: String,
    #[serde(default)]
    include: Vec<String>,
    #[serde(default)]
    exclude: Vec<String>,
    #[serde(default)]
    keep_mtime: bool,
    #[serde(default)]
    absolute_symlinks: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRestore {
    path: String,
    #[serde(default)]
    mode: Mode,
    /// On an exact miss, the keys that may stand in, in order.
    #[serde(default)]
    fallback: Vec<RawFallback>,
    /// How long a stand-in (`partial`) install stays warm.
    recheck: Option<crate::clock::DurationSpec>,
    /// Pinned value -> the version a legacy archive's name may carry for it.
    #[serde(default)]
    legacy_versions: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFallback {
    drop: Option<Vec<String>>,
    prefix: Option<String>,
}

/// One `[[restore.fallback]]`: which branch keys may stand in for an exact
/// key the branch lacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fallback {
    /// Keys whose parts equal today's except these (by pin name).
    Drop(Vec<String>),
    /// Keys that start with this text.
    Prefix(String),
}

impl std::fmt::Display for Fallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fallback::Drop(parts) => write!(f, "drop {}", parts.join(", ")),
            Fallback::Prefix(p) => write!(f, "prefix {p}"),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReady {
    path: Option<String>,
    command: Option<Vec<String>>,
    matches: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPublish {
    #[serde(default)]
    gates: Vec<String>,
    /// Bytes, or a size such as `"50MiB"` (`size::parse_size`).
    chunk_bytes: Option<crate::size::SizeSpec>,
    /// The average content-defined chunk, of uncompressed tar (`"4MiB"`).
    chunk_avg: Option<crate::size::SizeSpec>,
    /// `"fast"`, `"small"` or a zstd level.
    level: Option<LevelSpec>,
    lease_deadline: Option<crate::clock::DurationSpec>,
    /// Prune on every publish: per platform value, the newest N keys (plus
    /// the one today's pins give) stay.
    keep: Option<u32>,
    /// The most bytes of new blobs one push sends (`cache::publish::push`).
    push_limit: Option<crate::size::SizeSpec>,
}

/// The named zstd levels of `[publish] level`: `fast` for caches published
/// often (each publish compresses what changed, and time to publish is what
/// a landing waits for), `small` for caches written once and read many
/// times (a toolchain: fewer bytes on every restore's wire). BENCHMARKS.md
/// has the measured trade-off.
pub const LEVELS: [(&str, i32); 2] = [("fast", 3), ("small", 19)];

/// The level when the manifest names none.
pub const DEFAULT_LEVEL: i32 = LEVELS[0].1;

/// `[publish] level`: a name from `LEVELS` or a number.
#[derive(Debug)]
enum LevelSpec {
    Number(i64),
    Name(String),
}

impl<'de> Deserialize<'de> for LevelSpec {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LevelSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                write!(f, "\"fast\", \"small\" or a zstd level from 1 to 19")
            }
            fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<LevelSpec, E> {
                Ok(LevelSpec::Number(n))
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<LevelSpec, E> {
                Ok(LevelSpec::Number(i64::try_from(n).unwrap_or(i64::MAX)))
            }
            fn visit_str<E: serde::de::Error>(self, t: &str) -> Result<LevelSpec, E> {
                Ok(LevelSpec::Name(t.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// The zstd level `[publish] level` names; unknown names and numbers out
/// of range are errors that list what is allowed.
fn level_of(spec: Option<&LevelSpec>) -> Result<i32> {
    let allowed = || {
        LEVELS
            .iter()
            .map(|(n, l)| format!("\"{n}\" (zstd {l})"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match spec {
        None => Ok(DEFAULT_LEVEL),
        Some(LevelSpec::Number(n)) => match i32::try_from(*n) {
            Ok(l) if (1..=19).contains(&l) => Ok(l),
            _ => bail!(
                "publish.level = {n} is not a zstd level: give {} or a level from 1 to 19",
                allowed()
            ),
        },
        Some(LevelSpec::Name(name)) => LEVELS
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, l)| *l)
            .ok_or_else(|| {
                anyhow!(
                    "publish.level = {name:?} is not a level name: give {} or a level from 1 to 19",
                    allowed()
                )
            }),
    }
}

/// How a restore installs: replace a directory the cache owns, or merge
/// files into a shared prefix (with a journal).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    #[default]
    Replace,
    Merge,
    /// Merge, but never replace a file the user changed since warmstart
    /// installed it (`cache::restore::overlay`).
    Overlay,
}

/// One pin of the key.
#[derive(Clone, Debug)]
pub enum PinSource {
    Literal(String),
    Platform,
    Json {
        file: PathBuf,
        pointer: String,
    },
    Regex {
        file: PathBuf,
        pattern: regex_lite::Regex,
    },
    GitTree(Vec<String>),
    /// A one-line file: its text without the trailing newline.
    File(PathBuf),
}

#[derive(Clone, Debug)]
pub struct Pin {
    pub name: String,
    pub source: PinSource,
}

/// The ready-probe: the install is usable when this holds.
#[derive(Clone, Debug)]
pub enum Ready {
    /// The restore directory itself exists.
    Exists,
    /// This path (relative to the restore path) exists.
    Path(PathBuf),
    /// This command's stdout matches (or, without a pattern, it succeeds).
    Command {
        argv: Vec<String>,
        matches: Option<regex_lite::Regex>,
    },
}

/// A validated cache manifest.
#[derive(Clone, Debug)]
pub struct CacheManifest {
    pub name: String,
    pub file: PathBuf,
    /// Where the cache lives on the remote: a branch name (`<name>-cache`,
    /// meaning `refs/heads/<name>-cache`) or, from `cache.ref`, a full ref
    /// starting with `refs/` (see `cache::fetch::git::remote_ref`).
    pub branch: String,
    pub remote: String,
    /// `cache.registry`: the cache lives in this OCI registry repository,
    /// one tagged artifact per key, instead of on a git branch; `branch`
    /// then holds the registry's name, for messages only.
    pub registry: Option<crate::oci::Registry>,
    /// `cache.mirrors`: asked for blobs before the registry, after this
    /// machine's own (`crate::oci::mirror`); empty for a git cache.
    pub mirrors: Vec<crate::oci::mirror::Spec>,
    pub description: String,
    pub pins: Vec<Pin>,
    pub pack_root: PathBuf,
    pub include: Vec<Glob>,
    pub exclude: Vec<Glob>,
    pub keep_mtime: bool,
    /// Paths (globs relative to the pack root) whose symlink may have an
    /// absolute target without `..`, at pack time and at every restore.
    pub absolute_symlinks: Vec<crate::glob::Pattern>,
    pub restore_path: PathBuf,
    pub mode: Mode,
    pub ready: Ready,
    pub gates: Vec<String>,
    pub chunk_bytes: u64,
    /// Content-defined chunk sizes (of uncompressed tar) within `chunk_bytes`.
    pub chunk_sizes: Sizes,
    pub level: i32,
    /// `[publish] lease_deadline`: how long a publish retries a lost lease
    /// (`None`: the default, see `publish::lease_deadline`).
    pub lease_deadline: Option<std::time::Duration>,
    /// The `[network]` table: connect and stall deadlines, if set.
    pub network: crate::net::ManifestNetwork,
    /// `[publish] keep = N`: after each publish that pushes, keep per
    /// platform value the key today's pins give plus the N newest.
    pub keep: Option<usize>,
    /// `[publish] push_limit`: new blobs over it are pushed in batches
    /// (`None`: the default, see `cache::publish::push::limit`).
    pub push_limit: Option<u64>,
    /// `[[restore.fallback]]`, in order, and `restore.recheck` (set exactly
    /// when there are fallbacks).
    pub fallbacks: Vec<Fallback>,
    pub recheck: Option<std::time::Duration>,
    /// `[restore] legacy_versions`: a pinned value and the version a legacy
    /// archive may be named for instead (`key::legacy_mismatch`).
    pub legacy_versions: std::collections::BTreeMap<String, String>,
    /// `[trust]`: this cache's policy override, principals and ungated opt-in.
    pub trust: super::trust::CacheTrust,
    /// `[bootstrap]`: this is the binary cache the bootstrap script reads.
    pub bootstrap: Option<crate::cache::format::bootstrap::Bootstrap>,
    /// `[build]`: how `cache build` (and a restore, on a miss) makes it.
    pub build: Option<crate::cache::format::build::Build>,
}

/// The path of manifest `name` in `repo`.
pub fn path_of(repo: &Repo, name: &str) -> PathBuf {
    repo.manifests_dir().join(format!("{name}.toml"))
}

/// Parses and validates the text of manifest `name` (read from `file`,
/// which errors name); paths are expanded against `repo`.
pub fn parse(repo: &Repo, name: &str, file: &Path, text: &str) -> Result<CacheManifest> {
    let raw: RawManifest = toml::from_str(text)
        .map_err(|e| anyhow!("{}", crate::settings::toml_error_line(text, &e)))?;
    let bootstrap = resolve_bootstrap(raw.bootstrap, &raw.key, text, &raw.restore.path)?;
    let pins = resolve_pins(repo, raw.key)?;
    let build = raw
        .build
        .map(|b| crate::cache::format::build::resolve(b, &pin_reads(&pins), &repo.root))
        .transpose()?;
    let restore_path = expand_path(repo, &raw.restore.path)?;
    let (fallbacks, recheck) =
        resolve_fallbacks(raw.restore.fallback, raw.restore.recheck.as_ref(), &pins)?;
    let ready = resolve_ready(raw.ready)?;
    let (chunk_bytes, chunk_sizes) = chunking(&raw.publish)?;
    let level = level_of(raw.publish.level.as_ref())?;
    let lease_deadline = raw
        .publish
        .lease_deadline
        .as_ref()
        .map(|d| d.resolve_positive("publish.lease_deadline"))
        .transpose()?;
    let c = &raw.cache;
    let set = [
        (c.branch.is_some(), "branch"),
        (c.full_ref.is_some(), "ref"),
        (c.remote.is_some(), "remote"),
    ];
    let registry = place::registry_of(c.registry.as_deref(), set, !fallbacks.is_empty())?;
    let mirrors = place::mirrors_of(c.mirrors.as_deref(), registry.as_ref())?;
    let branch = match &registry {
        Some(r) => r.to_string(),
        None => place::cache_ref(name, raw.cache.branch, raw.cache.full_ref)?,
    };
    let pack_root = expand_path(repo, &raw.pack.root)?;
    if let Some(b) = &build {
        let picks = !raw.pack.include.is_empty() || !raw.pack.exclude.is_empty();
        super::build_fits::check(
            repo,
            b,
            picks,
            raw.restore.mode == Mode::Replace,
            &pack_root,
        )?;
    }
    let include = if raw.pack.include.is_empty() {
        vec![Glob::new("**")?]
    } else {
        globs(&raw.pack.include)?
    };
    Ok(CacheManifest {
        name: name.to_string(),
        file: file.to_path_buf(),
        branch,
        remote: raw.cache.remote.unwrap_or_else(|| "origin".into()),
        registry,
        mirrors,
        description: raw.cache.description.unwrap_or_default(),
        pins,
        pack_root,
        include,
        exclude: globs(&raw.pack.exclude)?,
        keep_mtime: raw.pack.keep_mtime,
        absolute_symlinks: globs(&raw.pack.absolute_symlinks)?
            .iter()
            .map(|g| g.pattern().clone())
            .collect(),
        restore_path,
        mode: raw.restore.mode,
        ready,
        gates: raw.publish.gates,
        chunk_bytes,
        chunk_sizes,
        level,
        lease_deadline,
        network: raw.network.resolve()?,
        keep: raw.publish.keep.map(|n| n as usize),
        push_limit: raw
            .publish
            .push_limit
            .as_ref()
            .map(|s| s.resolve("publish.push_limit"))
            .transpose()?,
        fallbacks,
        recheck,
        legacy_versions: raw.restore.legacy_versions,
        trust: raw.trust,
        bootstrap,
        build,
    })
}

/// What `pins` read, for `[build] inputs`' check.
fn pin_reads(pins: &[Pin]) -> crate::cache::format::build::PinReads<'_> {
    let mut reads = crate::cache::format::build::PinReads::default();
    for p in pins {
        match &p.source {
            PinSource::GitTree(paths) => reads.trees.extend(paths.iter().map(String::as_str)),
            PinSource::File(f)
            | PinSource::Json { file: f, .. }
            | PinSource::Regex { file: f, .. } => reads.files.push(f),
            PinSource::Literal(_) | PinSource::Platform => {}
        }
    }
    reads
}

/// `[bootstrap]`, checked against what the bootstrap script can read.
fn resolve_bootstrap(
    raw: Option<crate::cache::format::bootstrap::RawBootstrap>,
    pins: &[RawPin],
    text: &str,
    restore_path: &str,
) -> Result<Option<crate::cache::format::bootstrap::Bootstrap>> {
    let Some(b) = raw else { return Ok(None) };
    let kinds: Vec<&str> = pins.iter().map(RawPin::kind).collect();
    crate::cache::format::bootstrap::resolve(b, text, &kinds, restore_path).map(Some)
}

/// The `[[key]]` pins, each checked, no name twice.
fn resolve_pins(repo: &Repo, raw: Vec<RawPin>) -> Result<Vec<Pin>> {
    let mut pins = Vec::new();
    for p in raw {
        pins.push(resolve_pin(repo, p)?);
    }
    let mut seen = std::collections::BTreeSet::new();
    for p in &pins {
        if !seen.insert(p.name.as_str()) {
            bail!("key pin {:?} is declared twice", p.name);
        }
    }
    Ok(pins)
}

/// The `[ready]` probe: a path under the restore path, or a command.
fn resolve_ready(raw: Option<RawReady>) -> Result<Ready> {
    Ok(match raw {
        None => Ready::Exists,
        Some(RawReady {
            path: Some(p),
            command: None,
            matches: None,
        }) => {
            let p = PathBuf::from(p);
            if p.is_absolute() || p.components().any(|c| c.as_os_str() == "..") {
                bail!("ready.path must be relative to the restore path and stay inside it");
            }
            Ready::Path(p)
        }
        Some(RawReady {
            path: None,
            command: Some(argv),
            matches,
        }) => {
            if argv.is_empty() {
                bail!("ready.command is empty");
            }
            let matches = matches
                .map(|m| regex_lite::Regex::new(&m).map_err(|e| anyhow!("ready.matches: {e}")))
                .transpose()?;
            Ready::Command { argv, matches }
        }
        Some(_) => bail!("[ready] takes either `path`, or `command` with an optional `matches`"),
    })
}

/// `[publish] chunk_bytes` (the limit of a compressed chunk file) and the
/// content-defined sizes `chunk_avg` gives within it.
fn chunking(raw: &RawPublish) -> Result<(u64, Sizes)> {
    let chunk_bytes = match &raw.chunk_bytes {
        Some(spec) => spec.resolve("publish.chunk_bytes")?,
        None => DEFAULT_CHUNK_BYTES,
    };
    if chunk_bytes == 0 || chunk_bytes > MAX_CHUNK_BYTES {
        bail!(
            "publish.chunk_bytes must be between 1 and {MAX_CHUNK_BYTES} (GitHub rejects files of 100 MiB)"
        );
    }
    let chunk_avg = match &raw.chunk_avg {
        Some(spec) => Some(spec.resolve("publish.chunk_avg")?),
        None => None,
    };
    Ok((chunk_bytes, Sizes::for_limit(chunk_avg, chunk_bytes)?))
}

/// Globs compiled, in order.
fn globs(raw: &[String]) -> Result<Vec<Glob>> {
    raw.iter().map(|g| Glob::new(g)).collect()
}

/// `[[restore.fallback]]` and `restore.recheck`, checked against the pins.
fn resolve_fallbacks(
    raw: Vec<RawFallback>,
    recheck: Option<&crate::clock::DurationSpec>,
    pins: &[Pin],
) -> Result<(Vec<Fallback>, Option<std::time::Duration>)> {
    let mut out = Vec::new();
    for (i, f) in raw.into_iter().enumerate() {
        let n = i + 1;
        out.push(match (f.drop, f.prefix) {
            (Some(parts), None) => {
                if parts.is_empty() {
                    bail!("restore.fallback {n}: `drop` lists no key parts");
                }
                for p in &parts {
                    if !pins.iter().any(|pin| &pin.name == p) {
                        let names: Vec<&str> = pins.iter().map(|p| p.name.as_str()).collect();
                        bail!(
                            "restore.fallback {n}: `drop` names {p:?}, which is not a key pin (pins: {})",
                            names.join(", ")
                        );
                    }
                }
                Fallback::Drop(parts)
            }
            (None, Some(prefix)) if !prefix.is_empty() => Fallback::Prefix(prefix),
            (None, Some(_)) => bail!("restore.fallback {n}: `prefix` is empty"),
            _ => bail!(
                "restore.fallback {n} takes exactly one of `drop = [key parts]` or `prefix = \"...\"`"
            ),
        });
    }
    let recheck = recheck
        .map(|d| d.resolve_positive("restore.recheck"))
        .transpose()?;
    match (out.is_empty(), recheck) {
        (false, None) => bail!(
            "restore.fallback needs restore.recheck (e.g. \"1h\"): how long a stand-in key stays warm before the exact key is looked for again"
        ),
        (true, Some(_)) => bail!("restore.recheck is set but there is no restore.fallback"),
        _ => Ok((out, recheck)),
    }
}

impl RawPin {
    /// The field that gives this pin its value (the first one set).
    fn kind(&self) -> &'static str {
        if self.literal.is_some() {
            "literal"
        } else if self.platform {
            "platform"
        } else if self.json.is_some() {
            "json"
        } else if self.regex.is_some() {
            "regex"
        } else if self.git_tree.is_some() {
            "git_tree"
        } else {
            "file"
        }
    }
}

fn resolve_pin(repo: &Repo, p: RawPin) -> Result<Pin> {
    let kinds = usize::from(p.literal.is_some())
        + usize::from(p.platform)
        + usize::from(p.json.is_some())
        + usize::from(p.regex.is_some())
        + usize::from(p.git_tree.is_some())
        + usize::from(p.file.is_some());
    if kinds != 1 {
        bail!(
            "key pin {:?} must have exactly one of `literal`, `platform = true`, `json`, `regex`, `git_tree`, `file`",
            p.name
        );
    }
    let source = if let Some(l) = p.literal {
        PinSource::Literal(l)
    } else if p.platform {
        PinSource::Platform
    } else if let Some(j) = p.json {
        if !(j.pointer.is_empty() || j.pointer.starts_with('/')) {
            bail!("key pin {:?}: a JSON pointer starts with '/'", p.name);
        }
        PinSource::Json {
            file: expand_path(repo, &j.file)?,
            pointer: j.pointer,
        }
    } else if let Some(r) = p.regex {
        let pattern =
            regex_lite::Regex::new(&r.pattern).map_err(|e| anyhow!("key pin {:?}: {e}", p.name))?;
        if pattern.captures_len() < 2 {
            bail!(
                "key pin {:?}: the regex needs a capture group for the value",
                p.name
            );
        }
        PinSource::Regex {
            file: expand_path(repo, &r.file)?,
            pattern,
        }
    } else if let Some(f) = p.file {
        PinSource::File(expand_path(repo, &f)?)
    } else {
        let paths = p.git_tree.unwrap_or_default();
        if paths.is_empty() {
            bail!("key pin {:?}: git_tree lists no paths", p.name);
        }
        PinSource::GitTree(paths)
    };
    Ok(Pin {
        name: p.name,
        source,
    })
}

/// Expands `~` and `$VAR` / `${VAR}`; a relative result is taken from the
/// repository root. An unset variable is an error, not an empty string,
/// except `CARGO_TARGET_DIR`, which then is cargo's default `target`.
pub fn expand_path(repo: &Repo, raw: &str) -> Result<PathBuf> {
    let expanded = expand_vars(raw)?;
    let path = if expanded == "~" {
        home()?
    } else if let Some(rest) = expanded.strip_prefix("~/") {
        home()?.join(rest)
    } else {
        PathBuf::from(expanded)
    };
    Ok(if path.is_absolute() {
        path
    } else {
        repo.root.join(path)
    })
}

fn home() -> Result<PathBuf> {
    std::env::var_os("HOME")
        .map(PathBuf::from)
        .context("HOME is not set, so `~` cannot be expanded")
}

fn expand_vars(raw: &str) -> Result<String> {
    let mut out = String::new();
    let mut rest = raw;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let (name, tail) = if let Some(inner) = after.strip_prefix('{') {
            let end = inner
                .find('}')
                .ok_or_else(|| anyhow!("unclosed ${{ in {raw:?}"))?;
            (&inner[..end], &inner[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        if name.is_empty() {
            bail!("a lone '$' in {raw:?}");
        }
        let value = match std::env::var(name) {
            Ok(value) => value,
            // Unset, it is cargo's default (`target`, from the repository
            // root), so `$CARGO_TARGET_DIR/release` names the build output
            // either way; tools/bootstrap.sh resolves it alike.
            Err(_) if name == "CARGO_TARGET_DIR" => "target".to_string(),
            Err(_) => bail!("${name} in {raw:?} is not set"),
        };
        out.push_str(&value);
        rest = tail;
    }
    out.push_str(rest);
    Ok(out)
}

/// A `git_tree` pin's value from the output of `git rev-parse HEAD:<path>...`
/// (one tree id a line): the first 16 hex digits of sha256 over those lines,
/// each with its newline. tools/warmstart-bootstrap.sh computes the same with
/// git and coreutils: `git rev-parse HEAD:a HEAD:b | sha256sum | cut -c1-16`.
pub fn tree_digest(rev_parse_out: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut text = rev_parse_out.to_string();
    text.push('\n');
    let digest = Sha256::digest(text.as_bytes());
    hex::encode(&digest)[..16].to_string()
}

/// A path glob in the dialect of `crate::glob` (checked there): `*` and `?`
/// stay within one path component, `**` spans any number of them. Matched
/// against `/`-separated paths relative to the pack root.
#[derive(Clone, Debug)]
pub struct Glob {
    pub text: String,
    pattern: crate::glob::Pattern,
}

impl Glob {
    pub fn new(glob: &str) -> Result<Glob> {
        let pattern = crate::glob::Pattern::new(glob).map_err(|e| anyhow!("{e}"))?;
        Ok(Glob {
            text: glob.to_string(),
            pattern,
        })
    }

    pub fn matches(&self, rel: &str) -> bool {
        self.pattern.matches(rel)
    }

    /// The ground-floor matcher, for the extractor and the merge.
    pub fn pattern(&self) -> &crate::glob::Pattern {
        &self.pattern
    }
}

impl CacheManifest {
    /// Whether `rel` (a `/`-separated path under the pack root) is packed:
    /// it, or a directory above it, matches an include, and nothing excludes it.
    pub fn selects(&self, rel: &str) -> bool {
        let mut prefixes = rel
            .match_indices('/')
            .map(|(i, _)| &rel[..i])
            .chain(std::iter::once(rel));
        let included = prefixes.any(|p| self.include.iter().any(|g| g.matches(p)));
        included && !self.exclude.iter().any(|g| g.matches(rel))
    }
}

/// `RawManifest`'s `Deserialize`, for the field reference made from it
/// (`docs/reference/manifests.md`, tests/it/docs.rs); nothing else calls it.
#[doc(hidden)]
pub fn describe<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<(), D::Error> {
    RawManifest::deserialize(d).map(|_| ())
}

#[cfg(test)]
mod tests;
