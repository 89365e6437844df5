//! Recorded provider traffic (`tests/fixtures/provider/*.json`, copied verbatim from the
//! shared cases) replayed over HTTP; each parse must equal the recording's `expected`.

use keel_contracts::{FinishReason, ModelErrorKind, StreamDelta};

use super::harness::{TEST_KEY, replay, replay_with};

#[tokio::test]
async fn recording_01_text_with_usage_in_the_last_chunk() {
    let replay = replay("01-openai-stream-text-usage-in-last-chunk").await;
    let response = replay.check_ok();
    // The usage chunk has `choices: []`; its details are kept too.
    assert_eq!(response.usage.cached_input_tokens, Some(0));
    assert_eq!(response.usage.reasoning_tokens, Some(0));
    let n_text_deltas =
        replay.deltas.iter().filter(|delta| matches!(delta, StreamDelta::Text(_))).count();
    assert!(n_text_deltas > 5, "text should stream in pieces, got {n_text_deltas}");
}

#[tokio::test]
async fn recording_02_single_tool_call_in_fragments() {
    let replay = replay("02-openai-stream-single-tool-call").await;
    replay.check_ok();
    assert_eq!(replay.deltas, vec![StreamDelta::ToolCallStarted { name: "get_capital".into() }]);
}

#[tokio::test]
async fn recording_03_parallel_tool_calls() {
    let replay = replay("03-openai-stream-parallel-tool-calls").await;
    let response = replay.check_ok();
    assert_ne!(response.tool_calls[0].call_id, response.tool_calls[1].call_id);
}

#[tokio::test]
async fn recording_04_tool_arguments_in_59_fragments() {
    let replay = replay("04-openai-stream-tool-args-59-deltas").await;
    let response = replay.check_ok();
    assert_eq!(response.tool_calls[0].arguments["answers"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn recording_05_non_stream_tool_call_with_empty_id_gets_a_minted_id() {
    let replay = replay("05-gemini-compat-tool-call-empty-id").await;
    let response = replay.check_ok();
    // Gemini bills thinking inside total_tokens without itemising it: 35 + 12 < 109, so
    // the 62 tokens between are reasoning (usage rule 3, `keel_providers` usage.rs), and
    // the provider's own object is kept beside the normalised one.
    assert_eq!(response.usage.reasoning_tokens, Some(62));
    assert_eq!(response.usage.output_tokens, Some(12));
    assert_eq!(response.usage.cached_input_tokens, None);
    let raw = response.raw_usage.as_ref().expect("raw usage kept");
    assert_eq!(raw["total_tokens"], 109);
    assert_eq!(raw["completion_tokens"], 12);
    // A second replay mints a different id.
    let again = super::harness::replay("05-gemini-compat-tool-call-empty-id").await;
    assert_ne!(again.check_ok().tool_calls[0].call_id, response.tool_calls[0].call_id);
}

#[tokio::test]
async fn recording_06_empty_ids_on_continuations_keep_the_first_id() {
    replay("06-qwen-stream-tool-call-empty-id-on-continuations").await.check_ok();
}

#[tokio::test]
async fn recording_07_tool_call_without_index() {
    replay("07-mistral-stream-tool-call-without-index").await.check_ok();
}

#[tokio::test]
async fn recording_08_reasoning_then_tool_call_usage_excludes_reasoning() {
    let replay = replay("08-xai-stream-reasoning-then-tool-call-usage-excludes-reasoning").await;
    let response = replay.check_ok();
    assert_eq!(response.reasoning[0].text.chars().count(), 1069);
    assert!(response.reasoning[0].text.starts_with("First"));
    let n_reasoning_deltas =
        replay.deltas.iter().filter(|delta| matches!(delta, StreamDelta::Reasoning(_))).count();
    assert!(n_reasoning_deltas > 200, "{n_reasoning_deltas}");
}

#[tokio::test]
async fn recording_09_comments_length_twice_then_inline_error_is_an_error() {
    let replay = replay("09-openrouter-stream-comments-length-and-inline-error").await;
    // The chunk with `error: {code: 400}` ends the turn as a failure even though a
    // finish reason (length) and usage came before it: never an empty success.
    let error = replay.check_error(ModelErrorKind::InvalidRequest);
    assert_eq!(error.status, Some(400));
    assert!(error.message.contains("Token limit reached"), "{}", error.message);
    assert_eq!(replay.server.n_requests(), 1, "a 400 in the stream is not retried");
    // The comment lines were skipped and the reasoning before the error was streamed.
    assert!(replay.deltas.contains(&StreamDelta::Reasoning("We need".into())));
}

#[tokio::test]
async fn recording_10_error_event_after_reasoning_is_a_retryable_stream_error() {
    let replay = replay("10-groq-stream-error-event-tool-use-failed").await;
    let error = replay.check_error(ModelErrorKind::Stream);
    assert_eq!(error.status, Some(400));
    assert!(error.message.contains("Tool call validation failed"), "{}", error.message);
    assert!(error.message.contains("tool_use_failed"), "{}", error.message);
    // Retryable, so the whole request was sent 1 + max_retries (3) times.
    assert_eq!(replay.server.n_requests(), 4);
}

#[tokio::test]
async fn recording_11_json_401_for_a_stream_request_is_auth_and_not_retried() {
    // The recorded body echoes the key back ("Incorrect API key provided: DEADBEEF").
    let replay = replay_with("11-openai-401-json-body-for-stream-request", |config| {
        config.api_key = Some("DEADBEEF".to_owned());
    })
    .await;
    let error = replay.check_error(ModelErrorKind::Auth);
    assert!(!error.message.contains("DEADBEEF"), "{}", error.message);
    assert!(error.message.contains("Incorrect API key provided"), "{}", error.message);
    assert!(error.message.contains("invalid_api_key"), "{}", error.message);
    assert_eq!(replay.server.n_requests(), 1);
    let received = replay.server.received();
    assert_eq!(received[0].authorization.as_deref(), Some("Bearer DEADBEEF"));
    assert!(!received[0].authorization.as_deref().unwrap().contains(TEST_KEY));
}

#[tokio::test]
async fn recording_12_insufficient_quota_429_is_not_retried() {
    let replay = replay("12-openai-insufficient-quota-error-body").await;
    let error = replay.check_error(ModelErrorKind::QuotaExhausted);
    assert!(error.message.contains("exceeded your current quota"), "{}", error.message);
    assert_eq!(replay.server.n_requests(), 1);
}

#[tokio::test]
async fn recording_13_non_stream_finish_length_with_unterminated_think() {
    let replay = replay("13-together-deepseek-r1-finish-length").await;
    let response = replay.check_ok();
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert!(response.reasoning[0].text.starts_with("\nHmm, the user just said"));
    assert!(response.reasoning[0].text.ends_with("- Acknowledge"));
}

#[tokio::test]
async fn recording_22_tool_call_index_starting_at_1_makes_no_phantom_call() {
    let replay = replay("22-gateway-stream-tool-call-index-starts-at-1").await;
    let response = replay.check_ok();
    assert_eq!(response.tool_calls.len(), 1);
}
