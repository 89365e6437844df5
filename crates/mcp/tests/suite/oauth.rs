//! OAuth 2.1 against a local authorization server: a small axum server on loopback that is
//! an MCP server protected by bearer tokens, its protected resource metadata (RFC 9728)
//! and its authorization server (RFC 8414 metadata, RFC 7591 registration, authorize with
//! PKCE S256 and `resource`, token with refresh), like the conformance suite's.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Form, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use keel_contracts::Outcome;
use keel_mcp::oauth::{self, FetchingBrowser, LoginOptions, OAuthError, OAuthStore};
use keel_mcp::{McpServers, ServerSpec, ServerState};
use sha2::Digest as _;

use super::support::{Scratch, call, spec};

/// What the test server does, changed by a test before or between steps.
#[derive(Debug, Clone)]
struct Knobs {
    /// The `resource` its protected resource metadata names (default: its MCP URL).
    prm_resource: Option<String>,
    /// The `issuer` its authorization server metadata names (default: its origin).
    issuer: Option<String>,
    /// `code_challenge_methods_supported` (default: `["S256"]`).
    pkce_methods: Option<Vec<String>>,
    /// `expires_in` of issued access tokens.
    expires_in: u64,
    /// Whether refresh tokens are honoured.
    refresh_works: bool,
}

impl Default for Knobs {
    fn default() -> Knobs {
        Knobs {
            prm_resource: None,
            issuer: None,
            pkce_methods: Some(vec!["S256".into()]),
            expires_in: 3600,
            refresh_works: true,
        }
    }
}

#[derive(Debug, Default)]
struct Records {
    /// Every request: `METHOD PATH` and its `Authorization` header.
    requests: Vec<(String, Option<String>)>,
    /// Access tokens the MCP endpoint accepts.
    access: BTreeSet<String>,
    /// Refresh tokens the token endpoint accepts.
    refresh: BTreeSet<String>,
    /// Codes: code -> (code_challenge, redirect_uri).
    codes: BTreeMap<String, (String, String)>,
    /// `resource` of every authorize and token request.
    resources: Vec<String>,
    issued: u32,
    refreshed: u32,
}

#[derive(Clone)]
struct AuthServer {
    origin: String,
    knobs: Arc<Mutex<Knobs>>,
    records: Arc<Mutex<Records>>,
}

impl AuthServer {
    async fn start(knobs: Knobs) -> AuthServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let origin = format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port());
        let server =
            AuthServer { origin, knobs: Arc::new(Mutex::new(knobs)), records: Arc::default() };
        let app = axum::Router::new()
            .route(
                "/mcp",
                post(mcp)
                    .get(|| async { StatusCode::METHOD_NOT_ALLOWED })
                    .delete(|| async { StatusCode::OK }),
            )
            .route("/.well-known/oauth-protected-resource/mcp", get(prm))
            .route("/.well-known/oauth-authorization-server", get(as_metadata))
            .route("/register", post(register))
            .route("/authorize", get(authorize))
            .route("/token", post(token))
            .fallback(|| async { StatusCode::NOT_FOUND })
            .layer(axum::middleware::from_fn_with_state(server.clone(), record))
            .with_state(server.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        server
    }

    fn url(&self) -> String {
        format!("{}/mcp", self.origin)
    }

    fn config(&self) -> String {
        format!("url = \"{}\"\nstartup_timeout_ms = 20000\ntool_timeout_ms = 20000", self.url())
    }

    fn spec(&self, name: &str) -> ServerSpec {
        spec(name, &self.config())
    }

    fn knobs(&self) -> std::sync::MutexGuard<'_, Knobs> {
        self.knobs.lock().unwrap()
    }

    fn records(&self) -> std::sync::MutexGuard<'_, Records> {
        self.records.lock().unwrap()
    }

    /// Every `Authorization` header the MCP endpoint got.
    fn mcp_authorizations(&self) -> Vec<Option<String>> {
        self.records()
            .requests
            .iter()
            .filter(|(line, _)| line.ends_with(" /mcp"))
            .map(|(_, authorization)| authorization.clone())
            .collect()
    }

    fn saw(&self, line: &str) -> bool {
        self.records().requests.iter().any(|(seen, _)| seen == line)
    }
}

async fn record(
    State(server): State<AuthServer>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let line = format!("{} {}", request.method(), request.uri().path());
    let authorization = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    server.records().requests.push((line, authorization));
    next.run(request).await
}

