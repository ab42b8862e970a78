//! A cache key as an OCI artifact (docs/format.md, "In an OCI registry"):
//! one manifest per key, tagged with the key, whose config is that key's
//! `warmstart.json` and whose layers are the key's chunk frames, its files
//! index, and its signed statement and signature, each layer titled with
//! the file name it has on a cache branch.
//!
//! Pure: builds the manifest's bytes, parses one back, and cross-checks
//! its layers against the `warmstart.json` entry exactly as `SHA256SUMS`
//! is checked on a branch (every file listed once, with the digest and
//! size the entry gives it, nothing else). It never reads a file or the
//! network.

use anyhow::{Result, bail};
use serde_json::{Value, json};

use super::KeyEntry;

/// The artifact type of a cache key (OCI 1.1 `artifactType`).
pub const ARTIFACT_TYPE: &str = "application/vnd.warmstart.cache.v1";
/// The config: the key's `warmstart.json` (format 1, this key alone).
pub const CONFIG_TYPE: &str = "application/vnd.warmstart.cache.config.v1+json";
/// A chunk: one zstd frame of the key's tar.
pub const CHUNK_TYPE: &str = "application/vnd.warmstart.chunk.v1+zstd";
/// The per-file index (`<key>.files.zst`) or one of its parts.
pub const INDEX_TYPE: &str = "application/vnd.warmstart.files.v1+zstd";
/// The signed statement (`<key>.statement`) and its SSH signature.
pub const STATEMENT_TYPE: &str = "application/vnd.warmstart.statement.v1";
pub const SIG_TYPE: &str = "application/vnd.warmstart.statement.sig.v1";
/// The annotation that names a layer's file (what `oras pull` writes).
pub const TITLE: &str = "org.opencontainers.image.title";

/// One blob of the artifact: the config or a layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blob {
    pub media_type: String,
    /// The sha256, in lowercase hex (the descriptor says `sha256:<hex>`).
    pub sha256: String,
    pub size: u64,
    /// The file name on a cache branch (none for the config).
    pub title: Option<String>,
}

/// A parsed artifact manifest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Artifact {
    pub config: Blob,
    pub layers: Vec<Blob>,
    /// `org.opencontainers.image.created`-like annotations are not read:
    /// only the key, from the manifest's annotations, for messages.
    pub key: Option<String>,
}

fn descriptor(b: &Blob) -> Value {
    let mut d = json!({
        "mediaType": b.media_type,
        "digest": format!("sha256:{}", b.sha256),
        "size": b.size,
    });
    if let Some(t) = &b.title {
        d["annotations"] = json!({ TITLE: t });
    }
    d
}

/// The manifest's bytes: compact JSON in a fixed field order, so that
/// the same key published twice is the same manifest digest.
pub fn render(key: &str, config: &Blob, layers: &[Blob]) -> Vec<u8> {
    let v = json!({
        "schemaVersion": 2,
        "mediaType": crate::oci::MANIFEST_TYPE,
        "artifactType": ARTIFACT_TYPE,
        "config": descriptor(config),
        "layers": layers.iter().map(descriptor).collect::<Vec<_>>(),
        "annotations": { "dev.warmstart.key": key },
    });
    serde_json::to_vec(&v).expect("a manifest serializes")
}

fn digest_of(d: &Value, what: &str) -> Result<(String, u64)> {
    let Some(digest) = d["digest"].as_str() else {
        bail!("{what} has no digest");
    };
    let Some(hex) = digest.strip_prefix("sha256:") else {
        bail!("{what} has digest {digest:?}, not a sha256");
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        bail!("{what} has digest {digest:?}, not 64 lowercase hex digits");
    }
    let Some(size) = d["size"].as_u64() else {
        bail!("{what} has no size");
    };
    Ok((hex.to_string(), size))
}

