//! Assembling Responses API stream events into a [`ModelResponse`].
//!
//! Events (OpenAI, "Streaming events"): `response.created` and `response.in_progress`,
//! then per output item `response.output_item.added`, its deltas
//! (`response.output_text.delta`, `response.refusal.delta`,
//! `response.function_call_arguments.delta`/`.done`,
//! `response.reasoning_summary_part.added`, `response.reasoning_summary_text.delta`,
//! `response.reasoning_text.delta`) and `response.output_item.done`; the stream ends with
//! `response.completed`, `response.incomplete` or `response.failed`, and an `error` event
//! may end it at any point. There is no `[DONE]`. The event's kind is read from the JSON
//! `type` (the SSE `event:` name is only a fallback).
//!
//! Invariants:
//! - Items are kept by `output_index`; a `.done` item (and the final response's `output`)
//!   is authoritative over the deltas that built it. The final `output` is matched to the
//!   streamed items by item `id`, by position only for an item whose id did not stream
//!   (servers that rotate ids, corpus `github-copilot-id-rotation.1`): output indexes may
//!   skip numbers, so a position is not an identity (corpus `openai-phase.1`).
//! - Events keel does not use are never parsed strictly: a field of an unexpected shape
//!   reads as absent (`crate::lenient`), and an event of a kind keel ignores is skipped
//!   even when its data is not JSON.
//! - A call the client must answer (a `*_call` item with a `call_id`) of a kind keel never
//!   declares (`custom_tool_call`, `apply_patch_call`, `local_shell_call`, a local
//!   `shell_call`, a client `tool_search_call`, `computer_call`, …) is kept as a tool call
//!   with `arguments_error` set: the model is told it cannot be run, the user sees it, and
//!   it is never executed; never an empty answer. Such an item is the server's own (and
//!   ignored) when the server says it runs it (`execution: server`, a container
//!   `environment`), when the response carries its output (an item with the same
//!   `call_id`), or when the model went on to a message after it.
//! - Data that is not JSON in an event keel reads is [`ModelErrorKind::InvalidResponse`]:
//!   a complete response that cannot be read is not retried.
//! - A reasoning item becomes one [`ReasoningPart`]: its summary text (parts joined with a
//!   blank line) and its `encrypted_content` in `redacted`, byte-exact.
//! - A function call cut off by `response.incomplete` (or with status `incomplete`) is kept
//!   with `arguments_error`, so it is never executed.
//! - `response.failed` and `error` events are errors, never folded into a success.

use std::collections::BTreeMap;

use keel_contracts::{
    FinishReason, ModelError, ModelErrorKind, ModelResponse, ReasoningPart, StreamDelta, ToolCall,
    ToolCallId, Usage,
};
use serde_json::Value;

use super::wire::{OutputItem, ResponseObject, StreamEvent, WireUsage};
use crate::arguments;
use crate::failure;
use crate::transport::Flow;

/// The callback that receives live deltas.
pub(crate) type OnDelta<'a> = &'a (dyn Fn(StreamDelta) + Send + Sync);

/// The separator put between the texts of two message items, and between two summary
/// parts of a reasoning item.
const PART_SEPARATOR: &str = "\n\n";

/// One output item while it streams.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Item {
    Message {
        text: String,
        refusal: String,
    },
    FunctionCall {
        call_id: String,
        name: String,
        arguments: String,
        complete: bool,
    },
    Reasoning {
        summary: Vec<String>,
        content: String,
        encrypted_content: Option<String>,
    },
    /// An item of another kind; `call` is set when it is a call the client must answer.
    Other {
        call: Option<ForeignCall>,
    },
}

/// A call of a tool kind keel did not declare, as the item described it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ForeignCall {
    /// The item's `type`, e.g. `apply_patch_call`.
    kind: String,
    call_id: String,
    /// The tool's name: the item's `name`, else its kind without `_call`.
    name: String,
    /// The call's input as JSON text.
    arguments: String,
    /// Whether the server says it runs this call itself.
    server_side: bool,
}

/// How the response ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum End {
    Completed,
    /// `response.incomplete`, with `incomplete_details.reason`.
    Incomplete(Option<String>),
}

