//! The Responses API wire format: the request body keel sends and the lenient shapes of
//! the stream events it reads back.
//!
//! Format sources: the OpenAI API reference, "Create a model response"
//! (<https://platform.openai.com/docs/api-reference/responses/create>), "Streaming
//! events" (<https://platform.openai.com/docs/api-reference/responses-streaming>) and the
//! reasoning guide's "Encrypted reasoning items"
//! (<https://platform.openai.com/docs/guides/reasoning#encrypted-reasoning-items>).
//!
//! Request invariants:
//! - keel keeps the conversation, so requests are stateless: `store: false`, no
//!   `previous_response_id`, and `include: ["reasoning.encrypted_content"]` so reasoning
//!   comes back in a form that can be replayed.
//! - An assistant message becomes, in order: its reasoning items (`encrypted_content` from
//!   [`ReasoningPart::redacted`], byte-exact, with the summary text), an assistant
//!   `message` with its text, and one `function_call` item per call. Each keel tool result
//!   becomes a `function_call_output` item. Items carry no `id`: with `store: false` the
//!   server keeps none to refer to.
//! - A reasoning part without encrypted content cannot be replayed statelessly and is not
//!   sent.
//! - Function tools are sent with `strict: false`: keel's tool schemas are plain JSON
//!   Schema, not the strict subset.

use keel_contracts::{Message, ModelRequest, ReasoningPart, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::arguments;

/// What the caller may set besides the conversation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RequestSettings<'a> {
    pub(crate) model: &'a str,
    pub(crate) reasoning_effort: Option<&'a str>,
    pub(crate) reasoning_summary: Option<&'a str>,
    pub(crate) max_output_tokens: Option<u32>,
}

/// The body of `POST /responses`.
#[derive(Debug, Serialize)]
pub(crate) struct ResponsesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    input: Vec<InputItem<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    stream: bool,
    store: bool,
    include: [&'static str; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning: Option<ReasoningConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u32>,
}

#[derive(Debug, Serialize)]
struct ReasoningConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    effort: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    summary: Option<&'a str>,
}

/// One item of `input`.
#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum InputItem<'a> {
    Message { role: &'static str, content: Vec<ContentPart<'a>> },
    Reasoning { summary: Vec<SummaryPart<'a>>, encrypted_content: &'a str },
    FunctionCall { call_id: &'a str, name: &'a str, arguments: String },
    FunctionCallOutput { call_id: &'a str, output: &'a str },
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum ContentPart<'a> {
    InputText { text: &'a str },
    OutputText { text: &'a str },
}

#[derive(Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum SummaryPart<'a> {
    SummaryText { text: &'a str },
}

#[derive(Debug, Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    strict: bool,
}

impl<'a> ResponsesRequest<'a> {
    /// Builds the streaming request for `request` (see the module's invariants).
    pub(crate) fn streaming(settings: RequestSettings<'a>, request: &'a ModelRequest) -> Self {
        let mut input = Vec::with_capacity(request.messages.len());
        for message in &request.messages {
            match message {
                Message::User { text } => input.push(InputItem::Message {
                    role: "user",
                    content: vec![ContentPart::InputText { text }],
                }),
                Message::Assistant { text, reasoning, tool_calls } => {
                    input.extend(reasoning.iter().filter_map(reasoning_item));
                    if !text.is_empty() {
                        input.push(InputItem::Message {
                            role: "assistant",
                            content: vec![ContentPart::OutputText { text }],
                        });
                    }
                    input.extend(tool_calls.iter().map(function_call_item));
                }
                Message::ToolResult { call_id, tool: _, outcome: _, content } => {
                    input.push(InputItem::FunctionCallOutput {
                        call_id: call_id.as_str(),
                        output: content,
                    });
                }
            }
        }
        let tools = request
            .tools
            .iter()
            .map(|tool| WireTool {
                kind: "function",
                name: &tool.name,
                description: &tool.description,
                parameters: &tool.parameters,
                strict: false,
            })
            .collect();
        let reasoning = (settings.reasoning_effort.is_some()
            || settings.reasoning_summary.is_some())
        .then_some(ReasoningConfig {
            effort: settings.reasoning_effort,
            summary: settings.reasoning_summary,
        });
        ResponsesRequest {
            model: settings.model,
            instructions: Some(request.system.as_str()).filter(|system| !system.is_empty()),
            input,
            tools,
            stream: true,
            store: false,
            include: ["reasoning.encrypted_content"],
            reasoning,
            max_output_tokens: settings.max_output_tokens,
        }
    }
}

fn reasoning_item(part: &ReasoningPart) -> Option<InputItem<'_>> {
    let Some(encrypted_content) = part.redacted.as_deref().filter(|data| !data.is_empty()) else {
        tracing::debug!("reasoning without encrypted content cannot be replayed statelessly");
        return None;
    };
    let summary = if part.text.is_empty() {
        Vec::new()
    } else {
        vec![SummaryPart::SummaryText { text: &part.text }]
    };
    Some(InputItem::Reasoning { summary, encrypted_content })
}

fn function_call_item(tool_call: &ToolCall) -> InputItem<'_> {
    InputItem::FunctionCall {
        call_id: tool_call.call_id.as_str(),
        name: &tool_call.name,
        arguments: arguments::text(tool_call),
    }
}

/// One stream event's `data`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StreamEvent {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) output_index: Option<u64>,
    /// Which summary part of a reasoning item a summary event is about.
    pub(crate) summary_index: Option<u64>,
    /// `response.output_item.added` / `.done`.
    pub(crate) item: Option<OutputItem>,
    /// Text, argument and summary deltas.
    pub(crate) delta: Option<String>,
    /// `response.function_call_arguments.done`.
    pub(crate) arguments: Option<String>,
    /// `response.completed`, `.incomplete`, `.failed`.
    pub(crate) response: Option<ResponseObject>,
}

/// The response object (also a whole non-streaming body).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ResponseObject {
    pub(crate) status: Option<String>,
    pub(crate) output: Option<Vec<OutputItem>>,
    pub(crate) usage: Option<WireUsage>,
    pub(crate) incomplete_details: Option<IncompleteDetails>,
    pub(crate) error: Option<Value>,
}

/// `response.incomplete_details`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct IncompleteDetails {
    pub(crate) reason: Option<String>,
}

/// An output item: a message, a function call or a reasoning item (others are ignored).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct OutputItem {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) status: Option<String>,
    /// A message's content parts (`output_text`, `refusal`).
    pub(crate) content: Option<Vec<ContentPartOut>>,
    /// A function call's fields.
    pub(crate) call_id: Option<String>,
    pub(crate) name: Option<String>,
    pub(crate) arguments: Option<String>,
    /// A reasoning item's fields.
    pub(crate) summary: Option<Vec<ContentPartOut>>,
    pub(crate) encrypted_content: Option<String>,
}

/// A content or summary part of an output item.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ContentPartOut {
    #[serde(rename = "type")]
    pub(crate) kind: Option<String>,
    pub(crate) text: Option<String>,
    pub(crate) refusal: Option<String>,
}

/// `response.usage`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct WireUsage {
    pub(crate) input_tokens: Option<u64>,
    pub(crate) input_tokens_details: Option<InputTokensDetails>,
    pub(crate) output_tokens: Option<u64>,
    pub(crate) output_tokens_details: Option<OutputTokensDetails>,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct InputTokensDetails {
    pub(crate) cached_tokens: Option<u64>,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct OutputTokensDetails {
    pub(crate) reasoning_tokens: Option<u64>,
}
