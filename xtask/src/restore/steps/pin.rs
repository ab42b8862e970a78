//! `pin`: a tool's `--version` must match a pattern, else a named fix is applied.
//!
//! Running `tool --version` costs a process (tens of ms for an interpreter),
//! so the warm probe does not: a stamp records the resolved executable's
//! identity (device, inode, size, mtime) and the pattern it matched. The same
//! file and pattern means the same answer. Anything else runs the real
//! check. Fixes: a symlink, or one symlink in each of several places
//! (replacing only a symlink, never a real file), or a command. After a fix
//! the check runs again; it must match.
//!
//! The tool is looked up as a shell will find it once it evaluated
//! `restore env`: the directories the plan exports (`[env]`, then the steps
//! up to this one, in file order) in front of PATH. Checking the PATH restore
//! itself runs with would pass or fail a tool the user never runs.

use super::command::Cmdline;
use crate::cache::format::manifest::expand_path;
use crate::clock::DurationSpec;
use crate::repo::Repo;
use crate::restore::fields::timeout;
use anyhow::{Context, Result};
use anyhow::{anyhow, bail};
use serde::{Deserialize, Serialize};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::common::{Ctx, Outcome, Probe};
use crate::restore::proc::{self, Log};
use crate::restore::state;

/// A tool whose `--version` output must match `expect`, else `fix` is applied.
#[derive(Debug)]
pub struct Pin {
    /// A name looked up in PATH, or a path (contains `/`).
    pub tool: String,
    pub args: Vec<String>,
    pub expect: regex_lite::Regex,
    pub timeout: Duration,
    pub fix: Option<Fix>,
    /// The plan's PATH exports this step's shell will see in front of PATH
    /// (set by `plan::parse` once every step's exports are known).
    pub search: Vec<PathBuf>,
}

#[derive(Debug)]
pub enum Fix {
    /// Make each of `links` a symlink to `target` (replacing a link
    /// already there), in order.
    Symlink {
        links: Vec<PathBuf>,
        target: PathBuf,
    },
    Run(Cmdline),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPin {
    tool: String,
    args: Option<Vec<String>>,
    expect: String,
    timeout: Option<DurationSpec>,
    fix: Option<RawFix>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawFix {
    symlink: Option<OneOrMore>,
    target: Option<String>,
    run: Option<Cmdline>,
}

/// One path, or a list of them.
#[derive(Deserialize)]
#[serde(untagged)]
pub enum OneOrMore {
    One(String),
    More(Vec<String>),
}

pub fn resolve_pin(repo: &Repo, r: RawPin) -> Result<Pin> {
    if r.tool.is_empty() {
        bail!("`tool` is empty");
    }
    let tool = if r.tool.contains('/') {
        expand_path(repo, &r.tool)?.display().to_string()
    } else {
        r.tool
    };
    let expect = regex_lite::Regex::new(&r.expect)
        .map_err(|e| anyhow!("`expect` = {:?} is not a valid pattern: {e}", r.expect))?;
    let fix = match r.fix {
        None => None,
        Some(RawFix {
            symlink: Some(links),
            target: Some(target),
            run: None,
        }) => {
            let links = match links {
                OneOrMore::One(l) => vec![l],
                OneOrMore::More(ls) => ls,
            };
            if links.is_empty() {
                bail!("`fix.symlink` is an empty list: name at least one link to make");
            }
            let links = links
                .iter()
                .map(|l| expand_path(repo, l))
                .collect::<Result<Vec<_>>>()?;
            Some(Fix::Symlink {
                links,
                target: expand_path(repo, &target)?,
            })
        }
        Some(RawFix {
            symlink: None,
            target: None,
            run: Some(run),
        }) => {
            run.check("fix.run")?;
            Some(Fix::Run(run))
        }
        Some(_) => bail!(
            "`fix` must be either `{{ symlink = LINK or [LINKS], target = TARGET }}` or `{{ run = COMMAND }}`"
        ),
    };
    Ok(Pin {
        tool,
        args: r.args.unwrap_or_else(|| vec!["--version".into()]),
        expect,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(10))?,
        fix,
        search: Vec::new(),
    })
}

#[derive(Serialize, Deserialize, PartialEq)]
struct Stamp {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    expect: String,
    version: String,
}

/// The executable `tool` names: a path as given, else the first in the
/// plan's exported directories and then PATH, as a shell finds it.
fn resolve(tool: &str, search: &[PathBuf]) -> Option<PathBuf> {
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    search
        .iter()
        .cloned()
        .chain(std::env::split_paths(&path))
        .map(|d| d.join(tool))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
}

/// PATH as the shell that evaluated `restore env` has it, for the tool's
/// own run (a wrapper script finds its interpreter the same way).
fn shell_path(search: &[PathBuf]) -> std::ffi::OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(search.iter().cloned().chain(std::env::split_paths(&path))).unwrap_or(path)
}

fn stamp_for(path: &Path, p: &Pin, version: &str) -> Option<Stamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(Stamp {
        path: path.to_path_buf(),
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        expect: p.expect.as_str().to_string(),
        version: version.to_string(),
    })
}

