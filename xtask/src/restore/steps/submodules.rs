//! `submodules`: initialise the listed submodule paths, then check one sentinel per suite.
//!
//! The probe is a few `stat` calls: each path has its `.git`, each sentinel
//! exists. When something is missing it runs `git submodule update --init`
//! for the listed paths only, and then reports every sentinel that is still
//! absent as `MISSING <suite> <path> -> breaks: <what>`, so that the person
//! reading knows which test suite or tool will not work. It never forces a
//! checkout: local changes inside a submodule are never overwritten.
//!
//! `jobs` submodules are fetched at once (`--jobs`), and `shallow = true`
//! asks for `--depth 1`. A server that will not serve the recorded commit
//! by id refuses that when the commit is not a branch tip; then the shallow
//! clones it left are deepened (`fetch --unshallow`, which only adds
//! objects) and updated again without a depth, and a warning says so.

use crate::clock::DurationSpec;
use crate::repo::Repo;
use crate::restore::fields::{repo_relative, shown, timeout};
use anyhow::Result;
use anyhow::bail;
use serde::Deserialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::common::{Ctx, Outcome, Probe};
use crate::restore::proc::{self, Log};

/// `git submodule update --init` of the listed paths, then one sentinel file per suite.
#[derive(Debug)]
pub struct Submodules {
    /// Paths relative to the repository root, as `git submodule` takes them.
    pub paths: Vec<String>,
    pub sentinels: Vec<Sentinel>,
    /// Allow `file://` and local-path submodule URLs (git refuses them by
    /// default since 2.38.1 for submodules).
    pub allow_file_protocol: bool,
    pub timeout: Duration,
    /// Submodules fetched at once (`git submodule update --jobs`).
    pub jobs: u32,
    /// `--depth 1`, with a full fetch where the server refuses it.
    pub shallow: bool,
}

#[derive(Debug)]
pub struct Sentinel {
    pub suite: String,
    /// As written (relative to the root), for the MISSING line.
    pub path: String,
    pub abs: PathBuf,
    /// What stops working without it: the consumer named in MISSING lines.
    pub breaks: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSubmodules {
    paths: Vec<String>,
    #[serde(default)]
    sentinel: Vec<RawSentinel>,
    #[serde(default)]
    allow_file_protocol: bool,
    timeout: Option<DurationSpec>,
    // Values, not types: serde's "expected i64" would not name the field.
    jobs: Option<toml::Value>,
    shallow: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawSentinel {
    suite: String,
    path: String,
    breaks: String,
}

pub fn resolve_submodules(repo: &Repo, r: RawSubmodules) -> Result<Submodules> {
    if r.paths.is_empty() {
        bail!("`paths` is empty: list the submodule paths to initialise");
    }
    let paths = r
        .paths
        .iter()
        .map(|p| repo_relative("paths", p))
        .collect::<Result<Vec<_>>>()?;
    let mut sentinels = Vec::new();
    for s in r.sentinel {
        let path = repo_relative("sentinel.path", &s.path)?;
        if s.suite.is_empty() || s.breaks.is_empty() {
            bail!(
                "sentinel {path:?} needs a non-empty `suite` and `breaks` (what stops working without it)"
            );
        }
        sentinels.push(Sentinel {
            suite: s.suite,
            abs: repo.root.join(&path),
            path,
            breaks: s.breaks,
        });
    }
    // Default: every listed submodule at once, at most 8 (each is one
    // clone talking to the server; git's own default is 1, one by one).
    let jobs = match r.jobs {
        None => paths.len().clamp(1, 8) as u32,
        Some(toml::Value::Integer(n)) if (1..=64).contains(&n) => n as u32,
        Some(v) => bail!(
            "`jobs` = {} must be a number of submodules fetched at once, 1 to 64",
            shown(&v)
        ),
    };
    let shallow = match r.shallow {
        None => false,
        Some(toml::Value::Boolean(b)) => b,
        Some(v) => bail!("`shallow` = {} must be true or false", shown(&v)),
    };
    Ok(Submodules {
        paths,
        sentinels,
        allow_file_protocol: r.allow_file_protocol,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(600))?,
        jobs,
        shallow,
    })
}

pub fn probe(ctx: &Ctx, s: &Submodules) -> Probe {
    if let Some(p) = s
        .paths
        .iter()
        .find(|p| !ctx.repo.root.join(p).join(".git").exists())
    {
        return Probe::Needed(format!("submodule {p} is not initialised"));
    }
    if let Some(x) = s.sentinels.iter().find(|x| !x.abs.exists()) {
        return Probe::Needed(format!("sentinel {} is missing", x.path));
    }
    Probe::warm(format!(
        "{} submodules present, {} sentinels ok",
        s.paths.len(),
        s.sentinels.len()
    ))
}

/// `git submodule update --init --jobs N [EXTRA] -- PATHS`, bounded by `timeout`.
fn update(
    ctx: &Ctx,
    s: &Submodules,
    log: &mut Log,
    extra: &[&str],
    paths: &[String],
    timeout: Duration,
) -> Result<proc::Exit> {
    let root = &ctx.repo.root;
    // git refuses file:// and local-path submodule URLs unless asked; the
    // manifest opts in for repositories whose submodules live on this machine.
    let allow: &[&str] = if s.allow_file_protocol {
        &["-c", "protocol.file.allow=always"]
    } else {
        &[]
    };
    let jobs = s.jobs.to_string();
    let mut cmd: std::process::Command = xshell::cmd!(
        ctx.sh,
        "git {allow...} -C {root} submodule update --init --jobs {jobs} {extra...} -- {paths...}"
    )
    .into();
    cmd.env("GIT_TERMINAL_PROMPT", "0");
    proc::run_logged(&mut cmd, log, Some(timeout))
}

/// The listed paths whose work tree is not at the commit the superproject
/// records (`git submodule status`: `-` not initialised, `+` another commit,
/// `U` conflicts); all of them when git cannot say.
fn not_at_recorded_commit(ctx: &Ctx, paths: &[String]) -> Vec<String> {
    let root = &ctx.repo.root;
    let out = xshell::cmd!(ctx.sh, "git -C {root} submodule status -- {paths...}")
        .quiet()
        .ignore_stderr()
        .read();
    let Ok(out) = out else {
        return paths.to_vec();
    };
    let ok: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix(' '))
        .filter_map(|rest| rest.split_once(' ').map(|(_sha, p)| p))
        .map(|p| p.rsplit_once(" (").map_or(p, |(path, _)| path))
        .collect();
    paths
        .iter()
        .filter(|p| !ok.contains(&p.as_str()))
        .cloned()
        .collect()
}

