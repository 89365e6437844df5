//! A local HTTP server that replays scripted replies and records what it received, plus
//! loaders for the recorded fixtures and the checks against their `expected` notes.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use keel_contracts::{
    FinishReason, Message, ModelClient, ModelError, ModelErrorKind, ModelRequest, ModelResponse,
    StreamDelta, ToolDefinition,
};
use keel_providers::{
    AnthropicConfig, AnthropicMessages, OpenAiChat, OpenAiConfig, OpenAiResponses, RetryPolicy,
};
use serde_json::{Value, json};

/// The API key every test client sends unless a test sets another.
pub(crate) const TEST_KEY: &str = "sk-test-0123456789";

/// One scripted HTTP reply.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// The body is sent in pieces of this many bytes, to cross every parser boundary.
    chunk_bytes: usize,
    /// When set, the connection is aborted after this many body bytes.
    abort_after_bytes: Option<usize>,
    /// When set, the body stops (without ending) after this many bytes.
    stall_after_bytes: Option<usize>,
}

impl Reply {
    /// A 200 `text/event-stream` reply with this exact body.
    pub(crate) fn sse(body: impl Into<Vec<u8>>) -> Self {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: body.into(),
            chunk_bytes: 7,
            abort_after_bytes: None,
            stall_after_bytes: None,
        }
    }

    /// A 200 stream of `data:` payloads, one per non-empty line, ended by `[DONE]`.
    pub(crate) fn data_lines(lines: &str) -> Self {
        let mut body = String::new();
        for line in lines.lines().filter(|line| !line.trim().is_empty()) {
            body.push_str("data: ");
            body.push_str(line);
            body.push_str("\n\n");
        }
        body.push_str("data: [DONE]\n\n");
        Reply::sse(body)
    }

    /// A JSON reply with this status.
    pub(crate) fn json(status: u16, body: &Value) -> Self {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.to_string().into_bytes(),
            chunk_bytes: 64,
            abort_after_bytes: None,
            stall_after_bytes: None,
        }
    }

    /// The recorded response of a fixture, as its README says to replay it.
    pub(crate) fn recorded(recording: &Value) -> Self {
        let response = &recording["response"];
        let status = u16::try_from(response["status"].as_u64().unwrap()).unwrap();
        let mut reply = match response["body_format"].as_str().unwrap() {
            "sse" => Reply::sse(response["body"].as_str().unwrap()),
            "jsonl" => Reply::data_lines(response["body"].as_str().unwrap()),
            "json" => Reply::json(status, &response["body"]),
            other => panic!("unknown body_format {other}"),
        };
        reply.status = status;
        if let Some(headers) = response["headers"].as_object().filter(|h| !h.is_empty()) {
            reply.headers = headers
                .iter()
                .map(|(name, value)| (name.clone(), value.as_str().unwrap().to_owned()))
                .collect();
        }
        reply
    }

    pub(crate) fn status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sends the body in pieces of `n_bytes` (at least 1).
    pub(crate) fn chunked(mut self, n_bytes: usize) -> Self {
        self.chunk_bytes = n_bytes.max(1);
        self
    }

    pub(crate) fn abort_after(mut self, n_bytes: usize) -> Self {
        self.abort_after_bytes = Some(n_bytes);
        self
    }

    pub(crate) fn stall_after(mut self, n_bytes: usize) -> Self {
        self.stall_after_bytes = Some(n_bytes);
        self
    }

    fn into_response(self) -> Response {
        let mut builder = Response::builder().status(self.status);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let cut = self.abort_after_bytes.or(self.stall_after_bytes).unwrap_or(usize::MAX);
        let body = &self.body[..cut.min(self.body.len())];
        let mut pieces: Vec<Result<Bytes, io::Error>> =
            body.chunks(self.chunk_bytes).map(|piece| Ok(Bytes::copy_from_slice(piece))).collect();
        if self.abort_after_bytes.is_some() {
            pieces.push(Err(io::Error::other("connection aborted by the test server")));
        }
        let pieces = futures::stream::iter(pieces);
        let body = if self.stall_after_bytes.is_some() {
            Body::from_stream(pieces.chain(futures::stream::pending()))
        } else {
            Body::from_stream(pieces)
        };
        builder.body(body).unwrap()
    }
}

