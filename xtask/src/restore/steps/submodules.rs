//! `submodules`: initialise the listed submodule paths, then check one sentinel per suite.
//!
//! The probe is a few `stat` calls: each path has its `.git`, each sentinel
//! exists. When something is missing it runs `git submodule update --init`
//! for the listed paths only, and then reports every sentinel that is still
//! absent as `MISSING <suite> <path> -> breaks: <what>`, so that the person
//! reading knows which test suite or tool will not work. It never forces a
//! checkout: local changes inside a submodule are never overwritten.

use anyhow::Result;

use super::{Ctx, Outcome, Probe};
use crate::restore::plan::{Sentinel, Submodules};
use crate::restore::proc::{self, Log};

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

pub fn run(ctx: &Ctx, s: &Submodules, log: &mut Log) -> Result<Outcome> {
    let root = &ctx.repo.root;
    let paths = &s.paths;
    // git refuses file:// and local-path submodule URLs unless asked; the
    // manifest opts in for repositories whose submodules live on this machine.
    let allow: &[&str] = if s.allow_file_protocol {
        &["-c", "protocol.file.allow=always"]
    } else {
        &[]
    };
    let mut cmd: std::process::Command = xshell::cmd!(
        ctx.sh,
        "git {allow...} -C {root} submodule update --init -- {paths...}"
    )
    .into();
    cmd.env("GIT_TERMINAL_PROMPT", "0");
    let exit = proc::run_logged(&mut cmd, log, Some(s.timeout))?;
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
            "{} submodules initialised, {} sentinels ok",
            paths.len(),
            s.sentinels.len()
        )));
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
    Ok(Outcome::failed(why.join("; ")).with_warnings(missing))
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
