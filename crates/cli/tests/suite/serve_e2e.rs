//! `keel serve` over real HTTP (DESIGN.md §9 "Host HTTP API"): the real binary on
//! 127.0.0.1:0, reqwest as the client, the scripted model, and `kill -9` of the host.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::support::{Env, stdout};

const TOKEN: &str = "test-token-0123456789abcdef";

/// A running `keel serve`.
struct Host {
    child: Child,
    base: String,
    token: String,
    stderr_path: PathBuf,
}

impl Host {
    /// Starts `keel serve` on a free loopback port with `args`, the workspace root the
    /// scratch folder, and the fixed test token.
    fn start(env: &Env, args: &[&str]) -> Host {
        Host::start_with(env, args, Some(TOKEN))
    }

    fn start_with(env: &Env, args: &[&str], token: Option<&str>) -> Host {
        Host::start_full(env, args, token, &[])
    }

    fn start_full(env: &Env, args: &[&str], token: Option<&str>, vars: &[(&str, &str)]) -> Host {
        static STARTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr_path = env.scratch.path().join(format!("serve-{n}.stderr"));
        let mut command = env.keel();
        command
            .args(["serve", "--listen", "127.0.0.1:0", "--workspace-root"])
            .arg(env.scratch.path())
            .args(args)
            .envs(vars.iter().copied())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).unwrap());
        match token {
            Some(token) => command.env("KEEL_SERVE_TOKEN", token),
            None => command.env_remove("KEEL_SERVE_TOKEN"),
        };
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().unwrap_or_else(|| {
            panic!("no address line; stderr: {}", std::fs::read_to_string(&stderr_path).unwrap())
        });
        let line = line.unwrap();
        let base = line.strip_prefix("keel serve: listening on ").unwrap().trim().to_owned();
        // Keep draining stdout so the host never blocks on it.
        std::thread::spawn(move || for _ in lines {});
        let token = match token {
            Some(token) => token.to_owned(),
            None => std::fs::read_to_string(env.home.path().join("serve.token")).unwrap(),
        };
        Host { child, base, token, stderr_path }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn client(&self) -> Client {
        Client { http: reqwest::Client::new(), base: self.base.clone(), token: self.token.clone() }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// `kill -9`, and reaped, so its pid no longer reads as a live lease holder.
    fn kill9(mut self) -> String {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.stderr()
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An authenticated client.
struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    async fn get(&self, path: &str) -> (StatusCode, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn create(&self, workspace: &Path, script: &Path, approval: &str) -> String {
        let (status, body) = self
            .post(
                "/v1/sessions",
                json!({"workspace": workspace, "model": format!("scripted:{}", script.display()),
                       "approval": approval}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body["session_id"].as_str().unwrap().to_owned()
    }

    /// Waits until the session has a pending permission request; returns it.
    async fn pending(&self, session: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(&format!("/v1/sessions/{session}/permissions")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if let Some(first) = body.as_array().and_then(|list| list.first()) {
                return first.clone();
            }
            assert!(Instant::now() < deadline, "no pending permission request");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the session's state is `state`.
    async fn wait_state(&self, session: &str, state: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, body) = self.get(&format!("/v1/sessions/{session}")).await;
            if body["state"] == state && body["active_here"] == false {
                return body;
            }
            assert!(Instant::now() < deadline, "session never became {state}: {body}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn events(&self, session: &str, last_event_id: Option<u64>) -> Sse {
        let mut request = self
            .http
            .get(format!("{}/v1/sessions/{session}/events", self.base))
            .bearer_auth(&self.token);
        if let Some(id) = last_event_id {
            request = request.header("Last-Event-ID", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream")
        );
        Sse { stream: Box::pin(response.bytes_stream()), buffer: String::new() }
    }
}

/// One SSE frame.
#[derive(Debug, Clone, Default)]
struct Frame {
    id: Option<u64>,
    event: Option<String>,
    data: String,
    comment: bool,
}

struct Sse {
    stream: std::pin::Pin<Box<dyn futures::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buffer: String,
}

impl Sse {
    /// The next frame; `None` when the stream ended (or broke, as when the host died).
    async fn next(&mut self) -> Option<Frame> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut frame = Frame::default();
                for line in block.lines() {
                    if let Some(rest) = line.strip_prefix("id:") {
                        frame.id = Some(rest.trim().parse().unwrap());
                    } else if let Some(rest) = line.strip_prefix("event:") {
                        frame.event = Some(rest.trim().to_owned());
                    } else if let Some(rest) = line.strip_prefix("data:") {
                        frame.data.push_str(rest.strip_prefix(' ').unwrap_or(rest));
                    } else if line.starts_with(':') {
                        frame.comment = true;
                    }
                }
                return Some(frame);
            }
            match tokio::time::timeout(Duration::from_secs(30), self.stream.next()).await {
                Ok(Some(Ok(bytes))) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                Ok(Some(Err(_)) | None) => return None,
                Err(_) => panic!("no SSE data for 30 s; buffer: {}", self.buffer),
            }
        }
    }

    /// Ledger frames until one of kind `kind` (included), skipping pings and re-sent
    /// pending requests.
    async fn until(&mut self, kind: &str, into: &mut Vec<Frame>) -> bool {
        while let Some(frame) = self.next().await {
            if frame.id.is_none() {
                continue;
            }
            let done = frame.event.as_deref() == Some(kind);
            into.push(frame);
            if done {
                return true;
            }
        }
        false
    }
}

fn write_script(env: &Env, name: &str, files: &[&str]) -> PathBuf {
    let mut steps: Vec<Value> = files
        .iter()
        .map(|file| {
            json!({"tool_calls": [{"name": "write_file",
                                   "arguments": {"path": file, "content": format!("{file}\n")}}]})
        })
        .collect();
    steps.push(json!({"text": "Done."}));
    env.write_script(name, &json!({ "steps": steps }).to_string())
}

/// The session's ledger as `keel log --json` prints it.
fn ledger(env: &Env, session: &str) -> Vec<Value> {
    let output = env.run(&["log", session, "--json"]);
    stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect()
}

/// Every frame's data is the ledger event with its seq, in order, each seq once.
fn assert_frames_are_the_ledger(frames: &[Frame], ledger: &[Value]) {
    let ids: Vec<u64> = frames.iter().map(|frame| frame.id.unwrap()).collect();
    let expected: Vec<u64> = (1..=ledger.len() as u64).collect();
    assert_eq!(ids, expected, "lost or duplicated events");
    for (frame, event) in frames.iter().zip(ledger) {
        let data: Value = serde_json::from_str(&frame.data).unwrap();
        assert_eq!(&data, event);
        assert_eq!(frame.event.as_deref(), event["kind"].as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_turn_runs_and_its_stream_is_the_ledger() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "one.json", &["a.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();

    let health: Value = reqwest::get(host.url("/v1/health")).await.unwrap().json().await.unwrap();
    assert_eq!(health["status"], "ok");
    assert!(health["version"].is_string());

    let session = client.create(&workspace, &script, "auto").await;
    let (status, started) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write a"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{started}");
    assert!(started["turn_id"].is_string() && started["run_id"].is_string(), "{started}");

    let mut sse = client.events(&session, None).await;
    let mut frames = Vec::new();
    assert!(sse.until("run_completed", &mut frames).await);
    let ledger = ledger(&env, &session);
    assert_frames_are_the_ledger(&frames, &ledger);
    let run_started = ledger.iter().find(|e| e["kind"] == "run_started").unwrap();
    assert_eq!(run_started["run_id"], started["run_id"]);
    assert_eq!(std::fs::read_to_string(workspace.join("a.txt")).unwrap(), "a.txt\n");

    // A replay from `?after=` gives the rest, and the same bytes.
    let response = client
        .http
        .get(host.url(&format!("/v1/sessions/{session}/events?after=3")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let mut replay = Sse { stream: Box::pin(response.bytes_stream()), buffer: String::new() };
    let mut rest = Vec::new();
    assert!(replay.until("run_completed", &mut rest).await);
    assert_eq!(rest.first().and_then(|f| f.id), Some(4));
    assert_eq!(rest.len(), frames.len() - 3);

    let summary = client.wait_state(&session, "completed").await;
    assert_eq!(summary["id"], session.as_str());
    assert_eq!(summary["workspace"], workspace.canonicalize().unwrap().display().to_string());
    assert!(summary["usage"]["output_tokens"].as_u64().is_some(), "{summary}");
    let (status, list) = client.get("/v1/sessions").await;
    assert_eq!(status, StatusCode::OK);
    assert!(list["sessions"].as_array().unwrap().iter().any(|s| s["id"] == session.as_str()));

    // Nothing to resume after a completed turn.
    let (status, body) = client.post(&format!("/v1/sessions/{session}/resume"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "nothing_to_resume");
    // No active run to cancel.
    let (status, body) = client.post(&format!("/v1/sessions/{session}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Unknown session and unknown route: JSON errors.
    let (status, body) =
        client.get("/v1/sessions/0190aaaa-0000-7000-8000-000000000000/permissions").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, body) = client.get("/v1/nothing").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"]["message"].is_string());
    let response =
        client.http.delete(host.url("/v1/sessions")).bearer_auth(TOKEN).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "method_not_allowed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_openapi_names_every_route() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    let (status, document) = host.client().get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(document["openapi"], "3.1.0");
    let paths = document["paths"].as_object().unwrap();
    for path in [
        "/v1/health",
        "/v1/openapi.json",
        "/v1/sessions",
        "/v1/sessions/{id}",
        "/v1/sessions/{id}/turns",
        "/v1/sessions/{id}/input",
        "/v1/sessions/{id}/plan/approve",
        "/v1/sessions/{id}/resume",
        "/v1/sessions/{id}/cancel",
        "/v1/sessions/{id}/seal",
        "/v1/sessions/{id}/events",
        "/v1/sessions/{id}/permissions",
        "/v1/sessions/{id}/permissions/{call_id}",
        "/v1/sessions/{id}/questions",
        "/v1/sessions/{id}/questions/{question}",
        "/v1/schedules",
        "/v1/schedules/{id}",
        "/v1/wakes/{wake_id}",
        "/v1/web/logins",
    ] {
        assert!(paths.contains_key(path), "{path} missing from the OpenAPI document");
    }
    // Every operation that takes a body documents its bad request (400 bad_request).
    for (path, operations) in paths {
        for (method, operation) in operations.as_object().unwrap() {
            if operation.get("requestBody").is_some_and(|body| body["required"] == true) {
                assert!(operation["responses"].get("400").is_some(), "{method} {path}: no 400");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_usage_errors_name_the_body_fields_not_the_flags() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "fields.json", &[]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client.post("/v1/sessions", json!({"workspace": workspace})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("\"model\"") && !message.contains("-m "), "{message}");
    let session = client.create(&workspace, &script, "deny").await;
    for (field, value) in [
        ("max_steps", json!(0)),
        ("max_tokens", json!(0)),
        ("max_cost_usd", json!(-1.0)),
        // Beyond 100 years: a 400, never a worker panic on the overflowing deadline.
        ("max_time", json!("9223372036854775807s")),
    ] {
        let mut turn = json!({"input": "go"});
        turn[field] = value;
        let (status, body) = client.post(&format!("/v1/sessions/{session}/turns"), turn).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("\"{field}\"")) && !message.contains("--"), "{message}");
    }
    // A body that is not JSON, or JSON of the wrong shape, is 400 bad_request (status
    // and code agree), and starts nothing.
    let turns = host.url(&format!("/v1/sessions/{session}/turns"));
    for raw in [r#"{"input": "go""#, r#"{"input": 5}"#, r#"{"input": "go", "extra": 1}"#, "[]"] {
        let response = client
            .http
            .post(&turns)
            .bearer_auth(&client.token)
            .header("Content-Type", "application/json")
            .body(raw)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::BAD_REQUEST, "{raw}: {body}");
        assert_eq!(body["error"]["code"], "bad_request", "{raw}: {body}");
        assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{body}");
    }
    assert_eq!(ledger(&env, &session).len(), 1, "no turn was started");
    // The neighbour: a valid ceiling runs.
    let (status, body) = client
        .post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go", "max_steps": 3}))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_approvals_first_answer_wins_and_a_turn_waits_for_it() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ask.json", &["b.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write b"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let pending = client.pending(&session).await;
    assert_eq!(pending["tool"], "write_file");
    assert_eq!(pending["access"], "write");
    assert_eq!(pending["arguments"]["path"], "b.txt");
    assert!(pending["requested_seq"].as_u64().unwrap() > 0);
    assert!(!workspace.join("b.txt").exists(), "the call ran before it was allowed");

    // While the run waits, a second turn is refused.
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "run_active");

    // A subscriber is told about the pending request even when it starts after it.
    let requested = pending["requested_seq"].as_u64().unwrap();
    let mut sse = client.events(&session, Some(requested)).await;
    let frame = sse.next().await.unwrap();
    assert_eq!(frame.event.as_deref(), Some("permission_pending"), "{frame:?}");
    assert_eq!(frame.id, None);

    let call = pending["call_id"].as_str().unwrap();
    let path = format!("/v1/sessions/{session}/permissions/{call}");
    let (status, body) = client.post(&path, json!({"answer": "allow_once"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "allow_once");
    let (status, body) = client.post(&path, json!({"answer": "allow_once"})).await;
    assert_eq!(status, StatusCode::OK, "same answer again: {body}");
    let (status, body) = client.post(&path, json!({"answer": "deny"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "a different answer: {body}");
    assert_eq!(body["error"]["code"], "already_answered");
    let (status, body) = client.post(&path, json!({"answer": "maybe"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["code"], "bad_request");
    assert!(body["error"]["message"].is_string());

    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("b.txt")).unwrap(), "b.txt\n");
    let settled: Vec<Value> =
        ledger(&env, &session).into_iter().filter(|e| e["kind"] == "permission_settled").collect();
    assert_eq!(settled.len(), 1);
    assert_eq!(settled[0]["answer"], "allow_once");
    assert_eq!(settled[0]["by"], "remote (keel serve)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_steering_input_joins_the_active_run_after_the_pending_call() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = env.write_script(
        "steer.json",
        &json!({"steps": [
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "c.txt", "content": "c\n"}}]},
            {"text": "Done, and noted.", "expect": {"contains": "also note the date"}}
        ]})
        .to_string(),
    );
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    // No run yet: input is not steering.
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/input"), json!({"input": "early"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "no_active_run");

    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write c"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let pending = client.pending(&session).await;
    // Sent while the call waits for consent: it must not join mid-call.
    let steer = {
        let client = host.client();
        let path = format!("/v1/sessions/{session}/input");
        tokio::spawn(
            async move { client.post(&path, json!({"input": "also note the date"})).await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!steer.is_finished(), "the input was acknowledged before it joined");
    assert!(!ledger(&env, &session).iter().any(|e| e["kind"] == "input_joined"));
    // A new turn is still refused while the run is active.
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "again"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");

    let call = pending["call_id"].as_str().unwrap();
    let (status, body) = client
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, joined) = steer.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{joined}");
    assert_eq!(joined["joined"], true);
    client.wait_state(&session, "completed").await;

    let ledger = ledger(&env, &session);
    let seq = joined["seq"].as_u64().unwrap();
    let at = ledger.iter().position(|e| e["seq"] == seq).unwrap();
    assert_eq!(ledger[at]["kind"], "input_joined");
    assert_eq!(ledger[at]["input"], "also note the date");
    let result = ledger.iter().position(|e| e["kind"] == "tool_result").unwrap();
    assert!(result < at, "joined after the call's result");
    assert_eq!(ledger[at + 1]["kind"], "model_requested");
    assert_eq!(std::fs::read_to_string(workspace.join("c.txt")).unwrap(), "c\n");
    assert_eq!(ledger.iter().filter(|e| e["kind"] == "run_started").count(), 1, "one run");
    let last = ledger.last().unwrap();
    assert_eq!(last["kind"], "run_completed");
    assert_eq!(last["answer"], "Done, and noted.");
    // The run is over: steering is refused again.
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/input"), json!({"input": "late"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "no_active_run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_plan_mode_then_approve_plan_runs_it_live() {
    let env = Env::new();
    let workspace = env.workspace();
    let write = json!({"name": "write_file", "arguments": {"path": "e.txt", "content": "e\n"}});
    let script = env.write_script(
        "plan.json",
        &json!({"steps": [
            {"tool_calls": [write]},
            {"text": "Plan: write e.txt.", "expect": {"last_outcomes": ["refused"]}},
            {"tool_calls": [write], "expect": {"contains": "approved"}},
            {"text": "e.txt written.", "expect": {"last_outcomes": ["ok"]}}
        ]})
        .to_string(),
    );
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": workspace, "model": format!("scripted:{}", script.display()),
                   "approval": "auto", "mode": "plan"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "plan e"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    client.wait_state(&session, "completed").await;
    assert!(!workspace.join("e.txt").exists(), "plan mode wrote");

    let path = format!("/v1/sessions/{session}/plan/approve");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body["approved_seq"].as_u64().is_some() && body["run_id"].is_string(), "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e\n");
    let ledger = ledger(&env, &session);
    let approved: Vec<&Value> = ledger.iter().filter(|e| e["kind"] == "plan_approved").collect();
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["by"], "remote (keel serve)");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_planning");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_serve_plan_approve_before_any_plan_is_refused() {
    let env = Env::new();
    let workspace = env.workspace();
    let write = json!({"name": "write_file", "arguments": {"path": "e.txt", "content": "e\n"}});
    let script = env.write_script(
        "plan.json",
        &json!({"steps": [
            {"tool_calls": [write]},
            {"text": "Plan: write e.txt.", "expect": {"last_outcomes": ["refused"]}},
            {"tool_calls": [write], "expect": {"contains": "approved"}},
            {"text": "e.txt written.", "expect": {"last_outcomes": ["ok"]}}
        ]})
        .to_string(),
    );
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": workspace, "model": format!("scripted:{}", script.display()),
                   "approval": "auto", "mode": "plan"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    // No turn yet, so no plan: approving is refused and nothing runs.
    let path = format!("/v1/sessions/{session}/plan/approve");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_planning");
    let events = ledger(&env, &session);
    assert!(events.iter().all(|e| e["kind"] != "plan_approved" && e["kind"] != "run_started"));
    assert!(!workspace.join("e.txt").exists(), "an unplanned approval wrote");
    // The neighbour: after the plan-mode turn, the approval is accepted and runs live.
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "plan e"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    client.wait_state(&session, "completed").await;
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_an_unanswered_request_ends_as_deny_after_the_approval_timeout() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "timeout.json", &["c.txt"]);
    let host = Host::start(&env, &["--approval-timeout", "1s"]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write c"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // The deny refuses the call; the model sees that and answers.
    client.wait_state(&session, "completed").await;
    assert!(!workspace.join("c.txt").exists());
    let ledger = ledger(&env, &session);
    let result = ledger.iter().find(|e| e["kind"] == "tool_result").unwrap();
    assert_eq!(result["outcome"], "refused", "{result}");
    let settled = ledger.iter().find(|e| e["kind"] == "permission_settled").unwrap();
    assert_eq!(settled["answer"], "deny");
    assert!(settled["by"].as_str().unwrap().starts_with("approval_timeout"), "{settled}");
    // Answering now is too late: the deny was first.
    let call = settled["call_id"].as_str().unwrap();
    let (status, body) = client
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_cancel_then_resume_continues_without_running_the_cancelled_call() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "cancel.json", &["d.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write d"})).await;
    client.pending(&session).await;
    let (status, body) = client.post(&format!("/v1/sessions/{session}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "cancelled").await;
    let (status, body) = client.post(&format!("/v1/sessions/{session}/resume"), json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body["run_id"].is_string(), "{body}");
    client.wait_state(&session, "completed").await;
    // The cancelled call was answered `cancelled` and is never replayed.
    assert!(!workspace.join("d.txt").exists());
    let ledger = ledger(&env, &session);
    let results: Vec<&Value> = ledger.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["outcome"], "cancelled");
    assert_eq!(ledger.iter().filter(|e| e["kind"] == "run_started").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_with_a_pending_approval_then_restart_asks_again() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "crash.json", &["e.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write e"})).await;
    let before = client.pending(&session).await;
    host.kill9();

    let host = Host::start(&env, &[]);
    let client = host.client();
    // The restarted host asks again (a newer request for the same call), never cancels it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let pending = client.pending(&session).await;
        if pending["requested_seq"].as_u64() > before["requested_seq"].as_u64() {
            break pending;
        }
        assert!(Instant::now() < deadline, "the request was not asked again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(after["call_id"], before["call_id"]);
    let call = after["call_id"].as_str().unwrap();
    let (status, body) = client
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e.txt\n");
    let ledger = ledger(&env, &session);
    let results: Vec<&Value> = ledger.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 1, "the call got exactly one result");
    assert_eq!(results[0]["outcome"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_an_answer_right_after_a_restart_is_kept_and_the_dead_hosts_run_taken_over() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "window.json", &["w.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write w"})).await;
    let before = client.pending(&session).await;
    let call = before["call_id"].as_str().unwrap().to_owned();
    // Killed and not reaped (a zombie, as under a parent that has not waited yet): its pid
    // still exists, yet it is provably dead.
    let mut dead = host;
    dead.child.kill().unwrap();
    let stat_path = format!("/proc/{}/stat", dead.child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat_path).unwrap_or_default().contains(") Z") {
        assert!(Instant::now() < deadline, "the killed host never became a zombie");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Answered at once: the new host takes the dead one's run over at boot (its lease is
    // still the dead process's), not after the lease lapses, and keeps the answer.
    let restarted = Instant::now();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["by"], "remote (keel serve)");
    client.wait_state(&session, "completed").await;
    assert!(
        restarted.elapsed() < Duration::from_secs(8),
        "took {:?}: the dead host's lease was waited out",
        restarted.elapsed()
    );
    assert_eq!(std::fs::read_to_string(workspace.join("w.txt")).unwrap(), "w.txt\n");
    let ledger = ledger(&env, &session);
    let results: Vec<&Value> = ledger.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 1, "the call got exactly one result");
    assert_eq!(results[0]["outcome"], "ok");
    let settled: Vec<&Value> =
        ledger.iter().filter(|e| e["kind"] == "permission_settled").collect();
    assert_eq!(settled.len(), 1, "one answer recorded");
    assert_eq!(settled[0]["answer"], "allow_once");
    drop(dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_mid_stream_then_reconnect_loses_and_repeats_nothing() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "stream.json", &["f.txt", "g.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let mut sse = client.events(&session, None).await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write f and g"})).await;
    let mut frames = Vec::new();
    assert!(sse.until("permission_requested", &mut frames).await);
    host.kill9();
    // The stream breaks with the host.
    while sse.next().await.is_some() {}

    let host = Host::start(&env, &[]);
    let client = host.client();
    let last = frames.last().and_then(|frame| frame.id);
    let mut sse = client.events(&session, last).await;
    for _ in 0..2 {
        // Each request (the one asked again after the restart, then the next call's).
        loop {
            let pending = client.pending(&session).await;
            let asked_after_restart = pending["requested_seq"].as_u64() > last;
            if asked_after_restart {
                let call = pending["call_id"].as_str().unwrap();
                let (status, body) = client
                    .post(
                        &format!("/v1/sessions/{session}/permissions/{call}"),
                        json!({"answer": "allow_once"}),
                    )
                    .await;
                assert_eq!(status, StatusCode::OK, "{body}");
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(sse.until("run_completed", &mut frames).await);
    assert_frames_are_the_ledger(&frames, &ledger(&env, &session));
    assert!(workspace.join("f.txt").exists() && workspace.join("g.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_max_runs_answers_503_with_retry_after() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "busy.json", &["h.txt"]);
    let host = Host::start(&env, &["--max-runs", "1"]);
    let client = host.client();
    let first = client.create(&workspace, &script, "ask").await;
    let second = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{first}/turns"), json!({"input": "wait"})).await;
    client.pending(&first).await;
    let response = client
        .http
        .post(host.url(&format!("/v1/sessions/{second}/turns")))
        .bearer_auth(TOKEN)
        .json(&json!({"input": "too many"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(response.headers()["retry-after"], "5");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "overloaded");
    // Once the first run ends, the second session runs.
    client.post(&format!("/v1/sessions/{first}/cancel"), json!({})).await;
    client.wait_state(&first, "cancelled").await;
    let (status, body) =
        client.post(&format!("/v1/sessions/{second}/turns"), json!({"input": "now"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

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
    let host = Host::start_with(&env, &[], None);
    let path = env.home.path().join("serve.token");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&path).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    let token = host.token.clone();
    assert!(token.len() >= 32);
    let client = host.client();
    let session = client.create(&workspace, &script, "auto").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go"})).await;
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
    let again = Host::start_with(&env, &[], None);
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
    assert!(
        super::support::stderr(&output).contains("mode 0600"),
        "{}",
        super::support::stderr(&output)
    );
}

#[test]
fn redteam_host_non_loopback_bind_is_refused_without_the_flag() {
    let env = Env::new();
    let output = env.run(&["serve", "--listen", "0.0.0.0:0"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(super::support::stderr(&output).contains("not a loopback address"));
    // The neighbour: with --allow-remote it serves.
    let host = Host::start(&env, &["--allow-remote"]);
    assert!(host.base.starts_with("http://127.0.0.1:"));
    let mut explicit = env
        .keel()
        .env("KEEL_SERVE_TOKEN", TOKEN)
        .args(["serve", "--listen", "0.0.0.0:0", "--allow-remote"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(explicit.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    assert!(line.starts_with("keel serve: listening on http://0.0.0.0:"), "{line}");
    explicit.kill().unwrap();
    explicit.wait().unwrap();
    // `localhost` is the loopback, without the flag; another name is a usage error.
    let mut named = env
        .keel()
        .env("KEEL_SERVE_TOKEN", TOKEN)
        .args(["serve", "--listen", "localhost:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let line = BufReader::new(named.stdout.take().unwrap()).lines().next().unwrap().unwrap();
    assert!(line.starts_with("keel serve: listening on http://127.0.0.1:"), "{line}");
    named.kill().unwrap();
    named.wait().unwrap();
    let output = env.run(&["serve", "--listen", "example.com:7711"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(super::support::stderr(&output).contains("localhost:PORT"));
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
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "hello"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_workspace_outside_the_allowed_roots_is_refused() {
    let env = Env::new();
    let outside = tempfile::tempdir().unwrap();
    let script = write_script(&env, "roots.json", &["j.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    for workspace in [outside.path().to_path_buf(), env.scratch.path().join("ws/../../")] {
        std::fs::create_dir_all(env.scratch.path().join("ws")).unwrap();
        let (status, body) = client
            .post(
                "/v1/sessions",
                json!({"workspace": workspace, "model": format!("scripted:{}", script.display())}),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{workspace:?}: {body}");
    }
    let (status, _) = client
        .post("/v1/sessions", json!({"workspace": "relative/ws", "model": "scripted:/x"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    // A session made outside the roots (by `keel run`) is not admitted: 423, no agent code;
    // nor is it this host's to show: not listed, and reading, streaming, answering or
    // cancelling it answers 404.
    let output = env.run(&[
        "run",
        "-C",
        outside.path().to_str().unwrap(),
        "-m",
        &format!("scripted:{}", write_script(&env, "cli.json", &[]).display()),
        "--json",
        "hi",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", super::support::stderr(&output));
    let foreign = super::support::json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let (_, list) = client.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().map(Vec::len), Some(0), "{list}");
    // Nor does the web page list it, show it, or render its fragment.
    let page = |path: String| {
        let request = client.http.get(host.url(&path)).bearer_auth(&client.token);
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.text().await.unwrap())
        }
    };
    let (status, html) = page("/".to_owned()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!html.contains(&foreign) && html.contains("No sessions yet."), "{html}");
    let (status, _) = page(format!("/?session={foreign}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = page(format!("/web/sessions/{foreign}/fragment")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    for path in ["", "/events", "/permissions"] {
        let (status, body) = client.get(&format!("/v1/sessions/{foreign}{path}")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "GET {path}: {body}");
    }
    let (status, body) = client.post(&format!("/v1/sessions/{foreign}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "cancel: {body}");
    let (status, body) = client
        .post(&format!("/v1/sessions/{foreign}/permissions/c1"), json!({"answer": "deny"}))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "answer: {body}");
    let before = ledger(&env, &foreign).len();
    let (status, body) =
        client.post(&format!("/v1/sessions/{foreign}/turns"), json!({"input": "again"})).await;
    assert_eq!(status, StatusCode::LOCKED, "{body}");
    assert_eq!(ledger(&env, &foreign).len(), before);
    // The neighbour inside the root is created and runs.
    let inside = env.workspace();
    let session = client.create(&inside, &script, "auto").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go"})).await;
    client.wait_state(&session, "completed").await;
    assert!(inside.join("j.txt").exists());
    let (status, html) = page("/".to_owned()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(html.contains(&session) && !html.contains(&foreign), "{html}");
    let (status, _) = page(format!("/web/sessions/{session}/fragment")).await;
    assert_eq!(status, StatusCode::OK);
    // Summaries carry `session_id` as creation answers it (and `id`, as before).
    let (_, row) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(
        (row["session_id"].as_str(), row["id"].as_str()),
        (Some(&*session), Some(&*session))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_workspace_that_holds_keel_home_is_refused() {
    let env = Env::new();
    let script = write_script(&env, "home.json", &["o.txt"]);
    let home = env.home.path().to_str().unwrap().to_owned();
    let host = Host::start(&env, &["--workspace-root", &home]);
    let client = host.client();
    // An agent working there could read the token file and the ledger.
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": home, "model": format!("scripted:{}", script.display())}),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("KEEL_HOME"), "{body}");
    // The neighbour: a workspace beside it is admitted and runs.
    let workspace = env.workspace();
    let session = client.create(&workspace, &script, "auto").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go"})).await;
    client.wait_state(&session, "completed").await;
    assert!(workspace.join("o.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_sealed_session_answers_423_and_runs_nothing() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "sealed.json", &["k.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "auto").await;
    let (status, body) =
        client.post(&format!("/v1/sessions/{session}/seal"), json!({"reason": "incident 7"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let sealed = ledger(&env, &session);
    for path in ["turns", "resume"] {
        let (status, body) =
            client.post(&format!("/v1/sessions/{session}/{path}"), json!({"input": "go"})).await;
        assert_eq!(status, StatusCode::LOCKED, "{path}: {body}");
        assert_eq!(body["error"]["code"], "locked");
    }
    assert_eq!(ledger(&env, &session), sealed, "a sealed session recorded something");
    assert!(!workspace.join("k.txt").exists());
    let (_, summary) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(summary["state"], "sealed");
    // The neighbour: another session of the same workspace runs.
    let other = client.create(&workspace, &script, "auto").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{other}/turns"), json!({"input": "go"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    client.wait_state(&other, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_path_traversal_in_ids_is_refused() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ids.json", &["l.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    for id in ["..%2F..%2Fetc%2Fpasswd", "%2e%2e", "0190aaaa", "..", "x%00y", "%FF%FE"] {
        let (status, body) = client.get(&format!("/v1/sessions/{id}")).await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{id}: {status} {body}"
        );
        assert!(body["error"]["code"].is_string(), "{id}: {body}");
    }
    let session = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go"})).await;
    let pending = client.pending(&session).await;
    for call in ["..%2F..%2Fetc", "%00", "c%0Ax"] {
        let (status, body) = client
            .post(
                &format!("/v1/sessions/{session}/permissions/{call}"),
                json!({"answer": "allow_once"}),
            )
            .await;
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::NOT_FOUND,
            "{call}: {status} {body}"
        );
    }
    assert!(!workspace.join("l.txt").exists());
    // The neighbour: the real call id answers.
    let call = pending["call_id"].as_str().unwrap();
    let (status, _) = client
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    client.wait_state(&session, "completed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_an_untrusted_workspace_config_only_narrows() {
    let env = Env::new();
    let workspace = env.workspace();
    std::fs::create_dir_all(workspace.join(".keel")).unwrap();
    // The repository asks for another model and endpoint (ignored until trusted) and a
    // lower step ceiling (a narrowing, applied).
    std::fs::write(
        workspace.join(".keel/config.toml"),
        "model = \"openai:gpt-evil\"\nbase_url = \"http://127.0.0.1:9/v1\"\nmax_steps = 1\n",
    )
    .unwrap();
    let script = write_script(&env, "trust.json", &["m.txt", "n.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    // Without a model of its own the session has none: the repository's is not applied.
    let (status, body) = client.post("/v1/sessions", json!({"workspace": workspace})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("no model"), "{body}");
    let session = client.create(&workspace, &script, "auto").await;
    let (_, summary) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(summary["model"], format!("scripted:{}", script.display()));
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "go"})).await;
    client.wait_state(&session, "suspended").await;
    let ledger = ledger(&env, &session);
    let started = ledger.iter().find(|e| e["kind"] == "run_started").unwrap();
    assert_eq!(started["budget"]["max_steps"], 1, "{started}");
    assert!(!ledger.iter().any(|e| e.to_string().contains("gpt-evil")));
    assert!(host.stderr().contains("keel trust"), "the host says how to trust: {}", host.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_two_hosts_on_one_postgres_ledger_take_over_a_killed_hosts_run() {
    let Some(server) = keel_testkit::postgres::PgServer::shared() else { return };
    let database = server.create_database();
    let url = database.url().to_owned();
    let vars = [("KEEL_DATABASE_URL", url.as_str())];
    let env = Env::new();
    let other = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "pg.json", &["p.txt"]);
    let root = env.scratch.path().to_str().unwrap().to_owned();
    let first = Host::start_full(&env, &[], Some(TOKEN), &vars);
    let second = Host::start_full(&other, &["--workspace-root", &root], Some(TOKEN), &vars);
    let (a, b) = (first.client(), second.client());
    let session = a.create(&workspace, &script, "ask").await;
    a.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "write p"})).await;
    let before = a.pending(&session).await;
    // Either host shows the same ledger.
    let mut frames = Vec::new();
    assert!(b.events(&session, None).await.until("permission_requested", &mut frames).await);
    assert_eq!(frames.last().and_then(|f| f.id), before["requested_seq"].as_u64());
    // The first host drives the run: the second does not take it while it lives.
    let call = before["call_id"].as_str().unwrap().to_owned();
    let (status, body) = b
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "driven_elsewhere");

    first.kill9();
    // Within the lease time the second host takes the run over and asks again.
    let deadline = Instant::now() + Duration::from_secs(40);
    let after = loop {
        let pending = b.pending(&session).await;
        if pending["requested_seq"].as_u64() > before["requested_seq"].as_u64() {
            break pending;
        }
        assert!(Instant::now() < deadline, "not taken over: {}", second.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(after["call_id"], call.as_str());
    let (status, body) = b
        .post(
            &format!("/v1/sessions/{session}/permissions/{call}"),
            json!({"answer": "allow_once"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    b.wait_state(&session, "completed").await;
    assert!(second.stderr().contains("took over session"), "{}", second.stderr());
    assert_eq!(std::fs::read_to_string(workspace.join("p.txt")).unwrap(), "p.txt\n");
    let output =
        env.keel().env("KEEL_DATABASE_URL", &url).args(["log", &session, "--json"]).output();
    let ledger: Vec<Value> =
        stdout(&output.unwrap()).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let results: Vec<&Value> = ledger.iter().filter(|e| e["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 1, "the call ran once");
    assert_eq!(results[0]["outcome"], "ok");
    let seqs: Vec<u64> = ledger.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=ledger.len() as u64).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_killed_keel_run_with_approval_auto_is_closed_not_resumed() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "killed.json", &["q.txt", "r.txt"]);
    // A `keel run --approval auto`, killed by its user mid-run (after its first result).
    let mut run = env
        .keel()
        .env("KEEL_FAILPOINT", "after_result")
        .args(["run", "-C", workspace.to_str().unwrap(), "--approval", "auto", "-m"])
        .arg(format!("scripted:{}", script.display()))
        .arg("write q and r")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stderr.take().unwrap()).lines();
    assert!(lines.any(|line| line.unwrap().starts_with("keel-failpoint-reached")));
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(workspace.join("q.txt").exists() && !workspace.join("r.txt").exists());

    let host = Host::start(&env, &[]);
    let client = host.client();
    let (_, list) = client.get("/v1/sessions").await;
    let session = list["sessions"][0]["id"].as_str().unwrap().to_owned();
    // The host closes the dead run but does not bring it back in the background.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.stderr().contains("not resumed here") {
        assert!(Instant::now() < deadline, "{}", host.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ledger = ledger(&env, &session);
    assert_eq!(ledger.iter().filter(|e| e["kind"] == "run_started").count(), 1);
    assert_eq!(ledger.last().unwrap()["kind"], "run_failed");
    assert!(!workspace.join("r.txt").exists());
    // The neighbour: asked to, the host resumes it.
    let (status, body) = client.post(&format!("/v1/sessions/{session}/resume"), json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "completed").await;
    assert!(workspace.join("r.txt").exists());
}

/// The HTTP listing names a killed `keel run` as `keel sessions` does: `interrupted`, not
/// `running` (no live process holds its lease). The neighbour: while its process lives
/// (stopped at a failpoint), the same session is `running` in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lists_a_killed_keel_run_as_interrupted_like_keel_sessions() {
    let env = Env::new();
    let workspace = env.workspace();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let script = write_script(&env, "killed.json", &["q.txt", "r.txt"]);
    let mut run = env
        .keel()
        .env("KEEL_FAILPOINT", "after_result")
        .args(["run", "-C", workspace.to_str().unwrap(), "--approval", "auto", "-m"])
        .arg(format!("scripted:{}", script.display()))
        .arg("write q and r")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stderr.take().unwrap()).lines();
    assert!(lines.any(|line| line.unwrap().starts_with("keel-failpoint-reached")));
    let cli_state = || {
        let listed = stdout(&env.run(&["sessions", "--json"]));
        let row: Value = serde_json::from_str(listed.trim()).unwrap();
        row["state"].as_str().unwrap().to_owned()
    };
    let (_, list) = client.get("/v1/sessions").await;
    let session = list["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["sessions"][0]["state"], "running", "{list}");
    assert_eq!(cli_state(), "running");
    run.kill().unwrap();
    run.wait().unwrap();

    let (status, one) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    let (_, list) = client.get("/v1/sessions").await;
    let listed = &list["sessions"][0]["state"];
    if one["state"] == "interrupted" {
        assert_eq!(listed, "interrupted", "{list}");
        assert_eq!(cli_state(), "interrupted");
    } else {
        // The host's takeover check (every 10 s) may close the dead run first: then it is
        // closed (`failed`) everywhere, and the host says it closed it. Never `running`.
        let deadline = Instant::now() + Duration::from_secs(5);
        let note = format!("closed the interrupted run of session {session}");
        while !host.stderr().contains(&note) {
            assert!(Instant::now() < deadline, "{one} / {}", host.stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(one["state"], "failed", "{one}");
        assert_eq!(cli_state(), "failed");
    }
}

impl Client {
    /// Waits until the session has a pending server question; returns it.
    async fn question(&self, session: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, body) = self.get(&format!("/v1/sessions/{session}/questions")).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            if let Some(first) = body.as_array().and_then(|list| list.first()) {
                return first.clone();
            }
            assert!(Instant::now() < deadline, "no pending question");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn question_script(env: &Env, name: &str, expect: &str) -> PathBuf {
    std::fs::write(
        env.home.path().join("config.toml"),
        super::elicit_e2e::elicit_server("el", true),
    )
    .unwrap();
    let script = json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {}}]},
        {"text": "done", "expect": {"contains": [expect]}}
    ]});
    let path = env.scratch.path().join(name);
    std::fs::write(&path, script.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_mcp_elicit_a_hosted_question_is_pending_checked_and_answered_over_http() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = question_script(
        &env,
        "q.json",
        "action=accept content={\"color\": \"green\", \"name\": \"Bo\"}",
    );
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "ask"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let question = client.question(&session).await;
    assert_eq!(question["server"], "el", "{question}");
    assert_eq!(question["message"], "Who are you?");
    assert_eq!(question["schema"]["required"], json!(["name"]));
    let id = question["question"].as_str().unwrap().to_owned();
    // A subscriber that already saw the request gets it again as pending.
    let seq = question["requested_seq"].as_u64().unwrap();
    let mut stream = client.events(&session, Some(seq)).await;
    let pending = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(frame) = stream.next().await {
            if frame.event.as_deref() == Some("question_pending") {
                return Some(frame);
            }
        }
        None
    })
    .await
    .expect("no question_pending frame within 10 s")
    .expect("the stream ended before a question_pending frame");
    assert!(pending.id.is_none(), "a re-sent question has no id: {pending:?}");
    assert_eq!(serde_json::from_str::<Value>(&pending.data).unwrap()["question"], id);
    drop(stream);
    // Answers that do not fit the form are refused and nothing is sent.
    // The id goes into the path as it is (no `#` to start a fragment).
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.~".contains(&b)), "{id}");
    let path = format!("/v1/sessions/{session}/questions/{id}");
    for bad in [
        json!({"action": "accept", "content": {"color": "green"}}),
        json!({"action": "accept", "content": {"name": "Bo", "color": "blue"}}),
        json!({"action": "accept", "content": {"name": 7}}),
        json!({"action": "accept", "content": {"name": "Bo", "extra": true}}),
    ] {
        let (status, body) = client.post(&path, bad.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
        assert_eq!(body["error"]["code"], "invalid_answer", "{body}");
    }
    let (status, body) = client
        .post(&path, json!({"action": "accept", "content": {"name": "Bo", "color": "green"}}))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["action"], "accept");
    client.wait_state(&session, "completed").await;
    let ledger = ledger(&env, &session);
    let answered: Vec<&Value> =
        ledger.iter().filter(|e| e["kind"] == "elicitation_answered").collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["by"], "remote (keel serve)");
    assert_eq!(answered[0]["content"], json!({"name": "Bo", "color": "green"}));
    // Answered once: a second answer is a conflict, and nothing is pending.
    let (status, _) = client.post(&path, json!({"action": "decline"})).await;
    assert_eq!(status, StatusCode::CONFLICT);
    let (_, pending) = client.get(&format!("/v1/sessions/{session}/questions")).await;
    assert_eq!(pending, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_an_unanswered_question_ends_as_cancel_after_the_approval_timeout() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = question_script(&env, "t.json", "action=cancel content=null");
    let host = Host::start(&env, &["--approval-timeout", "1s"]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "ask"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    client.wait_state(&session, "completed").await;
    let ledger = ledger(&env, &session);
    let answered = ledger.iter().find(|e| e["kind"] == "elicitation_answered").unwrap();
    assert_eq!(answered["action"], "cancel", "{answered}");
    assert!(answered["reason"].as_str().unwrap().starts_with("approval_timeout"), "{answered}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_question_the_server_stops_waiting_for_ends_as_cancel() {
    let env = Env::new();
    let workspace = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        super::elicit_e2e::elicit_server("el", true),
    )
    .unwrap();
    let script = json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"timeout": 1}}]},
        {"text": "done", "expect": {"contains": ["timed out"]}}
    ]});
    let path = env.scratch.path().join("gone.json");
    std::fs::write(&path, script.to_string()).unwrap();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &path, "ask").await;
    let (status, _) =
        client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "ask"})).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    // Nobody answers; the server gives up after a second and ends its call: the question
    // is cancelled then, not left waiting for the approval timeout.
    client.wait_state(&session, "completed").await;
    let ledger = ledger(&env, &session);
    let answered = ledger.iter().find(|e| e["kind"] == "elicitation_answered").unwrap();
    assert_eq!(answered["action"], "cancel", "{answered}");
    assert!(answered["reason"].as_str().unwrap().contains("stopped waiting"), "{answered}");
    let (_, pending) = client.get(&format!("/v1/sessions/{session}/questions")).await;
    assert_eq!(pending, json!([]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_with_a_pending_question_then_restart_records_it_cancelled() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = question_script(&env, "k.json", "done");
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.post(&format!("/v1/sessions/{session}/turns"), json!({"input": "ask"})).await;
    let before = client.question(&session).await;
    host.kill9();

    // The MCP request died with the host: the restarted host closes the dead run and
    // records the question as cancelled (a later ask of the resumed run times out fast).
    let host = Host::start(&env, &["--approval-timeout", "2s"]);
    let client = host.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let cancelled = loop {
        let ledger = ledger(&env, &session);
        let found = ledger
            .iter()
            .find(|e| e["kind"] == "elicitation_answered" && e["question"] == before["question"]);
        if let Some(found) = found {
            break found.clone();
        }
        assert!(Instant::now() < deadline, "the open question was never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(cancelled["action"], "cancel", "{cancelled}");
    assert_eq!(cancelled["by"], "keel", "{cancelled}");
    assert!(cancelled["reason"].as_str().unwrap().starts_with("keel stopped"), "{cancelled}");
    drop(client);
}
