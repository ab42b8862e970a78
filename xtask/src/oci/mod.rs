//! The one door to OCI registries: the distribution API (blobs and
//! manifests of one repository in a registry), spoken through `curl`.
//!
//! Why `curl` and not an HTTP crate: the measurements (in the
//! commit that added this module) put `ureq` with rustls at about a minute of
//! extra cold build on this machine and `oci-client` (tokio, reqwest, rustls)
//! at several, against a budget of 10% (about 6 s) of warmstart's cold
//! build; `curl` costs no build time and no binary size, is what the
//! `download` step already runs, and honours the machine's CA store,
//! `CURL_CA_BUNDLE` and proxy variables as every other tool there does. It is
//! run the way `git` is run for the git backend: its own process group,
//! dying with warmstart, under the connect and stall deadlines of
//! `crate::net` (curl's `--connect-timeout`, and `--speed-limit 1
//! --speed-time <stall>`: nothing moved for the stall timeout), and its
//! failures classified into exit 8 (unreachable, timed out, 5xx), exit 13
//! (401, 403, a certificate refused) and the rest.
//!
//! Credentials (`auth`) never reach argv or a file: curl reads its URL and
//! headers from a config on its standard input (`--config -`), and every
//! message goes through `crate::redact`. Every blob read is hashed as it is
//! written and refused (exit 6) when its sha256 differs from the digest it
//! was asked for; nothing here writes outside the path its caller gives.

pub mod auth;
mod curl;
pub mod mirror;

use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::path::Path;

use crate::exit::{Code, fail};
use crate::hex;
use crate::net::NetworkSettings;

pub use auth::Auth;
use curl::{Call, Reply, quoted as curl_quoted};

/// The media type of an OCI image manifest, which an artifact's is.
pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";

/// A repository in a registry, as `[cache] registry` names it:
/// `host[:port]/path/of/repo`. HTTPS only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registry {
    /// `host` or `host:port`, as docker's `config.json` keys it.
    pub host: String,
    /// The repository's path (`org/name`), lowercase.
    pub repo: String,
}

impl std::fmt::Display for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.host, self.repo)
    }
}

impl Registry {
    /// Parses `host[:port]/repo/path`, strictly: no scheme, no tag or
    /// digest, no credentials, and a repository path as the distribution
    /// spec's grammar allows (lowercase components of `[a-z0-9]` joined by
    /// `.`, `_`, `__` or `-`).
    pub fn parse(s: &str) -> Result<Registry> {
        let bad = |why: &str| {
            anyhow::anyhow!(
                "registry {s:?} {why}: give host[:port]/repository, e.g. \"ghcr.io/org/tools-cache\" or \"127.0.0.1:5000/team/cache\""
            )
        };
        if s.contains("://") {
            return Err(bad(
                "has a scheme (registries are always reached over https)",
            ));
        }
        if s.contains('@') {
            return Err(bad(
                "holds credentials or a digest (credentials come from docker's config.json or WARMSTART_REGISTRY_TOKEN)",
            ));
        }
        let Some((host, repo)) = s.split_once('/') else {
            return Err(bad("has no repository"));
        };
        let host_ok = !host.is_empty()
            && host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
            && host.split(':').nth(1).is_none_or(|p| {
                !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && p.parse::<u16>().is_ok()
            })
            && host.matches(':').count() <= 1;
        if !host_ok {
            return Err(bad("has no usable host[:port]"));
        }
        if repo.contains(':') {
            return Err(bad(
                "names a tag (the tag of each key is the key: name only the repository)",
            ));
        }
        let component_ok = |c: &str| {
            let b = c.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_lowercase() | b[0].is_ascii_digit()
                && b[b.len() - 1].is_ascii_lowercase() | b[b.len() - 1].is_ascii_digit()
                && c.bytes()
                    .all(|x| x.is_ascii_lowercase() || x.is_ascii_digit() || b"._-".contains(&x))
                && !c.contains("..")
                && !c.contains("___")
        };
        if !repo.split('/').all(component_ok) || repo.len() > 255 {
            return Err(bad(
                "has a repository path the registry refuses (lowercase letters, digits, and . _ - between them)",
            ));
        }
        Ok(Registry {
            host: host.to_string(),
            repo: repo.to_string(),
        })
    }

