//! The incremental projection (issue #13): the fitted request kept between steps and
//! extended with what each step added, so a step costs what changed, not the window.
//!
//! [`IncrementalContext`] keeps, for the retained part of the ledger, the projected entries
//! (a [`Projector`] fold fed only the new events), each entry's token estimate (computed
//! once), the stub that replaces it when pruned (made once), and the messages of the last
//! request with their digests ([`MessageDigests`]). Every step it redoes only the pruning *decisions*, over
//! the cached integer sizes with the same algorithm as [`context::prune`](super::prune), and changes the
//! kept messages where a decision changed.
//!
//! Invariant (checked by the kernel's equivalence property test): for the same events and
//! window, [`IncrementalContext::fit`] reports what [`context::fit`](super::fit) of
//! [`context::retained_entries`](super::retained_entries) reports, [`IncrementalContext::take_request`] gives what
//! [`context::place_carried_note`](super::place_carried_note) gives for its messages, and
//! [`IncrementalContext::digest`] equals [`crate::digest::request_digest`].
//!
//! It rebuilds from the events (once, O(window)) when the retained part changes: a new
//! active compaction, or a slice that no longer starts or continues where it did.

use std::collections::BTreeMap;

use keel_contracts::{
    EventKind, Message, ModelRequest, RuntimeEvent, Seq, TokenCounter, estimate_message_tokens,
};

use super::{CARRIED_NOTE_HEADING, CARRIED_NOTE_OPENING, CONTINUE_NOTE, MIN_PREVIEW_BYTES, Window};
use crate::digest::MessageDigests;
use crate::projection::{self, Entry, Projector};

/// What a fit came to: the figures of [`context::Fitted`](super::Fitted) without the
/// messages (take them with [`IncrementalContext::take_request`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FitSummary {
    /// The request's estimated size (messages plus the fixed part), in tokens.
    pub tokens: u64,
    /// The estimate before pruning, when anything was pruned.
    pub tokens_before_pruning: Option<u64>,
    /// Results pruned to stubs or shrunk.
    pub pruned_results: u64,
    /// Whether the request is still over budget.
    pub over_budget: bool,
}

impl From<&super::Fitted> for FitSummary {
    fn from(fitted: &super::Fitted) -> FitSummary {
        FitSummary {
            tokens: fitted.tokens,
            tokens_before_pruning: fitted.tokens_before_pruning,
            pruned_results: fitted.pruned_results,
            over_budget: fitted.over_budget,
        }
    }
}

/// What a request holds for one entry.
#[derive(Debug, Clone, PartialEq)]
enum Form {
    /// The entry as projected.
    Original,
    /// A pruned result: its stub.
    Stub,
    /// A latest result shrunk to this content.
    Shrunk(String),
}

#[derive(Debug)]
struct Slot {
    entry: Entry,
    /// The entry's estimated tokens, unscaled.
    raw: u64,
    /// The stub that replaces this result when pruned, and its unscaled tokens: made the
    /// first time pruning reaches the entry.
    stub: Option<(String, u64)>,
    /// What the kept messages hold for it.
    sent: Form,
    /// What the latest fit wants.
    want: Form,
}

/// Where the kept messages start relative to the entries: the carried note that opens the
/// entries moves to the system prompt (`skip == 1`), and [`CONTINUE_NOTE`] may stand first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Front {
    skip: usize,
    continue_note: bool,
}

impl Front {
    fn of(slots: &[Slot]) -> Front {
        match slots.first().map(|slot| &slot.entry.message) {
            Some(Message::User { text }) if text.starts_with(CARRIED_NOTE_OPENING) => Front {
                skip: 1,
                continue_note: !matches!(
                    slots.get(1).map(|slot| &slot.entry.message),
                    Some(Message::User { .. })
                ),
            },
            _ => Front { skip: 0, continue_note: false },
        }
    }

    /// The index in the kept messages of entry `index` (at least `skip`).
    fn message_index(self, index: usize) -> usize {
        index - self.skip + usize::from(self.continue_note)
    }

    /// How many kept messages the first `entries` entries make.
    fn messages_for(self, entries: usize) -> usize {
        entries.saturating_sub(self.skip) + usize::from(self.continue_note)
    }
}

/// What the cache was built from.
#[derive(Debug, Clone)]
struct Built {
    first_seq: Seq,
    last_seq: Seq,
    /// The active compaction's seq.
    compaction: Option<Seq>,
    inline_limit: usize,
    /// The counter the sizes were estimated with ([`TokenCounter::name`]).
    counter: String,
}

