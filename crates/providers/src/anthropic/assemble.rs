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
//!   `message_delta`; see [`finish::usage_from_wire`] for how it maps to keel's
//!   [`Usage`](keel_contracts::Usage).
//! - An `error` event is an error, never folded into a success.
//!
//! The pieces: this module reads the events and builds each content block while it
//! streams; `finish` turns the blocks into the [`ModelResponse`], with the finish reason,
//! the refusal text and the usage.
//!
//! [`ModelResponse`]: keel_contracts::ModelResponse

mod finish;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use keel_contracts::{ModelError, ModelErrorKind, StreamDelta};
use serde_json::Value;

use super::wire::{ContentBlock, EventDelta, StreamEvent, WireUsage};
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
}
