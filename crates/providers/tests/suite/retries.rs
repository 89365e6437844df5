//! Synthetic traffic (no real recording exists for these; see the shared cases README,
//! "Gaps"): rate limits with `Retry-After`, overload, context too long, bad credentials,
//! and streams that break part-way.
//!
//! These run on real time with short delays. Paused tokio time cannot drive them: with
//! real sockets, a paused current-thread runtime auto-advances the clock whenever it
//! parks while loopback I/O is in flight, so request and idle timeouts fire spuriously.
//! The backoff arithmetic itself is tested on paused time in `retry.rs`, against an
//! attempt function without I/O.

use std::time::Duration;

use keel_contracts::{ModelErrorKind, StreamDelta};
use keel_providers::{OpenAiChat, OpenAiConfig};
use serde_json::json;
use tokio::time::Instant;

use super::harness::{
    MockServer, Reply, TEST_KEY, complete, measurable_retry, simple_request, text_stream,
};

/// A client whose backoff is long enough to measure: 100 ms, doubling, at most 800 ms;
/// `Retry-After` capped at 3 s.
fn slow_client(server: &MockServer, adjust: impl FnOnce(&mut OpenAiConfig)) -> OpenAiChat {
    let mut config = server.config();
    config.retry = measurable_retry();
    adjust(&mut config);
    OpenAiChat::new(config).unwrap()
}

fn rate_limited() -> Reply {
    Reply::json(
        429,
        &json!({"error": {"message": "Rate limit reached for requests", "type": "requests",
            "param": null, "code": "rate_limit_exceeded"}}),
    )
}

fn overloaded_529() -> Reply {
    Reply::json(
        529,
        &json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
    )
}

fn success() -> Reply {
    Reply::sse(text_stream("The whole answer."))
}

