//! The Messages API request keel sends: headers, roles, block order, and thinking replayed
//! byte-exact (B06).

use keel_contracts::{
    Message, ModelRequest, Outcome, ReasoningPart, ToolCall, ToolCallId, ToolDefinition,
};
use keel_providers::AnthropicMessages;
use serde_json::{Value, json};

use super::harness::{
    MockServer, Reply, TEST_KEY, anthropic_text_stream, complete, model_request, recording,
};

fn tool(name: &str) -> ToolDefinition {
    ToolDefinition {
        name: name.into(),
        description: format!("The {name} tool."),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}).into(),
    }
}

fn call(id: &str, name: &str, arguments: Value) -> ToolCall {
    ToolCall { call_id: ToolCallId::from(id), name: name.into(), arguments, arguments_error: None }
}

fn result(id: &str, name: &str, outcome: Outcome, content: &str) -> Message {
    Message::ToolResult {
        call_id: ToolCallId::from(id),
        tool: name.into(),
        outcome,
        content: content.into(),
    }
}

/// Sends `request` to a fresh server and returns the body it received.
async fn sent_body(request: &ModelRequest) -> Value {
    let server = MockServer::start(vec![Reply::sse(anthropic_text_stream("ok"))]).await;
    let (result, _) = complete(&server.anthropic_client(), request).await;
    assert_eq!(result.unwrap().text, "ok");
    server.received()[0].body.clone()
}

#[tokio::test]
async fn request_headers_path_and_body_match_the_recorded_request() {
    let recorded = recording("14-anthropic-stream-text");
    let server = MockServer::start(vec![Reply::recorded(&recorded)]).await;
    let request = model_request(
        "claude-sonnet-4-5",
        "",
        vec![Message::User { text: "Two names for a pet pelican, be brief".into() }],
        Vec::new(),
    );
    let (result, _) = complete(&server.anthropic_client(), &request).await;
    assert_eq!(result.unwrap().text, "- Captain\n- Scoop");
    let received = &server.received()[0];
    assert_eq!(received.path, "/v1/messages");
    assert_eq!(received.header("x-api-key"), Some(TEST_KEY));
    assert_eq!(received.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(received.authorization, None, "the key goes in x-api-key only");
    assert!(received.accept.as_deref().unwrap().contains("text/event-stream"));
    // keel sends what llm-anthropic sent, minus the sampling option it does not set.
    let mut expected = recorded["request"]["body"].clone();
    expected.as_object_mut().unwrap().remove("temperature");
    assert_eq!(received.body, expected);
}

#[tokio::test]
async fn history_with_thinking_tool_use_and_results_has_the_right_blocks_and_roles() {
    let thinking = ReasoningPart {
        text: "Let me look at both files.\n".into(),
        signature: Some("EqQBCkYIBxgCKkA+/sig==".into()),
        redacted: None,
    };
    let redacted = ReasoningPart {
        text: String::new(),
        signature: None,
        redacted: Some("EmwKAhgBEgy=".into()),
    };
    let request = model_request(
        "claude-sonnet-4-5",
        "You are keel.",
        vec![
            Message::User { text: "Read a.txt and b.txt.".into() },
            Message::Assistant {
                text: "Reading both.".into(),
                reasoning: vec![thinking.clone(), redacted.clone()],
                tool_calls: vec![
                    call("toolu_a", "read_file", json!({"path": "a.txt"})),
                    call("toolu_b", "read_file", json!({"path": "b.txt"})),
                ],
            },
            result("toolu_a", "read_file", Outcome::Ok, "alpha"),
            result("toolu_b", "read_file", Outcome::Error, "no such file: b.txt"),
            Message::User { text: "Also, be brief.".into() },
        ],
        vec![tool("read_file")],
    );
    let body = sent_body(&request).await;
    assert_eq!(
        body,
        json!({
            "model": "claude-sonnet-4-5",
            "max_tokens": 8192,
            "system": "You are keel.",
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Read a.txt and b.txt."}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me look at both files.\n",
                        "signature": "EqQBCkYIBxgCKkA+/sig=="},
                    {"type": "redacted_thinking", "data": "EmwKAhgBEgy="},
                    {"type": "text", "text": "Reading both."},
                    {"type": "tool_use", "id": "toolu_a", "name": "read_file", "input": {"path": "a.txt"}},
                    {"type": "tool_use", "id": "toolu_b", "name": "read_file", "input": {"path": "b.txt"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "alpha"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "no such file: b.txt",
                        "is_error": true},
                    {"type": "text", "text": "Also, be brief."}
                ]}
            ],
            "tools": [{"name": "read_file", "description": "The read_file tool.",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}],
            "stream": true
        })
    );
}

