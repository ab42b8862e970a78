//! `download`: one file over HTTPS, pinned by sha256, installed atomically.
//!
//! The transfer is `curl`'s: it honours `https_proxy`, `HTTPS_PROXY`,
//! `http_proxy` and `no_proxy`/`NO_PROXY` exactly as every other tool on the
//! machine does, uses the system's CA store, and costs warmstart no TLS stack
//! to compile (a Rust client with rustls would add ring or aws-lc to every
//! build of a tool whose point is to be ready fast). Timeouts: connect
//! (curl's), and a read timeout as "no byte for N": curl writes unbuffered
//! into the temp file and this module watches it grow, killing a transfer
//! that stalls (curl's own `--speed-time` averages over several seconds, so a
//! trickle of bytes would hide a stall for too long). Retries with doubling
//! backoff on timeouts, refused connections and 5xx (`restore::retry`, the
//! policy `command` shares).
//!
//! Install: into a temp file beside `dest`, hash it, and only when the hash
//! equals the pin, rename it onto `dest`. A wrong pin installs nothing and
//! leaves no temp file. The warm probe compares a stamp (url, pin, dest) and
//! checks that `dest` exists: it never re-hashes the installed file. When
//! that says "not installed", an `unless` probe (as `command` has) may
//! still say "not needed", e.g. because the system's own tool is recent
//! enough; nothing is fetched then, and nothing is stamped.
//!
//! A package (`unpack_into`): the verified temp file is unpacked into the
//! prefix by `conda::unpack_package` (the conda module's checks, placeholder
//! rewriting and journaled per-file install; `only` filters) before it is
//! renamed onto `dest`, so a package that does not unpack is not installed
//! and the next run tries again. The stamp then also records the prefix and
//! filters, and the probe checks that the prefix exists.

use super::command::Cmdline;
use crate::cache::format::manifest::expand_path;
use crate::clock::DurationSpec;
use crate::repo::Repo;
use crate::restore::fields::{field, retry_policy, timeout};
use anyhow::bail;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common::{Ctx, Outcome, Probe};
use crate::cli::conda::{DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, UnpackArgs};
use crate::conda;
use crate::hex;
use crate::restore::proc::{self, Exit, Log};
use crate::restore::report::fmt_duration;
use crate::restore::retry::{self, Attempt, Failure};
use crate::restore::state;

/// A file fetched over HTTPS, pinned by sha256, installed atomically.
#[derive(Debug)]
pub struct Download {
    pub url: String,
    pub sha256: String,
    pub dest: PathBuf,
    pub executable: bool,
    /// A `.conda` (or `.tar.bz2`) package to unpack into this prefix with
    /// the conda module once its pin checked.
    pub unpack_into: Option<PathBuf>,
    /// With `unpack_into`: install only these directories of the package.
    pub only: Vec<String>,
    pub connect_timeout: Duration,
    /// A transfer that moves no byte for this long is abandoned (and retried).
    pub read_timeout: Duration,
    pub max_time: Option<Duration>,
    /// Further attempts after the first one.
    pub retries: u32,
    /// Wait before the first retry; doubles on each further one.
    pub backoff: Duration,
    /// A probe command whose success means the download is not needed
    /// (e.g. the system's own tool is recent enough).
    pub unless: Option<Cmdline>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDownload {
    url: String,
    sha256: String,
    dest: String,
    #[serde(default)]
    executable: bool,
    unpack_into: Option<String>,
    #[serde(default)]
    only: Vec<String>,
    connect_timeout: Option<DurationSpec>,
    read_timeout: Option<DurationSpec>,
    max_time: Option<DurationSpec>,
    retries: Option<toml::Value>,
    backoff: Option<toml::Value>,
    unless: Option<toml::Value>,
}

pub fn resolve_download(repo: &Repo, r: RawDownload) -> Result<Download> {
    check_url(&r.url)?;
    let sha256 = r.sha256.to_ascii_lowercase();
    if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!(
            "`sha256` = {:?} is not 64 hex digits: pin the file with `sha256sum FILE`",
            r.sha256
        );
    }
    let dest = expand_path(repo, &r.dest)?;
    if dest.file_name().is_none() || r.dest.ends_with('/') {
        bail!("`dest` = {:?} must name the file to install", r.dest);
    }
    let unpack_into = r.unpack_into.map(|p| expand_path(repo, &p)).transpose()?;
    match &unpack_into {
        None if !r.only.is_empty() => {
            bail!("`only` needs `unpack_into`: it filters what a package installs")
        }
        Some(_) if !(r.dest.ends_with(".conda") || r.dest.ends_with(".tar.bz2")) => bail!(
            "`dest` = {:?} must end in .conda or .tar.bz2 when `unpack_into` is set",
            r.dest
        ),
        Some(_) if r.executable => {
            bail!("`executable` does not apply to a package that is unpacked")
        }
        _ => {}
    }
    for o in &r.only {
        let p = Path::new(o);
        if o.is_empty()
            || p.is_absolute()
            || p.components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            bail!("`only` = {o:?} must be a directory inside the package, such as \"bin/\"");
        }
    }
    let retry = retry_policy(r.retries.as_ref(), r.backoff, 3)?;
    let unless = field::<Cmdline>(r.unless, "unless")?;
    if let Some(u) = &unless {
        u.check("unless")?;
    }
    Ok(Download {
        url: r.url,
        sha256,
        dest,
        executable: r.executable,
        unpack_into,
        only: r.only,
        connect_timeout: timeout(
            &r.connect_timeout,
            "connect_timeout",
            Duration::from_secs(10),
        )?,
        read_timeout: timeout(&r.read_timeout, "read_timeout", Duration::from_secs(30))?,
        max_time: r
            .max_time
            .map(|t| t.resolve_positive("max_time"))
            .transpose()?,
        retries: retry.retries,
        backoff: retry.backoff,
        unless,
    })
}

