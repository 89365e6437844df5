//! The Messages assembler on event sequences: text blocks and their separators, reused
//! block indexes, spliced streams, thinking and redacted blocks, cut-off tool uses,
//! refusals and usage.

use std::sync::Mutex;

use keel_contracts::{FinishReason, ModelResponse, ReasoningPart, Usage};
use serde_json::json;

use super::finish::usage_from_wire;
use super::*;

fn run(events: &[Value]) -> (Result<ModelResponse, ModelError>, Vec<StreamDelta>) {
    let seen = Mutex::new(Vec::new());
    let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
    let mut assembler = Assembler::new(&on_delta, None);
    let mut result = None;
    for event in events {
        match assembler.apply_event("message", &event.to_string()) {
            Ok(Flow::Continue) => {}
            Ok(Flow::Done) => break,
            Err(error) => {
                result = Some(Err(error));
                break;
            }
        }
    }
    let result = result.unwrap_or_else(|| Ok(assembler.finish()));
    (result, seen.into_inner().unwrap())
}

/// The visible text the deltas showed, in order.
fn live_text(deltas: &[StreamDelta]) -> String {
    deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect()
}

fn start(index: u64, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn delta(index: u64, delta: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": delta})
}

fn stop(index: u64) -> Value {
    json!({"type": "content_block_stop", "index": index})
}

#[test]
fn two_text_blocks_around_a_call_are_separated() {
    let (result, deltas) = run(&[
        start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "Looking."})),
        stop(0),
        start(1, json!({"type": "tool_use", "id": "t1", "name": "read", "input": {}})),
        delta(1, json!({"type": "input_json_delta", "partial_json": "{\"p\":1}"})),
        stop(1),
        start(2, json!({"type": "text", "text": ""})),
        delta(2, json!({"type": "text_delta", "text": "Done."})),
        stop(2),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        json!({"type": "message_stop"}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.text, "Looking.\n\nDone.");
    assert_eq!(live_text(&deltas), response.text);
    assert_eq!(response.tool_calls[0].arguments, json!({"p": 1}));
}

#[test]
fn a_reused_block_index_keeps_both_tool_uses() {
    let (result, _) = run(&[
        start(0, json!({"type": "tool_use", "id": "toolu_a", "name": "read", "input": {}})),
        delta(0, json!({"type": "input_json_delta", "partial_json": "{\"p\":1}"})),
        stop(0),
        start(0, json!({"type": "tool_use", "id": "toolu_b", "name": "list", "input": {}})),
        delta(0, json!({"type": "input_json_delta", "partial_json": "{\"p\":2}"})),
        stop(0),
        json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        json!({"type": "message_stop"}),
    ]);
    let calls = result.unwrap().tool_calls;
    let ids: Vec<&str> = calls.iter().map(|call| call.call_id.as_str()).collect();
    assert_eq!(ids, ["toolu_a", "toolu_b"]);
    assert_eq!(calls[0].arguments, json!({"p": 1}));
    assert_eq!(calls[1].arguments, json!({"p": 2}));
}

