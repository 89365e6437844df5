//! keel-cli's integration suite: runs the real `keel` binary as a user would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
