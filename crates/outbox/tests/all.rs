//! keel-outbox's integration suite: mirrors over the in-memory reference store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
