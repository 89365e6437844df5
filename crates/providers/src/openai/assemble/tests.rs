//! The Chat Completions assembler: tool-call fragment routing (B01, B02), usage mapping,
//! `<think>` splitting at any chunking, live deltas, refusals and malformed chunks.

use std::sync::Mutex;

use keel_contracts::ToolCall;
use serde_json::json;

use super::*;

fn fragment(index: Option<u64>, id: Option<&str>, name: Option<&str>, args: &str) -> ToolCallDelta {
    serde_json::from_value(json!({
        "index": index,
        "id": id,
        "function": {"name": name, "arguments": args},
    }))
    .unwrap()
}

fn summary(calls: &[ToolCall]) -> Vec<(String, String, Value)> {
    calls
        .iter()
        .map(|call| (call.call_id.0.clone(), call.name.clone(), call.arguments.clone()))
        .collect()
}

#[test]
fn new_id_and_name_at_a_used_index_starts_a_new_call() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("a"), Some("read"), "{\"p\":1}"));
    calls.apply(&fragment(Some(0), Some("b"), Some("read"), "{\"p\":2}"));
    assert_eq!(
        summary(&calls.finish()),
        vec![
            ("a".into(), "read".into(), json!({"p": 1})),
            ("b".into(), "read".into(), json!({"p": 2}))
        ]
    );
}

#[test]
fn new_ids_without_names_continue_the_call_at_their_index() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("first"), Some("shell"), ""));
    calls.apply(&fragment(Some(0), Some("frag-1"), Some(""), "{\"a\""));
    calls.apply(&fragment(Some(0), Some("frag-2"), None, ":1}"));
    assert_eq!(summary(&calls.finish()), vec![("first".into(), "shell".into(), json!({"a": 1}))]);
}

#[test]
fn interleaved_indexes_route_by_index_not_by_last_seen() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("A"), Some("read"), ""));
    calls.apply(&fragment(Some(1), Some("B"), Some("list"), ""));
    calls.apply(&fragment(Some(0), None, None, "{\"x\":0}"));
    calls.apply(&fragment(Some(1), None, None, "{\"x\":1}"));
    assert_eq!(
        summary(&calls.finish()),
        vec![
            ("A".into(), "read".into(), json!({"x": 0})),
            ("B".into(), "list".into(), json!({"x": 1}))
        ]
    );
}

#[test]
fn fragments_without_index_or_id_continue_the_current_call() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(None, Some("m1"), Some("weather"), "{\"city\""));
    calls.apply(&fragment(None, None, None, ":\"Paris\"}"));
    calls.apply(&fragment(None, Some("m2"), Some("time"), ""));
    calls.apply(&fragment(None, Some(""), None, "{}"));
    assert_eq!(
        summary(&calls.finish()),
        vec![
            ("m1".into(), "weather".into(), json!({"city": "Paris"})),
            ("m2".into(), "time".into(), json!({}))
        ]
    );
}

#[test]
fn a_known_id_at_another_index_with_a_name_is_another_call() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("call_0"), Some("read_file"), "{\"path\":\"a\"}"));
    calls.apply(&fragment(Some(1), Some("call_0"), Some("list_dir"), "{\"path\":\"b\"}"));
    assert_eq!(
        summary(&calls.finish()),
        vec![
            ("call_0".into(), "read_file".into(), json!({"path": "a"})),
            ("call_0".into(), "list_dir".into(), json!({"path": "b"}))
        ]
    );
}

#[test]
fn repeated_known_id_continues_its_call() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("x"), Some("f"), "{\"a\":"));
    calls.apply(&fragment(Some(0), Some("x"), Some("f"), "1}"));
    assert_eq!(summary(&calls.finish()), vec![("x".into(), "f".into(), json!({"a": 1}))]);
}

#[test]
fn missing_id_is_minted_and_name_may_come_later() {
    let mut calls = ToolCallAssembler::default();
    assert_eq!(calls.apply(&fragment(Some(3), Some(""), None, "")), None);
    assert_eq!(calls.apply(&fragment(Some(3), None, Some("late"), "")), Some("late".to_owned()));
    let finished = calls.finish();
    assert_eq!(finished.len(), 1);
    assert!(finished[0].call_id.0.starts_with("call_"));
    assert!(finished[0].call_id.0.len() > "call_".len());
    assert_eq!(finished[0].name, "late");
    assert_eq!(finished[0].arguments, json!({}));
    assert_eq!(finished[0].arguments_error, None);
}

#[test]
fn unparseable_arguments_are_kept_raw_with_an_error() {
    let mut calls = ToolCallAssembler::default();
    calls.apply(&fragment(Some(0), Some("c"), Some("make_file"), "{\"path\": \"a.txt\", \"con"));
    let finished = calls.finish();
    assert_eq!(finished[0].arguments, json!("{\"path\": \"a.txt\", \"con"));
    assert!(
        finished[0].arguments_error.as_deref().unwrap().starts_with("arguments are not valid JSON")
    );
}

#[test]
fn usage_keeps_completion_when_it_excludes_reasoning() {
    // xAI (case 08): 307 + 26 + 227 = 560.
    let usage: WireUsage = serde_json::from_value(json!({
        "prompt_tokens": 307, "completion_tokens": 26, "total_tokens": 560,
        "prompt_tokens_details": {"cached_tokens": 306},
        "completion_tokens_details": {"reasoning_tokens": 227}
    }))
    .unwrap();
    assert_eq!(
        usage_from_wire(&usage),
        Usage {
            input_tokens: Some(307),
            output_tokens: Some(26),
            cached_input_tokens: Some(306),
            reasoning_tokens: Some(227)
        }
    );
    // OpenRouter (case 09): reasoning 11 exceeds completion 10.
    let usage: WireUsage = serde_json::from_value(json!({
        "prompt_tokens": 43, "completion_tokens": 10, "total_tokens": 53,
        "completion_tokens_details": {"reasoning_tokens": 11}
    }))
    .unwrap();
    // The total says reasoning is inside the completion, whatever the details say.
    assert_eq!(usage_from_wire(&usage).output_tokens, Some(0));
    assert_eq!(usage_from_wire(&usage).reasoning_tokens, Some(10));
}

