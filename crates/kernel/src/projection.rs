//! Projection: the next model request, built from durable ledger events only.
//!
//! Invariant: every projected request keeps tool calls and tool results paired. Each
//! assistant message's calls are answered, in order, by the tool results that follow it;
//! a result whose call is not in the preceding assistant message is dropped (an orphan),
//! and a call without a recorded result is answered with a synthetic `cancelled` result
//! (the ledger itself is repaired by recovery before a run continues; this is the last
//! line of defence, so the provider never sees an unanswered call).

use std::collections::BTreeMap;

use keel_contracts::{EventKind, Message, Outcome, RuntimeEvent, ToolCall, ToolCallId};

/// Text of a synthetic result for a call that has no recorded result.
pub const UNANSWERED_CALL_TEXT: &str =
    "cancelled: this call was interrupted before it produced a result";

/// Prefix of the note keel adds when the last permitted step of a budget begins.
pub const STOPPED_EARLY_PREFIX: &str = "[keel] ";
/// What keel asks of the model in the tools-off last step.
pub const REPORT_REQUEST: &str = "Tools are off for this last step. Write a short report for \
whoever resumes this task: what you did (with evidence), what you believe, and what is next.";

/// The note keel adds when a run resumes after the model's report.
pub const RESUME_NOTE: &str =
    "[keel] The run was resumed with a fresh budget. Continue the task from where you stopped.";

/// Projects the conversation of a session from its events.
pub fn messages(events: &[RuntimeEvent]) -> Vec<Message> {
    let mut messages = Vec::new();
    // Results recorded for the calls of the most recent assistant message, by call id.
    let mut pending: Option<Pending> = None;
    for event in events {
        match &event.kind {
            EventKind::TurnStarted { input } => {
                flush(&mut messages, &mut pending);
                push_user(&mut messages, input);
            }
            EventKind::ModelResponse { text, reasoning, tool_calls, .. } => {
                flush(&mut messages, &mut pending);
                messages.push(Message::Assistant {
                    text: text.clone(),
                    reasoning: reasoning.clone(),
                    tool_calls: tool_calls.clone(),
                });
                if !tool_calls.is_empty() {
                    pending = Some((tool_calls.clone(), BTreeMap::new()));
                }
            }
            EventKind::ToolResult { call_id, tool, outcome, content, .. } => {
                if let Some((calls, results)) = &mut pending
                    && calls.iter().any(|call| &call.call_id == call_id)
                {
                    results
                        .entry(call_id.clone())
                        .or_insert_with(|| (tool.clone(), *outcome, content.clone()));
                }
            }
            EventKind::BudgetExhausted { reason, report_requested: true } => {
                flush(&mut messages, &mut pending);
                push_user(
                    &mut messages,
                    &format!("{STOPPED_EARLY_PREFIX}{reason}. {REPORT_REQUEST}"),
                );
            }
            EventKind::RunStarted { resumes: Some(_), .. } if matches!(messages.last(), Some(Message::Assistant { tool_calls, .. }) if tool_calls.is_empty()) =>
            {
                // A resumed run after a tool-free answer (a report): the model needs a user
                // turn to continue from.
                push_user(&mut messages, RESUME_NOTE);
            }
            EventKind::BudgetExhausted { report_requested: false, .. }
            | EventKind::Checkpoint { .. }
            | EventKind::SessionCreated { .. }
            | EventKind::SessionSealed { .. }
            | EventKind::RunStarted { .. }
            | EventKind::RunComposition { .. }
            | EventKind::ModelRequested { .. }
            | EventKind::GateDecision { .. }
            | EventKind::PermissionRequested { .. }
            | EventKind::PermissionSettled { .. }
            | EventKind::ToolAttemptPrepared { .. }
            | EventKind::ShadowIntent { .. }
            | EventKind::RunCompleted { .. }
            | EventKind::RunFailed { .. }
            | EventKind::RunSuspended { .. }
            | EventKind::RunCancelled { .. } => {}
        }
    }
    flush(&mut messages, &mut pending);
    messages
}

/// The calls of the latest assistant message and the results recorded for them so far.
type Pending = (Vec<ToolCall>, BTreeMap<ToolCallId, (String, Outcome, String)>);

/// Two user messages in a row (a turn whose run failed before the model answered, or a
/// budget note after a new input) are merged, so roles alternate.
fn push_user(messages: &mut Vec<Message>, input: &str) {
    match messages.last_mut() {
        Some(Message::User { text }) => {
            text.push_str("\n\n");
            text.push_str(input);
        }
        _ => messages.push(Message::User { text: input.to_owned() }),
    }
}

fn flush(messages: &mut Vec<Message>, pending: &mut Option<Pending>) {
    let Some((calls, mut results)) = pending.take() else { return };
    for call in calls {
        let (tool, outcome, content) = results.remove(&call.call_id).unwrap_or_else(|| {
            (call.name.clone(), Outcome::Cancelled, UNANSWERED_CALL_TEXT.to_owned())
        });
        messages.push(Message::ToolResult { call_id: call.call_id, tool, outcome, content });
    }
}

/// Checks the pairing invariant on a projected conversation: every call of an assistant
/// message is answered exactly once by the results that follow it, and no result answers
/// a call that is not there.
///
/// # Errors
///
/// A description of the first violation.
pub fn check_pairing(messages: &[Message]) -> Result<(), String> {
    let mut open: Vec<ToolCallId> = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        match message {
            Message::ToolResult { call_id, .. } => {
                if open.first() == Some(call_id) {
                    open.remove(0);
                } else {
                    return Err(format!(
                        "message {index}: result for {call_id} answers no open call"
                    ));
                }
            }
            Message::User { .. } | Message::Assistant { .. } if !open.is_empty() => {
                return Err(format!("message {index}: calls left unanswered: {open:?}"));
            }
            Message::Assistant { tool_calls, .. } => {
                open = tool_calls.iter().map(|call| call.call_id.clone()).collect();
            }
            Message::User { .. } => {}
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("calls left unanswered at the end: {open:?}"))
    }
}

/// The number of model responses recorded in a session: the scripted model's position.
pub fn responses_in_session(events: &[RuntimeEvent]) -> u64 {
    events.iter().filter(|event| matches!(event.kind, EventKind::ModelResponse { .. })).count()
        as u64
}
