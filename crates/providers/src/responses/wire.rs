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

use std::borrow::Cow;

use keel_contracts::{Message, ModelRequest, ReasoningPart, ToolCall, ToolSchema};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::{arguments, lenient, tooling};

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
    /// `"none"` when tools are off but defined (see `crate::tooling`); else omitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'static str>,
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
    parameters: Cow<'a, ToolSchema>,
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
        let wire_tools = tooling::wire_tools(request);
        let tool_choice = wire_tools.none.then_some("none");
        let tools = wire_tools
            .defined
            .into_iter()
            .map(|tool| WireTool {
                kind: "function",
                name: tool.name,
                description: tool.description,
                parameters: tool.parameters,
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
            tool_choice,
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
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) output_index: Option<u64>,
    /// Which summary part of a reasoning item a summary event is about.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) summary_index: Option<u64>,
    /// `response.output_item.added` / `.done`.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) item: Option<OutputItem>,
    /// Text, argument and summary deltas.
    #[serde(deserialize_with = "lenient::text")]
    pub(crate) delta: Option<String>,
    /// `response.function_call_arguments.done`.
    #[serde(deserialize_with = "lenient::text")]
    pub(crate) arguments: Option<String>,
    /// `response.completed`, `.incomplete`, `.failed`.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) response: Option<ResponseObject>,
}

/// The response object (also a whole non-streaming body).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct ResponseObject {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) status: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) output: Option<Vec<OutputItem>>,
    /// The usage object as sent (kept raw; read with [`WireUsage`]).
    pub(crate) usage: Option<Value>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) incomplete_details: Option<IncompleteDetails>,
    pub(crate) error: Option<Value>,
}

/// `response.incomplete_details`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct IncompleteDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) reason: Option<String>,
}

/// An output item: a message, a function call, a reasoning item, or an item of another
/// kind (a hosted tool's call, or a call of a tool type keel never declares).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct OutputItem {
    /// The item's id (`msg_…`, `fc_…`, `rs_…`): how the final `output` names the items
    /// that streamed.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) id: Option<String>,
    #[serde(rename = "type")]
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) status: Option<String>,
    /// A message's content parts (`output_text`, `refusal`).
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) content: Option<Vec<ContentPartOut>>,
    /// A function call's fields.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) call_id: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) name: Option<String>,
    #[serde(deserialize_with = "lenient::text")]
    pub(crate) arguments: Option<String>,
    /// A reasoning item's fields.
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) summary: Option<Vec<ContentPartOut>>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) encrypted_content: Option<String>,
    /// A `custom_tool_call`'s free-form input.
    #[serde(deserialize_with = "lenient::text")]
    pub(crate) input: Option<String>,
    /// A `local_shell_call`'s or `shell_call`'s action, an `apply_patch_call`'s operation.
    pub(crate) action: Option<Value>,
    pub(crate) operation: Option<Value>,
    /// Who runs a tool-search call (`client` or `server`).
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) execution: Option<String>,
    /// Where a `shell_call` runs: absent or `local` on the client, a container on the
    /// server.
    pub(crate) environment: Option<Value>,
}

/// A content or summary part of an output item.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(default)]
pub(crate) struct ContentPartOut {
    #[serde(rename = "type")]
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) kind: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) text: Option<String>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) refusal: Option<String>,
}

/// `response.usage`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct WireUsage {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) total_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) input_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) input_tokens_details: Option<InputTokensDetails>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) output_tokens: Option<u64>,
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) output_tokens_details: Option<OutputTokensDetails>,
}

/// `usage.input_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct InputTokensDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) cached_tokens: Option<u64>,
}

/// `usage.output_tokens_details`.
#[derive(Debug, Default, Clone, Copy, Deserialize)]
#[serde(default)]
pub(crate) struct OutputTokensDetails {
    #[serde(deserialize_with = "lenient::option")]
    pub(crate) reasoning_tokens: Option<u64>,
}