/// A submodule that was cloned but never checked out: its git dir has no
/// index. git leaves such clones when an update stops at another
/// submodule's failure, and `git submodule status` shows them as fine
/// (HEAD is the recorded commit) although their work tree is empty.
fn never_checked_out(ctx: &Ctx, path: &str) -> bool {
    let dir = ctx.repo.root.join(path);
    if !dir.join(".git").exists() {
        return false;
    }
    xshell::cmd!(ctx.sh, "git -C {dir} rev-parse --git-path index")
        .quiet()
        .ignore_stderr()
        .read()
        .is_ok_and(|index| !dir.join(index.trim()).exists())
}

/// After a refused `--depth 1`: deepen the shallow clones it left
/// (`fetch --unshallow` only adds objects), then update those paths again
/// without a depth. Returns the new exit and the paths fetched in full.
/// A clone that was never checked out is updated with `--force`: with no
/// index there is no local change that a forced checkout could lose.
fn fetch_in_full(
    ctx: &Ctx,
    s: &Submodules,
    log: &mut Log,
    timeout: Duration,
) -> Result<Option<(proc::Exit, Vec<String>)>> {
    let started = Instant::now();
    let behind = not_at_recorded_commit(ctx, &s.paths);
    let blank: Vec<String> = s
        .paths
        .iter()
        .filter(|p| never_checked_out(ctx, p))
        .cloned()
        .collect();
    let redo: Vec<String> = s
        .paths
        .iter()
        .filter(|p| behind.contains(p) || blank.contains(p))
        .cloned()
        .collect();
    if redo.is_empty() {
        return Ok(None);
    }
    log.line(&format!(
        "shallow update failed; fetching in full: {}",
        redo.join(", ")
    ));
    let allow: &[&str] = if s.allow_file_protocol {
        &["-c", "protocol.file.allow=always"]
    } else {
        &[]
    };
    let left = |started: Instant| timeout.saturating_sub(started.elapsed());
    for p in &redo {
        let dir = ctx.repo.root.join(p);
        let shallow = xshell::cmd!(ctx.sh, "git -C {dir} rev-parse --is-shallow-repository")
            .quiet()
            .ignore_stderr()
            .read()
            .is_ok_and(|o| o.trim() == "true");
        if shallow {
            if left(started).is_zero() {
                return Ok(Some((proc::Exit::TimedOut(timeout), redo)));
            }
            let mut cmd: std::process::Command =
                xshell::cmd!(ctx.sh, "git {allow...} -C {dir} fetch --unshallow").into();
            cmd.env("GIT_TERMINAL_PROMPT", "0");
            proc::run_logged(&mut cmd, log, Some(left(started)))?;
        }
    }
    let plain: Vec<String> = redo
        .iter()
        .filter(|p| !blank.contains(p))
        .cloned()
        .collect();
    let mut last = None;
    for (extra, paths) in [(&[][..], &plain), (&["--force"][..], &blank)] {
        if paths.is_empty() {
            continue;
        }
        if left(started).is_zero() {
            return Ok(Some((proc::Exit::TimedOut(timeout), redo)));
        }
        let exit = update(ctx, s, log, extra, paths, left(started))?;
        if !exit.success() {
            return Ok(Some((exit, redo)));
        }
        last = Some(exit);
    }
    Ok(last.map(|exit| (exit, redo)))
}

