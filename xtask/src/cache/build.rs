//! `cargo xtask cache build <name>`: runs a manifest's `[build]` and puts
//! what it made into the pack root, ready for `cache publish`.
//!
//! The command runs at the repository root in its own process group (ended
//! at `[build] timeout`, on Ctrl-C, and when warmstart dies), writing into
//! an empty staging directory beside `[pack] root` that `WARMSTART_BUILD_OUT`
//! names; only once it exited 0 is the staging directory swapped in for the
//! pack root (`unpack::swap_dir`, one rename). So a build that fails, times
//! out or is killed leaves the pack root exactly as it was. This module
//! never publishes and never writes a restore's target: `run` is the one
//! function `cache publish --missing` and a restore's write-back call to
//! make the artifact, and what happens to it next is theirs to decide.
//!
//! What they decide must first pass `publishable`: a key's pins read
//! committed content (`HEAD:<path>`), while a build reads the work tree, so
//! an artifact is published under a key only when HEAD and the key are the
//! ones taken before the build (`Before::take`) and `git status` shows no
//! change under any `[build] input`, before the build and after it. A build
//! that fails this check is still a good local build; it is never anyone
//! else's key.

use anyhow::{Context, Result};
use std::path::PathBuf;
use std::time::Duration;

use crate::cache::format::build::OUT_VAR;
use crate::cache::format::manifest::CacheManifest;
use crate::cli::cache::BuildArgs;
use crate::exit::{Code, fail};
use crate::process::runner::{self, End, Limits, Output};
use crate::repo::Repo;
use xshell::Shell;

/// How long a build's process group gets between SIGTERM and SIGKILL.
const GRACE: Duration = Duration::from_secs(10);

/// What one build did.
#[derive(Clone, Debug)]
pub struct Built {
    /// How long the command ran.
    pub duration: Duration,
    /// Its whole output (`<state>/logs/cache-build-<name>.log`).
    pub log: PathBuf,
}

/// The log of cache `name`'s last build.
pub fn log_path(repo: &Repo, name: &str) -> PathBuf {
    repo.state_dir()
        .join("logs")
        .join(format!("cache-build-{name}.log"))
}

/// `cargo xtask cache build NAME`.
pub fn run_cli(args: BuildArgs) -> Result<()> {
    let repo = Repo::from_cwd()?;
    let m = crate::cache::manifests::load(&repo, &args.name)?;
    let built = run(&repo, &m)?;
    if !crate::out::quiet() {
        println!(
            "built {} into {} in {} (log {}); publish it with `{} cache publish {}`",
            m.name,
            m.pack_root.display(),
            crate::clock::human(built.duration),
            built.log.display(),
            crate::invocation::command(),
            m.name
        );
    }
    Ok(())
}

/// Builds manifest `m`'s artifact into its pack root: runs `[build]
/// command` at `repo`'s root into a fresh staging directory beside the
/// pack root, then swaps the staging directory in whole. Its output goes to
/// stderr (unless `--quiet`) and to `log_path`.
///
/// Errors: exit 10 when the manifest has no `[build]`, when
/// `build.platforms` leaves this machine out, or when the command cannot
/// start; exit 11 when it fails or passes its timeout. In every error case
/// the pack root is as it was.
pub fn run(repo: &Repo, m: &CacheManifest) -> Result<Built> {
    let Some(b) = &m.build else {
        return Err(fail(
            Code::Config,
            format!(
                "cache {} has no [build] table in {}: add one (command, inputs, timeout; docs/caches.md, \"Building a missing key\") or make the artifact yourself",
                m.name,
                m.file.display()
            ),
        ));
    };
    b.allowed_here(&crate::cache::format::key::platform(), &m.file)
        .map_err(|why| {
            fail(
                Code::Config,
                format!("not building cache {}: {why}", m.name),
            )
        })?;
    let staging = crate::unpack::staging_dir_for(&m.pack_root).with_context(|| {
        format!(
            "making a staging directory beside {}",
            m.pack_root.display()
        )
    })?;
    let log = log_path(repo, &m.name);
    let mut cmd = std::process::Command::new(&b.command[0]);
    cmd.args(&b.command[1..])
        .current_dir(&repo.root)
        .env(OUT_VAR, &staging);
    // The thread that starts the build waits for it: a warmstart killed
    // outright takes the build's leader with it (its group gets SIGTERM).
    crate::process::group::die_with_parent(&mut cmd);
    let output = Output::Live {
        log: Some(log.clone()),
        tail: 4096,
    };
    let limits = Limits {
        timeout: b.timeout,
        grace: GRACE,
    };
    let outcome = match runner::run(cmd, limits, output) {
        Ok(o) => o,
        Err(e) => {
            let _ = crate::unpack::remove_staging(&staging);
            return Err(fail(
                Code::Config,
                format!(
                    "{e:#}: build.command in {} names a program this machine does not have; fix it or install the program",
                    m.file.display()
                ),
            ));
        }
    };
    if !outcome.end.success() {
        let _ = crate::unpack::remove_staging(&staging);
        let how = match outcome.end {
            End::Exited(c) => format!("exited {c}"),
            End::Signaled(s) => format!("was killed by signal {s}"),
            End::TimedOut => format!(
                "passed build.timeout ({}) and was ended",
                crate::clock::human(b.timeout)
            ),
            End::Interrupted(s) => format!("was interrupted (signal {s})"),
        };
        return Err(fail(
            Code::StepFailed,
            format!(
                "the build of cache {} {how}; {} is as it was; its output is in {}: {}",
                m.name,
                m.pack_root.display(),
                log.display(),
                runner::last_lines(&outcome.output, 3)
            ),
        ));
    }
    // The build may have removed or replaced its output directory: only a
    // real directory goes in, and whatever is there never stays behind.
    let is_dir = std::fs::symlink_metadata(&staging).is_ok_and(|md| md.is_dir());
    if !is_dir {
        let _ = std::fs::remove_file(&staging);
        return Err(fail(
            Code::StepFailed,
            format!(
                "the build of cache {} exited 0 but left no directory at {OUT_VAR} ({}): it must write into that directory, not remove or replace it; {} is as it was",
                m.name,
                staging.display(),
                m.pack_root.display()
            ),
        ));
    }
    if let Err(e) = crate::unpack::swap_dir(&staging, &m.pack_root) {
        let _ = crate::unpack::remove_staging(&staging);
        return Err(e.context(format!(
            "moving the build of cache {} into {}",
            m.name,
            m.pack_root.display()
        )));
    }
    Ok(Built {
        duration: outcome.duration,
        log,
    })
}

