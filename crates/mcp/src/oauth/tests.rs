//! Unit tests of the OAuth pieces: redaction of secrets, canonical URLs as the store's key,
//! and keel's metadata checks.

use reqwest::Url;
use rmcp::transport::auth::AuthorizationMetadata;

use super::discovery::check_metadata;
use super::store::OAuthRecord;
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
    assert_eq!(canonical_url("HTTPS://Example.COM:443/mcp#x").unwrap(), "https://example.com/mcp");
    assert_eq!(canonical_url("http://127.0.0.1:8080/mcp").unwrap(), "http://127.0.0.1:8080/mcp");
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
    let good = metadata("https://as.example.com/a", "https://as.example.com/t", Some(&["S256"]));
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
