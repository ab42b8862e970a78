//! `cache publish` of a cache that lives in an OCI registry
//! (`[cache] registry`): the same walk, gates, pack and signature as a
//! branch publish, then the key's artifact (docs/format.md, "In an OCI
//! registry") uploaded blob by blob and tagged.
//!
//! Upload order is what makes a key safe to read at any moment: every
//! blob first (each asked for with a HEAD, and sent only when the registry
//! lacks it), the manifest that tags the key last. A publish cut anywhere
//! before the tag leaves only unreferenced blobs, which the next publish
//! finds and does not send again. An artifact with the same bytes as the
//! tagged one (same tar, same chunks) is not re-signed or re-tagged: an
//! unchanged input pushes nothing.
//!
//! Never: tag before every blob is in the registry, send a blob the
//! registry has, or touch another key's tag.

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::path::Path;
use std::time::Instant;
use xshell::Shell;

use super::{
    Reporter, Request, Summary, gate_record, ms, print_plan, pushed, rev_parse, same_artifact, walk,
};
use crate::cache::fetch::oci::{remote_of, scratch};
use crate::cache::format::manifest::{CacheManifest, Key};
use crate::cache::format::oci::{self as layout, Blob};
use crate::cache::format::{BranchManifest, KeyEntry};
use crate::cache::human_bytes;
use crate::cache::publish::blobs::{Prior, pack_into_git};
use crate::clock;
use crate::exit::{Code, fail};
use crate::git::CacheGit;
use crate::hex;
use crate::oci::{Client, Present, Registry};
use crate::repo::Repo;

/// What the upload did, for the summary and the report line.
#[derive(Default)]
struct Sent {
    blobs: usize,
    bytes: u64,
    present: usize,
}

/// Publishes `m`'s key to `registry` (after `key_only`, which the caller
/// handled).
#[allow(clippy::too_many_arguments)]
pub(super) fn publish(
    sh: &Shell,
    repo: &Repo,
    req: &Request,
    m: &CacheManifest,
    registry: &Registry,
    key: &Key,
    mut summary: Summary,
    out: &Reporter,
    started: Instant,
) -> Result<Summary> {
    if req.remote.is_some() {
        return Err(fail(
            Code::Usage,
            format!(
                "--remote names a git remote, and cache {} lives in registry {registry}",
                m.name
            ),
        ));
    }
    let tag = crate::oci::tag_of(&key.value)?;
    let shown = remote_of(registry);
    summary.remote = Some(super::RemoteJson::of(&shown));
    let (plan, planned_at_ns) = walk(m, &mut summary)?;
    if req.dry_run {
        summary.status = "dry-run";
        print_plan(out, m, key, &plan, &shown);
        return Ok(summary);
    }
    // The source must be a tree others can check, as for a branch: HEAD on
    // the repository's own remote, and its gates green.
    let origin = crate::git::resolve_remote(sh, &repo.root, &m.remote)?;
    pushed::check(sh, &repo.root, &origin, req.allow_unpushed, out)?;
    let (gate_record, ungated) = gate_record(sh, repo, m, req.allow_ungated, out)?;
    summary.ungated = ungated;
    out.say(format!(
        "publishing {} (key {}) to registry {registry}",
        m.name, key.value
    ));
    let mut git = CacheGit::open(sh, repo)?;
    git.set_network(&m.network)?;
    let client = Client::new(registry.clone(), git.network())?;

    let t = Instant::now();
    let old = tagged_entry(&git, &client, &key.value, tag)?;
    summary.timings_ms.insert("fetch", ms(t.elapsed()));
    summary.previous_commit = old.as_ref().map(|(digest, _)| digest.clone());

    let (entry, packed) = pack_key(
        sh,
        repo,
        m,
        key,
        (&plan, planned_at_ns),
        &git,
        &shown,
        gate_record,
        ungated,
        &mut summary,
        out,
    )?;

    if let Some((digest, old)) = &old
        && same_artifact(old, &entry)
        && old.ungated == ungated
    {
        summary.status = "unchanged";
        summary.unchanged_by = Some("pack");
        summary.commit = Some(digest.clone());
        summary.keys_on_branch = vec![key.value.clone()];
        out.say(format!(
            "unchanged: registry {registry} already holds key {} with the same bytes (tar sha256 {}); nothing uploaded, tag kept",
            key.value,
            &entry.tar_sha256[..12]
        ));
        summary.duration_ms = Some(ms(started.elapsed()));
        return Ok(summary);
    }

    let t = Instant::now();
    let mut checker = crate::trust::Checker::new(sh, repo)?;
    let warn = |line: String| out.warn(line);
    let signed = crate::trust::sign::sign_key(
        sh,
        &mut checker,
        m,
        &key.value,
        &entry,
        req.signing_key.as_deref(),
        &warn,
    )?;
    summary.signed_by = signed.as_ref().and_then(|s| s.signer.clone());
    summary.timings_ms.insert("sign", ms(t.elapsed()));

    let t = Instant::now();
    let (digest, sent) = land(
        &git,
        &client,
        key,
        tag,
        &entry,
        signed.as_ref(),
        &packed.oids,
    )?;
    summary.timings_ms.insert("push", ms(t.elapsed()));
    summary.status = "published";
    summary.commit = Some(digest.clone());
    summary.keys_on_branch = vec![key.value.clone()];
    summary.duration_ms = Some(ms(started.elapsed()));
    out.say(format!(
        "published key {} to registry {registry} as tag {tag} (manifest sha256:{}): {} blob(s) sent ({}), {} already there",
        key.value,
        &digest[..12],
        sent.blobs,
        human_bytes(sent.bytes),
        sent.present
    ));
    Ok(summary)
}

