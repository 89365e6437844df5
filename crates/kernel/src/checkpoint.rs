//! Checkpoints: what a run that stopped early leaves for whoever resumes it.

use keel_contracts::{EventKind, Evidence, RequestPurpose, RunId, RuntimeEvent};

/// The run's tool results, as evidence for a checkpoint.
pub(crate) fn checkpoint_evidence(events: &[RuntimeEvent], run_id: RunId) -> Vec<Evidence> {
    let arguments_of = |call_id: &keel_contracts::ToolCallId| {
        events.iter().find_map(|event| match &event.kind {
            EventKind::ModelResponse {
                tool_calls, purpose: RequestPurpose::Conversation, ..
            } => tool_calls
                .iter()
                .find(|call| &call.call_id == call_id)
                .map(|call| call.arguments.to_string()),
            EventKind::ToolCall { call_id: nested, arguments, .. } if nested == call_id => {
                Some(arguments.to_string())
            }
            _ => None,
        })
    };
    events
        .iter()
        .filter(|event| event.run_id == Some(run_id))
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { call_id, tool, outcome, .. } => {
                let mut arguments = arguments_of(call_id).unwrap_or_default();
                if arguments.chars().count() > 200 {
                    arguments = arguments.chars().take(200).collect::<String>() + "…";
                }
                Some(Evidence { seq: event.seq, tool: tool.clone(), arguments, outcome: *outcome })
            }
            _ => None,
        })
        .collect()
}
