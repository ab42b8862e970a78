//! The "Examples:" section of every command's `--help`, in one table.
//!
//! One place, so that a new subcommand without examples fails one test
//! (`every_command_has_examples_and_quiet`) rather than a review. `{bin}`
//! becomes the command as the user ran it (`warmstart` or `cargo xtask`,
//! `crate::invocation::command`), so every example can be pasted as is.

/// (subcommand path, examples): each example line is a command, then `#`
/// and what it does.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "",
        "{bin} cache restore rust-sdk      # fetch, verify and install one cache
  {bin} restore                       # the whole bootstrap of restore.toml
  {bin} gates run && {bin} cache publish rust-sdk
  {bin} cache status --json | jq .caches[0].local.state",
    ),
    (
        "cache",
        "{bin} cache list                  # every cache, its key and local state
  {bin} cache publish rust-sdk        # pack and push the current key
  {bin} cache restore rust-sdk        # install it (a warm run is a no-op)",
    ),
    (
        "cache publish",
        "{bin} cache publish rust-sdk --key-only   # print the key and how it was built
  {bin} cache publish rust-sdk --dry-run    # the plan: files, key, branch, remote
  {bin} cache publish rust-sdk --json       # publish, then one JSON summary
  {bin} cache publish rust-sdk --missing    # only if the remote lacks a trusted key (CI)",
    ),
    (
        "cache build",
        "{bin} cache build rust-sdk     # run its [build] into the pack root
  {bin} cache build rust-sdk && {bin} cache publish rust-sdk",
    ),
    (
        "cache restore",
        "{bin} cache restore rust-sdk                # at session start
  {bin} cache restore rust-sdk --verify       # compare the installed copy, repair it
  {bin} cache restore rust-sdk --key linux-1  # a key other than the pins give",
    ),
    (
        "cache verify",
        "{bin} cache verify rust-sdk               # every key of the branch
  {bin} cache verify rust-sdk --remote backup --json",
    ),
    (
        "cache list",
        "{bin} cache list
  {bin} cache list --offline --json   # local state only, for scripts",
    ),
    (
        "cache status",
        "{bin} cache status rust-sdk       # how the key is built; on a miss what differs
  {bin} cache status --offline",
    ),
    (
        "cache migrate",
        "{bin} cache migrate rust-sdk                        # after setting cache.ref
  {bin} cache migrate rust-sdk --from old-name-cache",
    ),
    (
        "cache prune",
        "{bin} cache prune rust-sdk --keep 3 --dry-run   # which keys would go
  {bin} cache prune rust-sdk --older-than 30d",
    ),
    (
        "cache resign",
        "{bin} cache resign rust-sdk --signing-key ~/.ssh/ci_signing_key
  {bin} cache resign rust-sdk --key linux-1 --json",
    ),
    (
        "cache gc",
        "{bin} cache gc --dry-run          # what would go, and why the rest stays
  {bin} cache gc --max-size 2G --keep-for 7d --json",
    ),
    (
        "demo",
        "{bin} demo                        # publish and restore this machine's rustlib
  {bin} demo --source ./target/doc --keep",
    ),
    (
        "restore",
        "{bin} restore                     # the whole bootstrap
  {bin} restore --only links          # one step
  {bin} restore --dry-run             # print the validated plan only
  {bin} restore --strict --json       # CI: any failure is fatal (exit 11)
  {bin} restore --background          # return at once, work continues",
    ),
    (
        "doctor",
        "{bin} doctor                      # every host: direct or which proxy, status line
  {bin} doctor --connect-timeout 3s --timeout 10s
  {bin} doctor --json | jq '.hosts[] | select(.reached | not)'",
    ),
    (
        "restore status",
        "{bin} restore status              # after `restore --background`
  {bin} restore status --json",
    ),
    (
        "restore env",
        "{bin} restore env                 # sh/bash/zsh lines: eval \"$({bin} restore env)\"
  {bin} restore env --shell fish | source
  {bin} restore env --github          # GitHub Actions: later steps of the job see them
  {bin} restore env --append \"$CLAUDE_ENV_FILE\"   # an agent hook's env file",
    ),
    (
        "restore stop",
        "{bin} restore stop                # stop every service step's process group
  {bin} restore stop lsp --json       # one service",
    ),
    (
        "gates",
        "{bin} gates run                   # run every gate, record the green ones
  {bin} gates check                   # exit 9 unless green for this tree
  {bin} gates push                    # share the record with origin",
    ),
    (
        "gates run",
        "{bin} gates run
  {bin} gates run fmt clippy --keep-going
  {bin} gates run --no-record --json  # try a dirty tree, record nothing",
    ),
    (
        "gates status",
        "{bin} gates status
  {bin} gates status --fetch=origin --json",
    ),
    (
        "gates check",
        "{bin} gates check                 # every gate of gates.toml
  {bin} gates check test --fetch      # fetch origin's record first",
    ),
    (
        "gates fetch",
        "{bin} gates fetch                 # from origin
  {bin} gates fetch upstream --timeout 20s",
    ),
    (
        "gates push",
        "{bin} gates push
  {bin} gates push origin --json",
    ),
    (
        "resume",
        "{bin} resume record pane-3 0b5e-session warmstart orchestrator
  {bin} resume resume-cmd pane-3      # the shell line that resumes it
  {bin} resume list",
    ),
    (
        "resume record",
        "{bin} resume record pane-3 0b5e-session warmstart
  {bin} resume record pane-3 0b5e-session warmstart orchestrator --cwd .",
    ),
    ("resume touch", "{bin} resume touch pane-3"),
    (
        "resume lookup",
        "{bin} resume lookup pane-3        # the entry as JSON, or null",
    ),
    (
        "resume resume-cmd",
        "{bin} resume resume-cmd pane-3
  {bin} resume resume-cmd pane-3 86400000 --json   # only if active within a day",
    ),
    (
        "resume list",
        "{bin} resume list
  {bin} resume list --json --path ./index.json",
    ),
    (
        "resume prune",
        "{bin} resume prune 604800000      # drop entries idle for a week",
    ),
    (
        "conda",
        "{bin} conda info binaryen-118-h59595ed_0.conda
  {bin} conda unpack binaryen-118-h59595ed_0.conda --into /usr/local --only bin/ --only lib/",
    ),
    (
        "conda info",
        "{bin} conda info binaryen-118-h59595ed_0.conda
  {bin} conda info zstd-1.5.6-h0.tar.bz2 --json",
    ),
    (
        "conda unpack",
        "{bin} conda unpack binaryen-118-h59595ed_0.conda --into /usr/local --only bin/ --only lib/
  {bin} conda unpack pkg.conda --into ~/.local --max-bytes 2G --json",
    ),
    (
        "init",
        "{bin} init                        # write what is missing, update what it generated
  {bin} init --check                  # CI: exit 6 when a generated file is stale
  {bin} init --signer ci=ci_signing_key.pub --binary standalone",
    ),
    (
        "completions",
        "{bin} completions bash > ~/.local/share/bash-completion/completions/warmstart
  {bin} completions fish > ~/.config/fish/completions/warmstart.fish",
    ),
    (
        "man",
        "{bin} man | man -l -                # read it now
  {bin} man --out ~/.local/share/man/man1",
    ),
];

