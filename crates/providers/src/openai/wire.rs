//! The Chat Completions wire format: the request body keel sends and the lenient shapes it
//! reads back.
//!
//! Format source: the OpenAI API reference, "Create chat completion"
//! (<https://platform.openai.com/docs/api-reference/chat/create>) and "The chat completion
//! chunk object" (<https://platform.openai.com/docs/api-reference/chat-streaming>).
//!
//! Response types accept what OpenAI-compatible servers actually send: every field is
//! optional, `null` is the same as absent, unknown fields are ignored, and loosely typed
//! fields (`content`, `reasoning`, `arguments`) are read as JSON values and interpreted
//! afterwards, so one odd field never makes a whole chunk unreadable.

use std::borrow::Cow;

use keel_contracts::{Message, ModelRequest, ToolCall, ToolSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{arguments, lenient, tooling};

/// The body of `POST /chat/completions`.
#[derive(Debug, Serialize)]
pub(crate) struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<WireMessage<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) tools: Vec<WireTool<'a>>,
    /// `"none"` when tools are off but defined (see `crate::tooling`); else omitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) tool_choice: Option<&'static str>,
    pub(super) stream: bool,
    pub(super) stream_options: StreamOptions,
}

#[derive(Debug, Serialize)]
pub(super) struct StreamOptions {
    include_usage: bool,
}

#[derive(Debug, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub(super) enum WireMessage<'a> {
    System {
        content: &'a str,
    },
    User {
        content: &'a str,
    },
    Assistant {
        /// `null` when the message is only tool calls, as OpenAI itself sends it.
        content: Option<&'a str>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<WireToolCall<'a>>,
    },
    Tool {
        tool_call_id: &'a str,
        content: &'a str,
    },
}

#[derive(Debug, Serialize)]
pub(super) struct WireToolCall<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunctionCall<'a>,
}

#[derive(Debug, Serialize)]
pub(super) struct WireFunctionCall<'a> {
    name: &'a str,
    /// The arguments as a JSON-encoded string, as the API requires.
    arguments: String,
}

#[derive(Debug, Serialize)]
pub(super) struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

#[derive(Debug, Serialize)]
pub(super) struct WireFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: Cow<'a, ToolSchema>,
}

impl<'a> ChatRequest<'a> {
    /// Builds the streaming request for `request`, addressed to `model`.
    ///
    /// The system prompt comes first (omitted when empty); reasoning parts are not sent
    /// back, since Chat Completions servers either ignore them or reject them.
    pub(crate) fn streaming(model: &'a str, request: &'a ModelRequest) -> Self {
        let mut messages = Vec::with_capacity(request.messages.len() + 1);
        if !request.system.is_empty() {
            messages.push(WireMessage::System { content: &request.system });
        }
        messages.extend(request.messages.iter().map(WireMessage::from_message));
        let wire_tools = tooling::wire_tools(request);
        let tools = wire_tools
            .defined
            .into_iter()
            .map(|tool| WireTool {
                kind: "function",
                function: WireFunction {
                    name: tool.name,
                    description: tool.description,
                    parameters: tool.parameters,
                },
            })
            .collect();
        ChatRequest {
            model,
            messages,
            tools,
            tool_choice: wire_tools.none.then_some("none"),
            stream: true,
            stream_options: StreamOptions { include_usage: true },
        }
    }
}

impl<'a> WireMessage<'a> {
    /// The wire form of a conversation message.
    pub(super) fn from_message(message: &'a Message) -> WireMessage<'a> {
        match message {
            Message::User { text } => WireMessage::User { content: text },
            Message::Assistant { text, reasoning: _, tool_calls } => WireMessage::Assistant {
                content: if text.is_empty() && !tool_calls.is_empty() { None } else { Some(text) },
                tool_calls: tool_calls.iter().map(wire_tool_call).collect(),
            },
            Message::ToolResult { call_id, tool: _, outcome: _, content } => {
                WireMessage::Tool { tool_call_id: call_id.as_str(), content }
            }
        }
    }
}

fn wire_tool_call(tool_call: &ToolCall) -> WireToolCall<'_> {
    WireToolCall {
        id: tool_call.call_id.as_str(),
        kind: "function",
        function: WireFunctionCall { name: &tool_call.name, arguments: arguments::text(tool_call) },
    }
}

