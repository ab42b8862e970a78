//! Arguments of `cargo xtask conda`: inspect and unpack conda packages.

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `conda unpack --max-bytes` unless given (also used by restore's package downloads).
pub const DEFAULT_MAX_BYTES: u64 = 16 << 30;
/// `conda unpack --max-entries` unless given.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

/// `cargo xtask conda`: its help text is the `Command::Conda` doc comment.
#[derive(Debug, Args)]
pub struct CondaArgs {
    #[command(subcommand)]
    pub command: CondaCommand,
}

#[derive(Debug, Subcommand)]
pub enum CondaCommand {
    /// Show a package's name, version, build, zip members with sizes and
    /// compression, and which files carry prefix placeholders.
    ///
    /// Reads only metadata: the zip's central directory and the small
    /// `info-*.tar.zst` member (for `.tar.bz2`, the whole stream is read,
    /// nothing is written).
    Info(InfoArgs),
    /// Unpack a package into a prefix such as /usr/local, rewriting prefix
    /// placeholders, one atomic rename per file.
    ///
    /// The package is extracted to a staging directory beside PREFIX, every
    /// entry checked (`..`, absolute paths, escaping symlinks, writes through
    /// symlinks, hardlinks to outside, device nodes are errors, never
    /// skipped); placeholders listed in `info/paths.json` (else
    /// `info/has_prefix`) are rewritten to PREFIX; then each file is renamed
    /// into PREFIX under a journal, so an interrupted run is completed by the
    /// next one. Files of PREFIX that the package does not contain are left
    /// alone; `info/` is not installed (conda keeps it outside the prefix too).
    ///
    /// Exit codes: 7 an entry or member was refused or a cap was exceeded
    /// (the error names it; PREFIX is untouched), 2 PREFIX is too long for
    /// a binary placeholder, 4 the package file does not exist.
    Unpack(UnpackArgs),
}

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// The package: a `.conda` or `.tar.bz2` file.
    pub file: PathBuf,
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct UnpackArgs {
    /// The package: a `.conda` or `.tar.bz2` file.
    pub file: PathBuf,
    /// The prefix to install into (created if missing), e.g. /usr/local.
    #[arg(long, value_name = "PREFIX")]
    pub into: PathBuf,
    /// Install only paths under this directory of the package (repeatable):
    /// `--only bin/ --only lib/`. Entries outside are still checked.
    #[arg(long, value_name = "DIR")]
    pub only: Vec<String>,
    /// Allow symlinks that point outside PREFIX (e.g. to /usr/bin/env).
    /// They are created, never written through.
    #[arg(long)]
    pub allow_external_symlinks: bool,
    /// Refuse packages whose contents exceed this size: `16G`, `512MiB`, or
    /// bytes (binary units, any case; docs/reference/settings.md).
    #[arg(long, value_name = "SIZE", default_value = "16G", value_parser = crate::size::parse_size_arg)]
    pub max_bytes: u64,
    /// Refuse packages with more entries than this.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_ENTRIES)]
    pub max_entries: u64,
    /// Print a JSON report instead of text.
    #[arg(long)]
    pub json: bool,
}
