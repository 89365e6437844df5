//! Context is not history (DESIGN.md §7): fitting each request into the model's window.
//!
//! Per request: the projection starts after the latest valid compaction (its summary and
//! carried context first), large results are previews with a handle, and, when the
//! estimate is over budget, old tool results are pruned to stubs, oldest first, then the
//! latest results' previews shrink. When that is not enough the loop compacts: a prefix is
//! summarised by the model into a `compaction` event that pins the covered seq range and a
//! digest. When compaction fails, the oldest exchanges are dropped whole, keeping the
//! carried context (the user's inputs verbatim), never an invented summary.
//!
//! Invariant: every result of [`fit`] keeps calls and results paired and, when it reports
//! `over_budget == false`, is within the budget.

use std::collections::BTreeMap;

use keel_contracts::{
    CarriedContext, ContextPolicy, EventKind, Message, RequestPurpose, RuntimeEvent, Seq,
    TokenCounter, estimate_message_tokens,
};

use crate::projection::{self, Entry};

mod incremental;

pub use incremental::{FitSummary, IncrementalContext};

/// Smallest preview a latest result shrinks to, in bytes.
pub(crate) const MIN_PREVIEW_BYTES: usize = 256;

/// How a request was fitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    /// The messages to send.
    pub messages: Vec<Message>,
    /// Their estimated size plus the fixed part (system prompt, tools), in tokens.
    pub tokens: u64,
    /// The estimate before pruning, when anything was pruned.
    pub tokens_before_pruning: Option<u64>,
    /// Results pruned to stubs or shrunk.
    pub pruned_results: u64,
    /// Whether the request is still over budget.
    pub over_budget: bool,
}

/// What a request is fitted against.
#[derive(Debug, Clone, Copy)]
pub struct Window<'a> {
    /// The policy (window, reserve, inline limit).
    pub policy: &'a ContextPolicy,
    /// The token counter.
    pub counter: &'a dyn TokenCounter,
    /// Tokens of the parts that do not shrink: system prompt and tool definitions.
    pub fixed_tokens: u64,
    /// Correction from the provider's reported usage (≥ 1.0).
    pub scale: f64,
}

impl Window<'_> {
    pub(crate) fn tokens(&self, message: &Message) -> u64 {
        scaled(estimate_message_tokens(message, self.counter), self.scale)
    }
}

/// `tokens` scaled up by `scale` (rounded up), as every size in a fit is.
pub(crate) fn scaled(tokens: u64, scale: f64) -> u64 {
    if scale <= 1.0 {
        return tokens;
    }
    // The scale is at most 4 (see the loop), so the product fits; saturate anyway.
    let product = (tokens as f64 * scale).ceil();
    if product >= u64::MAX as f64 {
        u64::MAX
    } else {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let tokens = product as u64;
        tokens
    }
}

/// The latest compaction whose digest still matches its covered events.
/// `verified` caches digest checks by the compaction's seq, so each is hashed once.
///
/// A chained compaction ([`keel_contracts::DigestChain`]) is checked against the events
/// covered since the compaction it extends, and that one in turn while its own covered
/// events are in `events`; the first compaction whose covered events are not all in
/// `events` is the chain's anchor, taken as it was checked when it was made (a ledger held
/// from its retained window on, see `Ledger`). A compaction without a chain needs every
/// event it covers.
pub fn active_compaction<'e>(
    events: &'e [RuntimeEvent],
    verified: &mut BTreeMap<Seq, bool>,
) -> Option<&'e RuntimeEvent> {
    events
        .iter()
        .rev()
        .filter(|event| matches!(event.kind, EventKind::Compaction { .. }))
        .find(|event| compaction_verifies(events, event, verified))
}

/// Whether `compaction` (and the chain under it, as far as `events` reach) still matches.
fn compaction_verifies(
    events: &[RuntimeEvent],
    compaction: &RuntimeEvent,
    verified: &mut BTreeMap<Seq, bool>,
) -> bool {
    if let Some(known) = verified.get(&compaction.seq) {
        return *known;
    }
    let result = check_compaction(events, compaction, verified);
    verified.insert(compaction.seq, result);
    result
}

