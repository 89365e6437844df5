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

use keel_contracts::{
    FinishReason, ModelError, ModelErrorKind, ModelResponse, ReasoningPart, StreamDelta, ToolCall,
    ToolCallId, Usage,
};
use serde_json::Value;

use super::wire::{self, ChatChunk, ChatCompletion, Delta, ToolCallDelta, WireUsage};
use crate::arguments;
use crate::failure;
use crate::lenient;
use crate::transport::Flow;

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

/// One tool call while its fragments arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PartialCall {
    /// The wire `index`, when the server sent one: a key, not a position.
    index: Option<u64>,
    /// The first non-empty id seen for the call.
    id: Option<String>,
    name: String,
    arguments: String,
}

/// Routes tool-call fragments to calls.
///
/// The rule (cases B01 and B02):
/// 1. A fragment with a non-empty id that no call has yet AND a non-empty name starts a
///    new call, even when its `index` is already in use. (A fragment repeating a known id
///    continues that call.)
/// 2. Otherwise a fragment with an `index` continues the most recent call with that index,
///    or starts one when the index is new.
/// 3. A fragment with neither a new id nor an index continues the call being streamed
///    (the one touched last), or starts the first call.
///
/// The first id seen for a call is kept; later ids on its fragments are ignored. A call
/// that never received an id gets one minted when the response finishes.
#[derive(Debug, Default)]
pub(crate) struct ToolCallAssembler {
    calls: Vec<PartialCall>,
    current: Option<usize>,
}

impl ToolCallAssembler {
    /// Applies one fragment; returns the call's name when this fragment gave a call its
    /// name (the moment to announce it).
    pub(crate) fn apply(&mut self, fragment: &ToolCallDelta) -> Option<String> {
        let id = fragment.id.as_deref().filter(|id| !id.is_empty());
        let function = fragment.function.as_ref();
        let name = function.and_then(|function| function.name.as_deref()).filter(|n| !n.is_empty());
        let arguments = wire::arguments_of(function.and_then(|f| f.arguments.as_ref()));

        // A known id continues its call, unless it arrives at another index with a name of
        // its own: that is a second call reusing the id (the kernel gives it a fresh one).
        let known_id = id
            .and_then(|id| self.calls.iter().rposition(|call| call.id.as_deref() == Some(id)))
            .filter(|&position| {
                let call_index = self.calls[position].index;
                !(name.is_some()
                    && fragment.index.is_some()
                    && call_index.is_some()
                    && call_index != fragment.index)
            });
        let target = match (known_id, id, name, fragment.index) {
            (Some(position), _, _, _) => Some(position),
            (None, Some(_), Some(_), _) => None,
            (None, _, _, Some(index)) => {
                self.calls.iter().rposition(|call| call.index == Some(index))
            }
            (None, _, _, None) => self.current,
        };
        let position = match target {
            Some(position) => position,
            None => {
                self.calls.push(PartialCall {
                    index: fragment.index,
                    id: None,
                    name: String::new(),
                    arguments: String::new(),
                });
                self.calls.len() - 1
            }
        };
        self.current = Some(position);
        let call = self.calls.get_mut(position)?;
        if call.id.is_none() {
            call.id = id.map(str::to_owned);
        }
        if let Some(arguments) = arguments {
            call.arguments.push_str(&arguments);
        }
        match name {
            Some(name) if call.name.is_empty() => {
                call.name = name.to_owned();
                Some(call.name.clone())
            }
            _ => None,
        }
    }

    /// The assembled calls, in the order they started.
    pub(crate) fn finish(self) -> Vec<ToolCall> {
        self.calls.into_iter().map(finish_call).collect()
    }
}

fn finish_call(call: PartialCall) -> ToolCall {
    let call_id = match call.id {
        Some(id) => ToolCallId(id),
        None => arguments::mint_call_id(),
    };
    let (arguments, arguments_error) = arguments::parse(call.arguments);
    ToolCall { call_id, name: call.name, arguments, arguments_error }
}

/// A piece of content after `<think>` splitting.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Reasoning(String),
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";

/// Splits reasoning that a model writes inline, as `<think>…</think>` at the very start of
/// its content (DeepSeek-R1 and others served behind plain Chat Completions), from the
/// visible answer. Content that does not start with `<think>` passes through unchanged; an
/// unterminated block is all reasoning.
#[derive(Debug)]
enum ThinkSplitter {
    /// Nothing but whitespace, or a prefix of `<think>`, seen so far.
    Start(String),
    /// Inside the block; holds back a possible partial `</think>`.
    Think(String),
    /// After `</think>`: leading whitespace of the answer is dropped.
    AfterThink,
    /// Plain text.
    Text,
}

