//! OpenAI Responses API traffic through `OpenAiResponses`. No recording of this API is in
//! the shared cases, so every stream here is synthetic, written after OpenAI's "Streaming
//! events" reference (<https://platform.openai.com/docs/api-reference/responses-streaming>):
//! `event:` names equal to the payload's `type`, `sequence_number`s, `item_id`s, summary
//! parts, and the full response object in `response.completed`.

use keel_contracts::{
    FinishReason, Message, ModelErrorKind, Outcome, ReasoningPart, StreamDelta, ToolCallId,
    ToolDefinition, Usage,
};
use serde_json::{Value, json};

use super::harness::{MockServer, Reply, complete, model_request, simple_request};

/// The encrypted reasoning the synthetic server hands out (opaque to keel).
const ENCRYPTED: &str = "gAAAAABoSynthetic_Encrypted+Reasoning/Blob==";
const SUMMARY: &str = "**Planning the file write**\n\nI will create notes.txt with one line.";

/// Frames typed payloads as the Responses API does, numbering them.
fn frame(payloads: Vec<Value>) -> String {
    payloads
        .into_iter()
        .enumerate()
        .map(|(sequence_number, mut payload)| {
            payload["sequence_number"] = json!(sequence_number);
            format!("event: {}\ndata: {payload}\n\n", payload["type"].as_str().unwrap())
        })
        .collect()
}

fn response_object(status: &str, output: Value, usage: Value) -> Value {
    json!({"id": "resp_synthetic", "object": "response", "created_at": 1_750_000_000,
        "status": status, "model": "gpt-5-mini", "output": output, "usage": usage,
        "store": false, "error": null, "incomplete_details": null})
}

fn reasoning_item() -> Value {
    json!({"id": "rs_1", "type": "reasoning", "encrypted_content": ENCRYPTED,
        "summary": [{"type": "summary_text", "text": SUMMARY}]})
}

fn call_item(arguments: &str) -> Value {
    json!({"id": "fc_1", "type": "function_call", "status": "completed", "arguments": arguments,
        "call_id": "call_write_1", "name": "write_file"})
}

/// Reasoning (summary in two deltas), then a function call whose arguments arrive in
/// three deltas, then `response.completed` with usage.
fn reasoning_then_call_stream() -> String {
    let arguments = r#"{"path":"notes.txt","content":"hello\n"}"#;
    let (a, rest) = arguments.split_at(9);
    let (b, c) = rest.split_at(14);
    let (summary_a, summary_b) = SUMMARY.split_at(28);
    let usage = json!({"input_tokens": 320, "input_tokens_details": {"cached_tokens": 256},
        "output_tokens": 180, "output_tokens_details": {"reasoning_tokens": 128},
        "total_tokens": 500});
    frame(vec![
        json!({"type": "response.created", "response": response_object("in_progress", json!([]), Value::Null)}),
        json!({"type": "response.in_progress", "response": response_object("in_progress", json!([]), Value::Null)}),
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "rs_1", "type": "reasoning", "summary": []}}),
        json!({"type": "response.reasoning_summary_part.added", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "part": {"type": "summary_text", "text": ""}}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "delta": summary_a}),
        json!({"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "delta": summary_b}),
        json!({"type": "response.reasoning_summary_text.done", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "text": SUMMARY}),
        json!({"type": "response.reasoning_summary_part.done", "item_id": "rs_1", "output_index": 0,
            "summary_index": 0, "part": {"type": "summary_text", "text": SUMMARY}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning_item()}),
        json!({"type": "response.output_item.added", "output_index": 1,
            "item": {"id": "fc_1", "type": "function_call", "status": "in_progress", "arguments": "",
                "call_id": "call_write_1", "name": "write_file"}}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": a}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": b}),
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1", "output_index": 1, "delta": c}),
        json!({"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 1,
            "arguments": arguments}),
        json!({"type": "response.output_item.done", "output_index": 1, "item": call_item(arguments)}),
        json!({"type": "response.completed", "response": response_object(
            "completed", json!([reasoning_item(), call_item(arguments)]), usage)}),
    ])
}

/// One assistant message saying `text` in word deltas.
fn text_stream(text: &str) -> String {
    let message = |text: &str, status: &str| {
        json!({"id": "msg_1", "type": "message", "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let mut payloads = vec![
        json!({"type": "response.created", "response": response_object("in_progress", json!([]), Value::Null)}),
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    ];
    for word in text.split_inclusive(' ') {
        payloads.push(json!({"type": "response.output_text.delta", "item_id": "msg_1",
            "output_index": 0, "content_index": 0, "delta": word}));
    }
    payloads.push(json!({"type": "response.output_text.done", "item_id": "msg_1",
        "output_index": 0, "content_index": 0, "text": text}));
    payloads.push(json!({"type": "response.output_item.done", "output_index": 0, "item": message(text, "completed")}));
    payloads.push(json!({"type": "response.completed", "response": response_object("completed",
        json!([message(text, "completed")]),
        json!({"input_tokens": 400, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 409}))}));
    frame(payloads)
}

fn write_tool() -> ToolDefinition {
    ToolDefinition {
        name: "write_file".into(),
        description: "Write a file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"},
            "content": {"type": "string"}}, "required": ["path", "content"]})
        .into(),
    }
}

