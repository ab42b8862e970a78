//! Git plumbing for cache branches, shared by publish and restore.
//!
//! Cache objects never enter the user's object store: every object lives in
//! a private bare repository, `<git-dir>/warmstart/cache.git`, and the remote
//! is addressed by URL (resolved from the user's remote name once). A branch
//! is fetched shallow into `refs/warmstart/<branch>` of that repository,
//! without its big blobs (a partial clone: git records the URL as a promisor
//! remote in cache.git's config); the chunks a restore reads are fetched by
//! id (`fetch_blob`), and git never fetches one on its own
//! (`GIT_NO_LAZY_FETCH`).
//!
//! Why the git CLI and not libgit2: git2 is not a dependency (it would add a
//! C build and OpenSSL/libssh2 to every cold compile), and the CLI is the
//! best transport there is: it honours the user's credential helpers,
//! `insteadOf` rewrites, proxies and ssh configuration, speaks protocol v2,
//! and streams big blobs through bulk check-in without holding them in memory.
//!
//! This module never writes to the user's repository: it only reads its
//! remote URLs and transport settings (`git -C <root> config`).

mod errors;
mod fetch;
mod heal;
mod objects;
mod push;
mod remote;
mod run;
pub mod ssh;
mod store;

pub use errors::*;
pub use fetch::*;
pub use heal::*;
pub use objects::*;
pub use push::*;
pub use remote::*;
use run::*;
pub use store::*;

#[cfg(test)]
mod tests;
