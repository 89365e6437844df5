//! OAuth 2.1 for streamable-HTTP servers, as the MCP authorization spec (2025-11-25)
//! describes, on rmcp's `auth` module: [`login`] runs the authorization-code flow once
//! (`keel mcp login NAME`), [`OAuthStore`] keeps what it got, and a connection uses the
//! stored login ([`authorized_manager`]) with refresh on expiry and on 401.
//!
//! The flow ([`login`]):
//! 1. POST `initialize` without a token; the 401's `WWW-Authenticate` names the protected
//!    resource metadata (RFC 9728) and maybe a `scope`.
//! 2. rmcp discovers: the metadata URL from the challenge, else the well-known URLs (path
//!    inserted, then root); the metadata's `resource` must name this server; then the
//!    authorization server's metadata (RFC 8414 and OpenID discovery, path-inserted forms
//!    first), whose `issuer` must match. Only addresses of the server's own class are
//!    fetched (a loopback address only for a loopback server).
//! 3. keel refuses what it cannot use safely: no metadata at all (no endpoints guessed), an
//!    authorization server that does not advertise PKCE `S256`, and an `http://` endpoint
//!    unless both it and the MCP server are on loopback.
//! 4. The client: the user's pre-registered `oauth_client_id`; else a client ID metadata
//!    document (`oauth_client_metadata_url`) where supported; else dynamic registration
//!    (RFC 7591) with a loopback redirect URI; else an error that says to pre-register.
//! 5. Scopes: the challenge's `scope`, else the resource metadata's `scopes_supported`,
//!    else none. The authorization URL carries PKCE S256, `state` and `resource` (RFC 8707,
//!    the server's URL); the [`Browser`] sends the user there; the redirect arrives at
//!    `http://127.0.0.1:PORT/callback` (keel listens there for the flow's duration only),
//!    its `state` must match, and the code is exchanged for tokens.
//!
//! Tokens live in `KEEL_HOME/mcp/oauth/<sha256 of the server's canonical URL>.json`, mode
//! 0600 in a 0700 folder, keyed by (and checked against) that URL: a token is only ever
//! sent to the URL it was issued for. `Debug` of everything here redacts them.

use std::io::Write as _;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use reqwest::Url;
use rmcp::transport::auth::{
    AuthError, AuthorizationManager, AuthorizationMetadata, AuthorizationMetadataSource,
    AuthorizationRequest, AuthorizationSession, CredentialStore, OAuthClientConfig,
    StoredCredentials,
};
use serde::{Deserialize, Serialize};

use crate::config::{ServerSpec, TransportSpec};
use crate::secrets::Secrets;

/// How long the user has to finish the browser step, unless the caller says otherwise.
pub const DEFAULT_LOGIN_TIMEOUT: Duration = Duration::from_secs(300);

/// How long one request of the probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// The name keel registers under (RFC 7591 `client_name`).
const CLIENT_NAME: &str = "keel";

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
    fn auth(error: &AuthError) -> OAuthError {
        OAuthError::Auth(error.to_string())
    }
}

/// The canonical form of a server URL: what tokens are keyed by (scheme and host
/// lowercased, default port dropped, no fragment).
///
/// # Errors
///
/// [`OAuthError::InvalidUrl`] when it does not parse as an `http(s)` URL with a host.
pub fn canonical_url(url: &str) -> Result<String, OAuthError> {
    let invalid = || OAuthError::InvalidUrl { url: url.to_owned() };
    let mut parsed = Url::parse(url).map_err(|_| invalid())?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(invalid());
    }
    parsed.set_fragment(None);
    Ok(parsed.to_string())
}

/// Where OAuth logins are kept: one file per server URL in a folder (normally
/// `KEEL_HOME/mcp/oauth`), created 0700, files 0600.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthStore {
    dir: PathBuf,
}