#[tokio::test]
async fn synthetic_responses_stream_with_reasoning_call_and_usage() {
    let server = MockServer::start(vec![Reply::sse(reasoning_then_call_stream())]).await;
    let (result, deltas) = complete(&server.responses_client(), &simple_request()).await;
    let response = result.unwrap();
    assert_eq!(response.text, "");
    assert_eq!(
        response.reasoning,
        vec![ReasoningPart {
            text: SUMMARY.into(),
            signature: None,
            redacted: Some(ENCRYPTED.into())
        }]
    );
    assert_eq!(response.tool_calls.len(), 1);
    let call = &response.tool_calls[0];
    assert_eq!(call.call_id.as_str(), "call_write_1");
    assert_eq!(call.name, "write_file");
    assert_eq!(call.arguments, json!({"path": "notes.txt", "content": "hello\n"}));
    assert_eq!(call.arguments_error, None);
    assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    // output_tokens 180 includes 128 reasoning tokens: keel's output excludes them.
    assert_eq!(
        response.usage,
        Usage {
            input_tokens: Some(320),
            output_tokens: Some(52),
            cached_input_tokens: Some(256),
            reasoning_tokens: Some(128)
        }
    );
    let live_reasoning: String = deltas
        .iter()
        .filter_map(|delta| match delta {
            StreamDelta::Reasoning(text) => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(live_reasoning, SUMMARY);
    assert!(deltas.contains(&StreamDelta::ToolCallStarted { name: "write_file".into() }));
    assert_eq!(server.received()[0].path, "/v1/responses");
}

#[tokio::test]
async fn synthetic_responses_tool_round_trip_replays_reasoning_call_and_output() {
    let server = MockServer::start(vec![
        Reply::sse(reasoning_then_call_stream()),
        Reply::sse(text_stream("Created notes.txt.")),
    ])
    .await;
    let client = server.responses_client();
    let user = Message::User { text: "Create notes.txt saying hello.".into() };
    let first =
        model_request("gpt-5-mini", "You are keel.", vec![user.clone()], vec![write_tool()]);
    let (response, _) = complete(&client, &first).await;
    let response = response.unwrap();

    let history = vec![
        user,
        Message::Assistant {
            text: response.text.clone(),
            reasoning: response.reasoning.clone(),
            tool_calls: response.tool_calls.clone(),
        },
        Message::ToolResult {
            call_id: ToolCallId::from("call_write_1"),
            tool: "write_file".into(),
            outcome: Outcome::Ok,
            content: "wrote 6 bytes to notes.txt".into(),
        },
    ];
    let second = model_request("gpt-5-mini", "You are keel.", history, vec![write_tool()]);
    let (answer, deltas) = complete(&client, &second).await;
    let answer = answer.unwrap();
    assert_eq!(answer.text, "Created notes.txt.");
    assert_eq!(answer.finish_reason, FinishReason::Stop);
    assert_eq!(answer.usage.output_tokens, Some(9));
    assert_eq!(answer.usage.reasoning_tokens, Some(0));
    assert!(deltas.len() > 1, "text streams in pieces");

    let received = server.received();
    assert_eq!(received[0].authorization.as_deref(), Some("Bearer sk-test-0123456789"));
    let first_body = &received[0].body;
    assert_eq!(
        first_body,
        &json!({
            "model": "gpt-5-mini",
            "instructions": "You are keel.",
            "input": [{"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Create notes.txt saying hello."}]}],
            "tools": [{"type": "function", "name": "write_file", "description": "Write a file.",
                "parameters": write_tool().parameters, "strict": false}],
            "stream": true,
            "store": false,
            "include": ["reasoning.encrypted_content"]
        })
    );
    let mut input = received[1].body["input"].as_array().unwrap().clone();
    // The arguments go back as a JSON string; compare what it says, not its key order.
    let arguments = input[2]["arguments"].take();
    let arguments: Value = serde_json::from_str(arguments.as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"path": "notes.txt", "content": "hello\n"}));
    assert_eq!(
        input,
        vec![
            json!({"type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Create notes.txt saying hello."}]}),
            json!({"type": "reasoning", "summary": [{"type": "summary_text", "text": SUMMARY}],
                "encrypted_content": ENCRYPTED}),
            json!({"type": "function_call", "call_id": "call_write_1", "name": "write_file",
                "arguments": null}),
            json!({"type": "function_call_output", "call_id": "call_write_1",
                "output": "wrote 6 bytes to notes.txt"}),
        ]
    );
}