#[tokio::test]
async fn issue_b06_thinking_from_stream_17_is_replayed_byte_exact_with_its_tool_result() {
    // Turn 1: the recorded stream (thinking deltas, an empty thinking delta, the signature,
    // then a tool_use with no input).
    let recorded = recording("17-anthropic-stream-thinking-then-tool-use-no-args");
    let server = MockServer::start(vec![
        Reply::recorded(&recorded),
        Reply::sse(anthropic_text_stream("v1")),
    ])
    .await;
    let client = server.anthropic_client();
    let user = Message::User { text: "Use the fixed_version tool.".into() };
    let first =
        model_request("claude-haiku-4-5", "", vec![user.clone()], vec![tool("fixed_version")]);
    let (response, _) = complete(&client, &first).await;
    let response = response.unwrap();

    // Turn 2: the history as the kernel projects it (interrupted call answered as error,
    // B03), round-tripped through the ledger's JSON form.
    let assistant = Message::Assistant {
        text: response.text.clone(),
        reasoning: response.reasoning.clone(),
        tool_calls: response.tool_calls.clone(),
    };
    let assistant: Message =
        serde_json::from_str(&serde_json::to_string(&assistant).unwrap()).unwrap();
    let answer = result(
        "toolu_01825dXWLSoJwCst1qTsiWdb",
        "fixed_version",
        Outcome::Indeterminate,
        "interrupted",
    );
    let second = model_request(
        "claude-haiku-4-5",
        "",
        vec![user, assistant, answer],
        vec![tool("fixed_version")],
    );
    let (again, _) = complete(&client, &second).await;
    assert_eq!(again.unwrap().text, "v1");

    // The thinking text and signature sent back are exactly what the stream carried.
    let body = recorded["response"]["body"].as_str().unwrap();
    let mut thinking = String::new();
    let mut signature = String::new();
    for data in body.lines().filter_map(|line| line.strip_prefix("data:")) {
        let payload: Value = serde_json::from_str(data.trim()).unwrap();
        match payload["delta"]["type"].as_str() {
            Some("thinking_delta") => {
                thinking.push_str(payload["delta"]["thinking"].as_str().unwrap())
            }
            Some("signature_delta") => {
                signature.push_str(payload["delta"]["signature"].as_str().unwrap())
            }
            _ => {}
        }
    }
    assert_eq!(thinking.chars().count(), 180);
    assert!(thinking.starts_with("The user wants me to:"));
    let sent = &server.received()[1].body;
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 3);
    assert_eq!(
        messages[1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": thinking, "signature": signature},
            {"type": "tool_use", "id": "toolu_01825dXWLSoJwCst1qTsiWdb", "name": "fixed_version", "input": {}}
        ]})
    );
    assert_eq!(
        messages[2],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_01825dXWLSoJwCst1qTsiWdb",
                "content": "interrupted", "is_error": true}
        ]})
    );
}

