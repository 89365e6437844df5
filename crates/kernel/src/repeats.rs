//! The repeated-failure guard: identical failing calls (same tool, same arguments) are
//! blocked after [`REPEATED_FAILURE_LIMIT`] failures in a turn, whatever made them fail,
//! counted from the ledger so a resume does not reset the guard.

use std::collections::BTreeMap;

use keel_contracts::{EventKind, Outcome, ToolCall, TurnId};

/// Identical failing calls (same tool, same arguments) allowed before further repeats
/// are blocked.
pub(crate) const REPEATED_FAILURE_LIMIT: u32 = 3;

/// The repeated-failure guard's key for a call (tool name, SHA-256 of its arguments' JSON),
/// and that digest.
pub(crate) fn failure_key(call: &ToolCall) -> ((String, String), String) {
    let digest = keel_contracts::arguments_sha256(&call.arguments);
    ((call.name.clone(), digest.clone()), digest)
}

/// The repeated-failure counts a turn already has: every `error` result of its earlier
/// runs (and of this one so far), keyed like [`failure_key`], so a resume does not reset
/// the guard.
pub(crate) fn failures_in_turn(
    events: &[keel_contracts::RuntimeEvent],
    turn_id: TurnId,
) -> BTreeMap<(String, String), u32> {
    let mut calls = BTreeMap::new();
    let mut failures = BTreeMap::new();
    for event in events.iter().filter(|event| event.turn_id == Some(turn_id)) {
        match &event.kind {
            EventKind::ModelResponse { tool_calls, purpose, .. } if purpose.is_conversation() => {
                for call in tool_calls {
                    calls.insert(call.call_id.clone(), failure_key(call).0);
                }
            }
            EventKind::ToolResult { call_id, outcome: Outcome::Error, .. } => {
                if let Some(key) = calls.get(call_id) {
                    *failures.entry(key.clone()).or_insert(0) += 1;
                }
            }
            _ => {}
        }
    }
    failures
}