#[test]
fn usage_subtracts_reasoning_when_completion_includes_it() {
    // OpenAI o-series: total = prompt + completion, completion includes reasoning.
    let usage: WireUsage = serde_json::from_value(json!({
        "prompt_tokens": 100, "completion_tokens": 500, "total_tokens": 600,
        "completion_tokens_details": {"reasoning_tokens": 400}
    }))
    .unwrap();
    assert_eq!(usage_from_wire(&usage).output_tokens, Some(100));
    assert_eq!(usage_from_wire(&usage).reasoning_tokens, Some(400));
}

#[test]
fn usage_without_numbers_is_not_reported() {
    assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
}

fn split_all(chunks: &[&str]) -> Vec<Piece> {
    let mut splitter = ThinkSplitter::default();
    let mut out = Vec::new();
    for chunk in chunks {
        splitter.push(chunk, &mut out);
    }
    splitter.finish(&mut out);
    // Merge neighbours of the same kind so the result does not depend on chunking.
    let mut merged: Vec<Piece> = Vec::new();
    for piece in out {
        match (merged.last_mut(), piece) {
            (Some(Piece::Text(last)), Piece::Text(text)) => last.push_str(&text),
            (Some(Piece::Reasoning(last)), Piece::Reasoning(text)) => last.push_str(&text),
            (_, piece) => merged.push(piece),
        }
    }
    merged.retain(|piece| !matches!(piece, Piece::Text(t) | Piece::Reasoning(t) if t.is_empty()));
    merged
}

#[test]
fn think_block_is_split_from_the_answer_at_any_chunking() {
    let content = "\n<think>\nplan: a < b </thin k> ok</think>\n\nThe answer.";
    let expected = vec![
        Piece::Reasoning("\nplan: a < b </thin k> ok".to_owned()),
        Piece::Text("The answer.".to_owned()),
    ];
    assert_eq!(split_all(&[content]), expected);
    for split in 0..=content.len() {
        if content.is_char_boundary(split) {
            assert_eq!(split_all(&[&content[..split], &content[split..]]), expected, "{split}");
        }
    }
    let chars: Vec<String> = content.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    assert_eq!(split_all(&refs), expected);
}

#[test]
fn unterminated_think_block_is_all_reasoning() {
    assert_eq!(
        split_all(&["<think>\nHmm", ", the user"]),
        vec![Piece::Reasoning("\nHmm, the user".to_owned())]
    );
}

#[test]
fn content_without_think_passes_through() {
    assert_eq!(
        split_all(&["  <thi", "s is text"]),
        vec![Piece::Text("  <this is text".to_owned())]
    );
    assert_eq!(split_all(&["<thi"]), vec![Piece::Text("<thi".to_owned())]);
    assert_eq!(split_all(&["a <think> b"]), vec![Piece::Text("a <think> b".to_owned())]);
}

#[test]
fn deltas_are_reported_live() {
    let seen = Mutex::new(Vec::new());
    let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
    let mut assembler = Assembler::new(&on_delta, None);
    for data in [
        r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
        r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
        r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}}]}"#,
        r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
    ] {
        assert_eq!(assembler.apply_event("message", data), Ok(Flow::Continue));
    }
    assert_eq!(assembler.apply_event("message", "[DONE]"), Ok(Flow::Done));
    let response = assembler.finish();
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    assert_eq!(
        seen.into_inner().unwrap(),
        vec![
            StreamDelta::Reasoning("hm".into()),
            StreamDelta::Text("Hi".into()),
            StreamDelta::ToolCallStarted { name: "f".into() }
        ]
    );
}

#[test]
fn refusal_becomes_the_text_and_the_reason() {
    let on_delta = |_: StreamDelta| {};
    let mut assembler = Assembler::new(&on_delta, None);
    assembler
        .apply_event(
            "message",
            r#"{"choices":[{"delta":{"refusal":"I can't"},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
    let response = assembler.finish();
    assert_eq!(response.text, "I can't");
    assert_eq!(response.finish_reason, FinishReason::Refusal);
}

#[test]
fn malformed_chunk_is_a_stream_error() {
    let on_delta = |_: StreamDelta| {};
    let mut assembler = Assembler::new(&on_delta, None);
    let error = assembler.apply_event("message", "{not json").unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::InvalidResponse);
    assert!(!error.is_retryable());
}

#[test]
fn thinking_content_parts_are_reasoning_in_every_shape() {
    let on_delta = |_: StreamDelta| {};
    let mut assembler = Assembler::new(&on_delta, None);
    for data in [
        r#"{"choices":[{"delta":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"Plan"}]}]}}]}"#,
        r#"{"choices":[{"delta":{"content":[{"type":"thinking","thinking":" more."}]}}]}"#,
        r#"{"choices":[{"delta":{"content":[{"type":"text","text":"4"}]}}]}"#,
        r#"{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}"#,
    ] {
        assembler.apply_event("message", data).unwrap();
    }
    let response = assembler.finish();
    assert_eq!(response.text, "4");
    assert_eq!(response.reasoning[0].text, "Plan more.");
}
