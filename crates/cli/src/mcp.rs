//! `keel mcp list`: the configured MCP servers, their state, tools and declared access.

use std::path::Path;

use keel_contracts::Egress;
use keel_host::mcp::start;
use keel_mcp::ServerState;

use crate::app::{canonical_workspace, exit, usage};
use crate::config;

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
    for status in started.statuses() {
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
