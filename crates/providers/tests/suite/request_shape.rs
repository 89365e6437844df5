//! The request body and headers keel sends, checked against a recorded OpenAI request.

use keel_contracts::{Message, ModelRequest, Outcome, ToolCall, ToolCallId, ToolDefinition};
use serde_json::{Value, json};

use super::harness::{
    MockServer, Reply, TEST_KEY, complete, model_request, recording, text_stream,
};

/// The conversation of recording 01's request, in keel's terms.
fn recorded_conversation() -> ModelRequest {
    let call_id = ToolCallId::from("call_ZR5UUuTt3pf61kjwAJIYdVMj");
    model_request(
        "gpt-4o-mini",
        "",
        vec![
            Message::User {
                text: "What is the capital of the UK? Use the tool, then answer.".into(),
            },
            Message::Assistant {
                text: String::new(),
                reasoning: Vec::new(),
                tool_calls: vec![ToolCall {
                    call_id: call_id.clone(),
                    name: "get_capital".into(),
                    arguments: json!({"country": "UK"}),
                    arguments_error: None,
                }],
            },
            Message::ToolResult {
                call_id,
                tool: "get_capital".into(),
                outcome: Outcome::Ok,
                content: "London".into(),
            },
        ],
        vec![ToolDefinition {
            name: "get_capital".into(),
            description: String::new(),
            parameters: json!({
                "additionalProperties": false,
                "properties": {"country": {"type": "string"}},
                "required": ["country"],
                "type": "object"
            })
            .into(),
        }],
    )
}

#[tokio::test]
async fn request_body_matches_the_recorded_openai_request() {
    let recorded = recording("01-openai-stream-text-usage-in-last-chunk");
    let server = MockServer::start(vec![Reply::recorded(&recorded)]).await;
    let (result, _) = complete(&server.client(), &recorded_conversation()).await;
    assert_eq!(result.unwrap().text, "The capital of the UK is London.");

    // keel sends what pydantic-ai sent, minus the options it does not use
    // (`tool_choice`, `strict`).
    let mut expected: Value = recorded["request"]["body"].clone();
    expected.as_object_mut().unwrap().remove("tool_choice");
    expected["tools"][0]["function"].as_object_mut().unwrap().remove("strict");
    let received = server.received();
    assert_eq!(received.len(), 1);
    assert_eq!(received[0].body, expected);
    assert_eq!(received[0].authorization.as_deref(), Some(format!("Bearer {TEST_KEY}").as_str()));
    assert!(received[0].accept.as_deref().unwrap().contains("text/event-stream"));
}

#[tokio::test]
async fn pre_serialized_tool_schemas_give_the_same_bytes_as_their_values() {
    // Tool schemas are serialized once per definition (`ToolSchema`) and spliced into each
    // body: the body must be byte for byte what serializing the values gives.
    let schema = json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "A \"quoted\" path\n\u{e9}"},
            "n": {"type": "number", "minimum": -0.5, "maximum": 1e300},
            "tags": {"type": "array", "items": {"enum": ["a", null, true, 3]}}
        },
        "required": ["path"],
        "additionalProperties": false
    });
    let server = MockServer::start(vec![Reply::sse(text_stream("ok"))]).await;
    let tool = ToolDefinition {
        name: "read_file".into(),
        description: "Reads \"a\" file.".into(),
        parameters: schema.clone().into(),
    };
    let request = model_request("m", "", vec![Message::User { text: "hi".into() }], vec![tool]);
    let (result, _) = complete(&server.client(), &request).await;
    assert!(result.is_ok(), "{result:?}");
    // The body as the wire structs serialize it (fields in their order), with the schema
    // serialized from its value as before.
    let expected = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"tools":[{{"type":"function","function":{{"name":"read_file","description":{},"parameters":{}}}}}],"stream":true,"stream_options":{{"include_usage":true}}}}"#,
        serde_json::to_string("Reads \"a\" file.").unwrap(),
        serde_json::to_string(&schema).unwrap()
    );
    let sent = &server.received()[0].raw_body;
    assert_eq!(std::str::from_utf8(sent).unwrap(), expected, "the same bytes");
}

#[tokio::test]
async fn system_prompt_comes_first_and_empty_tools_are_omitted() {
    let server = MockServer::start(vec![Reply::sse(text_stream("ok"))]).await;
    let request = model_request(
        "",
        "Be brief.",
        vec![
            Message::User { text: "hi".into() },
            Message::Assistant {
                text: "hello".into(),
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
            },
            Message::User { text: "again".into() },
        ],
        Vec::new(),
    );
    let (result, _) = complete(&server.client(), &request).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(
        server.received()[0].body,
        json!({
            // An empty request model falls back to the configured one.
            "model": "test-model",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "again"}
            ],
            "stream": true,
            "stream_options": {"include_usage": true}
        })
    );
}

#[tokio::test]
async fn malformed_call_arguments_are_sent_back_as_the_model_wrote_them() {
    let server = MockServer::start(vec![Reply::sse(text_stream("ok"))]).await;
    let raw = "{\"path\": \"a.txt\", \"con";
    let request = model_request(
        "m",
        "",
        vec![
            Message::User { text: "write".into() },
            Message::Assistant {
                text: "Writing.".into(),
                reasoning: Vec::new(),
                tool_calls: vec![ToolCall {
                    call_id: ToolCallId::from("c1"),
                    name: "write_file".into(),
                    arguments: Value::String(raw.into()),
                    arguments_error: Some("arguments are not valid JSON".into()),
                }],
            },
            Message::ToolResult {
                call_id: ToolCallId::from("c1"),
                tool: "write_file".into(),
                outcome: Outcome::Error,
                content: "invalid arguments".into(),
            },
        ],
        Vec::new(),
    );
    let (result, _) = complete(&server.client(), &request).await;
    assert!(result.is_ok(), "{result:?}");
    let body = &server.received()[0].body;
    assert_eq!(
        body["messages"][1],
        json!({"role": "assistant", "content": "Writing.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "write_file", "arguments": raw}}
        ]})
    );
    assert_eq!(
        body["messages"][2],
        json!({"role": "tool", "tool_call_id": "c1", "content": "invalid arguments"})
    );
}

#[tokio::test]
async fn no_authorization_header_without_a_key() {
    let server = MockServer::start(vec![Reply::sse(text_stream("ok"))]).await;
    let mut config = server.config();
    config.api_key = None;
    let client = keel_providers::OpenAiChat::new(config).unwrap();
    let (result, _) = complete(&client, &super::harness::simple_request()).await;
    assert!(result.is_ok(), "{result:?}");
    assert_eq!(server.received()[0].authorization, None);
}
