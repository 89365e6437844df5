//! Assembling Messages API stream events (or one whole message) into a [`ModelResponse`].
//!
//! Events (Anthropic, "Streaming Messages"): `message_start`, then for each content block
//! `content_block_start`, `content_block_delta`s and `content_block_stop`, then
//! `message_delta` (stop reason, cumulative usage) and `message_stop`; `ping` may come
//! anywhere and `error` ends the stream with an error. The event's kind is read from the
//! JSON `type` (the SSE `event:` name is only a fallback), so streams recorded without
//! `event:` lines parse the same.
//!
//! Invariants:
//! - Blocks are kept by their `index`; the response lists them in index order.
//! - A thinking block is its accumulated `thinking_delta` text plus its `signature_delta`,
//!   byte-exact (B06: never the `content_block_start` snapshot, which is empty). A thinking
//!   block that ends up without text or without a signature is not kept (it could never be
//!   sent back). A `redacted_thinking` block's `data` is kept opaque.
//! - A `tool_use` block's input is the concatenation of its `input_json_delta` fragments:
//!   empty means `{}`, text that does not parse is kept raw with `arguments_error`. A block
//!   that never got its `content_block_stop` (the output limit cut it, case 18) is always
//!   kept with `arguments_error`, so it is reported to the model and never executed, even
//!   when its partial JSON happens to parse.
//! - Usage: input from `message_start`, laid over by the cumulative counts of
//!   `message_delta`; see [`usage_from_wire`] for how it maps to keel's [`Usage`].
//! - An `error` event is an error, never folded into a success.

use std::collections::BTreeMap;

use keel_contracts::{
    FinishReason, ModelError, ModelErrorKind, ModelResponse, ReasoningPart, StreamDelta, ToolCall,
    ToolCallId, Usage,
};
use serde_json::Value;

use super::wire::{ContentBlock, EventDelta, StreamEvent, WireUsage};
use crate::arguments;
use crate::failure;
use crate::lenient;
use crate::transport::Flow;

/// The callback that receives live deltas.
pub(crate) type OnDelta<'a> = &'a (dyn Fn(StreamDelta) + Send + Sync);

/// The separator put between two text blocks of one response that another block stands
/// between (text, a tool call, more text), so their words do not run together in keel's
/// single text. Adjacent text blocks are one text split by the API (cited prose comes as a
/// run of text blocks, corpus `anthropic-web-search-tool.1`) and are joined as they are.
const TEXT_BLOCK_SEPARATOR: &str = "\n\n";

/// The event kinds the assembler reads; data of any other that is not JSON is skipped.
const READ_EVENTS: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "message",
    "error",
];

/// One content block while it streams.
#[derive(Debug, Clone, PartialEq)]
enum BlockState {
    Text(String),
    Thinking {
        text: String,
        signature: String,
    },
    Redacted(String),
    ToolUse {
        id: String,
        name: String,
        json: String,
        start_input: Option<Value>,
        stopped: bool,
    },
    /// A block type keel does not use (server tools, citations, ...): ignored.
    Other,
}

/// Collects one response while it streams.
pub(crate) struct Assembler<'a> {
    on_delta: OnDelta<'a>,
    secret: Option<&'a str>,
    blocks: BTreeMap<u64, BlockState>,
    /// Blocks whose index a later `content_block_start` reused: kept, never dropped.
    superseded: Vec<(u64, BlockState)>,
    /// Whether any visible text was shown yet (for [`TEXT_BLOCK_SEPARATOR`]).
    shown_text: bool,
    /// Whether a block other than text started since text was last shown.
    block_between: bool,
    /// Whether `message_start` arrived, and the message id it gave (a second one for
    /// another message is a spliced stream).
    started: bool,
    message_id: Option<String>,
    usage: Option<WireUsage>,
    /// The usage objects as sent: of `message_start`, and the last of `message_delta` (or
    /// of a whole message).
    raw_start_usage: Option<Value>,
    raw_delta_usage: Option<Value>,
    stop_reason: Option<String>,
    stop_details: Option<Value>,
}

impl std::fmt::Debug for Assembler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assembler")
            .field("blocks", &self.blocks)
            .field("usage", &self.usage)
            .field("stop_reason", &self.stop_reason)
            .finish_non_exhaustive()
    }
}

