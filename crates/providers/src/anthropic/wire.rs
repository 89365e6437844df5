//! The Messages API wire format: the request body keel sends and the lenient shapes of the
//! stream events it reads back.
//!
//! Format sources: Anthropic's API reference, "Messages"
//! (<https://docs.anthropic.com/en/api/messages>), "Streaming Messages"
//! (<https://docs.anthropic.com/en/docs/build-with-claude/streaming>) and "Extended
//! thinking" (<https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking>).
//!
//! Request invariants (what the API demands of a history):
//! - `system` is top-level; `messages` alternate `user` and `assistant`: consecutive keel
//!   messages of the same role are merged into one wire message, in order.
//! - A keel `ToolResult` is a `tool_result` block of a user message; consecutive results and
//!   a following keel `User` message share that one user message, results first.
//! - An assistant message carries its `thinking` blocks (text and signature byte-exact) and
//!   `redacted_thinking` blocks (data unchanged) first, then its text, then its `tool_use`
//!   blocks. A thinking block without text or without a signature is never sent (B06: the
//!   API rejects it and every later request of the session would fail); it is dropped with
//!   a warning, the rest of the message is kept.
//! - Empty or whitespace-only text is never sent as a block (the API rejects it).
//!
//! Response types accept what the API and compatible proxies send: every field is
//! optional, unknown fields and unknown block or delta types are ignored.

use std::borrow::Cow;

use keel_contracts::{Message, ModelRequest, Outcome, ReasoningPart, ToolCall, ToolSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{lenient, tooling};

/// The body of `POST /v1/messages`.
#[derive(Debug, Serialize)]
pub(crate) struct MessagesRequest<'a> {
    model: &'a str,
    max_tokens: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<&'a str>,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    /// `{"type": "none"}` when tools are off but defined (see `crate::tooling`).
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<WireToolChoice>,
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<ThinkingConfig>,
}

/// `tool_choice: {"type": "none"}`: the model may not call the defined tools.
#[derive(Debug, Serialize)]
struct WireToolChoice {
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `thinking: {"type": "enabled", "budget_tokens": N}`.
#[derive(Debug, Serialize)]
struct ThinkingConfig {
    #[serde(rename = "type")]
    kind: &'static str,
    budget_tokens: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Role {
    User,
    Assistant,
}

#[derive(Debug, Serialize)]
struct WireMessage<'a> {
    role: Role,
    content: Vec<Block<'a>>,
}

/// A content block of a request message.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Block<'a> {
    Text {
        text: &'a str,
    },
    Thinking {
        thinking: &'a str,
        signature: &'a str,
    },
    RedactedThinking {
        data: &'a str,
    },
    ToolUse {
        id: &'a str,
        name: &'a str,
        input: Cow<'a, Value>,
    },
    ToolResult {
        tool_use_id: &'a str,
        #[serde(skip_serializing_if = "str::is_empty")]
        content: &'a str,
        #[serde(skip_serializing_if = "is_false")]
        is_error: bool,
    },
}

fn is_false(value: &bool) -> bool {
    !*value
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    description: &'a str,
    input_schema: Cow<'a, ToolSchema>,
}

/// What the request builder needs besides the request itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestSettings<'a> {
    pub(crate) model: &'a str,
    pub(crate) max_tokens: u32,
    pub(crate) thinking_budget_tokens: Option<u32>,
}

impl<'a> MessagesRequest<'a> {
    /// Builds the streaming request for `request` (see the module's invariants).
    pub(crate) fn streaming(settings: RequestSettings<'a>, request: &'a ModelRequest) -> Self {
        let mut messages = History::default();
        for message in &request.messages {
            match message {
                Message::User { text } => messages.push_text(Role::User, text),
                Message::Assistant { text, reasoning, tool_calls } => {
                    for part in reasoning {
                        if let Some(block) = reasoning_block(part) {
                            messages.push(Role::Assistant, block);
                        }
                    }
                    messages.push_text(Role::Assistant, text);
                    for tool_call in tool_calls {
                        messages.push(Role::Assistant, tool_use_block(tool_call));
                    }
                }
                Message::ToolResult { call_id, tool: _, outcome, content } => messages.push(
                    Role::User,
                    Block::ToolResult {
                        tool_use_id: call_id.as_str(),
                        content,
                        is_error: *outcome != Outcome::Ok,
                    },
                ),
            }
        }
        let wire_tools = tooling::wire_tools(request);
        let tool_choice = wire_tools.none.then_some(WireToolChoice { kind: "none" });
        let tools = wire_tools
            .defined
            .into_iter()
            .map(|tool| WireTool {
                name: tool.name,
                description: tool.description,
                input_schema: tool.parameters,
            })
            .collect();
        MessagesRequest {
            model: settings.model,
            max_tokens: settings.max_tokens,
            system: Some(request.system.as_str()).filter(|system| !system.trim().is_empty()),
            messages: messages.0,
            tools,
            tool_choice,
            stream: true,
            thinking: settings
                .thinking_budget_tokens
                .map(|budget_tokens| ThinkingConfig { kind: "enabled", budget_tokens }),
        }
    }
}