#[tokio::test]
async fn issue_b06_empty_or_unsigned_thinking_from_an_old_log_is_dropped_not_the_turn() {
    let faulty = ReasoningPart {
        text: String::new(),
        signature: Some("EoQDCm0IDhgCKkCDzGs2".into()),
        redacted: None,
    };
    let unsigned = ReasoningPart { text: "thoughts".into(), signature: None, redacted: None };
    let request = model_request(
        "m",
        "",
        vec![
            Message::User { text: "go".into() },
            Message::Assistant {
                text: String::new(),
                reasoning: vec![faulty, unsigned],
                tool_calls: vec![call("toolu_1", "fixed_version", json!({}))],
            },
            result("toolu_1", "fixed_version", Outcome::Ok, "1.0"),
        ],
        Vec::new(),
    );
    let body = sent_body(&request).await;
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "fixed_version", "input": {}}
        ]})
    );
}

#[tokio::test]
async fn redacted_thinking_from_stream_21_is_replayed_unchanged() {
    let recorded = recording("21-anthropic-stream-redacted-thinking");
    let server = MockServer::start(vec![
        Reply::recorded(&recorded),
        Reply::sse(anthropic_text_stream("ok")),
    ])
    .await;
    let client = server.anthropic_client();
    let user = Message::User { text: "hi".into() };
    let (response, _) =
        complete(&client, &model_request("m", "", vec![user.clone()], Vec::new())).await;
    let response = response.unwrap();
    let history = vec![
        user,
        Message::Assistant {
            text: response.text.clone(),
            reasoning: response.reasoning.clone(),
            tool_calls: Vec::new(),
        },
        Message::User { text: "and?".into() },
    ];
    let (again, _) = complete(&client, &model_request("m", "", history, Vec::new())).await;
    assert!(again.is_ok());
    let content = server.received()[1].body["messages"][1]["content"].clone();
    let content = content.as_array().unwrap();
    assert_eq!(content.len(), 3);
    for (block, part) in content.iter().zip(&response.reasoning) {
        assert_eq!(
            block,
            &json!({"type": "redacted_thinking", "data": part.redacted.as_deref().unwrap()})
        );
    }
    assert_eq!(content[2], json!({"type": "text", "text": response.text}));
}

#[tokio::test]
async fn thinking_config_and_max_tokens_are_sent_when_configured() {
    let server = MockServer::start(vec![Reply::sse(anthropic_text_stream("ok"))]).await;
    let mut config = server.anthropic_config();
    config.max_tokens = 16000;
    config.thinking_budget_tokens = Some(4096);
    let client = AnthropicMessages::new(config).unwrap();
    let request = model_request("", "", vec![Message::User { text: "hi".into() }], Vec::new());
    let (result, _) = complete(&client, &request).await;
    assert!(result.is_ok(), "{result:?}");
    let body = &server.received()[0].body;
    // An empty request model falls back to the configured one.
    assert_eq!(body["model"], "claude-test");
    assert_eq!(body["max_tokens"], 16000);
    assert_eq!(body["thinking"], json!({"type": "enabled", "budget_tokens": 4096}));
    assert_eq!(body.get("system"), None, "an empty system prompt is not sent");
}

#[tokio::test]
async fn malformed_call_arguments_are_replayed_as_an_empty_object() {
    let request = model_request(
        "m",
        "",
        vec![
            Message::User { text: "write".into() },
            Message::Assistant {
                text: "   ".into(),
                reasoning: Vec::new(),
                tool_calls: vec![ToolCall {
                    call_id: ToolCallId::from("toolu_x"),
                    name: "make_file".into(),
                    arguments: Value::String("{\"filename\": \"taxes".into()),
                    arguments_error: Some("cut off".into()),
                }],
            },
            result("toolu_x", "make_file", Outcome::Error, "your call was cut off"),
        ],
        Vec::new(),
    );
    let body = sent_body(&request).await;
    // Whitespace-only text is not sent (the API rejects it); the input must be an object.
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_x", "name": "make_file", "input": {}}
        ]})
    );
}
