//! What the host reads off a session's ledger: pending permission requests, settled
//! answers, usage. Pure functions of events, so a restarted host sees what the dead one saw.

use keel_contracts::{
    Access, EventKind, PermissionAnswer, RuntimeEvent, Seq, ToolCallId, UsageTotals,
};
use serde::Serialize;

/// A permission request that has no answer yet (DESIGN.md §9 `GET …/permissions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Pending {
    pub(crate) call_id: ToolCallId,
    pub(crate) tool: String,
    pub(crate) access: Access,
    pub(crate) arguments: serde_json::Value,
    /// The seq of the newest `permission_requested` for the call (a call asked again after
    /// a restart has a newer one).
    pub(crate) requested_seq: Seq,
}

/// A server's question that has no answer yet (`GET …/questions`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Question {
    pub(crate) question: String,
    pub(crate) call_id: ToolCallId,
    pub(crate) tool: String,
    pub(crate) server: String,
    /// The server's words: untrusted text.
    pub(crate) message: String,
    pub(crate) schema: serde_json::Value,
    pub(crate) requested_seq: Seq,
}

/// Questions with no `elicitation_answered` yet, in order.
pub(crate) fn questions(events: &[RuntimeEvent]) -> Vec<Question> {
    let mut open: Vec<Question> = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::ElicitationRequested {
                call_id,
                tool,
                question,
                server,
                message,
                schema,
            } => {
                open.push(Question {
                    question: question.clone(),
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    server: server.clone(),
                    message: message.clone(),
                    schema: schema.clone(),
                    requested_seq: event.seq,
                });
            }
            EventKind::ElicitationAnswered { question, .. } => {
                open.retain(|open| &open.question != question);
            }
            _ => {}
        }
    }
    open
}

/// The recorded answer to a question: its action, who answered, its seq.
pub(crate) fn answered(
    events: &[RuntimeEvent],
    question: &str,
) -> Option<(keel_contracts::ElicitationAction, String, Seq)> {
    events.iter().rev().find_map(|event| match &event.kind {
        EventKind::ElicitationAnswered { question: id, action, by, .. } if id == question => {
            Some((*action, by.clone(), event.seq))
        }
        _ => None,
    })
}

/// A recorded answer to a call's permission request.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Settled {
    pub(crate) answer: PermissionAnswer,
    pub(crate) by: String,
    pub(crate) seq: Seq,
}

/// Requests whose call has neither a `permission_settled` nor a `tool_result` after its
/// newest `permission_requested`, in request order.
pub(crate) fn pending(events: &[RuntimeEvent]) -> Vec<Pending> {
    let mut open: Vec<Pending> = Vec::new();
    for event in events {
        match &event.kind {
            EventKind::PermissionRequested { call_id, tool, access, arguments } => {
                open.retain(|pending| &pending.call_id != call_id);
                open.push(Pending {
                    call_id: call_id.clone(),
                    tool: tool.clone(),
                    access: *access,
                    arguments: arguments.clone(),
                    requested_seq: event.seq,
                });
            }
            EventKind::PermissionSettled { call_id, .. }
            | EventKind::ToolResult { call_id, .. } => {
                open.retain(|pending| &pending.call_id != call_id);
            }
            _ => {}
        }
    }
    open
}

/// The newest recorded answer for `call_id`, if any.
pub(crate) fn settled(events: &[RuntimeEvent], call_id: &str) -> Option<Settled> {
    events.iter().rev().find_map(|event| match &event.kind {
        EventKind::PermissionSettled { call_id: id, answer, by, .. } if id.0 == call_id => {
            Some(Settled { answer: *answer, by: by.clone(), seq: event.seq })
        }
        _ => None,
    })
}

/// When the call's first permission request was recorded: the approval timeout counts
/// from there, across restarts.
pub(crate) fn first_requested_at(
    events: &[RuntimeEvent],
    call_id: &str,
) -> Option<chrono::DateTime<chrono::Utc>> {
    events.iter().find_map(|event| match &event.kind {
        EventKind::PermissionRequested { call_id: id, .. } if id.0 == call_id => Some(event.ts),
        _ => None,
    })
}

/// Usage and cost over every model response of the session (compaction summaries too).
pub(crate) fn usage(events: &[RuntimeEvent]) -> UsageTotals {
    let mut totals = UsageTotals::default();
    for event in events {
        if let EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } = &event.kind {
            totals.add(usage, estimated_usage.as_ref(), *cost_usd);
        }
    }
    totals
}

/// The reason the session was sealed, if it was.
pub(crate) fn sealed(events: &[RuntimeEvent]) -> Option<&str> {
    events.iter().find_map(|event| match &event.kind {
        EventKind::SessionSealed { reason } => Some(reason.as_str()),
        _ => None,
    })
}

/// The parent of a child session.
pub(crate) fn parent(events: &[RuntimeEvent]) -> Option<keel_contracts::SessionId> {
    match &events.first()?.kind {
        EventKind::SessionCreated { lineage, .. } => {
            lineage.as_ref().map(|lineage| lineage.parent_session_id)
        }
        _ => None,
    }
}

/// Whether the session's last run has no terminal event.
pub(crate) fn run_open(events: &[RuntimeEvent]) -> bool {
    let Some(start) =
        events.iter().rposition(|event| matches!(event.kind, EventKind::RunStarted { .. }))
    else {
        return false;
    };
    !events[start..].iter().any(|event| event.kind.is_run_terminal())
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_contracts::SessionId;

    fn event(seq: u64, kind: EventKind) -> RuntimeEvent {
        RuntimeEvent {
            seq: Seq(seq),
            session_id: SessionId(uuid::Uuid::nil()),
            turn_id: None,
            run_id: None,
            ts: chrono::DateTime::UNIX_EPOCH,
            kind,
        }
    }

    fn requested(seq: u64, call: &str) -> RuntimeEvent {
        event(
            seq,
            EventKind::PermissionRequested {
                call_id: ToolCallId(call.to_owned()),
                tool: "write_file".to_owned(),
                access: Access::Write,
                arguments: serde_json::json!({"path": "a"}),
            },
        )
    }

    #[test]
    fn a_request_asked_again_is_pending_once_with_its_newest_seq_until_answered() {
        let events = vec![requested(3, "c1"), requested(7, "c1"), requested(8, "c2")];
        let open = pending(&events);
        assert_eq!(
            open.iter().map(|p| (p.call_id.0.as_str(), p.requested_seq.0)).collect::<Vec<_>>(),
            vec![("c1", 7), ("c2", 8)]
        );
        let mut events = events;
        events.push(event(
            9,
            EventKind::PermissionSettled {
                call_id: ToolCallId("c1".to_owned()),
                tool: "write_file".to_owned(),
                access: Access::Write,
                answer: PermissionAnswer::Deny,
                by: "remote".to_owned(),
                arguments_sha256: None,
                expires_at: None,
            },
        ));
        assert_eq!(pending(&events).len(), 1);
        let answer = settled(&events, "c1").unwrap();
        assert_eq!((answer.answer, answer.seq), (PermissionAnswer::Deny, Seq(9)));
        assert!(settled(&events, "c2").is_none());
        assert_eq!(first_requested_at(&events, "c1"), Some(chrono::DateTime::UNIX_EPOCH));
    }
}
