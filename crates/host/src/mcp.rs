//! MCP servers from config: starting them for a run.

use std::path::Path;
use std::sync::Arc;

use keel_contracts::{Tool, UNTRUSTED_POLICY};
use keel_kernel::Instruction;
use keel_mcp::{
    BearerTokens, ElicitationPolicy, INHERITED_ENV_VARS, McpServers, ServerState, StartOptions,
};

use crate::config::ConfigFile;

/// The configured servers, started, with their tools. Start-up failures are reported on
/// stderr and are not fatal; an invalid `[mcp_servers.NAME]` table is a usage error.
#[derive(Debug)]
pub struct Started {
    servers: McpServers,
}

impl Started {
    /// Tools to append to the built-in ones.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.servers.tools()
    }

    /// The servers' current tools, which change on `tools/list_changed`, for
    /// `Kernel::with_tool_source`.
    pub fn tool_source(&self) -> Arc<dyn keel_contracts::ToolSource> {
        self.servers.tool_source()
    }

    /// The untrusted-input policy for the system prompt, when any MCP tool is present.
    pub fn policy_instruction(&self) -> Option<Instruction> {
        (!self.servers.tools().is_empty()).then(|| Instruction {
            source: "keel (untrusted input)".into(),
            text: UNTRUSTED_POLICY.into(),
        })
    }
}

/// Where `keel mcp login` keeps OAuth logins: `KEEL_HOME/mcp/oauth`.
pub fn oauth_dir(home: &Path) -> std::path::PathBuf {
    home.join("mcp").join("oauth")
}

/// Starts every server in `config` (logs under `KEEL_HOME/logs`). Servers' questions
/// (`elicitation/create`) are answered by `elicitation`.
pub async fn start(
    config: &ConfigFile,
    home: &Path,
    workspace: &Path,
    warn: bool,
    elicitation: ElicitationPolicy,
) -> anyhow::Result<Started> {
    let mut specs = Vec::new();
    for (name, server) in &config.mcp_servers {
        specs.push(server.validate(name).map_err(crate::error::config_error)?);
    }
    let bearer_tokens = BearerTokens::from_env(&specs);
    let options = StartOptions {
        bearer_tokens,
        elicitation,
        log_dir: home.join("logs"),
        oauth: Some(keel_mcp::oauth::OAuthStore::new(oauth_dir(home))),
        workspace: workspace.to_path_buf(),
        inherited_env: std::env::vars_os()
            .filter(|(name, _)| INHERITED_ENV_VARS.iter().any(|allowed| name == allowed))
            .collect(),
    };
    let servers = McpServers::start(specs, options).await;
    if warn {
        for status in servers.statuses() {
            if let ServerState::Failed { reason } = &status.state {
                eprintln!(
                    "keel: mcp server '{}' is unavailable: {reason} (see `keel mcp list`)",
                    status.name
                );
            }
        }
    }
    Ok(Started { servers })
}

impl Started {
    /// Ends every server's session (an HTTP server's with `DELETE`), each within a few
    /// seconds; see [`McpServers::close`].
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the remaining sessions closing in the background.
    pub async fn close(&self) {
        self.servers.close().await;
    }

    /// Each server's state, tools and notes (what `keel mcp list` prints).
    pub fn statuses(&self) -> &[keel_mcp::ServerStatus] {
        self.servers.statuses()
    }
}
