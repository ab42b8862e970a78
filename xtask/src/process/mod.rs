//! Child processes on the ground floor: the one signal handling module
//! (`signals`), process groups and their ending (`group`), and the runner
//! of one command with a deadline whose output is teed (`runner`). Every
//! room runs children through these; none installs a handler of its own.

pub mod group;
pub mod runner;
pub mod signals;
