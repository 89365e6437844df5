//! OAuth 2.1 against a local authorization server ([`AuthServer`]: an MCP server protected
//! by bearer tokens, its protected resource metadata and its authorization server).

use std::time::Duration;

use keel_contracts::Outcome;
use keel_mcp::oauth::{self, FetchingBrowser, LoginOptions, OAuthError, OAuthStore};
use keel_mcp::{McpServers, ServerSpec, ServerState};

use super::oauth_server::{AuthServer, Knobs};
use super::support::{Scratch, call, spec};

trait SpecOf {
    fn spec(&self, name: &str) -> ServerSpec;
}

impl SpecOf for AuthServer {
    /// The server as a `[mcp_servers.NAME]` table of the user's own config.
    fn spec(&self, name: &str) -> ServerSpec {
        spec(name, &self.config())
    }
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
async fn oauth_a_login_refused_mid_run_fails_the_call_naming_keel_mcp_login() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    // The authorization server revokes the login: the token is refused and so is the
    // refresh.
    server.records().access.clear();
    server.knobs().refresh_works = false;
    let started = std::time::Instant::now();
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(output.content.contains("run `keel mcp login remote`"), "{}", output.content);
    assert!(!output.content.contains("s3cret"), "{}", output.content);
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    // The next call says the same at once (no login is left to try).
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert!(output.content.contains("keel mcp login remote"), "{}", output.content);
}

#[tokio::test]
async fn oauth_a_call_refused_for_scope_names_login_and_the_next_login_asks_for_it() {
    let server =
        AuthServer::start(Knobs { call_scope: Some("mcp:write".into()), ..Knobs::default() }).await;
    let scratch = Scratch::new();
    let first = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    assert_eq!(first.scopes, ["mcp:tools"]);
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Error, "{}", output.content);
    assert!(
        output.content.contains("more OAuth scopes (mcp:tools mcp:write)"),
        "{}",
        output.content
    );
    assert!(output.content.contains("run `keel mcp login remote`"), "{}", output.content);
    servers.close().await;
    // The next login asks for what the server asked for, on top of what it had.
    let second = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    assert_eq!(second.scopes, ["mcp:tools", "mcp:write"]);
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(output.outcome, Outcome::Ok, "{}", output.content);
    servers.close().await;
    // The hint was used up: the token file no longer holds it.
    let stored = std::fs::read_to_string(&second.token_file).unwrap();
    assert!(!stored.contains("insufficient_scope"), "{stored}");
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

/// Every file under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path)
            .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

#[tokio::test]
async fn redteam_mcp_oauth_a_server_echoing_the_token_gets_it_redacted_even_after_refresh() {
    let server = AuthServer::start(Knobs { expires_in: 1, echo: true, ..Knobs::default() }).await;
    let scratch = Scratch::new();
    let report = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    // Expired: refreshed on connect, so the server sees (and echoes) new tokens.
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    assert!(server.records().refreshed >= 1, "{:?}", server.records());

    let echoed = call(&servers, "mcp__remote__echo", serde_json::json!({})).await;
    assert_eq!(echoed.outcome, Outcome::Ok, "{}", echoed.content);
    assert!(echoed.content.contains("you sent Bearer <redacted>"), "{}", echoed.content);
    let failed = call(&servers, "mcp__remote__echo_error", serde_json::json!({})).await;
    assert_eq!(failed.outcome, Outcome::Error, "{}", failed.content);
    assert!(failed.content.contains("server saw Bearer <redacted>"), "{}", failed.content);
    for output in [&echoed, &failed] {
        assert!(!output.content.contains("s3cret"), "{}", output.content);
    }
    // The legitimate neighbour: the server's other words arrive as they are.
    let hello = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert_eq!(hello.outcome, Outcome::Ok, "{}", hello.content);
    assert!(hello.content.contains("hello, authorized"), "{}", hello.content);
    servers.close().await;
    // The token file holds the refreshed token, and no other file does.
    let token = server.records().access.iter().last().cloned().unwrap();
    assert_ne!(token, "at-1-s3cret");
    assert_eq!(files_containing(scratch.dir.path(), &token), vec![report.token_file.clone()]);
}

