//! rmcp's credential store over one token file ([`FileCredentialStore`], and
//! [`PendingStore`] while a login waits for its tokens), and a connection's authorization
//! manager over the login stored for its URL ([`authorized_manager`]).

use std::path::PathBuf;
use std::sync::Arc;

use rmcp::transport::auth::{
    AuthError, AuthorizationManager, CredentialStore, OAuthClientConfig, StoredCredentials,
};

use super::store::{OAuthRecord, OAuthStore, read_record, write_record};
use crate::error::OAuthError;
use crate::secrets::Secrets;

/// rmcp's credential store over one token file: `load` reads the file (tokens only when
/// it is for this server and client), `save` writes the record with new tokens.
pub(super) struct FileCredentialStore {
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
    pub(super) fn new(
        path: PathBuf,
        mut template: OAuthRecord,
        keep_step_up: bool,
    ) -> FileCredentialStore {
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

/// The file store, noting whether it was written (tokens arrived).
pub(super) struct PendingStore {
    inner: FileCredentialStore,
    pub(super) written: Arc<std::sync::atomic::AtomicBool>,
}

impl PendingStore {
    pub(super) fn new(inner: FileCredentialStore) -> PendingStore {
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
