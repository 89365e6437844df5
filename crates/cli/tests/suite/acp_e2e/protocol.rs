//! The raw protocol, for what no SDK would send and how turns end: bad input answered,
//! the client going away mid-turn, a bounded permission wait, the stop reasons of budgets
//! and refusals, and `session/set_mode`.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::harness::{Raw, keel_log, scripted_args};
use crate::suite::support::{Env, events_of};

#[test]
fn acp_bad_input_is_answered_and_the_agent_goes_on() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let args = scripted_args(&env, "one.json", r#"{"steps":[{"text":"hello"}]}"#);
    let mut raw = Raw::start(&env, &args);
    // Malformed JSON: answered with a parse error, not a crash.
    raw.send("{this is not json");
    let parse = raw.until("a parse error", |v| v.get("error").is_some());
    assert_eq!(parse["error"]["code"], -32700, "{parse}");
    // An unknown method: method not found.
    raw.send(r#"{"jsonrpc":"2.0","id":7,"method":"session/new","params":{"cwd":"/"}}"#);
    assert_eq!(raw.response(7)["error"]["code"], -32600, "session/new before initialize");
    raw.initialize();
    raw.send(r#"{"jsonrpc":"2.0","id":8,"method":"session/teleport","params":{}}"#);
    assert_eq!(raw.response(8)["error"]["code"], -32601);
    raw.send(r#"{"jsonrpc":"2.0","id":9,"method":"session/new","params":{"cwd":42}}"#);
    assert_eq!(raw.response(9)["error"]["code"], -32602, "ill-typed params");
    // A relative, a missing and a file cwd are refused as invalid params.
    for (id, cwd) in [
        (10, PathBuf::from("relative/dir")),
        (11, ws.join("missing")),
        (12, env.write_script("file", "x")),
    ] {
        let answer = raw.new_session(id, &cwd);
        assert_eq!(answer["error"]["code"], -32602, "{cwd:?}: {answer}");
    }
    // An HTTP MCP server with headers is served (keel sends them); one with a header that
    // is not valid HTTP is refused, not dropped.
    raw.send(&json!({"jsonrpc":"2.0","id":13,"method":"session/new","params":{"cwd":ws,"mcpServers":[
        {"type":"http","name":"api","url":"http://127.0.0.1:9/mcp","headers":[{"name":"Authorization","value":"Bearer x"}]}]}}).to_string());
    assert!(raw.response(13)["result"]["sessionId"].is_string());
    raw.send(&json!({"jsonrpc":"2.0","id":14,"method":"session/new","params":{"cwd":ws,"mcpServers":[
        {"type":"http","name":"api","url":"http://127.0.0.1:9/mcp","headers":[{"name":"bad name","value":"x"}]}]}}).to_string());
    assert_eq!(raw.response(14)["error"]["code"], -32602);
    // A prompt for a session nobody opened, and one with no text.
    raw.send(r#"{"jsonrpc":"2.0","id":20,"method":"session/prompt","params":{"sessionId":"nope","prompt":[{"type":"text","text":"hi"}]}}"#);
    assert_eq!(raw.response(20)["error"]["code"], -32602);
    let session = raw.open_session(21, &ws);
    raw.send(&json!({"jsonrpc":"2.0","id":22,"method":"session/prompt","params":{"sessionId":session,"prompt":[]}}).to_string());
    assert_eq!(raw.response(22)["error"]["code"], -32602);
    // Loading a session that does not exist.
    raw.send(&json!({"jsonrpc":"2.0","id":23,"method":"session/load","params":{"sessionId":"01a2316a-352a-7459-b033-e9291312eb4b","cwd":ws,"mcpServers":[]}}).to_string());
    assert_eq!(raw.response(23)["error"]["code"], -32602);
    // After all that, a real turn still works.
    raw.prompt(24, &session, "hi");
    assert_eq!(raw.response(24)["result"]["stopReason"], "end_turn");
    drop(raw.stdin.take());
    assert!(raw.wait_exit(Duration::from_secs(20)).success());
}

#[test]
fn acp_client_disconnecting_mid_turn_cancels_and_records_the_run() {
    disconnect_mid_turn(false);
}

#[test]
fn acp_sigterm_mid_turn_cancels_and_records_the_run() {
    disconnect_mid_turn(true);
}

/// The client goes away while a command runs: stdin closed, or SIGTERM to keel acp.
fn disconnect_mid_turn(by_signal: bool) {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let script = r#"{"steps":[{"tool_calls":[{"name":"bash","arguments":{"command":"sleep 60"}}]},{"text":"never"}]}"#;
    let args = scripted_args(&env, "long.json", script);
    let mut raw = Raw::start(&env, &args);
    raw.initialize();
    let session = raw.open_session(2, &ws);
    raw.prompt(3, &session, "wait");
    let ask = raw.until("a permission request", |v| v["method"] == "session/request_permission");
    raw.select(&ask, "allow_once");
    raw.until("the command running", |v| v["params"]["update"]["status"] == "in_progress");
    // The editor goes away mid-command.
    let gone = Instant::now();
    if by_signal {
        let pid = raw.child.id().to_string();
        assert!(Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    } else {
        drop(raw.stdin.take());
    }
    raw.wait_exit(Duration::from_secs(20));
    assert!(gone.elapsed() < Duration::from_secs(20));
    let events = keel_log(&env, &session);
    assert_eq!(events_of(&events, "run_cancelled").len(), 1, "{events:#?}");
    let results = events_of(&events, "tool_result");
    assert_eq!(results[0]["outcome"], "cancelled");
    // Nothing lost: the run is closed as cancelled, last, and no run is left open.
    assert_eq!(events.last().unwrap()["kind"], "run_cancelled", "{events:#?}");
    let sessions = env.run(&["sessions", "--json"]);
    assert!(sessions.status.success());
    assert!(!String::from_utf8_lossy(&sessions.stdout).contains("\"running\""));
}

#[test]
fn acp_permission_wait_is_bounded_and_the_reason_recorded() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let script = r#"{"steps":[{"tool_calls":[{"name":"write_file","arguments":{"path":"a.txt","content":"a"}}]},{"text":"done","expect":{"last_outcomes":["refused"]}}]}"#;
    let mut args = scripted_args(&env, "wait.json", script);
    args.extend(["--permission-timeout".to_owned(), "1s".to_owned()]);
    let mut raw = Raw::start(&env, &args);
    raw.initialize();
    let session = raw.open_session(2, &ws);
    raw.prompt(3, &session, "write");
    raw.until("a permission request", |v| v["method"] == "session/request_permission");
    // Never answered: after the timeout the call is denied and the turn ends.
    assert_eq!(raw.response(3)["result"]["stopReason"], "end_turn");
    assert!(!ws.join("a.txt").exists());
    let events = keel_log(&env, &session);
    let settled = events_of(&events, "permission_settled");
    assert_eq!(settled[0]["answer"], "deny");
    assert!(settled[0]["by"].as_str().unwrap().contains("no answer within 1s"), "{settled:?}");
}

/// One prompt through `keel acp ARGS`; its stop reason and the session's ledger.
fn stop_reason_of(env: &Env, args: &[String]) -> (Value, Vec<Value>) {
    let ws = env.workspace().canonicalize().unwrap();
    let mut raw = Raw::start(env, args);
    raw.initialize();
    let session = raw.open_session(2, &ws);
    raw.prompt(3, &session, "list");
    let answer = raw.response(3);
    drop(raw.stdin.take());
    raw.wait_exit(Duration::from_secs(20));
    (answer, keel_log(env, &session))
}

const LISTING: &str = r#"{"steps":[
  {"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":600,"output_tokens":10}},
  {"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":700,"output_tokens":10}},
  {"text":"Report: listed.","usage":{"input_tokens":800,"output_tokens":10}},
  {"text":"Report: listed.","usage":{"input_tokens":800,"output_tokens":10}}]}"#;