fn check_compaction(
    events: &[RuntimeEvent],
    compaction: &RuntimeEvent,
    verified: &mut BTreeMap<Seq, bool>,
) -> bool {
    let EventKind::Compaction { covers_from, covers_to, digest, chain, .. } = &compaction.kind
    else {
        return false;
    };
    let Some(chain) = chain else {
        return covered(events, *covers_from, *covers_to)
            .is_some_and(|slice| digest_of(slice) == *digest);
    };
    let Some(segment) = covered(events, chain.covers_to.next(), *covers_to) else {
        return false;
    };
    if chained_digest(&chain.digest, segment) != *digest {
        return false;
    }
    let Some(previous) = event_at(events, chain.compaction) else {
        // The anchor: not in memory, checked when this compaction was made from it.
        return true;
    };
    let EventKind::Compaction {
        covers_from: previous_from,
        covers_to: previous_to,
        digest: previous_digest,
        chain: previous_chain,
        ..
    } = &previous.kind
    else {
        return false;
    };
    if *previous_to != chain.covers_to || *previous_digest != chain.digest {
        return false;
    }
    let previous_start =
        previous_chain.as_ref().map_or(*previous_from, |link| link.covers_to.next());
    if covered(events, previous_start, *previous_to).is_none() {
        // Its covered events are no longer held: it is the anchor.
        return true;
    }
    compaction_verifies(events, previous, verified)
}

/// The event at `seq` (events are in seq order).
fn event_at(events: &[RuntimeEvent], seq: Seq) -> Option<&RuntimeEvent> {
    let index = events.partition_point(|event| event.seq < seq);
    events.get(index).filter(|event| event.seq == seq)
}

/// The events with seq in `from..=to`, if every one of them is present (an empty slice
/// when `from` is `to + 1`).
pub fn covered(events: &[RuntimeEvent], from: Seq, to: Seq) -> Option<&[RuntimeEvent]> {
    let start = events.partition_point(|event| event.seq < from);
    let end = events.partition_point(|event| event.seq <= to);
    if to.0.checked_add(1) == Some(from.0) {
        return Some(&events[start..start]);
    }
    let slice = events.get(start..end)?;
    let complete = from <= to
        && slice.first().is_some_and(|first| first.seq == from)
        && u64::try_from(slice.len()).ok()
            == to.0.checked_sub(from.0).and_then(|n| n.checked_add(1));
    complete.then_some(slice)
}

/// SHA-256 over the events' JSON, one per line.
pub fn digest_of(events: &[RuntimeEvent]) -> String {
    lines_digest(None, events)
}

/// The chained digest of [`keel_contracts::DigestChain`]: SHA-256 over `previous`, a
/// newline, then the events' JSON, one per line.
pub fn chained_digest(previous: &str, events: &[RuntimeEvent]) -> String {
    lines_digest(Some(previous), events)
}

/// SHA-256 over `first` and a newline (when given), then each event's JSON and a newline
/// (an event that does not serialise counts as an empty line). Hashed as it is written,
/// one event at a time: a compaction's segment is never held as one string (issue #13:
/// that string was the largest allocation of a long session's peak).
fn lines_digest(first: Option<&str>, events: &[RuntimeEvent]) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    if let Some(first) = first {
        hasher.update(first.as_bytes());
        hasher.update(b"\n");
    }
    let mut line = Vec::new();
    for event in events {
        line.clear();
        if serde_json::to_writer(&mut line, event).is_err() {
            line.clear();
        }
        hasher.update(&line);
        hasher.update(b"\n");
    }
    hex::encode(hasher.finalize())
}

/// How every carried note begins; [`place_carried_note`] finds the note by it.
pub const CARRIED_NOTE_OPENING: &str = "[keel] The earlier conversation (ledger events #";

/// The user-role message that stands first when a carried note moved to the system prompt
/// and the retained conversation does not begin with the user's own input.
pub const CONTINUE_NOTE: &str =
    "[keel] Continue from the context keel carried in the system prompt.";

/// The heading a carried note gets in the system prompt.
pub const CARRIED_NOTE_HEADING: &str =
    "# Context kept by keel (keel's own note, not the user's words)";

