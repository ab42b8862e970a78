//! The `warmstart` binary: all of it is the library's `main` (an adopter's
//! xtask crate has the same one line).

fn main() {
    warmstart::main()
}
