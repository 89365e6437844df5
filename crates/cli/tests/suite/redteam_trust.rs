//! Red team: a hostile repository's `.keel/config.toml` and instruction files
//! (issue #11 items 1 and 2). Each test makes one attempt, asserts it is blocked, and
//! asserts the legitimate neighbour still works.

mod harness;

mod files;
mod instructions;
mod servers;
mod settings;
