//! keel-testkit's integration tests: the conformance suite over `MemStore`, and
//! `FaultyStore`'s failure injection.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: clippy.toml allows unwrap in tests, but only recognizes #[test] bodies, \
              not the helpers and factories these tests share"
)]

mod suite {
    mod faulty_store;
    mod mem_store;
}
