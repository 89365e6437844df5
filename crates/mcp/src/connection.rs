//! One live MCP session with a server: rmcp's client service over stdio or streamable
//! HTTP, and for stdio the child process it talks to.

use std::collections::HashMap;
use std::process::ExitStatus;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use reqwest::header::{HeaderName, HeaderValue};
use rmcp::service::{ClientInitializeError, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransportConfig, StreamableHttpError,
};
use rmcp::{Peer, RoleClient, ServiceExt};

use crate::client::KeelClient;
use crate::config::{HttpHeaders, ServerSpec, TransportSpec};
use crate::error::ConnectError;
use crate::http::KeelHttpClient;
use crate::options::StartOptions;
use crate::secrets::Secrets;
use crate::stdio::{self, ChildGuard, Launch, ServerLog};

/// How long a crashed server is given to be reaped, to report its exit status.
const EXIT_STATUS_WAIT: Duration = Duration::from_millis(500);

/// How long closing a session may take (an HTTP session's DELETE included).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(3);

/// An initialized client session.
#[derive(Debug)]
pub(crate) struct Connection {
    peer: Peer<RoleClient>,
    service: tokio::sync::Mutex<RunningService<RoleClient, KeelClient>>,
    /// HTTP: set when the server refused the session (see [`KeelHttpClient`]).
    session_lost: Option<Arc<AtomicBool>>,
    /// HTTP: the last failed POST (see [`KeelHttpClient::last_error`]).
    last_http_error: Option<Arc<std::sync::Mutex<Option<String>>>>,
    /// HTTP: the challenge of the last request refused with 401/403.
    last_challenge: Option<Arc<std::sync::Mutex<Option<String>>>>,
    /// HTTP: whether the connection uses a stored OAuth login.
    oauth_login: bool,
    // Dropped after `service`, so the transport closes before the group is killed.
    child: Option<ChildGuard>,
}