/// Parses an artifact manifest, refusing one that is not a warmstart key.
pub fn parse(bytes: &[u8]) -> Result<Artifact> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| anyhow::anyhow!("the manifest is not JSON: {e}"))?;
    if v["schemaVersion"].as_u64() != Some(2) {
        bail!("the manifest is not an OCI manifest (schemaVersion is not 2)");
    }
    if let Some(t) = v["mediaType"].as_str()
        && t != crate::oci::MANIFEST_TYPE
    {
        bail!("the manifest has media type {t:?}, not an OCI image manifest");
    }
    let config = &v["config"];
    if config["mediaType"].as_str() != Some(CONFIG_TYPE) {
        bail!(
            "the manifest's config is {:?}, not a warmstart cache key ({CONFIG_TYPE}): the tag holds something else",
            config["mediaType"].as_str().unwrap_or("missing")
        );
    }
    let (sha256, size) = digest_of(config, "the config")?;
    let config = Blob {
        media_type: CONFIG_TYPE.to_string(),
        sha256,
        size,
        title: None,
    };
    let Some(raw_layers) = v["layers"].as_array() else {
        bail!("the manifest has no layers");
    };
    let mut layers = Vec::new();
    for (i, d) in raw_layers.iter().enumerate() {
        let what = format!("layer {i}");
        let (sha256, size) = digest_of(d, &what)?;
        let Some(media_type) = d["mediaType"].as_str() else {
            bail!("{what} has no media type");
        };
        let Some(title) = d["annotations"][TITLE].as_str() else {
            bail!("{what} has no {TITLE}");
        };
        super::check_file_name(title)?;
        layers.push(Blob {
            media_type: media_type.to_string(),
            sha256,
            size,
            title: Some(title.to_string()),
        });
    }
    Ok(Artifact {
        config,
        layers,
        key: v["annotations"]["dev.warmstart.key"]
            .as_str()
            .map(str::to_string),
    })
}

/// The layers a key's entry names, in order: its chunks, then its index
/// files (the statement and signature come after, from their bytes).
pub fn entry_layers(entry: &KeyEntry) -> Vec<Blob> {
    let chunks = entry.chunks.iter().map(|c| Blob {
        media_type: CHUNK_TYPE.to_string(),
        sha256: c.sha256.to_ascii_lowercase(),
        size: c.size,
        title: Some(c.file.clone()),
    });
    let index = entry.index_files().map(|i| Blob {
        media_type: INDEX_TYPE.to_string(),
        sha256: i.sha256.to_ascii_lowercase(),
        size: i.size,
        title: Some(i.file.clone()),
    });
    chunks.chain(index).collect()
}

/// What an artifact's layers are besides the entry's own: its statement
/// and signature layers, if it has them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extra {
    pub statement: Option<Blob>,
    pub sig: Option<Blob>,
}