/// The note that opens a compacted projection: carried context verbatim, then the summary
/// (absent when the history was dropped without one). It is an entry of the projection, so
/// it is fitted and counted with the rest; a request carries it in its system prompt
/// ([`place_carried_note`]).
pub fn carried_note(carried: &CarriedContext, summary: Option<&str>, from: Seq, to: Seq) -> String {
    let mut text = match summary {
        Some(_) => format!(
            "{CARRIED_NOTE_OPENING}{from}–#{to}) was compacted to fit the context window. \
             Carried forward verbatim:\n"
        ),
        None => format!(
            "{CARRIED_NOTE_OPENING}{from}–#{to}) was dropped to fit the context window; no \
             summary could be made. Carried forward verbatim:\n"
        ),
    };
    text.push_str("\n## The user's task and instructions, in order\n");
    for (index, input) in carried.inputs.iter().enumerate() {
        text.push_str(&format!("{}. {}\n", index + 1, input));
    }
    if let Some(plan) = &carried.plan {
        text.push_str(&format!("\n## Your latest plan / todo list\n{plan}\n"));
    }
    if !carried.files.is_empty() {
        text.push_str("\n## Files touched so far\n");
        for file in &carried.files {
            text.push_str(&format!("- {file}\n"));
        }
    }
    if !carried.skills.is_empty() {
        text.push_str("\n## Skills you activated (as activate_skill returned them)\n");
        for skill in &carried.skills {
            text.push_str(&format!("\n### {}\n{}\n", skill.name, skill.text.trim_end()));
        }
    }
    if let Some(summary) = summary {
        text.push_str(&format!("\n## Summary of the earlier conversation\n{summary}\n"));
    }
    text
}

/// What [`place_carried_note`] can add to a request beyond the note's own tokens, in
/// tokens: the heading and separator in the system prompt, and [`CONTINUE_NOTE`] as a
/// message.
pub fn carried_note_overhead(counter: &dyn TokenCounter) -> u64 {
    counter.count(CARRIED_NOTE_HEADING)
        + counter.count("\n\n\n\n")
        + counter.count(CONTINUE_NOTE)
        + keel_contracts::MESSAGE_OVERHEAD_TOKENS
}

/// Moves a carried note that opens `messages` into the system prompt (DESIGN.md §7; issue
/// #12: a summary is keel's note, never a message in the user's name): the note is appended
/// under [`CARRIED_NOTE_HEADING`], and when the conversation left does not begin with a
/// user message, [`CONTINUE_NOTE`] stands first so every wire API gets a user turn first.
/// Requests without a note are returned unchanged.
pub fn place_carried_note(system: &str, mut messages: Vec<Message>) -> (String, Vec<Message>) {
    let opens_with_note = matches!(
        messages.first(),
        Some(Message::User { text }) if text.starts_with(CARRIED_NOTE_OPENING)
    );
    if !opens_with_note {
        return (system.to_owned(), messages);
    }
    let Message::User { text: note } = messages.remove(0) else {
        unreachable!("the first message was just matched as a user message")
    };
    if !matches!(messages.first(), Some(Message::User { .. })) {
        messages.insert(0, Message::User { text: CONTINUE_NOTE.to_owned() });
    }
    (format!("{system}\n\n{CARRIED_NOTE_HEADING}\n\n{note}"), messages)
}

