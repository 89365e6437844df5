//! Recorded Anthropic Messages traffic (`tests/fixtures/provider/14..21-*.json`, copied
//! verbatim from the shared cases) replayed over HTTP through `AnthropicMessages`; each
//! parse must equal the recording's `expected`.
//!
//! Where `expected` describes a long text ("(1021 characters, starts \"…\")"), the length
//! and the start are checked. Thinking and signatures are compared byte for byte with the
//! deltas read straight from the recorded body, independently of the client's parser.

use keel_contracts::{FinishReason, ModelErrorKind, ModelResponse, StreamDelta};
use serde_json::Value;

use super::harness::{Replay, live_text, recording, replay_anthropic};

/// The JSON payloads of the `data:` lines of a recorded SSE body, in order.
fn data_payloads(case: &str) -> Vec<Value> {
    let recorded = recording(case);
    recorded["response"]["body"]
        .as_str()
        .unwrap()
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(|data| serde_json::from_str(data.trim()).unwrap())
        .collect()
}

/// The concatenated `delta.<field>` of every `content_block_delta` of `delta_type`.
fn concatenated(payloads: &[Value], delta_type: &str, field: &str) -> String {
    payloads
        .iter()
        .filter(|payload| payload["delta"]["type"] == delta_type)
        .map(|payload| payload["delta"][field].as_str().unwrap())
        .collect()
}

/// Checks a described or literal expected text.
fn check_text(case: &str, actual: &str, expected: &str) {
    match expected.strip_prefix('(').and_then(|rest| rest.split_once(" characters, starts \"")) {
        Some((count, start)) => {
            let start = start.strip_suffix("\")").unwrap();
            assert_eq!(actual.chars().count(), count.parse::<usize>().unwrap(), "{case}: length");
            assert!(actual.starts_with(start), "{case}: text starts {:?}", &actual[..40]);
        }
        None => assert_eq!(actual, expected, "{case}: text"),
    }
}