#[test]
fn acp_stop_reasons_name_the_budget_that_ended_the_turn() {
    let env = Env::new();
    let mut args = scripted_args(&env, "steps.json", LISTING);
    args.extend(["--max-steps".to_owned(), "2".to_owned()]);
    let (answer, events) = stop_reason_of(&env, &args);
    assert_eq!(answer["result"]["stopReason"], "max_turn_requests", "{answer}");
    assert_eq!(events_of(&events, "run_suspended").len(), 1, "{events:#?}");

    let env = Env::new();
    let mut args = scripted_args(&env, "tokens.json", LISTING);
    args.extend(["--max-tokens".to_owned(), "1000".to_owned()]);
    let (answer, events) = stop_reason_of(&env, &args);
    assert_eq!(answer["result"]["stopReason"], "max_tokens", "{answer}");
    assert_eq!(events_of(&events, "run_suspended").len(), 1, "{events:#?}");

    // The neighbour: no budget reached is an ordinary end of turn.
    let env = Env::new();
    let args = scripted_args(&env, "free.json", LISTING);
    let (answer, _) = stop_reason_of(&env, &args);
    assert_eq!(answer["result"]["stopReason"], "end_turn", "{answer}");
}

/// A loopback OpenAI-compatible server whose model refuses: a `refusal` delta and `stop`.
async fn refusing(_body: axum::body::Bytes) -> impl axum::response::IntoResponse {
    let chunk = |delta: Value, finish: Option<&str>| {
        let body = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-test", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {body}\n\n")
    };
    let mut body = chunk(json!({"role": "assistant", "content": null}), None);
    body.push_str(&chunk(json!({"refusal": "I can't help with that."}), None));
    body.push_str(&chunk(json!({}), Some("stop")));
    body.push_str("data: [DONE]\n\n");
    ([(axum::http::header::CONTENT_TYPE, "text/event-stream")], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acp_a_model_refusal_is_the_refusal_stop_reason() {
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(refusing));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let answer = tokio::task::spawn_blocking(move || {
        let env = Env::new();
        let ws = env.workspace().canonicalize().unwrap();
        let args: Vec<String> = ["-m", "openai:gpt-test", "--base-url"]
            .iter()
            .map(|s| s.to_string())
            .chain([format!("http://{address}/v1")])
            .collect();
        let mut raw = Raw::start_with(&env, &args, &[("OPENAI_API_KEY", "sk-test")]);
        raw.initialize();
        let session = raw.open_session(2, &ws);
        raw.prompt(3, &session, "something bad");
        raw.response(3)
    })
    .await
    .unwrap();
    assert_eq!(answer["result"]["stopReason"], "refusal", "{answer}");
}

