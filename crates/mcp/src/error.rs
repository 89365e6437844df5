//! Errors of keel-mcp: configuration validation ([`ConfigError`]), server start-up
//! ([`ConnectError`]) and OAuth logins ([`OAuthError`], public as
//! `keel_mcp::oauth::OAuthError`). Tool calls never return `Err`: their failures are `error`
//! results.

use std::path::PathBuf;
use std::time::Duration;

use rmcp::transport::auth::AuthError;

/// A `[mcp_servers.NAME]` table that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The server name is empty, longer than [`crate::MAX_SERVER_NAME_LEN`], or has
    /// characters other than `[A-Za-z0-9_-]`, or `__`.
    #[error(
        "mcp server name '{server}' is invalid: use letters, digits, '_' and '-' (no '__', at most 32 characters)"
    )]
    InvalidName {
        /// The name as written.
        server: String,
    },
    /// Neither `command` nor `url` is set.
    #[error("mcp server '{server}' needs either `command` (stdio) or `url` (streamable HTTP)")]
    NoTransport {
        /// The server name.
        server: String,
    },
    /// Both `command` and `url` are set.
    #[error("mcp server '{server}' sets both `command` and `url`; choose one")]
    BothTransports {
        /// The server name.
        server: String,
    },
    /// `command` is empty.
    #[error("mcp server '{server}' has an empty `command`")]
    EmptyCommand {
        /// The server name.
        server: String,
    },
    /// A key that only applies to a stdio server is set on a URL server.
    #[error("mcp server '{server}': `{key}` applies only to a stdio server (`command`)")]
    StdioOnlyKey {
        /// The server name.
        server: String,
        /// `args`, `env` or `cwd`.
        key: &'static str,
    },
    /// A key that only applies to a URL server is set on a stdio server.
    #[error("mcp server '{server}': `{key}` applies only to a URL server (`url`)")]
    HttpOnlyKey {
        /// The server name.
        server: String,
        /// `headers` or `bearer_token_env`.
        key: &'static str,
    },
    /// A `headers` entry is not a valid HTTP header (name or value).
    #[error("mcp server '{server}': header '{header}' is not a valid HTTP header name and value")]
    InvalidHeader {
        /// The server name.
        server: String,
        /// The header name as written.
        header: String,
    },
    /// `bearer_token_env` is not an environment variable name.
    #[error(
        "mcp server '{server}': bearer_token_env '{variable}' must be an environment variable \
         name (letters, digits, '_')"
    )]
    InvalidTokenVariable {
        /// The server name.
        server: String,
        /// The name as written.
        variable: String,
    },
    /// `url` is not an `http://` or `https://` URL.
    #[error("mcp server '{server}': url '{url}' must start with http:// or https://")]
    InvalidUrl {
        /// The server name.
        server: String,
        /// The URL as written.
        url: String,
    },
    /// `oauth_client_secret_env` without `oauth_client_id`.
    #[error("mcp server '{server}': `oauth_client_secret_env` needs `oauth_client_id`")]
    OAuthSecretWithoutId {
        /// The server name.
        server: String,
    },
    /// An `oauth_*` client setting is unusable (an empty client ID, a client metadata
    /// document URL that is not `https://` with a path).
    #[error("mcp server '{server}': `{key}` is invalid")]
    InvalidOAuthClient {
        /// The server name.
        server: String,
        /// The key.
        key: &'static str,
    },
    /// A timeout is zero.
    #[error("mcp server '{server}': `{key}` must be greater than 0")]
    ZeroTimeout {
        /// The server name.
        server: String,
        /// `startup_timeout_ms` or `tool_timeout_ms`.
        key: &'static str,
    },
    /// A `[mcp_servers.NAME.tools.TOOL]` table has an empty tool name.
    #[error("mcp server '{server}': a `tools` table has an empty tool name")]
    EmptyToolName {
        /// The server name.
        server: String,
    },
}