#[tokio::test]
async fn redteam_mcp_oauth_a_static_bearer_token_and_header_echoed_back_are_redacted() {
    let server = AuthServer::start(Knobs { echo: true, ..Knobs::default() }).await;
    server.records().access.insert("static-t0ken-s3cret".to_owned());
    let scratch = Scratch::new();
    let variable = "KEEL_MCP_TEST_ECHOED_TOKEN";
    let config = format!(
        "{}\nbearer_token_env = \"{variable}\"\nheaders = {{ X-Key = \"hdr-s3cret\" }}",
        server.config()
    );
    let mut options = scratch.options();
    options.bearer_tokens.0.insert(variable.to_owned(), "static-t0ken-s3cret".to_owned());
    let servers = McpServers::start(vec![spec("remote", &config)], options).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let echoed = call(&servers, "mcp__remote__echo", serde_json::json!({})).await;
    assert_eq!(echoed.outcome, Outcome::Ok, "{}", echoed.content);
    assert!(echoed.content.contains("you sent Bearer <redacted>"), "{}", echoed.content);
    let failed = call(&servers, "mcp__remote__echo_error", serde_json::json!({})).await;
    assert!(failed.content.contains("server saw Bearer <redacted>"), "{}", failed.content);
    assert!(!format!("{}{}", echoed.content, failed.content).contains("s3cret"));
    // The token did go to the server.
    assert!(
        server
            .mcp_authorizations()
            .iter()
            .any(|s| s.as_deref() == Some("Bearer static-t0ken-s3cret"))
    );
    servers.close().await;
}

#[tokio::test]
async fn redteam_mcp_oauth_a_fifo_or_symlinked_token_file_or_folder_is_refused() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    let store = store(&scratch);
    let path = store.path_for(&server.url()).unwrap();
    let start = || async {
        let started = std::time::Instant::now();
        let servers = tokio::time::timeout(
            Duration::from_secs(15),
            start_with_store(&scratch, vec![server.spec("remote")]),
        )
        .await
        .expect("keel hung on the token file");
        assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
        let reason = failure(&servers, 0);
        servers.close().await;
        reason
    };

    // A FIFO where the token file goes: refused at once, not waited on.
    std::fs::create_dir_all(store.dir()).unwrap();
    let made = std::process::Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(made.success());
    let reason = start().await;
    assert!(reason.contains("not a regular file"), "{reason}");
    assert!(!store.has_login(&server.url()));
    std::fs::remove_file(&path).unwrap();

    // A symlinked token file (to a real login elsewhere) is not followed.
    let report = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap();
    let elsewhere = scratch.dir.path().join("elsewhere.json");
    std::fs::rename(&report.token_file, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let reason = start().await;
    assert!(reason.contains("symbolic link"), "{reason}");
    std::fs::remove_file(&path).unwrap();

    // A symlinked folder is neither written into nor chmodded.
    let target = scratch.dir.path().join("target");
    std::fs::create_dir(&target).unwrap();
    std::fs::set_permissions(&target, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let moved = scratch.dir.path().join("moved-oauth");
    std::fs::rename(store.dir(), &moved).unwrap();
    std::os::unix::fs::symlink(&target, store.dir()).unwrap();
    let error = oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("symbolic link"), "{error}");
    assert_eq!(mode(&target), 0o755);
    assert!(std::fs::read_dir(&target).unwrap().next().is_none());
    let reason = start().await;
    assert!(reason.contains("symbolic link"), "{reason}");

    // The neighbour: a real folder and file work again.
    std::fs::remove_file(store.dir()).unwrap();
    oauth::login(&server.spec("remote"), &login_options(&scratch), &FetchingBrowser).await.unwrap();
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    servers.close().await;
}

