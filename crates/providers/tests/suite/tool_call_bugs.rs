//! Tool-call assembly over the wire: the B01 and B02 bug inputs
//! (`tests/fixtures/bugs/*.jsonl`), and synthetic streams for the edges of the rule.

use keel_contracts::{FinishReason, ModelResponse, ToolCall};
use serde_json::{Value, json};

use super::harness::{MockServer, Reply, complete, fixture_path, simple_request};

async fn run_lines(lines: &str) -> ModelResponse {
    let server = MockServer::start(vec![Reply::data_lines(lines)]).await;
    let (result, _deltas) = complete(&server.client(), &simple_request()).await;
    result.unwrap()
}

async fn run_fixture(name: &str) -> ModelResponse {
    run_lines(&std::fs::read_to_string(fixture_path(&format!("bugs/{name}"))).unwrap()).await
}

fn calls(response: &ModelResponse) -> Vec<(&str, &str, &Value)> {
    response
        .tool_calls
        .iter()
        .map(|call| (call.call_id.as_str(), call.name.as_str(), &call.arguments))
        .collect()
}

fn chunk_with_call(call: Value) -> String {
    json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})
        .to_string()
}

const FINISH_TOOL_CALLS: &str =
    r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#;

#[tokio::test]
async fn issue_b01_variant_a_index_only_continuations_make_one_call() {
    let response = run_fixture("B01-variant-a.jsonl").await;
    let arguments = json!({"command": ["bash", "-lc", "ls -R"], "workdir": "/srv/demo"});
    assert_eq!(calls(&response), vec![("701601222", "shell", &arguments)]);
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
}

#[tokio::test]
async fn issue_b01_variant_b_new_ids_with_empty_names_make_one_call() {
    let response = run_fixture("B01-variant-b.jsonl").await;
    let arguments = json!({"command": ["bash", "-lc", "ls -R"], "workdir": "/srv/demo"});
    assert_eq!(calls(&response), vec![("701601222", "shell", &arguments)]);
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
}

#[tokio::test]
async fn issue_b02_variant_1_same_index_new_id_and_name_makes_two_calls() {
    let response = run_fixture("B02-variant-1.jsonl").await;
    assert_eq!(
        calls(&response),
        vec![
            ("call_a", "read_file", &json!({"path": "a"})),
            ("call_b", "read_file", &json!({"path": "b"}))
        ]
    );
    assert!(response.tool_calls.iter().all(|call| call.arguments_error.is_none()));
}

#[tokio::test]
async fn issue_b02_variant_2_interleaved_fragments_route_by_index() {
    let response = run_fixture("B02-variant-2.jsonl").await;
    assert_eq!(
        calls(&response),
        vec![
            ("call_A", "read_file", &json!({"path": "a.txt"})),
            ("call_B", "list_dir", &json!({"path": "src"}))
        ]
    );
}

/// Synthetic: a stream cut by the output limit inside the tool arguments keeps the call,
/// marked malformed, with the raw text; it is never dropped.
#[tokio::test]
async fn synthetic_unparseable_arguments_are_kept_with_an_error() {
    let lines = [
        chunk_with_call(json!({"index": 0, "id": "call_1", "type": "function",
            "function": {"name": "make_file", "arguments": "{\"path\": \"a.txt\", \"content\": \"hel"}})),
        r#"{"choices":[{"index":0,"delta":{},"finish_reason":"length"}]}"#.to_owned(),
    ]
    .join("\n");
    let response = run_lines(&lines).await;
    assert_eq!(response.finish_reason, FinishReason::Length);
    let ToolCall { call_id, name, arguments, arguments_error } = &response.tool_calls[0];
    assert_eq!((call_id.as_str(), name.as_str()), ("call_1", "make_file"));
    assert_eq!(arguments, &json!("{\"path\": \"a.txt\", \"content\": \"hel"));
    assert!(arguments_error.as_deref().unwrap().contains("not valid JSON"));
}

/// Synthetic: a call whose arguments never arrive gets `{}`, and a missing id is minted.
#[tokio::test]
async fn synthetic_empty_arguments_become_an_empty_object_and_ids_are_minted() {
    let lines = [
        chunk_with_call(json!({"index": 0, "type": "function",
            "function": {"name": "get_time", "arguments": ""}})),
        chunk_with_call(json!({"index": 1, "id": "",
            "function": {"name": "get_date"}})),
        FINISH_TOOL_CALLS.to_owned(),
    ]
    .join("\n");
    let response = run_lines(&lines).await;
    assert_eq!(response.tool_calls.len(), 2);
    for call in &response.tool_calls {
        assert_eq!(call.arguments, json!({}));
        assert_eq!(call.arguments_error, None);
        assert!(call.call_id.as_str().starts_with("call_"));
    }
    assert_ne!(response.tool_calls[0].call_id, response.tool_calls[1].call_id);
}

/// Synthetic: fragments with neither id nor index continue the call being streamed.
#[tokio::test]
async fn synthetic_fragments_without_id_or_index_continue_the_current_call() {
    let lines = [
        chunk_with_call(
            json!({"id": "x1", "function": {"name": "grep", "arguments": "{\"pattern\":"}}),
        ),
        chunk_with_call(json!({"function": {"arguments": "\"fn main\"}"}})),
        FINISH_TOOL_CALLS.to_owned(),
    ]
    .join("\n");
    let response = run_lines(&lines).await;
    assert_eq!(calls(&response), vec![("x1", "grep", &json!({"pattern": "fn main"}))]);
}