pub fn run(ctx: &Ctx, s: &Submodules, log: &mut Log) -> Result<Outcome> {
    let root = &ctx.repo.root;
    let paths = &s.paths;
    let started = Instant::now();
    let depth: &[&str] = if s.shallow { &["--depth", "1"] } else { &[] };
    let mut exit = update(ctx, s, log, depth, paths, s.timeout)?;
    let mut in_full: Vec<String> = Vec::new();
    // A server that does not serve a commit by id (protocol v0 without
    // `uploadpack.allowReachableSHA1InWant`) refuses a shallow fetch of a
    // recorded commit that is not a branch tip; the full fetch gets it.
    if s.shallow && matches!(exit, proc::Exit::Status(ref st) if !st.success()) {
        let left = s.timeout.saturating_sub(started.elapsed());
        if let Some((again, behind)) = fetch_in_full(ctx, s, log, left)? {
            exit = again;
            in_full = behind;
        }
    }
    let mut notes = Vec::new();
    if !in_full.is_empty() {
        notes.push(format!(
            "WARNING: shallow fetch refused for {} (the server does not serve the recorded commit by id: uploadpack.allowReachableSHA1InWant, or protocol v0): fetched in full",
            in_full.join(", ")
        ));
    }
    let mode = match (s.shallow, in_full.is_empty()) {
        (false, _) => format!("{} at once", s.jobs),
        (true, true) => format!("{} at once, shallow", s.jobs),
        (true, false) => format!(
            "{} at once, shallow refused for {}: fetched in full",
            s.jobs,
            in_full.join(", ")
        ),
    };
    let git_error = (!exit.success()).then(|| {
        format!(
            "`git submodule update --init` {}: {}",
            exit.describe(),
            proc::last_log_line(log)
        )
    });

    let uninit: Vec<&String> = paths
        .iter()
        .filter(|p| !root.join(p).join(".git").exists())
        .collect();
    let absent: Vec<&Sentinel> = s.sentinels.iter().filter(|x| !x.abs.exists()).collect();
    let missing: Vec<String> = absent
        .iter()
        .map(|x| format!("MISSING {} {} -> breaks: {}", x.suite, x.path, x.breaks))
        .collect();
    for m in &missing {
        log.line(m);
    }
    if missing.is_empty() && uninit.is_empty() && git_error.is_none() {
        return Ok(Outcome::done(format!(
            "{} submodules initialised ({mode}), {} sentinels ok",
            paths.len(),
            s.sentinels.len()
        ))
        .with_warnings(notes));
    }
    let mut why = Vec::new();
    if !missing.is_empty() {
        why.push(missing_summary(&absent));
    }
    if !uninit.is_empty() {
        why.push(format!(
            "not initialised: {}",
            uninit
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    why.extend(git_error);
    notes.extend(missing);
    Ok(Outcome::failed(why.join("; ")).with_warnings(notes))
}

/// How many sentinels the WHAT column names before it says "and N more":
/// the full list is on stderr and in the log, one MISSING line each.
const NAMED: usize = 3;

/// `2 sentinel(s) missing: alpha (vendor/alpha/run.sh), beta (...)`, for
/// the table's WHAT column.
fn missing_summary(absent: &[&Sentinel]) -> String {
    let mut named: Vec<String> = absent
        .iter()
        .take(NAMED)
        .map(|x| format!("{} ({})", x.suite, x.path))
        .collect();
    if absent.len() > NAMED {
        named.push(format!("and {} more", absent.len() - NAMED));
    }
    format!("{} sentinel(s) missing: {}", absent.len(), named.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn sentinel(i: usize) -> Sentinel {
        Sentinel {
            suite: format!("s{i}"),
            path: format!("v/s{i}/run"),
            abs: PathBuf::from(format!("/r/v/s{i}/run")),
            breaks: "make".into(),
        }
    }

    #[test]
    fn the_summary_names_the_first_few_and_counts_the_rest() {
        let all: Vec<Sentinel> = (1..=5).map(sentinel).collect();
        let refs: Vec<&Sentinel> = all.iter().collect();
        assert_eq!(
            missing_summary(&refs[..2]),
            "2 sentinel(s) missing: s1 (v/s1/run), s2 (v/s2/run)"
        );
        assert_eq!(
            missing_summary(&refs),
            "5 sentinel(s) missing: s1 (v/s1/run), s2 (v/s2/run), s3 (v/s3/run), and 2 more"
        );
    }
}