impl Connection {
    /// Spawns or connects to the server and runs the MCP handshake. Not bounded in time:
    /// the caller applies the startup timeout (dropping this future kills a spawned child).
    pub(crate) async fn open(
        spec: &ServerSpec,
        options: &StartOptions,
        log: Option<&Arc<ServerLog>>,
        handler: &KeelClient,
        secrets: &Secrets,
    ) -> Result<Connection, ConnectError> {
        let tail = || log.map(|log| log.tail()).unwrap_or_default();
        let initialize_error = |error: &ClientInitializeError| ConnectError::Initialize {
            message: describe(error),
            stderr_tail: tail(),
        };
        match &spec.transport {
            TransportSpec::Stdio { command, args, env, cwd } => {
                let log = log.ok_or_else(|| ConnectError::Initialize {
                    message: "no log for a stdio server".into(),
                    stderr_tail: Vec::new(),
                })?;
                let launch = Launch {
                    command,
                    args,
                    env,
                    cwd: match cwd {
                        Some(cwd) => options.workspace.join(cwd),
                        None => options.workspace.clone(),
                    },
                    inherited_env: &options.inherited_env,
                };
                let spawned = stdio::spawn(&launch, log)?;
                let child = spawned.child;
                let service = match handler.clone().serve((spawned.stdout, spawned.stdin)).await {
                    Ok(service) => service,
                    Err(error) => {
                        // Let stderr drain so the report says why the server died.
                        let _ = child.exit_status_within(EXIT_STATUS_WAIT).await;
                        return Err(initialize_error(&error));
                    }
                };
                Ok(Connection::new(service, Some(child), None, None))
            }
            TransportSpec::Http { url, headers, bearer_token_env } => {
                let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str())
                    .reinit_on_expired_session(true)
                    .custom_headers(header_map(headers)?);
                // A server may echo what it got into its error body or its results: the
                // user's header values and tokens never reach keel's report of it.
                secrets.add(headers.0.values().cloned());
                if let Some(variable) = bearer_token_env {
                    let token = options
                        .bearer_tokens
                        .0
                        .get(variable)
                        .filter(|token| !token.is_empty())
                        .ok_or_else(|| ConnectError::MissingToken { variable: variable.clone() })?;
                    secrets.add([token.clone()]);
                    config = config.auth_header(token.clone());
                }
                let client = KeelHttpClient::new().map_err(|error| ConnectError::Initialize {
                    message: format!("cannot set up the HTTP client: {error}"),
                    stderr_tail: Vec::new(),
                })?;
                let session_lost = client.session_lost();
                let last_error = client.last_error();
                let last_challenge = client.last_challenge();
                // A stored OAuth login for this very URL, for a server of the user's own
                // config that sends no token of its own.
                let oauth = match (&options.oauth, bearer_token_env) {
                    (Some(store), None) if !spec.from_workspace => {
                        crate::oauth::authorized_manager(store, url, secrets).await.map_err(
                            |error| ConnectError::OAuth {
                                server: spec.name.clone(),
                                message: error.to_string(),
                            },
                        )?
                    }
                    _ => None,
                };
                let had_login = oauth.is_some();
                let served = match oauth {
                    Some(manager) => {
                        let client = rmcp::transport::AuthClient::new(client, manager);
                        let transport = StreamableHttpClientTransport::with_client(client, config);
                        handler.clone().serve(transport).await
                    }
                    None => {
                        let transport = StreamableHttpClientTransport::with_client(client, config);
                        handler.clone().serve(transport).await
                    }
                };
                let service = served.map_err(|error| {
                    let refused = needs_authorization(&error)
                        .then(|| refusal(options, spec, &last_challenge))
                        .flatten();
                    if let Some(Refusal::Scope(scope)) = refused {
                        ConnectError::InsufficientScope { server: spec.name.clone(), scope }
                    } else if needs_authorization(&error) {
                        ConnectError::AuthorizationRequired { server: spec.name.clone(), had_login }
                    } else {
                        ConnectError::Initialize {
                            message: secrets.scrub(describe(&error)),
                            stderr_tail: tail(),
                        }
                    }
                })?;
                let mut connection =
                    Connection::new(service, None, Some(session_lost), Some(last_error));
                connection.last_challenge = Some(last_challenge);
                connection.oauth_login = had_login;
                Ok(connection)
            }
        }
    }

    fn new(
        service: RunningService<RoleClient, KeelClient>,
        child: Option<ChildGuard>,
        session_lost: Option<Arc<AtomicBool>>,
        last_http_error: Option<Arc<std::sync::Mutex<Option<String>>>>,
    ) -> Connection {
        Connection {
            peer: service.peer().clone(),
            service: tokio::sync::Mutex::new(service),
            session_lost,
            last_http_error,
            last_challenge: None,
            oauth_login: false,
            child,
        }
    }

    /// HTTP: why the server refused the last failed request, when it was an authorization
    /// refusal keel could not mend (see [`refusal`]), as the error to report.
    pub(crate) fn refusal(
        &self,
        spec: &ServerSpec,
        options: &StartOptions,
    ) -> Option<ConnectError> {
        Some(match refusal(options, spec, self.last_challenge.as_ref()?)? {
            Refusal::Scope(scope) => {
                ConnectError::InsufficientScope { server: spec.name.clone(), scope }
            }
            Refusal::Login => ConnectError::AuthorizationRequired {
                server: spec.name.clone(),
                had_login: self.oauth_login,
            },
        })
    }

    /// HTTP: how the last failed request failed (`HTTP 500 ...`), if one did.
    pub(crate) fn last_http_error(&self) -> Option<String> {
        self.last_http_error.as_ref()?.lock().ok()?.clone()
    }

    /// Whether an HTTP server refused this connection's session: requests it refused
    /// never ran, so a request that failed with the connection can be sent on a new one.
    pub(crate) fn lost_its_session(&self) -> bool {
        self.session_lost.as_ref().is_some_and(|lost| lost.load(Ordering::SeqCst))
    }

    /// The peer to send requests to.
    pub(crate) fn peer(&self) -> &Peer<RoleClient> {
        &self.peer
    }

    /// Whether requests can still be sent and answered.
    pub(crate) fn is_alive(&self) -> bool {
        let child_running =
            self.child.as_ref().is_none_or(|child| child.try_exit_status().is_none());
        // A service being closed right now holds the lock: it is not alive.
        let open = self.service.try_lock().is_ok_and(|service| !service.is_closed());
        child_running && open && !self.peer.is_transport_closed()
    }

    /// Ends the session within a few seconds: for an HTTP server, rmcp's worker sends the
    /// session's `DELETE` before it stops. Later requests fail as on a closed connection.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the session closing in the background.
    pub(crate) async fn close(&self) {
        let mut service = self.service.lock().await;
        let _ = service.close_with_timeout(CLOSE_TIMEOUT).await;
    }

    /// For a stdio server that went away: its exit status, waiting briefly for it.
    pub(crate) async fn exit_status(&self) -> Option<ExitStatus> {
        match &self.child {
            Some(child) => child.exit_status_within(EXIT_STATUS_WAIT).await,
            None => None,
        }
    }
}

