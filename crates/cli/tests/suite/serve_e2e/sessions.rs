//! Sessions and turns over HTTP: a turn's stream is the ledger, the OpenAPI document,
//! usage errors, steering input, plan mode and its approval, cancel and resume, and the
//! cap on concurrent runs.

use std::path::Path;
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{
    Client, Host, Sse, TOKEN, assert_frames_are_the_ledger, ledger, write_script,
};
use crate::suite::support::{Env, events_of};

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
    let started = client.turn(&session, "write a").await;
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
    let mut replay = Sse::of(response);
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

    client.turn(&session, "write c").await;
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
    let (status, body) = client.answer(&session, call, "allow_once").await;
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

/// A plan-mode session (approval auto) whose script plans to write e.txt, then writes it
/// once the plan is approved.
async fn plan_session(env: &Env, client: &Client, workspace: &Path) -> String {
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
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": workspace, "model": format!("scripted:{}", script.display()),
                   "approval": "auto", "mode": "plan"}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_plan_mode_then_approve_plan_runs_it_live() {
    let env = Env::new();
    let workspace = env.workspace();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = plan_session(&env, &client, &workspace).await;
    client.turn(&session, "plan e").await;
    client.wait_state(&session, "completed").await;
    assert!(!workspace.join("e.txt").exists(), "plan mode wrote");

    let path = format!("/v1/sessions/{session}/plan/approve");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(body["approved_seq"].as_u64().is_some() && body["run_id"].is_string(), "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e\n");
    let ledger = ledger(&env, &session);
    let approved = events_of(&ledger, "plan_approved");
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
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = plan_session(&env, &client, &workspace).await;
    // No turn yet, so no plan: approving is refused and nothing runs.
    let path = format!("/v1/sessions/{session}/plan/approve");
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "not_planning");
    let events = ledger(&env, &session);
    assert!(events.iter().all(|e| e["kind"] != "plan_approved" && e["kind"] != "run_started"));
    assert!(!workspace.join("e.txt").exists(), "an unplanned approval wrote");
    // The neighbour: after the plan-mode turn, the approval is accepted and runs live.
    client.turn(&session, "plan e").await;
    client.wait_state(&session, "completed").await;
    let (status, body) = client.post(&path, json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e\n");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_cancel_then_resume_continues_without_running_the_cancelled_call() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "cancel.json", &["d.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write d").await;
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
    let results = events_of(&ledger, "tool_result");
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["outcome"], "cancelled");
    assert_eq!(ledger.iter().filter(|e| e["kind"] == "run_started").count(), 2);
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
    client.turn(&first, "wait").await;
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
    client.turn(&second, "now").await;
}