/// A "browser" that, before it follows the authorization server's redirect, sends keel's
/// loopback listener what a hostile local page or process could: a forged redirect with
/// another state, a redirect without a code, other paths and methods, bytes that are not
/// HTTP, and a connection that never finishes its request. It records each status.
#[derive(Debug, Default)]
struct HostileBrowser {
    statuses: std::sync::Mutex<Vec<(String, u16)>>,
}

impl oauth::Browser for HostileBrowser {
    fn open<'a>(&'a self, url: &'a str) -> futures::future::BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let client = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|error| error.to_string())?;
            let answer = client.get(url).send().await.map_err(|error| error.to_string())?;
            let location = answer.headers()["location"].to_str().unwrap().to_owned();
            let real = reqwest::Url::parse(&location).unwrap();
            let base = format!("http://127.0.0.1:{}", real.port().unwrap());
            // A stalled connection first: it must hold up nothing.
            let mut stalled =
                tokio::net::TcpStream::connect(("127.0.0.1", real.port().unwrap())).await.unwrap();
            stalled.write_all(b"GET /callback?state=").await.unwrap();
            let mut garbage =
                tokio::net::TcpStream::connect(("127.0.0.1", real.port().unwrap())).await.unwrap();
            garbage.write_all(b"\x16\x03\x01 not http at all\r\n\r\n").await.unwrap();
            let mut answered = Vec::new();
            let _ = garbage.read_to_end(&mut answered).await;
            let first_line = String::from_utf8_lossy(&answered).lines().next().map(str::to_owned);
            self.statuses.lock().unwrap().push((
                "garbage".into(),
                match first_line {
                    Some(line) if line.starts_with("HTTP/1.1 400") => 400,
                    _ => 0,
                },
            ));
            let forged = [
                ("forged state", format!("{base}/callback?state=forged&code=evil")),
                ("no state", format!("{base}/callback?code=evil")),
                ("no code", format!("{base}/callback?state={}", query(&real, "state"))),
                ("other path", format!("{base}/other?state={}&code=evil", query(&real, "state"))),
            ];
            for (what, target) in forged {
                let status = client.get(target).send().await.unwrap().status().as_u16();
                self.statuses.lock().unwrap().push((what.to_owned(), status));
            }
            let posted = client.post(real.clone()).send().await.unwrap().status().as_u16();
            self.statuses.lock().unwrap().push(("post".to_owned(), posted));
            let status = client.get(real).send().await.unwrap().status().as_u16();
            self.statuses.lock().unwrap().push(("real".to_owned(), status));
            drop(stalled);
            Ok(())
        })
    }
}

fn query(url: &reqwest::Url, name: &str) -> String {
    url.query_pairs().find(|(key, _)| key == name).map(|(_, value)| value.into_owned()).unwrap()
}

#[tokio::test]
async fn redteam_mcp_oauth_forged_or_stray_requests_to_the_redirect_listener_end_nothing() {
    let server = AuthServer::start(Knobs::default()).await;
    let scratch = Scratch::new();
    let browser = HostileBrowser::default();
    let report =
        oauth::login(&server.spec("remote"), &login_options(&scratch), &browser).await.unwrap();
    let statuses = browser.statuses.lock().unwrap().clone();
    let expected: Vec<(String, u16)> = [
        ("garbage", 400),
        ("forged state", 400),
        ("no state", 400),
        ("no code", 400),
        ("other path", 404),
        ("post", 405),
        ("real", 200),
    ]
    .into_iter()
    .map(|(what, status)| (what.to_owned(), status))
    .collect();
    assert_eq!(statuses, expected);
    // The legitimate neighbour: the real redirect's code was exchanged and the token works.
    let servers = start_with_store(&scratch, vec![server.spec("remote")]).await;
    assert_eq!(servers.statuses()[0].state, ServerState::Connected, "{:?}", servers.statuses());
    let output = call(&servers, "mcp__remote__hello", serde_json::json!({})).await;
    assert!(output.content.contains("hello, authorized"), "{}", output.content);
    assert_eq!(report.client_id, "keel-test-client");
    servers.close().await;
}
