//! The one integration-test binary: each module tests one capability through the real `xtask` binary.

mod util;

mod cache_fetch;
mod cache_publish;
mod cache_restore;
mod conda;
mod demo;
mod gates;
mod restore;
mod restore_cache;
mod resume;
mod test_tools;
mod tidy;
mod unpack;