/// HTTPS only; plain HTTP is accepted for loopback hosts (local mirrors and
/// tests), where nothing crosses a network. The sha256 pin guards the bytes
/// either way.
fn check_url(url: &str) -> Result<()> {
    if let Some(rest) = url.strip_prefix("https://") {
        if rest.is_empty() {
            bail!("`url` = {:?} has no host", crate::redact::url(url));
        }
        return Ok(());
    }
    if let Some(rest) = url.strip_prefix("http://") {
        let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
        // `user:password@` is not the host.
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let host = match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(h, _)| h),
        };
        let loopback = host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if loopback {
            return Ok(());
        }
    }
    bail!(
        "`url` = {:?} must be https:// (plain http:// only for 127.0.0.1 or localhost)",
        crate::redact::url(url)
    )
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Stamp {
    url: String,
    sha256: String,
    dest: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    unpack_into: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    only: Vec<String>,
}

fn stamp_of(d: &Download) -> Stamp {
    Stamp {
        // Stamps are files under .git/warmstart: no credentials in them.
        url: crate::redact::url(&d.url),
        sha256: d.sha256.clone(),
        dest: d.dest.display().to_string(),
        unpack_into: d.unpack_into.as_ref().map(|p| p.display().to_string()),
        only: d.only.clone(),
    }
}

/// Warm when the pinned file is installed (a stamp and a `stat`: the
/// `unless` probe is not even started), or when `unless` succeeds.
pub fn probe(ctx: &Ctx, name: &str, d: &Download) -> Probe {
    let why = match installed(ctx, name, d) {
        Ok(warm) => return warm,
        Err(why) => why,
    };
    if let Some(u) = &d.unless
        && super::command::unless_succeeds(u, &ctx.repo.root)
    {
        return Probe::warm(format!("`{}` succeeds: not needed", u.display()));
    }
    Probe::Needed(why)
}

/// `Ok(warm)` when the pinned file is in place, else why not.
fn installed(ctx: &Ctx, name: &str, d: &Download) -> std::result::Result<Probe, String> {
    if !d.dest.exists() {
        return Err(format!("{} is missing", d.dest.display()));
    }
    if let Some(prefix) = &d.unpack_into
        && !prefix.is_dir()
    {
        return Err(format!("{} is missing", prefix.display()));
    }
    match state::read_stamp::<Stamp>(ctx.paths, name) {
        Some(s) if s == stamp_of(d) => Ok(Probe::warm(match &d.unpack_into {
            None => format!("{} at sha256 {}", d.dest.display(), &d.sha256[..12]),
            Some(p) => format!(
                "{} at sha256 {}, unpacked into {}",
                d.dest.display(),
                &d.sha256[..12],
                p.display()
            ),
        })),
        _ => Err(format!(
            "{} is not the pinned download (pin changed or installed by hand)",
            d.dest.display()
        )),
    }
}

fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

/// curl's answer to one attempt: transient for timeouts, refused
/// connections, 429 and 5xx; permanent for everything else.
fn attempt(d: &Download, tmp: &Path, log: &mut Log) -> Result<Attempt<()>> {
    let _ = std::fs::remove_file(tmp);
    let protos = if d.url.starts_with("https://") {
        "=https"
    } else {
        "=http,https"
    };
    let mut cmd = Command::new("curl");
    cmd.args([
        "--silent",
        "--show-error",
        "--fail",
        "--location",
        "--no-buffer",
    ])
    .args(["--proto", protos, "--proto-redir", protos])
    .args(["--connect-timeout", &secs(d.connect_timeout)])
    .args(["--write-out", "%{http_code}"])
    .arg("--output")
    .arg(tmp);
    if let Some(m) = d.max_time {
        cmd.args(["--max-time", &secs(m)]);
    }
    cmd.arg("--").arg(&d.url);
    log.line(&format!("$ {}", proc::show(&cmd)));
    // The read timeout: no new byte in the temp file for `read_timeout`
    // (before the first byte, the connect timeout is allowed on top).
    let start = Instant::now();
    let (mut size, mut progress, mut any) = (0u64, start, false);
    let stalled = || {
        let now_size = std::fs::metadata(tmp).map(|m| m.len()).unwrap_or(0);
        if now_size != size {
            (size, progress, any) = (now_size, Instant::now(), true);
        }
        let limit = if any {
            d.read_timeout
        } else {
            d.read_timeout + d.connect_timeout
        };
        (progress.elapsed() >= limit).then_some(d.read_timeout)
    };
    let (exit, out, err) = proc::capture_until(&mut cmd, stalled)
        .map_err(|e| e.context("running curl (downloads need it: `apt-get install curl`)"))?;
    let said = proc::last_line(&err);
    log.line(&format!(
        "-> {} http {} {said}",
        exit.describe(),
        out.trim()
    ));
    let code = match exit {
        Exit::Status(s) => s.code().unwrap_or(-1),
        Exit::TimedOut(t) => {
            return Ok(Attempt::Transient(format!(
                "timed out: no byte for {}",
                fmt_duration(t)
            )));
        }
    };
    let http: u32 = out.trim().parse().unwrap_or(0);
    if let Some(said) = proxy_failure(&d.url, code, &said) {
        return Ok(said);
    }
    Ok(match code {
        0 => Attempt::Ok(()),
        28 => Attempt::Transient(format!("timed out: {said}")),
        5 | 6 | 7 | 18 | 35 | 52 | 55 | 56 => Attempt::Transient(said),
        22 if http >= 500 || http == 429 => Attempt::Transient(format!("HTTP {http}")),
        22 => Attempt::Permanent(format!("HTTP {http}: {said}")),
        _ => Attempt::Permanent(format!("curl exit {code}: {said}")),
    })
}

/// A failure that is the proxy's, not the host's, in words that name the
/// proxy and where it was set: curl's `Failed to connect to 127.0.0.1 port
/// 9` names neither. `None` when no proxy applies or the failure is not one.
fn proxy_failure(url: &str, code: i32, said: &str) -> Option<Attempt<()>> {
    use crate::restore::doctor::route;
    let route = route::curl(url, &|k| std::env::var(k).ok());
    let p = route.proxy()?;
    match code {
        // curl connects to the proxy first: a refused or unresolved
        // connection is the proxy's.
        5 | 7 => Some(Attempt::Transient(p.down_line(said))),
        56 if said.contains("CONNECT tunnel failed") => Some(Attempt::Permanent(format!(
            "the proxy {} (from {}) refuses this host ({}): ask for it to be allowed, or set NO_PROXY if it is reachable directly",
            p.shown(),
            p.from,
            crate::redact::text(said)
        ))),
        _ => None,
    }
}