#[tokio::test]
async fn synthetic_responses_assistant_text_and_options_are_sent() {
    let server = MockServer::start(vec![Reply::sse(text_stream("ok"))]).await;
    let options = keel_providers::ResponsesOptions {
        reasoning_effort: Some("low".into()),
        reasoning_summary: Some("auto".into()),
        max_output_tokens: Some(2048),
    };
    let client = keel_providers::OpenAiResponses::with_options(server.config(), options).unwrap();
    let history = vec![
        Message::User { text: "hi".into() },
        Message::Assistant { text: "hello".into(), reasoning: Vec::new(), tool_calls: Vec::new() },
        Message::User { text: "again".into() },
    ];
    let (result, _) = complete(&client, &model_request("", "", history, Vec::new())).await;
    assert_eq!(result.unwrap().text, "ok");
    let body = &server.received()[0].body;
    assert_eq!(body["model"], "test-model");
    assert_eq!(body.get("instructions"), None);
    assert_eq!(body.get("tools"), None);
    assert_eq!(body["reasoning"], json!({"effort": "low", "summary": "auto"}));
    assert_eq!(body["max_output_tokens"], 2048);
    assert_eq!(
        body["input"][1],
        json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "hello"}]})
    );
}

#[tokio::test]
async fn synthetic_responses_incomplete_for_max_output_tokens_is_length() {
    let body = frame(vec![
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
            "content_index": 0, "delta": "The answer is"}),
        json!({"type": "response.incomplete", "response": {"id": "resp_1", "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"}, "output": [],
            "usage": {"input_tokens": 10, "output_tokens": 16,
                "output_tokens_details": {"reasoning_tokens": 12}}}}),
    ]);
    let server = MockServer::start(vec![Reply::sse(body)]).await;
    let (result, _) = complete(&server.responses_client(), &simple_request()).await;
    let response = result.unwrap();
    assert_eq!(response.text, "The answer is");
    assert_eq!(response.finish_reason, FinishReason::Length);
    assert_eq!(response.usage.output_tokens, Some(4));
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_responses_failed_and_error_events_are_errors() {
    let failed = frame(vec![
        json!({"type": "response.created", "response": response_object("in_progress", json!([]), Value::Null)}),
        json!({"type": "response.failed", "response": {"id": "resp_1", "status": "failed",
            "error": {"code": "server_error", "message": "The model failed to generate a response."}}}),
    ]);
    let server = MockServer::start(vec![Reply::sse(failed), Reply::sse(text_stream("ok"))]).await;
    let (result, _) = complete(&server.responses_client(), &simple_request()).await;
    assert_eq!(result.unwrap().text, "ok", "a server_error failure is retried");
    assert_eq!(server.n_requests(), 2);

    let invalid = frame(vec![json!({"type": "error", "code": "invalid_prompt",
        "message": "Invalid prompt: flagged.", "param": null})]);
    let server = MockServer::start(vec![Reply::sse(invalid)]).await;
    let (result, _) = complete(&server.responses_client(), &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::InvalidRequest);
    assert!(error.message.contains("Invalid prompt"), "{}", error.message);
    assert_eq!(server.n_requests(), 1);
}

#[tokio::test]
async fn synthetic_responses_stream_without_a_terminal_event_is_truncated() {
    let body = text_stream("Never finished.");
    let cut = body.find("event: response.output_item.done").unwrap();
    let server = MockServer::start(vec![Reply::sse(&body[..cut])]).await;
    let mut config = server.config();
    config.retry.max_retries = 1;
    let client = keel_providers::OpenAiResponses::new(config).unwrap();
    let (result, _) = complete(&client, &simple_request()).await;
    let error = result.unwrap_err();
    assert_eq!(error.kind, ModelErrorKind::Stream);
    assert!(error.message.contains("truncated"), "{}", error.message);
    assert_eq!(server.n_requests(), 2);
}

#[tokio::test]
async fn synthetic_responses_http_errors_use_the_shared_mapping() {
    let too_long = Reply::json(
        400,
        &json!({"error": {"message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}),
    );
    let server = MockServer::start(vec![too_long]).await;
    let (result, _) = complete(&server.responses_client(), &simple_request()).await;
    assert_eq!(result.unwrap_err().kind, ModelErrorKind::ContextTooLong);
    assert_eq!(server.n_requests(), 1);
}