/// The projected, fitted request of a session kept between steps (see the module docs).
///
/// Use per step: [`IncrementalContext::fit`], then (to send) [`IncrementalContext::take_request`],
/// [`IncrementalContext::digest`] of the request built with those messages, and
/// [`IncrementalContext::restore`] of the messages once the request is done with.
#[derive(Debug, Default)]
pub struct IncrementalContext {
    built: Option<Built>,
    /// Digest checks of compactions by seq (see [`super::active_compaction`]).
    verified: BTreeMap<Seq, bool>,
    /// Checks made by whoever holds the events ([`IncrementalContext::trust`]).
    trusted: BTreeMap<Seq, bool>,
    projector: Option<Projector>,
    /// The carried note (0 or 1 slots), then the projector's committed entries, then its
    /// provisional ones.
    slots: Vec<Slot>,
    /// Slots before the committed entries (the note).
    head: usize,
    /// Committed entries mirrored in `slots`.
    committed: usize,
    /// The messages of the last fit, when `messages_ok`; lent out between
    /// [`IncrementalContext::take_request`] and [`IncrementalContext::restore`].
    messages: Vec<Message>,
    messages_ok: bool,
    lent: bool,
    front: Front,
    /// Digests of `messages`, told of every message that changes.
    digests: MessageDigests,
}

impl IncrementalContext {
    /// An empty cache; the first fit projects the events in full.
    pub fn new() -> IncrementalContext {
        IncrementalContext::default()
    }

    /// Fits the session's request into `window`: projects the events added since the last
    /// fit (all of them the first time or when the retained part changed), redoes the
    /// pruning decisions over the cached sizes and updates the kept messages.
    ///
    /// `events` is the session's ledger in seq order (a suffix of it is fine, if it holds
    /// what [`super::retained_entries`] needs); each call's slice extends the previous one.
    pub fn fit(&mut self, events: &[RuntimeEvent], window: &Window<'_>) -> FitSummary {
        if self.lent {
            // Messages lent out and never given back: rebuild them.
            self.lent = false;
            self.messages_ok = false;
        }
        self.update(events, window.policy.inline_limit_bytes, window.counter);
        let summary = self.decide(window);
        self.apply();
        summary
    }

    /// The system prompt and messages of the request for the last fit: the carried note
    /// moved into `system` as [`super::place_carried_note`] does. The messages are lent:
    /// give them back with [`IncrementalContext::restore`] so the next step reuses them.
    pub fn take_request(&mut self, system: &str) -> (String, Vec<Message>) {
        let system = match (self.front.skip, self.slots.first().map(|slot| &slot.entry.message)) {
            (1, Some(Message::User { text: note })) => {
                format!("{system}\n\n{CARRIED_NOTE_HEADING}\n\n{note}")
            }
            _ => system.to_owned(),
        };
        self.lent = true;
        (system, std::mem::take(&mut self.messages))
    }

    /// The request's `request_sha256` ([`crate::digest::request_digest`]), hashing only the
    /// messages changed since the previous digest. `request.messages` must be the messages
    /// of the last [`IncrementalContext::take_request`].
    pub fn digest(&mut self, request: &ModelRequest) -> String {
        self.digests.digest(request)
    }

    /// Gives back the messages lent by [`IncrementalContext::take_request`] (unchanged).
    pub fn restore(&mut self, messages: Vec<Message>) {
        if self.lent {
            self.messages = messages;
            self.lent = false;
        }
    }

    /// Takes `checks` (digest checks of compactions by seq, made by the holder of the
    /// events while the events they cover were held) as this cache's own, also after a
    /// rebuild: a ledger that holds only what the projection needs no longer holds what its
    /// active compaction covers, so that compaction cannot be checked again here.
    pub fn trust(&mut self, checks: &BTreeMap<Seq, bool>) {
        if self.trusted != *checks {
            self.trusted.clone_from(checks);
        }
        self.verified.extend(checks.iter().map(|(seq, ok)| (*seq, *ok)));
    }

