//! `cargo xtask cache verify`: check a cache branch (and the installed copy)
//! without installing anything.
//!
//! Fetches the branch, cross-checks `SHA256SUMS` with `warmstart.json`, then
//! streams every key through the same verification and the same safe
//! extractor as a restore, into a scratch directory inside cache.git that is
//! removed afterwards. If the current key is installed here (per the stamp),
//! the installed copy is compared with the verified one.
//!
//! Architecture: this command never writes outside the private cache.git
//! (and cache.git's scratch directories), never touches the target, never
//! writes a stamp.

use anyhow::Result;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use xshell::Shell;

use crate::cache::format::manifest::{self, Key};
use crate::cache::human_bytes;
use crate::cache::restore;
use crate::cache::restore::branch::{Branch, Content};
use crate::cache::restore::compare;
use crate::cache::restore::stamp::{self, Loaded};
use crate::cli::cache::VerifyArgs;
use crate::exit::{Code, code_of, fail};
use crate::git::CacheGit;
use crate::repo::Repo;
use crate::unpack;

/// The verdict on one key of the branch.
#[derive(Debug, Serialize)]
pub struct KeyReport {
    pub key: String,
    /// Whether this is the key this machine computes.
    pub current: bool,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(rename = "chunk_count")]
    pub chunks: usize,
    pub compressed_bytes: u64,
    pub tar_bytes: u64,
    pub tar_sha256: String,
    pub entries: u64,
}

/// The verdict on the installed copy of the current key.
#[derive(Debug, Serialize)]
pub struct InstalledReport {
    pub target: PathBuf,
    /// `matches`, `differs`, `not installed`, `other key installed`.
    pub state: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub difference: Option<String>,
}

/// The whole `cache verify` report (`--json`).
#[derive(Debug, Serialize)]
pub struct Report {
    pub name: String,
    pub branch: String,
    #[serde(rename = "remote", serialize_with = "crate::contract::shown_remote")]
    pub source: String,
    pub commit: String,
    pub layout: &'static str,
    /// The envelope's `ok` says it (false when a key failed).
    #[serde(skip)]
    pub ok: bool,
    pub keys: Vec<KeyReport>,
    pub installed: Option<InstalledReport>,
    pub bytes_hashed: u64,
}

/// `cargo xtask cache verify NAME`.
pub fn run(sh: &Shell, args: VerifyArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let progress = !args.out.quiet() && !args.out.json && std::io::stderr().is_terminal();
    crate::contract::fail_with(serde_json::json!({ "name": args.name }));
    let (report, first_err) =
        verify_named(sh, &repo, &args.name, args.remote.as_deref(), progress)?;
    if !args.out.json && !args.out.quiet() {
        print_text(&report);
    }
    crate::contract::finish(&report, first_err.map_or(Ok(()), Err))
}

fn print_text(r: &Report) {
    println!(
        "cache {}: branch {} from {} at {} ({})",
        r.name,
        r.branch,
        r.source,
        &r.commit[..r.commit.len().min(12)],
        r.layout
    );
    for k in &r.keys {
        let mark = if k.current {
            " (this machine's key)"
        } else {
            ""
        };
        match &k.error {
            None => println!(
                "  ok      {}{mark}: {} chunks, {} compressed, {} tar, {} entries",
                k.key,
                k.chunks,
                human_bytes(k.compressed_bytes),
                human_bytes(k.tar_bytes),
                k.entries
            ),
            Some(e) => println!("  FAILED  {}{mark}: {e}", k.key),
        }
    }
    if let Some(i) = &r.installed {
        match &i.difference {
            None => println!("  installed copy at {}: {}", i.target.display(), i.state),
            Some(d) => println!(
                "  installed copy at {}: {} ({d}): repair it with `{cmd} cache restore {} --verify`",
                i.target.display(),
                i.state,
                r.name,
                cmd = crate::invocation::command(),
            ),
        }
    }
}