/// Asserts an Anthropic `ok` recording parsed as its `expected` says.
fn check_ok(replay: &Replay) -> &ModelResponse {
    let case = &replay.case;
    let expected = &replay.expected;
    let response = match &replay.result {
        Ok(response) => response,
        Err(error) => panic!("{case}: expected success, got {error:?}"),
    };
    check_text(case, &response.text, expected["text"].as_str().unwrap());

    let expected_calls = expected["tool_calls"].as_array().unwrap();
    assert_eq!(
        response.tool_calls.len(),
        expected_calls.len(),
        "{case}: {:?}",
        response.tool_calls
    );
    for (call, want) in response.tool_calls.iter().zip(expected_calls) {
        assert_eq!(call.call_id.as_str(), want["id"].as_str().unwrap(), "{case}: call id");
        assert_eq!(call.name, want["name"].as_str().unwrap(), "{case}: call name");
        assert_eq!(call.arguments, want["arguments"], "{case}: arguments");
        assert_eq!(call.arguments_error, None, "{case}: arguments error");
    }

    let finish = FinishReason::from(expected["finish"].as_str().unwrap().to_owned());
    assert_eq!(response.finish_reason, finish, "{case}: finish reason");
    let usage = &expected["usage"];
    assert_eq!(response.usage.input_tokens, usage["input_tokens"].as_u64(), "{case}: input");
    assert_eq!(response.usage.output_tokens, usage["output_tokens"].as_u64(), "{case}: output");
    // Cache reads are reported (0 in every recording); thinking stays inside output.
    assert_eq!(response.usage.cached_input_tokens, Some(0), "{case}: cached");
    assert_eq!(response.usage.reasoning_tokens, None, "{case}: reasoning tokens");

    match (expected.get("thinking"), expected.get("redacted_thinking_blocks")) {
        (Some(thinking), None) => {
            assert_eq!(response.reasoning.len(), 1, "{case}: one thinking block");
            let part = &response.reasoning[0];
            assert_eq!(
                u64::try_from(part.text.chars().count()).unwrap(),
                thinking["characters"].as_u64().unwrap(),
                "{case}: thinking length"
            );
            let signature = part.signature.as_deref().unwrap();
            assert_eq!(
                u64::try_from(signature.len()).unwrap(),
                thinking["signature_characters"].as_u64().unwrap(),
                "{case}: signature length"
            );
            assert_eq!(part.redacted, None);
            // Byte-exact against the recorded deltas (B06).
            let payloads = data_payloads(case);
            assert_eq!(part.text, concatenated(&payloads, "thinking_delta", "thinking"));
            assert_eq!(signature, concatenated(&payloads, "signature_delta", "signature"));
        }
        (None, Some(n_redacted)) => {
            let n_parts = u64::try_from(response.reasoning.len()).unwrap();
            assert_eq!(n_parts, n_redacted.as_u64().unwrap(), "{case}");
        }
        (None, None) => assert!(response.reasoning.is_empty(), "{case}: unexpected reasoning"),
        (Some(_), Some(_)) => unreachable!("no recording has both"),
    }

    let live_text = live_text(&replay.deltas);
    assert_eq!(live_text, response.text, "{case}: live text");
    let live_reasoning: String = replay
        .deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Reasoning(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    let reasoning_text: String = response.reasoning.iter().map(|part| part.text.as_str()).collect();
    assert_eq!(live_reasoning, reasoning_text, "{case}: live reasoning");
    assert_eq!(replay.server.n_requests(), 1, "{case}: a success is not retried");

    let received = &replay.server.received()[0];
    assert_eq!(received.path, "/v1/messages");
    response
}

#[tokio::test]
async fn recording_14_text_with_padded_data_lines_and_ping() {
    let replay = replay_anthropic("14-anthropic-stream-text").await;
    let response = check_ok(&replay);
    assert!(response.tool_calls.is_empty());
}

#[tokio::test]
async fn recording_15_tool_use_json_split_mid_key_keeps_input_tokens_from_message_start() {
    let replay = replay_anthropic("15-anthropic-stream-tool-use-json-split-mid-key").await;
    check_ok(&replay);
    assert!(
        replay.deltas.contains(&StreamDelta::ToolCallStarted { name: "get_weather".into() }),
        "{:?}",
        replay.deltas
    );
}

#[tokio::test]
async fn recording_16_thinking_and_signature_are_kept_together_byte_exact() {
    let replay = replay_anthropic("16-anthropic-stream-thinking-signature-then-text").await;
    let response = check_ok(&replay);
    assert!(response.reasoning[0].text.starts_with("This is a straightforward question"));
}

#[tokio::test]
async fn recording_17_thinking_then_tool_use_with_only_an_empty_input_delta() {
    let replay = replay_anthropic("17-anthropic-stream-thinking-then-tool-use-no-args").await;
    let response = check_ok(&replay);
    assert!(response.reasoning[0].text.starts_with("The user wants me to:"));
    // `output_tokens_details.thinking_tokens` (53) is not split out: 92 stays whole.
    assert_eq!(response.usage.output_tokens, Some(92));
}

#[tokio::test]
async fn recording_18_max_tokens_inside_tool_json_keeps_the_call_unexecutable() {
    let replay = replay_anthropic("18-anthropic-stream-max-tokens-inside-tool-json").await;
    let expected = &replay.expected;
    assert_eq!(expected["outcome"], "truncated");
    let response = replay.result.as_ref().unwrap();
    assert_eq!(response.text, expected["text"].as_str().unwrap());
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert_eq!(response.usage.input_tokens, Some(450));
    assert_eq!(response.usage.output_tokens, Some(124));
    // `tool_calls: []` in the expectation means "nothing to execute": the cut-off call is
    // kept (so the model can be told), but only as malformed.
    let incomplete = &expected["tool_calls_incomplete"][0];
    assert_eq!(response.tool_calls.len(), 1);
    let call = &response.tool_calls[0];
    assert_eq!(call.call_id.as_str(), incomplete["id"].as_str().unwrap());
    assert_eq!(call.name, incomplete["name"].as_str().unwrap());
    assert_eq!(
        call.arguments,
        Value::String(incomplete["partial_arguments"].as_str().unwrap().into())
    );
    let problem = call.arguments_error.as_deref().unwrap();
    assert!(problem.contains("cut off") && problem.contains("not executed"), "{problem}");
    assert_eq!(replay.server.n_requests(), 1, "a truncated answer is not retried as is");
}

#[tokio::test]
async fn recording_19_refusal_without_content_blocks_reports_the_explanation() {
    let replay = replay_anthropic("19-anthropic-stream-refusal-no-content-blocks").await;
    let expected = &replay.expected;
    assert_eq!(expected["outcome"], "refusal");
    let response = replay.result.as_ref().unwrap();
    assert_eq!(response.finish_reason, FinishReason::Refusal);
    assert!(response.tool_calls.is_empty() && response.reasoning.is_empty());
    // The model wrote no text (`expected.text` is ""); keel reports the refusal's
    // `stop_details` as the text so it is never an empty answer.
    let refusal = &expected["refusal"];
    assert!(
        response.text.starts_with(refusal["explanation_starts"].as_str().unwrap()),
        "{}",
        response.text
    );
    assert!(response.text.ends_with("(category: reasoning_extraction)"), "{}", response.text);
    assert_eq!(response.usage.input_tokens, Some(97));
    assert_eq!(response.usage.output_tokens, Some(0));
    assert_eq!(replay.server.n_requests(), 1, "a refusal is not retried");
}

#[tokio::test]
async fn recording_20_tool_result_without_tool_use_is_invalid_request_and_not_retried() {
    let replay = replay_anthropic("20-anthropic-400-tool-result-without-tool-use").await;
    let error = replay.check_error(ModelErrorKind::InvalidRequest);
    assert!(error.message.contains("unexpected `tool_use_id`"), "{}", error.message);
    assert_eq!(replay.server.n_requests(), 1);
}

#[tokio::test]
async fn recording_21_redacted_thinking_blocks_are_kept_opaque_and_in_order() {
    let replay = replay_anthropic("21-anthropic-stream-redacted-thinking").await;
    let response = check_ok(&replay);
    let recorded: Vec<String> = data_payloads("21-anthropic-stream-redacted-thinking")
        .iter()
        .filter(|payload| payload["content_block"]["type"] == "redacted_thinking")
        .map(|payload| payload["content_block"]["data"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(recorded.len(), 2);
    let kept: Vec<&str> =
        response.reasoning.iter().map(|part| part.redacted.as_deref().unwrap()).collect();
    assert_eq!(kept, recorded);
    assert!(response.reasoning.iter().all(|part| part.text.is_empty() && part.signature.is_none()));
    // Redacted thinking is never shown.
    assert!(!replay.deltas.iter().any(|delta| matches!(delta, StreamDelta::Reasoning(_))));
}
