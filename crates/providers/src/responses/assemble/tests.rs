//! The Responses assembler on event sequences: cut-off calls, errors, refusals, final
//! output matched to streamed items, foreign calls, and events keel ignores.

use std::sync::Mutex;

use keel_contracts::{FinishReason, ModelResponse, ReasoningPart, Usage};
use serde_json::json;

use super::finish::usage_from_wire;
use super::*;
use crate::responses::wire::WireUsage;

fn run(events: &[Value]) -> (Result<ModelResponse, ModelError>, Vec<StreamDelta>) {
    let seen = Mutex::new(Vec::new());
    let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
    let mut assembler = Assembler::new(&on_delta, None);
    let mut result = None;
    for event in events {
        let kind = event["type"].as_str().unwrap_or("message");
        match assembler.apply_event(kind, &event.to_string()) {
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

#[test]
fn usage_subtracts_reasoning_from_output() {
    let usage: WireUsage = serde_json::from_value(json!({
        "input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256},
        "total_tokens": 420
    }))
    .unwrap();
    assert_eq!(
        usage_from_wire(&usage),
        Usage {
            input_tokens: Some(120),
            output_tokens: Some(44),
            cached_input_tokens: Some(100),
            reasoning_tokens: Some(256)
        }
    );
    assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
}

#[test]
fn incomplete_response_cuts_off_an_unfinished_call() {
    let (result, deltas) = run(&[
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "function_call", "call_id": "call_1", "name": "write_file", "arguments": ""}}),
        json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{\"path\":"}),
        json!({"type": "response.incomplete", "response": {"status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"}, "output": []}}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert_eq!(response.tool_calls[0].arguments, json!("{\"path\":"));
    assert!(response.tool_calls[0].arguments_error.as_deref().unwrap().contains("cut off"));
    assert_eq!(deltas, vec![StreamDelta::ToolCallStarted { name: "write_file".into() }]);
}

#[test]
fn failed_response_and_error_events_are_errors() {
    let (result, _) = run(&[json!({"type": "response.failed", "response": {"status": "failed",
        "error": {"code": "server_error", "message": "The server had an error"}}})]);
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Server);
    assert!(error.message.contains("The server had an error"));
    let (result, _) = run(&[json!({"type": "error", "code": "rate_limit_exceeded",
        "message": "Rate limit reached", "param": null, "sequence_number": 3})]);
    assert_eq!(result.unwrap_err().kind, ModelErrorKind::RateLimited { retry_after: None });
}

#[test]
fn refusal_becomes_the_text_and_the_reason() {
    let (result, _) = run(&[
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"type": "message", "role": "assistant", "content": []}}),
        json!({"type": "response.refusal.delta", "output_index": 0, "delta": "I can't help"}),
        json!({"type": "response.completed", "response": {"status": "completed"}}),
    ]);
    let response = result.unwrap();
    assert_eq!(response.text, "I can't help");
    assert_eq!(response.finish_reason, FinishReason::Refusal);
}

#[test]
fn final_output_fills_in_what_did_not_stream() {
    let (result, deltas) = run(&[json!({"type": "response.completed", "response": {
        "status": "completed",
        "output": [
            {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"},
                {"type": "summary_text", "text": "b"}], "encrypted_content": "gAAA"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]}
        ],
        "usage": {"input_tokens": 3, "output_tokens": 2}
    }})]);
    let response = result.unwrap();
    assert_eq!(response.text, "Hi.");
    assert_eq!(
        response.reasoning,
        vec![ReasoningPart {
            text: "a\n\nb".into(),
            signature: None,
            redacted: Some("gAAA".into())
        }]
    );
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(deltas, vec![StreamDelta::Text("Hi.".into())]);
}

fn done(index: u64, item: Value) -> Value {
    json!({"type": "response.output_item.done", "output_index": index, "item": item})
}

fn completed(output: Value) -> Value {
    json!({"type": "response.completed", "response": {"status": "completed", "output": output}})
}

