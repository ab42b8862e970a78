//! The one integration-test binary: each module tests one capability through the real `xtask` binary.

mod util;

mod conda;
mod gates;
mod restore;
mod resume;
mod tidy;
mod unpack;