/// Wire messages under construction: a block of the same role as the last message joins
/// it, so roles alternate.
#[derive(Debug, Default)]
struct History<'a>(Vec<WireMessage<'a>>);

impl<'a> History<'a> {
    fn push(&mut self, role: Role, block: Block<'a>) {
        match self.0.last_mut() {
            Some(last) if last.role == role => last.content.push(block),
            _ => self.0.push(WireMessage { role, content: vec![block] }),
        }
    }

    fn push_text(&mut self, role: Role, text: &'a str) {
        if !text.trim().is_empty() {
            self.push(role, Block::Text { text });
        }
    }
}

/// The block that replays `part`, or `None` (with a warning) when it cannot be sent.
fn reasoning_block(part: &ReasoningPart) -> Option<Block<'_>> {
    if let Some(data) = part.redacted.as_deref().filter(|data| !data.is_empty()) {
        return Some(Block::RedactedThinking { data });
    }
    match part.signature.as_deref().filter(|signature| !signature.is_empty()) {
        Some(signature) if !part.text.is_empty() => {
            Some(Block::Thinking { thinking: &part.text, signature })
        }
        _ => {
            tracing::warn!(
                has_text = !part.text.is_empty(),
                has_signature = part.signature.is_some(),
                "dropping a thinking block without text or signature from the request"
            );
            None
        }
    }
}

/// A `tool_use` block. The API wants `input` to be an object: a call whose arguments did
/// not parse (kept as raw text, with `arguments_error`) is replayed with `{}`; its
/// `tool_result` already tells the model what was wrong.
fn tool_use_block(tool_call: &ToolCall) -> Block<'_> {
    let input = match &tool_call.arguments {
        arguments @ Value::Object(_) if tool_call.arguments_error.is_none() => {
            Cow::Borrowed(arguments)
        }
        _ => Cow::Owned(Value::Object(serde_json::Map::new())),
    };
    Block::ToolUse { id: tool_call.call_id.as_str(), name: &tool_call.name, input }
}

/// One stream event's `data` (or a whole non-streaming body, whose `type` is `message`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StreamEvent {
    #[serde(rename = "type")]
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    /// `message_start`'s message.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) message: Option<MessageStart>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) index: Option<u64>,
    /// `content_block_start`'s block.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) content_block: Option<ContentBlock>,
    /// `content_block_delta`'s or `message_delta`'s delta (the fields of both).
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) delta: Option<EventDelta>,
    /// `message_delta`'s cumulative usage (or a whole message's), as sent.
    pub(crate) usage: Option<Value>,
    /// An `error` event's error.
    pub(crate) error: Option<Value>,
    /// A whole message body (`type: message`): its blocks and stop reason.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) content: Option<Vec<ContentBlock>>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) stop_reason: Option<String>,
    pub(crate) stop_details: Option<Value>,
}

/// `message_start.message`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MessageStart {
    /// The message id: a second `message_start` with another id is a spliced stream.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) id: Option<String>,
    /// The usage so far, as sent.
    pub(crate) usage: Option<Value>,
}

/// A content block as it starts (or whole, in a non-streaming body).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ContentBlock {
    #[serde(rename = "type")]
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) text: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) thinking: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) signature: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) data: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) name: Option<String>,
    pub(crate) input: Option<Value>,
}

/// The fields of a block delta and of a message delta.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct EventDelta {
    #[serde(rename = "type")]
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) text: Option<String>,
    #[serde(deserialize_with = "lenient::text")]
    pub(crate) partial_json: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) thinking: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) signature: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) stop_reason: Option<String>,
    pub(crate) stop_details: Option<Value>,
}

/// A `usage` object (of `message_start.message` or of `message_delta`).
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct WireUsage {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) cache_creation_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) cache_read_input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) output_tokens: Option<u64>,
}

impl WireUsage {
    /// Lays the fields `later` reports over these (`message_delta` counts are cumulative).
    pub(crate) fn update(&mut self, later: &WireUsage) {
        let pairs = [
            (&mut self.input_tokens, later.input_tokens),
            (&mut self.cache_creation_input_tokens, later.cache_creation_input_tokens),
            (&mut self.cache_read_input_tokens, later.cache_read_input_tokens),
            (&mut self.output_tokens, later.output_tokens),
        ];
        for (field, value) in pairs {
            if value.is_some() {
                *field = value;
            }
        }
    }
}
