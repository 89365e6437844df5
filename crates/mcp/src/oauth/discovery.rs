//! Discovery and keel's checks of what it finds: the probe that asks the server for its
//! challenge ([`probe`]), rmcp's metadata discovery ([`discover`]) and keel's own rules on
//! the metadata ([`check_metadata`]: PKCE S256, no plain HTTP off loopback).

use std::net::IpAddr;
use std::time::Duration;

use reqwest::Url;
use rmcp::transport::auth::{
    AuthorizationManager, AuthorizationMetadata, AuthorizationMetadataSource,
};

use crate::error::OAuthError;

/// How long one request of the probe may take.
pub(super) const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// Discovers the authorization server's metadata for the server at `server_url` through
/// rmcp, from `challenge` (else the well-known URLs), refuses a fallback to guessed
/// endpoints, checks it with keel's own rules ([`check_metadata`]) and sets it on
/// `manager`.
///
/// # Errors
///
/// [`OAuthError::Auth`] when rmcp's discovery fails, [`OAuthError::NoMetadata`] when none
/// was found, and what [`check_metadata`] refuses.
pub(super) async fn discover(
    manager: &mut AuthorizationManager,
    challenge: Option<&str>,
    server_url: &Url,
) -> Result<AuthorizationMetadata, OAuthError> {
    let resolution = manager
        .resolve_metadata_from_challenge(challenge)
        .await
        .map_err(|e| OAuthError::auth(&e))?;
    if resolution.source == AuthorizationMetadataSource::LegacyEndpointFallback {
        return Err(OAuthError::NoMetadata);
    }
    let metadata = resolution.metadata;
    check_metadata(server_url, &metadata)?;
    manager.set_metadata(metadata.clone());
    Ok(metadata)
}

/// Whether `url`'s host is a loopback name or address.
fn is_loopback_host(url: &Url) -> bool {
    let Some(host) = url.host_str() else { return false };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    let domain = host.trim_end_matches('.').to_ascii_lowercase();
    domain == "localhost" || domain.ends_with(".localhost")
}

/// keel's own checks of discovered metadata, on top of rmcp's (resource and issuer):
/// PKCE S256 advertised, and the issuer and every endpoint `https://` unless it and the
/// server are both on loopback.
pub(super) fn check_metadata(
    server: &Url,
    metadata: &AuthorizationMetadata,
) -> Result<(), OAuthError> {
    let s256 = metadata
        .code_challenge_methods_supported
        .as_ref()
        .is_some_and(|methods| methods.iter().any(|method| method == "S256"));
    if !s256 {
        return Err(OAuthError::PkceUnsupported);
    }
    // The issuer too: metadata fetched over plain HTTP could name any endpoints.
    let endpoints = [
        ("issuer", metadata.issuer.as_ref()),
        ("authorization_endpoint", Some(&metadata.authorization_endpoint)),
        ("token_endpoint", Some(&metadata.token_endpoint)),
        ("registration_endpoint", metadata.registration_endpoint.as_ref()),
    ];
    for (endpoint, url) in endpoints {
        let Some(url) = url else { continue };
        let insecure = || OAuthError::InsecureEndpoint { endpoint, url: url.clone() };
        let parsed = Url::parse(url).map_err(|_| insecure())?;
        let allowed = match parsed.scheme() {
            "https" => true,
            "http" => is_loopback_host(server) && is_loopback_host(&parsed),
            _ => false,
        };
        if !allowed {
            return Err(insecure());
        }
    }
    Ok(())
}

/// Asks the server without a token: POSTs `initialize` and, when a server lets that
/// through, `tools/list` on the session it opened. The first 401/403 challenge
/// (`WWW-Authenticate`, `None` when the refusal carries none).
pub(super) async fn probe(url: &str) -> Result<Option<String>, OAuthError> {
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(PROBE_TIMEOUT)
        .build()
        .map_err(|error| OAuthError::Probe { message: error.to_string() })?;
    let initialize = serde_json::json!({
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {
            "protocolVersion": crate::client::OFFERED_PROTOCOL_VERSION.as_str(),
            "capabilities": {},
            "clientInfo": {"name": "keel", "version": env!("CARGO_PKG_VERSION")},
        },
    });
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"});
    let mut session: Option<String> = None;
    let mut last_status = reqwest::StatusCode::OK;
    for message in [&initialize, &initialized, &list] {
        let mut request = client
            .post(url)
            .header(reqwest::header::ACCEPT, "application/json, text/event-stream")
            .header("mcp-protocol-version", crate::client::OFFERED_PROTOCOL_VERSION.as_str())
            .json(message);
        if let Some(session) = &session {
            request = request.header("mcp-session-id", session);
        }
        let answer = request
            .send()
            .await
            .map_err(|error| OAuthError::Probe { message: error.without_url().to_string() })?;
        let status = answer.status();
        if status == reqwest::StatusCode::UNAUTHORIZED || status == reqwest::StatusCode::FORBIDDEN {
            return Ok(answer
                .headers()
                .get(reqwest::header::WWW_AUTHENTICATE)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned));
        }
        if !status.is_success() {
            return Err(OAuthError::Probe { message: format!("HTTP {status}") });
        }
        if let Some(id) = answer.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            session = Some(id.to_owned());
        }
        last_status = status;
    }
    if let Some(session) = session {
        let _ = client.delete(url).header("mcp-session-id", session).send().await;
    }
    Err(OAuthError::NotRequired { status: last_status.as_u16() })
}
