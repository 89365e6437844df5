//! The client under test for the official MCP conformance suite
//! (`@modelcontextprotocol/conformance client --command ...`): keel's own MCP client code
//! ([`McpServers`] and its tools) pointed at the scenario's server.
//!
//! Usage: `keel-mcp-conformance-client URL`, with `MCP_CONFORMANCE_SCENARIO` naming the
//! scenario (the suite sets both). It connects (initialize, `tools/list`), then calls every
//! listed tool once, with arguments made from its input schema (`add_numbers` of the
//! `tools_call` scenario gets `a = 2`, `b = 3`), and exits 0 when every step worked.
//! For an `auth/*` scenario it first logs in as `keel mcp login` does ([`oauth::login`]),
//! with an HTTP fetch of the authorization URL as the browser, into a scratch token store.
//! It is a test harness, not part of keel's interface.

use std::collections::BTreeMap;
use std::process::ExitCode;

use keel_contracts::{Outcome, SandboxMode, SessionId, ToolCallId, ToolContext};
use keel_mcp::oauth::{self, FetchingBrowser, LoginOptions, OAuthStore};
use keel_mcp::{
    ElicitationPolicy, McpServerConfig, McpServers, ServerSpec, ServerState, StartOptions,
};

/// The client ID metadata document URL the suite's `auth/basic-cimd` scenario expects.
const CIMD_URL: &str = "https://conformance-test.local/client-metadata.json";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let Some(url) = std::env::args().nth(1) else {
        eprintln!("usage: keel-mcp-conformance-client URL");
        return ExitCode::from(2);
    };
    let scenario = std::env::var("MCP_CONFORMANCE_SCENARIO").unwrap_or_default();
    eprintln!("scenario {scenario:?} against {url}");
    let auth = scenario.starts_with("auth/");
    // Scenario data: the pre-registered client of `auth/pre-registration`.
    let context: serde_json::Value = std::env::var("MCP_CONFORMANCE_CONTEXT")
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or_default();
    let client_id = context["client_id"].as_str().map(str::to_owned);
    let client_secret = context["client_secret"].as_str().map(str::to_owned);
    let config = McpServerConfig {
        url: Some(url),
        startup_timeout_ms: Some(20_000),
        oauth_client_id: client_id.clone(),
        oauth_client_secret_env: client_secret.as_ref().map(|_| "CONFORMANCE_SECRET".into()),
        // The document the suite's client ID metadata scenario expects (it is not fetched).
        oauth_client_metadata_url: auth.then(|| CIMD_URL.to_owned()),
        ..Default::default()
    };
    let spec = match config.validate("conformance") {
        Ok(spec) => spec,
        Err(error) => {
            eprintln!("config: {error}");
            return ExitCode::from(2);
        }
    };
    let scratch = std::env::temp_dir().join(format!("keel-mcp-conformance-{}", std::process::id()));
    let store = OAuthStore::new(scratch.join("oauth"));
    let login = LoginOptions {
        store: store.clone(),
        client_secret,
        timeout: std::time::Duration::from_secs(30),
    };
    let options = StartOptions {
        log_dir: scratch.join("logs"),
        workspace: std::env::temp_dir(),
        inherited_env: BTreeMap::new(),
        bearer_tokens: Default::default(),
        // The suite's answers are the defaults it offers (as under `--approval auto`).
        elicitation: ElicitationPolicy::AcceptDefaults,
        oauth: Some(store),
    };
    let mut logins = 0;
    let ok = loop {
        if auth {
            // `keel mcp login`, with an HTTP fetch of the authorization URL as the browser
            // (the suite's authorization server redirects at once).
            logins += 1;
            match oauth::login(&spec, &login, &FetchingBrowser).await {
                Ok(report) => eprintln!(
                    "logged in at {} as {} (scopes {:?})",
                    report.authorization_server, report.client_id, report.scopes
                ),
                Err(error) => {
                    eprintln!("login failed: {error}");
                    break false;
                }
            }
        }
        let (ok, wants_scope) = run(&spec, &options).await;
        // A server that asks for more scopes gets them the way a user gives them: by
        // running `keel mcp login` again, which asks for what the server asked for. A
        // user who keeps being refused stops; so does this harness, after MAX_LOGINS.
        if auth && wants_scope && logins < MAX_LOGINS {
            eprintln!("the server asks for more scopes: logging in again");
            continue;
        }
        break ok;
    };
    let _ = std::fs::remove_dir_all(&scratch);
    if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE }
}

/// How many times the harness logs in when the server keeps asking for more scopes.
const MAX_LOGINS: u32 = 3;

/// Connects, calls every tool once, closes. Whether every step worked, and whether a step
/// failed because the server asked for more OAuth scopes (`keel mcp login` would help).
async fn run(spec: &ServerSpec, options: &StartOptions) -> (bool, bool) {
    let servers = McpServers::start(vec![spec.clone()], options.clone()).await;
    let mut ok = true;
    let mut wants_scope = false;
    for status in servers.statuses() {
        match &status.state {
            ServerState::Connected => eprintln!("connected; {} tools", status.tools.len()),
            ServerState::Failed { reason } => {
                eprintln!("failed to connect: {reason}");
                wants_scope |= reason.contains(SCOPE_ERROR);
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
        wants_scope |= output.outcome != Outcome::Ok && output.content.contains(SCOPE_ERROR);
        ok &= output.outcome == Outcome::Ok;
    }
    for asked in servers.elicitations() {
        eprintln!("elicitation: {asked:?}");
    }
    servers.close().await;
    (ok, wants_scope)
}

/// What keel says when a server refuses a token for lack of scope.
const SCOPE_ERROR: &str = "asks for more OAuth scopes";

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
