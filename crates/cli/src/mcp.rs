//! `keel mcp list`: the configured MCP servers, their state, tools and declared access.
//! `keel mcp login NAME` / `keel mcp logout NAME`: a URL server's OAuth login.

use std::path::Path;

use keel_contracts::Egress;
use keel_host::error::usage;
use keel_host::mcp::start;
use keel_host::root::canonical_workspace;
use keel_mcp::ServerState;

use crate::config;
use crate::exit;

/// The most tools one request may carry at the strictest provider keel talks to (OpenAI's
/// APIs accept 128 function tools).
pub(crate) const PROVIDER_TOOL_LIMIT: usize = 128;

/// `keel mcp list`: each server's state, tools, declared access and the server's own
/// `readOnlyHint`, as text or (`json`) one JSON object. Exits 0 when every server
/// connected (or none is configured), 1 when any failed; the failed ones are named on
/// stderr.
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
        return Ok(failures(started.statuses()));
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
    Ok(failures(started.statuses()))
}

/// The exit status of a listing: `FAILED` when a server failed to connect, after naming
/// every failed one on stderr; `COMPLETED` otherwise.
fn failures(statuses: &[keel_mcp::ServerStatus]) -> u8 {
    let failed: Vec<&str> = statuses
        .iter()
        .filter(|status| matches!(status.state, ServerState::Failed { .. }))
        .map(|status| status.name.as_str())
        .collect();
    if failed.is_empty() {
        return exit::COMPLETED;
    }
    eprintln!(
        "keel: {} of {} MCP servers failed to connect: {}",
        failed.len(),
        statuses.len(),
        crate::terminal::neutralize(&failed.join(", "))
    );
    exit::FAILED
}

/// The validated server `name` of the merged config, refusing one from a workspace file.
fn server_spec(
    name: &str,
    workspace: Option<&Path>,
) -> anyhow::Result<(keel_mcp::ServerSpec, std::path::PathBuf)> {
    let workspace = canonical_workspace(workspace)?;
    let home = config::keel_home()?;
    let config = config::load_merged(&home, &workspace).map_err(|e| usage(format!("{e:#}")))?;
    let Some(server) = config.mcp_servers.get(name) else {
        let known: Vec<&str> = config.mcp_servers.keys().map(String::as_str).collect();
        return Err(usage(format!(
            "no MCP server '{name}' in your config (configured: {})",
            if known.is_empty() { "none".to_owned() } else { known.join(", ") }
        )));
    };
    let spec = server.validate(name).map_err(|error| usage(format!("config: {error}")))?;
    Ok((spec, home))
}

/// `keel mcp login NAME`: the OAuth browser step for a URL server of the user's own
/// config. Prints the authorization URL, opens a browser when one is available, waits up
/// to `timeout` (a duration such as `90s` or `5m`, or bare seconds) for the redirect on
/// 127.0.0.1, stores the tokens. A server that is not a URL server is a usage error.
pub(crate) async fn login(
    name: &str,
    workspace: Option<&Path>,
    timeout: &str,
    no_browser: bool,
) -> anyhow::Result<u8> {
    let timeout = login_timeout(timeout)?;
    let (spec, home) = server_spec(name, workspace)?;
    if !matches!(spec.transport, keel_mcp::TransportSpec::Http { .. }) {
        return Err(usage(format!(
            "mcp server '{name}' is not a URL server; OAuth login applies to `url` servers only"
        )));
    }
    let client_secret = match &spec.oauth.client_secret_env {
        Some(variable) => match std::env::var(variable) {
            Ok(secret) if !secret.is_empty() => Some(secret),
            _ => {
                return Err(usage(format!(
                    "mcp server '{name}': the environment variable {variable}                      (oauth_client_secret_env) is not set"
                )));
            }
        },
        None => None,
    };
    let options = keel_mcp::oauth::LoginOptions {
        store: keel_mcp::oauth::OAuthStore::new(keel_host::mcp::oauth_dir(&home)),
        client_secret,
        timeout,
    };
    let browser = TerminalBrowser { open: !no_browser };
    match keel_mcp::oauth::login(&spec, &options, &browser).await {
        Ok(report) => {
            let scopes = if report.scopes.is_empty() {
                "no scopes named".to_owned()
            } else {
                format!("scopes: {}", report.scopes.join(" "))
            };
            eprintln!(
                "keel: logged in to mcp server '{name}' at {} ({scopes}); tokens in {}",
                report.authorization_server,
                report.token_file.display()
            );
            Ok(exit::COMPLETED)
        }
        Err(error) => {
            eprintln!("keel: login to mcp server '{name}' failed: {error}");
            Ok(exit::FAILED)
        }
    }
}