/// The layers must be exactly the entry's chunks and index files (same
/// titles, digests, sizes and media types, in that order), then at most
/// the key's statement and its signature, by their names (`names`, from
/// `trust::statement`, which this layer cannot name): what
/// `check_sums_agree` is to a branch.
pub fn check_layers(
    key: &str,
    entry: &KeyEntry,
    artifact: &Artifact,
    names: (&str, &str),
) -> Result<Extra> {
    let want = entry_layers(entry);
    let mut extra = Extra::default();
    for (i, got) in artifact.layers.iter().enumerate() {
        let title = got.title.as_deref().unwrap_or("");
        if let Some(w) = want.get(i) {
            if got != w {
                bail!(
                    "layer {i} is {title} (sha256 {}, {} bytes, {}) but warmstart.json says {} (sha256 {}, {} bytes, {})",
                    got.sha256,
                    got.size,
                    got.media_type,
                    w.title.as_deref().unwrap_or(""),
                    w.sha256,
                    w.size,
                    w.media_type
                );
            }
            continue;
        }
        let slot = if title == names.0 && got.media_type == STATEMENT_TYPE {
            &mut extra.statement
        } else if title == names.1 && got.media_type == SIG_TYPE {
            &mut extra.sig
        } else {
            bail!(
                "layer {i} ({title}, {}) is not a file of key {key}",
                got.media_type
            );
        };
        if slot.replace(got.clone()).is_some() {
            bail!("layer {i} ({title}) is there twice");
        }
    }
    if artifact.layers.len() < want.len() {
        bail!(
            "the manifest lacks {}, which warmstart.json lists",
            want[artifact.layers.len()].title.as_deref().unwrap_or("")
        );
    }
    Ok(extra)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::format::{Chunk, IndexFile};

    const NAMES: (&str, &str) = ("k.statement", "k.statement.sig");

    fn entry() -> KeyEntry {
        let chunk = |n: usize, c: char| Chunk {
            file: format!("k.tar.zst.part00{n}"),
            size: 10 + n as u64,
            sha256: c.to_string().repeat(64),
            raw_size: None,
            raw_sha256: None,
        };
        KeyEntry {
            archive: "k.tar.zst".into(),
            compression: "zstd".into(),
            chunks: vec![chunk(0, 'a'), chunk(1, 'b')],
            tar_sha256: "c".repeat(64),
            tar_size: 10240,
            files: 2,
            key_parts: vec![],
            source_commit: None,
            source_tree: None,
            gates: serde_json::Value::Null,
            ungated: false,
            created_at: "2026-12-07T00:00:00Z".into(),
            tool_version: "warmstart 0.1.0".into(),
            frames: None,
            index: Some(IndexFile {
                file: "k.files.zst".into(),
                size: 7,
                sha256: "d".repeat(64),
            }),
            index_parts: Vec::new(),
        }
    }

    fn config() -> Blob {
        Blob {
            media_type: CONFIG_TYPE.into(),
            sha256: "e".repeat(64),
            size: 99,
            title: None,
        }
    }

    fn statement() -> Blob {
        Blob {
            media_type: STATEMENT_TYPE.into(),
            sha256: "f".repeat(64),
            size: 5,
            title: Some("k.statement".into()),
        }
    }

    #[test]
    fn a_rendered_manifest_parses_back_and_agrees_with_its_entry() {
        let e = entry();
        let mut layers = entry_layers(&e);
        layers.push(statement());
        let bytes = render("k", &config(), &layers);
        let a = parse(&bytes).unwrap();
        assert_eq!(a.config, config());
        assert_eq!(a.layers, layers);
        assert_eq!(a.key.as_deref(), Some("k"));
        let extra = check_layers("k", &e, &a, NAMES).unwrap();
        assert_eq!(extra.statement, Some(statement()));
        assert_eq!(extra.sig, None);
        // The same inputs, the same bytes (so the same manifest digest).
        assert_eq!(render("k", &config(), &layers), bytes);
    }

    #[test]
    fn layers_that_disagree_with_the_entry_are_refused() {
        let e = entry();
        let layers = entry_layers(&e);
        let check = |layers: &[Blob]| {
            let a = parse(&render("k", &config(), layers)).unwrap();
            check_layers("k", &e, &a, NAMES)
                .map(|_| ())
                .unwrap_err()
                .to_string()
        };
        let mut l = layers.clone();
        l[1].sha256 = "0".repeat(64);
        assert!(check(&l).contains("layer 1"), "{}", check(&l));
        let mut l = layers.clone();
        l[0].size += 1;
        assert!(check(&l).contains("layer 0"));
        let l = layers[..2].to_vec();
        assert!(check(&l).contains("lacks k.files.zst"), "{}", check(&l));
        let mut l = layers.clone();
        l.swap(0, 1);
        assert!(check(&l).contains("layer 0"));
        let mut l = layers.clone();
        l.push(Blob {
            title: Some("other".into()),
            ..statement()
        });
        assert!(check(&l).contains("not a file of key k"), "{}", check(&l));
        let mut l = layers.clone();
        l.push(statement());
        l.push(statement());
        assert!(check(&l).contains("twice"));
    }

    #[test]
    fn foreign_manifests_are_refused() {
        let ok = String::from_utf8(render("k", &config(), &entry_layers(&entry()))).unwrap();
        for (from, to) in [
            (CONFIG_TYPE, "application/vnd.oci.image.config.v1+json"),
            ("\"schemaVersion\":2", "\"schemaVersion\":1"),
            ("sha256:eeee", "sha512:eeee"),
            ("\"size\":99", "\"size\":-1"),
            ("k.tar.zst.part000", "../x"),
        ] {
            let bad = ok.replacen(from, to, 1);
            assert_ne!(bad, ok, "{from}");
            assert!(parse(bad.as_bytes()).is_err(), "{from} -> {to}");
        }
        assert!(parse(b"[]").is_err());
        assert!(parse(b"not json").is_err());
    }
}
