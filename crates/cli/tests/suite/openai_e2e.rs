//! `keel run -m openai:… --base-url http://127.0.0.1:PORT/v1` against a local server that
//! streams Chat Completions SSE the way OpenAI does: tool-call arguments split across many
//! deltas, usage in a final chunk with empty `choices`, then `data: [DONE]`.

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

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-test",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    });
    format!("data: {body}\n\n")
}

fn usage_chunk(prompt: u64, completion: u64) -> String {
    let body = json!({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-test",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion},
    });
    format!("data: {body}\n\n")
}

/// A streamed tool call whose JSON arguments arrive `piece` bytes at a time.
fn tool_call_stream(id: &str, name: &str, arguments: &Value, piece: usize) -> String {
    let mut out = chunk(
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": ""}}
        ]}),
        None,
    );
    let text = arguments.to_string();
    let chars: Vec<char> = text.chars().collect();
    for fragment in chars.chunks(piece) {
        let fragment: String = fragment.iter().collect();
        out.push_str(&chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
            None,
        ));
    }
    out.push_str(&chunk(json!({}), Some("tool_calls")));
    out.push_str(&usage_chunk(100, 20));
    out.push_str("data: [DONE]\n\n");
    out
}

fn text_stream(text: &str) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
    for word in text.split_inclusive(' ') {
        out.push_str(&chunk(json!({"content": word}), None));
    }
    out.push_str(&chunk(json!({}), Some("stop")));
    out.push_str(&usage_chunk(150, 8));
    out.push_str("data: [DONE]\n\n");
    out
}

async fn completions(
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
        1 => tool_call_stream(
            "call_write",
            "write_file",
            &json!({"path": "notes/hello.txt", "content": "hello from keel\nsecond line\n"}),
            3,
        ),
        2 => tool_call_stream(
            "call_edit",
            "edit_file",
            &json!({"path": "notes/hello.txt", "old": "second line", "new": "edited line"}),
            2,
        ),
        _ => text_stream("Wrote and edited notes/hello.txt as asked."),
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_compatible_server_drives_a_real_run() {
    let recorded = Recorded::default();
    let app =
        Router::new().route("/v1/chat/completions", post(completions)).with_state(recorded.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let env = Env::new();
    let workspace = env.workspace();
    let base_url = format!("http://{address}/v1");
    let keel_home = env.home.path().to_owned();
    let ws = workspace.clone();
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .env("KEEL_HOME", &keel_home)
            .env("OPENAI_API_KEY", "sk-test-secret-123")
            .stdin(std::process::Stdio::null())
            .args(["run", "-C", ws.to_str().unwrap(), "-m", "openai:gpt-test"])
            .args(["--base-url", &base_url, "--approval", "auto", "--json"])
            .arg("Write notes/hello.txt, then change its second line.")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));

    // The files changed as the model asked.
    let written = std::fs::read_to_string(workspace.join("notes/hello.txt")).unwrap();
    assert_eq!(written, "hello from keel\nedited line\n");

    // The requests the server received are well-formed and paired.
    let requests = recorded.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    for (headers, request) in &requests {
        assert_eq!(headers[header::AUTHORIZATION], "Bearer sk-test-secret-123");
        assert_eq!(request["model"], "gpt-test");
        assert_eq!(request["stream"], true);
        let tools: Vec<&str> = request["tools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["function"]["name"].as_str().unwrap())
            .collect();
        assert!(tools.contains(&"write_file") && tools.contains(&"bash"), "{tools:?}");
        let messages = request["messages"].as_array().unwrap();
        assert_eq!(messages[0]["role"], "system");
        // Every tool message answers a call of the previous assistant message.
        let mut open: Vec<String> = Vec::new();
        for message in messages {
            match message["role"].as_str().unwrap() {
                "assistant" => {
                    assert!(open.is_empty(), "unanswered calls before a new assistant message");
                    open = message["tool_calls"]
                        .as_array()
                        .map(|calls| {
                            calls.iter().map(|c| c["id"].as_str().unwrap().to_owned()).collect()
                        })
                        .unwrap_or_default();
                }
                "tool" => {
                    let id = message["tool_call_id"].as_str().unwrap();
                    assert_eq!(
                        open.first().map(String::as_str),
                        Some(id),
                        "tool message answers no open call"
                    );
                    open.remove(0);
                }
                _ => assert!(open.is_empty(), "calls left unanswered"),
            }
        }
        assert!(open.is_empty());
    }
    let last = requests[2].1["messages"].as_array().unwrap();
    let assistant_args = &last[2]["tool_calls"][0]["function"]["arguments"];
    let parsed: Value = serde_json::from_str(assistant_args.as_str().unwrap()).unwrap();
    assert_eq!(parsed["path"], "notes/hello.txt", "arguments reassembled from the deltas");

    // The secret never reaches the ledger.
    let all = stdout(&output);
    assert!(!all.contains("sk-test-secret"), "API key leaked into the event stream");
    for entry in std::fs::read_dir(env.home.path()).unwrap() {
        let bytes = std::fs::read(entry.unwrap().path()).unwrap_or_default();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("sk-test-secret"),
            "API key in KEEL_HOME"
        );
    }
    let usage = all.lines().last().map(|l| serde_json::from_str::<Value>(l).unwrap()).unwrap();
    assert_eq!(usage["kind"], "run_completed");
    assert_eq!(usage["usage"]["input_tokens"], 350);
    assert_eq!(usage["usage"]["output_tokens"], 48);
}
