//! MCP servers from config: starting them for a run, and `keel mcp list`.

use std::path::Path;
use std::sync::Arc;

use keel_contracts::{Egress, Tool, UNTRUSTED_POLICY};
use keel_kernel::Instruction;
use keel_mcp::{INHERITED_ENV_VARS, McpServers, ServerState, StartOptions};

use crate::app::{canonical_workspace, exit, usage};
use crate::config::{self, ConfigFile};

/// The configured servers, started, with their tools. Start-up failures are reported on
/// stderr and are not fatal; an invalid `[mcp_servers.NAME]` table is a usage error.
pub(crate) struct Started {
    servers: McpServers,
}

impl Started {
    /// Tools to append to the built-in ones.
    pub(crate) fn tools(&self) -> Vec<Arc<dyn Tool>> {
        self.servers.tools()
    }

    /// The untrusted-input policy for the system prompt, when any MCP tool is present.
    pub(crate) fn policy_instruction(&self) -> Option<Instruction> {
        (!self.servers.tools().is_empty()).then(|| Instruction {
            source: "keel (untrusted input)".into(),
            text: UNTRUSTED_POLICY.into(),
        })
    }
}

/// Starts every server in `config` (logs under `KEEL_HOME/logs`).
pub(crate) async fn start(
    config: &ConfigFile,
    home: &Path,
    workspace: &Path,
    warn: bool,
) -> anyhow::Result<Started> {
    let mut specs = Vec::new();
    for (name, server) in &config.mcp_servers {
        specs.push(server.validate(name).map_err(|error| usage(format!("config: {error}")))?);
    }
    let options = StartOptions {
        log_dir: home.join("logs"),
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

/// `keel mcp list`: each server's state, tools, declared access and the server's own
/// `readOnlyHint`. Exits 0 whatever the servers' states.
pub(crate) async fn list(workspace: Option<&Path>) -> anyhow::Result<u8> {
    let workspace = canonical_workspace(workspace)?;
    let home = config::keel_home()?;
    let config = config::load_merged(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    if config.mcp_servers.is_empty() {
        eprintln!(
            "keel: no MCP servers configured: add [mcp_servers.NAME] to {} (or to {} and \
             run `keel trust`)",
            config::user_config_dir()
                .map_or_else(|| home.join("config.toml"), |dir| dir.join("config.toml"))
                .display(),
            workspace.join(".keel/config.toml").display()
        );
        return Ok(exit::COMPLETED);
    }
    let started = start(&config, &home, &workspace, false).await?;
    for status in started.servers.statuses() {
        let state = match &status.state {
            ServerState::Connected => "connected".to_owned(),
            ServerState::Failed { reason } => format!("failed: {reason}"),
        };
        outln!("{}  {state}  ({})", status.name, status.transport);
        let width = status.tools.iter().map(|tool| tool.name.len()).max().unwrap_or(0);
        for tool in &status.tools {
            let egress = match tool.effects.egress {
                Egress::None => "none",
                Egress::Internal => "internal",
                Egress::External => "external",
            };
            let hint = match tool.read_only_hint {
                Some(true) => "true",
                Some(false) => "false",
                None => "-",
            };
            outln!(
                "  {:<width$}  {:<5}  egress={egress:<8}  by={:<20}  readOnlyHint={hint}",
                tool.name,
                tool.access.as_str(),
                tool.source.as_str(),
            );
        }
        for note in &status.notes {
            outln!("  note: {note}");
        }
        if let Some(log) = &status.log_path {
            outln!("  log: {}", log.display());
        }
    }
    Ok(exit::COMPLETED)
}
