//! Finishing a Responses stream: the items in output order become the
//! [`ModelResponse`], with its finish reason, the refused calls of kinds keel never
//! declares, and the usage mapped to keel's [`Usage`].

use keel_contracts::{
    FinishReason, ModelResponse, ReasoningPart, StreamDelta, ToolCall, ToolCallId, Usage,
};
use serde_json::Value;

use super::item::{ForeignCall, Item};
use super::{Assembler, End, PART_SEPARATOR};
use crate::arguments;
use crate::responses::wire::WireUsage;

impl Assembler<'_> {
    /// Finishes the response.
    ///
    /// `response.incomplete` with `max_output_tokens` is [`FinishReason::Length`], with
    /// `content_filter` [`FinishReason::ContentFilter`]; a completed response is
    /// [`FinishReason::ToolCalls`] when it proposes calls, else [`FinishReason::Stop`]. A
    /// refusal part makes it [`FinishReason::Refusal`] and becomes the text when there is
    /// no other.
    pub(crate) fn finish(self) -> ModelResponse {
        let mut texts = Vec::new();
        let mut refusal = String::new();
        let mut reasoning = Vec::new();
        let mut tool_calls = Vec::new();
        let ended_incomplete = matches!(self.end, Some(End::Incomplete(_)));
        let last_message = self
            .items
            .iter()
            .filter(|(_, item)| matches!(item, Item::Message { .. }))
            .map(|(index, _)| *index)
            .next_back();
        for (index, item) in self.items {
            match item {
                Item::Message { text, refusal: refused } => {
                    if !text.is_empty() {
                        texts.push(text);
                    }
                    refusal.push_str(&refused);
                }
                Item::FunctionCall { call_id, name, arguments, complete } => {
                    let call_id = if call_id.is_empty() {
                        arguments::mint_call_id()
                    } else {
                        ToolCallId(call_id)
                    };
                    tool_calls.push(if complete || !ended_incomplete {
                        let (arguments, arguments_error) = arguments::parse(arguments);
                        ToolCall { call_id, name, arguments, arguments_error }
                    } else {
                        let error = format!(
                            "the tool call was cut off before its arguments were complete \
                             ({} bytes received); it was not executed",
                            arguments.len()
                        );
                        ToolCall {
                            call_id,
                            name,
                            arguments: Value::String(arguments),
                            arguments_error: Some(error),
                        }
                    });
                }
                Item::Reasoning { summary, content, encrypted_content } => {
                    let summary: Vec<String> =
                        summary.into_iter().filter(|part| !part.is_empty()).collect();
                    let text =
                        if summary.is_empty() { content } else { summary.join(PART_SEPARATOR) };
                    let redacted = encrypted_content.filter(|data| !data.is_empty());
                    if !text.is_empty() || redacted.is_some() {
                        reasoning.push(ReasoningPart { text, signature: None, redacted });
                    }
                }
                Item::Other { call: Some(call) } => {
                    let answered = call.server_side
                        || self.answered_calls.contains(&call.call_id)
                        || last_message.is_some_and(|message| message > index);
                    if !answered {
                        (self.on_delta)(StreamDelta::ToolCallStarted { name: call.name.clone() });
                        tool_calls.push(foreign_call(call));
                    }
                }
                Item::Other { call: None } => {}
            }
        }
        let mut text = texts.join(PART_SEPARATOR);
        let mut finish_reason = match self.end {
            Some(End::Incomplete(Some(reason))) if reason == "max_output_tokens" => {
                FinishReason::Length
            }
            Some(End::Incomplete(Some(reason))) if reason == "content_filter" => {
                FinishReason::ContentFilter
            }
            Some(End::Incomplete(reason)) => {
                FinishReason::Other(reason.unwrap_or_else(|| "incomplete".to_owned()))
            }
            Some(End::Completed) | None if tool_calls.is_empty() => FinishReason::Stop,
            Some(End::Completed) | None => FinishReason::ToolCalls,
        };
        if !refusal.is_empty() {
            if text.is_empty() {
                (self.on_delta)(StreamDelta::Text(refusal.clone()));
                text = refusal;
            }
            finish_reason = FinishReason::Refusal;
        }
        ModelResponse {
            text,
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

/// The tool call that tells the model (and the user) that `call` cannot be run.
fn foreign_call(call: ForeignCall) -> ToolCall {
    let call_id =
        if call.call_id.is_empty() { arguments::mint_call_id() } else { ToolCallId(call.call_id) };
    let arguments = serde_json::from_str::<Value>(&call.arguments)
        .unwrap_or_else(|_| Value::String(call.arguments.clone()));
    ToolCall {
        call_id,
        name: call.name,
        arguments,
        arguments_error: Some(format!(
            "keel offered no tool of this kind (a `{}` item); the call was not executed",
            call.kind
        )),
    }
}

/// Maps the Responses API's usage to keel's [`Usage`].
///
/// The rule, decided by the totals when the server sends them
/// ([`crate::usage::split_reasoning`]): OpenAI documents `output_tokens` as including
/// `output_tokens_details.reasoning_tokens` ("Create a model response", the `usage` object:
/// <https://platform.openai.com/docs/api-reference/responses/object#responses/object-usage>),
/// and `total_tokens = input_tokens + output_tokens`. When `total_tokens` equals input plus
/// output, reasoning is inside output and is subtracted; when it equals input plus output
/// plus reasoning (a server that reports reasoning on top), output is kept as given;
/// without a total, the documented rule (inside) applies.
pub(crate) fn usage_from_wire(usage: &WireUsage) -> Usage {
    let reasoning = usage.output_tokens_details.and_then(|details| details.reasoning_tokens);
    let (output_tokens, reasoning_tokens) = crate::usage::split_reasoning(
        usage.input_tokens,
        usage.output_tokens,
        reasoning,
        usage.total_tokens,
        crate::usage::WithoutTotals::Inside,
    );
    Usage {
        input_tokens: usage.input_tokens,
        output_tokens,
        cached_input_tokens: usage.input_tokens_details.and_then(|details| details.cached_tokens),
        reasoning_tokens,
    }
}
