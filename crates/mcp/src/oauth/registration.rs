//! Which client keel logs in as: the user's pre-registered one, a client ID metadata
//! document, or one registered dynamically (RFC 7591).

use rmcp::transport::auth::{AuthorizationManager, AuthorizationMetadata};

use crate::config::ServerSpec;
use crate::error::OAuthError;

/// The name keel registers under (RFC 7591 `client_name`).
pub(super) const CLIENT_NAME: &str = "keel";

/// The client ID (and secret) to log in to `spec` with: the user's pre-registered
/// `oauth_client_id` with `client_secret` (read by the caller; an empty one is none); else
/// the client ID metadata document `oauth_client_metadata_url` when the authorization
/// server supports them; else a client registered with it for `redirect_uri` and `scopes`.
///
/// # Errors
///
/// [`OAuthError::NoRegistration`] when the server offers none of these;
/// [`OAuthError::Auth`] when the registration fails.
pub(super) async fn client_for(
    spec: &ServerSpec,
    client_secret: Option<&str>,
    metadata: &AuthorizationMetadata,
    manager: &mut AuthorizationManager,
    redirect_uri: &str,
    scopes: &[String],
) -> Result<(String, Option<String>), OAuthError> {
    let supports_documents = metadata
        .additional_fields
        .get("client_id_metadata_document_supported")
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    if let Some(client_id) = &spec.oauth.client_id {
        Ok((
            client_id.clone(),
            client_secret.map(str::to_owned).filter(|secret| !secret.is_empty()),
        ))
    } else if let Some(document) =
        spec.oauth.client_metadata_url.as_ref().filter(|_| supports_documents)
    {
        Ok((document.clone(), None))
    } else if metadata.registration_endpoint.is_some() {
        let scope_refs: Vec<&str> = scopes.iter().map(String::as_str).collect();
        let registered = manager
            .register_client(CLIENT_NAME, redirect_uri, &scope_refs)
            .await
            .map_err(|e| OAuthError::auth(&e))?;
        Ok((registered.client_id, registered.client_secret))
    } else {
        Err(OAuthError::NoRegistration)
    }
}
