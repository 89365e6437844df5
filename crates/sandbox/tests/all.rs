//! keel-sandbox integration tests: one binary, behaviours in `suite/`.
// Test helpers outside #[test] functions unwrap too: a failed setup is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite {
    mod boundary;
    mod managed;
    mod redteam;
    mod run;
}
