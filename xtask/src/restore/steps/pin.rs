//! `pin`: a tool's `--version` must match a pattern, else a named fix is applied.
//!
//! Running `tool --version` costs a process (tens of ms for an interpreter),
//! so the warm probe does not: a stamp records the resolved executable's
//! identity (device, inode, size, mtime) and the pattern it matched. The same
//! file and pattern means the same answer. Anything else runs the real
//! check. Fixes: a symlink (replacing only a symlink, never a real file), or a
//! command. After a fix the check runs again; it must match.

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
}

#[derive(Debug)]
pub enum Fix {
    /// Make `link` a symlink to `target` (replacing a link already there).
    Symlink {
        link: PathBuf,
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
    symlink: Option<String>,
    target: Option<String>,
    run: Option<Cmdline>,
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
            symlink: Some(link),
            target: Some(target),
            run: None,
        }) => Some(Fix::Symlink {
            link: expand_path(repo, &link)?,
            target: expand_path(repo, &target)?,
        }),
        Some(RawFix {
            symlink: None,
            target: None,
            run: Some(run),
        }) => {
            run.check("fix.run")?;
            Some(Fix::Run(run))
        }
        Some(_) => bail!(
            "`fix` must be either `{{ symlink = LINK, target = TARGET }}` or `{{ run = COMMAND }}`"
        ),
    };
    Ok(Pin {
        tool,
        args: r.args.unwrap_or_else(|| vec!["--version".into()]),
        expect,
        timeout: timeout(&r.timeout, "timeout", Duration::from_secs(10))?,
        fix,
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

/// The executable `tool` names: a path as given, else the first in PATH.
fn resolve(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return p.is_file().then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0))
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
    let Some(path) = resolve(&p.tool) else {
        return Probe::Needed(format!("{} is not found", p.tool));
    };
    match state::read_stamp::<Stamp>(ctx.paths, name) {
        Some(s) if Some(&s) == stamp_for(&path, p, &s.version).as_ref() => {
            Probe::warm(format!("{}: {}", p.tool, s.version))
        }
        _ => Probe::Needed(format!("{} not checked since it changed", path.display())),
    }
}

/// Runs the version command: `Ok((path, first line))`, or why it could not.
fn check(p: &Pin, log: &mut Log) -> Result<(PathBuf, String), String> {
    let path = resolve(&p.tool).ok_or_else(|| format!("{} is not found", p.tool))?;
    let mut cmd = Command::new(&path);
    cmd.args(&p.args);
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
        Fix::Symlink { link, target } => {
            if let Ok(m) = std::fs::symlink_metadata(link)
                && !m.file_type().is_symlink()
            {
                anyhow::bail!(
                    "{} exists and is not a symlink: not replacing it (move it away, or change `fix.symlink`)",
                    link.display()
                );
            }
            let dir = link.parent().context("the fix's link has a parent")?;
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let tmp = dir.join(format!(".warmstart-link-{}", std::process::id()));
            let _ = std::fs::remove_file(&tmp);
            std::os::unix::fs::symlink(target, &tmp)
                .with_context(|| format!("creating {}", tmp.display()))?;
            std::fs::rename(&tmp, link)
                .with_context(|| format!("renaming onto {}", link.display()))?;
            log.line(&format!("fix: {} -> {}", link.display(), target.display()));
            Ok(format!(
                "symlink {} -> {}",
                link.display(),
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