#[test]
fn final_output_is_matched_by_id_not_position() {
    let first = json!({"id": "msg_a", "type": "message",
        "content": [{"type": "output_text", "text": "One."}]});
    let second = json!({"id": "msg_b", "type": "message",
        "content": [{"type": "output_text", "text": "Two."}]});
    // Streamed at output indexes 0 and 2; the final output lists them at 0 and 1.
    let (result, deltas) =
        run(&[done(0, first.clone()), done(2, second.clone()), completed(json!([first, second]))]);
    assert_eq!(result.unwrap().text, "One.\n\nTwo.");
    let live: String = deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Text(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(live, "One.\n\nTwo.");
}

#[test]
fn final_output_with_rotated_ids_falls_back_to_position() {
    let streamed = json!({"id": "msg_1", "type": "message",
        "content": [{"type": "output_text", "text": "Hi."}]});
    let rotated = json!({"id": "msg_9", "type": "message",
        "content": [{"type": "output_text", "text": "Hi."}]});
    let (result, _) = run(&[done(0, streamed), completed(json!([rotated]))]);
    assert_eq!(result.unwrap().text, "Hi.");
}

#[test]
fn undeclared_client_calls_are_refused_calls_never_an_empty_answer() {
    for (item, name) in [
        (
            json!({"type": "custom_tool_call", "call_id": "c1", "name": "write_sql",
            "input": "SELECT 1"}),
            "write_sql",
        ),
        (
            json!({"type": "apply_patch_call", "call_id": "c1",
            "operation": {"type": "delete_file", "path": "a"}}),
            "apply_patch",
        ),
        (
            json!({"type": "local_shell_call", "call_id": "c1",
            "action": {"type": "exec", "command": ["ls"]}}),
            "local_shell",
        ),
        (json!({"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}}), "shell"),
        (
            json!({"type": "tool_search_call", "call_id": "c1", "execution": "client",
            "arguments": {"goal": "weather"}}),
            "tool_search",
        ),
    ] {
        let (result, deltas) = run(&[done(0, item.clone()), completed(json!([item]))]);
        let response = result.unwrap();
        assert_eq!(response.finish_reason, FinishReason::ToolCalls, "{name}");
        assert_eq!(response.tool_calls.len(), 1, "{name}");
        let call = &response.tool_calls[0];
        assert_eq!((call.name.as_str(), call.call_id.as_str()), (name, "c1"));
        assert!(call.arguments_error.as_deref().unwrap().contains("not executed"), "{name}");
        assert_eq!(deltas, vec![StreamDelta::ToolCallStarted { name: name.into() }]);
    }
    // The tool-search arguments object survives as the call's arguments.
    let item = json!({"type": "tool_search_call", "call_id": "c1", "execution": "client",
        "arguments": {"goal": "weather"}});
    let (result, _) = run(&[done(0, item)]);
    assert_eq!(result.unwrap().tool_calls[0].arguments, json!({"goal": "weather"}));
}

#[test]
fn calls_the_server_runs_are_not_refused() {
    let message = json!({"id": "m", "type": "message",
        "content": [{"type": "output_text", "text": "Done."}]});
    for items in [
        // The server says it runs them.
        vec![json!({"type": "shell_call", "call_id": "c1",
            "environment": {"type": "container_reference"}})],
        vec![json!({"type": "tool_search_call", "call_id": "c1", "execution": "server"})],
        // Its output is in the response.
        vec![
            json!({"type": "computer_call", "call_id": "c1"}),
            json!({"type": "computer_call_output", "call_id": "c1"}),
        ],
        // The model went on to a message after it (xAI's server-side custom tools).
        vec![
            json!({"type": "custom_tool_call", "call_id": "c1", "name": "x_search"}),
            message.clone(),
        ],
        // Not a call at all.
        vec![json!({"type": "program", "call_id": "c1", "code": ""})],
        vec![json!({"type": "web_search_call", "id": "ws_1", "status": "completed"})],
    ] {
        let events: Vec<Value> = items
            .iter()
            .enumerate()
            .map(|(index, item)| done(u64::try_from(index).unwrap(), item.clone()))
            .collect();
        let (result, _) = run(&events);
        let response = result.unwrap();
        assert!(response.tool_calls.is_empty(), "{items:?}");
        assert_eq!(response.finish_reason, FinishReason::Stop, "{items:?}");
    }
}

#[test]
fn events_keel_ignores_never_fail_and_unreadable_events_it_reads_are_not_retried() {
    let seen = Mutex::new(Vec::new());
    let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
    let mut assembler = Assembler::new(&on_delta, None);
    let odd = json!({"type": "response.shell_call_output_content.delta", "output_index": 0,
        "delta": {"stdout": "x"}});
    assert_eq!(assembler.apply_event("message", &odd.to_string()), Ok(Flow::Continue));
    assert_eq!(assembler.apply_event("response.created", "{\"trunc"), Ok(Flow::Continue));
    let error = assembler.apply_event("response.completed", "{\"trunc").unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::InvalidResponse);
    assert!(!error.is_retryable());
}
