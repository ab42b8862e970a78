//! Chunks read straight from the server's pack stream, into a store of
//! verified chunk files.
//!
//! `git fetch <oid>` of a 99 MiB chunk costs about 2.5 CPU-seconds on this
//! machine, two thirds of it in the receiving `index-pack` (two SHA-1 passes
//! with collision detection, an inflate and a CRC over every byte, and a
//! copy of the pack on disk), and the chunk then crosses two more pipes
//! through `git cat-file` each time it is read. None of that authenticates
//! anything a restore relies on: every chunk carries its own sha256 in
//! `warmstart.json`, which arrived through git's own, SHA-1-checked fetch of
//! the branch. So a restore asks the server's `git upload-pack` for each
//! chunk itself, in protocol v2 (`command=fetch`, `want <oid>`, `done`),
//! reads the one-object pack it answers, inflates the blob, and writes it
//! to `cache.git/chunks/<sha256>` while hashing it. A chunk is stored under
//! its digest only once its size and sha256 matched; anything else is
//! refused with the same message and exit code as a damaged chunk read
//! from cache.git.
//!
//! The server is reached the way `git fetch` reaches it (`Server`): a
//! repository on this machine (a path, a `file://` URL) by running
//! `git upload-pack` on it; smart HTTP(S) through git's own remote helper
//! in its `stateless-connect` mode, so credentials, proxies and `http.*`
//! settings stay git's; ssh by running the ssh program git would run, with
//! git's arguments (`git::ssh`); a `git daemon` over a TCP stream of our
//! own (`daemon`). Anything else goes through `git fetch`.
//!
//! A connection that ends inside the pack is `Error::Cut`: the chunks
//! stored before it stay stored, and the caller asks again for the rest.
//!
//! The pack's own trailing SHA-1 is not checked: the sha256 of the content
//! is the check that matters, and it is stronger. The pack itself is parsed
//! as it streams by `pack::PackSink`; this file speaks the protocol.
//!
//! Anything this reader does not expect (a server that does not speak
//! protocol v2, a delta, more than one object, another hash function) is
//! `Error::Unsupported`: the caller falls back to `git fetch` for this and
//! every later chunk (`cache::fetch::prefetch`).

use anyhow::{Context, Result, anyhow};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::git::ssh::{self, Ssh};
use crate::git::{CacheGit, Remote};
use crate::hex;

mod daemon;
mod pack;

use daemon::Daemon;
use pack::PackSink;

/// Verified chunk files, named by their sha256, in `cache.git/chunks`.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

impl Store {
    pub fn of(git: &CacheGit) -> Store {
        Store {
            dir: git.dir.join("chunks"),
        }
    }

    /// Where the chunk with this digest is kept.
    pub fn path(&self, sha256: &[u8; 32]) -> PathBuf {
        self.dir.join(hex::encode(sha256))
    }

    /// The size of the stored chunk with this digest, if there is one.
    pub fn size(&self, sha256: &[u8; 32]) -> Option<u64> {
        std::fs::symlink_metadata(self.path(sha256))
            .ok()
            .filter(|m| m.is_file())
            .map(|m| m.len())
    }

    /// Hashes the stored chunk with this digest: `Ok(true)` if it is there
    /// with this size and digest. A file that does not match (a crash
    /// before its data reached the disk, a hand edit) is removed, so that
    /// the chunk is fetched again.
    pub fn check(&self, sha256: &[u8; 32], size: u64) -> Result<bool> {
        let path = self.path(sha256);
        if self.size(sha256) != Some(size) {
            let _ = std::fs::remove_file(&path);
            return Ok(false);
        }
        let mut f = File::open(&path).with_context(|| format!("opening {}", path.display()))?;
        let mut h = Sha256::new();
        io::copy(&mut f, &mut h).with_context(|| format!("reading {}", path.display()))?;
        let got: [u8; 32] = h.finalize().into();
        if got != *sha256 {
            std::fs::remove_file(&path)
                .with_context(|| format!("removing the damaged {}", path.display()))?;
            return Ok(false);
        }
        Ok(true)
    }

    /// Removes partial files nobody has written to for `STALE` (a killed
    /// restore leaves up to a chunk's worth of bytes behind). Age, not a
    /// pid, tells them apart: a clone may be shared by containers with pid
    /// namespaces of their own, and a live fetch writes every few ms.
    pub fn sweep(&self) {
        let Ok(rd) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for e in rd.flatten() {
            if !e.file_name().to_string_lossy().starts_with("tmp-") {
                continue;
            }
            let idle = e
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok());
            if idle.is_some_and(|d| d > STALE) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }

    /// A new, empty partial file for the chunk with this digest, for a
    /// writer other than this module's (`cache::fetch::oci`).
    pub fn reserve_tmp(&self, sha256: &[u8; 32]) -> io::Result<PathBuf> {
        std::fs::create_dir_all(&self.dir)?;
        self.create_tmp(sha256).map(|(path, _)| path)
    }

    /// A new partial file for the chunk with this digest, never one that
    /// exists (two fetchers may fetch the same digest at once).
    fn create_tmp(&self, sha256: &[u8; 32]) -> io::Result<(PathBuf, File)> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        loop {
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let path = self.dir.join(format!(
                "tmp-{}-{n}-{nanos}-{}",
                std::process::id(),
                hex::encode(sha256)
            ));
            match crate::unpack::create_new_file(&path) {
                Ok(f) => return Ok((path, f)),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// How long a partial chunk file may sit unwritten before `Store::sweep`
/// takes it for a dead run's.
const STALE: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// How to reach the server's `git upload-pack` ourselves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Server {
    /// A repository on this machine: run `git upload-pack` on it, as a
    /// local `git fetch` does.
    Local(PathBuf),
    /// Smart HTTP(S): through git's own remote helper
    /// (`git remote-https`), in its `stateless-connect` mode, so that
    /// credentials, proxies, certificates and `http.*` settings are git's.
    Http(String),
    /// ssh (`ssh://`, scp-like `host:path`): the ssh program git would
    /// run, with git's arguments, running `git-upload-pack` on the server.
    Ssh(Ssh),
    /// A `git daemon` (`git://`): a TCP stream of our own
    /// (`direct::daemon`), with git's request line.
    Daemon(Daemon),
}

/// The server `remote` names, if this reader can talk to it: an absolute
/// path, a `file://` URL without escapes, an `http(s)://` URL, or an ssh
/// URL that `git::ssh` reaches as git would; and only when no git
/// setting could change how git would reach it (`url.*.insteadOf`,
/// `protocol.*` but `protocol.version=2`), in the system, global or
/// forwarded configuration. Anything else goes through `git fetch`.
pub fn server_for(remote: &Remote, git: &CacheGit) -> Option<Server> {
    choose_server(remote, git).ok()
}

/// Like `server_for`, but says why the direct reader is skipped (the
/// restore's `direct_fallback`), e.g. `the remote is reached over git://`.
pub fn choose_server(remote: &Remote, git: &CacheGit) -> Result<Server, String> {
    // What git itself would see: system, global and forwarded settings.
    // `protocol.version=2` is what this reader speaks anyway.
    let settings = git
        .transport_settings()
        .map_err(|e| format!("git's transport settings could not be read ({e:#})"))?;
    if let Some((k, _)) = settings
        .iter()
        .find(|(k, v)| !(k == "protocol.version" && v.trim() == "2"))
    {
        return Err(format!(
            "git setting {k} may change how git reaches the remote, so git fetch does it"
        ));
    }
    let url = remote.url.as_str();
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(Server::Http(url.to_string()));
    }
    if let Some(daemon) = daemon::target(url, git) {
        return daemon.map(Server::Daemon);
    }
    match ssh::target(url) {
        Ok(Some(target)) => {
            let settings = ssh::Settings::read(git)?;
            // git's probe of an ssh program it cannot name (`-G`).
            let mut probe = |s: &Ssh| s.probe_command().status().is_ok_and(|st| st.success());
            return Ssh::new(target, &settings, &mut probe).map(Server::Ssh);
        }
        Ok(None) => {}
        Err(why) => return Err(format!("{why} goes through git fetch")),
    }
    let path = match url.strip_prefix("file://") {
        Some(p) if !p.contains('%') => p,
        Some(_) => return Err("a file:// URL with %-escapes goes through git fetch".into()),
        None if url.contains("://") => {
            let scheme = url.split("://").next().unwrap_or_default();
            return Err(format!(
                "the remote is reached over {scheme}://, which only git fetch speaks here"
            ));
        }
        None => url,
    };
    let path = Path::new(path);
    if path.is_absolute() {
        Ok(Server::Local(path.to_path_buf()))
    } else {
        Err("a relative path goes through git fetch".into())
    }
}

/// One chunk a batch asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Want {
    pub oid: String,
    pub size: u64,
    pub sha256: [u8; 32],
}