    /// Brings the slots up to date with `events`.
    fn update(&mut self, events: &[RuntimeEvent], inline_limit: usize, counter: &dyn TokenCounter) {
        let Some(built) = &self.built else { return self.rebuild(events, inline_limit, counter) };
        let first_seq = events.first().map_or(Seq(0), |event| event.seq);
        let start = events.partition_point(|event| event.seq <= built.last_seq);
        let continues = start > 0 && events[start - 1].seq == built.last_seq;
        if built.first_seq != first_seq
            || built.inline_limit != inline_limit
            || built.counter != counter.name()
            || !continues
        {
            return self.rebuild(events, inline_limit, counter);
        }
        let new = &events[start..];
        if new.is_empty() {
            return;
        }
        if new.iter().any(|event| matches!(event.kind, EventKind::Compaction { .. })) {
            let active = super::active_compaction(events, &mut self.verified).map(|e| e.seq);
            if active != built.compaction {
                return self.rebuild(events, inline_limit, counter);
            }
        }
        let Some(projector) = &mut self.projector else {
            return self.rebuild(events, inline_limit, counter);
        };
        for event in new {
            projector.feed(event);
        }
        if let Some(built) = &mut self.built {
            built.last_seq = new[new.len() - 1].seq;
        }
        self.sync(counter);
    }

    fn rebuild(
        &mut self,
        events: &[RuntimeEvent],
        inline_limit: usize,
        counter: &dyn TokenCounter,
    ) {
        let first_seq = events.first().map(|event| event.seq);
        if self.built.as_ref().map(|built| built.first_seq) != first_seq {
            // Digest checks hold for the slice they were made on (a compaction whose covered
            // events are not in the slice does not verify).
            self.verified.clear();
            self.verified.extend(self.trusted.iter().map(|(seq, ok)| (*seq, *ok)));
        }
        let (note, start) = super::retained_start(events, &mut self.verified);
        let mut projector = Projector::new(Some(inline_limit));
        for event in &events[start..] {
            projector.feed(event);
        }
        self.slots.clear();
        self.head = 0;
        self.committed = 0;
        self.messages_ok = false;
        if let Some(note) = note {
            self.slots.push(slot(note, counter));
            self.head = 1;
        }
        self.projector = Some(projector);
        self.built = events.last().map(|last| Built {
            first_seq: events[0].seq,
            last_seq: last.seq,
            // The note's seq is the compaction's `covers_to`; what matters is that a
            // different active compaction rebuilds, so record the compaction's own seq.
            compaction: super::active_compaction(events, &mut self.verified).map(|e| e.seq),
            inline_limit,
            counter: counter.name().to_owned(),
        });
        self.sync(counter);
    }

    /// Mirrors the projector's entries in `slots`: drops the slots from the first changed
    /// entry on (and every provisional one), then pushes the entries from there.
    fn sync(&mut self, counter: &dyn TokenCounter) {
        let Some(projector) = &mut self.projector else { return };
        let changed = projector.take_changed().min(self.committed);
        let keep = self.head + changed;
        self.slots.truncate(keep);
        if self.messages_ok {
            let kept = self.front.messages_for(keep).min(self.messages.len());
            self.messages.truncate(kept);
            self.digests.truncate(kept);
        }
        for entry in &projector.committed()[changed..] {
            self.slots.push(slot(entry.clone(), counter));
        }
        self.committed = projector.committed().len();
        for entry in projector.provisional() {
            self.slots.push(slot(entry, counter));
        }
        if Front::of(&self.slots) != self.front {
            self.messages_ok = false;
        }
    }