/// `--timeout` of `keel mcp login`: a duration with its unit, as every duration flag takes
/// (`90s`, `5m`), or bare seconds (what the flag took first, so `--timeout 300` keeps
/// meaning five minutes).
fn login_timeout(text: &str) -> anyhow::Result<std::time::Duration> {
    let bare_seconds = text.trim().parse::<u64>().ok().filter(|seconds| *seconds > 0);
    bare_seconds
        .map(std::time::Duration::from_secs)
        .or_else(|| keel_host::duration::parse_duration(text))
        .ok_or_else(|| {
            usage(format!(
                "invalid --timeout '{}': give a positive time such as 90s or 5m",
                crate::terminal::neutralize(text)
            ))
        })
}

/// `keel mcp logout NAME`: deletes the stored OAuth login.
pub(crate) fn logout(name: &str, workspace: Option<&Path>) -> anyhow::Result<u8> {
    let (spec, home) = server_spec(name, workspace)?;
    let keel_mcp::TransportSpec::Http { url, .. } = &spec.transport else {
        return Err(usage(format!("mcp server '{name}' is not a URL server")));
    };
    let store = keel_mcp::oauth::OAuthStore::new(keel_host::mcp::oauth_dir(&home));
    let removed = store.remove(url).map_err(|error| anyhow::anyhow!("{error}"))?;
    if removed {
        eprintln!("keel: removed the stored login of mcp server '{name}'");
    } else {
        eprintln!("keel: no stored login for mcp server '{name}'");
    }
    Ok(exit::COMPLETED)
}

/// The browser step in a terminal: the URL on stderr, and a browser opened when one is
/// configured (`$BROWSER`) or a desktop session has an opener (`xdg-open`, `open`).
struct TerminalBrowser {
    open: bool,
}

impl keel_mcp::oauth::Browser for TerminalBrowser {
    fn open<'a>(
        &'a self,
        url: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), String>> + Send + 'a>> {
        Box::pin(async move {
            eprintln!("keel: to log in, open this URL in a browser:\n\n  {url}\n");
            eprintln!("keel: waiting for the authorization server's redirect...");
            if self.open
                && let Some(opener) = browser_opener()
            {
                // Best effort: the printed URL is the fallback.
                let _ = std::process::Command::new(opener)
                    .arg(url)
                    .stdin(std::process::Stdio::null())
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn();
            }
            Ok(())
        })
    }
}

/// The program that opens a URL in the user's browser, if there is one.
fn browser_opener() -> Option<std::ffi::OsString> {
    if let Some(browser) = std::env::var_os("BROWSER").filter(|value| !value.is_empty()) {
        return Some(browser);
    }
    let desktop = cfg!(target_os = "macos")
        || std::env::var_os("DISPLAY").is_some()
        || std::env::var_os("WAYLAND_DISPLAY").is_some();
    if !desktop {
        return None;
    }
    let name = if cfg!(target_os = "macos") { "open" } else { "xdg-open" };
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
        .map(std::ffi::OsString::from)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_timeouts_are_durations_or_bare_seconds() {
        let secs = std::time::Duration::from_secs;
        assert_eq!(login_timeout("90s").unwrap(), secs(90));
        assert_eq!(login_timeout("2m").unwrap(), secs(120));
        assert_eq!(login_timeout("300").unwrap(), secs(300));
        assert_eq!(login_timeout("1500ms").unwrap(), std::time::Duration::from_millis(1500));
        for bad in ["", "0", "0s", "soon", "10x", "-5s", "99999999999999999999999s"] {
            let error = login_timeout(bad).unwrap_err();
            assert!(keel_host::error::is_usage(&error), "{bad:?}: {error}");
        }
    }
}