async fn mcp(State(server): State<AuthServer>, headers: HeaderMap, body: String) -> Response {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::to_owned);
    let valid = token.as_ref().is_some_and(|token| server.records().access.contains(token));
    if !valid {
        let challenge = format!(
            "Bearer resource_metadata=\"{}/.well-known/oauth-protected-resource/mcp\", \
             scope=\"mcp:tools\"",
            server.origin
        );
        return (StatusCode::UNAUTHORIZED, [(header::WWW_AUTHENTICATE, challenge)]).into_response();
    }
    let message: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    let id = message["id"].clone();
    let result = match message["method"].as_str() {
        Some("initialize") => serde_json::json!({
            "protocolVersion": "2025-11-25",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "protected", "version": "1"},
        }),
        Some("tools/list") => serde_json::json!({"tools": [
            {"name": "hello", "inputSchema": {"type": "object"}}
        ]}),
        Some("tools/call") => {
            serde_json::json!({"content": [{"type": "text", "text": "hello, authorized"}]})
        }
        _ => return StatusCode::ACCEPTED.into_response(),
    };
    let answer = serde_json::json!({"jsonrpc": "2.0", "id": id, "result": result});
    ([(header::CONTENT_TYPE, "application/json")], answer.to_string()).into_response()
}

async fn prm(State(server): State<AuthServer>) -> Response {
    let resource = server.knobs().prm_resource.clone().unwrap_or_else(|| server.url());
    axum::Json(serde_json::json!({
        "resource": resource,
        "authorization_servers": [server.origin],
        "scopes_supported": ["mcp:tools"],
    }))
    .into_response()
}