/// Verifies every key of cache `name`'s branch. Returns the report and
/// the first failure (whose exit code the command ends with).
pub fn verify_named(
    sh: &Shell,
    repo: &Repo,
    name: &str,
    remote: Option<&str>,
    progress: bool,
) -> Result<(Report, Option<anyhow::Error>)> {
    let m = crate::cache::manifests::load_git(repo, name, "cache verify")?;
    // The key is only needed to mark the current key and check the install;
    // a key that cannot be computed here does not stop the branch check.
    let key = match crate::cache::manifests::compute_key(sh, repo, &m) {
        Ok(k) => Some(k),
        Err(e) => {
            eprintln!("warning: cannot compute the key of {name} here: {e:#}");
            None
        }
    };
    // `cache gc` removes no chunk while this may read one.
    let _reading = crate::cache::gc::Reading::take(
        &repo.state_dir(),
        crate::cache::restore::RestoreOptions::default().lock_timeout,
    )?;
    let (git, branch) = crate::git::healing(|| restore::fetch(sh, repo, &m, remote, progress))?;
    let ctx = Ctx {
        sh,
        repo,
        m: &m,
        key: key.as_ref(),
        git: &git,
        branch: &branch,
        // Scratch trees are staging directories of a target that is never
        // swapped in: `staging_dir_for` also removes those of killed runs.
        scratch: git.dir.join("warmstart-verify"),
        fix: restore::republish_fix(name),
        progress,
    };
    let mut found = Found::default();
    for k in keys_to_verify(&branch, key.as_ref()) {
        ctx.verify_key(k, &mut found)?;
    }
    let first_err = found.first_err.take().or_else(|| ctx.verdict(&found));
    debug_assert!(first_err.as_ref().is_none_or(|e| code_of(e) != Code::Ok));
    Ok((
        Report {
            name: name.to_string(),
            branch: branch.name.clone(),
            source: branch.remote.to_string(),
            commit: branch.commit.clone(),
            layout: branch.layout(),
            ok: first_err.is_none(),
            keys: found.reports,
            installed: found.installed,
            bytes_hashed: found.bytes_hashed,
        },
        first_err,
    ))
}

/// The keys to verify: every key of a v1 branch; a legacy branch holds one
/// archive, restored whatever the key.
fn keys_to_verify(branch: &Branch, key: Option<&Key>) -> Vec<String> {
    match &branch.content {
        Content::V1(_) => branch.keys(),
        Content::Legacy { archive, .. } => {
            vec![
                key.map(|k| k.value.clone())
                    .unwrap_or_else(|| archive.clone()),
            ]
        }
    }
}

/// What `verify_named` checks each key with.
struct Ctx<'a> {
    sh: &'a Shell,
    repo: &'a Repo,
    m: &'a manifest::CacheManifest,
    /// This machine's key, when it could be computed.
    key: Option<&'a Key>,
    git: &'a CacheGit,
    branch: &'a Branch,
    scratch: PathBuf,
    fix: String,
    progress: bool,
}

/// What the keys verified so far found.
#[derive(Default)]
struct Found {
    reports: Vec<KeyReport>,
    first_err: Option<anyhow::Error>,
    installed: Option<InstalledReport>,
    bytes_hashed: u64,
}

