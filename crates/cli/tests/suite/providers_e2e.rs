//! `keel run -m anthropic:…` and `keel run -m openai-responses:…` against local servers that
//! stream each API's SSE format: a tool round trip (write_file) whose second request must
//! carry the thinking (Anthropic: text and signature byte-exact) or reasoning item
//! (Responses: encrypted content) of the first answer, and the tool result answering the
//! call.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use super::support::{Env, stderr, stdout};

#[derive(Clone, Default)]
struct Recorded {
    requests: Arc<Mutex<Vec<(HeaderMap, Value)>>>,
}

const THINKING: [&str; 3] = [
    "The user wants a file written.\n",
    "I'll call write_file with the path and content — \"quoted\" and unicode: é✓.",
    "",
];
const SIGNATURE: &str = "EqQBCkgIBxABGAIiQH1sT9+/e2e/Signature+With/Slashes==";
const FILE_CONTENT: &str = "hello from keel\nsecond line\n";

/// Serves a router on 127.0.0.1 and returns its address.
async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

/// Runs `keel run` with `env_vars` in a fresh KEEL_HOME and workspace.
async fn run_keel(
    env: &Env,
    model: &str,
    base_url: String,
    env_vars: &[(&str, &str)],
) -> std::process::Output {
    let workspace = env.workspace();
    let keel_home = env.home.path().to_owned();
    let model = model.to_owned();
    let env_vars: Vec<(String, String)> =
        env_vars.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .env("KEEL_HOME", &keel_home)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .envs(env_vars)
            .stdin(std::process::Stdio::null())
            .args(["run", "-C", workspace.to_str().unwrap(), "-m", &model])
            .args(["--base-url", &base_url, "--approval", "auto", "--json"])
            .arg("Write notes/hello.txt with two lines.")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

/// The secret appears nowhere in the output or in KEEL_HOME.
fn assert_no_secret(env: &Env, output: &std::process::Output, secret: &str) {
    assert!(!stdout(output).contains(secret), "API key leaked into the event stream");
    assert!(!stderr(output).contains(secret), "API key leaked into stderr");
    for entry in std::fs::read_dir(env.home.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&bytes).contains(secret), "API key in KEEL_HOME");
    }
}

fn last_event(output: &std::process::Output) -> Value {
    stdout(output).lines().last().map(|line| serde_json::from_str(line).unwrap()).unwrap()
}

// ---------------------------------------------------------------------------------------
// Anthropic Messages

fn anthropic_event(payload: &Value) -> String {
    // Padded like Anthropic's real data lines.
    format!("event: {}\ndata: {payload}    \n\n", payload["type"].as_str().unwrap())
}

/// Thinking (deltas, an empty delta, the signature), then a write_file call whose input
/// arrives in small fragments.
fn anthropic_thinking_then_tool_use() -> String {
    let mut payloads = vec![
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-sonnet-4-5", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 900, "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 100, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        json!({"type": "ping"}),
    ];
    for piece in THINKING {
        payloads.push(json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": piece}}));
    }
    payloads.push(json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "signature_delta", "signature": SIGNATURE}}));
    payloads.push(json!({"type": "content_block_stop", "index": 0}));
    payloads.push(json!({"type": "content_block_start", "index": 1, "content_block":
        {"type": "tool_use", "id": "toolu_write_1", "name": "write_file", "input": {}}}));
    let input = json!({"path": "notes/hello.txt", "content": FILE_CONTENT}).to_string();
    let chars: Vec<char> = input.chars().collect();
    payloads.push(json!({"type": "content_block_delta", "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": ""}}));
    for fragment in chars.chunks(5) {
        payloads.push(json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": fragment.iter().collect::<String>()}}));
    }
    payloads.push(json!({"type": "content_block_stop", "index": 1}));
    payloads.push(json!({"type": "message_delta", "delta": {"stop_reason": "tool_use",
        "stop_sequence": null}, "usage": {"output_tokens": 120}}));
    payloads.push(json!({"type": "message_stop"}));
    payloads.iter().map(anthropic_event).collect()
}