fn sha256_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut f = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(&h.finalize()))
}

pub fn run(ctx: &Ctx, name: &str, d: &Download, log: &mut Log) -> Result<Outcome> {
    let dir = d.dest.parent().context("dest has a parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let file_name = d.dest.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(
        ".{file_name}.warmstart-{}.part",
        std::process::id()
    ));
    let result = fetch_verify_install(ctx, name, d, &tmp, log);
    // Whatever happened, no partial file stays behind.
    let _ = std::fs::remove_file(&tmp);
    result
}

fn fetch_verify_install(
    ctx: &Ctx,
    name: &str,
    d: &Download,
    tmp: &Path,
    log: &mut Log,
) -> Result<Outcome> {
    let policy = retry::Policy {
        retries: d.retries,
        backoff: d.backoff,
    };
    let url = crate::redact::url(&d.url);
    let tried = retry::run(policy, &format!("download of {url}"), log, |log| {
        attempt(d, tmp, log)
    })?;
    let warnings = tried.warnings;
    match tried.result {
        Ok(()) => {}
        Err(Failure::Permanent(why)) => {
            return Ok(Outcome::failed(format!(
                "download of {url} failed: {}; nothing installed",
                crate::redact::text(&why)
            ))
            .with_warnings(warnings));
        }
        Err(Failure::Exhausted { attempts, last }) => {
            return Ok(Outcome::failed(format!(
                "download of {url} failed after {attempts} attempt(s): {}; nothing installed",
                crate::redact::text(&last)
            ))
            .with_warnings(warnings));
        }
    }
    let got = sha256_file(tmp)?;
    if got != d.sha256 {
        log.line(&format!("sha256 {got} != pinned {}", d.sha256));
        return Ok(Outcome::failed(format!(
            "sha256 mismatch for {}: got {got}, the manifest pins {}; nothing installed (if the new file is right, update `sha256`)",
            crate::redact::url(&d.url),
            d.sha256
        ))
        .with_warnings(warnings));
    }
    let unpacked = match &d.unpack_into {
        None => None,
        Some(prefix) => {
            let args = UnpackArgs {
                file: tmp.to_path_buf(),
                into: prefix.clone(),
                only: d.only.clone(),
                allow_external_symlinks: false,
                max_bytes: DEFAULT_MAX_BYTES,
                max_entries: DEFAULT_MAX_ENTRIES,
                json: false,
            };
            let r = conda::unpack_package(&args).with_context(|| {
                format!(
                    "unpacking {} (sha256 checked) into {}; {} not installed",
                    crate::redact::url(&d.url),
                    prefix.display(),
                    d.dest.display()
                )
            })?;
            log.line(&format!(
                "unpacked {} {} ({}) into {}: {} files, {} symlinks, {} bytes; placeholders rewritten in {}",
                r.name,
                r.version,
                r.build,
                r.prefix.display(),
                r.files,
                r.symlinks,
                r.bytes,
                r.rewritten.len()
            ));
            Some(r)
        }
    };
    let mode = if d.executable { 0o755 } else { 0o644 };
    std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", tmp.display()))?;
    std::fs::File::open(tmp)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", tmp.display()))?;
    std::fs::rename(tmp, &d.dest).with_context(|| format!("renaming onto {}", d.dest.display()))?;
    state::write_stamp(ctx.paths, name, &stamp_of(d))?;
    let size = std::fs::metadata(&d.dest).map(|m| m.len()).unwrap_or(0);
    if let Some(r) = unpacked {
        return Ok(Outcome::done(format!(
            "installed {} ({size} bytes, sha256 {}) and unpacked {} {} into {}: {} files",
            d.dest.display(),
            &d.sha256[..12],
            r.name,
            r.version,
            r.prefix.display(),
            r.files
        ))
        .with_warnings(warnings));
    }
    Ok(Outcome::done(format!(
        "installed {} ({size} bytes, sha256 {})",
        d.dest.display(),
        &d.sha256[..12]
    ))
    .with_warnings(warnings))
}
