//! keel-store's integration tests: the store conformance suite over file-backed SQLite and
//! a real PostgreSQL server, and behaviour only a real backend shows (several handles,
//! several threads, racing writers).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: clippy.toml allows unwrap in tests, but only recognizes #[test] bodies, \
              not the helpers and factories these tests share"
)]

mod suite {
    mod concurrency;
    mod conformance;
    mod postgres;
    mod schedules;
}