    /// `https://host/v2/repo/` + `rest`.
    fn url(&self, rest: &str) -> String {
        format!("https://{}/v2/{}/{rest}", self.host, self.repo)
    }

    /// The `oci://` URL restore records as a cache's source.
    pub fn source_url(&self) -> String {
        format!("oci://{self}")
    }

    /// Parses what `source_url` made.
    pub fn from_source_url(url: &str) -> Option<Registry> {
        Registry::parse(url.strip_prefix("oci://")?).ok()
    }
}

/// A tag is the cache key itself when the registry's grammar allows it
/// (`[A-Za-z0-9_][A-Za-z0-9._-]{0,127}`); a key with `+`, a leading `-`
/// or more than 128 characters cannot be a tag and is refused, exit 10,
/// rather than renamed (two keys must never share a tag).
pub fn tag_of(key: &str) -> Result<&str> {
    let b = key.as_bytes();
    let ok = !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(c));
    if !ok {
        return Err(fail(
            Code::Config,
            format!(
                "cache key {key:?} cannot be an OCI tag (letters, digits, '.', '_', '-', at most 128, not starting with '.' or '-'): change the pin that gives it, or keep this cache on a git branch"
            ),
        ));
    }
    Ok(key)
}

/// A client of one repository: where, with which credentials, under
/// which deadlines.
#[derive(Clone, Debug)]
pub struct Client {
    pub registry: Registry,
    auth: Auth,
    net: NetworkSettings,
    /// Asked for blobs before `registry` (`mirror`); none for a publish.
    mirrors: Vec<mirror::Mirror>,
}

/// What a HEAD of a blob found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Present {
    Yes(u64),
    No,
}

impl Client {
    /// A client of `registry`, with the credentials `auth::find` finds.
    pub fn new(registry: Registry, net: NetworkSettings) -> Result<Client> {
        let auth = auth::find(&registry.host)?;
        Ok(Client::bare(registry, auth, net))
    }

    fn bare(registry: Registry, auth: Auth, net: NetworkSettings) -> Client {
        Client {
            registry,
            auth,
            net,
            mirrors: Vec::new(),
        }
    }

    /// This client, asking for blobs first of the mirrors this machine
    /// (`WARMSTART_REGISTRY_MIRRORS`) and then `listed` (a manifest's
    /// `[cache] mirrors`) name for its registry (`mirror::resolve`).
    pub fn with_mirrors(mut self, listed: &[mirror::Spec]) -> Result<Client> {
        for spec in mirror::resolve(&self.registry, listed)? {
            self.mirrors
                .push(mirror::Mirror::new(&spec, &self.registry, self.net)?);
        }
        Ok(self)
    }

