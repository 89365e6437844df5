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
//!
//! The pieces: this module reads the events and keeps the items by output index; `item`
//! is one output item (what the wire says of it, how its `.done` form overlays what
//! streamed, calls of kinds keel never declares); `finish` turns the items into the
//! [`ModelResponse`], with the finish reason and usage.
//!
//! [`ModelResponse`]: keel_contracts::ModelResponse
//! [`ReasoningPart`]: keel_contracts::ReasoningPart

mod finish;
mod item;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use keel_contracts::{ModelError, ModelErrorKind, StreamDelta};
use serde_json::Value;

use super::wire::{OutputItem, ResponseObject, StreamEvent};
use crate::failure;
use crate::transport::Flow;
use item::Item;

/// The callback that receives live deltas.
pub(crate) type OnDelta<'a> = &'a (dyn Fn(StreamDelta) + Send + Sync);

/// The separator put between the texts of two message items, and between two summary
/// parts of a reasoning item.
const PART_SEPARATOR: &str = "\n\n";

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
}