/// What the server received for one request.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) body: Value,
    /// The body's bytes as sent.
    pub(crate) raw_body: Bytes,
    pub(crate) authorization: Option<String>,
    pub(crate) accept: Option<String>,
    pub(crate) headers: HeaderMap,
}

impl Received {
    /// A header's value, when sent.
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|value| value.to_str().unwrap())
    }
}

/// A wire API's rules about tools, enforced by a [`MockServer`] as the real API does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolRules {
    /// Anthropic Messages: `tool_use`/`tool_result` blocks need `tools` ("Requests which
    /// include `tool_use` or `tool_result` blocks must define tools."), and `tool_choice`
    /// is one of `auto`, `any`, `tool`, `none` and needs `tools`.
    Messages,
    /// OpenAI Chat Completions: `tool_choice` only beside `tools` (OpenAI's own rule);
    /// assistant `tool_calls` and `tool` messages need `tools` (the stricter rule of
    /// compatible servers that translate to the Messages API).
    Chat,
    /// OpenAI Responses: `tool_choice` only beside `tools`; `function_call` and
    /// `function_call_output` input items need `tools` (as for Chat).
    Responses,
}

impl ToolRules {
    /// The 400 body the API answers `body` with, or `None` when the body keeps the rules.
    fn violation(self, body: &Value) -> Option<Value> {
        let tools = body["tools"].as_array().is_some_and(|tools| !tools.is_empty());
        let choice = body.get("tool_choice").filter(|choice| !choice.is_null());
        let openai_error = |message: &str, param: &str| {
            serde_json::json!({"error": {"message": message, "type": "invalid_request_error",
                "param": param, "code": null}})
        };
        match self {
            ToolRules::Messages => {
                let blocks =
                    body["messages"].as_array().into_iter().flatten().flat_map(|message| {
                        message["content"].as_array().cloned().unwrap_or_default()
                    });
                let mut tool_blocks = blocks.filter(|block| {
                    matches!(block["type"].as_str(), Some("tool_use" | "tool_result"))
                });
                let error = |message: &str| {
                    serde_json::json!({"type": "error", "error":
                        {"type": "invalid_request_error", "message": message}})
                };
                if tool_blocks.next().is_some() && !tools {
                    return Some(error(
                        "Requests which include `tool_use` or `tool_result` blocks must define tools.",
                    ));
                }
                if let Some(choice) = choice {
                    if !tools {
                        return Some(error(
                            "tool_choice may only be specified while providing tools.",
                        ));
                    }
                    if !matches!(choice["type"].as_str(), Some("auto" | "any" | "tool" | "none")) {
                        return Some(error(
                            "tool_choice: Input tag does not match any of the expected tags",
                        ));
                    }
                }
                None
            }
            ToolRules::Chat => {
                if choice.is_some() && !tools {
                    return Some(openai_error(
                        "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                        "tool_choice",
                    ));
                }
                let tool_history = body["messages"].as_array().into_iter().flatten().any(|m| {
                    m["role"] == "tool" || m["tool_calls"].as_array().is_some_and(|c| !c.is_empty())
                });
                (tool_history && !tools).then(|| {
                    openai_error("messages with tool calls or results need 'tools'", "tools")
                })
            }
            ToolRules::Responses => {
                if choice.is_some() && !tools {
                    return Some(openai_error(
                        "Tool choice 'none' is only allowed when 'tools' are specified.",
                        "tool_choice",
                    ));
                }
                let tool_history = body["input"].as_array().into_iter().flatten().any(|item| {
                    matches!(item["type"].as_str(), Some("function_call" | "function_call_output"))
                });
                (tool_history && !tools)
                    .then(|| openai_error("function call items need 'tools'", "tools"))
            }
        }
    }
}

#[derive(Debug)]
struct ServerState {
    replies: Vec<Reply>,
    received: Mutex<Vec<Received>>,
    rules: Option<ToolRules>,
}