/// Extends `carried` with what `events` add: user inputs, the latest plan, files named.
pub fn carry<'e>(
    mut carried: CarriedContext,
    events: impl IntoIterator<Item = &'e RuntimeEvent>,
) -> CarriedContext {
    for event in events {
        match &event.kind {
            EventKind::TurnStarted { input } | EventKind::InputJoined { input } => {
                carried.inputs.push(input.clone());
            }
            EventKind::SkillActivated { name, text, .. } => {
                let activated =
                    keel_contracts::ActivatedSkill { name: name.clone(), text: text.clone() };
                match carried.skills.iter_mut().find(|skill| skill.name == *name) {
                    Some(skill) => *skill = activated,
                    None => carried.skills.push(activated),
                }
            }
            EventKind::ModelResponse {
                tool_calls, purpose: RequestPurpose::Conversation, ..
            } => {
                for call in tool_calls {
                    if matches!(call.name.as_str(), "todo" | "plan") {
                        carried.plan = call.arguments.get("items").cloned();
                    }
                    if let Some(path) = call.arguments.get("path").and_then(|p| p.as_str())
                        && !carried.files.iter().any(|file| file == path)
                    {
                        carried.files.push(path.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    carried
}

/// The projection's entries: after the active compaction (opened by its note), or all.
pub fn retained_entries(
    events: &[RuntimeEvent],
    inline_limit: usize,
    verified: &mut BTreeMap<Seq, bool>,
) -> Vec<Entry> {
    let (note, start) = retained_start(events, verified);
    let mut entries: Vec<Entry> = note.into_iter().collect();
    // The user's own input after the note stays its own message, verbatim: the note moves
    // to the system prompt when the request is built.
    entries.extend(projection::entries(&events[start..], Some(inline_limit)));
    entries
}

/// Where the retained part of `events` starts (an index into `events`) and the carried
/// note that opens it: after the active compaction, or all of `events` without a note.
pub(crate) fn retained_start(
    events: &[RuntimeEvent],
    verified: &mut BTreeMap<Seq, bool>,
) -> (Option<Entry>, usize) {
    let Some(compaction) = active_compaction(events, verified) else { return (None, 0) };
    let EventKind::Compaction { covers_from, covers_to, summary, carried, .. } = &compaction.kind
    else {
        unreachable!("active_compaction returns compaction events")
    };
    // Events are in seq order: the retained part starts by binary search.
    let start = events.partition_point(|event| event.seq <= *covers_to);
    let note = carried_note(carried, Some(summary), *covers_from, *covers_to);
    let entry = Entry { message: Message::User { text: note }, seq: *covers_to, full_bytes: 0 };
    (Some(entry), start)
}

/// Fits `entries` into the window: prunes old results to stubs, oldest first, then shrinks
/// the latest results' previews. Never splits a call from its result.
pub fn fit(entries: Vec<Entry>, window: &Window<'_>) -> Fitted {
    let (entries, fitted) = prune(entries, window);
    Fitted { messages: entries.into_iter().map(|entry| entry.message).collect(), ..fitted }
}

/// [`fit`], keeping the entries (with their seqs); the returned `Fitted` has no messages.
pub fn prune(mut entries: Vec<Entry>, window: &Window<'_>) -> (Vec<Entry>, Fitted) {
    let mut sizes: Vec<u64> = entries.iter().map(|entry| window.tokens(&entry.message)).collect();
    let total = |sizes: &[u64]| window.fixed_tokens + sizes.iter().sum::<u64>();
    let mut tokens = total(&sizes);
    let Some(budget) = window.policy.budget() else {
        let fitted = Fitted {
            messages: Vec::new(),
            tokens,
            tokens_before_pruning: None,
            pruned_results: 0,
            over_budget: false,
        };
        return (entries, fitted);
    };
    let before = tokens;
    let mut pruned = 0;
    // The latest results (after the last assistant message) are what the model needs now.
    let latest_start = entries
        .iter()
        .rposition(|entry| matches!(entry.message, Message::Assistant { .. }))
        .map_or(entries.len(), |index| index + 1);
    for index in 0..latest_start {
        if tokens <= budget {
            break;
        }
        let Entry {
            message: Message::ToolResult { call_id, outcome, content, .. },
            full_bytes,
            ..
        } = &mut entries[index]
        else {
            continue;
        };
        let replacement = projection::stub(*full_bytes, *outcome, call_id);
        if replacement.len() < content.len() {
            *content = replacement;
            pruned += 1;
            let size = window.tokens(&entries[index].message);
            tokens = tokens - sizes[index] + size;
            sizes[index] = size;
        }
    }
    // Then shrink the latest results' previews, halving until they fit or reach the floor.
    let mut limit = window.policy.inline_limit_bytes / 2;
    while tokens > budget && limit >= MIN_PREVIEW_BYTES {
        for index in latest_start..entries.len() {
            let Entry { message: Message::ToolResult { call_id, content, .. }, .. } =
                &mut entries[index]
            else {
                continue;
            };
            if content.len() > limit + 400 {
                let shrunk = projection::preview(content, call_id, limit);
                if shrunk.len() < content.len() {
                    *content = shrunk;
                    pruned += 1;
                    let size = window.tokens(&entries[index].message);
                    tokens = tokens - sizes[index] + size;
                    sizes[index] = size;
                }
            }
        }
        limit /= 2;
    }
    let fitted = Fitted {
        messages: Vec::new(),
        tokens,
        tokens_before_pruning: (pruned > 0).then_some(before),
        pruned_results: pruned,
        over_budget: tokens > budget,
    };
    (entries, fitted)
}

/// The index of the first entry to keep when the oldest exchanges are dropped so the rest
/// fits in `room` tokens: always at an assistant message (so no result loses its call),
/// or `entries.len()` when not even the latest exchange fits.
pub fn cut_for(entries: &[Entry], window: &Window<'_>, room: u64) -> usize {
    cut_within(entries, window, room)
}

fn cut_within(entries: &[Entry], window: &Window<'_>, room: u64) -> usize {
    let mut used = 0;
    let mut cut = entries.len();
    for index in (0..entries.len()).rev() {
        used += window.tokens(&entries[index].message);
        if used > room {
            break;
        }
        if matches!(entries[index].message, Message::Assistant { .. }) {
            cut = index;
        }
    }
    cut
}