/// An authorization refusal of the server's.
enum Refusal {
    /// 403 `insufficient_scope`: the scopes it asks for.
    Scope(String),
    /// 401 that a refresh did not mend (or no login at all).
    Login,
}

/// The refusal in `last` (the challenge of the last request refused with 401/403 and not
/// answered since; taken, so it is reported once). A 403 `insufficient_scope` challenge is
/// noted with the server's stored login, so `keel mcp login` asks for its scopes (step-up).
fn refusal(
    options: &StartOptions,
    spec: &ServerSpec,
    last: &Arc<std::sync::Mutex<Option<String>>>,
) -> Option<Refusal> {
    let challenge = last.lock().ok()?.take()?;
    let base = reqwest::Url::parse("http://localhost/").ok()?;
    let params = rmcp::transport::WWWAuthenticateParams::parse(&challenge, &base);
    if !params.is_insufficient_scope() {
        return Some(Refusal::Login);
    }
    if let (Some(store), TransportSpec::Http { url, bearer_token_env: None, .. }) =
        (&options.oauth, &spec.transport)
        && !spec.from_workspace
    {
        crate::oauth::note_step_up(store, url, &challenge);
    }
    // The server's words reach the model: scope tokens only (RFC 6749 §3.3), bounded.
    let scope: String = params
        .scope
        .unwrap_or_default()
        .chars()
        .filter(|c| *c == ' ' || (c.is_ascii_graphic() && *c != '"' && *c != '\\'))
        .take(200)
        .collect();
    Some(Refusal::Scope(if scope.trim().is_empty() { "unnamed scopes".to_owned() } else { scope }))
}

/// The configured headers as reqwest's types (validated with the config already).
fn header_map(headers: &HttpHeaders) -> Result<HashMap<HeaderName, HeaderValue>, ConnectError> {
    let mut map = HashMap::new();
    for (name, value) in &headers.0 {
        let invalid = || ConnectError::Initialize {
            message: format!("header '{name}' is not a valid HTTP header"),
            stderr_tail: Vec::new(),
        };
        let name = HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid())?;
        let mut value = HeaderValue::from_str(value).map_err(|_| invalid())?;
        value.set_sensitive(true);
        map.insert(name, value);
    }
    Ok(map)
}

/// Whether the handshake failed because the server wants authorization (HTTP 401 with a
/// `WWW-Authenticate` challenge, 403 for a missing scope, or a stored login that expired
/// and could not be refreshed).
fn needs_authorization(error: &ClientInitializeError) -> bool {
    let ClientInitializeError::TransportError { error, .. } = error else { return false };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
    while let Some(current) = cause {
        if let Some(http) = current.downcast_ref::<StreamableHttpError<reqwest::Error>>()
            && matches!(
                http,
                StreamableHttpError::AuthRequired(_) | StreamableHttpError::InsufficientScope(_)
            )
        {
            return true;
        }
        cause = current.source();
    }
    false
}

/// A handshake error for humans: a transport failure as `what was being done: cause: ...`
/// (rmcp's own text names Rust types).
fn describe(error: &ClientInitializeError) -> String {
    match error {
        ClientInitializeError::TransportError { error, context } => {
            let mut message = context.to_string();
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error.error.as_ref());
            while let Some(current) = cause {
                let text = current.to_string();
                if !message.ends_with(&text) {
                    message.push_str(": ");
                    message.push_str(&text);
                }
                cause = current.source();
            }
            message
        }
        other => other.to_string(),
    }
}