/// The chunk a cut connection was carrying: the want it was taken for
/// (by its size: its digest was not known yet), and how many of its
/// bytes had arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partial {
    pub want: usize,
    pub size: u64,
    pub arrived: u64,
}

/// Why a batch was not stored (whole or in part: every chunk stored
/// before the failure was reported through `on_stored` and stays stored,
/// hashed).
#[derive(Debug)]
pub enum Error {
    /// The server or its answer is not what this reader handles (a
    /// delta, another hash function, protocol v0): use `git fetch`
    /// instead for what was not stored.
    Unsupported(String),
    /// The server does not have an object asked for (this one, when it
    /// said which).
    NotOnRemote(Option<String>),
    /// A blob whose content does not have the declared sha256 of the
    /// awaited chunk of its size.
    Digest { want: usize, got: [u8; 32] },
    /// The connection ended in the middle of the pack (a link that drops
    /// its connections): what it was carrying then, if it was inside a
    /// chunk. The chunks before it are stored; asking again for the rest
    /// makes progress.
    Cut {
        partial: Option<Partial>,
        cause: anyhow::Error,
    },
    /// The connection ended, before or after the pack began (becomes `Cut`
    /// or `Failed` once it is known which).
    HungUp(anyhow::Error),
    /// Anything else (the server failed, the disk is full).
    Failed(anyhow::Error),
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        use io::ErrorKind as K;
        match e.kind() {
            K::UnexpectedEof | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe => {
                Error::HungUp(anyhow!(e))
            }
            _ => Error::Failed(anyhow!(e)),
        }
    }
}

/// Fetches the blobs of `wants` from `server` into `store`, in one
/// protocol v2 request (one `want` per distinct blob): the server answers
/// with one pack of them all, in its own order, and each blob is inflated
/// into a partial file while it is hashed, then stored under its sha256
/// once its size and digest matched a want. `on_stored(i)` is called for
/// each want as soon as its chunk is in the store (two wants of one digest
/// both). `pid` gets the process group of the running `git upload-pack`
/// or remote helper (`None` once it exited), as in `CacheGit::fetch_blob`;
/// `stopped` says when the caller no longer wants the rest (a `git://`
/// stream has no process to stop).
pub fn fetch(
    git: &CacheGit,
    server: &Server,
    wants: &[Want],
    store: &Store,
    pid: &mut dyn FnMut(Option<u32>),
    on_stored: &mut dyn FnMut(usize),
    stopped: &dyn Fn() -> bool,
) -> Result<(), Error> {
    crate::git::make_chunk_dir(&store.dir)?;
    let mut sink = PackSink::new(store, wants, on_stored);
    let r = match server {
        Server::Daemon(d) => fetch_daemon(git, d, wants, &mut sink, stopped),
        _ => fetch_child(git, server, wants, &mut sink, pid),
    };
    match r {
        Err(Error::HungUp(cause)) if sink.started() => Err(Error::Cut {
            partial: sink.partial(),
            cause,
        }),
        Err(Error::HungUp(cause)) => Err(Error::Failed(cause)),
        r => r,
    }
}

/// A read over a TCP stream of our own to a `git daemon`.
fn fetch_daemon(
    git: &CacheGit,
    d: &Daemon,
    wants: &[Want],
    sink: &mut PackSink<'_>,
    stopped: &dyn Fn() -> bool,
) -> Result<(), Error> {
    let (link, w) = d.connect(git.network(), stopped)?;
    let mut out = BufReader::with_capacity(1 << 17, link);
    let r = exchange(false, w, &mut out, wants, sink);
    if let Some(v) = out.get_ref().verdict.clone() {
        return Err(daemon::verdict_error(v));
    }
    r
}

