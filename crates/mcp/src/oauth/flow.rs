//! The login flow ([`login`]): probe, discovery, the client, the browser step and the
//! redirect, the code exchange, and the tokens stored; what it needs ([`LoginOptions`])
//! and what it got ([`LoginReport`]).

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Url;
use rmcp::transport::auth::{AuthorizationManager, AuthorizationRequest, AuthorizationSession};

use super::browser::Browser;
use super::credentials::{FileCredentialStore, PendingStore};
use super::discovery::{discover, probe};
use super::redirect::{listen, wait_for_redirect};
use super::registration::{CLIENT_NAME, client_for};
use super::store::{OAuthRecord, OAuthStore, canonical_url};
use crate::config::{ServerSpec, TransportSpec};
use crate::error::OAuthError;

/// How long the user has to finish the browser step, unless the caller says otherwise.
pub const DEFAULT_LOGIN_TIMEOUT: Duration = Duration::from_secs(300);

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
    let metadata = discover(&mut manager, challenge.as_deref(), &server_url).await?;
    let mut scopes = granted;
    for scope in manager.select_initial_scopes(&[]).await {
        if !scopes.contains(&scope) {
            scopes.push(scope);
        }
    }

    let (listener, redirect_uri) = listen().await?;

    let (client_id, client_secret) = client_for(
        spec,
        options.client_secret.as_deref(),
        &metadata,
        &mut manager,
        &redirect_uri,
        &scopes,
    )
    .await?;

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