pub fn probe(ctx: &Ctx, name: &str, p: &Pin) -> Probe {
    let Some(path) = resolve(&p.tool, &p.search) else {
        return Probe::Needed(format!("{} is not found", p.tool));
    };
    let stamp = state::read_stamp::<Stamp>(ctx.paths, name);
    Probe::Needed(match stamp {
        Some(s) if Some(&s) == stamp_for(&path, p, &s.version).as_ref() => {
            return Probe::warm(format!("{}: {}", p.tool, s.version));
        }
        None => format!("{} not checked yet in this clone", path.display()),
        Some(s) if s.path != path => format!(
            "{} is now {} (checked: {})",
            p.tool,
            path.display(),
            s.path.display()
        ),
        Some(s) if s.expect != p.expect.as_str() => {
            format!("{}: `expect` changed since it was checked", path.display())
        }
        Some(_) => format!("{} changed since it was checked", path.display()),
    })
}

/// Runs the version command: `Ok((path, first line))`, or why it could not.
fn check(p: &Pin, log: &mut Log) -> Result<(PathBuf, String), String> {
    let path = resolve(&p.tool, &p.search).ok_or_else(|| format!("{} is not found", p.tool))?;
    let mut cmd = Command::new(&path);
    cmd.args(&p.args).env("PATH", shell_path(&p.search));
    log.line(&format!("$ {}", proc::show(&cmd)));
    let (exit, out, err) =
        proc::capture(&mut cmd, Some(p.timeout)).map_err(|e| format!("{e:#}"))?;
    log.line(&format!(
        "-> {}: {}{}",
        exit.describe(),
        out.trim(),
        err.trim()
    ));
    if !exit.success() {
        return Err(format!(
            "`{} {}` {}: {}",
            p.tool,
            p.args.join(" "),
            exit.describe(),
            proc::last_line(&err)
        ));
    }
    // Some tools print their version on stderr.
    let text = if out.trim().is_empty() { err } else { out };
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("")
        .to_string();
    Ok((path, first))
}

fn apply(fix: &Fix, log: &mut Log) -> Result<String> {
    match fix {
        Fix::Symlink { links, target } => {
            // Every place is checked before any link is made, so a real file
            // in the second place leaves the first untouched too.
            if let Some(link) = links
                .iter()
                .find(|l| std::fs::symlink_metadata(l).is_ok_and(|m| !m.file_type().is_symlink()))
            {
                anyhow::bail!(
                    "{} exists and is not a symlink: not replacing it (move it away, or change `fix.symlink`)",
                    link.display()
                );
            }
            for link in links {
                symlink_onto(link, target)?;
                log.line(&format!("fix: {} -> {}", link.display(), target.display()));
            }
            let shown: Vec<String> = links.iter().map(|l| l.display().to_string()).collect();
            Ok(format!(
                "symlink {} -> {}",
                shown.join(", "),
                target.display()
            ))
        }
        Fix::Run(c) => {
            let (program, args) = c.program_and_args();
            let mut cmd = Command::new(program);
            cmd.args(args);
            let exit = proc::run_logged(&mut cmd, log, None)?;
            if !exit.success() {
                anyhow::bail!(
                    "fix `{}` {}: {}",
                    c.display(),
                    exit.describe(),
                    proc::last_log_line(log)
                );
            }
            Ok(format!("ran `{}`", c.display()))
        }
    }
}

/// Makes `link` a symlink to `target` through a rename, so a reader sees
/// the old link or the new one, never none.
fn symlink_onto(link: &Path, target: &Path) -> Result<()> {
    let dir = link.parent().context("the fix's link has a parent")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let tmp = dir.join(format!(".warmstart-link-{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    std::fs::rename(&tmp, link).with_context(|| format!("renaming onto {}", link.display()))
}

pub fn run(ctx: &Ctx, name: &str, p: &Pin, log: &mut Log) -> Result<Outcome> {
    let pattern = p.expect.as_str();
    let first = check(p, log);
    if let Ok((path, v)) = &first
        && p.expect.is_match(v)
    {
        if let Some(s) = stamp_for(path, p, v) {
            state::write_stamp(ctx.paths, name, &s)?;
        }
        return Ok(Outcome::done(format!("{}: {v}", p.tool)));
    }
    let said = match &first {
        Ok((_, v)) => format!("says {v:?}"),
        Err(why) => why.clone(),
    };
    let Some(fix) = &p.fix else {
        state::clear_stamp(ctx.paths, name);
        return Ok(Outcome::failed(format!(
            "{} {said}, expected /{pattern}/; no `fix` in the manifest",
            p.tool
        )));
    };
    let applied = apply(fix, log)?;
    match check(p, log) {
        Ok((path, v)) if p.expect.is_match(&v) => {
            if let Some(s) = stamp_for(&path, p, &v) {
                state::write_stamp(ctx.paths, name, &s)?;
            }
            Ok(Outcome::done(format!("fixed ({applied}): {}: {v}", p.tool)))
        }
        after => {
            state::clear_stamp(ctx.paths, name);
            let now = match after {
                Ok((path, v)) => format!("{} says {v:?}", path.display()),
                Err(why) => why,
            };
            Ok(Outcome::failed(format!(
                "{} {said}, expected /{pattern}/; after the fix ({applied}) {now}",
                p.tool
            )))
        }
    }
}
