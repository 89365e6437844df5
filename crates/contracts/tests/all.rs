//! keel-contracts' integration tests: one binary (HOUSE-STYLE.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite {
    mod tool_schema;
}
