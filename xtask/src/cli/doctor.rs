//! Arguments of `doctor`.

use clap::Args;

/// Which hosts this repository's restore reaches, and how: for each git
/// remote, cache remote, download, submodule and package registry, whether
/// it answered directly or through which proxy, with the status line, and
/// what that means.
///
/// Each host is probed the way its real client goes: downloads and
/// registries as curl does (`https_proxy`, `HTTPS_PROXY`, `all_proxy`,
/// `no_proxy`), git over HTTPS as git does (`http.proxy` first, then the
/// environment), ssh as `ssh -G` resolves it. A proxy's 403 is named as the
/// proxy's, a dead proxy as dead, so that nobody concludes "unreachable"
/// from one refusal. Never sends a host's credentials, never prints a
/// token or a proxy's password. Exit 0 when every host answered, 8 when
/// one did not (the report is printed either way), 10 for an invalid
/// restore.toml.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as JSON on stdout instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Give up connecting to a host or a proxy after this long (e.g. 500ms,
    /// 10s) [default: 10s, or WARMSTART_CONNECT_TIMEOUT]
    #[arg(long, value_name = "DURATION")]
    pub connect_timeout: Option<String>,
    /// Give up on one host's whole probe after this long [default: the
    /// connect timeout plus 10s]
    #[arg(long, value_name = "DURATION")]
    pub timeout: Option<String>,
}