/// Collects one response while it streams.
pub(crate) struct Assembler<'a> {
    on_delta: OnDelta<'a>,
    secret: Option<&'a str>,
    items: BTreeMap<u64, Item>,
    /// The item id of each streamed item that had one, by output index.
    ids: BTreeMap<u64, String>,
    /// `call_id`s of output items that answer a call inside the response (`*_output`).
    answered_calls: Vec<String>,
    /// Whether any visible text was shown yet (for [`PART_SEPARATOR`]).
    shown_text: bool,
    usage: Option<Value>,
    end: Option<End>,
}

/// The event kinds the assembler reads; any other is skipped unparsed.
const READ_EVENTS: &[&str] = &[
    "response.output_item.added",
    "response.output_item.done",
    "response.output_text.delta",
    "response.refusal.delta",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.reasoning_summary_part.added",
    "response.reasoning_summary_text.delta",
    "response.reasoning_text.delta",
    "response.completed",
    "response.incomplete",
    "response.failed",
    "error",
];

impl std::fmt::Debug for Assembler<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assembler")
            .field("items", &self.items)
            .field("usage", &self.usage)
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl<'a> Assembler<'a> {
    /// A new, empty response; `secret` is redacted from any error message.
    pub(crate) fn new(on_delta: OnDelta<'a>, secret: Option<&'a str>) -> Self {
        Assembler {
            on_delta,
            secret,
            items: BTreeMap::new(),
            ids: BTreeMap::new(),
            answered_calls: Vec::new(),
            shown_text: false,
            usage: None,
            end: None,
        }
    }

    /// Applies one SSE event.
    ///
    /// # Errors
    ///
    /// An `error` event or `response.failed` becomes the error it describes (see
    /// `failure::in_band_error`); data that is not JSON, in an event keel reads, is a
    /// [`ModelErrorKind::InvalidResponse`] error.
    pub(crate) fn apply_event(&mut self, event: &str, data: &str) -> Result<Flow, ModelError> {
        if data.trim().is_empty() {
            return Ok(Flow::Continue);
        }
        let value: Value = match serde_json::from_str(data) {
            Ok(value) => value,
            Err(_) if event == "error" => {
                return Err(failure::in_band_error(&Value::String(data.to_owned()), self.secret));
            }
            Err(error) if event == "message" || READ_EVENTS.contains(&event) => {
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
        let kind = value.get("type").and_then(Value::as_str).unwrap_or(event).to_owned();
        if kind == "error" {
            return Err(failure::in_band_error(value.get("error").unwrap_or(&value), self.secret));
        }
        if !READ_EVENTS.contains(&kind.as_str()) {
            tracing::trace!(event = kind, "ignoring event in responses stream");
            return Ok(Flow::Continue);
        }
        let parsed: StreamEvent = serde_json::from_value(value).map_err(|error| {
            ModelError::new(
                ModelErrorKind::InvalidResponse,
                None,
                format!("malformed {kind} event: {error}"),
            )
        })?;
        let index = parsed.output_index.unwrap_or(0);
        let delta = parsed.delta.unwrap_or_default();
        match kind.as_str() {
            "response.output_item.added" => {
                if let Some(item) = parsed.item {
                    self.note_ids(index, &item);
                    self.items.entry(index).or_insert_with(|| {
                        let item = Item::from_wire(&item, false);
                        if let Item::FunctionCall { name, .. } = &item {
                            (self.on_delta)(StreamDelta::ToolCallStarted { name: name.clone() });
                        }
                        item
                    });
                }
            }
            "response.output_item.done" => {
                if let Some(item) = parsed.item {
                    self.note_ids(index, &item);
                    self.apply_done_item(index, &item);
                }
            }
            "response.output_text.delta" => self.push_text(index, delta),
            "response.refusal.delta" => {
                if let Item::Message { refusal, .. } = self.message_at(index) {
                    refusal.push_str(&delta);
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(Item::FunctionCall { arguments, .. }) = self.items.get_mut(&index) {
                    arguments.push_str(&delta);
                }
            }
            "response.function_call_arguments.done" => {
                if let (Some(Item::FunctionCall { arguments, .. }), Some(done)) =
                    (self.items.get_mut(&index), parsed.arguments)
                {
                    *arguments = done;
                }
            }
            "response.reasoning_summary_part.added" => {
                let part = parsed.summary_index;
                if let Item::Reasoning { summary, .. } = self.reasoning_at(index) {
                    let part =
                        part.and_then(|part| usize::try_from(part).ok()).unwrap_or(summary.len());
                    if summary.len() <= part {
                        summary.resize(part + 1, String::new());
                    }
                }
            }
            "response.reasoning_summary_text.delta" => {
                let part = parsed.summary_index;
                if let Item::Reasoning { summary, .. } = self.reasoning_at(index) {
                    let part = part
                        .and_then(|part| usize::try_from(part).ok())
                        .unwrap_or(summary.len().saturating_sub(1));
                    if summary.len() <= part {
                        summary.resize(part + 1, String::new());
                    }
                    if let Some(text) = summary.get_mut(part) {
                        text.push_str(&delta);
                    }
                }
                self.show_reasoning(delta);
            }
            "response.reasoning_text.delta" => {
                if let Item::Reasoning { content, .. } = self.reasoning_at(index) {
                    content.push_str(&delta);
                }
                self.show_reasoning(delta);
            }
            "response.completed" | "response.incomplete" => {
                let response = parsed.response.unwrap_or_default();
                let end = if kind == "response.completed" {
                    End::Completed
                } else {
                    End::Incomplete(
                        response
                            .incomplete_details
                            .as_ref()
                            .and_then(|details| details.reason.clone()),
                    )
                };
                self.apply_final(response, end);
                return Ok(Flow::Done);
            }
            "response.failed" => {
                let error = parsed
                    .response
                    .and_then(|response| response.error)
                    .filter(|error| !error.is_null())
                    .unwrap_or_else(|| Value::String("response failed".to_owned()));
                return Err(failure::in_band_error(&error, self.secret));
            }
            other => tracing::trace!(event = other, "ignoring event in responses stream"),
        }
        Ok(Flow::Continue)
    }

    /// Applies a whole response object (a non-streaming body).
    ///
    /// # Errors
    ///
    /// A body with an `error` object is that error.
    pub(crate) fn apply_body(&mut self, body: &[u8]) -> Result<(), ModelError> {
        let response: ResponseObject = serde_json::from_slice(body).map_err(|error| {
            ModelError::new(
                ModelErrorKind::InvalidResponse,
                None,
                format!("malformed response body: {error}"),
            )
        })?;
        if let Some(error) = response.error.as_ref().filter(|error| !error.is_null()) {
            return Err(failure::in_band_error(error, self.secret));
        }
        let end = match response.status.as_deref() {
            Some("incomplete") => End::Incomplete(
                response.incomplete_details.as_ref().and_then(|details| details.reason.clone()),
            ),
            _ => End::Completed,
        };
        self.apply_final(response, end);
        Ok(())
    }

    /// Whether the response ended (`response.completed` or `response.incomplete`).
    pub(crate) fn has_ended(&self) -> bool {
        self.end.is_some()
    }

    fn apply_final(&mut self, response: ResponseObject, end: End) {
        if let Some(usage) = response.usage.filter(|usage| !usage.is_null()) {
            self.usage = Some(usage);
        }
        let output = response.output.unwrap_or_default();
        // Streamed items named by an id in the final output belong to that item only.
        let final_ids: Vec<&str> = output.iter().filter_map(|item| item.id.as_deref()).collect();
        let mut matched: Vec<u64> = Vec::new();
        for (position, item) in output.iter().enumerate() {
            let position = u64::try_from(position).unwrap_or(u64::MAX);
            let by_id = item.id.as_deref().and_then(|id| {
                self.ids.iter().find(|(_, streamed)| streamed.as_str() == id).map(|(at, _)| *at)
            });
            let by_position = || {
                let unclaimed = self
                    .ids
                    .get(&position)
                    .is_none_or(|streamed| !final_ids.contains(&streamed.as_str()));
                (unclaimed && !matched.contains(&position)).then_some(position)
            };
            let index = by_id.or_else(by_position).unwrap_or_else(|| {
                self.items.keys().next_back().map_or(position, |last| last.saturating_add(1))
            });
            matched.push(index);
            self.note_ids(index, item);
            self.apply_done_item(index, item);
        }
        self.end = Some(end);
    }

    /// Remembers the id of the item at `index`, and the call an `*_output` item answers.
    fn note_ids(&mut self, index: u64, item: &OutputItem) {
        if let Some(id) = item.id.as_ref().filter(|id| !id.is_empty()) {
            self.ids.entry(index).or_insert_with(|| id.clone());
        }
        if item.kind.as_deref().is_some_and(|kind| kind.ends_with("_output"))
            && let Some(call_id) = item.call_id.as_ref().filter(|id| !id.is_empty())
        {
            self.answered_calls.push(call_id.clone());
        }
    }

    fn apply_done_item(&mut self, index: u64, wire: &OutputItem) {
        let done = Item::from_wire(wire, wire.status.as_deref() != Some("incomplete"));
        let merged = match (self.items.remove(&index), done) {
            (None, done) => {
                if let Item::FunctionCall { name, .. } = &done {
                    (self.on_delta)(StreamDelta::ToolCallStarted { name: name.clone() });
                }
                if let Item::Message { text, .. } = &done {
                    // Text that never streamed as deltas is shown now.
                    self.show_text(text.clone());
                }
                done
            }
            (Some(streamed), done) => {
                if let (Item::Message { text: streamed_text, .. }, Item::Message { text, .. }) =
                    (&streamed, &done)
                    && text != streamed_text
                {
                    // Text the deltas did not carry (a trimmed or whole-item stream) is
                    // shown now, so what was shown adds up to the answer.
                    match text.strip_prefix(streamed_text.as_str()) {
                        Some(rest) if streamed_text.is_empty() => self.show_text(rest.to_owned()),
                        Some(rest) => (self.on_delta)(StreamDelta::Text(rest.to_owned())),
                        None => tracing::debug!(
                            index,
                            "a done message differs from its streamed text; the done text wins"
                        ),
                    }
                }
                streamed.overlaid_by(done)
            }
        };
        self.items.insert(index, merged);
    }

    fn message_at(&mut self, index: u64) -> &mut Item {
        self.items
            .entry(index)
            .or_insert_with(|| Item::Message { text: String::new(), refusal: String::new() })
    }

    fn reasoning_at(&mut self, index: u64) -> &mut Item {
        self.items.entry(index).or_insert_with(|| Item::Reasoning {
            summary: Vec::new(),
            content: String::new(),
            encrypted_content: None,
        })
    }

    fn push_text(&mut self, index: u64, delta: String) {
        if delta.is_empty() {
            return;
        }
        let fresh = match self.items.get(&index) {
            None => true,
            Some(Item::Message { text, .. }) => text.is_empty(),
            Some(_) => false,
        };
        let separate = self.shown_text && fresh;
        if let Item::Message { text, .. } = self.message_at(index) {
            text.push_str(&delta);
        }
        if separate {
            (self.on_delta)(StreamDelta::Text(PART_SEPARATOR.to_owned()));
        }
        self.shown_text = true;
        (self.on_delta)(StreamDelta::Text(delta));
    }

    /// Shows `text` of a message item that arrived whole, keeping live text equal to the
    /// final text.
    fn show_text(&mut self, text: String) {
        if text.is_empty() {
            return;
        }
        if self.shown_text {
            (self.on_delta)(StreamDelta::Text(PART_SEPARATOR.to_owned()));
        }
        self.shown_text = true;
        (self.on_delta)(StreamDelta::Text(text));
    }

    fn show_reasoning(&self, delta: String) {
        if !delta.is_empty() {
            (self.on_delta)(StreamDelta::Reasoning(delta));
        }
    }

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

impl Item {
    /// The item as the wire describes it; `complete` says whether a function call's
    /// arguments are whole.
    fn from_wire(item: &OutputItem, complete: bool) -> Item {
        let texts =
            |parts: &Option<Vec<super::wire::ContentPartOut>>, kinds: &[&str]| -> Vec<String> {
                parts
                    .iter()
                    .flatten()
                    .filter(|part| part.kind.as_deref().is_some_and(|kind| kinds.contains(&kind)))
                    .filter_map(|part| part.text.clone().or_else(|| part.refusal.clone()))
                    .collect()
            };
        match item.kind.as_deref() {
            Some("message") => Item::Message {
                text: texts(&item.content, &["output_text"]).concat(),
                refusal: texts(&item.content, &["refusal"]).concat(),
            },
            Some("function_call") => Item::FunctionCall {
                call_id: item.call_id.clone().unwrap_or_default(),
                name: item.name.clone().unwrap_or_default(),
                arguments: item.arguments.clone().unwrap_or_default(),
                complete,
            },
            Some("reasoning") => Item::Reasoning {
                summary: texts(&item.summary, &["summary_text"]),
                content: texts(&item.content, &["reasoning_text"]).concat(),
                encrypted_content: item.encrypted_content.clone(),
            },
            Some(kind) => Item::Other { call: ForeignCall::from_wire(kind, item) },
            None => Item::Other { call: None },
        }
    }

    /// This streamed item with the fields of its `.done` form laid over it; a field the
    /// `.done` form leaves empty keeps what streamed.
    fn overlaid_by(self, done: Item) -> Item {
        let pick = |streamed: String, done: String| if done.is_empty() { streamed } else { done };
        match (self, done) {
            (
                Item::Message { text, refusal },
                Item::Message { text: done_text, refusal: done_refusal },
            ) => {
                Item::Message { text: pick(text, done_text), refusal: pick(refusal, done_refusal) }
            }
            (
                Item::FunctionCall { call_id, name, arguments, complete: _ },
                Item::FunctionCall {
                    call_id: done_id,
                    name: done_name,
                    arguments: done_arguments,
                    complete,
                },
            ) => Item::FunctionCall {
                call_id: pick(call_id, done_id),
                name: pick(name, done_name),
                arguments: pick(arguments, done_arguments),
                complete,
            },
            (
                Item::Reasoning { summary, content, encrypted_content },
                Item::Reasoning {
                    summary: done_summary,
                    content: done_content,
                    encrypted_content: done_encrypted,
                },
            ) => Item::Reasoning {
                summary: if done_summary.iter().all(String::is_empty) {
                    summary
                } else {
                    done_summary
                },
                content: pick(content, done_content),
                encrypted_content: done_encrypted.or(encrypted_content),
            },
            (_, done) => done,
        }
    }
}

impl ForeignCall {
    /// The call an item of `kind` asks the client to answer, when it is one: the API names
    /// call items `*_call`, and a call the client answers has a `call_id` (a hosted
    /// `program` item has one too, but is no call: the function calls it makes are).
    fn from_wire(kind: &str, item: &OutputItem) -> Option<ForeignCall> {
        if !kind.ends_with("_call") {
            return None;
        }
        let call_id = item.call_id.clone().filter(|id| !id.is_empty())?;
        let name = item
            .name
            .clone()
            .filter(|name| !name.is_empty())
            .unwrap_or_else(|| kind.strip_suffix("_call").unwrap_or(kind).to_owned());
        let arguments = if let Some(arguments) = &item.arguments {
            arguments.clone()
        } else if let Some(input) = &item.input {
            Value::String(input.clone()).to_string()
        } else if let Some(operation) = &item.operation {
            serde_json::json!({"operation": operation}).to_string()
        } else if let Some(action) = &item.action {
            serde_json::json!({"action": action}).to_string()
        } else {
            "{}".to_owned()
        };
        let environment = item
            .environment
            .as_ref()
            .and_then(|environment| environment.get("type"))
            .and_then(Value::as_str);
        let server_side = item.execution.as_deref() == Some("server")
            || environment.is_some_and(|environment| environment != "local");
        Some(ForeignCall { kind: kind.to_owned(), call_id, name, arguments, server_side })
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
            let kind = event["type"].as_str().unwrap_or("message");
            match assembler.apply_event(kind, &event.to_string()) {
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

    #[test]
    fn usage_subtracts_reasoning_from_output() {
        let usage: WireUsage = serde_json::from_value(json!({
            "input_tokens": 120, "input_tokens_details": {"cached_tokens": 100},
            "output_tokens": 300, "output_tokens_details": {"reasoning_tokens": 256},
            "total_tokens": 420
        }))
        .unwrap();
        assert_eq!(
            usage_from_wire(&usage),
            Usage {
                input_tokens: Some(120),
                output_tokens: Some(44),
                cached_input_tokens: Some(100),
                reasoning_tokens: Some(256)
            }
        );
        assert_eq!(usage_from_wire(&WireUsage::default()), Usage::default());
    }

    #[test]
    fn incomplete_response_cuts_off_an_unfinished_call() {
        let (result, deltas) = run(&[
            json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "function_call", "call_id": "call_1", "name": "write_file", "arguments": ""}}),
            json!({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": "{\"path\":"}),
            json!({"type": "response.incomplete", "response": {"status": "incomplete",
                "incomplete_details": {"reason": "max_output_tokens"}, "output": []}}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.finish_reason, FinishReason::Length);
        assert_eq!(response.tool_calls[0].arguments, json!("{\"path\":"));
        assert!(response.tool_calls[0].arguments_error.as_deref().unwrap().contains("cut off"));
        assert_eq!(deltas, vec![StreamDelta::ToolCallStarted { name: "write_file".into() }]);
    }

    #[test]
    fn failed_response_and_error_events_are_errors() {
        let (result, _) =
            run(&[json!({"type": "response.failed", "response": {"status": "failed",
            "error": {"code": "server_error", "message": "The server had an error"}}})]);
        let error = result.unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::Server);
        assert!(error.message.contains("The server had an error"));
        let (result, _) = run(&[json!({"type": "error", "code": "rate_limit_exceeded",
            "message": "Rate limit reached", "param": null, "sequence_number": 3})]);
        assert_eq!(result.unwrap_err().kind, ModelErrorKind::RateLimited { retry_after: None });
    }

    #[test]
    fn refusal_becomes_the_text_and_the_reason() {
        let (result, _) = run(&[
            json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"type": "message", "role": "assistant", "content": []}}),
            json!({"type": "response.refusal.delta", "output_index": 0, "delta": "I can't help"}),
            json!({"type": "response.completed", "response": {"status": "completed"}}),
        ]);
        let response = result.unwrap();
        assert_eq!(response.text, "I can't help");
        assert_eq!(response.finish_reason, FinishReason::Refusal);
    }

    #[test]
    fn final_output_fills_in_what_did_not_stream() {
        let (result, deltas) = run(&[json!({"type": "response.completed", "response": {
            "status": "completed",
            "output": [
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": "a"},
                    {"type": "summary_text", "text": "b"}], "encrypted_content": "gAAA"},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi."}]}
            ],
            "usage": {"input_tokens": 3, "output_tokens": 2}
        }})]);
        let response = result.unwrap();
        assert_eq!(response.text, "Hi.");
        assert_eq!(
            response.reasoning,
            vec![ReasoningPart {
                text: "a\n\nb".into(),
                signature: None,
                redacted: Some("gAAA".into())
            }]
        );
        assert_eq!(response.finish_reason, FinishReason::Stop);
        assert_eq!(deltas, vec![StreamDelta::Text("Hi.".into())]);
    }

    fn done(index: u64, item: Value) -> Value {
        json!({"type": "response.output_item.done", "output_index": index, "item": item})
    }

    fn completed(output: Value) -> Value {
        json!({"type": "response.completed", "response": {"status": "completed", "output": output}})
    }

    #[test]
    fn final_output_is_matched_by_id_not_position() {
        let first = json!({"id": "msg_a", "type": "message",
            "content": [{"type": "output_text", "text": "One."}]});
        let second = json!({"id": "msg_b", "type": "message",
            "content": [{"type": "output_text", "text": "Two."}]});
        // Streamed at output indexes 0 and 2; the final output lists them at 0 and 1.
        let (result, deltas) = run(&[
            done(0, first.clone()),
            done(2, second.clone()),
            completed(json!([first, second])),
        ]);
        assert_eq!(result.unwrap().text, "One.\n\nTwo.");
        let live: String = deltas
            .iter()
            .filter_map(|delta| match delta {
                StreamDelta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(live, "One.\n\nTwo.");
    }

    #[test]
    fn final_output_with_rotated_ids_falls_back_to_position() {
        let streamed = json!({"id": "msg_1", "type": "message",
            "content": [{"type": "output_text", "text": "Hi."}]});
        let rotated = json!({"id": "msg_9", "type": "message",
            "content": [{"type": "output_text", "text": "Hi."}]});
        let (result, _) = run(&[done(0, streamed), completed(json!([rotated]))]);
        assert_eq!(result.unwrap().text, "Hi.");
    }

    #[test]
    fn undeclared_client_calls_are_refused_calls_never_an_empty_answer() {
        for (item, name) in [
            (
                json!({"type": "custom_tool_call", "call_id": "c1", "name": "write_sql",
                "input": "SELECT 1"}),
                "write_sql",
            ),
            (
                json!({"type": "apply_patch_call", "call_id": "c1",
                "operation": {"type": "delete_file", "path": "a"}}),
                "apply_patch",
            ),
            (
                json!({"type": "local_shell_call", "call_id": "c1",
                "action": {"type": "exec", "command": ["ls"]}}),
                "local_shell",
            ),
            (
                json!({"type": "shell_call", "call_id": "c1", "action": {"commands": ["ls"]}}),
                "shell",
            ),
            (
                json!({"type": "tool_search_call", "call_id": "c1", "execution": "client",
                "arguments": {"goal": "weather"}}),
                "tool_search",
            ),
        ] {
            let (result, deltas) = run(&[done(0, item.clone()), completed(json!([item]))]);
            let response = result.unwrap();
            assert_eq!(response.finish_reason, FinishReason::ToolCalls, "{name}");
            assert_eq!(response.tool_calls.len(), 1, "{name}");
            let call = &response.tool_calls[0];
            assert_eq!((call.name.as_str(), call.call_id.as_str()), (name, "c1"));
            assert!(call.arguments_error.as_deref().unwrap().contains("not executed"), "{name}");
            assert_eq!(deltas, vec![StreamDelta::ToolCallStarted { name: name.into() }]);
        }
        // The tool-search arguments object survives as the call's arguments.
        let item = json!({"type": "tool_search_call", "call_id": "c1", "execution": "client",
            "arguments": {"goal": "weather"}});
        let (result, _) = run(&[done(0, item)]);
        assert_eq!(result.unwrap().tool_calls[0].arguments, json!({"goal": "weather"}));
    }

    #[test]
    fn calls_the_server_runs_are_not_refused() {
        let message = json!({"id": "m", "type": "message",
            "content": [{"type": "output_text", "text": "Done."}]});
        for items in [
            // The server says it runs them.
            vec![json!({"type": "shell_call", "call_id": "c1",
                "environment": {"type": "container_reference"}})],
            vec![json!({"type": "tool_search_call", "call_id": "c1", "execution": "server"})],
            // Its output is in the response.
            vec![
                json!({"type": "computer_call", "call_id": "c1"}),
                json!({"type": "computer_call_output", "call_id": "c1"}),
            ],
            // The model went on to a message after it (xAI's server-side custom tools).
            vec![
                json!({"type": "custom_tool_call", "call_id": "c1", "name": "x_search"}),
                message.clone(),
            ],
            // Not a call at all.
            vec![json!({"type": "program", "call_id": "c1", "code": ""})],
            vec![json!({"type": "web_search_call", "id": "ws_1", "status": "completed"})],
        ] {
            let events: Vec<Value> = items
                .iter()
                .enumerate()
                .map(|(index, item)| done(u64::try_from(index).unwrap(), item.clone()))
                .collect();
            let (result, _) = run(&events);
            let response = result.unwrap();
            assert!(response.tool_calls.is_empty(), "{items:?}");
            assert_eq!(response.finish_reason, FinishReason::Stop, "{items:?}");
        }
    }

    #[test]
    fn events_keel_ignores_never_fail_and_unreadable_events_it_reads_are_not_retried() {
        let seen = Mutex::new(Vec::new());
        let on_delta = |delta: StreamDelta| seen.lock().unwrap().push(delta);
        let mut assembler = Assembler::new(&on_delta, None);
        let odd = json!({"type": "response.shell_call_output_content.delta", "output_index": 0,
            "delta": {"stdout": "x"}});
        assert_eq!(assembler.apply_event("message", &odd.to_string()), Ok(Flow::Continue));
        assert_eq!(assembler.apply_event("response.created", "{\"trunc"), Ok(Flow::Continue));
        let error = assembler.apply_event("response.completed", "{\"trunc").unwrap_err();
        assert_eq!(error.kind, ModelErrorKind::InvalidResponse);
        assert!(!error.is_retryable());
    }
}