/// A read through a child: `git upload-pack`, git's HTTP helper or ssh,
/// under the watchdog.
fn fetch_child(
    git: &CacheGit,
    server: &Server,
    wants: &[Want],
    sink: &mut PackSink<'_>,
    pid: &mut dyn FnMut(Option<u32>),
) -> Result<(), Error> {
    use std::os::unix::process::CommandExt;
    let mut cmd: Command = match server {
        Server::Local(repo) => git.upload_pack(repo),
        Server::Http(url) => git.remote_helper(url),
        Server::Ssh(ssh) => ssh.upload_pack(),
        Server::Daemon(_) => unreachable!("read by fetch_daemon"),
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| Error::Failed(anyhow!(e).context("running git upload-pack")))?;
    // Bounded like every network operation: the stream's bytes are the
    // progress the watchdog looks for (see `crate::net`).
    let watch = crate::net::Watch::start(child.id(), git.network(), None, None);
    pid(Some(child.id()));
    let mut stderr = child.stderr.take().expect("piped");
    let errs = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let stdin = child.stdin.take().expect("piped");
    let mut out = BufReader::with_capacity(
        1 << 17,
        crate::net::Counted {
            inner: child.stdout.take().expect("piped"),
            progress: watch.progress(),
        },
    );
    let http = matches!(server, Server::Http(_));
    let r = exchange(http, stdin, &mut out, wants, sink);
    drop(out);
    let status = child.wait();
    pid(None);
    let stderr = errs.join().unwrap_or_default();
    if let Some(v) = watch.finish() {
        return Err(Error::Failed(v.error("the direct read", "the server")));
    }
    verdict(server, r, status, &stderr)
}

/// One protocol v2 conversation over the server's pipes: the helper's
/// connect (`http`), the advertisement, the request, and the pack into
/// the store.
fn exchange(
    http: bool,
    mut stdin: impl Write,
    out: &mut impl io::BufRead,
    wants: &[Want],
    sink: &mut PackSink<'_>,
) -> Result<(), Error> {
    if http {
        connect(&mut stdin, out)?;
    }
    advertisement(out)?;
    stdin.write_all(&request(wants))?;
    drop(stdin);
    response(out, sink)?;
    if http {
        // The helper ends each response with a response-end packet,
        // and exits once it could write it.
        let mut buf = Vec::new();
        while !matches!(read_pkt(out, &mut buf)?, Pkt::ResponseEnd) {}
    }
    sink.finish()
}

/// The outcome of a finished read: the conversation's, unless the server's
/// exit and stderr say more (a refused login, a failed upload-pack).
fn verdict(
    server: &Server,
    r: Result<(), Error>,
    status: io::Result<std::process::ExitStatus>,
    stderr: &str,
) -> Result<(), Error> {
    if crate::git::auth_refused(stderr).is_some() {
        let who = match server {
            Server::Ssh(_) => "ssh",
            _ => "git's HTTP helper",
        };
        return Err(Error::Failed(crate::git::remote_failure(who, stderr)));
    }
    match (r, status) {
        (Ok(()), Ok(s)) if s.success() => Ok(()),
        (Ok(()), _) => Err(Error::Failed(anyhow!(
            "git upload-pack failed: {}",
            last_line(stderr)
        ))),
        (Err(Error::Failed(e)), _) if !stderr.trim().is_empty() => Err(Error::Failed(anyhow!(
            "{e:#}: git upload-pack: {}",
            last_line(stderr)
        ))),
        (Err(Error::HungUp(e)), _) if !stderr.trim().is_empty() => {
            Err(Error::HungUp(anyhow!("{e:#}: {}", last_line(stderr))))
        }
        (Err(e), _) => Err(e),
    }
}

/// The protocol v2 fetch request: one `want` per distinct blob, no
/// negotiation (`done` at once: a `have` of a branch commit would make the
/// server leave the chunks out), no progress, no `ofs-delta` and no
/// `thin-pack` (so the pack is self-contained; blobs git did store as
/// deltas still come as `REF_DELTA`, which `PackSink` hands to git fetch).
fn request(wants: &[Want]) -> Vec<u8> {
    let mut req = Vec::new();
    pkt(&mut req, b"command=fetch\n");
    req.extend_from_slice(b"0001");
    let mut seen = std::collections::HashSet::new();
    for w in wants {
        if seen.insert(w.oid.as_str()) {
            pkt(&mut req, format!("want {}\n", w.oid).as_bytes());
        }
    }
    pkt(&mut req, b"no-progress\n");
    pkt(&mut req, b"done\n");
    req.extend_from_slice(b"0000");
    req
}