/// One stored login: the server it is for, the authorization server's metadata and the
/// client keel used, and the tokens.
#[derive(Clone, Serialize, Deserialize)]
struct OAuthRecord {
    /// The canonical server URL the tokens were issued for.
    server_url: String,
    /// The authorization server's metadata, as discovered at login.
    metadata: AuthorizationMetadata,
    /// The client ID keel used.
    client_id: String,
    /// Its secret, if the registration gave one (or the user's pre-registered one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
    /// The redirect URI of the login.
    redirect_uri: String,
    /// rmcp's stored credentials (tokens, scopes, when they were received).
    #[serde(default)]
    credentials: Option<StoredCredentials>,
    /// The `WWW-Authenticate` challenge of a request the server refused for lack of scope
    /// (403 `insufficient_scope`): the next login asks for its scopes too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    step_up: Option<String>,
}

impl std::fmt::Debug for OAuthRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuthRecord")
            .field("server_url", &self.server_url)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("credentials", &self.credentials.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl OAuthRecord {
    /// The secrets in this record, for redaction from error text.
    fn secrets(&self) -> Vec<String> {
        let mut secrets: Vec<String> = self.client_secret.iter().cloned().collect();
        if let Some(credentials) = &self.credentials
            && let Ok(value) = serde_json::to_value(credentials)
        {
            for key in ["access_token", "refresh_token", "id_token"] {
                if let Some(token) = value["token_response"][key].as_str() {
                    secrets.push(token.to_owned());
                }
            }
        }
        secrets.retain(|secret| !secret.is_empty());
        secrets
    }
}

impl OAuthStore {
    /// A store in `dir` (created on first save).
    pub fn new(dir: impl Into<PathBuf>) -> OAuthStore {
        OAuthStore { dir: dir.into() }
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The token file for the server at `url`.
    ///
    /// # Errors
    ///
    /// [`OAuthError::InvalidUrl`].
    pub fn path_for(&self, url: &str) -> Result<PathBuf, OAuthError> {
        let canonical = canonical_url(url)?;
        let digest = keel_contracts::sha256_hex(canonical.as_bytes());
        Ok(self.dir.join(format!("{}.json", &digest[..32])))
    }

    /// Whether a login with tokens is stored for `url`.
    pub fn has_login(&self, url: &str) -> bool {
        matches!(self.load(url), Ok(Some(record)) if record.credentials.is_some())
    }

    /// Deletes the login stored for `url`; whether there was one.
    ///
    /// # Errors
    ///
    /// [`OAuthError::Store`] when the file exists and cannot be removed.
    pub fn remove(&self, url: &str) -> Result<bool, OAuthError> {
        let path = self.path_for(url)?;
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(OAuthError::Store { path, message: error.to_string() }),
        }
    }

    /// The record for `url`, if one is stored *for that URL* (a file whose `server_url`
    /// differs is ignored).
    fn load(&self, url: &str) -> Result<Option<OAuthRecord>, OAuthError> {
        let canonical = canonical_url(url)?;
        let path = self.path_for(url)?;
        read_record(&path, &canonical)
    }
}

/// The most a token file may hold.
const MAX_RECORD_BYTES: u64 = 1 << 20;

/// Refuses a token folder that is a symbolic link or not a folder (its target would get
/// the tokens, and a `chmod`); an absent one is fine.
fn check_dir(dir: &Path, path: &Path) -> Result<(), OAuthError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(OAuthError::Store {
            path: path.to_owned(),
            message: format!(
                "{} is a symbolic link or not a folder; keel keeps tokens only in a real folder \
                 (remove it and log in again)",
                dir.display()
            ),
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(OAuthError::Store { path: path.to_owned(), message: error.to_string() }),
    }
}

/// The bytes of the token file at `path`, `None` when absent. Opened without following a
/// symbolic link and without blocking (a FIFO would hang keel); only a regular file is read.
fn read_token_file(path: &Path) -> Result<Option<Vec<u8>>, OAuthError> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let refused = |message: String| OAuthError::Store { path: path.to_owned(), message };
    if let Some(dir) = path.parent() {
        check_dir(dir, path)?;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let file = match file {
        Ok(file) => file,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) if error.raw_os_error() == Some(libc::ELOOP) => {
            return Err(refused(
                "the token file is a symbolic link; keel reads only a regular file (remove it \
                 and log in again)"
                    .into(),
            ));
        }
        Err(error) => return Err(refused(error.to_string())),
    };
    let meta = file.metadata().map_err(|error| refused(error.to_string()))?;
    if !meta.is_file() {
        return Err(refused(
            "the token file is not a regular file (remove it and log in again)".into(),
        ));
    }
    let mut bytes = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| refused(error.to_string()))?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(refused("the token file is larger than 1 MiB".into()));
    }
    Ok(Some(bytes))
}

