//! Getting a cache branch's bytes onto the machine: the private stores,
//! protocol-v2 chunk reads, and the prefetcher.

pub mod direct;
pub mod oci;
pub mod prefetch;
pub mod reuse;