/// Asks git's HTTP remote helper for a `stateless-connect` to
/// `git-upload-pack` (gitremote-helpers(7)): after it, the helper relays
/// protocol v2 requests and responses.
fn connect(stdin: &mut impl Write, out: &mut impl io::BufRead) -> Result<(), Error> {
    let unsupported = |why: &str| Error::Unsupported(format!("git's HTTP helper: {why}"));
    stdin.write_all(b"capabilities\n")?;
    stdin.flush()?;
    let mut stateless = false;
    loop {
        let mut line = String::new();
        if out.read_line(&mut line)? == 0 {
            return Err(unsupported("it hung up"));
        }
        match line.trim_end() {
            "" => break,
            "stateless-connect" => stateless = true,
            _ => {}
        }
    }
    if !stateless {
        return Err(unsupported("no stateless-connect"));
    }
    stdin.write_all(b"stateless-connect git-upload-pack\n")?;
    stdin.flush()?;
    let mut line = String::new();
    out.read_line(&mut line)?;
    if line != "\n" {
        return Err(unsupported(&format!("it answered {:?}", line.trim_end())));
    }
    Ok(())
}

/// The last line of a helper's stderr, redacted (`crate::redact`): it is
/// passed on into messages and JSON.
fn last_line(s: &str) -> String {
    crate::redact::text(s.trim().lines().last().unwrap_or("").trim())
}

fn pkt(buf: &mut Vec<u8>, data: &[u8]) {
    buf.extend_from_slice(format!("{:04x}", data.len() + 4).as_bytes());
    buf.extend_from_slice(data);
}

enum Pkt {
    Flush,
    Delim,
    ResponseEnd,
    Data(usize),
}

/// Reads one pkt-line into `buf` (its payload, for `Pkt::Data`).
fn read_pkt(r: &mut impl Read, buf: &mut Vec<u8>) -> Result<Pkt, Error> {
    let pkt = read_pkt_len(r)?;
    if let Pkt::Data(n) = pkt {
        // Grows once to the largest packet; never zero-filled again.
        if buf.len() < n {
            buf.resize(65520, 0);
        }
        r.read_exact(&mut buf[..n])?;
    }
    Ok(pkt)
}

/// Reads one pkt-line's length: `Pkt::Data(n)` leaves its `n` payload
/// bytes unread.
fn read_pkt_len(r: &mut impl Read) -> Result<Pkt, Error> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            Error::HungUp(anyhow!("the server hung up"))
        } else {
            Error::from(e)
        }
    })?;
    let len = std::str::from_utf8(&len)
        .ok()
        .and_then(|s| usize::from_str_radix(s, 16).ok())
        .ok_or_else(|| Error::Unsupported(format!("not a pkt-line: {len:?}")))?;
    Ok(match len {
        0 => Pkt::Flush,
        1 => Pkt::Delim,
        2 => Pkt::ResponseEnd,
        3 => return Err(Error::Unsupported("pkt-line of length 3".into())),
        n if n > 65520 => return Err(Error::Unsupported(format!("pkt-line of length {n}"))),
        n => Pkt::Data(n - 4),
    })
}

/// The capability advertisement: protocol v2 with `fetch` and SHA-1
/// object ids, or `Unsupported`.
fn advertisement(r: &mut impl Read) -> Result<(), Error> {
    let mut buf = Vec::new();
    let mut first = true;
    let mut fetch = false;
    loop {
        match read_pkt(r, &mut buf)? {
            Pkt::Flush => break,
            Pkt::Data(n) => {
                let line = String::from_utf8_lossy(&buf[..n]);
                let line = line.trim_end_matches('\n');
                if first && line.starts_with("version ") && line != "version 2" {
                    return Err(Error::Unsupported(format!(
                        "the server speaks {line:?}, not protocol v2"
                    )));
                }
                if first && line != "version 2" {
                    // A v0 ref advertisement: the server never saw
                    // GIT_PROTOCOL (over ssh, sshd passes it only with
                    // `AcceptEnv GIT_PROTOCOL`).
                    return Err(Error::Unsupported(
                        "the server answers protocol v0, not v2 (over ssh it needs `AcceptEnv GIT_PROTOCOL` in its sshd_config)".into(),
                    ));
                }
                first = false;
                if line == "fetch" || line.starts_with("fetch=") {
                    fetch = true;
                }
                if let Some(f) = line.strip_prefix("object-format=")
                    && f != "sha1"
                {
                    return Err(Error::Unsupported(format!("object format {f}")));
                }
            }
            _ => return Err(Error::Unsupported("unexpected packet".into())),
        }
    }
    if !fetch {
        return Err(Error::Unsupported("the server offers no fetch".into()));
    }
    Ok(())
}

/// The object id in a server's `not our ref <oid>`.
fn not_our_ref(msg: &str) -> Option<String> {
    let rest = &msg[msg.find("not our ref")? + "not our ref".len()..];
    let oid = rest.split_whitespace().next()?;
    oid.bytes()
        .all(|b| b.is_ascii_hexdigit())
        .then(|| oid.to_string())
}

