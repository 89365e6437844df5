//! `keel mcp list`: the configured MCP servers, their state, tools and declared access.

use std::path::Path;

use keel_contracts::Egress;
use keel_host::mcp::start;
use keel_mcp::ServerState;

use crate::app::{canonical_workspace, exit, usage};
use crate::config;

/// The most tools one request may carry at the strictest provider keel talks to (OpenAI's
/// APIs accept 128 function tools).
pub(crate) const PROVIDER_TOOL_LIMIT: usize = 128;

/// `keel mcp list`: each server's state, tools, declared access and the server's own
/// `readOnlyHint`, as text or (`json`) one JSON object. Exits 0 whatever the servers'
/// states.
pub(crate) async fn list(workspace: Option<&Path>, json: bool) -> anyhow::Result<u8> {
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
        if json {
            outln!("{}", serde_json::json!({"servers": [], "tool_count": 0, "notes": []}));
        }
        return Ok(exit::COMPLETED);
    }
    let started =
        start(&config, &home, &workspace, false, keel_mcp::ElicitationPolicy::Decline).await?;
    let tool_count: usize = started.statuses().iter().map(|status| status.tools.len()).sum();
    let mut notes = Vec::new();
    if tool_count > PROVIDER_TOOL_LIMIT {
        notes.push(format!(
            "{tool_count} MCP tools: more than the {PROVIDER_TOOL_LIMIT} tools some providers \
             accept in one request (OpenAI); declare fewer servers or tools"
        ));
    }
    if json {
        let servers: Vec<serde_json::Value> = started.statuses().iter().map(status_json).collect();
        let report = serde_json::json!({
            "servers": servers,
            "tool_count": tool_count,
            "notes": notes,
        });
        outln!("{report}");
        return Ok(exit::COMPLETED);
    }
    for note in &notes {
        eprintln!("keel: {note}");
    }
    for status in started.statuses() {
        let state = match &status.state {
            ServerState::Connected => "connected".to_owned(),
            ServerState::Failed { reason } => format!("failed: {reason}"),
        };
        outln!("{}  {state}  ({})", status.name, status.transport);
        let width = status.tools.iter().map(|tool| tool.name.len()).max().unwrap_or(0);
        for tool in &status.tools {
            let egress = egress_name(tool.effects.egress);
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

fn egress_name(egress: Egress) -> &'static str {
    match egress {
        Egress::None => "none",
        Egress::Internal => "internal",
        Egress::External => "external",
    }
}

/// One server of `keel mcp list --json`.
fn status_json(status: &keel_mcp::ServerStatus) -> serde_json::Value {
    let (state, reason) = match &status.state {
        ServerState::Connected => ("connected", None),
        ServerState::Failed { reason } => ("failed", Some(reason.as_str())),
    };
    let tools: Vec<serde_json::Value> = status
        .tools
        .iter()
        .map(|tool| {
            serde_json::json!({
                "name": tool.name,
                "server_tool": tool.server_tool,
                "access": tool.access.as_str(),
                "egress": egress_name(tool.effects.egress),
                "declared_by": tool.source.as_str(),
                "read_only_hint": tool.read_only_hint,
            })
        })
        .collect();
    serde_json::json!({
        "name": status.name,
        "transport": status.transport,
        "state": state,
        "reason": reason,
        "tools": tools,
        "notes": status.notes,
        "log": status.log_path.as_ref().map(|path| path.display().to_string()),
    })
}
