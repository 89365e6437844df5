//! Provider-neutral model messages: what the kernel sends and what a provider returns.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::{Outcome, ToolCallId};

/// One tool call proposed by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call (minted by the adapter when the provider sent none).
    pub call_id: ToolCallId,
    /// The tool name as the model spelled it.
    pub name: String,
    /// The parsed arguments. When they did not parse, this holds the raw text as a JSON
    /// string and [`ToolCall::arguments_error`] says why.
    pub arguments: serde_json::Value,
    /// Set when the streamed arguments were not valid JSON (or were cut off): such a call
    /// is reported to the model as malformed and never executed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arguments_error: Option<String>,
}

/// A reasoning ("thinking") block, kept byte-exact so it can be sent back to providers that
/// require it (Anthropic signatures, OpenAI encrypted reasoning).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReasoningPart {
    /// The visible reasoning text (empty for redacted blocks).
    #[serde(default)]
    pub text: String,
    /// The provider's signature over the text, when it sends one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
    /// Opaque redacted or encrypted content to replay verbatim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redacted: Option<String>,
}

/// Token usage as the provider reported it, normalised. `None` means "not reported",
/// never zero. Each token is counted once: `input_tokens + output_tokens +
/// reasoning_tokens` is what the provider bills (its `total_tokens`, when it sends one).
///
/// Whether a provider's completion count includes its reasoning tokens differs by wire API
/// and server; each adapter documents its rule (keel-providers: `usage_from_wire` of each
/// wire API), and [`ModelResponse::raw_usage`] keeps the provider's own figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cached ones (OpenAI `prompt_tokens`; Anthropic
    /// `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`).
    pub input_tokens: Option<u64>,
    /// Completion tokens excluding reasoning tokens, counted once.
    pub output_tokens: Option<u64>,
    /// Of `input_tokens`, those served from the provider's cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Reasoning tokens, counted separately from `output_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_tokens: Option<u64>,
}

/// Why the model stopped, normalized across providers.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum FinishReason {
    /// A natural end of the answer (`stop`, `end_turn`).
    Stop,
    /// The model wants tool results (`tool_calls`, `tool_use`).
    ToolCalls,
    /// The output limit cut the answer (`length`, `max_tokens`): truncated, never a success.
    Length,
    /// The provider's filter stopped the answer.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// Any other reason, as the provider spelled it.
    Other(String),
}

impl From<String> for FinishReason {
    fn from(value: String) -> Self {
        match value.as_str() {
            "stop" | "end_turn" | "stop_sequence" => FinishReason::Stop,
            "tool_calls" | "tool_use" | "function_call" => FinishReason::ToolCalls,
            "length" | "max_tokens" => FinishReason::Length,
            "content_filter" => FinishReason::ContentFilter,
            "refusal" => FinishReason::Refusal,
            _ => FinishReason::Other(value),
        }
    }
}

impl From<FinishReason> for String {
    fn from(value: FinishReason) -> Self {
        value.to_string()
    }
}

impl fmt::Display for FinishReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FinishReason::Stop => "stop",
            FinishReason::ToolCalls => "tool_calls",
            FinishReason::Length => "length",
            FinishReason::ContentFilter => "content_filter",
            FinishReason::Refusal => "refusal",
            FinishReason::Other(other) => other,
        })
    }
}

/// One message of the projected conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// The user's input for a turn.
    User {
        /// The input text.
        text: String,
    },
    /// A model response.
    Assistant {
        /// Visible text (may be empty).
        text: String,
        /// Reasoning blocks to send back verbatim.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<ReasoningPart>,
        /// Proposed tool calls; each is answered by a [`Message::ToolResult`] that follows.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    /// The answer to one tool call.
    ToolResult {
        /// The call this answers.
        call_id: ToolCallId,
        /// The tool's name.
        tool: String,
        /// How the call ended.
        outcome: Outcome,
        /// The text the model sees.
        content: String,
    },
}

/// A tool as the model sees it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The tool name.
    pub name: String,
    /// Its description.
    pub description: String,
    /// JSON Schema of its arguments.
    pub parameters: ToolSchema,
}

/// A tool's JSON Schema, serialized once.
///
/// Clones share one allocation (a reference count), and serializing it with serde_json
/// writes the JSON text made when it was built instead of walking the value again: the
/// same bytes as serializing the value compactly (`serde_json::to_string`), so request
/// bodies and digests are unchanged. Requests are built every model step and a run's tool
/// definitions do not change between steps, so this keeps the schemas out of each step's
/// allocation and escaping work. Reads go through the value ([`ToolSchema::value`], or
/// `Deref`); equality and `Debug` are the value's.
#[derive(Clone)]
pub struct ToolSchema(std::sync::Arc<SchemaParts>);

struct SchemaParts {
    value: serde_json::Value,
    /// `serde_json::to_string(&value)`; `None` only if that failed (it cannot for a
    /// `Value`, whose keys are strings), and then the value itself is serialized.
    json: Option<Box<serde_json::value::RawValue>>,
}

impl ToolSchema {
    /// Wraps `value`, serializing it once.
    pub fn new(value: serde_json::Value) -> ToolSchema {
        let json = serde_json::value::to_raw_value(&value).ok();
        ToolSchema(std::sync::Arc::new(SchemaParts { value, json }))
    }

    /// The schema.
    pub fn value(&self) -> &serde_json::Value {
        &self.0.value
    }

    /// The schema as compact JSON text (what serializing it writes).
    pub fn json(&self) -> std::borrow::Cow<'_, str> {
        match &self.0.json {
            Some(json) => std::borrow::Cow::Borrowed(json.get()),
            None => std::borrow::Cow::Owned(self.0.value.to_string()),
        }
    }
}

