//! Assembling Chat Completions chunks (or one whole message) into a [`ModelResponse`].
//!
//! Invariants:
//! - Tool-call fragments are routed by one rule (see [`ToolCallAssembler`]) that keeps
//!   servers which reuse an `index` for two calls apart (B02) and keeps servers which send
//!   a fresh id on every fragment together (B01).
//! - A call is never dropped: arguments that are empty become `{}`, arguments that do not
//!   parse are kept as the raw text with [`ToolCall::arguments_error`] set.
//! - The first finish reason is the one recorded; usage comes from whichever chunk carries
//!   it (usually the last, whose `choices` is empty).
//! - An error inside the stream is returned as an error, never folded into a success.
//!
//! The pieces: this module reads chunks, keeps text, reasoning and refusal, finishes the
//! response and maps its usage; `tool_calls` routes tool-call fragments to calls; `think`
//! splits an inline `<think>` block from the answer.
//!
//! [`ToolCall::arguments_error`]: keel_contracts::ToolCall::arguments_error

#[cfg(test)]
mod tests;
mod think;
mod tool_calls;

use keel_contracts::{
    FinishReason, ModelError, ModelErrorKind, ModelResponse, ReasoningPart, StreamDelta, Usage,
};
use serde_json::Value;

use super::wire::{self, ChatChunk, ChatCompletion, Delta, ToolCallDelta, WireUsage};
use crate::failure;
use crate::lenient;
use crate::transport::Flow;
use think::{Piece, ThinkSplitter};
use tool_calls::ToolCallAssembler;

/// The callback that receives live deltas.
pub(crate) type OnDelta<'a> = &'a (dyn Fn(StreamDelta) + Send + Sync);

/// Collects one response while it streams.
pub(crate) struct Assembler<'a> {
    on_delta: OnDelta<'a>,
    secret: Option<&'a str>,
    think: ThinkSplitter,
    text: String,
    reasoning: String,
    refusal: String,
    tool_calls: ToolCallAssembler,
    /// The last `usage` object, as sent.
    usage: Option<Value>,
    finish_reason: Option<FinishReason>,
}

impl std::fmt::Debug for Assembler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assembler")
            .field("text", &self.text)
            .field("reasoning", &self.reasoning)
            .field("tool_calls", &self.tool_calls)
            .field("usage", &self.usage)
            .field("finish_reason", &self.finish_reason)
            .finish_non_exhaustive()
    }
}

impl<'a> Assembler<'a> {
    /// A new, empty response; `secret` is redacted from any error message.
    pub(crate) fn new(on_delta: OnDelta<'a>, secret: Option<&'a str>) -> Self {
        Assembler {
            on_delta,
            secret,
            think: ThinkSplitter::default(),
            text: String::new(),
            reasoning: String::new(),
            refusal: String::new(),
            tool_calls: ToolCallAssembler::default(),
            usage: None,
            finish_reason: None,
        }
    }