/// The fetch response: a `packfile` section of side-band packets, into `sink`.
fn response(r: &mut impl Read, sink: &mut PackSink<'_>) -> Result<(), Error> {
    let mut buf = Vec::with_capacity(65520);
    let mut in_pack = false;
    loop {
        let pkt = if in_pack {
            match read_pkt_len(r)? {
                Pkt::Data(n) if n > 0 => {
                    let mut band = [0u8; 1];
                    r.read_exact(&mut band)?;
                    if band[0] == 1 {
                        stream_band(r, n - 1, &mut buf, sink)?;
                        continue;
                    }
                    buf.resize(buf.len().max(n), 0);
                    buf[0] = band[0];
                    r.read_exact(&mut buf[1..n])?;
                    Pkt::Data(n)
                }
                other => other,
            }
        } else {
            read_pkt(r, &mut buf)?
        };
        match pkt {
            Pkt::Flush if in_pack => return Ok(()),
            Pkt::Data(n) if !in_pack => {
                let buf = &buf[..n];
                if let Some(msg) = buf.strip_prefix(b"ERR ") {
                    let msg = String::from_utf8_lossy(msg).trim().to_string();
                    return Err(if msg.contains("not our ref") {
                        Error::NotOnRemote(not_our_ref(&msg))
                    } else {
                        Error::Failed(anyhow!("the server says: {msg}"))
                    });
                }
                if buf == b"packfile\n" {
                    in_pack = true;
                } else {
                    return Err(Error::Unsupported(format!(
                        "unexpected section {:?}",
                        String::from_utf8_lossy(buf)
                    )));
                }
            }
            Pkt::Data(n) if n > 0 => match buf[0] {
                1 => unreachable!("pack data is streamed below"),
                2 => {}
                3 => {
                    let msg = String::from_utf8_lossy(&buf[1..n]).trim().to_string();
                    return Err(if msg.contains("not our ref") {
                        Error::NotOnRemote(not_our_ref(&msg))
                    } else {
                        Error::Failed(anyhow!("the server says: {msg}"))
                    });
                }
                b => return Err(Error::Unsupported(format!("side band {b}"))),
            },
            _ => return Err(Error::Unsupported("unexpected packet in the pack".into())),
        }
    }
}