fn read_record(path: &Path, canonical: &str) -> Result<Option<OAuthRecord>, OAuthError> {
    let Some(bytes) = read_token_file(path)? else { return Ok(None) };
    let record: OAuthRecord =
        serde_json::from_slice(&bytes).map_err(|error| OAuthError::Store {
            path: path.to_owned(),
            message: format!("not a keel token file: {error}"),
        })?;
    Ok((record.server_url == canonical).then_some(record))
}

/// Writes `record` to `path` atomically: folder 0700, file 0600 from its creation.
fn write_record(path: &Path, record: &OAuthRecord) -> Result<(), OAuthError> {
    use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
    let store_error = |error: std::io::Error| OAuthError::Store {
        path: path.to_owned(),
        message: error.to_string(),
    };
    let dir = path.parent().ok_or_else(|| OAuthError::Store {
        path: path.to_owned(),
        message: "no parent folder".into(),
    })?;
    check_dir(dir, path)?;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(store_error)?;
    // Checked again once it exists: a symlink put there meanwhile is not chmodded.
    check_dir(dir, path)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(store_error)?;
    let bytes = serde_json::to_vec_pretty(record)
        .map_err(|error| OAuthError::Store { path: path.to_owned(), message: error.to_string() })?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        path.file_name().and_then(|name| name.to_str()).unwrap_or("token"),
        temp_suffix()
    ));
    let written = (|| {
        let mut file =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        file.write_all(&bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(store_error)
}

/// A suffix no other writer in this or another process uses at the same time.
fn temp_suffix() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or_default();
    format!("{}-{count}-{nanos}", std::process::id())
}

/// rmcp's credential store over one token file: `load` reads the file (tokens only when
/// it is for this server and client), `save` writes the record with new tokens.
struct FileCredentialStore {
    path: PathBuf,
    /// Everything but the tokens, written with them.
    template: OAuthRecord,
    /// One refresh at a time within this process.
    refresh: Arc<tokio::sync::Mutex<()>>,
    /// Whether a step-up challenge noted in the file is kept on writes (a connection's
    /// refresh), or dropped (a login, which asked for those scopes).
    keep_step_up: bool,
    /// A connection's: where the tokens it saves are added, for redaction.
    secrets: Option<Secrets>,
}

impl FileCredentialStore {
    fn new(path: PathBuf, mut template: OAuthRecord, keep_step_up: bool) -> FileCredentialStore {
        template.credentials = None;
        template.step_up = None;
        FileCredentialStore { path, template, refresh: Arc::default(), keep_step_up, secrets: None }
    }

    fn write(&self, credentials: Option<StoredCredentials>) -> Result<(), AuthError> {
        // A step-up challenge noted since this store was made is kept.
        let step_up = if self.keep_step_up {
            read_record(&self.path, &self.template.server_url)
                .ok()
                .flatten()
                .and_then(|record| record.step_up)
        } else {
            None
        };
        let record = OAuthRecord { credentials, step_up, ..self.template.clone() };
        if let Some(secrets) = &self.secrets {
            secrets.add(record.secrets());
        }
        write_record(&self.path, &record)
            .map_err(|error| AuthError::CredentialStoreError(error.to_string()))
    }
}

#[async_trait::async_trait]
impl CredentialStore for FileCredentialStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let record = read_record(&self.path, &self.template.server_url)
            .map_err(|error| AuthError::CredentialStoreError(error.to_string()))?;
        Ok(record
            .filter(|record| record.client_id == self.template.client_id)
            .and_then(|record| record.credentials))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.write(Some(credentials))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        self.write(None)
    }

    async fn on_refresh_token_rejected(
        &self,
        _credentials: &StoredCredentials,
    ) -> Result<(), AuthError> {
        // A refused refresh token is dead: drop the tokens so the next run says "log in"
        // at once. The client registration is kept.
        self.write(None)
    }

    async fn acquire_refresh_guard(
        &self,
    ) -> Result<Option<rmcp::transport::CredentialRefreshGuard>, AuthError> {
        let guard = self.refresh.clone().lock_owned().await;
        Ok(Some(rmcp::transport::CredentialRefreshGuard::new(guard)))
    }
}