fn anthropic_text(text: &str) -> String {
    [
        json!({"type": "message_start", "message": {"id": "msg_2", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": 1100, "cache_read_input_tokens": 900,
                "cache_creation_input_tokens": 0, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}),
        json!({"type": "message_stop"}),
    ]
    .iter()
    .map(anthropic_event)
    .collect()
}

async fn messages(
    State(recorded): State<Recorded>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut requests = recorded.requests.lock().unwrap();
        requests.push((headers, request));
        requests.len()
    };
    let body = match n {
        1 => anthropic_thinking_then_tool_use(),
        _ => anthropic_text("Wrote notes/hello.txt."),
    };
    ([(header::CONTENT_TYPE, "text/event-stream; charset=utf-8")], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_and_a_tool_round_trip_drive_a_real_run() {
    let recorded = Recorded::default();
    let address =
        serve(Router::new().route("/v1/messages", post(messages)).with_state(recorded.clone()))
            .await;
    let env = Env::new();
    let secret = "sk-ant-test-secret-456";
    let output = run_keel(
        &env,
        "anthropic:claude-sonnet-4-5",
        format!("http://{address}"),
        &[("ANTHROPIC_API_KEY", secret)],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));

    let written = std::fs::read_to_string(env.workspace().join("notes/hello.txt")).unwrap();
    assert_eq!(written, FILE_CONTENT);

    let requests = recorded.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for (headers, request) in &requests {
        assert_eq!(headers["x-api-key"], secret);
        assert_eq!(headers["anthropic-version"], "2023-06-01");
        assert!(headers.get(header::AUTHORIZATION).is_none());
        assert_eq!(request["model"], "claude-sonnet-4-5");
        assert_eq!(request["stream"], true);
        assert!(request["max_tokens"].as_u64().unwrap() > 0);
        assert!(!request["system"].as_str().unwrap().is_empty(), "system prompt is top-level");
        let tools: Vec<&str> = request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(tools.contains(&"write_file"), "{tools:?}");
        assert!(request["tools"][0]["input_schema"].is_object());
    }

    // The second request replays the first answer: thinking first, byte-exact, then the
    // call; then one user message whose tool_result answers that call.
    let messages = requests[1].1["messages"].as_array().unwrap().clone();
    assert_eq!(messages.len(), 3, "{messages:#?}");
    assert_eq!(messages[0]["role"], "user");
    let assistant = &messages[1];
    assert_eq!(assistant["role"], "assistant");
    let blocks = assistant["content"].as_array().unwrap();
    assert_eq!(blocks.len(), 2, "{blocks:#?}");
    assert_eq!(
        blocks[0],
        json!({"type": "thinking", "thinking": THINKING.concat(), "signature": SIGNATURE})
    );
    assert_eq!(blocks[1]["type"], "tool_use");
    assert_eq!(blocks[1]["id"], "toolu_write_1");
    assert_eq!(blocks[1]["name"], "write_file");
    assert_eq!(blocks[1]["input"], json!({"path": "notes/hello.txt", "content": FILE_CONTENT}));
    let answer = &messages[2];
    assert_eq!(answer["role"], "user");
    let results = answer["content"].as_array().unwrap();
    assert_eq!(results.len(), 1, "{results:#?}");
    assert_eq!(results[0]["type"], "tool_result");
    assert_eq!(results[0]["tool_use_id"], "toolu_write_1");
    assert_eq!(results[0].get("is_error"), None, "the write succeeded");

    assert_no_secret(&env, &output, secret);
    let last = last_event(&output);
    assert_eq!(last["kind"], "run_completed");
    // Input counts cache reads: (900 + 100) + (1100 + 900); output as reported.
    assert_eq!(last["usage"]["input_tokens"], 3000);
    assert_eq!(last["usage"]["output_tokens"], 129);
    assert_eq!(last["usage"]["reasoning_tokens"], 0, "thinking stays inside output");
}

// ---------------------------------------------------------------------------------------
// OpenAI Responses

const ENCRYPTED: &str = "gAAAAABoE2e-Encrypted_Reasoning+Blob/==";
const SUMMARY: &str = "**Writing the file**\n\nI'll call write_file.";

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

fn responses_reasoning_then_call() -> String {
    let arguments = json!({"path": "notes/hello.txt", "content": FILE_CONTENT}).to_string();
    let reasoning = json!({"id": "rs_1", "type": "reasoning", "encrypted_content": ENCRYPTED,
        "summary": [{"type": "summary_text", "text": SUMMARY}]});
    let call = json!({"id": "fc_1", "type": "function_call", "status": "completed",
        "arguments": arguments, "call_id": "call_write_1", "name": "write_file"});
    let mut payloads = vec![
        json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "delta": SUMMARY}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning}),
        json!({"type": "response.output_item.added", "output_index": 1,
            "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": "call_write_1", "name": "write_file"}}),
    ];
    let chars: Vec<char> = arguments.chars().collect();
    for fragment in chars.chunks(7) {
        payloads.push(json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
            "output_index": 1, "delta": fragment.iter().collect::<String>()}));
    }
    payloads.push(json!({"type": "response.function_call_arguments.done", "item_id": "fc_1",
        "output_index": 1, "arguments": arguments}));
    payloads.push(json!({"type": "response.output_item.done", "output_index": 1, "item": call}));
    payloads.push(json!({"type": "response.completed", "response": {"id": "resp_1",
        "status": "completed", "output": [reasoning, call],
        "usage": {"input_tokens": 700, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 150, "output_tokens_details": {"reasoning_tokens": 100},
            "total_tokens": 850}}}));
    responses_frame(payloads)
}