impl Ctx<'_> {
    /// Streams key `k` through a restore's verified stream into a scratch
    /// tree (removed after), and compares the installed copy with it when
    /// `k` is this machine's key.
    fn verify_key(&self, k: String, found: &mut Found) -> Result<()> {
        let current = self.key.is_some_and(|c| c.value == k);
        let dest = unpack::staging_dir_for(&self.scratch)?;
        // A chunk unreadable in a damaged cache.git: rebuilt once, and the
        // key's chunks are fetched again by id (the plan needs no tree).
        // The scratch tree lives in cache.git, so each attempt makes it anew.
        let result = crate::git::healing(|| {
            unpack::staging_dir_for(&self.scratch)?;
            let (m, git, branch) = (self.m, self.git, self.branch);
            restore::verified_unpack(
                self.sh,
                self.repo,
                m,
                git,
                branch,
                &k,
                &self.fix,
                &dest,
                self.progress,
            )
        });
        match result {
            Ok((kp, u, v)) => {
                found.bytes_hashed += v.bytes_hashed;
                if current && let Some(key) = self.key {
                    found.installed = Some(check_installed(self.repo, self.m, &key.value, &dest)?);
                }
                found.reports.push(KeyReport {
                    key: k,
                    current,
                    ok: true,
                    error: None,
                    chunks: kp.plan.pieces.len(),
                    compressed_bytes: v.compressed_bytes,
                    tar_bytes: v.tar_bytes,
                    tar_sha256: v.tar_sha256,
                    entries: u.files + u.dirs + u.symlinks + u.hardlinks,
                })
            }
            Err(e) => {
                found.reports.push(KeyReport {
                    key: k.clone(),
                    current,
                    ok: false,
                    error: Some(format!("{e:#}")),
                    chunks: 0,
                    compressed_bytes: 0,
                    tar_bytes: 0,
                    tar_sha256: String::new(),
                    entries: 0,
                });
                if found.first_err.is_none() {
                    let name = &self.m.name;
                    found.first_err = Some(e.context(format!("verifying key {k} of cache {name}")));
                }
            }
        }
        unpack::remove_tree(&dest)?;
        Ok(())
    }

    /// When every key verified: exit 4 if the branch lacks this machine's
    /// key, exit 6 if the installed copy differs, else `None`.
    fn verdict(&self, found: &Found) -> Option<anyhow::Error> {
        let name = &self.m.name;
        if let Some(key) = self.key
            && !found.reports.iter().any(|r| r.current)
        {
            return Some(fail(
                Code::NotFound,
                format!(
                    "branch {} holds no key {} (this machine's key): the other keys verified; publish this one with `{cmd} cache publish {name}`",
                    self.branch.name,
                    key.value,
                    cmd = crate::invocation::command(),
                ),
            ));
        }
        let i = found.installed.as_ref().filter(|i| i.state == "differs")?;
        Some(fail(
            Code::Verify,
            format!(
                "the installed copy of cache {name} at {} differs from the branch ({}): repair it with `{cmd} cache restore {name} --verify`",
                i.target.display(),
                i.difference.as_deref().unwrap_or("?"),
                cmd = crate::invocation::command(),
            ),
        ))
    }
}

/// Compares the installed copy with the verified scratch tree, if the stamp
/// says the current key is installed.
fn check_installed(
    repo: &Repo,
    m: &manifest::CacheManifest,
    key: &str,
    verified: &Path,
) -> Result<InstalledReport> {
    let target = m.restore_path.clone();
    let state = match stamp::load(&stamp::path(
        &crate::cache::restore::records_place(repo, m),
        &m.name,
    )) {
        Loaded::Found(s) if s.key == key && s.target == target => None,
        Loaded::Found(_) => Some("other key installed"),
        Loaded::Missing => Some("not installed"),
        Loaded::Corrupt(_) => Some("not installed (corrupt stamp)"),
    };
    if let Some(state) = state {
        return Ok(InstalledReport {
            target,
            state: state.to_string(),
            difference: None,
        });
    }
    let exact = m.mode == manifest::Mode::Replace;
    if m.mode == manifest::Mode::Overlay {
        // Files the user changed since they were installed are theirs, not
        // a difference: they leave the scratch copy (inside cache.git), and
        // the overlay record is only read.
        let record = crate::cache::restore::overlay::load(
            &crate::cache::restore::overlay::path(&repo.state_dir(), &m.name),
            &target,
        );
        crate::cache::restore::overlay::hold_back(verified, &target, &record)?;
    }
    let (diff, _) = compare::first_difference(verified, &target, exact)?;
    Ok(InstalledReport {
        target,
        state: if diff.is_some() { "differs" } else { "matches" }.to_string(),
        difference: diff,
    })
}
