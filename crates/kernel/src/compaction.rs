//! Compaction: folding a prefix of the projection into a summary written by the model
//! (DESIGN.md §7), and the fallback when that fails.
//!
//! The summary request has tools off and its own purpose ([`RequestPurpose::Compaction`](keel_contracts::RequestPurpose::Compaction)).
//! A prefix too large for one request is summarised in pieces, each piece seeing the
//! summary so far. A failed or malformed summary (error, empty, tool calls, truncated) is
//! retried a bounded number of times, then recorded as `compaction_failed`: not compacted.
//! The caller then drops the oldest exchanges whole, keeping the carried context.

use std::collections::BTreeMap;

use keel_contracts::{CarriedContext, EventKind, Message, RunId, Seq, TurnId};

use crate::context::{self, Window};
use crate::projection::Entry;

/// Summary requests per piece before compaction gives up.
pub const SUMMARY_ATTEMPTS: u32 = 2;

/// The system prompt of a summary request.
pub const SUMMARY_SYSTEM: &str = "You are summarising the earlier part of a coding agent's \
conversation so the agent can continue its task with a smaller context. Keep: decisions made \
and why, what was tried and its results (including errors and refusals), facts learned about \
the code, and open questions. Be specific (names, paths, commands). Do not invent anything. \
Answer with the summary only.";

/// The instruction that ends a summary request.
pub const SUMMARY_REQUEST: &str = "[keel] Summarise the conversation above (and the summary \
so far, if one was given) for your own continuation. The user's inputs, your plan and the \
files touched are carried forward separately and verbatim; focus on what happened.";

/// Who asks for a summary: the identities its events carry, the step it happens in (0
/// outside a run, for `keel compact`) and the price its usage is charged at.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SummaryCall<'a> {
    pub(crate) ids: (Option<TurnId>, Option<RunId>),
    pub(crate) step: u32,
    pub(crate) price: Option<&'a keel_contracts::Price>,
}

/// How compaction went.
#[derive(Debug)]
pub(crate) enum Compacted {
    /// A compaction event was appended.
    Done,
    /// Nothing could be compacted (no prefix to fold), or the summary failed (recorded).
    Not,
}

/// The repeated-failure counts of the turn open at `covers_to`, up to it: the previous
/// compaction's (when it is of the same turn) plus the failures in `segment`, the events
/// covered since.
pub(crate) fn turn_failures(
    events: &[keel_contracts::RuntimeEvent],
    previous: Option<&keel_contracts::RuntimeEvent>,
    segment: &[keel_contracts::RuntimeEvent],
    covers_to: Seq,
) -> Option<keel_contracts::TurnFailures> {
    // Turn starts are facts: held in memory whatever was dropped.
    let turn_id = events
        .iter()
        .rev()
        .filter(|event| event.seq <= covers_to)
        .find(|event| matches!(event.kind, EventKind::TurnStarted { .. }))?
        .turn_id?;
    let mut counts = BTreeMap::new();
    if let Some(EventKind::Compaction { failures: Some(earlier), .. }) =
        previous.map(|event| &event.kind)
        && earlier.turn_id == turn_id
    {
        for count in &earlier.counts {
            counts.insert((count.tool.clone(), count.arguments_sha256.clone()), count.failures);
        }
    }
    for (key, failures) in crate::repeats::failures_in_turn(segment, turn_id) {
        *counts.entry(key).or_insert(0) += failures;
    }
    Some(keel_contracts::TurnFailures {
        turn_id,
        counts: counts
            .into_iter()
            .map(|((tool, arguments_sha256), failures)| keel_contracts::FailureCount {
                tool,
                arguments_sha256,
                failures,
            })
            .collect(),
    })
}

/// The prefix as a summary request sees it: results larger than 2 KiB become previews, so
/// the pieces stay small; the summary cites handles for the rest.
pub(crate) fn shrink_for_summary(entries: &[Entry]) -> Vec<Entry> {
    entries
        .iter()
        .cloned()
        .map(|mut entry| {
            if let Message::ToolResult { call_id, content, .. } = &mut entry.message
                && content.len() > 2048
            {
                *content = crate::projection::preview(content, call_id, 2048);
            }
            entry
        })
        .collect()
}

/// The fallback when compaction is not possible: drop the oldest exchanges whole so the
/// rest fits, opened by the carried context (the user's inputs verbatim, the plan, the
/// files), never an invented summary.
pub fn drop_oldest(
    events: &[keel_contracts::RuntimeEvent],
    window: &Window<'_>,
) -> context::Fitted {
    drop_oldest_checked(events, window, &mut BTreeMap::new())
}

/// [`drop_oldest`] of a ledger's held events, with the digest checks its holder made
/// (`verified`, by compaction seq; see [`context::active_compaction`]): the active
/// compaction's covered events need not be in `events`.
pub(crate) fn drop_oldest_checked(
    events: &[keel_contracts::RuntimeEvent],
    window: &Window<'_>,
    verified: &mut BTreeMap<Seq, bool>,
) -> context::Fitted {
    let entries = context::retained_entries(events, window.policy.inline_limit_bytes, verified);
    // What is carried starts from the active compaction's (which carries everything up to
    // what it covers): the events it covers need not be held.
    let (carried_so_far, carried_to) =
        match context::active_compaction(events, verified).map(|event| &event.kind) {
            Some(EventKind::Compaction { carried, covers_to, .. }) => (carried.clone(), *covers_to),
            _ => (CarriedContext::default(), Seq(0)),
        };
    let after_active = events.partition_point(|event| event.seq <= carried_to);
    let carried_all = context::carry(carried_so_far.clone(), &events[after_active..]);
    let probe = context::carried_note(&carried_all, None, Seq(1), Seq(1));
    let note_tokens = window.counter.count(&probe) + 16;
    let budget = window.policy.budget().unwrap_or(u64::MAX);
    let room = budget.saturating_sub(window.fixed_tokens + note_tokens);
    let (pruned, _) = context::prune(entries.clone(), window);
    let cut = context::cut_for(&pruned, window, room).min(entries.len());
    if cut == 0 {
        return context::fit(entries, window);
    }
    let covers_to = Seq(entries.get(cut).map_or(u64::MAX, |e| e.seq.0.saturating_sub(1)));
    let carried = context::carry(
        carried_so_far,
        events[after_active..].iter().filter(|e| e.seq <= covers_to),
    );
    let note = context::carried_note(&carried, None, Seq(1), covers_to);
    let mut kept =
        vec![Entry { message: Message::User { text: note }, seq: covers_to, full_bytes: 0 }];
    kept.extend(entries.into_iter().skip(cut));
    context::fit(kept, window)
}
