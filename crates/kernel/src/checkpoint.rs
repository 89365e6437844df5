//! Checkpoints: what a run that stopped early leaves for whoever resumes it.
//!
//! The evidence is the run's last [`EVIDENCE_LIMIT`] tool results held in memory (issue
//! #13; docs/decisions.md, "A checkpoint's evidence is bounded"): a checkpoint
//! of a run of 20 000 calls listed all of them, ~1.6 MB of JSON that every later resume
//! and new turn of the session decoded (the checkpoint follows the latest compaction, so
//! it is in the suffix a load reads), and building it paired each result with its call by
//! a scan of the whole run (quadratic in the run), after reading the whole run from the
//! store when it began before the retained window.

use std::collections::BTreeMap;

use keel_contracts::{EventKind, Evidence, RequestPurpose, RunId, RuntimeEvent};

use crate::ledger::Ledger;

/// At most this many tool results, the run's latest, are a checkpoint's evidence.
pub(crate) const EVIDENCE_LIMIT: usize = 64;

/// The evidence for a checkpoint of `run_id`: its latest [`EVIDENCE_LIMIT`] results among
/// the events held in memory. Every event after the ledger's base is held, so these are
/// the run's last results; of a run that began before the base, those the retained window
/// holds (what it covers is in the compaction's summary, and in the store). Never reads
/// the store.
pub(crate) fn run_evidence(ledger: &Ledger, run_id: RunId) -> Vec<Evidence> {
    let held = ledger.events();
    let start = held.partition_point(|event| event.seq <= ledger.base());
    checkpoint_evidence(&held[start..], run_id)
}

/// The run's last [`EVIDENCE_LIMIT`] tool results in `events`, in seq order, each with its
/// call's arguments (empty when the call is not in `events`).
fn checkpoint_evidence(events: &[RuntimeEvent], run_id: RunId) -> Vec<Evidence> {
    let mut results: Vec<&RuntimeEvent> = events
        .iter()
        .rev()
        .filter(|event| {
            event.run_id == Some(run_id) && matches!(event.kind, EventKind::ToolResult { .. })
        })
        .take(EVIDENCE_LIMIT)
        .collect();
    results.reverse();
    // The arguments of the calls those results answer, from one pass (the first call with
    // an id, as before: ids are unique within a run).
    let mut wanted: BTreeMap<&keel_contracts::ToolCallId, Option<String>> = results
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { call_id, .. } => Some((call_id, None)),
            _ => None,
        })
        .collect();
    for event in events {
        let mut found = |call_id: &keel_contracts::ToolCallId, arguments: &serde_json::Value| {
            if let Some(slot @ None) = wanted.get_mut(call_id) {
                *slot = Some(arguments.to_string());
            }
        };
        match &event.kind {
            EventKind::ModelResponse {
                tool_calls, purpose: RequestPurpose::Conversation, ..
            } => {
                for call in tool_calls {
                    found(&call.call_id, &call.arguments);
                }
            }
            EventKind::ToolCall { call_id, arguments, .. } => found(call_id, arguments),
            _ => {}
        }
    }
    results
        .into_iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { call_id, tool, outcome, .. } => {
                let mut arguments = wanted.get(call_id).cloned().flatten().unwrap_or_default();
                if arguments.chars().count() > 200 {
                    arguments = arguments.chars().take(200).collect::<String>() + "…";
                }
                Some(Evidence { seq: event.seq, tool: tool.clone(), arguments, outcome: *outcome })
            }
            _ => None,
        })
        .collect()
}