    fn call(&self, method: &'static str, url: String) -> Call<'_> {
        Call::new(self, method, url)
    }

    /// Whether the repository holds blob `sha256`, and its size.
    pub fn blob_present(&self, sha256: &str) -> Result<Present> {
        let r = self
            .call("HEAD", self.registry.url(&format!("blobs/sha256:{sha256}")))
            .run()?;
        match r.status {
            200 => Ok(Present::Yes(r.content_length.unwrap_or(0))),
            404 => Ok(Present::No),
            _ => Err(r.failure(&format!("asking for blob sha256:{sha256}"))),
        }
    }

    /// Blob `sha256` of `size` bytes into `dest` (created or replaced),
    /// hashed as it arrives: a blob of another size or digest is exit 6
    /// and `dest` is removed.
    pub fn get_blob(&self, sha256: &str, size: u64, dest: &Path) -> Result<()> {
        self.get_blob_tracked(sha256, size, dest, &mut |_| {})
    }

    /// `get_blob`, telling `track` curl's process group while it runs.
    /// Each mirror that is still on is asked first (`mirror`): what one
    /// serves is held to the same digest and size, and any failure but a
    /// 404 turns it off with one warning; the origin is asked last, and
    /// its failure is the caller's.
    pub fn get_blob_tracked(
        &self,
        sha256: &str,
        size: u64,
        dest: &Path,
        track: &mut dyn FnMut(Option<u32>),
    ) -> Result<()> {
        for (i, m) in self.mirrors.iter().enumerate() {
            if m.is_off() {
                continue;
            }
            match m.client.fetch_blob(sha256, size, dest, track) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    let next = self.mirrors[i + 1..]
                        .iter()
                        .find(|n| !n.is_off())
                        .map_or_else(
                            || format!("the origin {}", self.registry),
                            |n| format!("mirror {}", n.client.registry),
                        );
                    m.failed(&format!("blob sha256:{sha256}"), &e, &next);
                }
            }
        }
        self.fetch_blob(sha256, size, dest, track)
    }

    /// Blob `sha256` from this client's registry alone, hashed as it
    /// arrives. A connection cut after some bytes arrived is asked again
    /// for the rest with an HTTP Range (`curl --continue-at`), as long as
    /// each attempt brings at least one more byte; one that brings none is
    /// tried once more, and then fails. A server that refuses the range is
    /// asked once for the whole blob again.
    fn fetch_blob(
        &self,
        sha256: &str,
        size: u64,
        dest: &Path,
        track: &mut dyn FnMut(Option<u32>),
    ) -> Result<()> {
        let what = format!("blob sha256:{sha256}");
        let url = self.registry.url(&format!("blobs/sha256:{sha256}"));
        let _ = std::fs::remove_file(dest);
        let have = |p: &Path| std::fs::metadata(p).map_or(0, |m| m.len());
        let (mut idle, mut restarted) = (false, false);
        loop {
            let from = have(dest);
            let mut call = self.call("GET", url.clone()).follow().output(dest);
            if from > 0 {
                call = call.continue_at(from);
            }
            let (r, exit) = call.track(track).run_with_exit();
            match r {
                Ok(r) if r.status == 200 || r.status == 206 => break,
                // The range is past the blob's end: it is not the blob
                // asked for, or it changed; start over once.
                Ok(r) if r.status == 416 && !restarted => {
                    restarted = true;
                    let _ = std::fs::remove_file(dest);
                }
                Ok(r) => {
                    let _ = std::fs::remove_file(dest);
                    return Err(r.failure(&format!("fetching {what}")));
                }
                // curl's 33: the server ignores ranges.
                Err(_) if exit == Some(33) && !restarted => {
                    restarted = true;
                    let _ = std::fs::remove_file(dest);
                }
                Err(e) if exit.is_some_and(curl::is_cut) => {
                    let now = have(dest);
                    if now >= size {
                        break;
                    }
                    if now > from {
                        idle = false;
                    } else if idle {
                        let _ = std::fs::remove_file(dest);
                        return Err(e.context(format!(
                            "fetching {what} of {size} bytes: the connection was cut twice with no byte more after {now}"
                        )));
                    } else {
                        idle = true;
                    }
                }
                Err(e) => {
                    let _ = std::fs::remove_file(dest);
                    return Err(e);
                }
            }
        }
        let got = hash_file(dest)?;
        if got.1 != size || got.0 != sha256 {
            let _ = std::fs::remove_file(dest);
            return Err(fail(
                Code::Verify,
                format!(
                    "registry {} sent {} bytes with sha256 {} for {what} of {size} bytes: refused before use (the registry's storage is damaged or it is not the registry the manifest names)",
                    self.registry, got.1, got.0
                ),
            ));
        }
        Ok(())
    }

    /// A small blob (a manifest's config, a statement), checked as
    /// `get_blob` checks one, into memory.
    pub fn get_small_blob(&self, sha256: &str, size: u64, tmp: &Path) -> Result<Vec<u8>> {
        self.get_blob(sha256, size, tmp)?;
        let bytes = std::fs::read(tmp).with_context(|| format!("reading {}", tmp.display()))?;
        let _ = std::fs::remove_file(tmp);
        Ok(bytes)
    }

    /// Uploads `path` as blob `sha256` (one POST for the upload session,
    /// one PUT of the whole file).
    pub fn put_blob(&self, sha256: &str, path: &Path) -> Result<()> {
        let what = format!("uploading blob sha256:{sha256}");
        let r = self
            .call("POST", self.registry.url("blobs/uploads/"))
            .run()?;
        if r.status != 202 {
            return Err(r.failure(&what));
        }
        let Some(location) = r.location.clone() else {
            return Err(fail(
                Code::Remote,
                format!(
                    "{what} to {}: the registry began an upload without a Location",
                    self.registry
                ),
            ));
        };
        let mut url = if location.starts_with('/') {
            format!("https://{}{location}", self.registry.host)
        } else if location.starts_with("https://") {
            location
        } else {
            return Err(fail(
                Code::Remote,
                format!(
                    "{what} to {}: the registry's upload Location {:?} is not https",
                    self.registry,
                    crate::redact::url(&location)
                ),
            ));
        };
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!("digest=sha256%3A{sha256}"));
        let r = self
            .call("PUT", url)
            .header("Content-Type: application/octet-stream")
            .upload(path)
            .run()?;
        if r.status != 201 {
            return Err(r.failure(&what));
        }
        Ok(())
    }

    /// The manifest tagged `tag`: its bytes and their sha256, or `None`
    /// when the repository has no such tag (or no such repository). Asked
    /// of the origin alone, never of a mirror: a tag is a name, and only
    /// the origin says what it names now (`mirror`).
    pub fn get_manifest(&self, tag: &str, tmp: &Path) -> Result<Option<(Vec<u8>, String)>> {
        let r = self
            .call("GET", self.registry.url(&format!("manifests/{tag}")))
            .header(&format!("Accept: {MANIFEST_TYPE}"))
            .output(tmp)
            .run()?;
        let bytes = std::fs::read(tmp).unwrap_or_default();
        let _ = std::fs::remove_file(tmp);
        match r.status {
            200 => {
                let digest = hex::encode(&Sha256::digest(&bytes));
                Ok(Some((bytes, digest)))
            }
            404 => Ok(None),
            _ => Err(r.with_body(bytes).failure(&format!("reading tag {tag}"))),
        }
    }

    /// Points `tag` at `manifest` (the one write that makes a key visible).
    pub fn put_manifest(&self, tag: &str, manifest: &[u8], tmp: &Path) -> Result<()> {
        crate::fsio::write_atomic(tmp, manifest)?;
        let r = self
            .call("PUT", self.registry.url(&format!("manifests/{tag}")))
            .header(&format!("Content-Type: {MANIFEST_TYPE}"))
            .upload(tmp)
            .run();
        let _ = std::fs::remove_file(tmp);
        let r = r?;
        if r.status != 201 {
            return Err(r.failure(&format!("tagging {tag}")));
        }
        Ok(())
    }
}

/// The sha256 (hex) and size of a file.
pub fn hash_file(path: &Path) -> Result<(String, u64)> {
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        let k = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex::encode(&h.finalize()), n))
}

impl Reply {
    /// The error of an answer that was not the one expected: exit 13 for
    /// 401 and 403 (with where the credentials came from), 4 for a 404, 8
    /// for 429 and 5xx, 1 otherwise; the registry's own error message
    /// (redacted) when it sent one.
    fn failure(&self, what: &str) -> anyhow::Error {
        let said = self.said();
        let (code, hint) = match self.status {
            401 | 403 => (
                Code::AuthRefused,
                format!(
                    " ({}; set WARMSTART_REGISTRY_TOKEN, or log in with `docker login {}`)",
                    self.auth_source, self.host
                ),
            ),
            404 => (Code::NotFound, String::new()),
            429 | 500..=599 => (Code::Remote, String::new()),
            _ => (Code::Failed, String::new()),
        };
        fail(
            code,
            crate::redact::text(&format!(
                "{what} at {}: HTTP {}{said}{hint}",
                self.registry, self.status
            )),
        )
    }
}