impl<'a> Assembler<'a> {
    /// A new, empty response; `secret` is redacted from any error message.
    pub(crate) fn new(on_delta: OnDelta<'a>, secret: Option<&'a str>) -> Self {
        Assembler {
            on_delta,
            secret,
            blocks: BTreeMap::new(),
            superseded: Vec::new(),
            shown_text: false,
            block_between: false,
            started: false,
            message_id: None,
            usage: None,
            raw_start_usage: None,
            raw_delta_usage: None,
            stop_reason: None,
            stop_details: None,
        }
    }

    /// Whether a stop reason has been received (the stream may end without
    /// `message_stop` after it).
    pub(crate) fn has_stop_reason(&self) -> bool {
        self.stop_reason.is_some()
    }

    /// Applies one SSE event.
    ///
    /// # Errors
    ///
    /// An `error` event becomes the error it describes (see `failure::in_band_error`:
    /// `overloaded_error` is [`ModelErrorKind::Overloaded`], retryable); data that is not
    /// JSON, in an event keel reads, is a [`ModelErrorKind::InvalidResponse`] error (not
    /// retried); a second `message_start` before `message_stop` is a spliced stream, a
    /// [`ModelErrorKind::Stream`] error.
    pub(crate) fn apply_event(&mut self, event: &str, data: &str) -> Result<Flow, ModelError> {
        if data.trim().is_empty() {
            return Ok(Flow::Continue);
        }
        let parsed: StreamEvent = match lenient::parse(data) {
            Ok(parsed) => parsed,
            Err(_) if event == "error" => {
                return Err(failure::in_band_error(&Value::String(data.to_owned()), self.secret));
            }
            Err(error) if READ_EVENTS.contains(&event) => {
                return Err(ModelError::new(
                    ModelErrorKind::InvalidResponse,
                    None,
                    failure::redact(&format!("malformed {event} event: {error}"), self.secret),
                ));
            }
            Err(error) => {
                tracing::debug!(event, %error, "skipping an unreadable event keel does not use");
                return Ok(Flow::Continue);
            }
        };
        let kind = parsed.kind.clone().unwrap_or_else(|| event.to_owned());
        match kind.as_str() {
            "message_start" => {
                let id = parsed.message.as_ref().and_then(|message| message.id.clone());
                if self.started {
                    // The same message announced twice (before any content) is harmless;
                    // another message before this one stopped is two streams spliced.
                    let same = id.is_some() && id == self.message_id;
                    let nothing_yet = id.is_none() && self.blocks.is_empty();
                    if !(same || nothing_yet) {
                        return Err(ModelError::new(
                            ModelErrorKind::Stream,
                            None,
                            failure::redact(
                                &format!(
                                    "a message_start for another message ({}) arrived before \
                                     message_stop of {}: the stream is spliced or corrupt",
                                    id.as_deref().unwrap_or("no id"),
                                    self.message_id.as_deref().unwrap_or("no id")
                                ),
                                self.secret,
                            ),
                        ));
                    }
                    return Ok(Flow::Continue);
                }
                self.started = true;
                self.message_id = id;
                if let Some(usage) = parsed.message.and_then(|message| message.usage) {
                    self.raw_start_usage = Some(usage.clone());
                    self.update_usage(&usage);
                }
            }
            "content_block_start" => {
                if let Some(block) = parsed.content_block {
                    let index = parsed.index.unwrap_or_else(|| self.next_index());
                    self.start_block(index, block);
                }
            }
            "content_block_delta" => {
                if let (Some(index), Some(delta)) = (parsed.index, parsed.delta) {
                    self.apply_block_delta(index, delta);
                }
            }
            "content_block_stop" => {
                if let Some(BlockState::ToolUse { stopped, .. }) =
                    parsed.index.and_then(|index| self.blocks.get_mut(&index))
                {
                    *stopped = true;
                }
            }
            "message_delta" => {
                if let Some(delta) = parsed.delta {
                    self.record_stop(delta.stop_reason, delta.stop_details);
                }
                if let Some(usage) = parsed.usage {
                    self.raw_delta_usage = Some(usage.clone());
                    self.update_usage(&usage);
                }
            }
            "message_stop" => return Ok(Flow::Done),
            "error" => {
                let error = parsed.error.unwrap_or_else(|| Value::String(data.to_owned()));
                return Err(failure::in_band_error(&error, self.secret));
            }
            "message" => {
                self.apply_message(parsed);
                return Ok(Flow::Done);
            }
            "ping" => {}
            other => tracing::debug!(event = other, "ignoring unknown event in messages stream"),
        }
        Ok(Flow::Continue)
    }