impl From<serde_json::Value> for ToolSchema {
    fn from(value: serde_json::Value) -> ToolSchema {
        ToolSchema::new(value)
    }
}

impl std::ops::Deref for ToolSchema {
    type Target = serde_json::Value;

    fn deref(&self) -> &serde_json::Value {
        &self.0.value
    }
}

impl PartialEq for ToolSchema {
    fn eq(&self, other: &ToolSchema) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0) || self.0.value == other.0.value
    }
}

impl PartialEq<serde_json::Value> for ToolSchema {
    fn eq(&self, other: &serde_json::Value) -> bool {
        self.0.value == *other
    }
}

impl fmt::Debug for ToolSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0.value, f)
    }
}

impl Serialize for ToolSchema {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0.json {
            Some(json) => json.serialize(serializer),
            None => self.0.value.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for ToolSchema {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<ToolSchema, D::Error> {
        serde_json::Value::deserialize(deserializer).map(ToolSchema::new)
    }
}

/// Everything a provider needs for one model call, projected from the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The model name as the provider knows it.
    pub model: String,
    /// The system prompt (keel's instructions plus workspace instructions such as AGENTS.md).
    pub system: String,
    /// The conversation, oldest first; tool calls and results always paired.
    pub messages: Vec<Message>,
    /// Tools defined for this request. With [`ToolChoice::None`] they stay defined (a
    /// history with tool calls needs them on some wire APIs) but may not be called; an
    /// empty list also means tools are off.
    pub tools: Vec<ToolDefinition>,
    /// Whether the model may call [`ModelRequest::tools`] in this response.
    #[serde(default, skip_serializing_if = "ToolChoice::is_auto")]
    pub tool_choice: ToolChoice,
    /// The number of model responses already recorded in this session's ledger.
    /// Deterministic models (the scripted model) use it as their position.
    pub responses_in_session: u64,
    /// What the request is for.
    #[serde(default)]
    pub purpose: RequestPurpose,
}

/// Whether the model may call tools in one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides (the wire APIs' default).
    #[default]
    Auto,
    /// Tools are off: the model must answer in text. The tool definitions are still sent
    /// when the request has any (`tool_choice: "none"` on OpenAI's APIs,
    /// `{"type": "none"}` on Anthropic's).
    None,
}

impl ToolChoice {
    /// Whether this is [`ToolChoice::Auto`] (the serialized default, omitted).
    pub fn is_auto(&self) -> bool {
        *self == ToolChoice::Auto
    }
}

/// What a model request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequestPurpose {
    /// A step of the conversation.
    #[default]
    Conversation,
    /// A summary of earlier conversation for compaction (tools off).
    Compaction,
}

impl RequestPurpose {
    /// Whether this is [`RequestPurpose::Conversation`] (the default, left off the wire).
    pub fn is_conversation(&self) -> bool {
        matches!(self, RequestPurpose::Conversation)
    }
}

/// A whole model response, assembled from the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// Visible text.
    pub text: String,
    /// Reasoning blocks, kept for replay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasoning: Vec<ReasoningPart>,
    /// Proposed tool calls, in the provider's order.
    pub tool_calls: Vec<ToolCall>,
    /// Reported usage, normalised (see [`Usage`]).
    pub usage: Usage,
    /// The provider's own usage object(s), exactly as received: the JSON `usage` of the
    /// response (Chat Completions: the last chunk's; Responses: `response.usage`), or, for
    /// Anthropic, `{"message_start": {...}, "message_delta": {...}}`, the `usage` of
    /// `message_start` and of the last `message_delta` (a whole, unstreamed message's
    /// `usage` is under `message_delta`). `None` when the provider reported none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw_usage: Option<serde_json::Value>,
    /// Why the model stopped.
    pub finish_reason: FinishReason,
}

/// A piece of a response while it streams, for live display only (the ledger records the
/// assembled [`ModelResponse`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamDelta {
    /// Visible text.
    Text(String),
    /// Reasoning text.
    Reasoning(String),
    /// A tool call started streaming.
    ToolCallStarted {
        /// The tool's name.
        name: String,
    },
    /// The attempt failed and the client will send the request again after a wait: what
    /// was streamed so far is void (the next attempt streams from the start). Sent once per
    /// retry, before the wait.
    Retrying(RetryNotice),
}

/// A retry a [`crate::ModelClient`] is about to make, as it reports it through
/// [`StreamDelta::Retrying`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryNotice {
    /// The attempt about to be made: 2 for the first retry.
    pub attempt: u32,
    /// The failed attempt's HTTP status, when there was one.
    pub status: Option<u16>,
    /// The kind of failure, as [`crate::ModelErrorKind::as_str`] spells it.
    pub error: String,
    /// The failed attempt's message.
    pub message: String,
    /// The wait before the next attempt.
    pub wait: std::time::Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_choice_defaults_to_auto_and_is_omitted_then() {
        let request: ModelRequest = serde_json::from_value(serde_json::json!({
            "model": "m", "system": "", "messages": [], "tools": [], "responses_in_session": 0
        }))
        .unwrap();
        assert_eq!(request.tool_choice, ToolChoice::Auto);
        let json = serde_json::to_value(&request).unwrap();
        assert!(json.get("tool_choice").is_none(), "request hashes of tools-on steps unchanged");
        let off = ModelRequest { tool_choice: ToolChoice::None, ..request };
        let json = serde_json::to_value(&off).unwrap();
        assert_eq!(json["tool_choice"], "none");
        assert_eq!(serde_json::from_value::<ModelRequest>(json).unwrap(), off);
    }
}