/// Notes a 403 `insufficient_scope` challenge with the login stored for `url` (if there
/// is one), for the next [`login`]. Best effort: a failure to write only loses the hint.
pub(crate) fn note_step_up(store: &OAuthStore, url: &str, challenge: &str) {
    let (Ok(Some(mut record)), Ok(path)) = (store.load(url), store.path_for(url)) else {
        return;
    };
    record.step_up = Some(challenge.chars().take(2000).collect());
    let _ = write_record(&path, &record);
}

/// For a connection: an rmcp authorization manager over the login stored for `url`,
/// or `None` when there is none (or it holds no tokens). The record's secrets, and those
/// of every later refresh, are added to `secrets` (for redaction).
///
/// # Errors
///
/// [`OAuthError::Store`] for an unreadable file, [`OAuthError::Auth`] for stored metadata
/// rmcp cannot use.
pub(crate) async fn authorized_manager(
    store: &OAuthStore,
    url: &str,
    secrets: &Secrets,
) -> Result<Option<AuthorizationManager>, OAuthError> {
    let Some(record) = store.load(url)? else { return Ok(None) };
    if record.credentials.is_none() {
        return Ok(None);
    }
    let path = store.path_for(url)?;
    secrets.add(record.secrets());
    let mut manager = AuthorizationManager::new(record.server_url.as_str())
        .await
        .map_err(|e| OAuthError::auth(&e))?;
    manager.set_metadata(record.metadata.clone());
    let mut config = OAuthClientConfig::new(record.client_id.clone(), record.redirect_uri.clone());
    if let Some(secret) = &record.client_secret {
        config = config.with_client_secret(secret.clone());
    }
    manager.configure_client(config).map_err(|e| OAuthError::auth(&e))?;
    let mut credentials = FileCredentialStore::new(path, record, true);
    credentials.secrets = Some(secrets.clone());
    manager.set_credential_store(credentials);
    Ok(Some(manager))
}

/// Sends the user to the authorization URL: a real browser for `keel mcp login`, an HTTP
/// fetch for tests and the conformance harness. It returns once the user was sent (or the
/// fetch done); the redirect is awaited separately.
pub trait Browser: Send + Sync {
    /// Opens `url`.
    ///
    /// # Errors
    ///
    /// Why it could not; the login then fails with [`OAuthError::Browser`].
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>>;
}

/// A [`Browser`] that fetches the authorization URL over HTTP without a user (an
/// authorization server that redirects at once, as test servers do) and follows the
/// redirect to keel's loopback listener. For tests and headless harnesses.
#[derive(Debug, Clone, Default)]
pub struct FetchingBrowser;

impl Browser for FetchingBrowser {
    fn open<'a>(&'a self, url: &'a str) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(PROBE_TIMEOUT)
                .build()
                .map_err(|error| error.to_string())?;
            let answer = client.get(url).send().await.map_err(|error| error.to_string())?;
            let location = answer
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|value| value.to_str().ok())
                .ok_or_else(|| {
                    format!(
                        "the authorization endpoint answered {} without a redirect",
                        answer.status()
                    )
                })?
                .to_owned();
            let target = Url::parse(&location).map_err(|error| error.to_string())?;
            if target.host_str().is_none_or(|host| host != "127.0.0.1") {
                return Err(format!(
                    "the authorization endpoint redirected to {location}, not to keel"
                ));
            }
            client.get(target).send().await.map_err(|error| error.to_string())?;
            Ok(())
        })
    }
}

