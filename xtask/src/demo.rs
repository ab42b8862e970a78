//! `cargo xtask demo`: the main job end to end on a local default, with no setup.
//!
//! Everything happens in a fresh scratch directory: a bare origin configured
//! like a hosting server, a repository with its own `cache-manifests/`, a
//! publish of a real directory, a fresh clone, a restore into it, and a
//! comparison of the restored tree with the source by the digest of their
//! deterministic tars (content, modes, link targets, hardlinks). It calls the
//! same library functions as `cache publish` and `cache restore`.
//!
//! The demo never writes outside its scratch directory and never reads the
//! current repository: it works from any directory.

use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use xshell::{Shell, cmd};

use crate::cache::human_bytes;
use crate::cache::publish::pack;
use crate::cache::publish::{self, Request};
use crate::cache::restore::{self, RestoreOptions};
use crate::cli::demo::DemoArgs;
use crate::clock;
use crate::exit::{Code, fail};
use crate::repo::Repo;

/// The `--json` output.
#[derive(Debug, Serialize)]
struct DemoSummary {
    source: PathBuf,
    scratch: PathBuf,
    kept: bool,
    entries: u64,
    file_bytes: u64,
    key: String,
    branch: String,
    commit: Option<String>,
    chunk_count: usize,
    compressed_bytes: u64,
    tar_sha256: String,
    restored_tar_sha256: String,
    equal: bool,
    timings_ms: BTreeMap<&'static str, u64>,
}

/// `cargo xtask demo`.
pub fn run(sh: &Shell, args: DemoArgs) -> Result<()> {
    let source = match &args.source {
        Some(s) => s.clone(),
        None => default_source(sh)?,
    };
    let source = std::fs::canonicalize(&source).map_err(|e| {
        fail(
            Code::NotFound,
            format!(
                "cannot publish {}: {e}: pass --source DIR",
                source.display()
            ),
        )
    })?;
    if !source.is_dir() {
        return Err(fail(
            Code::Config,
            format!("{} is not a directory: pass --source DIR", source.display()),
        ));
    }
    let text = source.to_string_lossy();
    if text.contains('$') || text.contains('\n') {
        return Err(fail(
            Code::Config,
            format!(
                "{} contains '$' or a newline, which cache manifests cannot name: pass another --source",
                source.display()
            ),
        ));
    }
    let scratch = Scratch::new(args.keep)?;
    let result = demo(sh, &args, &source, &scratch.path);
    if args.keep && !crate::out::quiet() {
        eprintln!("kept the scratch directory {}", scratch.path.display());
    }
    let summary = result?;
    if args.json {
        crate::contract::document(&summary);
    }
    Ok(())
}

fn default_source(sh: &Shell) -> Result<PathBuf> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let sysroot = cmd!(sh, "{rustc} --print sysroot")
        .quiet()
        .ignore_stderr()
        .read()
        .map_err(|_| {
            fail(
                Code::NotFound,
                "cannot run `rustc --print sysroot` to pick the demo's source directory: pass --source DIR",
            )
        })?;
    Ok(PathBuf::from(sysroot).join("lib/rustlib"))
}

/// The scratch directory, removed when dropped unless kept.
struct Scratch {
    path: PathBuf,
    keep: bool,
}

