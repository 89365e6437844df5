//! Tools-off requests whose history holds tool calls, on all three wire APIs, against local
//! servers that enforce each API's tool rules (`harness::ToolRules`): the budget stop's
//! report step (tools defined, `ToolChoice::None`) and a compaction summary request (no
//! tools offered, `ToolChoice::None`) both succeed, and the server really refuses the shape
//! keel used to send (tool blocks without tools).

use keel_contracts::{
    Message, ModelClient, ModelRequest, Outcome, RequestPurpose, ToolCall, ToolCallId, ToolChoice,
    ToolDefinition,
};
use serde_json::{Value, json};

use super::harness::{
    MockServer, Reply, TEST_KEY, ToolRules, anthropic_text_stream, complete, model_request,
    text_stream,
};

/// A complete Responses API stream that says `text`.
fn responses_stream(text: &str) -> String {
    let message = json!({"id": "msg_1", "type": "message", "status": "completed",
        "role": "assistant", "content": [{"type": "output_text", "text": text}]});
    [
        json!({"type": "response.output_item.added", "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}),
        json!({"type": "response.output_text.delta", "output_index": 0, "delta": text}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": message}),
        json!({"type": "response.completed", "response": {"status": "completed",
            "output": [message], "usage": {"input_tokens": 9, "output_tokens": 4, "total_tokens": 13}}}),
    ]
    .iter()
    .map(|event| format!("event: {}\ndata: {event}\n\n", event["type"].as_str().unwrap()))
    .collect()
}

fn read_file() -> ToolDefinition {
    ToolDefinition {
        name: "read_file".into(),
        description: "Read a file.".into(),
        parameters: json!({"type": "object", "properties": {"path": {"type": "string"}}}).into(),
    }
}

/// A history with one tool call and its result, as the budget stop's report step sees it.
fn history() -> Vec<Message> {
    vec![
        Message::User { text: "Read a.txt, then report.".into() },
        Message::Assistant {
            text: "Reading it.".into(),
            reasoning: Vec::new(),
            tool_calls: vec![ToolCall {
                call_id: ToolCallId::from("call_1"),
                name: "read_file".into(),
                arguments: json!({"path": "a.txt"}),
                arguments_error: None,
            }],
        },
        Message::ToolResult {
            call_id: ToolCallId::from("call_1"),
            tool: "read_file".into(),
            outcome: Outcome::Ok,
            content: "hello".into(),
        },
        Message::User { text: "Budget reached: write your report, no more tools.".into() },
    ]
}

/// The budget stop's report step: tools defined, but off.
fn report_step() -> ModelRequest {
    let mut request = model_request("test-model", "You are a test.", history(), vec![read_file()]);
    request.tool_choice = ToolChoice::None;
    request
}

/// A compaction summary request: no tools offered, tools off, tool calls in the history.
fn compaction() -> ModelRequest {
    let mut request = model_request("test-model", "Summarise.", history(), Vec::new());
    request.tool_choice = ToolChoice::None;
    request.purpose = RequestPurpose::Compaction;
    request
}

#[derive(Debug, Clone, Copy)]
enum Wire {
    Chat,
    Responses,
    Messages,
}

impl Wire {
    const ALL: [Wire; 3] = [Wire::Chat, Wire::Responses, Wire::Messages];

    async fn server(self) -> MockServer {
        match self {
            Wire::Chat => {
                MockServer::enforcing(ToolRules::Chat, vec![Reply::sse(text_stream("Report."))])
                    .await
            }
            Wire::Responses => {
                MockServer::enforcing(
                    ToolRules::Responses,
                    vec![Reply::sse(responses_stream("Report."))],
                )
                .await
            }
            Wire::Messages => {
                MockServer::enforcing(
                    ToolRules::Messages,
                    vec![Reply::sse(anthropic_text_stream("Report."))],
                )
                .await
            }
        }
    }

    fn client(self, server: &MockServer) -> Box<dyn ModelClient> {
        match self {
            Wire::Chat => Box::new(server.client()),
            Wire::Responses => Box::new(server.responses_client()),
            Wire::Messages => Box::new(server.anthropic_client()),
        }
    }

    /// The wire API's "tools off" `tool_choice`.
    fn none(self) -> Value {
        match self {
            Wire::Chat | Wire::Responses => json!("none"),
            Wire::Messages => json!({"type": "none"}),
        }
    }

    /// The names of the tools a request body defines.
    fn tool_names(self, body: &Value) -> Vec<String> {
        body["tools"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|tool| {
                let name = match self {
                    Wire::Chat => &tool["function"]["name"],
                    Wire::Responses | Wire::Messages => &tool["name"],
                };
                name.as_str().unwrap().to_owned()
            })
            .collect()
    }
}

#[tokio::test]
async fn tools_off_report_step_with_tool_history_is_accepted_on_every_wire_api() {
    for wire in Wire::ALL {
        let server = wire.server().await;
        let (result, _) = complete(wire.client(&server).as_ref(), &report_step()).await;
        assert_eq!(result.unwrap().text, "Report.", "{wire:?}");
        let body = &server.received()[0].body;
        assert_eq!(wire.tool_names(body), ["read_file"], "{wire:?}: the tools stay defined");
        assert_eq!(body["tool_choice"], wire.none(), "{wire:?}: and may not be called");
        assert_eq!(server.n_requests(), 1, "{wire:?}");
    }
}

#[tokio::test]
async fn tools_off_compaction_with_tool_history_defines_stub_tools_on_every_wire_api() {
    for wire in Wire::ALL {
        let server = wire.server().await;
        let (result, _) = complete(wire.client(&server).as_ref(), &compaction()).await;
        assert_eq!(result.unwrap().text, "Report.", "{wire:?}");
        let body = &server.received()[0].body;
        assert_eq!(wire.tool_names(body), ["read_file"], "{wire:?}: a stub for the history");
        assert_eq!(body["tool_choice"], wire.none(), "{wire:?}");
        let text = body.to_string();
        assert!(text.contains("not available in this request"), "{wire:?}: {text}");
    }
}

#[tokio::test]
async fn tools_on_requests_send_no_tool_choice_and_tool_less_requests_no_tools() {
    for wire in Wire::ALL {
        let server = wire.server().await;
        let request = model_request("test-model", "s", history(), vec![read_file()]);
        let (result, _) = complete(wire.client(&server).as_ref(), &request).await;
        assert_eq!(result.unwrap().text, "Report.", "{wire:?}");
        let plain =
            model_request("test-model", "s", vec![Message::User { text: "hi".into() }], Vec::new());
        let mut off = plain.clone();
        off.tool_choice = ToolChoice::None;
        for request in [plain, off] {
            let (result, _) = complete(wire.client(&server).as_ref(), &request).await;
            assert_eq!(result.unwrap().text, "Report.", "{wire:?}");
        }
        let received = server.received();
        assert_eq!(wire.tool_names(&received[0].body), ["read_file"], "{wire:?}");
        assert!(received[0].body.get("tool_choice").is_none(), "{wire:?}: auto is the default");
        for later in &received[1..] {
            assert!(later.body.get("tools").is_none(), "{wire:?}: {}", later.body);
            assert!(later.body.get("tool_choice").is_none(), "{wire:?}: {}", later.body);
        }
    }
}

#[tokio::test]
async fn enforcing_servers_refuse_tool_history_without_tools_like_the_real_apis() {
    // The shape keel used to send for a tools-off step: the history's tool blocks, no
    // tools. Posted raw, so the rule is shown to bite.
    let anthropic = json!({"model": "m", "max_tokens": 16, "stream": true, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read_file", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]}]});
    let chat = json!({"model": "m", "stream": true, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "t1", "type": "function",
            "function": {"name": "read_file", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "x"}], "tool_choice": "none"});
    let responses = json!({"model": "m", "stream": true, "input": [
        {"type": "function_call", "call_id": "t1", "name": "read_file", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "t1", "output": "x"}]});
    let http = reqwest::Client::new();
    for (wire, body, path) in [
        (Wire::Messages, anthropic, "/v1/messages"),
        (Wire::Chat, chat, "/v1/chat/completions"),
        (Wire::Responses, responses, "/v1/responses"),
    ] {
        let server = wire.server().await;
        let reply = http
            .post(format!("{}{path}", server.root_url))
            .header("x-api-key", TEST_KEY)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(reply.status().as_u16(), 400, "{wire:?}");
        let error: Value = reply.json().await.unwrap();
        assert!(error.to_string().contains("tool"), "{wire:?}: {error}");
    }
}