    /// Whether a finish reason has been received.
    pub(crate) fn has_finish_reason(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// Applies one SSE event of a Chat Completions stream.
    ///
    /// # Errors
    ///
    /// An `event: error` frame or a chunk carrying an `error` object becomes the error it
    /// describes (see [`failure::in_band_error`]); a data payload that is not JSON is a
    /// [`ModelErrorKind::InvalidResponse`] error (not retried: the response arrived whole).
    pub(crate) fn apply_event(&mut self, event: &str, data: &str) -> Result<Flow, ModelError> {
        match event {
            "error" => {
                let value = serde_json::from_str::<Value>(data)
                    .unwrap_or_else(|_| Value::String(data.to_owned()));
                let error = value.get("error").unwrap_or(&value);
                Err(failure::in_band_error(error, self.secret))
            }
            "message" => {
                let data = data.trim();
                if data.is_empty() {
                    return Ok(Flow::Continue);
                }
                if data == "[DONE]" {
                    return Ok(Flow::Done);
                }
                let chunk: ChatChunk = lenient::parse(data).map_err(|error| {
                    ModelError::new(
                        ModelErrorKind::InvalidResponse,
                        None,
                        format!("malformed stream chunk: {error}"),
                    )
                })?;
                self.apply_chunk(chunk)?;
                Ok(Flow::Continue)
            }
            other => {
                tracing::debug!(event = other, "ignoring unknown event type in chat stream");
                Ok(Flow::Continue)
            }
        }
    }

    /// Applies one parsed chunk.
    ///
    /// # Errors
    ///
    /// A chunk with an `error` object is that error.
    pub(crate) fn apply_chunk(&mut self, chunk: ChatChunk) -> Result<(), ModelError> {
        if let Some(error) = chunk.error.as_ref().filter(|error| !error.is_null()) {
            return Err(failure::in_band_error(error, self.secret));
        }
        if let Some(usage) = chunk.usage.filter(|usage| !usage.is_null()) {
            self.usage = Some(usage);
        }
        for choice in chunk.choices.unwrap_or_default() {
            // keel asks for one choice; any other is ignored.
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            if let Some(delta) = choice.delta.or(choice.message) {
                self.apply_delta(delta, false);
            }
            self.record_finish(choice.finish_reason);
        }
        Ok(())
    }

    /// Applies a whole non-streaming completion and finishes the response.
    ///
    /// # Errors
    ///
    /// A body with an `error` object is that error; a body without a choice is a
    /// [`ModelErrorKind::Stream`] error.
    pub(crate) fn apply_completion(
        mut self,
        completion: ChatCompletion,
    ) -> Result<ModelResponse, ModelError> {
        if let Some(error) = completion.error.as_ref().filter(|error| !error.is_null()) {
            return Err(failure::in_band_error(error, self.secret));
        }
        if let Some(usage) = completion.usage.filter(|usage| !usage.is_null()) {
            self.usage = Some(usage);
        }
        let choice = completion
            .choices
            .unwrap_or_default()
            .into_iter()
            .find(|choice| choice.index.unwrap_or(0) == 0)
            .ok_or_else(|| {
                ModelError::new(ModelErrorKind::InvalidResponse, None, "completion has no choices")
            })?;
        if let Some(message) = choice.message.or(choice.delta) {
            self.apply_delta(message, true);
        }
        self.record_finish(choice.finish_reason);
        Ok(self.finish())
    }

    fn record_finish(&mut self, finish_reason: Option<String>) {
        if self.finish_reason.is_none() {
            self.finish_reason =
                finish_reason.filter(|reason| !reason.is_empty()).map(FinishReason::from);
        }
    }

    /// `whole_message` is set for non-streaming messages, whose tool calls are complete
    /// and listed in order, so each entry is a call of its own.
    fn apply_delta(&mut self, delta: Delta, whole_message: bool) {
        for text in [&delta.reasoning_content, &delta.reasoning]
            .into_iter()
            .filter_map(|value| wire::text_of(value.as_ref()))
        {
            self.push_reasoning(text);
        }
        let (content, thinking) = wire::content_of(delta.content.as_ref());
        if let Some(thinking) = thinking {
            self.push_reasoning(thinking);
        }
        if let Some(content) = content {
            let mut pieces = Vec::new();
            self.think.push(&content, &mut pieces);
            self.emit(pieces);
        }
        if let Some(refusal) = wire::text_of(delta.refusal.as_ref()) {
            self.refusal.push_str(&refusal);
        }
        for (position, tool_call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
            let tool_call = if whole_message {
                ToolCallDelta { index: u64::try_from(position).ok(), ..tool_call }
            } else {
                tool_call
            };
            if let Some(name) = self.tool_calls.apply(&tool_call) {
                (self.on_delta)(StreamDelta::ToolCallStarted { name });
            }
        }
    }

    fn push_reasoning(&mut self, text: String) {
        if !text.is_empty() {
            self.reasoning.push_str(&text);
            (self.on_delta)(StreamDelta::Reasoning(text));
        }
    }

    fn emit(&mut self, pieces: Vec<Piece>) {
        for piece in pieces {
            match piece {
                Piece::Reasoning(text) => self.push_reasoning(text),
                Piece::Text(text) => {
                    if !text.is_empty() {
                        self.text.push_str(&text);
                        (self.on_delta)(StreamDelta::Text(text));
                    }
                }
            }
        }
    }

    /// Finishes the response.
    ///
    /// Without a finish reason (a stream that ended with `[DONE]` but sent none) the reason
    /// is inferred: `tool_calls` when calls were proposed, else `stop`. A refusal sets the
    /// reason to [`FinishReason::Refusal`] and becomes the text when there is no other.
    pub(crate) fn finish(mut self) -> ModelResponse {
        let mut pieces = Vec::new();
        self.think.finish(&mut pieces);
        self.emit(pieces);
        let tool_calls = self.tool_calls.finish();
        let inferred =
            if tool_calls.is_empty() { FinishReason::Stop } else { FinishReason::ToolCalls };
        let mut finish_reason = self.finish_reason.unwrap_or(inferred);
        if !self.refusal.is_empty() {
            if self.text.is_empty() {
                self.text = std::mem::take(&mut self.refusal);
            }
            finish_reason = FinishReason::Refusal;
        }
        let reasoning = if self.reasoning.is_empty() {
            Vec::new()
        } else {
            vec![ReasoningPart { text: self.reasoning, signature: None, redacted: None }]
        };
        ModelResponse {
            text: self.text,
            reasoning,
            tool_calls,
            usage: self
                .usage
                .as_ref()
                .and_then(|usage| serde_json::from_value::<WireUsage>(usage.clone()).ok())
                .as_ref()
                .map(usage_from_wire)
                .unwrap_or_default(),
            raw_usage: self.usage,
            finish_reason,
        }
    }
}

/// Maps a wire `usage` object to keel's [`Usage`].
///
/// `output_tokens` excludes reasoning tokens. OpenAI documents `completion_tokens` as
/// including `completion_tokens_details.reasoning_tokens` and `total_tokens` as prompt
/// plus completion ("The chat completion object", `usage`:
/// <https://platform.openai.com/docs/api-reference/chat/object#chat/object-usage>); some
/// compatible servers report reasoning on top (xAI: total = prompt + completion +
/// reasoning) or bill it unitemised (Gemini's compatibility endpoint: total above prompt
/// plus completion). The totals decide ([`crate::usage::split_reasoning`]); without them,
/// reasoning is inside the completion unless it is larger than the completion.
pub(crate) fn usage_from_wire(usage: &WireUsage) -> Usage {
    let reasoning = usage.completion_tokens_details.and_then(|details| details.reasoning_tokens);
    let (output_tokens, reasoning_tokens) = crate::usage::split_reasoning(
        usage.prompt_tokens,
        usage.completion_tokens,
        reasoning,
        usage.total_tokens,
        crate::usage::WithoutTotals::InsideUnlessLarger,
    );
    Usage {
        input_tokens: usage.prompt_tokens,
        output_tokens,
        cached_input_tokens: usage.prompt_tokens_details.and_then(|details| details.cached_tokens),
        reasoning_tokens,
    }
}