/// A server on 127.0.0.1 that answers the n-th POST, whatever its path, with the n-th
/// reply (the last reply repeats).
#[derive(Debug)]
pub(crate) struct MockServer {
    /// `http://127.0.0.1:PORT/v1`, the OpenAI-style base URL.
    pub(crate) base_url: String,
    /// `http://127.0.0.1:PORT`, the Anthropic-style base URL.
    pub(crate) root_url: String,
    state: Arc<ServerState>,
}

impl MockServer {
    pub(crate) async fn start(replies: Vec<Reply>) -> MockServer {
        MockServer::start_with(replies, None).await
    }

    /// A server that answers 400, as the real API does, to a request breaking `rules`.
    pub(crate) async fn enforcing(rules: ToolRules, replies: Vec<Reply>) -> MockServer {
        MockServer::start_with(replies, Some(rules)).await
    }

    async fn start_with(replies: Vec<Reply>, rules: Option<ToolRules>) -> MockServer {
        assert!(!replies.is_empty());
        let state = Arc::new(ServerState { replies, received: Mutex::new(Vec::new()), rules });
        let router = Router::new().fallback(handle).with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
        MockServer {
            base_url: format!("http://{address}/v1"),
            root_url: format!("http://{address}"),
            state,
        }
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    pub(crate) fn n_requests(&self) -> usize {
        self.state.received.lock().unwrap().len()
    }

    /// A config for this server: test key, three retries with millisecond backoff.
    pub(crate) fn config(&self) -> OpenAiConfig {
        let mut config = OpenAiConfig::new(&self.base_url, "test-model");
        config.api_key = Some(TEST_KEY.to_owned());
        config.retry = RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(1),
            max_backoff: Duration::from_millis(10),
            max_retry_after: Duration::from_secs(60),
        };
        config
    }

    pub(crate) fn client(&self) -> OpenAiChat {
        OpenAiChat::new(self.config()).unwrap()
    }

    /// A Responses API client with [`MockServer::config`].
    pub(crate) fn responses_client(&self) -> OpenAiResponses {
        OpenAiResponses::new(self.config()).unwrap()
    }

    /// An Anthropic config for this server: test key, three retries with millisecond
    /// backoff.
    pub(crate) fn anthropic_config(&self) -> AnthropicConfig {
        let mut config = AnthropicConfig::new(&self.root_url, "claude-test");
        config.api_key = Some(TEST_KEY.to_owned());
        config.retry = self.config().retry;
        config
    }

    pub(crate) fn anthropic_client(&self) -> AnthropicMessages {
        AnthropicMessages::new(self.anthropic_config()).unwrap()
    }
}

async fn handle(
    State(state): State<Arc<ServerState>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return Response::builder()
            .status(StatusCode::METHOD_NOT_ALLOWED)
            .body(Body::empty())
            .unwrap();
    }
    let header = |name: &str| headers.get(name).map(|value| value.to_str().unwrap().to_owned());
    let n_request = {
        let mut received = state.received.lock().unwrap();
        received.push(Received {
            path: uri.path().to_owned(),
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            raw_body: body.clone(),
            authorization: header("authorization"),
            accept: header("accept"),
            headers: headers.clone(),
        });
        received.len() - 1
    };
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    if let Some(violation) = state.rules.and_then(|rules| rules.violation(&parsed)) {
        return Reply::json(400, &violation).into_response();
    }
    let reply = &state.replies[n_request.min(state.replies.len() - 1)];
    reply.clone().into_response()
}

pub(crate) fn fixture_path(relative: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(relative)
}

