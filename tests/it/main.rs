//! The one integration-test binary: each module tests one capability through the real `warmstart` binary.

mod util;

mod adopt;
mod attack;
mod broken_pipe;
mod cache_concurrency;
mod cache_fetch;
mod cache_heal;
mod cache_keys;
mod cache_legacy;
mod cache_nofilter;
mod cache_overlay;
mod cache_prune;
mod cache_publish;
mod cache_refs;
mod cache_restore;
mod conda;
mod containment;
mod containment_property;
mod demo;
mod gates;
mod gates_refs;
mod net_deadline;
mod restore;
mod restore_cache;
mod resume;
mod resume_interop;
mod secrets;
mod strict;
mod test_tools;
mod tidy;
mod transports;
mod transports_faults;
mod trust;
mod trust_bootstrap;
mod unpack;
