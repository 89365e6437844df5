//! keel-eval's integration suite: real task folders, real sandboxed commands, real keel
//! sessions (the scripted model) through the composition root.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
