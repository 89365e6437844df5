//! The client under test for the official MCP conformance suite
//! (`@modelcontextprotocol/conformance client --command ...`): keel's own MCP client code
//! ([`McpServers`] and its tools) pointed at the scenario's server.
//!
//! Usage: `keel-mcp-conformance-client URL`, with `MCP_CONFORMANCE_SCENARIO` naming the
//! scenario (the suite sets both). It connects (initialize, `tools/list`), then calls every
//! listed tool once, with arguments made from its input schema (`add_numbers` of the
//! `tools_call` scenario gets `a = 2`, `b = 3`), and exits 0 when every step worked.
//! It is a test harness, not part of keel's interface.

use std::collections::BTreeMap;
use std::process::ExitCode;

use keel_contracts::{Outcome, SandboxMode, SessionId, ToolCallId, ToolContext};
use keel_mcp::{ElicitationPolicy, McpServerConfig, McpServers, ServerState, StartOptions};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: keel-mcp-conformance-client URL");
        return ExitCode::from(2);
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?} against {url}");
    let config =
        McpServerConfig { url: Some(url), startup_timeout_ms: Some(20_000), ..Default::default() };
    let spec = match config.validate("conformance") {
        Ok(spec) => spec,
        Err(error) => {
            eprintln!("config: {error}");
            return ExitCode::from(2);
        }
    };
    let scratch = std::env::temp_dir().join(format!("keel-mcp-conformance-{}", std::process::id()));
    let options = StartOptions {
        log_dir: scratch.join("logs"),
        workspace: std::env::temp_dir(),
        inherited_env: BTreeMap::new(),
        bearer_tokens: Default::default(),
        // The suite's answers are the defaults it offers (as under `--approval auto`).
        elicitation: ElicitationPolicy::AcceptDefaults,
    };
    let servers = McpServers::start(vec![spec], options).await;
    let mut ok = true;
    for status in servers.statuses() {
        match &status.state {
            ServerState::Connected => eprintln!("connected; {} tools", status.tools.len()),
            ServerState::Failed { reason } => {
                eprintln!("failed to connect: {reason}");
                ok = false;
            }
        }
    }
    let context = ToolContext {
        workspace: std::env::temp_dir(),
        session_id: SessionId(uuid::Uuid::nil()),
        call_id: ToolCallId::from("conformance"),
        sandbox: SandboxMode::Managed,
        boundary: Default::default(),
        denied_paths: Default::default(),
        write_denied_paths: Default::default(),
        elicitor: None,
    };
    for tool in servers.tools() {
        let arguments = arguments_for(&tool.spec().parameters);
        let output = tool.invoke(&context, &arguments).await;
        eprintln!("{} {arguments} -> {:?}: {}", tool.spec().name, output.outcome, output.content);
        ok &= output.outcome == Outcome::Ok;
    }
    for asked in servers.elicitations() {
        eprintln!("elicitation: {asked:?}");
    }
    servers.close().await;
    drop(servers);
    let _ = std::fs::remove_dir_all(&scratch);
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// Arguments for a tool from its input schema: each required property gets a value of its
/// type (numbers count up from 2, so `add_numbers` is asked for 2 + 3).
fn arguments_for(schema: &serde_json::Value) -> serde_json::Value {
    let mut arguments = serde_json::Map::new();
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    let mut next_number = 2;
    for name in required.iter().filter_map(|name| name.as_str()) {
        let value = match schema["properties"][name]["type"].as_str() {
            Some("number" | "integer") => {
                next_number += 1;
                serde_json::Value::from(next_number - 1)
            }
            Some("boolean") => serde_json::Value::Bool(true),
            Some("array") => serde_json::Value::Array(Vec::new()),
            Some("object") => serde_json::Value::Object(Default::default()),
            _ => serde_json::Value::from("conformance"),
        };
        arguments.insert(name.to_owned(), value);
    }
    serde_json::Value::Object(arguments)
}
