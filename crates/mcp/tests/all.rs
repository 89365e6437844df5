//! keel-mcp's integration suite: real MCP servers (npm's server-everything and
//! server-filesystem, pinned in tests/servers) and a scripted fake stdio server.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod suite;