/// Uploads the key's artifact, blobs first and the tag last: returns the
/// manifest's digest and what was sent.
fn land(
    git: &CacheGit,
    client: &Client,
    key: &Key,
    tag: &str,
    entry: &KeyEntry,
    signed: Option<&crate::trust::sign::Signed>,
    oids: &std::collections::BTreeMap<String, String>,
) -> Result<(String, Sent)> {
    let mut one = BranchManifest::new();
    one.keys.insert(key.value.clone(), entry.clone());
    let config = one.render().into_bytes();
    let config_blob = blob_of(layout::CONFIG_TYPE, &config, None);
    let mut layers = layout::entry_layers(entry);
    let mut small: Vec<(String, Vec<u8>)> = vec![(config_blob.sha256.clone(), config.clone())];
    if let Some(s) = signed {
        for (ty, name, bytes) in [
            (
                layout::STATEMENT_TYPE,
                crate::trust::statement::file_name(&key.value),
                &s.statement,
            ),
            (
                layout::SIG_TYPE,
                crate::trust::statement::sig_name(&key.value),
                &s.sig,
            ),
        ] {
            let b = blob_of(ty, bytes, Some(name));
            small.push((b.sha256.clone(), bytes.clone()));
            layers.push(b);
        }
    }
    let mut sent = Sent::default();
    for b in std::iter::once(&config_blob).chain(&layers) {
        upload(git, client, b, oids, &small, &mut sent)?;
    }
    let manifest = layout::render(&key.value, &config_blob, &layers);
    client.put_manifest(tag, &manifest, &scratch(git, "manifest")?)?;
    Ok((hex::encode(&Sha256::digest(&manifest)), sent))
}

