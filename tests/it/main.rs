//! The one integration-test binary: each module tests one capability through the real `warmstart` binary.

mod util;

mod adopt;
mod broken_pipe;
mod cache_concurrency;
mod cache_fetch;
mod cache_heal;
mod cache_publish;
mod cache_restore;
mod conda;
mod containment;
mod containment_property;
mod demo;
mod gates;
mod restore;
mod restore_cache;
mod resume;
mod resume_interop;
mod strict;
mod tidy;
mod unpack;
mod wheel;
