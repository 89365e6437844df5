//! Recovery: closing runs that a dead process left without a terminal event (DESIGN.md §6).
//!
//! Every call of the interrupted run is classified from the ledger alone: answered
//! (nothing to do), not dispatched (no `tool_attempt_prepared`: answered `cancelled`), or
//! indeterminate (prepared, no result: answered `indeterminate` and never replayed).
//!
//! A permission request is a ledger fact too (DESIGN.md §6): when the run died while a
//! call waited for consent, that call and the ones after it are left open, and the run that
//! resumes the turn asks again ([`awaiting_calls`]); a new turn answers them `cancelled`
//! ([`cancel_awaiting`]). They are never silently cancelled by the crash itself.
//!
//! A program's calls (`tool_call` events of a `run_code` cell) are closed like the model's
//! (prepared: `indeterminate`; not dispatched: `cancelled`) but never asked again or run
//! again: the cell's own call was prepared before its program started, so it is
//! `indeterminate` too, and the model decides what to do next.

use keel_contracts::{EventKind, Outcome, RunId, TurnId, UsageTotals};

use crate::Result;
use crate::ledger::Ledger;

/// Result text for a prepared call whose outcome is unknown.
pub const INDETERMINATE_TEXT: &str = "indeterminate: keel stopped while this call was running, so \
its effect is unknown. Inspect the current state before you retry it.";
/// Result text for a call that was never dispatched.
pub const NOT_DISPATCHED_TEXT: &str =
    "cancelled: keel stopped before this call was executed; it did not run";
/// Result text for a call that waited for consent when a new turn began instead.
pub const NEW_TURN_TEXT: &str = "cancelled: a new turn began before this call's permission request was answered; it did \
not run";
/// Why a server's question still open when keel stopped ends as `cancel`.
pub const QUESTION_ENDED_TEXT: &str =
    "keel stopped before the question was answered; the server's request ended with it";
/// Reason recorded on a run closed by recovery.
pub const INTERRUPTED_REASON: &str =
    "interrupted: the process driving this run stopped before the run finished";

/// Closes the session's last run if it has no terminal event.
pub(crate) async fn close_dangling_run(
    ledger: &mut Ledger,
    outbox: &dyn crate::Outbox,
) -> Result<()> {
    // Run starts and ends are facts, held in memory whatever was dropped.
    let Some(start) = ledger
        .events()
        .iter()
        .rposition(|event| matches!(event.kind, EventKind::RunStarted { .. }))
    else {
        return Ok(());
    };
    let start_event = &ledger.events()[start];
    let (run_id, turn_id, start_seq) = (start_event.run_id, start_event.turn_id, start_event.seq);
    if ledger.events()[start..].iter().any(|event| event.kind.is_run_terminal()) {
        return Ok(());
    }
    // A run that began before the events held in memory is closed from the whole ledger,
    // read from the store (recovery of a long run; never on a normal step).
    let history = ledger.history_from(keel_contracts::Seq(1)).await?;
    let start = history.partition_point(|event| event.seq < start_seq);
    let run_events = &history[start..];
    let mut usage = UsageTotals::default();
    // Calls an earlier run left open (waiting for consent) that this run was settling are
    // this run's to close too: without them, a second crash would leave a prepared call
    // unanswered and the next resume would attempt it again.
    let mut open: Vec<_> = awaiting_calls(&history[..start])
        .2
        .into_iter()
        .map(|call| (call.call_id, call.name, None, false))
        .collect();
    let mut asked = std::collections::BTreeSet::new();
    // Questions a server asked during a call that got no answer: the server's request
    // ended with the process that held it.
    let mut questions: Vec<(keel_contracts::ToolCallId, String, String)> = Vec::new();
    for event in run_events {
        match &event.kind {
            EventKind::ModelResponse {
                tool_calls,
                usage: reported,
                cost_usd,
                estimated_usage,
                purpose,
                ..
            } => {
                usage.add(reported, estimated_usage.as_ref(), *cost_usd);
                if !purpose.is_conversation() {
                    continue;
                }
                open = tool_calls
                    .iter()
                    .map(|call| (call.call_id.clone(), call.name.clone(), None, false))
                    .collect();
            }
            EventKind::ToolCall { call_id, tool, .. } => {
                open.push((call_id.clone(), tool.clone(), None, true));
            }
            EventKind::ToolAttemptPrepared { call_id, attempt_id, .. } => {
                if let Some(entry) = open.iter_mut().find(|(id, _, _, _)| id == call_id) {
                    entry.2 = Some(*attempt_id);
                }
            }
            EventKind::PermissionRequested { call_id, .. } => {
                asked.insert(call_id.clone());
            }
            EventKind::PermissionSettled { call_id, .. } => {
                asked.remove(call_id);
            }
            EventKind::ElicitationRequested { call_id, tool, question, .. } => {
                questions.push((call_id.clone(), tool.clone(), question.clone()));
            }
            EventKind::ElicitationAnswered { question, .. } => {
                questions.retain(|(_, _, open)| open != question);
            }
            EventKind::ToolResult { call_id, .. } => open.retain(|(id, _, _, _)| id != call_id),
            _ => {}
        }
    }
    drop(history);
    for (call_id, tool, question) in questions {
        ledger
            .append(
                turn_id,
                run_id,
                EventKind::ElicitationAnswered {
                    call_id,
                    tool,
                    question,
                    action: keel_contracts::ElicitationAction::Cancel,
                    content: None,
                    by: "keel".to_owned(),
                    reason: Some(QUESTION_ENDED_TEXT.to_owned()),
                },
            )
            .await?;
    }
    // A call that waited for consent is asked again by the next run of the turn: it and
    // the undispatched calls after it stay open. A program's calls are never asked again.
    let awaiting = open
        .iter()
        .any(|(id, _, attempt, nested)| !nested && attempt.is_none() && asked.contains(id));
    for (call_id, tool, attempt_id, nested) in open {
        if awaiting && attempt_id.is_none() && !nested {
            continue;
        }
        let (outcome, text) = match attempt_id {
            Some(_) => (Outcome::Indeterminate, INDETERMINATE_TEXT),
            None => (Outcome::Cancelled, NOT_DISPATCHED_TEXT),
        };
        ledger
            .append(
                turn_id,
                run_id,
                EventKind::ToolResult {
                    call_id,
                    attempt_id,
                    tool,
                    outcome,
                    content: text.to_owned(),
                    bytes: text.len() as u64,
                    raw: None,
                },
            )
            .await?;
    }
    let _ =
        tokio::time::timeout(crate::OUTBOX_FLUSH_TIMEOUT, outbox.flush(ledger.session_id)).await;
    ledger
        .append(
            turn_id,
            run_id,
            EventKind::RunFailed {
                reason: INTERRUPTED_REASON.into(),
                usage,
                answer: None,
                // The process that ran it died; its duration is not known.
                duration_ms: None,
            },
        )
        .await?;
    Ok(())
}

