//! Getting a cache branch's bytes onto the machine: the private stores,
//! protocol-v2 chunk reads, ssh, and the prefetcher.

pub mod direct;
pub mod git;
pub mod prefetch;
pub mod reuse;
pub mod ssh;