/// HEAD and the key, as they were before a build: what `publishable`
/// compares with afterwards.
#[derive(Clone, Debug)]
pub struct Before {
    /// `git rev-parse HEAD` (empty in a repository with no commit).
    pub head: String,
    /// The key today's pins gave.
    pub key: String,
}

impl Before {
    /// Takes HEAD now; `key` is the key computed for this build.
    pub fn take(sh: &Shell, repo: &Repo, key: &str) -> Before {
        Before {
            head: head(sh, repo),
            key: key.to_string(),
        }
    }
}

fn head(sh: &Shell, repo: &Repo) -> String {
    sh.cmd("git")
        .arg("-C")
        .arg(&repo.root)
        .args(["rev-parse", "--verify", "--quiet", "HEAD"])
        .quiet()
        .ignore_stderr()
        .read()
        .unwrap_or_default()
}

/// Whether what manifest `m`'s build made may be published under
/// `before.key`: `Err` says why not ("inputs differ from HEAD: <paths>",
/// "HEAD moved during the build", "the key changed during the build"). Call
/// it before the build (a dirty tree still builds, for this machine only)
/// and again after it, just before publishing. `cache publish --missing`
/// and a restore's write-back both use it; it never changes anything.
pub fn publishable(
    sh: &Shell,
    repo: &Repo,
    m: &CacheManifest,
    before: &Before,
) -> Result<(), String> {
    let inputs = m
        .build
        .as_ref()
        .map(|b| b.inputs.clone())
        .unwrap_or_default();
    if !inputs.is_empty() {
        let status = sh
            .cmd("git")
            .arg("-C")
            .arg(&repo.root)
            .args(["status", "--porcelain", "--untracked-files=all", "--"])
            .args(&inputs)
            .quiet()
            .ignore_stderr()
            .read()
            .map_err(|e| format!("cannot tell whether build.inputs differ from HEAD ({e})"))?;
        let paths: Vec<&str> = status.lines().filter_map(|l| l.get(3..)).collect();
        if !paths.is_empty() {
            return Err(format!(
                "inputs differ from HEAD: {}; commit them (or stash them) and build again to publish",
                paths.join(", ")
            ));
        }
    }
    let now = head(sh, repo);
    if now != before.head {
        return Err(format!(
            "HEAD moved during the build (from {} to {}), so the build may not be what either commit's key names",
            short(&before.head),
            short(&now)
        ));
    }
    let key = crate::cache::manifests::compute_key(sh, repo, m)
        .map_err(|e| format!("cannot compute the key again after the build ({e:#})"))?;
    if key.value != before.key {
        return Err(format!(
            "the key changed during the build (from {} to {})",
            before.key, key.value
        ));
    }
    Ok(())
}

fn short(commit: &str) -> &str {
    if commit.is_empty() {
        "no commit"
    } else {
        &commit[..commit.len().min(12)]
    }
}