async fn as_metadata(State(server): State<AuthServer>) -> Response {
    let knobs = server.knobs().clone();
    let origin = &server.origin;
    let mut metadata = serde_json::json!({
        "issuer": knobs.issuer.unwrap_or_else(|| origin.clone()),
        "authorization_endpoint": format!("{origin}/authorize"),
        "token_endpoint": format!("{origin}/token"),
        "registration_endpoint": format!("{origin}/register"),
        "response_types_supported": ["code"],
        "grant_types_supported": ["authorization_code", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["none"],
    });
    if let Some(methods) = knobs.pkce_methods {
        metadata["code_challenge_methods_supported"] = serde_json::json!(methods);
    }
    axum::Json(metadata).into_response()
}

async fn register(axum::Json(body): axum::Json<serde_json::Value>) -> Response {
    let redirects = body["redirect_uris"].clone();
    let loopback = redirects.as_array().is_some_and(|uris| {
        uris.iter().all(|uri| uri.as_str().is_some_and(|uri| uri.starts_with("http://127.0.0.1:")))
    });
    assert!(loopback, "keel registers a loopback redirect URI only: {redirects}");
    (
        StatusCode::CREATED,
        axum::Json(
            serde_json::json!({"client_id": "keel-test-client", "redirect_uris": redirects}),
        ),
    )
        .into_response()
}

async fn authorize(
    State(server): State<AuthServer>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Response {
    assert_eq!(query.get("response_type").map(String::as_str), Some("code"));
    assert_eq!(query.get("code_challenge_method").map(String::as_str), Some("S256"));
    assert_eq!(query.get("client_id").map(String::as_str), Some("keel-test-client"));
    let redirect = query["redirect_uri"].clone();
    let mut records = server.records();
    records.resources.push(query.get("resource").cloned().unwrap_or_default());
    let code = format!("code-{}", records.codes.len());
    records.codes.insert(code.clone(), (query["code_challenge"].clone(), redirect.clone()));
    let location = format!("{redirect}?code={code}&state={}", query["state"]);
    (StatusCode::FOUND, [(header::LOCATION, location)]).into_response()
}

async fn token(
    State(server): State<AuthServer>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let knobs = server.knobs().clone();
    let mut records = server.records();
    records.resources.push(form.get("resource").cloned().unwrap_or_default());
    let refused = |error: &str| {
        (StatusCode::BAD_REQUEST, axum::Json(serde_json::json!({"error": error}))).into_response()
    };
    match form.get("grant_type").map(String::as_str) {
        Some("authorization_code") => {
            let Some((challenge, redirect)) =
                form.get("code").and_then(|code| records.codes.remove(code))
            else {
                return refused("invalid_grant");
            };
            let verifier = form.get("code_verifier").cloned().unwrap_or_default();
            let computed = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .encode(sha2::Sha256::digest(verifier.as_bytes()));
            if computed != challenge || form.get("redirect_uri") != Some(&redirect) {
                return refused("invalid_grant");
            }
        }
        Some("refresh_token") => {
            let known =
                form.get("refresh_token").is_some_and(|token| records.refresh.contains(token));
            if !knobs.refresh_works || !known {
                return refused("invalid_grant");
            }
            records.refreshed += 1;
        }
        _ => return refused("unsupported_grant_type"),
    }
    records.issued += 1;
    let access = format!("at-{}-s3cret", records.issued);
    let refresh = format!("rt-{}-s3cret", records.issued);
    records.access.insert(access.clone());
    records.refresh.insert(refresh.clone());
    axum::Json(serde_json::json!({
        "access_token": access,
        "token_type": "Bearer",
        "expires_in": knobs.expires_in,
        "refresh_token": refresh,
        "scope": "mcp:tools",
    }))
    .into_response()
}

fn login_options(scratch: &Scratch) -> LoginOptions {
    LoginOptions { store: store(scratch), client_secret: None, timeout: Duration::from_secs(20) }
}

fn store(scratch: &Scratch) -> OAuthStore {
    OAuthStore::new(scratch.log_dir().with_file_name("oauth"))
}

async fn start_with_store(scratch: &Scratch, specs: Vec<ServerSpec>) -> McpServers {
    let mut options = scratch.options();
    options.oauth = Some(store(scratch));
    McpServers::start(specs, options).await
}

fn failure(servers: &McpServers, index: usize) -> String {
    match &servers.statuses()[index].state {
        ServerState::Failed { reason } => reason.clone(),
        ServerState::Connected => panic!("connected: {:?}", servers.statuses()),
    }
}

fn mode(path: &std::path::Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn oauth_login_stores_tokens_0600_and_a_run_sends_them_to_the_server() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    let report = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    assert_eq!(report.scopes, vec!["mcp:tools".to_owned()], "the challenge's scope");
    assert_eq!(report.client_id, "keel-test-client");
    assert_eq!(mode(&report.token_file), 0o600);
    assert_eq!(mode(report.token_file.parent().unwrap()), 0o700);
    let stored = std::fs::read_to_string(&report.token_file).unwrap();
    assert!(stored.contains("at-1-s3cret") && stored.contains(&server.url()), "{stored}");
    // RFC 8707: the authorization and the token request name the server.
    assert_eq!(server.records().resources, vec![server.url(), server.url()]);
    // The probe went out without a token.
    assert_eq!(server.mcp_authorizations().first(), Some(&None));

    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert!(output.content.contains("hello, authorized"), "{}", output.content);
    assert!(
        server
            .mcp_authorizations()
            .iter()
            .any(|sent| sent.as_deref() == Some("Bearer at-1-s3cret")),
        "{:?}",
        server.mcp_authorizations()
    );
    // The token shows nowhere keel reports to a human or a model.
    let shown = format!("{:?} {:?} {}", servers.statuses(), servers, output.content);
    assert!(!shown.contains("s3cret"), "{shown}");
    servers.close().await;
}

#[tokio::test]
async fn oauth_an_expired_token_is_refreshed_and_a_refused_one_is_refreshed_on_401() {
    let server = AuthServer::start(Knobs { expires_in: 1, ..Knobs::default() }).await;
    let scratch = Scratch::new();
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Expired on the client's clock: refreshed before the first request.
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    assert!(server.records().refreshed >= 1, "{:?}", server.records());
    assert!(
        !server
            .mcp_authorizations()
            .iter()
            .any(|sent| sent.as_deref() == Some("Bearer at-1-s3cret")),
        "the expired token was sent: {:?}",
        server.mcp_authorizations()
    );
    servers.close().await;

    // Refused by the server (revoked) while still valid on the client's clock: the 401
    // makes keel refresh once and retry.
    server.knobs().expires_in = 3600;
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let before = server.records().refreshed;
    server.records().access.clear();
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    assert_eq!(server.records().refreshed, before + 1, "{:?}", server.records());
    servers.close().await;
}

#[tokio::test]
async fn oauth_a_401_after_a_refused_refresh_names_keel_mcp_login() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    let report = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    server.records().access.clear();
    server.knobs().refresh_works = false;
    let started = std::time::Instant::now();
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    let reason = failure(&servers, 0);
    assert!(reason.contains("run `keel mcp login remote`"), "{reason}");
    assert!(reason.contains("could not be refreshed"), "{reason}");
    assert!(!reason.contains("s3cret"), "{reason}");
    // Headless: no browser is waited for.
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // The dead tokens are dropped; the next run says "log in" without trying them.
    let stored = std::fs::read_to_string(&report.token_file).unwrap();
    assert!(!stored.contains("s3cret"), "{stored}");
    assert!(!store(&scratch).has_login(&server.url()));

    // Never logged in: the same advice, at once.
    let other = AuthServer::start(Knobs::default()).await;
    let servers = start_with_store(&scratch, vec![other.spec("fresh")]).await;
    let reason = failure(&servers, 0);
    assert!(reason.contains("run `keel mcp login fresh`"), "{reason}");

    // Logging in again makes it work; logging out removes it.
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    servers.close().await;
    assert!(store(&scratch).remove(&server.url()).unwrap());
    assert!(!report.token_file.exists());
}

#[tokio::test]
async fn redteam_mcp_oauth_a_token_for_one_server_is_never_sent_to_another() {
    let a = AuthServer::start(Knobs::default()).await;
    let b = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    oauth::login(&a.spec("a"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    let servers = start_with_store(&scratch, vec![a.spec("a"), b.spec("b")]).await;
    // The legitimate neighbour: A gets its token and works.
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    // B never sees a token at all (only A's login exists), and asks for its own login.
    assert!(b.mcp_authorizations().iter().all(Option::is_none), "{:?}", b.mcp_authorizations());
    assert!(failure(&servers, 1).contains("keel mcp login b"));
    // A token file copied under B's name is not B's: it names A's URL and is ignored.
    let store = store(&scratch);
    std::fs::copy(store.path_for(&a.url()).unwrap(), store.path_for(&b.url()).unwrap()).unwrap();
    let servers = start_with_store(&scratch, vec![b.spec("b")]).await;
    assert!(failure(&servers, 0).contains("keel mcp login b"));
    assert!(b.mcp_authorizations().iter().all(Option::is_none), "{:?}", b.mcp_authorizations());
}

#[tokio::test]
async fn redteam_mcp_oauth_a_workspace_server_never_gets_the_users_stored_token() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    oauth::login(&server.spec("mine"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    // A repository's table naming the very URL the user logged in to.
    let mut from_repo = server.spec("theirs");
    from_repo.from_workspace = true;
    let servers = start_with_store(&scratch, vec![from_repo.clone()]).await;
    assert!(failure(&servers, 0).contains("requires authorization"));
    assert!(
        server
            .mcp_authorizations()
            .iter()
            .all(|sent| sent.as_deref() != Some("Bearer at-1-s3cret")),
        "{:?}",
        server.mcp_authorizations()
    );
    // Nor can it be logged in to.
    let refused = oauth::login(&from_repo, &login_options(&scratch), &FetchingBrowser).await;
    assert!(matches!(refused, Err(OAuthError::FromWorkspace { .. })), "{refused:?}");
    // The user's own table for it works.
    let servers = start_with_store(&scratch, vec![server.spec("mine")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    servers.close().await;
}

/// A login refused before the browser step: nothing stored, the user never sent anywhere.
async fn refused_login(knobs: Knobs) -> (AuthServer, Scratch, String) {
    let server = AuthServer::start(knobs).await;
    let scratch = Scratch::new();
    let error = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .expect_err("the login must be refused");
    assert!(!server.saw("GET /authorize"), "{:?}", server.records().requests);
    assert!(!server.saw("POST /token"), "{:?}", server.records().requests);
    assert!(!store(&scratch).path_for(&server.url()).unwrap().exists());
    (server, scratch, error.to_string())
}

#[tokio::test]
async fn redteam_mcp_oauth_metadata_for_another_resource_is_refused() {
    let (server, _scratch, error) = refused_login(Knobs {
        prm_resource: Some("https://elsewhere.example/mcp".into()),
        ..Knobs::default()
    })
    .await;
    assert!(error.contains("resource mismatch"), "{error}");
    // Its neighbour with matching metadata logs in.
    server.knobs().prm_resource = None;
    let scratch = Scratch::new();
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
}

#[tokio::test]
async fn redteam_mcp_oauth_an_issuer_mismatch_is_refused() {
    let (server, _scratch, error) = refused_login(Knobs {
        issuer: Some("https://attacker.example".into()),
        ..Knobs::default()
    })
    .await;
    assert!(error.contains("issuer mismatch"), "{error}");
    server.knobs().issuer = None;
    let scratch = Scratch::new();
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
}

#[tokio::test]
async fn redteam_mcp_oauth_an_authorization_server_without_s256_is_refused() {
    for methods in [None, Some(vec!["plain".to_owned()])] {
        let (_server, _scratch, error) =
            refused_login(Knobs { pkce_methods: methods, ..Knobs::default() }).await;
        assert!(error.contains("S256"), "{error}");
    }
}