/// The calls of the session's last conversation response that have no result: the ones a
/// dead run left waiting for consent (see the module doc), in call order, with the turn and
/// run they belong to.
pub(crate) fn awaiting_calls(
    events: &[keel_contracts::RuntimeEvent],
) -> (Option<TurnId>, Option<RunId>, Vec<keel_contracts::ToolCall>) {
    let Some(index) = events.iter().rposition(|event| event.kind.is_conversation_response()) else {
        return (None, None, Vec::new());
    };
    let EventKind::ModelResponse { tool_calls, .. } = &events[index].kind else {
        return (None, None, Vec::new());
    };
    let answered: std::collections::BTreeSet<_> = events[index..]
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { call_id, .. } => Some(call_id),
            _ => None,
        })
        .collect();
    let open =
        tool_calls.iter().filter(|call| !answered.contains(&call.call_id)).cloned().collect();
    (events[index].turn_id, events[index].run_id, open)
}

/// Answers the calls left waiting for consent with `cancelled` ([`NEW_TURN_TEXT`]): a new
/// turn is starting, so they will not be asked again.
pub(crate) async fn cancel_awaiting(ledger: &mut Ledger) -> Result<()> {
    let (turn_id, run_id, open) = awaiting_calls(ledger.events());
    for call in open {
        ledger
            .append(
                turn_id,
                run_id,
                EventKind::ToolResult {
                    call_id: call.call_id,
                    attempt_id: None,
                    tool: call.name,
                    outcome: Outcome::Cancelled,
                    content: NEW_TURN_TEXT.to_owned(),
                    bytes: NEW_TURN_TEXT.len() as u64,
                    raw: None,
                },
            )
            .await?;
    }
    Ok(())
}

/// The last turn and its last run, if that turn has not completed.
pub(crate) fn resumable_turn(
    events: &[keel_contracts::RuntimeEvent],
) -> Option<(TurnId, Option<RunId>)> {
    let turn_index =
        events.iter().rposition(|event| matches!(event.kind, EventKind::TurnStarted { .. }))?;
    let turn_id = events[turn_index].turn_id?;
    let mut last_run = None;
    let mut completed = false;
    for event in &events[turn_index..] {
        match &event.kind {
            EventKind::RunStarted { .. } => {
                last_run = event.run_id;
                completed = false;
            }
            EventKind::RunCompleted { .. } => completed = true,
            _ => {}
        }
    }
    if completed { None } else { Some((turn_id, last_run)) }
}
