//! keel-store's integration tests: the store conformance suite over file-backed SQLite,
//! and behaviour only a real file shows (several handles, several threads).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: clippy.toml allows unwrap in tests, but only recognizes #[test] bodies, \
              not the helpers and factories these tests share"
)]

mod suite {
    mod concurrency;
    mod conformance;
}