impl Scratch {
    fn new(keep: bool) -> Result<Scratch> {
        let path = std::env::temp_dir().join(format!(
            "warmstart-demo-{}-{}",
            std::process::id(),
            clock::now_ms()
        ));
        std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Scratch { path, keep })
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// The words of the demo: a narrative on stdout, or nothing with --json.
struct Say {
    on: bool,
}

impl Say {
    fn line(&self, s: impl AsRef<str>) {
        if self.on {
            println!("{}", s.as_ref());
        }
    }
}

fn demo(sh: &Shell, args: &DemoArgs, source: &Path, scratch: &Path) -> Result<DemoSummary> {
    let say = Say { on: !args.json };
    let mut timings = BTreeMap::new();
    let plan = pack::plan_tree(source, false, &pack::Rules::all())?;
    introduce(&say, source, scratch, &plan, args.keep);
    let origin = scratch.join("origin.git");
    let work = scratch.join("work");
    let clone = scratch.join("clone");
    set_up_repositories(sh, &say, source, &origin, &work)?;
    let published = publish_twice(sh, &say, &work, args.json, &mut timings)?;
    restore_twice(sh, &say, &origin, &clone, args.json, &mut timings)?;
    say.line("7. compare the restored tree with the source (digest of their deterministic tars)");
    let t = Instant::now();
    let target = clone.join("restored");
    let a = pack::write_tar(&plan, std::io::sink(), &mut |_| {})?;
    let b_plan = pack::plan_tree(&target, false, &pack::Rules::all())?;
    let b = pack::write_tar(&b_plan, std::io::sink(), &mut |_| {})?;
    timings.insert("compare", t.elapsed());
    let equal = a == b && published.tar_sha256.as_deref() == Some(a.sha256.as_str());
    if !equal {
        return Err(fail(
            Code::Verify,
            format!(
                "the restored tree {} differs from the source {} (tar sha256 {} vs {}; published {})",
                target.display(),
                source.display(),
                b.sha256,
                a.sha256,
                published.tar_sha256.as_deref().unwrap_or("?")
            ),
        ));
    }
    say.line(format!(
        "   equal: {} entries, tar sha256 {}",
        a.entries, a.sha256
    ));
    print_timings_and_next_steps(&say, &timings);

    Ok(DemoSummary {
        source: source.to_path_buf(),
        scratch: scratch.to_path_buf(),
        kept: args.keep,
        entries: a.entries,
        file_bytes: plan.file_bytes,
        key: published.key.clone(),
        branch: published.branch.clone(),
        commit: published.commit.clone(),
        chunk_count: published.chunks.len(),
        compressed_bytes: published.compressed_size.unwrap_or(0),
        tar_sha256: a.sha256,
        restored_tar_sha256: b.sha256,
        equal,
        timings_ms: timings
            .iter()
            .map(|(step, d)| (*step, d.as_millis() as u64))
            .collect(),
    })
}

/// What the demo will do, and with which directories.
fn introduce(say: &Say, source: &Path, scratch: &Path, plan: &pack::Plan, keep: bool) {
    say.line(
        "warmstart demo: publish a real directory to a local origin, restore it into a fresh clone",
    );
    say.line("");
    say.line(format!(
        "source   {} ({} entries, {})",
        source.display(),
        plan.items.len(),
        human_bytes(plan.file_bytes)
    ));
    say.line(format!(
        "scratch  {}{}",
        scratch.display(),
        if keep {
            " (kept)"
        } else {
            " (removed at the end; --keep keeps it)"
        }
    ));
    say.line("");
}

/// Steps 1 and 2: a bare origin set up like a hosting server, and a work
/// repository with the demo's manifest pushed to it.
fn set_up_repositories(
    sh: &Shell,
    say: &Say,
    source: &Path,
    origin: &Path,
    work: &Path,
) -> Result<()> {
    let git_id = [
        "-c",
        "user.name=warmstart demo",
        "-c",
        "user.email=demo@localhost",
    ];
    say.line(
        "1. origin.git: a bare repository set up like a hosting server (receive.unpackLimit 1)",
    );
    cmd!(sh, "git init -q --bare -b main {origin}")
        .quiet()
        .run()?;
    cmd!(sh, "git --git-dir {origin} config receive.unpackLimit 1")
        .quiet()
        .run()?;

    say.line("2. work/: a repository with its own cache-manifests/demo.toml, pushed to origin");
    cmd!(sh, "git init -q -b main {work}").quiet().run()?;
    let manifest_text = demo_manifest(source);
    std::fs::create_dir_all(work.join("cache-manifests"))?;
    std::fs::write(work.join("cache-manifests/demo.toml"), &manifest_text)?;
    cmd!(sh, "git -C {work} add -A").quiet().run()?;
    cmd!(
        sh,
        "git {git_id...} -C {work} commit -q --no-verify -m 'Add the demo cache manifest'"
    )
    .quiet()
    .run()?;
    cmd!(sh, "git -C {work} remote add origin ../origin.git")
        .quiet()
        .run()?;
    cmd!(sh, "git -C {work} push -q --no-verify origin main")
        .quiet()
        .run()?;
    for line in manifest_text.lines() {
        say.line(format!("     | {line}"));
    }
    Ok(())
}

/// Steps 3 and 4: publish, then publish again, which must change nothing.
fn publish_twice(
    sh: &Shell,
    say: &Say,
    work: &Path,
    json: bool,
    timings: &mut BTreeMap<&'static str, Duration>,
) -> Result<publish::Summary> {
    say.line(format!(
        "3. {cmd} cache publish demo",
        cmd = crate::invocation::command()
    ));
    let work_repo = Repo::discover(work)?;
    let req = Request {
        name: "demo".into(),
        quiet: json,
        json: false,
        ..Request::default()
    };
    let t = Instant::now();
    let published = spaced(say, || publish::publish(sh, &work_repo, &req))?;
    timings.insert("publish", t.elapsed());

    say.line(format!(
        "4. {cmd} cache publish demo, again: nothing changed",
        cmd = crate::invocation::command()
    ));
    let t = Instant::now();
    let again = spaced(say, || publish::publish(sh, &work_repo, &req))?;
    timings.insert("publish_unchanged", t.elapsed());
    if again.status != "unchanged" {
        return Err(fail(
            Code::Verify,
            format!(
                "publishing the same directory twice gave {} instead of unchanged",
                again.status
            ),
        ));
    }
    Ok(published)
}

/// Steps 5 and 6: restore into a fresh clone, then again (warm).
fn restore_twice(
    sh: &Shell,
    say: &Say,
    origin: &Path,
    clone: &Path,
    json: bool,
    timings: &mut BTreeMap<&'static str, Duration>,
) -> Result<()> {
    say.line(format!(
        "5. git clone origin clone/, then {cmd} cache restore demo",
        cmd = crate::invocation::command()
    ));
    cmd!(sh, "git clone -q {origin} {clone}").quiet().run()?;
    let clone_repo = Repo::discover(clone)?;
    let opts = RestoreOptions {
        progress: !json && std::io::stderr().is_terminal(),
        live_steps: crate::restore::step_names,
        ..RestoreOptions::default()
    };
    // The table shows the time the restore measured and printed itself, so
    // that step 6's line and the table never disagree.
    let restored = restore::restore_named(sh, &clone_repo, "demo", &opts)?;
    timings.insert("restore", restored.duration);
    say.line(format!("   {}", restored.summary()));

    say.line(format!(
        "6. {cmd} cache restore demo, again: warm",
        cmd = crate::invocation::command()
    ));
    let warm = restore::restore_named(sh, &clone_repo, "demo", &opts)?;
    timings.insert("restore_warm", warm.duration);
    say.line(format!("   {}", warm.summary()));
    Ok(())
}

/// The table of step times, then how to use warmstart for real.
fn print_timings_and_next_steps(say: &Say, timings: &BTreeMap<&'static str, Duration>) {
    say.line("");
    say.line("| step | time |");
    say.line("|---|---:|");
    for (step, label) in [
        ("publish", "publish (pack, compress, push)"),
        (
            "publish_unchanged",
            "publish again (unchanged: no commit, no push)",
        ),
        (
            "restore",
            "restore into a fresh clone (fetch, verify, unpack)",
        ),
        ("restore_warm", "restore again (warm)"),
        ("compare", "compare with the source"),
    ] {
        say.line(format!(
            "| {label} | {} |",
            crate::clock::human(timings[step])
        ));
    }
    say.line("");
    say.line("Real use, in your repository (see docs/adopting.md):");
    say.line("  1. describe each cache in cache-manifests/<name>.toml (like the one above: key pins, pack root, restore path, gates)");
    say.line(format!(
        "  2. {cmd} cache publish <name>     # from CI, once the gates are green",
        cmd = crate::invocation::command()
    ));
    say.line(format!(
        "  3. {cmd} cache restore <name>     # at session start; a warm run is a no-op",
        cmd = crate::invocation::command()
    ));
    say.line("  4. no warmstart at hand? the cache branch's README.md restores it with git and coreutils alone");
}

/// Runs `f` (which prints its own lines), then a blank line.
fn spaced<T>(say: &Say, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let r = f();
    say.line("");
    r
}

/// The demo's manifest: the key is the platform and a literal, the pack
/// root is the source, the restore path is `restored` in the clone.
fn demo_manifest(source: &Path) -> String {
    let quote = |s: &str| serde_json::to_string(s).expect("a string serializes");
    let root = quote(&source.to_string_lossy());
    let name = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let description = quote(&format!("warmstart demo: a copy of {name}"));
    format!(
        r#"# The demo cache: one directory, keyed by platform.
[cache]
description = {description}

[[key]]
name = "demo"
literal = "v1"

[[key]]
name = "platform"
platform = true

[pack]
root = {root}

[restore]
path = "restored"
"#
    )
}
