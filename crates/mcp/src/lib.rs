//! keel-mcp: the MCP client bridge. The tools of configured MCP servers become declared keel
//! [`Tool`](keel_contracts::Tool)s named `mcp__<server>__<tool>`.
//!
//! Entry points: [`McpServerConfig`] (one `[mcp_servers.NAME]` table, validated into a
//! [`ServerSpec`]), [`McpServers::start`] (connects every server and lists its tools),
//! [`McpServers::tools`] (what a composition root appends to the built-in tools) and
//! [`McpServers::statuses`] (what `keel mcp list` prints).
//!
//! Lifecycle: every server is started eagerly by [`McpServers::start`], in parallel, each
//! bounded by its startup timeout, because the kernel needs each tool's name and schema
//! when it assembles its registry. A server that fails to start contributes no tools and
//! is reported in its [`ServerStatus`]. A server that crashes or closes later is reported
//! as an `error` tool result, and restarted (connected and initialized anew) on next use.
//!
//! Invariants:
//! - **Access is declared, never inferred** (DESIGN.md §2, [`declare_access`]): the user's
//!   `access`/`egress` in config first; otherwise a local (stdio) server's tools are writes
//!   without egress and a remote (URL) server's tools are writes with external egress. A
//!   server's own `readOnlyHint` is shown, and counts only when the user marked the server
//!   `trusted = true`. No MCP tool is intrinsic or first-party, so none runs in shadow mode.
//! - **What a server says is fenced** ([`keel_contracts::fence_untrusted`]): every tool
//!   result, server error text and tool description reaches the model inside
//!   untrusted-input markers; content marked for the user only (`audience`) does not reach
//!   it at all.
//! - **A server's questions are answered by policy** ([`ElicitationPolicy`]): declined with
//!   a reason unless `--approval auto` and every required field has a default; sampling is
//!   refused. Answers are kept ([`McpServers::elicitations`]).
//! - **Credentials stay out of sight:** `headers` values and bearer tokens
//!   ([`BearerTokens`], read by the composition root) print as `<redacted>`.
//! - **OAuth logins are the user's** ([`oauth`]): `keel mcp login NAME` runs the browser
//!   step once and stores the tokens (0600) keyed by the server's canonical URL; a
//!   connection sends them only to that URL, refreshes them, and never waits for a
//!   browser: without a usable login the server fails with an error naming
//!   `keel mcp login NAME`. Servers from a workspace file never get them.
//! - **A call never hangs a run:** every call has a timeout; a timed-out or dropped call
//!   sends `notifications/cancelled` to the server (rmcp's abandoned-request guard); a dead
//!   server fails its pending calls at once.
//! - **A stdio server lives in its own process group**, killed as a whole when its
//!   connection is dropped; its stderr goes to `<log_dir>/mcp-<server>.log`. Servers are the
//!   user's configured programs and run outside keel's sandbox; their tools are gated by
//!   scope and consent like any other tool.
//! - **One bad line does not kill a stdio connection** (bug case B12): lines on the server's
//!   stdout that are not JSON (log banners, a UTF-8 BOM) are logged to its log file and
//!   skipped before they reach the JSON-RPC transport.
#![forbid(unsafe_code)]

mod access;
mod client;
mod config;
mod connection;
mod error;
mod http;
mod manager;
mod naming;
pub mod oauth;
mod options;
mod result;
mod secrets;
mod server;
mod status;
mod stdio;
mod tool;

pub use access::{AccessSource, DeclaredAccess, declare_access};
pub use client::{Elicitation, ElicitationPolicy};
pub use config::{
    DEFAULT_STARTUP_TIMEOUT, DEFAULT_TOOL_TIMEOUT, HttpHeaders, MAX_SERVER_NAME_LEN,
    McpServerConfig, OAuthClientSpec, ServerSpec, ToolDeclaration, TransportKind, TransportSpec,
};
pub use error::{ConfigError, ConnectError};
pub use manager::McpServers;
pub use naming::{MAX_TOOL_NAME_LEN, keel_tool_name};
pub use options::{BearerTokens, INHERITED_ENV_VARS, StartOptions};
pub use status::{McpToolInfo, ServerState, ServerStatus};
pub use tool::McpTool;