/// What [`login`] needs besides the server. `Debug` does not show the secret.
#[derive(Clone)]
pub struct LoginOptions {
    /// Where the tokens go.
    pub store: OAuthStore,
    /// The secret of a pre-registered `oauth_client_id`, read by the caller from
    /// `oauth_client_secret_env`.
    pub client_secret: Option<String>,
    /// How long the user has for the browser step.
    pub timeout: Duration,
}

impl std::fmt::Debug for LoginOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginOptions")
            .field("store", &self.store)
            .field("client_secret", &self.client_secret.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// What a successful login got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginReport {
    /// The token file.
    pub token_file: PathBuf,
    /// The authorization server (its issuer, or its authorization endpoint).
    pub authorization_server: String,
    /// The scopes asked for (empty: none named).
    pub scopes: Vec<String>,
    /// The client ID keel used.
    pub client_id: String,
}

/// Runs the OAuth authorization-code flow for `spec` (see the module docs) and stores the
/// tokens. Never stores anything when a step fails.
///
/// # Errors
///
/// An [`OAuthError`] naming the failed step.
///
/// # Cancel safety
///
/// Dropping the future stops listening for the redirect; nothing is stored.
pub async fn login(
    spec: &ServerSpec,
    options: &LoginOptions,
    browser: &dyn Browser,
) -> Result<LoginReport, OAuthError> {
    login_with_challenge(spec, options, browser, None).await
}

