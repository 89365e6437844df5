//! Finishing a Messages stream: the content blocks in index order become the
//! [`ModelResponse`], with its finish reason, a refusal's explanation as its text, each
//! tool use's arguments, and the usage mapped to keel's [`Usage`].

use keel_contracts::{
    FinishReason, ModelResponse, ReasoningPart, StreamDelta, ToolCall, ToolCallId, Usage,
};
use serde_json::Value;

use super::{Assembler, BlockState};
use crate::anthropic::wire::WireUsage;
use crate::arguments;

impl Assembler<'_> {
    /// Finishes the response.
    ///
    /// The finish reason maps `end_turn`/`stop_sequence` to [`FinishReason::Stop`],
    /// `tool_use` to [`FinishReason::ToolCalls`], `max_tokens` and
    /// `model_context_window_exceeded` to [`FinishReason::Length`], `refusal` to
    /// [`FinishReason::Refusal`]; any other is kept as [`FinishReason::Other`]. Without a
    /// stop reason it is inferred (`tool_calls` when calls were proposed, else `stop`).
    ///
    /// A refusal (case 19) usually has no content: the `stop_details` explanation (and its
    /// category) becomes the text, so the refusal is reported with its reason rather than
    /// as an empty answer.
    pub(crate) fn finish(self) -> ModelResponse {
        let mut text = String::new();
        let mut reasoning = Vec::new();
        let mut tool_calls = Vec::new();
        // Superseded blocks come first at their index (a stable sort keeps that order).
        let mut all: Vec<(u64, BlockState)> =
            self.superseded.into_iter().chain(self.blocks).collect();
        all.sort_by_key(|(index, _)| *index);
        for (index, block) in all {
            match block {
                BlockState::Text(piece) => text.push_str(&piece),
                BlockState::Thinking { text: thinking, signature } => {
                    if thinking.is_empty() || signature.is_empty() {
                        tracing::warn!(
                            index,
                            has_text = !thinking.is_empty(),
                            has_signature = !signature.is_empty(),
                            "thinking block without text or signature is not kept"
                        );
                    } else {
                        reasoning.push(ReasoningPart {
                            text: thinking,
                            signature: Some(signature),
                            redacted: None,
                        });
                    }
                }
                BlockState::Redacted(data) => reasoning.push(ReasoningPart {
                    text: String::new(),
                    signature: None,
                    redacted: Some(data),
                }),
                BlockState::ToolUse { id, name, json, start_input, stopped } => {
                    tool_calls.push(finish_tool_use(id, name, json, start_input, stopped));
                }
                BlockState::Other => {}
            }
        }
        let finish_reason = match self.stop_reason.as_deref() {
            Some("model_context_window_exceeded") => FinishReason::Length,
            Some(reason) => FinishReason::from(reason.to_owned()),
            None if tool_calls.is_empty() => FinishReason::Stop,
            None => FinishReason::ToolCalls,
        };
        if finish_reason == FinishReason::Refusal
            && text.is_empty()
            && let Some(explanation) = refusal_text(self.stop_details.as_ref())
        {
            (self.on_delta)(StreamDelta::Text(explanation.clone()));
            text = explanation;
        }
        let raw_usage = match (self.raw_start_usage, self.raw_delta_usage) {
            (None, None) => None,
            (start, delta) => Some(serde_json::json!({
                "message_start": start,
                "message_delta": delta,
            })),
        };
        ModelResponse {
            text,
            reasoning,
            tool_calls,
            usage: self.usage.as_ref().map(usage_from_wire).unwrap_or_default(),
            raw_usage,
            finish_reason,
        }
    }
}

fn finish_tool_use(
    id: String,
    name: String,
    json: String,
    start_input: Option<Value>,
    stopped: bool,
) -> ToolCall {
    let call_id = if id.is_empty() { arguments::mint_call_id() } else { ToolCallId(id) };
    if !stopped {
        let error = format!(
            "the tool call was cut off before its input was complete ({} bytes received); \
             it was not executed",
            json.len()
        );
        return ToolCall {
            call_id,
            name,
            arguments: Value::String(json),
            arguments_error: Some(error),
        };
    }
    let (arguments, arguments_error) = match start_input {
        // The whole input came with the start and no fragments followed.
        Some(input @ Value::Object(_)) if json.trim().is_empty() => (input, None),
        _ => arguments::parse(json),
    };
    ToolCall { call_id, name, arguments, arguments_error }
}

/// The text of a refusal's `stop_details`: its explanation, with its category.
fn refusal_text(stop_details: Option<&Value>) -> Option<String> {
    let details = stop_details?;
    let explanation = details.get("explanation").and_then(Value::as_str).unwrap_or_default();
    let category = details.get("category").and_then(Value::as_str);
    match (explanation.is_empty(), category) {
        (true, None) => None,
        (true, Some(category)) => Some(format!("refused (category: {category})")),
        (false, None) => Some(explanation.to_owned()),
        (false, Some(category)) => Some(format!("{explanation} (category: {category})")),
    }
}

/// Maps the Messages API's usage to keel's [`Usage`].
///
/// Source: Anthropic, "Messages" (the `usage` object:
/// <https://docs.anthropic.com/en/api/messages>) and "Extended thinking" ("you're charged
/// for the full thinking tokens", billed as output:
/// <https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking>). The API sends
/// no total and no reasoning share, so the totals rule of `crate::usage` cannot apply.
///
/// - `input_tokens` = `input_tokens + cache_read_input_tokens + cache_creation_input_tokens`
///   (Anthropic's `input_tokens` counts only the uncached part); `cached_input_tokens` =
///   `cache_read_input_tokens`. Cache writes are counted as plain input (Anthropic bills
///   them somewhat above the input price).
/// - `output_tokens` is Anthropic's `output_tokens` as reported. Anthropic counts thinking
///   inside it and does not (reliably) report the thinking share, so keel cannot subtract
///   it: `output_tokens` here INCLUDES thinking, and `reasoning_tokens` is left `None`.
///   This departs from [`Usage::output_tokens`]' "excluding reasoning" on purpose: every
///   token is counted exactly once, so budgets and `cost_usd` (which bills output plus
///   reasoning at the output price) stay right. Splitting a guess out would double count
///   or undercount.
pub(crate) fn usage_from_wire(usage: &WireUsage) -> Usage {
    let input_tokens = usage.input_tokens.map(|input| {
        input
            .saturating_add(usage.cache_read_input_tokens.unwrap_or(0))
            .saturating_add(usage.cache_creation_input_tokens.unwrap_or(0))
    });
    Usage {
        input_tokens,
        output_tokens: usage.output_tokens,
        cached_input_tokens: usage.cache_read_input_tokens,
        reasoning_tokens: None,
    }
}