#[tokio::test]
async fn synthetic_429_with_retry_after_seconds_waits_then_succeeds() {
    let server =
        MockServer::start(vec![rate_limited().header("retry-after", "1"), success()]).await;
    let start = Instant::now();
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let waited = start.elapsed();
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);
    // Retry-After (1 s), not the 100 ms backoff; the upper bound only guards a loaded CI.
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_429_with_retry_after_http_date_is_measured_against_the_date_header() {
    let limited = rate_limited()
        .header("date", "Sun, 06 Nov 1994 08:49:37 GMT")
        .header("retry-after", "Sun, 06 Nov 1994 08:49:38 GMT");
    let server = MockServer::start(vec![limited, success()]).await;
    let start = Instant::now();
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let waited = start.elapsed();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(server.n_requests(), 2);
    assert!(waited >= Duration::from_secs(1) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_retry_after_longer_than_the_cap_is_cut_to_the_cap() {
    let server =
        MockServer::start(vec![rate_limited().header("retry-after", "3600"), success()]).await;
    let client = slow_client(&server, |config| {
        config.retry.max_retry_after = Duration::from_millis(300);
    });
    let start = Instant::now();
    let (result, _) = complete(&client, &simple_request()).await;
    let waited = start.elapsed();
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(server.n_requests(), 2);
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_429_exhausting_retries_reports_rate_limited_with_its_delay() {
    let server = MockServer::start(vec![rate_limited().header("retry-after-ms", "20")]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(
        error.kind,
        ModelErrorKind::RateLimited { retry_after: Some(Duration::from_millis(20)) }
    );
    assert_eq!(error.status, Some(429));
    assert!(error.message.contains("Rate limit reached"), "{}", error.message);
    assert_eq!(server.n_requests(), 4);
}

#[tokio::test]
async fn synthetic_529_and_503_overloaded_are_retried_with_backoff() {
    let unavailable =
        Reply::sse("Service Unavailable").status(503).header("content-type", "text/plain");
    let server = MockServer::start(vec![overloaded_529(), unavailable, success()]).await;
    let start = Instant::now();
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let waited = start.elapsed();
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 3);
    // 100 ms then 200 ms of backoff, each reduced by at most half by jitter.
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");
}

#[tokio::test]
async fn synthetic_overloaded_gives_up_after_max_retries() {
    let server = MockServer::start(vec![overloaded_529()]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::Overloaded, Some(529)));
    assert_eq!(error.message, "Overloaded");
    assert_eq!(server.n_requests(), 4);
}

#[tokio::test]
async fn synthetic_context_too_long_is_not_retried() {
    let too_long = Reply::json(
        400,
        &json!({"error": {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens.",
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
    );
    let server = MockServer::start(vec![too_long, success()]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::ContextTooLong, Some(400)));
    assert!(!error.is_retryable());
    // One request and the success never asked for: given up at once, with no backoff.
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_context_too_long_is_recognised_by_message_alone() {
    // The shape llama.cpp-style servers send: no code, only words.
    let too_long = Reply::json(
        400,
        &json!({"error": {"message": "the request exceeds the available context window size", "type": "invalid_request_error"}}),
    );
    let server = MockServer::start(vec![too_long]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    assert_eq!(result.unwrap_err().kind, ModelErrorKind::ContextTooLong);
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_401_is_not_retried_and_the_key_is_redacted() {
    let unauthorized = Reply::json(
        401,
        &json!({"error": {"message": format!("Incorrect API key provided: {TEST_KEY}."),
            "type": "invalid_request_error", "param": null, "code": "invalid_api_key"}}),
    );
    let server = MockServer::start(vec![unauthorized, success()]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::Auth, Some(401)));
    assert!(!error.message.contains(TEST_KEY), "{}", error.message);
    assert!(!format!("{error:?}").contains(TEST_KEY));
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_truncated_stream_is_retried_whole_and_the_partial_discarded() {
    // Text deltas, then the body ends: no finish reason, no [DONE].
    let partial = text_stream("Partial answ that never ends.");
    let cut = partial.find("that").unwrap();
    let truncated = Reply::sse(&partial.as_bytes()[..partial[..cut].rfind("data:").unwrap()]);
    let server = MockServer::start(vec![truncated, success()]).await;
    let (result, deltas) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    let response = result.unwrap();
    assert_eq!(response.text, "The whole answer.");
    assert_eq!(response.usage.input_tokens, Some(5));
    assert_eq!(server.n_requests(), 2);
    // The first attempt was shown live, then superseded.
    assert_eq!(deltas[0], StreamDelta::Text("Partial ".into()));
}

#[tokio::test]
async fn synthetic_truncated_stream_that_never_completes_is_a_stream_error() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n";
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let client = slow_client(&server, |config| config.retry.max_retries = 1);
    let (result, _) = complete(&client, &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Stream);
    assert!(error.message.contains("truncated"), "{}", error.message);
    assert_eq!(server.n_requests(), 2);
}

#[tokio::test]
async fn synthetic_connection_aborted_mid_stream_is_retried() {
    let aborted = Reply::sse(text_stream("Never finished here.")).abort_after(60);
    let server = MockServer::start(vec![aborted, success()]).await;
    let (result, _) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);
}

#[tokio::test]
async fn synthetic_stalled_stream_times_out_and_is_retried() {
    let stalled = Reply::sse(text_stream("Stuck forever.")).stall_after(40);
    let server = MockServer::start(vec![stalled, success()]).await;
    let client = slow_client(&server, |config| {
        config.stream_idle_timeout = Duration::from_millis(300);
    });
    let start = Instant::now();
    let (result, _) = complete(&client, &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 2);
    assert!(start.elapsed() >= Duration::from_millis(300));
}

#[tokio::test]
async fn synthetic_stream_with_finish_reason_but_no_done_is_complete() {
    let body = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi.\"},\"finish_reason\":\"stop\"}]}\n\n";
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&server.client(), &simple_request()).await;
    assert_eq!(result.unwrap().text, "Hi.");
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_done_line_needs_its_terminator_but_not_the_blank_line() {
    let body =
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi.\"}}]}\r\n\r\ndata: [DONE]";
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&server.client(), &simple_request()).await;
    // Without even a line terminator the `[DONE]` line is incomplete: truncated.
    assert_eq!(result.unwrap_err().kind, ModelErrorKind::Stream);
    // With its line terminator but no blank line after it, the event still counts.
    let body = format!("{body}\n");
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&server.client(), &simple_request()).await;
    assert_eq!(result.unwrap().text, "Hi.");
}

#[tokio::test]
async fn synthetic_non_stream_body_with_an_error_object_is_an_error() {
    let body = json!({"error": {"message": "Upstream failed", "code": 502}});
    let server = MockServer::start(vec![Reply::json(200, &body)]).await;
    let client = slow_client(&server, |config| config.retry.max_retries = 0);
    let (result, _) = complete(&client, &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!((error.kind.clone(), error.status), (ModelErrorKind::Server, Some(502)));
}

/// Each retry is reported through `on_delta` before its wait, with the attempt about to be
/// made, the failed attempt's status and kind, and the wait chosen (`Retry-After` honoured);
/// text a failed stream showed comes before its retry notice, so a consumer can discard it.
#[tokio::test]
async fn synthetic_retries_are_reported_with_status_kind_and_wait() {
    let broken = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Partial \"}}]}\n\n\
                  data: {\"error\":{\"message\":\"upstream blew up\",\"code\":500}}\n\n";
    let server = MockServer::start(vec![
        rate_limited().header("retry-after", "1"),
        Reply::sse(broken),
        success(),
    ])
    .await;
    let (result, deltas) = complete(&slow_client(&server, |_| {}), &simple_request()).await;
    assert_eq!(result.unwrap().text, "The whole answer.");
    assert_eq!(server.n_requests(), 3);
    let notices: Vec<_> = deltas
        .iter()
        .enumerate()
        .filter_map(|(idx, delta)| match delta {
            StreamDelta::Retrying(notice) => Some((idx, notice.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(notices.len(), 2, "{deltas:?}");
    let (first_idx, first) = &notices[0];
    assert_eq!(*first_idx, 0, "nothing streamed before a 429: {deltas:?}");
    assert_eq!(
        (first.attempt, first.status, first.error.as_str(), first.wait),
        (2, Some(429), "rate_limited", Duration::from_secs(1))
    );
    assert!(first.message.contains("Rate limit reached"), "{}", first.message);
    let (second_idx, second) = &notices[1];
    // The broken stream's text came first, then its retry notice.
    assert_eq!(deltas[1], StreamDelta::Text("Partial ".into()));
    assert_eq!(*second_idx, 2, "{deltas:?}");
    assert_eq!((second.attempt, second.status, second.error.as_str()), (3, Some(500), "server"));
    assert!(second.message.contains("upstream blew up"), "{}", second.message);
    // The second backoff: 200 ms with equal jitter.
    assert!(
        second.wait >= Duration::from_millis(100) && second.wait <= Duration::from_millis(200),
        "{:?}",
        second.wait
    );
    // After the last notice, only the successful attempt's text.
    let after: String = deltas[second_idx + 1..]
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(after, "The whole answer.");
}
