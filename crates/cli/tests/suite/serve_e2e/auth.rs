//! Red team: who may talk to the host. The bearer token and its file, the loopback bind,
//! the body size limit and CORS.

use std::io::{BufRead, BufReader};
use std::process::Stdio;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{Host, TOKEN, ledger, write_script};
use crate::suite::support::{Env, stderr};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_no_token_and_wrong_token_are_401() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "auth.json", &[]);
    let host = Host::start(&env, &[]);
    let http = reqwest::Client::new();
    for path in ["/v1/sessions", "/v1/openapi.json"] {
        let response = http.get(host.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED, "{path} without a token");
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized");
        let response = http.get(host.url(path)).bearer_auth("wrong-token-0123456789").send();
        assert_eq!(response.await.unwrap().status(), StatusCode::UNAUTHORIZED, "{path} wrong");
        let response = http.get(host.url(path)).header("Authorization", TOKEN).send();
        assert_eq!(response.await.unwrap().status(), StatusCode::UNAUTHORIZED, "no Bearer");
    }
    let response = http
        .post(host.url("/v1/sessions"))
        .bearer_auth("wrong-token-0123456789")
        .json(&json!({"workspace": workspace, "model": format!("scripted:{}", script.display())}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let (status, list) = host.client().get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0, "nothing was created");
    // The legitimate neighbour: the right token works.
    host.client().create(&workspace, &script, "deny").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_the_token_is_never_in_logs_and_its_file_is_private() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "logs.json", &["i.txt"]);
    let host = Host::start_with_token_file(&env, &[]);
    let path = env.home.path().join("serve.token");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let token = host.token.clone();
    assert!(token.len() >= 32);
    let client = host.client();
    let session = client.create(&workspace, &script, "auto").await;
    client.turn(&session, "go").await;
    client.wait_state(&session, "completed").await;
    let _ = reqwest::Client::new()
        .get(host.url("/v1/sessions"))
        .bearer_auth(format!("{token}x"))
        .send()
        .await
        .unwrap();
    let logs = host.kill9();
    assert!(logs.contains("bearer token from"), "{logs}");
    assert!(!logs.contains(&token), "the token was logged: {logs}");
    for event in ledger(&env, &session) {
        assert!(!event.to_string().contains(&token), "the token is in the ledger");
    }
    // The same token on restart: it was made once.
    let again = Host::start_with_token_file(&env, &[]);
    assert_eq!(again.token, token);
    // A token file others can read is refused, not used.
    drop(again);
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let output = env
        .keel()
        .env_remove("KEEL_SERVE_TOKEN")
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("mode 0600"), "{}", stderr(&output));
}

/// `keel serve ARGS` (the fixed token, no workspace root): the first line it prints, then
/// it is killed.
fn first_line_of_serve(env: &Env, args: &[&str]) -> String {
    let mut serve = env
        .keel()
        .env("KEEL_SERVE_TOKEN", TOKEN)
        .arg("serve")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(serve.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    serve.kill().unwrap();
    serve.wait().unwrap();
    line
}

#[test]
fn redteam_host_non_loopback_bind_is_refused_without_the_flag() {
    let env = Env::new();
    let output = env.run(&["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("not a loopback address"));
    // The neighbour: with --allow-remote it serves.
    let host = Host::start(&env, &["--allow-remote"]);
    assert!(host.base.starts_with("http://127.0.0.1:"));
    let line = first_line_of_serve(&env, &["--listen", "0.0.0.0:0", "--allow-remote"]);
    assert!(line.starts_with("keel serve: listening on http://0.0.0.0:"), "{line}");
    // `localhost` is the loopback, without the flag; another name is a usage error.
    let line = first_line_of_serve(&env, &["--listen", "localhost:0"]);
    assert!(line.starts_with("keel serve: listening on http://127.0.0.1:"), "{line}");
    let output = env.run(&["serve", "--listen", "example.com:7711"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("localhost:PORT"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_an_oversized_body_is_413_and_no_cors_is_offered() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "big.json", &[]);
    let host = Host::start(&env, &["--max-body-bytes", "4096"]);
    let client = host.client();
    let session = client.create(&workspace, &script, "deny").await;
    let (status, body) = client
        .post(&format!("/v1/sessions/{session}/turns"), json!({"input": "x".repeat(10_000)}))
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    assert_eq!(body["error"]["code"], "payload_too_large");
    assert_eq!(ledger(&env, &session).len(), 1, "no turn was started");
    // A browser's preflight from another origin gets no CORS grant.
    let response = client
        .http
        .request(reqwest::Method::OPTIONS, host.url("/v1/sessions"))
        .header("Origin", "https://evil.example")
        .header("Access-Control-Request-Method", "POST")
        .send()
        .await
        .unwrap();
    assert!(response.headers().get("access-control-allow-origin").is_none());
    // The neighbour: a normal body is fine.
    client.turn(&session, "hello").await;
}
