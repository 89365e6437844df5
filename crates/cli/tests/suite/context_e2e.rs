//! A long session in a small window, end to end: 300 steps whose tool outputs range from
//! 1 byte to 5 MB, through `keel run -m openai:gpt-4o --context-window 8000` against a local
//! Chat Completions server that checks every request it receives.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::post;
use serde_json::{Value, json};

use super::support::{Env, stderr};

const TASK: &str = "Run the commands I ask for, one per step. Constraint: never delete a file. \
Constraint: keep every answer under ten words.";
const STEPS: usize = 300;

const WINDOW: u64 = 8000;

/// Output size of step `n`: mostly small, a 1 MB output every 20 steps, 5 MB every 50.
fn size(n: usize) -> usize {
    if n % 50 == 7 {
        5_000_000
    } else if n % 20 == 3 {
        1_000_000
    } else {
        [1, 40, 700, 6_000, 30_000][n % 5]
    }
}

#[derive(Default)]
struct Seen {
    conversation: usize,
    summaries: usize,
    max_tokens: u64,
    violations: Vec<String>,
    last_messages: Option<Value>,
}

/// The request's size as keel budgets it: system, messages with a per-message overhead,
/// tool definitions.
fn request_tokens(request: &Value, bpe: &tiktoken_rs::CoreBPE) -> u64 {
    let count = |text: &str| bpe.count_ordinary(text) as u64;
    let mut total = 0;
    for message in request["messages"].as_array().unwrap() {
        total += 4;
        if let Some(content) = message["content"].as_str() {
            total += count(content);
        }
        if let Some(id) = message["tool_call_id"].as_str() {
            total += count(id);
        }
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            total += 4
                + count(call["function"]["name"].as_str().unwrap())
                + count(call["function"]["arguments"].as_str().unwrap());
        }
    }
    if let Some(tools) = request["tools"].as_array() {
        let definitions: Vec<Value> = tools
            .iter()
            .map(|t| json!({"name": t["function"]["name"], "description": t["function"]["description"], "parameters": t["function"]["parameters"]}))
            .collect();
        total += count(&serde_json::to_string(&definitions).unwrap());
    }
    total
}

fn pairing_problem(messages: &[Value]) -> Option<String> {
    let mut open: Vec<String> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        match message["role"].as_str().unwrap() {
            "assistant" => {
                if !open.is_empty() {
                    return Some(format!("message {index}: unanswered calls {open:?}"));
                }
                open = message["tool_calls"]
                    .as_array()
                    .map(|calls| {
                        calls.iter().map(|c| c["id"].as_str().unwrap().to_owned()).collect()
                    })
                    .unwrap_or_default();
            }
            "tool" => {
                let id = message["tool_call_id"].as_str().unwrap();
                if open.first().map(String::as_str) != Some(id) {
                    return Some(format!("message {index}: orphan result {id}"));
                }
                open.remove(0);
            }
            _ => {
                if !open.is_empty() {
                    return Some(format!("message {index}: unanswered calls {open:?}"));
                }
            }
        }
    }
    (!open.is_empty()).then(|| format!("unanswered calls at the end: {open:?}"))
}

fn sse(chunks: &[Value]) -> String {
    let mut body = String::new();
    for chunk in chunks {
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    body
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o",
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

fn usage(prompt: u64) -> Value {
    json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o", "choices": [],
           "usage": {"prompt_tokens": prompt, "completion_tokens": 20, "total_tokens": prompt + 20}})
}

fn o200k() -> &'static tiktoken_rs::CoreBPE {
    static BPE: std::sync::OnceLock<tiktoken_rs::CoreBPE> = std::sync::OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::o200k_base().unwrap())
}

async fn completions(
    State(seen): State<Arc<Mutex<Seen>>>,
    body: axum::body::Bytes,
) -> impl IntoResponse {
    let request: Value = serde_json::from_slice(&body).unwrap();
    let prompt = request_tokens(&request, o200k());
    let is_summary = request["messages"][0]["content"]
        .as_str()
        .is_some_and(|system| system.starts_with("You are summarising"));
    let mut seen = seen.lock().unwrap();
    let body = if is_summary {
        seen.summaries += 1;
        sse(&[
            chunk(
                json!({"role": "assistant", "content": "Summary: ran the requested output commands; all succeeded."}),
                None,
            ),
            chunk(json!({}), Some("stop")),
            usage(prompt),
        ])
    } else {
        seen.conversation += 1;
        let n = seen.conversation;
        seen.max_tokens = seen.max_tokens.max(prompt);
        if prompt > WINDOW - WINDOW / 4 {
            seen.violations.push(format!("request {n}: {prompt} tokens over the budget"));
        }
        let messages = request["messages"].as_array().unwrap();
        if let Some(problem) = pairing_problem(messages) {
            seen.violations.push(format!("request {n}: {problem}"));
        }
        seen.last_messages = Some(request["messages"].clone());
        if n > STEPS {
            sse(&[
                chunk(json!({"role": "assistant", "content": "Done."}), None),
                chunk(json!({}), Some("stop")),
                usage(prompt),
            ])
        } else {
            let command = format!("head -c {} /dev/zero | tr '\\\\0' x; echo", size(n));
            let arguments = json!({"command": command}).to_string();
            sse(&[
                chunk(
                    json!({"role": "assistant", "content": null, "tool_calls": [
                        {"index": 0, "id": format!("call_{n}"), "type": "function", "function": {"name": "bash", "arguments": arguments}}
                    ]}),
                    None,
                ),
                chunk(json!({}), Some("tool_calls")),
                usage(prompt),
            ])
        }
    };
    ([(header::CONTENT_TYPE, "text/event-stream")], body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_steps_with_megabyte_outputs_fit_an_8000_token_window() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let app =
        Router::new().route("/v1/chat/completions", post(completions)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let env = Env::new();
    let workspace = env.workspace();
    let keel_home = env.home.path().to_owned();
    let base_url = format!("http://{address}/v1");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .env("KEEL_HOME", &keel_home)
            .env_remove("OPENAI_API_KEY")
            .stdin(std::process::Stdio::null())
            .args([
                "run",
                "-C",
                workspace.to_str().unwrap(),
                "-m",
                "openai:gpt-4o",
                "--base-url",
                &base_url,
            ])
            .args([
                "--context-window",
                &WINDOW.to_string(),
                "--approval",
                "auto",
                "--sandbox",
                "bypass",
            ])
            .arg(TASK)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(0), "stderr tail: {}", tail(&stderr(&output)));

    let seen = seen.lock().unwrap();
    assert_eq!(seen.conversation, STEPS + 1);
    assert!(seen.violations.is_empty(), "{:#?}", seen.violations);
    assert!(seen.summaries >= 1, "no compaction happened");
    let last = serde_json::to_string(seen.last_messages.as_ref().unwrap()).unwrap();
    assert!(last.contains("Run the commands I ask for, one per step."), "the task was lost");
    assert!(last.contains("Constraint: never delete a file."));
    assert!(last.contains("Constraint: keep every answer under ten words."));
    eprintln!("largest request: {} tokens; {} summary requests", seen.max_tokens, seen.summaries);
}

fn tail(text: &str) -> String {
    text.lines().rev().take(20).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n")
}
