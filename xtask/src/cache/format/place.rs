//! Where a cache lives, from its manifest's `[cache]` table: a git branch
//! or full ref, or a repository in an OCI registry, and the registry's
//! mirrors. Pure: checks strings, reads nothing. Never: accept a setting of
//! one place beside the other's, or a mirror list nobody would read.

use anyhow::{Context, Result, bail};

/// `cache.registry`, checked: it excludes the git fields (`branch`, `ref`,
/// `remote`), and what a registry cache cannot do yet
/// (`[[restore.fallback]]`, which needs the registry's tag list) is refused
/// rather than ignored.
pub fn registry_of(
    registry: Option<&str>,
    git_fields: [(bool, &str); 3],
    fallbacks: bool,
) -> Result<Option<crate::oci::Registry>> {
    let Some(r) = registry else {
        return Ok(None);
    };
    for (set, field) in git_fields {
        if set {
            bail!(
                "cache.registry and cache.{field} are both set: a cache lives in a registry or on a git branch; keep one"
            );
        }
    }
    if fallbacks {
        bail!(
            "[[restore.fallback]] is not read from a registry yet (cache.registry): remove it, or keep this cache on a git branch"
        );
    }
    Ok(Some(crate::oci::Registry::parse(r)?))
}

/// `cache.mirrors`, checked: each `host[:port][/path]` as
/// `oci::mirror::Spec::parse` reads it, none twice, none the registry
/// itself; only beside `cache.registry` (a git cache's mirrors are not read
/// yet, and a list nobody reads would be a silent default).
pub fn mirrors_of(
    listed: Option<&[String]>,
    registry: Option<&crate::oci::Registry>,
) -> Result<Vec<crate::oci::mirror::Spec>> {
    let Some(listed) = listed else {
        return Ok(Vec::new());
    };
    let Some(registry) = registry else {
        bail!(
            "cache.mirrors is set without cache.registry: mirrors are read for a cache in an OCI registry only (a git branch's mirrors are not read yet); remove it"
        );
    };
    let mut out: Vec<crate::oci::mirror::Spec> = Vec::new();
    for m in listed {
        let spec = crate::oci::mirror::Spec::parse(m).context("cache.mirrors")?;
        if spec.for_origin(registry) == *registry {
            bail!("cache.mirrors names the registry itself ({m:?}): list only other registries");
        }
        if out.contains(&spec) {
            bail!("cache.mirrors names {m:?} twice: list each mirror once");
        }
        out.push(spec);
    }
    Ok(out)
}

/// Where the cache lives: `cache.branch` (default `<name>-cache`, a branch
/// as before refs existed, so that a manifest without either field keeps
/// meaning what it always meant) or `cache.ref`, a full ref.
pub fn cache_ref(name: &str, branch: Option<String>, full: Option<String>) -> Result<String> {
    let usable = |s: &str| {
        !(s.is_empty()
            || s.starts_with('-')
            || s.ends_with('/')
            || s.contains("..")
            || s.contains("//")
            || s.ends_with(".lock")
            || s.bytes().any(|b| b <= b' ' || b":~^?*[\\".contains(&b)))
    };
    match (branch, full) {
        (Some(_), Some(_)) => bail!(
            "cache.branch and cache.ref are both set: keep one (`ref = \"refs/warmstart/cache/{name}\"` keeps the cache out of plain clones)"
        ),
        (b, None) => {
            let b = b.unwrap_or_else(|| format!("{name}-cache"));
            if !usable(&b) || b.starts_with("refs/") {
                bail!(
                    "cache.branch {b:?} is not a usable branch name (for a full ref such as refs/warmstart/cache/{name}, set cache.ref instead)"
                );
            }
            Ok(b)
        }
        (None, Some(r)) => {
            let bad_place = ["refs/tags/", "refs/remotes/", "refs/warmstart/gates/"]
                .iter()
                .find(|p| r.starts_with(*p));
            if !r.starts_with("refs/") || r.matches('/').count() < 2 || !usable(&r) {
                bail!(
                    "cache.ref {r:?} is not a usable ref: give a full ref such as \"refs/warmstart/cache/{name}\""
                );
            }
            if let Some(p) = bad_place {
                bail!(
                    "cache.ref {r:?} is under {p}, which clones, fetches or gate records use: choose e.g. \"refs/warmstart/cache/{name}\""
                );
            }
            Ok(r)
        }
    }
}