/// One `chat.completion.chunk` (a streamed `data:` payload).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChatChunk {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) choices: Option<Vec<Choice>>,
    /// The usage object as sent (kept raw; read with [`WireUsage`]).
    pub(crate) usage: Option<Value>,
    /// An error reported inside the stream (OpenRouter and others).
    pub(crate) error: Option<Value>,
}

/// A non-streaming `chat.completion` body.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ChatCompletion {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) choices: Option<Vec<Choice>>,
    /// The usage object as sent (kept raw; read with [`WireUsage`]).
    pub(crate) usage: Option<Value>,
    pub(crate) error: Option<Value>,
}

/// A choice of a chunk (`delta`) or of a whole completion (`message`).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Choice {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) index: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) delta: Option<Delta>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) message: Option<Delta>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) finish_reason: Option<String>,
}

/// The content of a delta or of a whole message; both have the same fields.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Delta {
    pub(crate) content: Option<Value>,
    /// DeepSeek, xAI, vLLM and others.
    pub(crate) reasoning_content: Option<Value>,
    /// OpenRouter, Groq and others.
    pub(crate) reasoning: Option<Value>,
    pub(crate) refusal: Option<Value>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) tool_calls: Option<Vec<ToolCallDelta>>,
}

/// A fragment of a tool call (or a whole one, in a non-streaming message).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ToolCallDelta {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) index: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) function: Option<FunctionDelta>,
}

/// The `function` member of a tool-call fragment.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct FunctionDelta {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) name: Option<String>,
    /// A string fragment per the format; an object is accepted from lenient servers.
    pub(crate) arguments: Option<Value>,
}

/// The `usage` object.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct WireUsage {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) prompt_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) completion_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) total_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) prompt_tokens_details: Option<PromptTokensDetails>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) completion_tokens_details: Option<CompletionTokensDetails>,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct PromptTokensDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) cached_tokens: Option<u64>,
}

/// `usage.completion_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct CompletionTokensDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) reasoning_tokens: Option<u64>,
}

/// The visible text and the reasoning of a `content` field: a string is text; an array of
/// parts is split by part type: `{"type": "thinking", "thinking": …}` (Mistral's Magistral
/// models; `thinking` a string or an array of text parts) and `{"type": "reasoning", …}`
/// parts are reasoning, every other part's `text` is visible text.
pub(crate) fn content_of(value: Option<&Value>) -> (Option<String>, Option<String>) {
    let Some(Value::Array(parts)) = value else {
        return (text_of(value), None);
    };
    let mut text = String::new();
    let mut reasoning = String::new();
    for part in parts {
        let kind = part.get("type").and_then(Value::as_str);
        if matches!(kind, Some("thinking" | "reasoning")) {
            let inner = part.get("thinking").or_else(|| part.get("reasoning"));
            let inner = inner.or_else(|| part.get("text"));
            reasoning.push_str(&text_of(inner).unwrap_or_default());
        } else {
            text.push_str(&text_of(Some(part)).unwrap_or_default());
        }
    }
    (Some(text), Some(reasoning).filter(|reasoning| !reasoning.is_empty()))
}

/// The text of a loosely typed text field: a string, a `{"text": …}` part, or an array of
/// such parts (concatenated); anything else has no text.
pub(crate) fn text_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let text: String = parts
                .iter()
                .filter_map(|part| match part {
                    Value::String(text) => Some(text.as_str()),
                    Value::Object(fields) => fields.get("text").and_then(Value::as_str),
                    _ => None,
                })
                .collect();
            Some(text)
        }
        Value::Object(fields) => fields.get("text").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

/// The argument text of a fragment: a string as is, `null` as nothing, any other JSON
/// value re-encoded.
pub(crate) fn arguments_of(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::Null => None,
        Value::String(text) => Some(text.clone()),
        other => Some(other.to_string()),
    }
}