/// [`login`], seeded with the `WWW-Authenticate` challenge of a request that was refused
/// (a 403 `insufficient_scope` asks for more scopes); without one, keel asks the server.
///
/// # Errors
///
/// As [`login`].
///
/// # Cancel safety
///
/// As [`login`].
pub async fn login_with_challenge(
    spec: &ServerSpec,
    options: &LoginOptions,
    browser: &dyn Browser,
    challenge: Option<String>,
) -> Result<LoginReport, OAuthError> {
    let TransportSpec::Http { url, .. } = &spec.transport else {
        return Err(OAuthError::NotHttp { server: spec.name.clone() });
    };
    if spec.from_workspace {
        return Err(OAuthError::FromWorkspace { server: spec.name.clone() });
    }
    let canonical = canonical_url(url)?;
    let server_url =
        Url::parse(&canonical).map_err(|_| OAuthError::InvalidUrl { url: url.clone() })?;
    // A step-up: the server refused the stored token for lack of scope. Ask for what it
    // asked for, on top of what was granted before.
    let previous = options.store.load(&canonical).ok().flatten();
    let granted: Vec<String> = previous
        .as_ref()
        .and_then(|record| record.credentials.as_ref())
        .map(|credentials| credentials.granted_scopes.clone())
        .unwrap_or_default();
    let step_up = previous.and_then(|record| record.step_up);
    let challenge = match challenge.or(step_up) {
        Some(challenge) => Some(challenge),
        None => probe(&canonical).await?,
    };

    let mut manager =
        AuthorizationManager::new(canonical.as_str()).await.map_err(|e| OAuthError::auth(&e))?;
    let resolution = manager
        .resolve_metadata_from_challenge(challenge.as_deref())
        .await
        .map_err(|e| OAuthError::auth(&e))?;
    if resolution.source == AuthorizationMetadataSource::LegacyEndpointFallback {
        return Err(OAuthError::NoMetadata);
    }
    let metadata = resolution.metadata;
    check_metadata(&server_url, &metadata)?;
    manager.set_metadata(metadata.clone());
    let mut scopes = granted;
    for scope in manager.select_initial_scopes(&[]).await {
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }

    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|error| OAuthError::Callback(format!("cannot listen on 127.0.0.1: {error}")))?;
    let port =
        listener.local_addr().map_err(|error| OAuthError::Callback(error.to_string()))?.port();
    let redirect_uri = format!("http://127.0.0.1:{port}/callback");

    let supports_documents = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    let (client_id, client_secret) = if let Some(client_id) = &spec.oauth.client_id {
        (client_id.clone(), options.client_secret.clone().filter(|secret| !secret.is_empty()))
    } else if let Some(document) =
        spec.oauth.client_metadata_url.as_ref().filter(|_| supports_documents)
    {
        (document.clone(), None)
    } else if metadata.registration_endpoint.is_some() {
        let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let registered = manager
            .register_client(CLIENT_NAME, &redirect_uri, &scope_refs)
            .await
            .map_err(|e| OAuthError::auth(&e))?;
        (registered.client_id, registered.client_secret)
    } else {
        return Err(OAuthError::NoRegistration);
    };

    let record = OAuthRecord {
        server_url: canonical.clone(),
        metadata: metadata.clone(),
        client_id: client_id.clone(),
        client_secret: client_secret.clone(),
        redirect_uri: redirect_uri.clone(),
        credentials: None,
        step_up: None,
    };
    let path = options.store.path_for(&canonical)?;
    // The tokens are written by rmcp through this store once the code is exchanged; until
    // then nothing is on disk.
    let pending = PendingStore::new(FileCredentialStore::new(path.clone(), record, false));
    let written = pending.written.clone();
    manager.set_credential_store(pending);

    let mut request = AuthorizationRequest::new(redirect_uri.clone())
        .with_client_name(CLIENT_NAME)
        .with_preregistered_client(client_id.clone());
    if let Some(secret) = client_secret {
        request = request.with_client_secret(secret);
    }
    if !scopes.is_empty() {
        request = request.with_scopes(scopes.clone());
    }
    let session = AuthorizationSession::new(manager, request)
        .await
        .map_err(|(_, error)| OAuthError::auth(&error))?;
    let auth_url = session.get_authorization_url().to_owned();
    let state = Url::parse(&auth_url)
        .ok()
        .and_then(|parsed| {
            parsed
                .query_pairs()
                .find(|(key, _)| key == "state")
                .map(|(_, value)| value.into_owned())
        })
        .ok_or_else(|| OAuthError::Callback("the authorization URL carries no state".into()))?;

    let waited = tokio::time::timeout(options.timeout, async {
        let (opened, callback) = futures::join!(
            async { browser.open(&auth_url).await.map_err(OAuthError::Browser) },
            wait_for_redirect(listener, &state)
        );
        match (opened, callback) {
            (_, Ok(callback)) => Ok(callback),
            (Err(error), Err(_)) => Err(error),
            (Ok(()), Err(error)) => Err(error),
        }
    });
    let callback = match waited.await {
        Ok(result) => result?,
        Err(_elapsed) => return Err(OAuthError::Timeout(options.timeout)),
    };
    session
        .handle_callback_with_issuer(&callback.code, &state, callback.issuer.as_deref())
        .await
        .map_err(|e| OAuthError::auth(&e))?;
    if !written.load(std::sync::atomic::Ordering::SeqCst) {
        return Err(OAuthError::Store {
            path,
            message: "the token exchange stored no tokens".into(),
        });
    }
    let scopes = scopes.into_iter().filter(|scope| !scope.is_empty()).collect();
    Ok(LoginReport {
        token_file: path,
        authorization_server: metadata
            .issuer
            .clone()
            .unwrap_or_else(|| metadata.authorization_endpoint.clone()),
        scopes,
        client_id,
    })
}

/// The file store, noting whether it was written (tokens arrived).
struct PendingStore {
    inner: FileCredentialStore,
    written: Arc<std::sync::atomic::AtomicBool>,
}

impl PendingStore {
    fn new(inner: FileCredentialStore) -> PendingStore {
        PendingStore { inner, written: Arc::default() }
    }
}

