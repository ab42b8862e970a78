//! Every command-line type of `cargo xtask`, one file per command group.
//!
//! Doc comments here are the `--help` text: write them for the reader who
//! has never seen warmstart. This module only describes arguments; it never
//! does any work (that is `crate::run` and the capability modules).

pub mod cache;
pub mod conda;
pub mod demo;
pub mod doctor;
pub mod examples;
pub mod gates;
pub mod init;
pub mod manual;
pub mod restore;
pub mod resume;

use clap::{Parser, Subcommand};

/// warmstart: make a fresh or recycled machine fully working again in
/// seconds, from caches kept in the git repository itself.
///
/// Run it as `warmstart <COMMAND>` (or `cargo xtask <COMMAND>` from an xtask
/// crate) inside any repository that has a `cache-manifests/` folder. Exit codes: docs/reference/exit-codes.md.
#[derive(Debug, Parser)]
// `name` and `bin_name` are set at run time to `crate::invocation::command()`.
#[command(name = "warmstart", version, propagate_version = true)]
#[command(max_term_width = 100)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// Print no progress and no informational lines on stderr; warnings
    /// and errors are still printed (so is stdout: a report, or `--json`).
    #[arg(long, short, global = true)]
    pub quiet: bool,
    /// Colour warmstart's `error:` and `warning:` lines: auto (only on a
    /// terminal, and not when NO_COLOR is set), always, or never
    #[arg(long, global = true, value_name = "WHEN", value_enum, default_value_t)]
    pub color: crate::out::ColorChoice,
}

