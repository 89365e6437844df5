//! keel-providers integration tests: recorded and synthetic provider traffic replayed
//! through a local HTTP server (`suite::harness`), driven through `ModelClient::complete`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: clippy.toml allows unwrap in tests, but only recognizes #[test] bodies, \
              not the harness the tests share"
)]

mod suite {
    // The suites replay HTTP traffic through the network clients; the shared harness
    // builds clients of both features, so the suites need both.
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod anthropic_recordings;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod anthropic_request_shape;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod anthropic_retries;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod corpus;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod harness;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod recordings;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod request_shape;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod responses;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod retries;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod tool_call_bugs;
    #[cfg(all(feature = "openai", feature = "anthropic"))]
    mod tools_off;
}