/// Why a server could not be started and initialized.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The command could not be spawned.
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        /// The command as configured.
        command: String,
        /// The spawn error.
        #[source]
        source: std::io::Error,
    },
    /// The log file under the log folder could not be opened.
    #[error("cannot open the server log {path}: {source}")]
    Log {
        /// The log file.
        path: std::path::PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Initialization and the first `tools/list` did not finish in time.
    #[error("no answer within the startup timeout ({} ms){}", timeout.as_millis(), tail(stderr_tail))]
    StartupTimeout {
        /// The configured startup timeout.
        timeout: Duration,
        /// The last lines the server wrote on stderr.
        stderr_tail: Vec<String>,
    },
    /// The MCP handshake failed (the process exited, or spoke something else).
    #[error("initialization failed: {message}{}", tail(stderr_tail))]
    Initialize {
        /// rmcp's description.
        message: String,
        /// The last lines the server wrote on stderr.
        stderr_tail: Vec<String>,
    },
    /// The environment variable named by `bearer_token_env` is not set (or empty).
    #[error("the environment variable {variable} (bearer_token_env) is not set")]
    MissingToken {
        /// The variable's name.
        variable: String,
    },
    /// The server answered 401 (or 403 for a scope) and keel has no usable login for it:
    /// none stored, or the stored one was refused and could not be refreshed. A headless
    /// run never waits for a browser; the user logs in with `keel mcp login NAME`.
    #[error(
        "the server requires authorization (HTTP 401/403){}: run `keel mcp login {server}` \
         (or, if the server takes a static token, set `bearer_token_env` or `headers` in your \
         own config)",
        if *had_login { " and its stored OAuth login was refused and could not be refreshed" } else { "" }
    )]
    AuthorizationRequired {
        /// The server's name.
        server: String,
        /// Whether a stored OAuth login was tried.
        had_login: bool,
    },
    /// The server refused keel's OAuth token for lack of scope (403 `insufficient_scope`).
    #[error(
        "the server asks for more OAuth scopes ({scope}) than keel's login holds: run \
         `keel mcp login {server}` to grant them"
    )]
    InsufficientScope {
        /// The server's name.
        server: String,
        /// The scopes it asks for, as it names them.
        scope: String,
    },
    /// The stored OAuth login could not be used (unreadable token file, broken metadata).
    #[error("the stored OAuth login cannot be used: {message}; run `keel mcp login {server}`")]
    OAuth {
        /// The server's name.
        server: String,
        /// Why, for humans (never a token).
        message: String,
    },
    /// `tools/list` failed.
    #[error("tools/list failed: {message}{}", tail(stderr_tail))]
    ListTools {
        /// rmcp's description.
        message: String,
        /// The last lines the server wrote on stderr.
        stderr_tail: Vec<String>,
    },
}

fn tail(lines: &[String]) -> String {
    if lines.is_empty() { String::new() } else { format!("; stderr: {}", lines.join(" | ")) }
}

/// Why a login, or the use of a stored one, failed. The text never holds a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthError {
    /// The server is not a URL server.
    #[error("mcp server '{server}' is not a URL server; OAuth applies to `url` servers only")]
    NotHttp {
        /// The server's name.
        server: String,
    },
    /// The server's table came from a workspace file.
    #[error(
        "mcp server '{server}' comes from a workspace config; keel logs in only to servers of \
         your own config"
    )]
    FromWorkspace {
        /// The server's name.
        server: String,
    },
    /// The server URL does not parse.
    #[error("the server URL '{url}' is not a valid URL")]
    InvalidUrl {
        /// The URL as configured.
        url: String,
    },
    /// The server could not be reached, or answered something other than 401/403/2xx.
    #[error("cannot ask the server for its authorization requirements: {message}")]
    Probe {
        /// Why.
        message: String,
    },
    /// The server answered without asking for authorization.
    #[error(
        "the server did not ask for authorization (HTTP {status}); there is nothing to log in to"
    )]
    NotRequired {
        /// The status it answered with.
        status: u16,
    },
    /// Discovery or the OAuth exchange failed (rmcp's reason: a resource metadata
    /// `resource` that does not name this server, an issuer mismatch, ...).
    #[error("{0}")]
    Auth(String),
    /// The server publishes no authorization metadata; keel does not guess endpoints.
    #[error(
        "the server publishes no OAuth metadata (no protected resource or authorization server \
         metadata was found); keel does not guess authorization endpoints"
    )]
    NoMetadata,
    /// The authorization server does not advertise PKCE with S256.
    #[error(
        "the authorization server does not advertise PKCE with S256 \
         (code_challenge_methods_supported); keel refuses to log in without it"
    )]
    PkceUnsupported,
    /// An endpoint is not `https://` (and not on loopback with a loopback server).
    #[error(
        "the authorization server's {endpoint} '{url}' is not https://; keel sends credentials \
         over plain HTTP only between loopback addresses"
    )]
    InsecureEndpoint {
        /// Which endpoint (`authorization_endpoint`, ...).
        endpoint: &'static str,
        /// Its URL.
        url: String,
    },
    /// No way to get a client ID.
    #[error(
        "the authorization server offers no dynamic client registration; register a client \
         with it and set `oauth_client_id` (and `oauth_client_secret_env`) for this server in \
         your own config"
    )]
    NoRegistration,
    /// The browser step failed.
    #[error("the browser step failed: {0}")]
    Browser(String),
    /// The redirect brought an error or could not be read.
    #[error("the authorization did not complete: {0}")]
    Callback(String),
    /// The user did not finish in time.
    #[error("no redirect arrived within {} s; run the login again", .0.as_secs())]
    Timeout(Duration),
    /// The token file could not be read or written.
    #[error("token file {path}: {message}")]
    Store {
        /// The file.
        path: PathBuf,
        /// Why.
        message: String,
    },
}

impl OAuthError {
    /// rmcp's `AuthError` as [`OAuthError::Auth`], by its text.
    pub(crate) fn auth(error: &AuthError) -> OAuthError {
        OAuthError::Auth(error.to_string())
    }
}