/// The command tree as `--help` shows it: named `bin` (`warmstart` or
/// `cargo xtask`), with every command's examples (`examples`).
pub fn with_examples(cmd: clap::Command, bin: &str) -> clap::Command {
    examples::apply(cmd, bin)
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Cache branches: publish an artifact to an orphan branch of the
    /// repository's remote, and restore it on any machine, verified byte for byte.
    ///
    /// Each cache is described by `cache-manifests/<NAME>.toml`: what to pack,
    /// how its key is built, where it restores, and which gates a publish needs.
    Cache(cache::CacheArgs),
    /// The main job on a local default, no setup: publish a real directory to a
    /// scratch origin, restore it into a fresh clone, compare, and time it.
    ///
    /// In a scratch directory: a bare `origin.git` set up like a hosting server,
    /// a repository with its own `cache-manifests/demo.toml`, `cache publish`
    /// of a real directory (by default this machine's
    /// `$(rustc --print sysroot)/lib/rustlib`), a fresh clone, `cache restore`
    /// into it, and a byte-for-byte comparison with the source. Prints what
    /// happened, the timings, and the commands for real use. Touches nothing
    /// outside the scratch directory, which is removed at the end.
    Demo(demo::DemoArgs),
    /// Bring this machine back: run the steps of cache-manifests/restore.toml
    /// (each only when its probe says it is needed) and print what each did.
    Restore(restore::RestoreArgs),
    /// Which hosts the restore reaches, directly or through which proxy,
    /// with the status line each answered and what it means.
    Doctor(doctor::DoctorArgs),
    /// Gates: commands that must pass on a clean tree before a cache is
    /// published from it; run them, record them green, share the record.
    ///
    /// A gate is a named command in cache-manifests/gates.toml (fmt, clippy,
    /// test...). When it passes on a clean worktree, warmstart records it green
    /// for HEAD's tree id, not the commit: the same tree reached by another
    /// commit stays green, any other tree is not. The record lives in the ref
    /// refs/warmstart/gates/<tree-id>, so `gates push` and `gates fetch` share
    /// it between machines, and `cache publish` refuses a tree whose required
    /// gates are not green.
    Gates(gates::GatesArgs),
    /// The crash-resume index: record, look up and resume agent sessions.
    ///
    /// Which agent session ran on which terminal surface, so a crashed or
    /// recycled machine can resume it. The index is one JSON file shared with
    /// the JavaScript tool (same bytes, same lock directory `<index>.lock`):
    /// `--path FILE`, else `$CRASH_RESUME_INDEX_PATH`, else
    /// `$HOME/.golems/crash-resume-index.json`. A corrupt or unreadable index
    /// is never overwritten (exit 5; `record --reinit` moves it aside); the
    /// lock is waited on for 4 s (exit 3).
    Resume(resume::ResumeArgs),
    /// Inspect and unpack conda packages (`.conda`, `.tar.bz2`) safely,
    /// e.g. to put a newer tool than the OS ships into /usr/local.
    Conda(conda::CondaArgs),
    /// Set up warmstart in this repository: cache manifests, the bootstrap
    /// script, the CI workflow, the session-start hook.
    ///
    /// Writes what is missing: `cache-manifests/` (the binary cache that the
    /// bootstrap reads, `restore.toml`, a commented example cache,
    /// `gates.toml`), `tools/warmstart-bootstrap.sh`, the CI workflow
    /// (`.github/workflows/gates.yml`, `tools/ci-gates.sh`), and a
    /// `SessionStart` hook in `.claude/settings.json`; prints a dev container
    /// `postCreateCommand`. Each generated file carries a header with the
    /// generator's version and a digest of its body: one whose body no longer
    /// matches the digest is yours, and is reported and left alone. Rerunning
    /// is safe, and updates the files it generated.
    Init(init::InitArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or
    /// PowerShell, made from the same command tree as `--help`.
    ///
    /// For `warmstart` on PATH: e.g. `warmstart completions bash >
    /// ~/.local/share/bash-completion/completions/warmstart`.
    Completions(manual::CompletionsArgs),
    /// Print the man page (roff), or write one page per command with `--out
    /// DIR`, made from the same command tree as `--help`.
    Man(manual::ManArgs),
}

/// The deadlines of every network operation (fetch, push), shared by the
/// commands that talk to a remote. Above `WARMSTART_CONNECT_TIMEOUT`,
/// `WARMSTART_STALL_TIMEOUT` and a manifest's `[network]` table.
#[derive(Debug, Default, clap::Args)]
pub struct NetworkArgs {
    /// Give up when the remote has not answered after this long (e.g. 500ms,
    /// 10s, 2m) [default: 10s]
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
    /// Give up when a transfer made no progress for this long [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub stall_timeout: Option<String>,
}

impl NetworkArgs {
    /// Records the flags for this command's network operations (exit 10
    /// when one is not a duration).
    pub fn apply(&self) -> anyhow::Result<()> {
        crate::net::set_flags(crate::net::NetworkFlags {
            connect: self.connect_timeout.clone(),
            stall: self.stall_timeout.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::collections::BTreeMap;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// The kind of value a flag takes, from its value's name: a count, a
    /// duration, a size, or text (names and paths); `None` for a switch,
    /// which takes no value.
    fn kind(a: &clap::Arg) -> Option<&'static str> {
        if !a.get_num_args().is_some_and(|n| n.takes_values()) {
            return None;
        }
        let name = a
            .get_value_names()
            .and_then(|n| n.first())
            .map(|n| n.as_str());
        Some(match name {
            Some("N" | "COUNT" | "JOBS") => "count",
            Some("DURATION") => "duration",
            Some("SIZE" | "BYTES") => "size",
            Some("MAX_AGE_MS") => "milliseconds",
            _ => "text",
        })
    }

    fn walk(c: &clap::Command, path: &str, seen: &mut BTreeMap<String, BTreeMap<String, String>>) {
        for a in c.get_arguments().filter(|a| !a.is_hide_set()) {
            if let (Some(long), Some(kind)) = (a.get_long(), kind(a)) {
                seen.entry(long.to_string())
                    .or_default()
                    .entry(kind.to_string())
                    .or_insert_with(|| path.to_string());
            }
        }
        for sub in c.get_subcommands() {
            walk(sub, &format!("{path} {}", sub.get_name()), seen);
        }
    }

    /// `cache gc --keep` was renamed: the old name is an error that names
    /// the new one, never a silent 3 seconds.
    #[test]
    fn gc_keep_points_to_keep_for() {
        use clap::Parser;
        let e = Cli::try_parse_from(["warmstart", "cache", "gc", "--keep", "3"]).unwrap_err();
        let said = e.to_string();
        assert!(said.contains("is now `--keep-for 3`"), "{said}");
        let ok = Cli::try_parse_from(["warmstart", "cache", "gc", "--keep-for", "2w"]);
        assert!(ok.is_ok(), "{ok:?}");
        assert!(Cli::try_parse_from(["warmstart", "cache", "prune", "x", "--keep", "3"]).is_ok());
    }

    /// One flag name, one kind of value, across every command: `--keep`
    /// was a count in `cache prune` and a duration in `cache gc`, so
    /// `cache gc --keep 3` meant 3 seconds.
    #[test]
    fn no_flag_name_takes_two_kinds_of_value() {
        let mut cmd = Cli::command();
        cmd.build();
        let mut seen = BTreeMap::new();
        walk(&cmd, "warmstart", &mut seen);
        let clashes: Vec<String> = seen
            .iter()
            .filter(|(_, kinds)| kinds.len() > 1)
            .map(|(flag, kinds)| format!("--{flag}: {kinds:?}"))
            .collect();
        assert!(clashes.is_empty(), "one flag, several kinds: {clashes:#?}");
        assert!(seen.len() > 10, "the walk found the flags: {seen:?}");
        assert_eq!(seen["keep"].keys().collect::<Vec<_>>(), ["count"]);
        assert_eq!(seen["keep-for"].keys().collect::<Vec<_>>(), ["duration"]);
    }

    /// The one vocabulary of time limits: `--connect-timeout` until the
    /// remote answers, `--stall-timeout` for no progress, `--timeout` for
    /// the whole operation. `gates check --fetch-timeout` and `gates push
    /// --timeout` (which bounded each step) named one kind two ways.
    const TIMEOUTS: [&str; 3] = ["connect-timeout", "stall-timeout", "timeout"];

    #[test]
    fn every_timeout_flag_is_one_of_three_names_and_a_duration() {
        use clap::Parser;
        let mut cmd = Cli::command();
        cmd.build();
        let mut seen = BTreeMap::new();
        walk(&cmd, "warmstart", &mut seen);
        let limits: Vec<&String> = seen
            .keys()
            .filter(|f| f.contains("timeout") || f.contains("deadline") || f.ends_with("-limit"))
            .collect();
        for flag in &limits {
            assert!(
                TIMEOUTS.contains(&flag.as_str()),
                "--{flag} ({:?}) is not one of the timeout names {TIMEOUTS:?}",
                seen[*flag]
            );
            assert_eq!(
                seen[*flag].keys().collect::<Vec<_>>(),
                ["duration"],
                "--{flag}"
            );
        }
        assert_eq!(limits.len(), TIMEOUTS.len(), "{limits:?}");
        for args in [
            &["gates", "check", "--fetch", "--timeout", "5s"][..],
            &["gates", "status", "--timeout", "5s"],
            &["gates", "push", "--timeout", "5s", "origin"],
            &["gates", "fetch", "--connect-timeout", "5s"],
            &["cache", "publish", "x", "--stall-timeout", "5s"],
        ] {
            let ok = Cli::try_parse_from(std::iter::once("warmstart").chain(args.iter().copied()));
            assert!(ok.is_ok(), "{args:?}: {ok:?}");
        }
    }

    /// `gates check --fetch-timeout` was renamed: the old name is an error
    /// that names the new one.
    #[test]
    fn gates_fetch_timeout_points_to_timeout() {
        use clap::Parser;
        for cmd in ["check", "status"] {
            let e = Cli::try_parse_from(["warmstart", "gates", cmd, "--fetch-timeout", "20s"])
                .unwrap_err();
            let said = e.to_string();
            assert!(said.contains("is now `--timeout 20s`"), "{said}");
        }
    }
}
