//! keel-providers integration tests: recorded and synthetic provider traffic replayed
//! through a local HTTP server (`suite::harness`), driven through `ModelClient::complete`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test code: clippy.toml allows unwrap in tests, but only recognizes #[test] bodies, \
              not the harness the tests share"
)]

mod suite {
    // Every suite so far replays HTTP traffic through `OpenAiChat`.
    #[cfg(feature = "openai")]
    mod harness;
    #[cfg(feature = "openai")]
    mod recordings;
    #[cfg(feature = "openai")]
    mod request_shape;
    #[cfg(feature = "openai")]
    mod retries;
    #[cfg(feature = "openai")]
    mod tool_call_bugs;
}
