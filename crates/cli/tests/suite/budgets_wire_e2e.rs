//! Budgets on every wire API (issue 12, "Must show"): for each budget kind (steps, tokens,
//! cost, time) × wire API (OpenAI Chat Completions, OpenAI Responses, Anthropic Messages) ×
//! usage reported or missing, the real `keel` binary runs against a local server speaking
//! that wire format and must suspend (exit 3) with a checkpoint, after a tools-off report
//! step the server accepted under its API's tool rules, without passing the ceiling. With
//! usage missing, keel's own estimates (`model_response.estimated_usage`) stop the token
//! and cost budgets.
//!
//! The server answers every tools-on request with a `list_dir` call and the tools-off
//! request with a report. Per-step usage, when reported, is 1000 input + 100 output tokens.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::support::{Env, stderr, stdout};

const REPORT: &str = "Report: listed the folder. Next: answer the user.";
const INPUT_TOKENS: u64 = 1000;
const OUTPUT_TOKENS: u64 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wire {
    Chat,
    Responses,
    Messages,
}

impl Wire {
    fn spec(self) -> &'static str {
        match self {
            Wire::Chat => "openai:budget-test",
            Wire::Responses => "openai-responses:budget-test",
            Wire::Messages => "anthropic:budget-test",
        }
    }

    fn base_url(self, address: SocketAddr) -> String {
        match self {
            Wire::Chat | Wire::Responses => format!("http://{address}/v1"),
            Wire::Messages => format!("http://{address}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Steps,
    Tokens(u64),
    Cost(f64),
    Time(Duration),
}

/// What the server saw.
#[derive(Debug, Clone, Default)]
struct Seen {
    /// Every request body, in order.
    requests: Vec<Value>,
    /// Requests refused for breaking the wire API's tool rules.
    refused: Vec<String>,
    /// Tools-off requests answered 200.
    tools_off_answered: usize,
}

#[derive(Clone)]
struct Server {
    wire: Wire,
    usage: bool,
    /// How long a tools-on step takes to answer (the time budget's cases).
    delay: Duration,
    seen: Arc<Mutex<Seen>>,
}

/// The wire API's rule for tools: `tool_choice` only beside `tools` (OpenAI's APIs and
/// Anthropic's), and for Anthropic, `tool_use`/`tool_result` blocks only with `tools`.
fn tool_rule_violation(wire: Wire, request: &Value) -> Option<String> {
    let has_tools = request["tools"].as_array().is_some_and(|tools| !tools.is_empty());
    if request.get("tool_choice").is_some() && !has_tools {
        return Some("tool_choice is only allowed when tools are specified".into());
    }
    if wire == Wire::Messages && !has_tools {
        let tool_blocks = request["messages"].as_array().into_iter().flatten().any(|message| {
            message["content"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|block| matches!(block["type"].as_str(), Some("tool_use" | "tool_result")))
        });
        if tool_blocks {
            return Some(
                "Requests which include `tool_use` or `tool_result` blocks must define tools."
                    .into(),
            );
        }
    }
    None
}

fn tools_off(wire: Wire, request: &Value) -> bool {
    match wire {
        Wire::Chat | Wire::Responses => request["tool_choice"] == "none",
        Wire::Messages => request["tool_choice"]["type"] == "none",
    }
}

async fn answer(State(server): State<Server>, body: axum::body::Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let off = tools_off(server.wire, &request);
    let n = {
        let mut seen = server.seen.lock().unwrap();
        seen.requests.push(request.clone());
        if let Some(violation) = tool_rule_violation(server.wire, &request) {
            seen.refused.push(violation.clone());
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": violation}});
            return (StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
        }
        if off {
            seen.tools_off_answered += 1;
        }
        seen.requests.len()
    };
    if !off {
        tokio::time::sleep(server.delay).await;
    }
    let body = match (server.wire, off) {
        (Wire::Chat, false) => chat_call(n, server.usage),
        (Wire::Chat, true) => chat_text(REPORT, server.usage),
        (Wire::Responses, false) => responses_call(n, server.usage),
        (Wire::Responses, true) => responses_text(REPORT, server.usage),
        (Wire::Messages, false) => messages_call(n, server.usage),
        (Wire::Messages, true) => messages_text(REPORT, server.usage),
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

fn list_dir_arguments() -> String {
    json!({"path": "."}).to_string()
}

// Chat Completions: deltas, a finish reason, usage in a last chunk with empty choices.

fn chat_chunk(choices: Value, usage: Option<Value>) -> String {
    let mut body = json!({"id": "chatcmpl-b", "object": "chat.completion.chunk", "created": 1,
        "model": "budget-test", "choices": choices});
    if let Some(usage) = usage {
        body["usage"] = usage;
    }
    format!("data: {body}\n\n")
}

fn chat_tail(finish: &str, usage: bool) -> String {
    let mut out = chat_chunk(json!([{"index": 0, "delta": {}, "finish_reason": finish}]), None);
    if usage {
        out.push_str(&chat_chunk(
            json!([]),
            Some(json!({"prompt_tokens": INPUT_TOKENS, "completion_tokens": OUTPUT_TOKENS,
                "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS})),
        ));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

fn chat_call(n: usize, usage: bool) -> String {
    let mut out = chat_chunk(
        json!([{"index": 0, "delta": {"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": format!("call_{n}"), "type": "function",
             "function": {"name": "list_dir", "arguments": ""}}]}}]),
        None,
    );
    out.push_str(&chat_chunk(
        json!([{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": list_dir_arguments()}}]}}]),
        None,
    ));
    out.push_str(&chat_tail("tool_calls", usage));
    out
}

fn chat_text(text: &str, usage: bool) -> String {
    let mut out =
        chat_chunk(json!([{"index": 0, "delta": {"role": "assistant", "content": text}}]), None);
    out.push_str(&chat_tail("stop", usage));
    out
}

// Responses: typed events, the whole response (with or without usage) in response.completed.

fn responses_frame(payloads: Vec<Value>) -> String {
    payloads
        .into_iter()
        .enumerate()
        .map(|(sequence_number, mut payload)| {
            payload["sequence_number"] = json!(sequence_number);
            format!("event: {}\ndata: {payload}\n\n", payload["type"].as_str().unwrap())
        })
        .collect()
}

fn responses_completed(n: usize, output: Vec<Value>, usage: bool) -> Value {
    let mut response = json!({"id": format!("resp_{n}"), "status": "completed", "output": output});
    if usage {
        response["usage"] = json!({"input_tokens": INPUT_TOKENS,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens": OUTPUT_TOKENS,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": INPUT_TOKENS + OUTPUT_TOKENS});
    }
    json!({"type": "response.completed", "response": response})
}

fn responses_call(n: usize, usage: bool) -> String {
    let arguments = list_dir_arguments();
    let call = json!({"id": format!("fc_{n}"), "type": "function_call", "status": "completed",
        "arguments": arguments, "call_id": format!("call_{n}"), "name": "list_dir"});
    responses_frame(vec![
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": format!("fc_{n}"), "type": "function_call", "status": "in_progress",
                "arguments": "", "call_id": format!("call_{n}"), "name": "list_dir"}}),
        json!({"type": "response.function_call_arguments.delta", "item_id": format!("fc_{n}"),
            "output_index": 0, "delta": arguments}),
        json!({"type": "response.function_call_arguments.done", "item_id": format!("fc_{n}"),
            "output_index": 0, "arguments": arguments}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": call}),
        responses_completed(n, vec![call], usage),
    ])
}

fn responses_text(text: &str, usage: bool) -> String {
    let message = json!({"id": "msg_r", "type": "message", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]});
    responses_frame(vec![
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_r", "type": "message", "status": "in_progress",
                "role": "assistant", "content": []}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_r", "output_index": 0,
            "content_index": 0, "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
        responses_completed(0, vec![message], usage),
    ])
}

// Anthropic Messages: usage in message_start and message_delta, or in neither.

fn messages_frame(payloads: Vec<Value>) -> String {
    payloads
        .iter()
        .map(|payload| format!("event: {}\ndata: {payload}\n\n", payload["type"].as_str().unwrap()))
        .collect()
}

fn messages_start(n: usize, usage: bool) -> Value {
    let mut message = json!({"id": format!("msg_{n}"), "type": "message", "role": "assistant",
        "model": "budget-test", "content": [], "stop_reason": null});
    if usage {
        message["usage"] = json!({"input_tokens": INPUT_TOKENS, "output_tokens": 1});
    }
    json!({"type": "message_start", "message": message})
}

fn messages_delta(stop_reason: &str, usage: bool) -> Value {
    let mut delta = json!({"type": "message_delta", "delta": {"stop_reason": stop_reason}});
    if usage {
        delta["usage"] = json!({"output_tokens": OUTPUT_TOKENS});
    }
    delta
}

fn messages_call(n: usize, usage: bool) -> String {
    messages_frame(vec![
        messages_start(n, usage),
        json!({"type": "content_block_start", "index": 0, "content_block":
            {"type": "tool_use", "id": format!("toolu_{n}"), "name": "list_dir", "input": {}}}),
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": list_dir_arguments()}}),
        json!({"type": "content_block_stop", "index": 0}),
        messages_delta("tool_use", usage),
        json!({"type": "message_stop"}),
    ])
}

fn messages_text(text: &str, usage: bool) -> String {
    messages_frame(vec![
        messages_start(0, usage),
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        messages_delta("end_turn", usage),
        json!({"type": "message_stop"}),
    ])
}

async fn serve(server: Server) -> SocketAddr {
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .route("/v1/responses", post(answer))
        .route("/v1/messages", post(answer))
        .with_state(server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// Tokens a `model_response` counts against a token budget: reported figures, with keel's
/// estimate for the missing ones.
fn charged_tokens(response: &Value) -> u64 {
    let figure = |name: &str| {
        response["usage"][name]
            .as_u64()
            .or_else(|| response["estimated_usage"][name].as_u64())
            .unwrap_or(0)
    };
    figure("input_tokens")
        + figure("output_tokens")
        + response["usage"]["reasoning_tokens"].as_u64().unwrap_or(0)
}

/// One case: runs keel once and checks the stop.
async fn case(wire: Wire, kind: Kind, usage: bool) {
    let label = format!("{wire:?} {kind:?} usage={usage}");
    let delay = match kind {
        Kind::Time(_) => TIME_STEP,
        Kind::Steps | Kind::Tokens(_) | Kind::Cost(_) => Duration::ZERO,
    };
    let server = Server { wire, usage, delay, seen: Arc::default() };
    let address = serve(server.clone()).await;
    let env = Env::new();
    // $1 per million input tokens, $2 per million output: a reported step costs $0.0012.
    std::fs::write(
        env.home.path().join("prices.toml"),
        format!("[\"{}\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n", wire.spec()),
    )
    .unwrap();
    let mut budget_args: Vec<String> = match kind {
        Kind::Steps => vec!["--max-steps".into(), "2".into()],
        Kind::Tokens(max) => vec!["--max-tokens".into(), max.to_string()],
        Kind::Cost(max) => vec!["--max-cost-usd".into(), max.to_string()],
        Kind::Time(max) => vec!["--max-time".into(), format!("{}ms", max.as_millis())],
    };
    // A step ceiling far away, so a budget that never stops the run fails the test fast.
    if kind != Kind::Steps {
        budget_args.extend(["--max-steps".into(), "12".into()]);
    }
    let workspace = env.workspace();
    std::fs::write(workspace.join("a.txt"), "alpha\n").unwrap();
    let mut command = env.keel();
    command
        .env("OPENAI_API_KEY", "sk-budget-test")
        .env("ANTHROPIC_API_KEY", "sk-ant-budget-test")
        .args(["run", "-C", workspace.to_str().unwrap(), "-m", wire.spec()])
        .args(["--base-url", &wire.base_url(address), "--approval", "auto", "--json"])
        .args(&budget_args)
        .arg("List the folder.");
    let output = tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap();
    let seen = server.seen.lock().unwrap().clone();
    assert_eq!(output.status.code(), Some(3), "{label}: stderr {}", stderr(&output));
    let events: Vec<Value> =
        stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let last = events.last().unwrap();
    assert_eq!(last["kind"], "run_suspended", "{label}");

    // A checkpoint with the tools-off report, which the server accepted under its rules.
    assert!(seen.refused.is_empty(), "{label}: the server refused {:?}", seen.refused);
    assert_eq!(seen.tools_off_answered, 1, "{label}: one tools-off report step");
    assert!(tools_off(wire, seen.requests.last().unwrap()), "{label}: the report step came last");
    let exhausted = events.iter().find(|e| e["kind"] == "budget_exhausted").unwrap();
    assert_eq!(exhausted["report_requested"], true, "{label}: {exhausted}");
    let checkpoint = events.iter().find(|e| e["kind"] == "checkpoint").unwrap();
    assert_eq!(checkpoint["report"], REPORT, "{label}");
    assert!(checkpoint["evidence"][0]["tool"] == "list_dir", "{label}: {checkpoint}");

    let responses: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "model_response" && e.get("purpose").is_none())
        .collect();
    let steps = events
        .iter()
        .filter(|e| e["kind"] == "model_requested" && e.get("purpose").is_none())
        .count();
    assert_eq!(steps, seen.requests.len(), "{label}: every request is recorded");
    assert_eq!(responses.len(), steps, "{label}");
    for response in &responses {
        if usage {
            assert_eq!(response["usage"]["input_tokens"], INPUT_TOKENS, "{label}: {response}");
            assert!(response.get("estimated_usage").is_none(), "{label}: {response}");
        } else {
            assert!(response["usage"]["input_tokens"].is_null(), "{label}: {response}");
            assert!(
                response["estimated_usage"]["input_tokens"].as_u64().unwrap() > 0
                    && response["estimated_usage"]["output_tokens"].as_u64().unwrap() > 0,
                "{label}: unreported usage is estimated: {response}"
            );
            assert!(response["cost_usd"].as_f64().unwrap() > 0.0, "{label}: {response}");
        }
    }

    // The ceiling was not passed.
    match kind {
        Kind::Steps => assert_eq!(steps, 2, "{label}"),
        Kind::Tokens(max) => {
            let tokens: u64 = responses.iter().map(|r| charged_tokens(r)).sum();
            assert!(tokens <= max, "{label}: {tokens} tokens of {max}");
            assert!(steps >= 2, "{label}: stopped by the budget, not before a step");
        }
        Kind::Cost(max) => {
            let cost: f64 = responses.iter().map(|r| r["cost_usd"].as_f64().unwrap()).sum();
            assert!(cost <= max, "{label}: ${cost} of ${max}");
            let total = last["usage"]["cost_usd"].as_f64().unwrap();
            assert!((total - cost).abs() < 1e-12, "{label}: {total} vs {cost}");
            assert!(steps >= 2, "{label}");
        }
        Kind::Time(max) => {
            let duration = last["duration_ms"].as_u64().unwrap();
            assert!(u128::from(duration) <= max.as_millis(), "{label}: {duration} ms");
            assert!(steps >= 2, "{label}");
        }
    }
}

/// Ceilings that leave room for one tools-on step and the report. Reported usage is 1100
/// tokens and $0.0012 a step. keel's estimate of an unreported step is its count of the
/// whole request (system prompt, tool definitions, history) and the answer: about 3,000
/// tokens and $0.0030 here (with `run_code`'s definition), so 10,500 tokens or $0.0105 stop
/// the run after two tools-on steps and the report, with ~1,000 tokens of margin either side
/// of the prediction.
fn kinds(usage: bool) -> [Kind; 4] {
    let (tokens, cost) = if usage { (2_750, 0.003) } else { (TOKENS_ESTIMATED, COST_ESTIMATED) };
    [Kind::Steps, Kind::Tokens(tokens), Kind::Cost(cost), Kind::Time(TIME_STEP * 5 / 2)]
}

/// How long the server takes to answer a tools-on step in the time cases. A ceiling of
/// 2.5 steps makes the second step the tools-off report (answered at once), with a quarter
/// of a step of slack either way for a loaded machine.
const TIME_STEP: Duration = Duration::from_millis(1500);

const TOKENS_ESTIMATED: u64 = 10_500;
const COST_ESTIMATED: f64 = 0.0105;

async fn wire_cases(wire: Wire) {
    for usage in [true, false] {
        for kind in kinds(usage) {
            case(wire, kind, usage).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_budgets_stop_openai_chat_with_usage_reported_and_missing() {
    wire_cases(Wire::Chat).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_budgets_stop_openai_responses_with_usage_reported_and_missing() {
    wire_cases(Wire::Responses).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_budgets_stop_anthropic_messages_with_usage_reported_and_missing() {
    wire_cases(Wire::Messages).await;
}