/// A recorded interaction, `tests/fixtures/provider/{case}.json`.
pub(crate) fn recording(case: &str) -> Value {
    let text = std::fs::read_to_string(fixture_path(&format!("provider/{case}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A complete stream that says `text` in a few deltas, then `stop`, usage and `[DONE]`.
pub(crate) fn text_stream(text: &str) -> String {
    let mut body = String::new();
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    for word in words {
        let chunk = serde_json::json!({"choices": [{"index": 0, "delta": {"content": word}}]});
        body.push_str(&format!("data: {chunk}\n\n"));
    }
    body.push_str(
        "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    );
    body.push_str("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,\"total_tokens\":8}}\n\n");
    body.push_str("data: [DONE]\n\n");
    body
}

/// A short complete Messages API stream that says `text`, with `event:` names.
pub(crate) fn anthropic_text_stream(text: &str) -> String {
    let events = [
        json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
            "content": [], "usage": {"input_tokens": 5, "output_tokens": 1}}}),
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_stop"}),
    ];
    events
        .iter()
        .map(|event| format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap()))
        .collect()
}

/// The text the deltas showed live, in order.
pub(crate) fn live_text(deltas: &[StreamDelta]) -> String {
    deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

/// A backoff long enough to measure: 100 ms, doubling, at most 800 ms; `Retry-After`
/// capped at 3 s; three retries.
pub(crate) fn measurable_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        initial_backoff: Duration::from_millis(100),
        max_backoff: Duration::from_millis(800),
        max_retry_after: Duration::from_secs(3),
    }
}

/// A request built through serde, so that fields the tests do not name keep their
/// defaults; `responses_in_session` counts the assistant messages.
pub(crate) fn model_request(
    model: impl Into<String>,
    system: impl Into<String>,
    messages: Vec<Message>,
    tools: Vec<ToolDefinition>,
) -> ModelRequest {
    let responses_in_session =
        messages.iter().filter(|message| matches!(message, Message::Assistant { .. })).count();
    serde_json::from_value(serde_json::json!({
        "model": model.into(),
        "system": system.into(),
        "messages": messages,
        "tools": tools,
        "responses_in_session": responses_in_session,
    }))
    .unwrap()
}

/// A small request for replays whose request body does not matter.
pub(crate) fn simple_request() -> ModelRequest {
    model_request(
        "test-model",
        "You are a test.",
        vec![Message::User { text: "hello".to_owned() }],
        Vec::new(),
    )
}

/// Runs one request against `client`, collecting the live deltas.
pub(crate) async fn complete(
    client: &dyn ModelClient,
    request: &ModelRequest,
) -> (Result<ModelResponse, ModelError>, Vec<StreamDelta>) {
    let deltas = Mutex::new(Vec::new());
    let on_delta = |delta: StreamDelta| deltas.lock().unwrap().push(delta);
    let result = client.complete(request, &on_delta).await;
    (result, deltas.into_inner().unwrap())
}

/// The outcome of replaying one recording.
#[derive(Debug)]
pub(crate) struct Replay {
    pub(crate) case: String,
    pub(crate) expected: Value,
    pub(crate) result: Result<ModelResponse, ModelError>,
    pub(crate) deltas: Vec<StreamDelta>,
    pub(crate) server: MockServer,
}

/// Replays `case` through a fresh server with the default test client.
pub(crate) async fn replay(case: &str) -> Replay {
    replay_with(case, |_| {}).await
}

/// Replays `case`, letting the test adjust the client's config first.
pub(crate) async fn replay_with(case: &str, adjust: impl FnOnce(&mut OpenAiConfig)) -> Replay {
    replay_through(case, |server| {
        let mut config = server.config();
        adjust(&mut config);
        Box::new(OpenAiChat::new(config).unwrap())
    })
    .await
}

/// Replays an Anthropic `case` through [`AnthropicMessages`] with the default test config.
pub(crate) async fn replay_anthropic(case: &str) -> Replay {
    replay_through(case, |server| Box::new(server.anthropic_client())).await
}

/// Replays `case` through a fresh server and the client `build` makes for it.
pub(crate) async fn replay_through(
    case: &str,
    build: impl FnOnce(&MockServer) -> Box<dyn ModelClient>,
) -> Replay {
    let recorded = recording(case);
    let server = MockServer::start(vec![Reply::recorded(&recorded)]).await;
    let client = build(&server);
    let (result, deltas) = complete(client.as_ref(), &simple_request()).await;
    Replay { case: case.to_owned(), expected: recorded["expected"].clone(), result, deltas, server }
}

