//! A key in an OCI registry, read the way a restore reads a branch: its
//! manifest and small files fetched, cross-checked, and handed on as a
//! `Branch`, so that everything after the fetch (the trust check before
//! any chunk, the plan, the chunk store, the verified stream, the delta
//! install, the stamp) is the git path's own code.
//!
//! What is fetched here: the manifest the key's tag points at, its config
//! (the key's `warmstart.json`), and the statement, signature and files
//! index layers; each blob is hashed against its descriptor's digest as
//! it arrives (`oci::Client::get_blob`), and the layers are checked against
//! `warmstart.json` as `SHA256SUMS` is on a branch
//! (`format::oci::check_layers`). The small files go into cache.git as
//! blobs, so that the trust check and the delta's index read them there;
//! no chunk is fetched here: `prefetch` fetches the missing ones into the
//! chunk store (`fetch_chunk`), after the trust verdict.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use xshell::Shell;

use crate::cache::format::manifest::{CacheManifest, Mode};
use crate::cache::format::{self, BranchManifest};
use crate::cache::restore::branch::{Branch, Content};
use crate::exit::{Code, fail};
use crate::git::{CacheGit, Remote, TreeEntry};
use crate::hex;
use crate::oci::{Client, Registry};
use crate::repo::Repo;

/// The largest config (a key's `warmstart.json`) read: thousands of chunks
/// take a few MB.
const MAX_CONFIG_BYTES: u64 = 64 << 20;

/// A scratch file for one download in cache.git (removed by its reader).
pub fn scratch(git: &CacheGit, what: &str) -> Result<PathBuf> {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = git.dir.join("oci-tmp");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(dir.join(format!("{what}-{}-{n}", std::process::id())))
}

fn corrupt(registry: &Registry, key: &str, what: impl std::fmt::Display) -> anyhow::Error {
    fail(
        Code::Verify,
        format!(
            "key {key} in registry {registry}: {what}: republish it with `{} cache publish`",
            crate::invocation::command()
        ),
    )
}

/// The remote a registry's `Branch` carries: `oci://host/repo`, which
/// `prefetch` recognises (`Registry::from_source_url`).
pub fn remote_of(registry: &Registry) -> Remote {
    let url = registry.source_url();
    Remote {
        name: url.clone(),
        url,
    }
}

/// Fetches the manifest, config and small files of `key` from `m`'s
/// registry into cache.git, and reads them as a one-key `Branch`.
pub fn fetch(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    registry: &Registry,
    key: &str,
    progress: bool,
) -> Result<(CacheGit, Branch)> {
    let mut git = CacheGit::open(sh, repo)?;
    git.set_network(&m.network)?;
    // Blobs are asked of the mirrors first; the tag only of the origin.
    let client = Client::new(registry.clone(), git.network())?.with_mirrors(&m.mirrors)?;
    let tag = crate::oci::tag_of(key)?;
    let spin = if progress {
        crate::progress::spinner(format!("fetching key {key} from {registry}"))
    } else {
        crate::progress::hidden()
    };
    let r = read_key(&git, &client, m, key, tag);
    spin.finish_and_clear();
    Ok((git, r?))
}