fn responses_text(text: &str) -> String {
    let message = json!({"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]});
    responses_frame(vec![
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
        json!({"type": "response.completed", "response": {"id": "resp_2", "status": "completed",
            "output": [message], "usage": {"input_tokens": 900,
                "input_tokens_details": {"cached_tokens": 640}, "output_tokens": 12,
                "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 912}}}),
    ])
}

async fn responses(
    State(recorded): State<Recorded>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let n = {
        let mut requests = recorded.requests.lock().unwrap();
        requests.push((headers, request));
        requests.len()
    };
    let body = match n {
        1 => responses_reasoning_then_call(),
        _ => responses_text("Wrote notes/hello.txt."),
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_reasoning_and_a_tool_round_trip_drive_a_real_run() {
    let recorded = Recorded::default();
    let address =
        serve(Router::new().route("/v1/responses", post(responses)).with_state(recorded.clone()))
            .await;
    let env = Env::new();
    let secret = "sk-test-responses-789";
    let output = run_keel(
        &env,
        "openai-responses:gpt-5-mini",
        format!("http://{address}/v1"),
        &[("OPENAI_API_KEY", secret)],
    )
    .await;
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));

    let written = std::fs::read_to_string(env.workspace().join("notes/hello.txt")).unwrap();
    assert_eq!(written, FILE_CONTENT);

    let requests = recorded.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2);
    for (headers, request) in &requests {
        assert_eq!(headers[header::AUTHORIZATION], format!("Bearer {secret}"));
        assert_eq!(request["model"], "gpt-5-mini");
        assert_eq!(request["stream"], true);
        assert_eq!(request["store"], false);
        assert_eq!(request["include"], json!(["reasoning.encrypted_content"]));
        assert!(!request["instructions"].as_str().unwrap().is_empty());
        let tools: Vec<&str> = request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["name"].as_str().unwrap())
            .collect();
        assert!(tools.contains(&"write_file"), "{tools:?}");
        assert_eq!(request["tools"][0]["type"], "function");
    }

    // The second request carries the reasoning item, the call and its output, in order.
    let input = requests[1].1["input"].as_array().unwrap().clone();
    assert_eq!(input.len(), 4, "{input:#?}");
    assert_eq!(input[0]["role"], "user");
    assert_eq!(
        input[1],
        json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": SUMMARY}],
            "encrypted_content": ENCRYPTED})
    );
    assert_eq!(input[2]["type"], "function_call");
    assert_eq!(input[2]["call_id"], "call_write_1");
    assert_eq!(input[2]["name"], "write_file");
    let arguments: Value = serde_json::from_str(input[2]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"path": "notes/hello.txt", "content": FILE_CONTENT}));
    assert_eq!(input[3]["type"], "function_call_output");
    assert_eq!(input[3]["call_id"], "call_write_1");
    assert!(input[3]["output"].is_string());

    assert_no_secret(&env, &output, secret);
    let last = last_event(&output);
    assert_eq!(last["kind"], "run_completed");
    assert_eq!(last["usage"]["input_tokens"], 1600);
    // Output excludes reasoning: (150 - 100) + 12.
    assert_eq!(last["usage"]["output_tokens"], 62);
    assert_eq!(last["usage"]["reasoning_tokens"], 100);
}