    /// The pruning decisions of [`super::prune`], over the cached sizes: sets each slot's
    /// `want`.
    fn decide(&mut self, window: &Window<'_>) -> FitSummary {
        let scale = window.scale;
        let size = |raw: u64| super::scaled(raw, scale);
        let mut tokens = window.fixed_tokens;
        for slot in &mut self.slots {
            tokens += size(slot.raw);
            slot.want = Form::Original;
        }
        let Some(budget) = window.policy.budget() else {
            return FitSummary {
                tokens,
                tokens_before_pruning: None,
                pruned_results: 0,
                over_budget: false,
            };
        };
        let before = tokens;
        let mut pruned = 0;
        // The latest results (after the last assistant message) are what the model needs now.
        let latest_start = self
            .slots
            .iter()
            .rposition(|slot| matches!(slot.entry.message, Message::Assistant { .. }))
            .map_or(self.slots.len(), |index| index + 1);
        for slot in &mut self.slots[..latest_start] {
            if tokens <= budget {
                break;
            }
            let Message::ToolResult { call_id, tool, outcome, content } = &slot.entry.message
            else {
                continue;
            };
            let (stub, stub_raw) = slot.stub.get_or_insert_with(|| {
                let stub = projection::stub(slot.entry.full_bytes, *outcome, call_id);
                let message = Message::ToolResult {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    outcome: *outcome,
                    content: stub,
                };
                let raw = estimate_message_tokens(&message, window.counter);
                let Message::ToolResult { content: stub, .. } = message else {
                    unreachable!("built as a tool result just above")
                };
                (stub, raw)
            });
            if stub.len() < content.len() {
                slot.want = Form::Stub;
                pruned += 1;
                tokens = tokens - size(slot.raw) + size(*stub_raw);
            }
        }
        // Then shrink the latest results' previews, halving until they fit or reach the floor.
        let mut limit = window.policy.inline_limit_bytes / 2;
        let mut sizes: Vec<u64> = self.slots[latest_start..].iter().map(|s| size(s.raw)).collect();
        while tokens > budget && limit >= MIN_PREVIEW_BYTES {
            for (offset, slot) in self.slots[latest_start..].iter_mut().enumerate() {
                let Message::ToolResult { call_id, tool, outcome, content } = &slot.entry.message
                else {
                    continue;
                };
                let current = match &slot.want {
                    Form::Shrunk(shrunk) => shrunk.as_str(),
                    Form::Original | Form::Stub => content.as_str(),
                };
                if current.len() > limit + 400 {
                    let shrunk = projection::preview(current, call_id, limit);
                    if shrunk.len() < current.len() {
                        pruned += 1;
                        let message = Message::ToolResult {
                            call_id: call_id.clone(),
                            tool: tool.clone(),
                            outcome: *outcome,
                            content: shrunk,
                        };
                        let new_size = window.tokens(&message);
                        tokens = tokens - sizes[offset] + new_size;
                        sizes[offset] = new_size;
                        let Message::ToolResult { content: shrunk, .. } = message else {
                            unreachable!("built as a tool result just above")
                        };
                        slot.want = Form::Shrunk(shrunk);
                    }
                }
            }
            limit /= 2;
        }
        FitSummary {
            tokens,
            tokens_before_pruning: (pruned > 0).then_some(before),
            pruned_results: pruned,
            over_budget: tokens > budget,
        }
    }

    /// Makes the kept messages what the slots want, changing only what differs.
    fn apply(&mut self) {
        if !self.messages_ok {
            self.front = Front::of(&self.slots);
            self.messages.clear();
            self.digests.truncate(0);
            if self.front.continue_note {
                self.messages.push(Message::User { text: CONTINUE_NOTE.to_owned() });
            }
            for slot in &mut self.slots {
                slot.sent = Form::Original;
            }
            self.messages_ok = true;
        }
        let front = self.front;
        for (index, slot) in self.slots.iter_mut().enumerate().skip(front.skip) {
            let at = front.message_index(index);
            if at >= self.messages.len() {
                self.messages.push(message_for(slot));
                slot.sent = slot.want.clone();
                continue;
            }
            if slot.sent == slot.want {
                continue;
            }
            if let Message::ToolResult { content, .. } = &mut self.messages[at] {
                *content = content_for(slot).to_owned();
            } else {
                self.messages[at] = message_for(slot);
            }
            slot.sent = slot.want.clone();
            self.digests.changed(at);
        }
    }
}

fn slot(entry: Entry, counter: &dyn TokenCounter) -> Slot {
    let raw = estimate_message_tokens(&entry.message, counter);
    Slot { entry, raw, stub: None, sent: Form::Original, want: Form::Original }
}

/// The content a slot's wanted form sends (for a tool result).
fn content_for(slot: &Slot) -> &str {
    match (&slot.want, &slot.entry.message) {
        (Form::Shrunk(shrunk), _) => shrunk,
        (Form::Stub, _) => slot.stub.as_ref().map_or("", |(stub, _)| stub.as_str()),
        (Form::Original, Message::ToolResult { content, .. }) => content,
        (Form::Original, _) => "",
    }
}

/// The message a slot's wanted form sends.
fn message_for(slot: &Slot) -> Message {
    let mut message = slot.entry.message.clone();
    if slot.want != Form::Original
        && let Message::ToolResult { content, .. } = &mut message
    {
        *content = content_for(slot).to_owned();
    }
    message
}
