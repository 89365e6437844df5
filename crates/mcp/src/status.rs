//! What `keel mcp list` shows of each configured server ([`ServerStatus`]): its state
//! ([`ServerState`]), its tools ([`McpToolInfo`]) and notes for the user.

use std::path::PathBuf;

use keel_contracts::{Access, Effects};

use crate::access::AccessSource;

/// Whether a server is usable, as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerState {
    /// Initialized and its tools listed.
    Connected,
    /// Start-up failed; the server contributes no tools.
    Failed {
        /// Why, for humans.
        reason: String,
    },
}

/// One MCP tool as `keel mcp list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The name the model calls it by (`mcp__fs__read_file`).
    pub name: String,
    /// The server's own name for it.
    pub server_tool: String,
    /// Declared access.
    pub access: Access,
    /// Declared effects.
    pub effects: Effects,
    /// Who declared the access.
    pub source: AccessSource,
    /// The server's own `readOnlyHint`: shown, never trusted unless the server is.
    pub read_only_hint: Option<bool>,
}

/// One configured server as `keel mcp list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerStatus {
    /// The server's name.
    pub name: String,
    /// `stdio: COMMAND ARGS` or `http: URL`.
    pub transport: String,
    /// Connected, or why not.
    pub state: ServerState,
    /// Its tools, in the server's order.
    pub tools: Vec<McpToolInfo>,
    /// Things the user should know: declarations for tools the server does not offer,
    /// tools left out because their names collide.
    pub notes: Vec<String>,
    /// The server's log (stdio servers).
    pub log_path: Option<PathBuf>,
}
