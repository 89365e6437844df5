//! Synthetic Anthropic failures (no real recording exists for these; see the shared cases
//! README, "Gaps"): 429 with `retry-after`, 529 `overloaded_error`, an `overloaded_error`
//! event inside a 200 stream, "prompt is too long", and streams that break part-way. The
//! bodies follow Anthropic's "Errors" page (<https://docs.anthropic.com/en/api/errors>).
//!
//! Like `retries.rs`, these run on real time with short delays.

use std::time::Duration;

use keel_contracts::ModelErrorKind;
use keel_providers::AnthropicMessages;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::harness::{MockServer, Reply, TEST_KEY, complete, measurable_retry, simple_request};

fn error_body(error_type: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type, "message": message},
        "request_id": "req_synthetic"})
}

fn event(payload: &Value) -> String {
    format!("event: {}\ndata: {payload}\n\n", payload["type"].as_str().unwrap())
}

fn message_start() -> String {
    event(&json!({"type": "message_start", "message": {"id": "msg_s", "type": "message",
        "role": "assistant", "content": [], "usage": {"input_tokens": 12, "output_tokens": 1}}}))
}

/// A complete stream that says "The whole answer.".
fn success() -> Reply {
    let mut body = message_start();
    for payload in [
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "ping"}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The whole "}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "answer."}}),
        json!({"type": "content_block_stop", "index": 0}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        json!({"type": "message_stop"}),
    ] {
        body.push_str(&event(&payload));
    }
    Reply::sse(body)
}

/// A client whose backoff is long enough to measure: 100 ms, doubling, at most 800 ms;
/// `retry-after` capped at 3 s.
fn slow_client(server: &MockServer) -> AnthropicMessages {
    let mut config = server.anthropic_config();
    config.retry = measurable_retry();
    AnthropicMessages::new(config).unwrap()
}

#[tokio::test]
async fn synthetic_anthropic_429_with_retry_after_waits_then_succeeds() {
    let limited = Reply::json(
        429,
        &error_body("rate_limit_error", "Number of request tokens has exceeded your rate limit"),
    )
    .header("retry-after", "1");
    let server = MockServer::start(vec![limited, success()]).await;
    let start = Instant::now();
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let waited = start.elapsed();
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_anthropic_429_exhausting_retries_reports_rate_limited() {
    let limited =
        Reply::json(429, &error_body("rate_limit_error", "slow down")).header("retry-after", "0");
    let server = MockServer::start(vec![limited]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::RateLimited { retry_after: Some(Duration::ZERO) });
    assert_eq!(error.status, Some(429));
    assert_eq!(server.n_requests(), 4);
}

#[tokio::test]
async fn synthetic_anthropic_529_overloaded_is_retried_with_backoff() {
    let overloaded = Reply::json(529, &error_body("overloaded_error", "Overloaded"));
    let server = MockServer::start(vec![overloaded.clone(), overloaded, success()]).await;
    let start = Instant::now();
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let waited = start.elapsed();
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 3);
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_anthropic_overloaded_error_inside_a_200_stream_is_retried() {
    // The stream starts, shows some text, then carries `event: error` (Anthropic's
    // "Streaming Messages", "Error events").
    let mut body = message_start();
    body.push_str(&event(&json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}})));
    body.push_str(&event(&json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "Partial"}})));
    body.push_str(&event(&error_body("overloaded_error", "Overloaded")));
    let server = MockServer::start(vec![Reply::sse(body.clone()), success()]).await;
    let (result, deltas) = complete(&slow_client(&server), &simple_request()).await;
    let response = result.unwrap();
    assert_eq!(response.text, "The whole answer.", "the partial answer is discarded");
    assert_eq!(server.n_requests(), 2);
    assert_eq!(deltas[0], keel_contracts::StreamDelta::Text("Partial".into()));

    // Every attempt overloaded: the error says so and is retryable.
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Overloaded);
    assert!(error.is_retryable());
    assert_eq!(error.message, "Overloaded");
    assert_eq!(server.n_requests(), 4);
}

#[tokio::test]
async fn synthetic_anthropic_prompt_too_long_is_context_too_long_and_not_retried() {
    let too_long = Reply::json(
        400,
        &error_body("invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
    );
    let server = MockServer::start(vec![too_long, success()]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::ContextTooLong, Some(400)));
    assert!(!error.is_retryable());
    assert!(error.message.contains("prompt is too long"), "{}", error.message);
    // One request and the success never asked for: given up at once, with no backoff.
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_anthropic_401_is_auth_not_retried_and_the_key_is_redacted() {
    let unauthorized = Reply::json(
        401,
        &error_body("authentication_error", &format!("invalid x-api-key {TEST_KEY}")),
    );
    let server = MockServer::start(vec![unauthorized, success()]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::Auth, Some(401)));
    assert!(!error.message.contains(TEST_KEY), "{}", error.message);
    assert!(!format!("{error:?}").contains(TEST_KEY));
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_anthropic_stream_without_stop_is_truncated_and_retried() {
    // message_start and some text, then the body ends: no stop reason, no message_stop.
    let mut body = message_start();
    body.push_str(&event(&json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}})));
    body.push_str(&event(&json!({"type": "content_block_delta", "index": 0,
        "delta": {"type": "text_delta", "text": "Hel"}})));
    let server = MockServer::start(vec![Reply::sse(body.clone()), success()]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);

    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Stream);
    assert!(error.message.contains("truncated"), "{}", error.message);
}

#[tokio::test]
async fn synthetic_anthropic_connection_aborted_mid_stream_is_retried() {
    let server = MockServer::start(vec![success().abort_after(200), success()]).await;
    let (result, _) = complete(&slow_client(&server), &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);
}

/// Each retry reaches `on_delta` before its wait: a 429 with `retry-after` (status 429, the
/// server's wait), then an `api_error` event inside a 200 stream that already showed text
/// (no HTTP status; kind `server`; backoff), then the answer.
#[tokio::test]
async fn synthetic_anthropic_retries_are_reported_with_status_kind_and_wait() {
    use keel_contracts::StreamDelta;
    let limited = Reply::json(429, &error_body("rate_limit_error", "Number of requests exceeded"))
        .header("retry-after", "1");
    let mut broken = message_start();
    for payload in [
        json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "The who"}}),
        json!({"type": "error", "error": {"type": "api_error", "message": "Internal server error"}}),
    ] {
        broken.push_str(&event(&payload));
    }
    let server = MockServer::start(vec![limited, Reply::sse(broken), success()]).await;
    let (result, deltas) = complete(&slow_client(&server), &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 3);
    let notices: Vec<_> = deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Retrying(notice) => Some(notice),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 2, "{deltas:?}");
    assert_eq!(
        (notices[0].attempt, notices[0].status, notices[0].error.as_str(), notices[0].wait),
        (2, Some(429), "rate_limited", Duration::from_secs(1))
    );
    assert_eq!((notices[1].attempt, notices[1].error.as_str()), (3, "server"));
    assert!(notices[1].message.contains("Internal server error"), "{}", notices[1].message);
    assert!(
        notices[1].wait >= Duration::from_millis(100)
            && notices[1].wait <= Duration::from_millis(200),
        "{:?}",
        notices[1].wait
    );
    // The broken attempt's text came before its notice.
    let second =
        deltas.iter().position(|d| matches!(d, StreamDelta::Retrying(n) if n.attempt == 3));
    assert!(deltas[..second.unwrap()].contains(&StreamDelta::Text("The who".into())));
}