// ---------------------------------------------------------------------------------------
// The budget stop's report step against a server that enforces the Messages API's rule

/// Like Anthropic's API, answers 400 when `tool_use`/`tool_result` blocks come without
/// `tools` (and when `tool_choice` comes without them); else a tool call first, then text.
async fn strict_messages(
    State(recorded): State<Recorded>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let tools = request["tools"].as_array().is_some_and(|tools| !tools.is_empty());
    let tool_blocks = request["messages"].as_array().unwrap().iter().any(|message| {
        message["content"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|block| matches!(block["type"].as_str(), Some("tool_use" | "tool_result")))
    });
    let n = {
        let mut requests = recorded.requests.lock().unwrap();
        requests.push((headers, request.clone()));
        requests.len()
    };
    if (tool_blocks || request.get("tool_choice").is_some()) && !tools {
        let error = json!({"type": "error", "error": {"type": "invalid_request_error",
            "message": "Requests which include `tool_use` or `tool_result` blocks must define tools."}});
        return (axum::http::StatusCode::BAD_REQUEST, axum::Json(error)).into_response();
    }
    let body = match n {
        1 => anthropic_thinking_then_tool_use(),
        _ => anthropic_text("Report: wrote notes/hello.txt. Next: nothing."),
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_budget_report_step_keeps_tools_defined_with_tools_off() {
    let recorded = Recorded::default();
    let address = serve(
        Router::new().route("/v1/messages", post(strict_messages)).with_state(recorded.clone()),
    )
    .await;
    let env = Env::new();
    let workspace = env.workspace();
    let keel_home = env.home.path().to_owned();
    let base_url = format!("http://{address}");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .env("KEEL_HOME", &keel_home)
            .env_remove("ANTHROPIC_BASE_URL")
            .env("ANTHROPIC_API_KEY", "sk-ant-test-789")
            .stdin(std::process::Stdio::null())
            .args(["run", "-C", workspace.to_str().unwrap(), "-m", "anthropic:claude-sonnet-4-5"])
            .args(["--base-url", &base_url, "--approval", "auto", "--json", "--max-steps", "2"])
            .arg("Write notes/hello.txt with two lines.")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(3), "stderr: {}", stderr(&output));
    let requests = recorded.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "the report step was not refused and not retried");
    let report_step = &requests[1].1;
    assert_eq!(report_step["tool_choice"], json!({"type": "none"}), "tools off");
    assert!(
        report_step["tools"].as_array().unwrap().iter().any(|tool| tool["name"] == "write_file"),
        "the history's tool_use needs its tools defined: {report_step}"
    );
    assert!(requests[0].1.get("tool_choice").is_none(), "tools on: the default choice");

    let events: Vec<Value> =
        stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let checkpoint = events.iter().find(|event| event["kind"] == "checkpoint").unwrap();
    assert_eq!(checkpoint["report"], "Report: wrote notes/hello.txt. Next: nothing.");
    // Each model_response keeps Anthropic's own usage objects beside the normalised ones.
    let responses: Vec<&Value> =
        events.iter().filter(|event| event["kind"] == "model_response").collect();
    assert_eq!(responses.len(), 2);
    assert_eq!(responses[0]["raw_usage"]["message_start"]["cache_read_input_tokens"], 100);
    assert_eq!(responses[0]["raw_usage"]["message_delta"]["output_tokens"], 120);
    assert_eq!(responses[0]["usage"]["input_tokens"], 1000);
}