#[async_trait::async_trait]
impl CredentialStore for PendingStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        if self.written.load(std::sync::atomic::Ordering::SeqCst) {
            self.inner.load().await
        } else {
            // A login starts from nothing: whatever an earlier login left is replaced.
            Ok(None)
        }
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        self.inner.save(credentials).await?;
        self.written.store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(())
    }

    async fn clear(&self) -> Result<(), AuthError> {
        // Nothing of this login is on disk yet; an earlier login's file is left as it is.
        Ok(())
    }
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
fn check_metadata(server: &Url, metadata: &AuthorizationMetadata) -> Result<(), OAuthError> {
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
async fn probe(url: &str) -> Result<Option<String>, OAuthError> {
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

/// The parts of the redirect keel needs.
struct Callback {
    code: String,
    issuer: Option<String>,
}

/// What the loopback listener's handler needs: the login's `state`, and where the first
/// redirect that carries it is sent.
struct Redirects {
    state: String,
    first: tokio::sync::mpsc::Sender<Result<Callback, OAuthError>>,
}

/// Serves HTTP on `listener` (axum) until a `GET /callback` whose `state` is `state`
/// arrives: its code (or the authorization server's error). Other requests get 404, 405
/// or 400 and are otherwise ignored, so a stray or forged request cannot end the login;
/// connections are served side by side, so a stalled one holds up nothing.
///
/// Cancel safety: dropping it closes the listener.
async fn wait_for_redirect(
    listener: tokio::net::TcpListener,
    state: &str,
) -> Result<Callback, OAuthError> {
    let (first, mut received) = tokio::sync::mpsc::channel(1);
    let redirects = Arc::new(Redirects { state: state.to_owned(), first });
    let app = axum::Router::new()
        .route("/callback", axum::routing::get(on_callback))
        .fallback(|| async { page(axum::http::StatusCode::NOT_FOUND, "Not found.") })
        .with_state(redirects);
    tokio::select! {
        served = async { axum::serve(listener, app).await } => {
            Err(OAuthError::Callback(match served {
                Ok(()) => "the loopback listener stopped".to_owned(),
                Err(error) => format!("the loopback listener failed: {error}"),
            }))
        }
        Some(callback) = received.recv() => callback,
    }
}

/// `GET /callback`: the redirect when its `state` is the login's (then it is handed to
/// [`wait_for_redirect`], once), else 400.
async fn on_callback(
    axum::extract::State(redirects): axum::extract::State<Arc<Redirects>>,
    axum::extract::RawQuery(query): axum::extract::RawQuery,
) -> axum::response::Response {
    use axum::http::StatusCode;
    let Ok(mut url) = Url::parse("http://127.0.0.1/callback") else {
        return page(StatusCode::INTERNAL_SERVER_ERROR, "keel could not read the redirect.");
    };
    url.set_query(query.as_deref());
    let param = |name: &str| {
        url.query_pairs().find(|(key, _)| key == name).map(|(_, value)| value.into_owned())
    };
    if param("state").as_deref() != Some(redirects.state.as_str()) {
        return page(StatusCode::BAD_REQUEST, "The state does not match this login.");
    }
    if let Some(error) = param("error") {
        let description = param("error_description").unwrap_or_default();
        let text: String = format!("{error} {description}")
            .chars()
            .filter(|c| !c.is_control())
            .take(300)
            .collect();
        let _ = redirects.first.try_send(Err(OAuthError::Callback(format!(
            "the authorization server answered: {}",
            text.trim()
        ))));
        return page(StatusCode::OK, "The authorization was refused; see the terminal.");
    }
    let Some(code) = param("code").filter(|code| !code.is_empty()) else {
        return page(StatusCode::BAD_REQUEST, "The redirect carries no code.");
    };
    let _ = redirects.first.try_send(Ok(Callback { code, issuer: param("iss") }));
    page(StatusCode::OK, "keel is logged in. You can close this window.")
}

/// A small HTML page saying `text`, not cached, closing the connection.
fn page(status: axum::http::StatusCode, text: &str) -> axum::response::Response {
    use axum::http::header;
    use axum::response::IntoResponse as _;
    let body = format!("<!doctype html><title>keel</title><p>{text}</p>\n");
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (header::CONNECTION, "close"),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(authorize: &str, token: &str, methods: Option<&[&str]>) -> AuthorizationMetadata {
        let mut metadata = AuthorizationMetadata::default();
        metadata.authorization_endpoint = authorize.into();
        metadata.token_endpoint = token.into();
        metadata.code_challenge_methods_supported =
            methods.map(|methods| methods.iter().map(|m| (*m).to_owned()).collect());
        metadata
    }

    #[test]
    fn secrets_never_show_in_debug() {
        let options = LoginOptions {
            store: OAuthStore::new("/tmp/x"),
            client_secret: Some("cl1ent-s3cret".into()),
            timeout: DEFAULT_LOGIN_TIMEOUT,
        };
        assert!(!format!("{options:?}").contains("s3cret"), "{options:?}");
        let record: OAuthRecord = serde_json::from_value(serde_json::json!({
            "server_url": "https://h/mcp",
            "metadata": {"authorization_endpoint": "https://a/authorize", "token_endpoint": "https://a/token"},
            "client_id": "c",
            "client_secret": "cl1ent-s3cret",
            "redirect_uri": "http://127.0.0.1:1/callback",
            "credentials": {"client_id": "c", "token_response": {
                "access_token": "acc3ss-s3cret", "refresh_token": "r3fresh-s3cret", "token_type": "bearer"}},
        }))
        .unwrap();
        assert!(!format!("{record:?}").contains("s3cret"), "{record:?}");
        let mut secrets = record.secrets();
        secrets.sort();
        assert_eq!(secrets, ["acc3ss-s3cret", "cl1ent-s3cret", "r3fresh-s3cret"]);
    }

    #[test]
    fn canonical_urls_are_the_key() {
        assert_eq!(
            canonical_url("HTTPS://Example.COM:443/mcp#x").unwrap(),
            "https://example.com/mcp"
        );
        assert_eq!(
            canonical_url("http://127.0.0.1:8080/mcp").unwrap(),
            "http://127.0.0.1:8080/mcp"
        );
        assert!(canonical_url("ftp://example.com/").is_err());
        assert!(canonical_url("not a url").is_err());
        let store = OAuthStore::new("/tmp/x");
        assert_eq!(
            store.path_for("https://Example.com/mcp").unwrap(),
            store.path_for("https://example.com:443/mcp").unwrap()
        );
        assert_ne!(
            store.path_for("https://example.com/mcp").unwrap(),
            store.path_for("https://example.com/other").unwrap()
        );
    }

    #[test]
    fn redteam_mcp_oauth_no_s256_or_a_plain_http_endpoint_for_a_remote_server_is_refused() {
        let remote = Url::parse("https://mcp.example.com/mcp").unwrap();
        let loopback = Url::parse("http://127.0.0.1:9/mcp").unwrap();
        let good =
            metadata("https://as.example.com/a", "https://as.example.com/t", Some(&["S256"]));
        assert!(check_metadata(&remote, &good).is_ok());
        for methods in [None, Some(&["plain"][..])] {
            let no_pkce = metadata("https://as.example.com/a", "https://as.example.com/t", methods);
            assert!(matches!(check_metadata(&remote, &no_pkce), Err(OAuthError::PkceUnsupported)));
        }
        let http = metadata("http://as.example.com/a", "https://as.example.com/t", Some(&["S256"]));
        assert!(matches!(
            check_metadata(&remote, &http),
            Err(OAuthError::InsecureEndpoint { endpoint: "authorization_endpoint", .. })
        ));
        // A loopback server may use a loopback authorization server over http, and only that.
        let local = metadata("http://127.0.0.1:7/a", "http://localhost:7/t", Some(&["S256"]));
        assert!(check_metadata(&loopback, &local).is_ok());
        assert!(check_metadata(&remote, &local).is_err());
        let mixed = metadata("http://as.example.com/a", "http://127.0.0.1:7/t", Some(&["S256"]));
        assert!(check_metadata(&loopback, &mixed).is_err());
        let mut plain_issuer = good.clone();
        plain_issuer.issuer = Some("http://as.example.com".into());
        assert!(matches!(
            check_metadata(&remote, &plain_issuer),
            Err(OAuthError::InsecureEndpoint { endpoint: "issuer", .. })
        ));
    }
}