    /// Applies a whole non-streaming message (`type: message`) as if it had streamed.
    fn apply_message(&mut self, message: StreamEvent) {
        if let Some(usage) = message.usage {
            self.raw_delta_usage = Some(usage.clone());
            self.update_usage(&usage);
        }
        for (position, block) in message.content.unwrap_or_default().into_iter().enumerate() {
            let index = u64::try_from(position).unwrap_or(u64::MAX);
            self.start_block(index, block);
            if let Some(BlockState::ToolUse { stopped, .. }) = self.blocks.get_mut(&index) {
                *stopped = true;
            }
        }
        self.record_stop(message.stop_reason, message.stop_details);
    }

    fn next_index(&self) -> u64 {
        self.blocks.keys().next_back().map_or(0, |last| last.saturating_add(1))
    }

    fn update_usage(&mut self, usage: &Value) {
        if usage.is_null() {
            return;
        }
        let usage: WireUsage = serde_json::from_value(usage.clone()).unwrap_or_default();
        self.usage.get_or_insert_with(WireUsage::default).update(&usage);
    }

    fn record_stop(&mut self, stop_reason: Option<String>, stop_details: Option<Value>) {
        if let Some(stop_reason) = stop_reason.filter(|reason| !reason.is_empty()) {
            self.stop_reason = Some(stop_reason);
        }
        if let Some(stop_details) = stop_details.filter(|details| !details.is_null()) {
            self.stop_details = Some(stop_details);
        }
    }

    fn start_block(&mut self, index: u64, block: ContentBlock) {
        let state = match block.kind.as_deref() {
            Some("text") => BlockState::Text(String::new()),
            Some("thinking") => {
                BlockState::Thinking { text: String::new(), signature: String::new() }
            }
            Some("redacted_thinking") => {
                BlockState::Redacted(block.data.clone().unwrap_or_default())
            }
            Some("tool_use") => {
                let name = block.name.clone().unwrap_or_default();
                (self.on_delta)(StreamDelta::ToolCallStarted { name: name.clone() });
                BlockState::ToolUse {
                    id: block.id.clone().unwrap_or_default(),
                    name,
                    json: String::new(),
                    start_input: block.input.clone(),
                    stopped: false,
                }
            }
            other => {
                tracing::debug!(block = ?other, "ignoring a content block keel does not use");
                BlockState::Other
            }
        };
        if !matches!(state, BlockState::Text(_)) {
            self.block_between = true;
        }
        if let Some(previous) = self.blocks.insert(index, state) {
            tracing::warn!(index, "a content block reused the index of an earlier one; both kept");
            self.superseded.push((index, previous));
        }
        // A start may carry content already (a whole message; some proxies): it counts as
        // the block's first delta.
        let initial = EventDelta {
            text: block.text,
            thinking: block.thinking,
            signature: block.signature,
            ..EventDelta::default()
        };
        self.apply_block_delta(index, initial);
    }

    fn apply_block_delta(&mut self, index: u64, delta: EventDelta) {
        let Some(block) = self.blocks.get_mut(&index) else {
            tracing::debug!(index, "ignoring a delta for a block that never started");
            return;
        };
        let mut shown_text = None;
        let mut shown_reasoning = None;
        match block {
            BlockState::Text(text) => {
                if let Some(piece) = delta.text.filter(|piece| !piece.is_empty()) {
                    if text.is_empty() && self.shown_text && self.block_between {
                        text.push_str(TEXT_BLOCK_SEPARATOR);
                        (self.on_delta)(StreamDelta::Text(TEXT_BLOCK_SEPARATOR.to_owned()));
                    }
                    text.push_str(&piece);
                    shown_text = Some(piece);
                }
            }
            BlockState::Thinking { text, signature } => {
                if let Some(piece) = delta.thinking.filter(|piece| !piece.is_empty()) {
                    text.push_str(&piece);
                    shown_reasoning = Some(piece);
                }
                if let Some(piece) = delta.signature {
                    signature.push_str(&piece);
                }
            }
            BlockState::ToolUse { json, .. } => {
                if let Some(piece) = delta.partial_json {
                    json.push_str(&piece);
                }
            }
            BlockState::Redacted(_) | BlockState::Other => {}
        }
        if let Some(piece) = shown_text {
            self.shown_text = true;
            self.block_between = false;
            (self.on_delta)(StreamDelta::Text(piece));
        }
        if let Some(piece) = shown_reasoning {
            (self.on_delta)(StreamDelta::Reasoning(piece));
        }
    }

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

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    fn run(events: &[Value]) -> (Result<ModelResponse, ModelError>, Vec<StreamDelta>) {
        let seen = Mutex::new(Vec::new());
        let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
        let mut assembler = Assembler::new(&on_delta, None);
        let mut result = None;
        for event in events {
            match assembler.apply_event("message", &event.to_string()) {
                Ok(Flow::Continue) => {}
                Ok(Flow::Done) => break,
                Err(error) => {
                    result = Some(Err(error));
                    break;
                }
            }
        }
        let result = result.unwrap_or_else(|| Ok(assembler.finish()));
        (result, seen.into_inner().unwrap())
    }