/// Feeds `left` bytes of pack data to `sink` as they arrive, not a whole
/// 64 KiB packet at a time: a transfer that stalls keeps every chunk that
/// was complete before it.
fn stream_band(
    r: &mut impl Read,
    mut left: usize,
    buf: &mut Vec<u8>,
    sink: &mut PackSink<'_>,
) -> Result<(), Error> {
    if buf.len() < 65520 {
        buf.resize(65520, 0);
    }
    while left > 0 {
        let n = match r.read(&mut buf[..left]) {
            Ok(0) => return Err(Error::HungUp(anyhow!("the server hung up"))),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        };
        sink.feed(&buf[..n])?;
        left -= n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs git in `dir` with `input` on its stdin; its stdout.
    fn git_in(dir: &Path, args: &[&str], input: &[u8]) -> Vec<u8> {
        let mut child = Command::new("git")
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "git {args:?}");
        out.stdout
    }

    fn hash_object(dir: &Path, blob: &[u8]) -> String {
        let out = git_in(dir, &["hash-object", "-w", "--stdin"], blob);
        String::from_utf8(out).unwrap().trim().to_string()
    }

    /// A bare repository with two blobs: `(dir, [oid of a, oid of b])`.
    fn repo_with_two_blobs() -> (tempfile::TempDir, Vec<String>) {
        let dir = tempfile::tempdir().unwrap();
        git_in(dir.path(), &["init", "-q", "--bare", "."], b"");
        let oids = [b"first blob\n".as_slice(), b"second blob\n"]
            .iter()
            .map(|b| hash_object(dir.path(), b))
            .collect();
        (dir, oids)
    }

    fn pack_of(dir: &Path, oids: &[&str]) -> Vec<u8> {
        let list: String = oids.iter().map(|o| format!("{o}\n")).collect();
        git_in(dir, &["pack-objects", "--stdout", "-q"], list.as_bytes())
    }

    fn store_in(dir: &Path) -> Store {
        let store = Store {
            dir: dir.join("chunks"),
        };
        std::fs::create_dir_all(&store.dir).unwrap();
        store
    }

    fn want(dir: &Path, blob: &[u8]) -> Want {
        Want {
            oid: hash_object(dir, blob),
            size: blob.len() as u64,
            sha256: Sha256::digest(blob).into(),
        }
    }

    /// Feeds `pack` to a sink for `wants` in pieces of `piece` bytes, as
    /// side-band packets cut it; the wants reported stored, in order.
    fn feed(
        store: &Store,
        wants: &[Want],
        pack: &[u8],
        piece: usize,
    ) -> (Result<(), Error>, Vec<usize>) {
        let mut stored = Vec::new();
        let mut on = |i| stored.push(i);
        let mut s = PackSink::new(store, wants, &mut on);
        let r = pack
            .chunks(piece)
            .try_for_each(|p| s.feed(p))
            .and_then(|()| s.finish());
        drop(s);
        (r, stored)
    }

    fn stored_names(store: &Store) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&store.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_pack_of_several_blobs_is_stored_byte_for_byte_each_as_it_arrives() {
        let (dir, _) = repo_with_two_blobs();
        let store = store_in(dir.path());
        let blobs: [&[u8]; 3] = [b"first blob\n", b"second blob\n", b"third, longer blob\n"];
        let mut wants: Vec<Want> = blobs.iter().map(|b| want(dir.path(), b)).collect();
        // The same chunk twice in one key: asked for once, both stored.
        wants.push(wants[0].clone());
        let oids: Vec<&str> = wants[..3].iter().map(|w| w.oid.as_str()).collect();
        let pack = pack_of(dir.path(), &oids);
        assert_eq!(
            request(&wants).windows(5).filter(|w| w == b"want ").count(),
            3
        );
        for piece in [5, 65519] {
            let _ = std::fs::remove_dir_all(&store.dir);
            std::fs::create_dir_all(&store.dir).unwrap();
            let (r, mut stored) = feed(&store, &wants, &pack, piece);
            r.unwrap();
            stored.sort();
            assert_eq!(stored, vec![0, 1, 2, 3]);
            for (b, w) in blobs.iter().zip(&wants) {
                assert_eq!(std::fs::read(store.path(&w.sha256)).unwrap(), *b);
            }
            // Nothing partial is left behind.
            assert_eq!(stored_names(&store).len(), 3, "{:?}", stored_names(&store));
        }
    }

    #[test]
    fn a_wrong_blob_size_digest_or_cut_pack_stores_nothing_unchecked() {
        let (dir, oids) = repo_with_two_blobs();
        let store = store_in(dir.path());
        let pack = pack_of(dir.path(), &[&oids[0]]);
        let good = want(dir.path(), b"first blob\n");
        // The wrong digest.
        let mut w = good.clone();
        w.sha256 = [0; 32];
        let (r, stored) = feed(&store, &[w], &pack, 7);
        let digest: [u8; 32] = Sha256::digest(b"first blob\n").into();
        assert!(matches!(r, Err(Error::Digest { want: 0, got }) if got == digest));
        assert!(stored.is_empty());
        // The wrong size (or an object nobody asked for): git fetch, whose
        // size check gives the verdict.
        let mut w = good.clone();
        w.size = 3;
        let (r, _) = feed(&store, &[w], &pack, 7);
        assert!(
            matches!(&r, Err(Error::Unsupported(w)) if w.contains("11 bytes")),
            "{r:?}"
        );
        // A cut pack.
        let (r, _) = feed(
            &store,
            std::slice::from_ref(&good),
            &pack[..pack.len() - 1],
            7,
        );
        assert!(matches!(r, Err(Error::Failed(_))), "{r:?}");
        // A want the pack lacks.
        let other = want(dir.path(), b"second blob\n");
        let (r, stored) = feed(&store, &[good.clone(), other.clone()], &pack, 7);
        assert!(
            matches!(&r, Err(Error::NotOnRemote(Some(o))) if *o == other.oid),
            "{r:?}"
        );
        assert_eq!(
            not_our_ref("upload-pack: not our ref 0a1b2c").as_deref(),
            Some("0a1b2c")
        );
        assert_eq!(stored, vec![0]);
        // No partial file is left, and only the checked blob was stored.
        assert_eq!(stored_names(&store), vec![hex::encode(&good.sha256)]);
    }

    #[test]
    fn what_the_reader_does_not_handle_is_unsupported() {
        let (dir, _) = repo_with_two_blobs();
        let store = store_in(dir.path());
        // Two similar blobs, which pack-objects stores as a delta.
        let text: Vec<u8> = (0..4000u32)
            .flat_map(|i| format!("line {i}\n").into_bytes())
            .collect();
        let mut edited = text.clone();
        edited[100] = b'X';
        let wants = [want(dir.path(), &text), want(dir.path(), &edited)];
        let pack = pack_of(dir.path(), &[&wants[0].oid, &wants[1].oid]);
        let (r, _) = feed(&store, &wants, &pack, 4096);
        assert!(
            matches!(&r, Err(Error::Unsupported(w)) if w.contains("delta")),
            "{r:?}"
        );
        // An object header that never ends.
        let mut endless = b"PACK\0\0\0\x02\0\0\0\x01".to_vec();
        endless.extend([0xb0; 11]);
        let (r, _) = feed(&store, &wants, &endless, 64);
        assert!(matches!(r, Err(Error::Unsupported(_))));
        // Not a pack at all.
        let (r, _) = feed(&store, &wants, b"KCAP\0\0\0\x02\0\0\0\x01", 64);
        assert!(matches!(r, Err(Error::Unsupported(_))));
        // A server that answers in protocol v0 (no GIT_PROTOCOL).
        let mut c = Command::new("git");
        c.args(["upload-pack", "--advertise-refs"])
            .arg(dir.path())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env_remove("GIT_PROTOCOL")
            .stdin(Stdio::null());
        let out = c.output().unwrap();
        assert!(out.status.success());
        assert!(matches!(
            advertisement(&mut &out.stdout[..]),
            Err(Error::Unsupported(_))
        ));
        // The same server in protocol v2 is understood.
        let out = c.env("GIT_PROTOCOL", "version=2").output().unwrap();
        assert!(out.status.success());
        advertisement(&mut &out.stdout[..]).unwrap();
    }

    #[test]
    fn stale_partial_files_are_swept_and_fresh_ones_kept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store {
            dir: dir.path().to_path_buf(),
        };
        let (stale, f) = store.create_tmp(&[7; 32]).unwrap();
        f.set_modified(std::time::SystemTime::now() - STALE * 2)
            .unwrap();
        let (fresh, _f) = store.create_tmp(&[7; 32]).unwrap();
        assert_ne!(stale, fresh, "two partial files of one digest");
        let kept = store.path(&[7; 32]);
        std::fs::write(&kept, b"x").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&kept)
            .unwrap()
            .set_modified(std::time::SystemTime::now() - STALE * 2)
            .unwrap();
        store.sweep();
        assert!(!stale.exists());
        assert!(fresh.exists() && kept.exists());
    }

    #[test]
    fn a_deflated_blob_of_several_mib_inflates_in_side_band_pieces() {
        // Compressible but not trivial, deflated at git's default level:
        // the inflater's 1 MiB output fills many times per packet run.
        let (dir, _) = repo_with_two_blobs();
        let store = store_in(dir.path());
        let mut blob = Vec::with_capacity(5 << 20);
        let mut x: u32 = 1;
        while blob.len() < 5 << 20 {
            x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            blob.extend_from_slice(format!("{} ", x >> 24).as_bytes());
        }
        let w = want(dir.path(), &blob);
        let pack = pack_of(dir.path(), &[&w.oid]);
        assert!(pack.len() < blob.len() / 2, "the blob is deflated");
        let (r, stored) = feed(&store, std::slice::from_ref(&w), &pack, 65519);
        r.unwrap();
        assert_eq!(stored, vec![0]);
        assert!(std::fs::read(store.path(&w.sha256)).unwrap() == blob);
    }
    #[test]
    fn pkt_lines_round_trip() {
        let mut b = Vec::new();
        pkt(&mut b, b"want x\n");
        b.extend_from_slice(b"00000001");
        let mut r = &b[..];
        let mut buf = Vec::new();
        assert!(matches!(read_pkt(&mut r, &mut buf).unwrap(), Pkt::Data(7)));
        assert_eq!(&buf[..7], b"want x\n");
        assert!(matches!(read_pkt(&mut r, &mut buf).unwrap(), Pkt::Flush));
        assert!(matches!(read_pkt(&mut r, &mut buf).unwrap(), Pkt::Delim));
        assert!(matches!(read_pkt(&mut r, &mut buf), Err(Error::HungUp(_))));
        assert!(matches!(
            read_pkt(&mut &b"zzzz"[..], &mut buf),
            Err(Error::Unsupported(_))
        ));
    }
}