/// Packs `plan` into chunk blobs in cache.git and makes the key's entry.
/// The frames a branch would lend are not at hand, so every chunk this
/// clone's record of its last pack does not vouch for is compressed (the
/// same bytes make the same chunks, which the registry then has).
#[allow(clippy::too_many_arguments)]
fn pack_key(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    key: &Key,
    (plan, planned_at_ns): (&super::pack::Plan, i64),
    git: &CacheGit,
    shown: &crate::git::Remote,
    gate_record: serde_json::Value,
    ungated: bool,
    summary: &mut Summary,
    out: &Reporter,
) -> Result<(KeyEntry, crate::cache::publish::blobs::PackedKey)> {
    let t = Instant::now();
    let prior = Prior {
        branch: None,
        oids: &Default::default(),
        remote: shown,
        record: &super::unchanged::path(&repo.state_dir(), &m.name),
        planned_at_ns,
    };
    let packed = pack_into_git(git, m, key, plan, prior, out)?;
    summary.timings_ms.insert("pack", ms(t.elapsed()));
    summary.fill_packed(&packed);
    out.say(format!(
        "packed {} entries: tar {} -> zstd {} in {} chunk(s), {}",
        plan.items.len(),
        human_bytes(packed.entry.tar_size),
        human_bytes(summary.compressed_size.unwrap_or(0)),
        packed.entry.chunks.len(),
        clock::human(t.elapsed())
    ));
    let mut entry = KeyEntry {
        gates: gate_record,
        ungated,
        source_commit: rev_parse(sh, &repo.root, "HEAD"),
        source_tree: rev_parse(sh, &repo.root, "HEAD^{tree}"),
        key_parts: key.parts.clone(),
        ..packed.entry.clone()
    };
    entry.created_at = clock::rfc3339(clock::now_ms());
    Ok((entry, packed))
}

fn blob_of(media_type: &str, bytes: &[u8], title: Option<String>) -> Blob {
    Blob {
        media_type: media_type.to_string(),
        sha256: hex::encode(&Sha256::digest(bytes)),
        size: bytes.len() as u64,
        title,
    }
}

/// The manifest digest and the entry of the key `tag` holds now, if it is
/// a warmstart key this registry can give whole (anything else is
/// replaced: a publish makes the tag right).
fn tagged_entry(
    git: &CacheGit,
    client: &Client,
    key: &str,
    tag: &str,
) -> Result<Option<(String, KeyEntry)>> {
    let Some((bytes, digest)) = client.get_manifest(tag, &scratch(git, "manifest")?)? else {
        return Ok(None);
    };
    let Ok(artifact) = layout::parse(&bytes) else {
        return Ok(None);
    };
    if artifact.config.size > 64 << 20 {
        return Ok(None);
    }
    let config = client.get_small_blob(
        &artifact.config.sha256,
        artifact.config.size,
        &scratch(git, "config")?,
    )?;
    let entry = std::str::from_utf8(&config)
        .ok()
        .and_then(|t| BranchManifest::parse(t).ok())
        .and_then(|mut bm| bm.keys.remove(key));
    Ok(entry.map(|e| (digest, e)))
}

/// Sends blob `b` unless the registry has it: from `small` (bytes made
/// here) or from cache.git (a chunk or index file `pack_into_git` stored,
/// by name in `oids`), through a scratch file curl reads.
fn upload(
    git: &CacheGit,
    client: &Client,
    b: &Blob,
    oids: &std::collections::BTreeMap<String, String>,
    small: &[(String, Vec<u8>)],
    sent: &mut Sent,
) -> Result<()> {
    if let Present::Yes(size) = client.blob_present(&b.sha256)?
        && size == b.size
    {
        sent.present += 1;
        return Ok(());
    }
    let tmp = scratch(git, "upload")?;
    let _guard = crate::process::signals::register_temp(&tmp);
    let r = write_blob(git, b, oids, small, &tmp).and_then(|()| client.put_blob(&b.sha256, &tmp));
    let _ = std::fs::remove_file(&tmp);
    r?;
    sent.blobs += 1;
    sent.bytes += b.size;
    Ok(())
}

fn write_blob(
    git: &CacheGit,
    b: &Blob,
    oids: &std::collections::BTreeMap<String, String>,
    small: &[(String, Vec<u8>)],
    tmp: &Path,
) -> Result<()> {
    if let Some((_, bytes)) = small.iter().find(|(s, _)| *s == b.sha256) {
        return crate::fsio::write_atomic(tmp, bytes);
    }
    let title = b.title.as_deref().unwrap_or("");
    let oid = oids
        .get(title)
        .with_context(|| format!("{title} was packed but is not in cache.git"))?;
    let mut f =
        std::fs::File::create(tmp).with_context(|| format!("creating {}", tmp.display()))?;
    std::io::copy(&mut git.read_blob(oid)?, &mut f)
        .with_context(|| format!("copying {title} out of cache.git"))?;
    Ok(())
}