fn read_key(
    git: &CacheGit,
    client: &Client,
    m: &CacheManifest,
    key: &str,
    tag: &str,
) -> Result<Branch> {
    let registry = &client.registry;
    let Some((bytes, digest)) = client.get_manifest(tag, &scratch(git, "manifest")?)? else {
        return Err(fail(
            Code::NotFound,
            format!(
                "registry {registry} has no key {key} (no tag {tag}): publish it with `{} cache publish {}`, or see which pin differs with `{} cache status`",
                crate::invocation::command(),
                m.name,
                crate::invocation::command(),
            ),
        ));
    };
    let artifact =
        format::oci::parse(&bytes).map_err(|e| corrupt(registry, key, format!("{e:#}")))?;
    if artifact.config.size > MAX_CONFIG_BYTES {
        return Err(corrupt(
            registry,
            key,
            format!("its config is {} bytes", artifact.config.size),
        ));
    }
    let config = client.get_small_blob(
        &artifact.config.sha256,
        artifact.config.size,
        &scratch(git, "config")?,
    )?;
    let text = String::from_utf8(config.clone())
        .map_err(|_| corrupt(registry, key, "its warmstart.json is not UTF-8"))?;
    let bm = BranchManifest::parse(&text).map_err(|e| corrupt(registry, key, format!("{e:#}")))?;
    let names: Vec<String> = bm.keys.keys().cloned().collect();
    let Some(entry) = bm.keys.get(key).filter(|_| names.len() == 1).cloned() else {
        return Err(corrupt(
            registry,
            key,
            format!("its warmstart.json holds keys {names:?}, not exactly {key}"),
        ));
    };
    let names = (
        crate::trust::statement::file_name(key),
        crate::trust::statement::sig_name(key),
    );
    let extra = format::oci::check_layers(key, &entry, &artifact, (&names.0, &names.1))
        .map_err(|e| corrupt(registry, key, format!("{e:#}")))?;

    let blob = |name: &str, oid: String, size: u64| TreeEntry {
        mode: "100644".into(),
        kind: "blob".into(),
        oid,
        size: Some(size),
        name: name.to_string(),
    };
    let mut fresh = std::collections::HashSet::new();
    let mut entries = Vec::new();
    let oid = git.write_blob_bytes(&config)?;
    entries.push(blob("warmstart.json", oid, config.len() as u64));
    // The small files: what the trust check and a delta's index read
    // from cache.git. The index only where a delta can use it.
    let index = entry
        .index_files()
        .map(|i| (i.file.as_str(), &i.sha256, i.size));
    let signed = [&extra.statement, &extra.sig]
        .into_iter()
        .flatten()
        .map(|b| (b.title.as_deref().unwrap_or(""), &b.sha256, b.size));
    let small: Vec<(&str, &String, u64)> = match m.mode {
        Mode::Replace => signed.chain(index).collect(),
        _ => signed.collect(),
    };
    for (name, sha256, size) in small {
        if name.ends_with(".statement") && size > crate::trust::MAX_STATEMENT_BYTES {
            return Err(corrupt(registry, key, format!("{name} is {size} bytes")));
        }
        let bytes =
            client.get_small_blob(&sha256.to_ascii_lowercase(), size, &scratch(git, "layer")?)?;
        let oid = git.write_blob_bytes(&bytes)?;
        fresh.insert(oid.clone());
        entries.push(blob(name, oid, size));
    }
    // The chunks are not here: `prefetch` finds them in the chunk store or
    // fetches them from the registry. Their ids only have to name no
    // object of cache.git (a chunk is found by its sha256).
    for c in &entry.chunks {
        entries.push(blob(&c.file, absent_oid(&c.sha256), c.size));
    }
    Ok(Branch {
        name: m.branch.clone(),
        remote: remote_of(registry),
        commit: digest,
        entries,
        content: Content::V1(bm),
        manifest_sha256: hex::encode(&Sha256::digest(&config)),
        fresh,
        registry: Some(client.clone()),
    })
}

/// The id a chunk of a registry key has in its `Branch`: `oci-` and its
/// sha256, which no git object id can be, so that cache.git and the user's
/// repository never answer for it and the chunk store (by sha256) or the
/// registry does.
pub fn absent_oid(sha256: &str) -> String {
    format!("oci-{}", sha256.to_ascii_lowercase())
}

/// Fetches chunk `sha256` of `size` bytes from `registry` into the chunk
/// store at `dest` (through a partial file beside it, hashed as it
/// arrives): the fetch `prefetch` runs for a registry's chunks, telling
/// `track` curl's process group while it runs.
pub fn fetch_chunk(
    client: &Client,
    sha256: &[u8; 32],
    size: u64,
    (tmp, dest): (&Path, &Path),
    track: &mut dyn FnMut(Option<u32>),
) -> Result<()> {
    client.get_blob_tracked(&hex::encode(sha256), size, tmp, track)?;
    std::fs::rename(tmp, dest).with_context(|| format!("storing {}", dest.display()))
}