/// `cmd` (the whole tree) with each command's examples as its `after_help`,
/// `{bin}` replaced by `bin`.
pub fn apply(mut cmd: clap::Command, bin: &str) -> clap::Command {
    for (path, text) in EXAMPLES {
        let text = format!("Examples:\n  {}", text.replace("{bin}", bin));
        cmd = at_path(cmd, path, &move |c| c.after_help(text.clone()));
    }
    cmd
}

fn at_path(
    cmd: clap::Command,
    path: &str,
    f: &dyn Fn(clap::Command) -> clap::Command,
) -> clap::Command {
    match path.split_once(' ') {
        _ if path.is_empty() => f(cmd),
        Some((first, rest)) => cmd.mut_subcommand(first, |c| at_path(c, rest, f)),
        None => cmd.mut_subcommand(path, f),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    /// Every command and subcommand, by path, after `clap` built the tree
    /// (which is when `global` flags reach the subcommands).
    fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<(String, clap::Command)>) {
        out.push((path.to_string(), cmd.clone()));
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            let p = format!("{path} {}", sub.get_name()).trim().to_string();
            walk(sub, &p, out);
        }
    }

    #[test]
    fn every_command_has_examples_and_quiet() {
        let mut cmd = apply(crate::cli::Cli::command(), "warmstart");
        cmd.build();
        let mut all = Vec::new();
        walk(&cmd, "", &mut all);
        assert!(all.len() > 25, "the walk found only {}", all.len());
        for (path, c) in &all {
            let help = c
                .get_after_help()
                .map(|s| s.to_string())
                .unwrap_or_default();
            assert!(
                help.starts_with("Examples:\n  warmstart "),
                "`{path}` has no examples in its --help: add them to cli/examples.rs"
            );
            assert!(!help.contains("{bin}"), "{path}: {help}");
            for line in help.lines().skip(1) {
                let line = line.trim_start();
                assert!(line.starts_with("warmstart "), "{path}: {line:?}");
                let words: Vec<_> = line.split_whitespace().skip(1).collect();
                assert!(
                    path.is_empty() || words.join(" ").starts_with(path.as_str()),
                    "`{path}` shows an example of another command: {line:?}"
                );
            }
            assert!(
                c.get_arguments().any(|a| a.get_id() == "quiet"),
                "`{path}` has no --quiet"
            );
        }
        // Each table row names a real command: a typo would apply nothing.
        for (path, _) in EXAMPLES {
            assert!(all.iter().any(|(p, _)| p == path), "no command `{path}`");
        }
    }
}