#[test]
fn whole_input_in_the_start_block_is_kept() {
    let (result, _) = run(&[
        start(0, json!({"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}})),
        stop(0),
        json!({"type": "message_stop"}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.tool_calls[0].arguments, json!({"a": 1}));
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
}

#[test]
fn unsigned_or_empty_thinking_is_not_kept() {
    let (result, deltas) = run(&[
        start(0, json!({"type": "thinking", "thinking": "", "signature": ""})),
        delta(0, json!({"type": "thinking_delta", "thinking": "hm"})),
        stop(0),
        start(1, json!({"type": "thinking", "thinking": "", "signature": ""})),
        delta(1, json!({"type": "signature_delta", "signature": "sig"})),
        stop(1),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        json!({"type": "message_stop"}),
    ]);
    assert_eq!(result.unwrap().reasoning, Vec::new());
    assert_eq!(deltas, vec![StreamDelta::Reasoning("hm".into())]);
}

#[test]
fn cut_off_call_is_never_valid_even_when_its_json_parses() {
    let (result, _) = run(&[
        start(0, json!({"type": "tool_use", "id": "t1", "name": "f", "input": {}})),
        delta(0, json!({"type": "input_json_delta", "partial_json": "{}"})),
        json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}),
        json!({"type": "message_stop"}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert_eq!(response.tool_calls[0].arguments, json!("{}"));
    assert!(response.tool_calls[0].arguments_error.as_deref().unwrap().contains("cut off"));
}

#[test]
fn non_streaming_message_body_is_assembled() {
    let (result, _) = run(&[json!({
        "type": "message", "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "plan", "signature": "sig"},
            {"type": "text", "text": "Hi."},
            {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
        ],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 7}
    })]);
    let response = result.unwrap();
    assert_eq!(response.text, "Hi.");
    assert_eq!(
        response.reasoning,
        vec![ReasoningPart { text: "plan".into(), signature: Some("sig".into()), redacted: None }]
    );
    assert_eq!(response.tool_calls[0].arguments, json!({"x": 1}));
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: Some(15),
            output_tokens: Some(7),
            cached_input_tokens: Some(5),
            reasoning_tokens: None
        }
    );
}

#[test]
fn usage_counts_cache_reads_and_writes_as_input() {
    let usage = WireUsage {
        input_tokens: Some(10),
        cache_creation_input_tokens: Some(100),
        cache_read_input_tokens: Some(1000),
        output_tokens: Some(5),
    };
    assert_eq!(
        usage_from_wire(&usage),
        Usage {
            input_tokens: Some(1110),
            output_tokens: Some(5),
            cached_input_tokens: Some(1000),
            reasoning_tokens: None
        }
    );
    assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
}

#[test]
fn error_event_is_an_error_and_other_stop_reasons_are_kept() {
    let (result, _) =
        run(&[json!({"type": "error", "error": {"type": "api_error", "message": "Internal"}})]);
    assert_eq!(result.unwrap_err().kind, ModelErrorKind::Server);
    let (result, _) = run(&[
        json!({"type": "message_delta", "delta": {"stop_reason": "pause_turn"}}),
        json!({"type": "message_stop"}),
    ]);
    assert_eq!(result.unwrap().finish_reason, FinishReason::Other("pause_turn".into()));
    let (result, _) = run(&[
        json!({"type": "message_delta", "delta": {"stop_reason": "model_context_window_exceeded"}}),
        json!({"type": "message_stop"}),
    ]);
    assert_eq!(result.unwrap().finish_reason, FinishReason::Length);
}

#[test]
fn adjacent_text_blocks_are_joined_as_sent() {
    let (result, deltas) = run(&[
        start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "Opened in 2003."})),
        stop(0),
        start(1, json!({"type": "text", "text": ""})),
        delta(1, json!({"type": "text_delta", "text": " It is big."})),
        stop(1),
        start(2, json!({"type": "thinking", "thinking": ""})),
        delta(2, json!({"type": "thinking_delta", "thinking": "more"})),
        delta(2, json!({"type": "signature_delta", "signature": "sig"})),
        stop(2),
        start(3, json!({"type": "text", "text": ""})),
        delta(3, json!({"type": "text_delta", "text": "After."})),
        stop(3),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
        json!({"type": "message_stop"}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.text, "Opened in 2003. It is big.\n\nAfter.");
    assert_eq!(live_text(&deltas), response.text);
}

#[test]
fn a_message_start_for_another_message_is_a_spliced_stream() {
    let start_of = |id: &str| {
        json!({"type": "message_start", "message": {"id": id,
            "usage": {"input_tokens": 3, "output_tokens": 1}}})
    };
    let (result, _) = run(&[
        start_of("msg_a"),
        start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "Hel"})),
        start_of("msg_b"),
        json!({"type": "message_stop"}),
    ]);
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Stream);
    assert!(error.is_retryable());
    assert!(error.message.contains("spliced"), "{}", error.message);
    // The same message announced twice is harmless.
    let (result, _) = run(&[
        start_of("msg_a"),
        start_of("msg_a"),
        start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "Hi."})),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
            "usage": {"output_tokens": 2}}),
        json!({"type": "message_stop"}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.text, "Hi.");
    assert_eq!(
        response.raw_usage,
        Some(json!({"message_start": {"input_tokens": 3, "output_tokens": 1},
            "message_delta": {"output_tokens": 2}}))
    );
}
