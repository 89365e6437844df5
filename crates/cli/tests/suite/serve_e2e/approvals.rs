//! Permission requests and MCP servers' questions, answered over HTTP or left to time out.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{Host, ledger, question_script, write_script};
use crate::suite::support::{Env, events_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_approvals_first_answer_wins_and_a_turn_waits_for_it() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "ask.json", &["b.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write b").await;
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
    let (status, body) = client.answer(&session, call, "allow_once").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["answer"], "allow_once");
    let (status, body) = client.answer(&session, call, "allow_once").await;
    assert_eq!(status, StatusCode::OK, "same answer again: {body}");
    let (status, body) = client.answer(&session, call, "deny").await;
    assert_eq!(status, StatusCode::CONFLICT, "a different answer: {body}");
    assert_eq!(body["error"]["code"], "already_answered");
    let (status, body) = client.answer(&session, call, "maybe").await;
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
async fn serve_an_unanswered_request_ends_as_deny_after_the_approval_timeout() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "timeout.json", &["c.txt"]);
    let host = Host::start(&env, &["--approval-timeout", "1s"]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write c").await;
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
    let (status, body) = client.answer(&session, call, "allow_once").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_mcp_elicit_a_hosted_question_is_pending_checked_and_answered_over_http() {
    let env = Env::new();
    let workspace = env.workspace();
    let accepted = "action=accept content={\"color\": \"green\", \"name\": \"Bo\"}";
    let script = question_script(&env, "q.json", json!({}), accepted);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "ask").await;
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
    let answered = events_of(&ledger, "elicitation_answered");
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
    let script = question_script(&env, "t.json", json!({}), "action=cancel content=null");
    let host = Host::start(&env, &["--approval-timeout", "1s"]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "ask").await;
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
    let script = question_script(&env, "gone.json", json!({"timeout": 1}), "timed out");
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "ask").await;
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