impl Replay {
    /// Asserts an `ok` recording parsed exactly as its `expected` says, and returns the
    /// response for further checks.
    pub(crate) fn check_ok(&self) -> &ModelResponse {
        let expected = &self.expected;
        let case = &self.case;
        assert_eq!(expected["outcome"], "ok", "{case}: not an ok recording");
        let response = match &self.result {
            Ok(response) => response,
            Err(error) => panic!("{case}: expected success, got {error:?}"),
        };
        assert_eq!(response.text, expected["text"].as_str().unwrap(), "{case}: text");

        let expected_calls = expected["tool_calls"].as_array().unwrap();
        assert_eq!(
            response.tool_calls.len(),
            expected_calls.len(),
            "{case}: {:?}",
            response.tool_calls
        );
        for (call, want) in response.tool_calls.iter().zip(expected_calls) {
            let want_id = want["id"].as_str().unwrap();
            if want_id.is_empty() {
                // The provider sent an empty id: ours must be minted, unique and non-empty.
                assert!(call.call_id.as_str().starts_with("call_"), "{case}: {:?}", call.call_id);
                assert!(call.call_id.as_str().len() > "call_".len());
            } else {
                assert_eq!(call.call_id.as_str(), want_id, "{case}: call id");
            }
            assert_eq!(call.name, want["name"].as_str().unwrap(), "{case}: call name");
            assert_eq!(call.arguments, want["arguments"], "{case}: arguments");
            assert_eq!(call.arguments_error, None, "{case}: arguments error");
        }

        let finish = FinishReason::from(expected["finish"].as_str().unwrap().to_owned());
        assert_eq!(response.finish_reason, finish, "{case}: finish reason");

        let usage = &expected["usage"];
        if usage.is_null() {
            assert_eq!(response.usage, Default::default(), "{case}: usage must be unreported");
        } else {
            assert_eq!(
                response.usage.input_tokens,
                usage["input_tokens"].as_u64(),
                "{case}: input"
            );
            assert_eq!(
                response.usage.output_tokens,
                usage["output_tokens"].as_u64(),
                "{case}: output"
            );
            if let Some(reasoning) = usage.get("reasoning_tokens") {
                assert_eq!(
                    response.usage.reasoning_tokens,
                    reasoning.as_u64(),
                    "{case}: reasoning"
                );
            }
            if let Some(cached) = usage.get("cached_input_tokens") {
                assert_eq!(response.usage.cached_input_tokens, cached.as_u64(), "{case}: cached");
            }
        }

        match expected.get("reasoning") {
            Some(_) => {
                assert_eq!(response.reasoning.len(), 1, "{case}: reasoning part");
                assert!(!response.reasoning[0].text.is_empty(), "{case}: reasoning text");
            }
            None => assert!(response.reasoning.is_empty(), "{case}: unexpected reasoning"),
        }

        // What was streamed live adds up to what was returned.
        let live_text = live_text(&self.deltas);
        assert_eq!(live_text, response.text, "{case}: live text");
        let live_calls = self
            .deltas
            .iter()
            .filter(|delta| matches!(delta, StreamDelta::ToolCallStarted { .. }))
            .count();
        assert_eq!(live_calls, response.tool_calls.len(), "{case}: live tool calls");
        assert_eq!(self.server.n_requests(), 1, "{case}: a success is not retried");
        response
    }

    /// Asserts an `error` recording failed with `kind` and the retryability and status its
    /// `expected` says, and returns the error for further checks.
    pub(crate) fn check_error(&self, kind: ModelErrorKind) -> &ModelError {
        let expected = &self.expected;
        let case = &self.case;
        assert_eq!(expected["outcome"], "error", "{case}: not an error recording");
        let error = match &self.result {
            Ok(response) => panic!("{case}: expected an error, got {response:?}"),
            Err(error) => error,
        };
        assert_eq!(error.kind, kind, "{case}: kind ({error:?})");
        assert_eq!(
            error.is_retryable(),
            expected["error"]["retryable"].as_bool().unwrap(),
            "{case}: retryable"
        );
        if let Some(status) = expected["error"]["http_status"].as_u64() {
            assert_eq!(error.status.map(u64::from), Some(status), "{case}: status");
        }
        assert!(!error.message.contains(TEST_KEY), "{case}: key leaked");
        error
    }
}