    fn start(index: u64, block: Value) -> Value {
        json!({"type": "content_block_start", "index": index, "content_block": block})
    }

    fn delta(index: u64, delta: Value) -> Value {
        json!({"type": "content_block_delta", "index": index, "delta": delta})
    }

    fn stop(index: u64) -> Value {
        json!({"type": "content_block_stop", "index": index})
    }

    #[test]
    fn two_text_blocks_around_a_call_are_separated() {
        let (result, deltas) = run(&[
            start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Looking."})),
            stop(0),
            start(1, json!({"type": "tool_use", "id": "t1", "name": "read", "input": {}})),
            delta(1, json!({"type": "input_json_delta", "partial_json": "{\"p\":1}"})),
            stop(1),
            start(2, json!({"type": "text", "text": ""})),
            delta(2, json!({"type": "text_delta", "text": "Done."})),
            stop(2),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
            json!({"type": "message_stop"}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.text, "Looking.\n\nDone.");
        let live: String = deltas
            .iter()
            .filter_map(|delta| match delta {
                StreamDelta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(live, response.text);
        assert_eq!(response.tool_calls[0].arguments, json!({"p": 1}));
    }

    #[test]
    fn a_reused_block_index_keeps_both_tool_uses() {
        let (result, _) = run(&[
            start(0, json!({"type": "tool_use", "id": "toolu_a", "name": "read", "input": {}})),
            delta(0, json!({"type": "input_json_delta", "partial_json": "{\"p\":1}"})),
            stop(0),
            start(0, json!({"type": "tool_use", "id": "toolu_b", "name": "list", "input": {}})),
            delta(0, json!({"type": "input_json_delta", "partial_json": "{\"p\":2}"})),
            stop(0),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
            json!({"type": "message_stop"}),
        ]);
        let calls = result.unwrap().tool_calls;
        let ids: Vec<&str> = calls.iter().map(|call| call.call_id.as_str()).collect();
        assert_eq!(ids, ["toolu_a", "toolu_b"]);
        assert_eq!(calls[0].arguments, json!({"p": 1}));
        assert_eq!(calls[1].arguments, json!({"p": 2}));
    }

    #[test]
    fn whole_input_in_the_start_block_is_kept() {
        let (result, _) = run(&[
            start(0, json!({"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}})),
            stop(0),
            json!({"type": "message_stop"}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.tool_calls[0].arguments, json!({"a": 1}));
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
    }

    #[test]
    fn unsigned_or_empty_thinking_is_not_kept() {
        let (result, deltas) = run(&[
            start(0, json!({"type": "thinking", "thinking": "", "signature": ""})),
            delta(0, json!({"type": "thinking_delta", "thinking": "hm"})),
            stop(0),
            start(1, json!({"type": "thinking", "thinking": "", "signature": ""})),
            delta(1, json!({"type": "signature_delta", "signature": "sig"})),
            stop(1),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
            json!({"type": "message_stop"}),
        ]);
        assert_eq!(result.unwrap().reasoning, Vec::new());
        assert_eq!(deltas, vec![StreamDelta::Reasoning("hm".into())]);
    }

    #[test]
    fn cut_off_call_is_never_valid_even_when_its_json_parses() {
        let (result, _) = run(&[
            start(0, json!({"type": "tool_use", "id": "t1", "name": "f", "input": {}})),
            delta(0, json!({"type": "input_json_delta", "partial_json": "{}"})),
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"}}),
            json!({"type": "message_stop"}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.finish_reason, FinishReason::Length);
        assert_eq!(response.tool_calls[0].arguments, json!("{}"));
        assert!(response.tool_calls[0].arguments_error.as_deref().unwrap().contains("cut off"));
    }

    #[test]
    fn non_streaming_message_body_is_assembled() {
        let (result, _) = run(&[json!({
            "type": "message", "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "plan", "signature": "sig"},
                {"type": "text", "text": "Hi."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"x": 1}}
            ],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 7}
        })]);
        let response = result.unwrap();
        assert_eq!(response.text, "Hi.");
        assert_eq!(
            response.reasoning,
            vec![ReasoningPart {
                text: "plan".into(),
                signature: Some("sig".into()),
                redacted: None
            }]
        );
        assert_eq!(response.tool_calls[0].arguments, json!({"x": 1}));
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            response.usage,
            Usage {
                input_tokens: Some(15),
                output_tokens: Some(7),
                cached_input_tokens: Some(5),
                reasoning_tokens: None
            }
        );
    }

    #[test]
    fn usage_counts_cache_reads_and_writes_as_input() {
        let usage = WireUsage {
            input_tokens: Some(10),
            cache_creation_input_tokens: Some(100),
            cache_read_input_tokens: Some(1000),
            output_tokens: Some(5),
        };
        assert_eq!(
            usage_from_wire(&usage),
            Usage {
                input_tokens: Some(1110),
                output_tokens: Some(5),
                cached_input_tokens: Some(1000),
                reasoning_tokens: None
            }
        );
        assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
    }

    #[test]
    fn error_event_is_an_error_and_other_stop_reasons_are_kept() {
        let (result, _) =
            run(&[json!({"type": "error", "error": {"type": "api_error", "message": "Internal"}})]);
        assert_eq!(result.unwrap_err().kind, ModelErrorKind::Server);
        let (result, _) = run(&[
            json!({"type": "message_delta", "delta": {"stop_reason": "pause_turn"}}),
            json!({"type": "message_stop"}),
        ]);
        assert_eq!(result.unwrap().finish_reason, FinishReason::Other("pause_turn".into()));
        let (result, _) = run(&[
            json!({"type": "message_delta", "delta": {"stop_reason": "model_context_window_exceeded"}}),
            json!({"type": "message_stop"}),
        ]);
        assert_eq!(result.unwrap().finish_reason, FinishReason::Length);
    }

    #[test]
    fn adjacent_text_blocks_are_joined_as_sent() {
        let (result, deltas) = run(&[
            start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Opened in 2003."})),
            stop(0),
            start(1, json!({"type": "text", "text": ""})),
            delta(1, json!({"type": "text_delta", "text": " It is big."})),
            stop(1),
            start(2, json!({"type": "thinking", "thinking": ""})),
            delta(2, json!({"type": "thinking_delta", "thinking": "more"})),
            delta(2, json!({"type": "signature_delta", "signature": "sig"})),
            stop(2),
            start(3, json!({"type": "text", "text": ""})),
            delta(3, json!({"type": "text_delta", "text": "After."})),
            stop(3),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}),
            json!({"type": "message_stop"}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.text, "Opened in 2003. It is big.\n\nAfter.");
        let live: String = deltas
            .iter()
            .filter_map(|delta| match delta {
                StreamDelta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(live, response.text);
    }

    #[test]
    fn a_message_start_for_another_message_is_a_spliced_stream() {
        let start_of = |id: &str| {
            json!({"type": "message_start", "message": {"id": id,
                "usage": {"input_tokens": 3, "output_tokens": 1}}})
        };
        let (result, _) = run(&[
            start_of("msg_a"),
            start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Hel"})),
            start_of("msg_b"),
            json!({"type": "message_stop"}),
        ]);
        let error = result.unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::Stream);
        assert!(error.is_retryable());
        assert!(error.message.contains("spliced"), "{}", error.message);
        // The same message announced twice is harmless.
        let (result, _) = run(&[
            start_of("msg_a"),
            start_of("msg_a"),
            start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "Hi."})),
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": 2}}),
            json!({"type": "message_stop"}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.text, "Hi.");
        assert_eq!(
            response.raw_usage,
            Some(json!({"message_start": {"input_tokens": 3, "output_tokens": 1},
                "message_delta": {"output_tokens": 2}}))
        );
    }
}
