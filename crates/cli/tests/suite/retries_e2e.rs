//! Retries are facts (issue 12, item 9), end to end: the real `keel` binary against a local
//! OpenAI-compatible server that fails before it answers. Each retry is a `model_retry`
//! event in `--json`, a line of its own on the terminal, and a line in `keel log`; the
//! answer is shown once, however many attempts streamed part of it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

use super::support::{Env, stderr, stdout};

const ANSWER: &str = "The answer is 42.";
const SUMMARY: &str = "Summary: listed the folder and read a.txt.";

/// One planned reply of the server, in order of the conversation requests.
#[derive(Debug, Clone)]
enum Reply {
    /// HTTP 503 with `Retry-After: 1`.
    Unavailable,
    /// Streams `text`, then an error event with code 500 (the stream fails part-way).
    BrokenAfter(&'static str),
    /// A streamed tool call.
    Call(&'static str, Value),
    /// A streamed text answer.
    Text(&'static str),
}

#[derive(Clone)]
struct Server {
    replies: Arc<Mutex<Vec<Reply>>>,
    /// Whether streams end with a usage chunk.
    usage: bool,
    conversation_requests: Arc<Mutex<usize>>,
    summary_requests: Arc<Mutex<usize>>,
}

impl Server {
    fn new(replies: Vec<Reply>, usage: bool) -> Server {
        Server {
            replies: Arc::new(Mutex::new(replies)),
            usage,
            conversation_requests: Arc::default(),
            summary_requests: Arc::default(),
        }
    }
}

fn chunk(delta: Value, finish: Option<&str>) -> String {
    let body = json!({"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1,
        "model": "gpt-4o", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {body}\n\n")
}

fn tail(finish: &str, usage: bool) -> String {
    let mut out = chunk(json!({}), Some(finish));
    if usage {
        let body = json!({"id": "chatcmpl-r", "object": "chat.completion.chunk", "created": 1,
            "model": "gpt-4o", "choices": [],
            "usage": {"prompt_tokens": 200, "completion_tokens": 10, "total_tokens": 210}});
        out.push_str(&format!("data: {body}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out
}

fn text_stream(text: &str, usage: bool) -> String {
    let mut out = chunk(json!({"role": "assistant", "content": ""}), None);
    for word in text.split_inclusive(' ') {
        out.push_str(&chunk(json!({"content": word}), None));
    }
    out.push_str(&tail("stop", usage));
    out
}

fn sse(body: String) -> Response {
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

async fn completions(State(server): State<Server>, body: axum::body::Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let is_summary = request["messages"][0]["content"]
        .as_str()
        .is_some_and(|system| system.starts_with("You are summarising"));
    if is_summary {
        *server.summary_requests.lock().unwrap() += 1;
        return sse(text_stream(SUMMARY, server.usage));
    }
    *server.conversation_requests.lock().unwrap() += 1;
    let reply = {
        let mut replies = server.replies.lock().unwrap();
        if replies.is_empty() { Reply::Text("out of replies") } else { replies.remove(0) }
    };
    match reply {
        Reply::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1"), (header::CONTENT_TYPE, "text/plain")],
            "Service Unavailable",
        )
            .into_response(),
        Reply::BrokenAfter(text) => {
            let mut out = chunk(json!({"role": "assistant", "content": text}), None);
            out.push_str("data: {\"error\":{\"message\":\"upstream reset\",\"code\":500}}\n\n");
            sse(out)
        }
        Reply::Call(name, arguments) => {
            let mut out = chunk(
                json!({"role": "assistant", "content": null, "tool_calls": [
                    {"index": 0, "id": format!("call_{name}"), "type": "function",
                     "function": {"name": name, "arguments": arguments.to_string()}}]}),
                None,
            );
            out.push_str(&tail("tool_calls", server.usage));
            sse(out)
        }
        Reply::Text(text) => sse(text_stream(text, server.usage)),
    }
}

async fn serve(server: Server) -> SocketAddr {
    let app = Router::new().route("/v1/chat/completions", post(completions)).with_state(server);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    address
}

async fn keel(env: &Env, args: Vec<String>) -> std::process::Output {
    let mut command = env.keel();
    command.env("OPENAI_API_KEY", "sk-retry-test").args(args);
    tokio::task::spawn_blocking(move || command.output().unwrap()).await.unwrap()
}

fn run_args(env: &Env, address: SocketAddr, extra: &[&str]) -> Vec<String> {
    let workspace = env.workspace();
    std::fs::write(workspace.join("a.txt"), "alpha\n").unwrap();
    let mut args: Vec<String> = ["run", "-C", workspace.to_str().unwrap(), "-m", "openai:gpt-4o"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.extend(["--base-url".into(), format!("http://{address}/v1")]);
    args.extend(["--approval".into(), "auto".into()]);
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args.push("What is the answer?".into());
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_a_503_retry_is_in_json_and_on_the_terminal_once_with_the_answer_once() {
    // --json: the retry is an event, before the response it led to.
    let server = Server::new(vec![Reply::Unavailable, Reply::Text(ANSWER)], true);
    let address = serve(server.clone()).await;
    let env = Env::new();
    let output = keel(&env, run_args(&env, address, &["--json"])).await;
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(*server.conversation_requests.lock().unwrap(), 2);
    let events: Vec<Value> =
        stdout(&output).lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    let retry_at = kinds.iter().position(|k| *k == "model_retry").expect("a model_retry event");
    assert_eq!(kinds.iter().filter(|k| **k == "model_retry").count(), 1, "{kinds:?}");
    assert_eq!(kinds[retry_at - 1], "model_requested");
    assert_eq!(kinds[retry_at + 1], "model_response");
    let retry = &events[retry_at];
    assert_eq!(retry["step"], 1);
    assert_eq!(retry["attempt"], 2);
    assert_eq!(retry["status"], 503);
    assert_eq!(retry["error"], "overloaded");
    assert_eq!(retry["wait_ms"], 1000, "Retry-After is honoured");
    assert_eq!(events.last().unwrap()["answer"], ANSWER);

    // The terminal: a broken stream showed part of the answer before it failed; the retry
    // lines appear once each and the answer once.
    let server = Server::new(
        vec![Reply::Unavailable, Reply::BrokenAfter("The answer "), Reply::Text(ANSWER)],
        true,
    );
    let address = serve(server.clone()).await;
    let env = Env::new();
    let output = keel(&env, run_args(&env, address, &[])).await;
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    assert_eq!(*server.conversation_requests.lock().unwrap(), 3);
    let (out, err) = (stdout(&output), stderr(&output));
    assert_eq!(out.trim_end(), ANSWER);
    assert_eq!(err.matches("↻ retry 2 after 503, waiting 1s").count(), 1, "{err}");
    assert_eq!(err.matches("↻ retry 3 after 500, waiting ").count(), 1, "{err}");
    assert_eq!(err.matches("↻").count(), 2, "{err}");
    assert_eq!(
        format!("{out}{err}").matches("The answer").count(),
        1,
        "stdout {out}\nstderr {err}"
    );
}

/// The `keel log` lines of the session that matter here: retry lines as they are, the
/// others with their figures (which depend on keel's tokenizer and timing) replaced by `N`.
fn relevant(log: &str) -> String {
    let mut lines = Vec::new();
    for line in log.lines() {
        let line = line.trim();
        if line.contains('↻') {
            lines.push(line.to_owned());
        } else if line.contains("compaction summary")
            || line.contains("context compacted")
            || line.contains("estimated")
        {
            let chars: Vec<char> = line.chars().collect();
            let mut normalised = String::new();
            let mut idx = 0;
            while idx < chars.len() {
                if chars[idx].is_ascii_digit() {
                    normalised.push('N');
                    while idx < chars.len()
                        && (chars[idx].is_ascii_digit()
                            || (matches!(chars[idx], ',' | '.')
                                && chars.get(idx + 1).is_some_and(char::is_ascii_digit)))
                    {
                        idx += 1;
                    }
                } else {
                    normalised.push(chars[idx]);
                    idx += 1;
                }
            }
            lines.push(normalised);
        }
    }
    lines.join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn issue_12_keel_log_shows_summaries_retries_and_estimated_usage_distinctly() {
    // No usage is ever reported: every figure is keel's estimate.
    let server = Server::new(
        vec![
            Reply::Unavailable,
            Reply::Call("list_dir", json!({"path": "."})),
            Reply::Call("read_file", json!({"path": "a.txt"})),
            Reply::Text(ANSWER),
        ],
        false,
    );
    let address = serve(server.clone()).await;
    let env = Env::new();
    let output = keel(&env, run_args(&env, address, &["--json"])).await;
    assert_eq!(output.status.code(), Some(0), "stderr: {}", stderr(&output));
    let first: Value = serde_json::from_str(stdout(&output).lines().next().unwrap()).unwrap();
    let session = first["session_id"].as_str().unwrap().to_owned();

    let compact = keel(
        &env,
        vec![
            "compact".into(),
            session.clone(),
            "--base-url".into(),
            format!("http://{address}/v1"),
        ],
    )
    .await;
    assert_eq!(compact.status.code(), Some(0), "stderr: {}", stderr(&compact));
    assert!(*server.summary_requests.lock().unwrap() >= 1);

    let log = keel(&env, vec!["log".into(), session.clone()]).await;
    assert_eq!(log.status.code(), Some(0), "stderr: {}", stderr(&log));
    let text = format!("{}{}", stdout(&log), stderr(&log));
    expect_test::expect![[r#"
        ↻ retry 2 after 503, waiting 1s
        ✓ completed · ~N in / ~N out tokens (N estimated) · N model calls · $N · Ns
        compaction summary written (N chars · ~N in / ~N out tokens (N estimated) · N model call)
        context compacted: ~N → ~N tokens"#]]
    .assert_eq(&relevant(&text));

    // The verbose trace names each distinctly too.
    let verbose = keel(&env, vec!["log".into(), session, "-v".into()]).await;
    let verbose = format!("{}{}", stdout(&verbose), stderr(&verbose));
    assert!(verbose.contains("step 1: retry, attempt 2 after HTTP 503, overloaded: "), "{verbose}");
    assert!(verbose.contains("waiting 1000 ms"), "{verbose}");
}