#[test]
fn acp_set_mode_switches_the_approval_mode_between_turns() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let script = r#"{"steps":[
      {"tool_calls":[{"name":"write_file","arguments":{"path":"auto.txt","content":"a"}}]},
      {"text":"wrote","expect":{"last_outcomes":["ok"]}},
      {"tool_calls":[{"name":"write_file","arguments":{"path":"deny.txt","content":"d"}}]},
      {"text":"refused","expect":{"last_outcomes":["refused"]}}]}"#;
    let args = scripted_args(&env, "modes.json", script);
    let mut raw = Raw::start(&env, &args);
    raw.initialize();
    let created = raw.new_session(2, &ws);
    assert_eq!(created["result"]["modes"]["currentModeId"], "ask", "{created}");
    let ids: Vec<&str> = created["result"]["modes"]["availableModes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["ask", "sandboxed", "auto", "deny"]);
    let session = created["result"]["sessionId"].as_str().unwrap().to_owned();
    assert_eq!(raw.set_mode(3, &session, "yolo")["error"]["code"], -32602);
    assert!(raw.set_mode(4, &session, "auto")["result"].is_object());
    raw.prompt(5, &session, "write");
    assert_eq!(raw.answer_without_asking(5)["result"]["stopReason"], "end_turn");
    assert!(ws.join("auto.txt").exists());
    assert!(raw.set_mode(6, &session, "deny")["result"].is_object());
    raw.prompt(7, &session, "write");
    assert_eq!(raw.answer_without_asking(7)["result"]["stopReason"], "end_turn");
    assert!(!ws.join("deny.txt").exists());
    let events = keel_log(&env, &session);
    let approvals: Vec<&Value> =
        events_of(&events, "run_started").iter().map(|e| &e["approval"]).collect();
    assert_eq!(approvals, [&json!("auto"), &json!("deny")]);
}