impl Default for ThinkSplitter {
    fn default() -> Self {
        ThinkSplitter::Start(String::new())
    }
}

impl ThinkSplitter {
    fn push(&mut self, content: &str, out: &mut Vec<Piece>) {
        match self {
            ThinkSplitter::Start(buffer) => {
                buffer.push_str(content);
                let trimmed = buffer.trim_start();
                if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                    let rest = rest.to_owned();
                    *self = ThinkSplitter::Think(String::new());
                    self.push(&rest, out);
                } else if trimmed.is_empty() || THINK_OPEN.starts_with(trimmed) {
                    // Not decided yet.
                } else {
                    out.push(Piece::Text(std::mem::take(buffer)));
                    *self = ThinkSplitter::Text;
                }
            }
            ThinkSplitter::Think(pending) => {
                pending.push_str(content);
                if let Some(end) = pending.find(THINK_CLOSE) {
                    let after = pending[end + THINK_CLOSE.len()..].to_owned();
                    pending.truncate(end);
                    out.push(Piece::Reasoning(std::mem::take(pending)));
                    *self = ThinkSplitter::AfterThink;
                    self.push(&after, out);
                } else {
                    // Keep back the longest suffix that may begin `</think>`; it is ASCII,
                    // so the split falls on a character boundary.
                    let keep = (1..THINK_CLOSE.len())
                        .rev()
                        .find(|len| pending.ends_with(&THINK_CLOSE[..*len]))
                        .unwrap_or(0);
                    let held = pending.split_off(pending.len() - keep);
                    out.push(Piece::Reasoning(std::mem::replace(pending, held)));
                }
            }
            ThinkSplitter::AfterThink => {
                let trimmed = content.trim_start();
                if !trimmed.is_empty() {
                    out.push(Piece::Text(trimmed.to_owned()));
                    *self = ThinkSplitter::Text;
                }
            }
            ThinkSplitter::Text => out.push(Piece::Text(content.to_owned())),
        }
    }

    fn finish(&mut self, out: &mut Vec<Piece>) {
        match std::mem::replace(self, ThinkSplitter::Text) {
            ThinkSplitter::Start(buffer) => out.push(Piece::Text(buffer)),
            ThinkSplitter::Think(pending) => out.push(Piece::Reasoning(pending)),
            ThinkSplitter::AfterThink | ThinkSplitter::Text => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use serde_json::json;

    use super::*;

    fn fragment(
        index: Option<u64>,
        id: Option<&str>,
        name: Option<&str>,
        args: &str,
    ) -> ToolCallDelta {
        serde_json::from_value(json!({
            "index": index,
            "id": id,
            "function": {"name": name, "arguments": args},
        }))
        .unwrap()
    }

    fn summary(calls: &[ToolCall]) -> Vec<(String, String, Value)> {
        calls
            .iter()
            .map(|call| (call.call_id.0.clone(), call.name.clone(), call.arguments.clone()))
            .collect()
    }

    #[test]
    fn new_id_and_name_at_a_used_index_starts_a_new_call() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(Some(0), Some("a"), Some("read"), "{\"p\":1}"));
        calls.apply(&fragment(Some(0), Some("b"), Some("read"), "{\"p\":2}"));
        assert_eq!(
            summary(&calls.finish()),
            vec![
                ("a".into(), "read".into(), json!({"p": 1})),
                ("b".into(), "read".into(), json!({"p": 2}))
            ]
        );
    }

    #[test]
    fn new_ids_without_names_continue_the_call_at_their_index() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(Some(0), Some("first"), Some("shell"), ""));
        calls.apply(&fragment(Some(0), Some("frag-1"), Some(""), "{\"a\""));
        calls.apply(&fragment(Some(0), Some("frag-2"), None, ":1}"));
        assert_eq!(
            summary(&calls.finish()),
            vec![("first".into(), "shell".into(), json!({"a": 1}))]
        );
    }

    #[test]
    fn interleaved_indexes_route_by_index_not_by_last_seen() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(Some(0), Some("A"), Some("read"), ""));
        calls.apply(&fragment(Some(1), Some("B"), Some("list"), ""));
        calls.apply(&fragment(Some(0), None, None, "{\"x\":0}"));
        calls.apply(&fragment(Some(1), None, None, "{\"x\":1}"));
        assert_eq!(
            summary(&calls.finish()),
            vec![
                ("A".into(), "read".into(), json!({"x": 0})),
                ("B".into(), "list".into(), json!({"x": 1}))
            ]
        );
    }

    #[test]
    fn fragments_without_index_or_id_continue_the_current_call() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(None, Some("m1"), Some("weather"), "{\"city\""));
        calls.apply(&fragment(None, None, None, ":\"Paris\"}"));
        calls.apply(&fragment(None, Some("m2"), Some("time"), ""));
        calls.apply(&fragment(None, Some(""), None, "{}"));
        assert_eq!(
            summary(&calls.finish()),
            vec![
                ("m1".into(), "weather".into(), json!({"city": "Paris"})),
                ("m2".into(), "time".into(), json!({}))
            ]
        );
    }

    #[test]
    fn a_known_id_at_another_index_with_a_name_is_another_call() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(Some(0), Some("call_0"), Some("read_file"), "{\"path\":\"a\"}"));
        calls.apply(&fragment(Some(1), Some("call_0"), Some("list_dir"), "{\"path\":\"b\"}"));
        assert_eq!(
            summary(&calls.finish()),
            vec![
                ("call_0".into(), "read_file".into(), json!({"path": "a"})),
                ("call_0".into(), "list_dir".into(), json!({"path": "b"}))
            ]
        );
    }

    #[test]
    fn repeated_known_id_continues_its_call() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(Some(0), Some("x"), Some("f"), "{\"a\":"));
        calls.apply(&fragment(Some(0), Some("x"), Some("f"), "1}"));
        assert_eq!(summary(&calls.finish()), vec![("x".into(), "f".into(), json!({"a": 1}))]);
    }

    #[test]
    fn missing_id_is_minted_and_name_may_come_later() {
        let mut calls = ToolCallAssembler::default();
        assert_eq!(calls.apply(&fragment(Some(3), Some(""), None, "")), None);
        assert_eq!(
            calls.apply(&fragment(Some(3), None, Some("late"), "")),
            Some("late".to_owned())
        );
        let finished = calls.finish();
        assert_eq!(finished.len(), 1);
        assert!(finished[0].call_id.0.starts_with("call_"));
        assert!(finished[0].call_id.0.len() > "call_".len());
        assert_eq!(finished[0].name, "late");
        assert_eq!(finished[0].arguments, json!({}));
        assert_eq!(finished[0].arguments_error, None);
    }

    #[test]
    fn unparseable_arguments_are_kept_raw_with_an_error() {
        let mut calls = ToolCallAssembler::default();
        calls.apply(&fragment(
            Some(0),
            Some("c"),
            Some("make_file"),
            "{\"path\": \"a.txt\", \"con",
        ));
        let finished = calls.finish();
        assert_eq!(finished[0].arguments, json!("{\"path\": \"a.txt\", \"con"));
        assert!(
            finished[0]
                .arguments_error
                .as_deref()
                .unwrap()
                .starts_with("arguments are not valid JSON")
        );
    }

    #[test]
    fn usage_keeps_completion_when_it_excludes_reasoning() {
        // xAI (case 08): 307 + 26 + 227 = 560.
        let usage: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 307, "completion_tokens": 26, "total_tokens": 560,
            "prompt_tokens_details": {"cached_tokens": 306},
            "completion_tokens_details": {"reasoning_tokens": 227}
        }))
        .unwrap();
        assert_eq!(
            usage_from_wire(&usage),
            Usage {
                input_tokens: Some(307),
                output_tokens: Some(26),
                cached_input_tokens: Some(306),
                reasoning_tokens: Some(227)
            }
        );
        // OpenRouter (case 09): reasoning 11 exceeds completion 10.
        let usage: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 43, "completion_tokens": 10, "total_tokens": 53,
            "completion_tokens_details": {"reasoning_tokens": 11}
        }))
        .unwrap();
        // The total says reasoning is inside the completion, whatever the details say.
        assert_eq!(usage_from_wire(&usage).output_tokens, Some(0));
        assert_eq!(usage_from_wire(&usage).reasoning_tokens, Some(10));
    }

    #[test]
    fn usage_subtracts_reasoning_when_completion_includes_it() {
        // OpenAI o-series: total = prompt + completion, completion includes reasoning.
        let usage: WireUsage = serde_json::from_value(json!({
            "prompt_tokens": 100, "completion_tokens": 500, "total_tokens": 600,
            "completion_tokens_details": {"reasoning_tokens": 400}
        }))
        .unwrap();
        assert_eq!(usage_from_wire(&usage).output_tokens, Some(100));
        assert_eq!(usage_from_wire(&usage).reasoning_tokens, Some(400));
    }

    #[test]
    fn usage_without_numbers_is_not_reported() {
        assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
    }

    fn split_all(chunks: &[&str]) -> Vec<Piece> {
        let mut splitter = ThinkSplitter::default();
        let mut out = Vec::new();
        for chunk in chunks {
            splitter.push(chunk, &mut out);
        }
        splitter.finish(&mut out);
        // Merge neighbours of the same kind so the result does not depend on chunking.
        let mut merged: Vec<Piece> = Vec::new();
        for piece in out {
            match (merged.last_mut(), piece) {
                (Some(Piece::Text(last)), Piece::Text(text)) => last.push_str(&text),
                (Some(Piece::Reasoning(last)), Piece::Reasoning(text)) => last.push_str(&text),
                (_, piece) => merged.push(piece),
            }
        }
        merged
            .retain(|piece| !matches!(piece, Piece::Text(t) | Piece::Reasoning(t) if t.is_empty()));
        merged
    }

    #[test]
    fn think_block_is_split_from_the_answer_at_any_chunking() {
        let content = "\n<think>\nplan: a < b </thin k> ok</think>\n\nThe answer.";
        let expected = vec![
            Piece::Reasoning("\nplan: a < b </thin k> ok".to_owned()),
            Piece::Text("The answer.".to_owned()),
        ];
        assert_eq!(split_all(&[content]), expected);
        for split in 0..=content.len() {
            if content.is_char_boundary(split) {
                assert_eq!(split_all(&[&content[..split], &content[split..]]), expected, "{split}");
            }
        }
        let chars: Vec<String> = content.chars().map(String::from).collect();
        let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(split_all(&refs), expected);
    }

    #[test]
    fn unterminated_think_block_is_all_reasoning() {
        assert_eq!(
            split_all(&["<think>\nHmm", ", the user"]),
            vec![Piece::Reasoning("\nHmm, the user".to_owned())]
        );
    }

    #[test]
    fn content_without_think_passes_through() {
        assert_eq!(
            split_all(&["  <thi", "s is text"]),
            vec![Piece::Text("  <this is text".to_owned())]
        );
        assert_eq!(split_all(&["<thi"]), vec![Piece::Text("<thi".to_owned())]);
        assert_eq!(split_all(&["a <think> b"]), vec![Piece::Text("a <think> b".to_owned())]);
    }

    #[test]
    fn deltas_are_reported_live() {
        let seen = Mutex::new(Vec::new());
        let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
        let mut assembler = Assembler::new(&on_delta, None);
        for data in [
            r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"choices":[{"delta":{"content":"Hi"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c","function":{"name":"f","arguments":""}}]}}]}"#,
            r#"{"choices":[{"delta":{},"finish_reason":"tool_calls"}]}"#,
        ] {
            assert_eq!(assembler.apply_event("message", data), Ok(Flow::Continue));
        }
        assert_eq!(assembler.apply_event("message", "[DONE]"), Ok(Flow::Done));
        let response = assembler.finish();
        assert_eq!(response.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            seen.into_inner().unwrap(),
            vec![
                StreamDelta::Reasoning("hm".into()),
                StreamDelta::Text("Hi".into()),
                StreamDelta::ToolCallStarted { name: "f".into() }
            ]
        );
    }

    #[test]
    fn refusal_becomes_the_text_and_the_reason() {
        let on_delta = |_: StreamDelta| {};
        let mut assembler = Assembler::new(&on_delta, None);
        assembler
            .apply_event(
                "message",
                r#"{"choices":[{"delta":{"refusal":"I can't"},"finish_reason":"stop"}]}"#,
            )
            .unwrap();
        let response = assembler.finish();
        assert_eq!(response.text, "I can't");
        assert_eq!(response.finish_reason, FinishReason::Refusal);
    }

    #[test]
    fn malformed_chunk_is_a_stream_error() {
        let on_delta = |_: StreamDelta| {};
        let mut assembler = Assembler::new(&on_delta, None);
        let error = assembler.apply_event("message", "{not json").unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::InvalidResponse);
        assert!(!error.is_retryable());
    }

    #[test]
    fn thinking_content_parts_are_reasoning_in_every_shape() {
        let on_delta = |_: StreamDelta| {};
        let mut assembler = Assembler::new(&on_delta, None);
        for data in [
            r#"{"choices":[{"delta":{"content":[{"type":"thinking","thinking":[{"type":"text","text":"Plan"}]}]}}]}"#,
            r#"{"choices":[{"delta":{"content":[{"type":"thinking","thinking":" more."}]}}]}"#,
            r#"{"choices":[{"delta":{"content":[{"type":"text","text":"4"}]}}]}"#,
            r#"{"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}"#,
        ] {
            assembler.apply_event("message", data).unwrap();
        }
        let response = assembler.finish();
        assert_eq!(response.text, "4");
        assert_eq!(response.reasoning[0].text, "Plan more.");
    }
}
