//! Answers to what a hosted run asks (DESIGN.md §9): the open permission requests and
//! servers' questions of a session, and the answers posted to them. An answer is handed to
//! the run that waits for it (or kept for the run that will ask), and the reply comes once
//! the kernel recorded it: the ledger, not the request, says what was answered.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_contracts::{PermissionAnswer, Seq, SessionId};
use keel_host::root::RunSettings;
use serde_json::json;

use crate::approvals::BY_REMOTE;
use crate::auth::AppState;
use crate::error::ApiError;
use crate::extract::{Body, Params, session_id};
use crate::ledger;
use crate::sessions::visible_row;
use crate::state::{Host, Job};
use crate::wire::{AnswerBody, QuestionBody};

pub(crate) async fn list_permissions(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    list_open(&state.host, &id, ledger::pending).await
}

pub(crate) async fn list_questions(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    list_open(&state.host, &id, ledger::questions).await
}

/// The open requests of session `id` that `open` finds in its events (permission
/// requests, questions), as a JSON array.
async fn list_open<T: serde::Serialize>(
    host: &Host,
    id: &str,
    open: fn(&[keel_contracts::RuntimeEvent]) -> Vec<T>,
) -> Result<Response, ApiError> {
    let session_id = session_id(id)?;
    visible_row(host, session_id).await?;
    let events = host.events(session_id).await?;
    Ok(axum::Json(json!(open(&events))).into_response())
}

/// The session an answer is for and its events, once `id` names a session the caller
/// may see and `item` (a call id, a question id: at most `max_len` bytes, no control
/// characters) is well formed (400 `invalid <what>` when not).
async fn answering(
    host: &Host,
    id: &str,
    item: &str,
    max_len: usize,
    what: &str,
) -> Result<(SessionId, Vec<keel_contracts::RuntimeEvent>), ApiError> {
    let session_id = session_id(id)?;
    visible_row(host, session_id).await?;
    if item.is_empty() || item.len() > max_len || item.chars().any(char::is_control) {
        return Err(ApiError::bad_request(format!("invalid {what}")));
    }
    Ok((session_id, host.events(session_id).await?))
}

/// How long an answer's reply waits for the kernel to record it before it is 202.
const RECORD_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The reply to an answer handed to a run, once the kernel recorded it: `recorded` looks
/// for it in the session's events (and makes the reply); after [`RECORD_WAIT`] without
/// it, 202 with `accepted` (the answer given, `"state": "accepted"` and a note).
///
/// Cancel safety: dropping it only stops the waiting (the answer stays handed over).
async fn reply_once_recorded(
    host: &Host,
    session_id: SessionId,
    recorded: impl Fn(&[keel_contracts::RuntimeEvent]) -> Option<Result<Response, ApiError>>,
    accepted: serde_json::Value,
) -> Result<Response, ApiError> {
    let mut woken = host.feed.subscribe(session_id);
    let deadline = tokio::time::Instant::now() + RECORD_WAIT;
    loop {
        let events = host.store.read(session_id, Seq(0)).await.map_err(ApiError::internal)?;
        if let Some(reply) = recorded(&events) {
            return reply;
        }
        tokio::select! {
            _ = woken.changed() => {}
            () = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            () = tokio::time::sleep_until(deadline) => {
                return Ok((StatusCode::ACCEPTED, axum::Json(accepted)).into_response());
            }
        }
    }
}

pub(crate) async fn answer_permission(
    State(state): State<AppState>,
    Params((id, call_id)): Params<(String, String)>,
    Body(body): Body<AnswerBody>,
) -> Result<Response, ApiError> {
    let host = &state.host;
    // Not while a takeover is closing and resuming runs (it may be this one's): the
    // events read below then show what it did, and the run it resumed takes the answer.
    let takeover = host.takeover.read().await;
    let (session_id, events) = answering(host, &id, &call_id, 256, "call id").await?;
    let answer = body.answer;
    if let Some(settled) = ledger::settled(&events, &call_id) {
        return settled_reply(answer, &settled);
    }
    if !ledger::pending(&events).iter().any(|pending| pending.call_id.0 == call_id) {
        return Err(ApiError::not_found(format!(
            "session {session_id} has no permission request for call {call_id}"
        )));
    }
    let delivered = match host.approvals.deliver(session_id, &call_id, answer) {
        Ok(delivered) => delivered,
        Err(first) => {
            return Err(ApiError::conflict(
                "already_answered",
                format!("call {call_id} was answered {} first", answer_text(first)),
            ));
        }
    };
    let driven_here = host.drives(session_id, &events).await;
    if !delivered && !driven_here {
        // Nobody waits for it here: the host that asked stopped, or its run is still open
        // under the lease of a process that died (this host restarted and has not taken
        // it over yet). The answer is kept and the turn resumed here; its run asks again
        // and takes the kept answer. A live process's lease refuses the resume: that
        // process waits for the answer itself.
        if let Err(error) = host.start(session_id, Job::Resume, RunSettings::default()).await {
            // Another start here (the takeover at boot) won the race: its run takes it.
            if !host.is_active(session_id) {
                host.approvals.forget(session_id, &call_id);
                if ledger::run_open(&events) && error.status == StatusCode::CONFLICT {
                    return Err(ApiError::conflict(
                        "driven_elsewhere",
                        format!(
                            "session {session_id} is driven by another process; answer on \
                             the host that runs it (or wait: a dead host's run is taken over \
                             within the lease time)"
                        ),
                    ));
                }
                return Err(error);
            }
        }
    }
    drop(takeover);
    // The answer counts once the kernel recorded it.
    let recorded = |events: &[keel_contracts::RuntimeEvent]| {
        let settled = ledger::settled(events, &call_id)?;
        host.approvals.forget(session_id, &call_id);
        Some(settled_reply(answer, &settled))
    };
    let accepted = json!({
        "answer": answer, "state": "accepted",
        "note": "not recorded yet: the run that asked has not taken it"
    });
    reply_once_recorded(host, session_id, recorded, accepted).await
}

/// Answers a server's question: the content is checked against the requested form (422
/// when it does not match), handed to the run that waits for it (409 `not_waiting` when
/// none does on this host: the MCP request that asked ended with the process that made
/// it), and the reply comes once the kernel recorded `elicitation_answered`.
pub(crate) async fn answer_question(
    State(state): State<AppState>,
    Params((id, question)): Params<(String, String)>,
    Body(body): Body<QuestionBody>,
) -> Result<Response, ApiError> {
    use keel_contracts::{ElicitationAction, ElicitationAnswer, FormSchema};
    let host = &state.host;
    let (session_id, events) = answering(host, &id, &question, 300, "question id").await?;
    if let Some((action, by, seq)) = ledger::answered(&events, &question) {
        return Err(ApiError::conflict(
            "already_answered",
            format!(
                "question {question} was answered first: {} by {by} (#{})",
                action.as_str(),
                seq.0
            ),
        ));
    }
    let Some(pending) = ledger::questions(&events).into_iter().find(|q| q.question == question)
    else {
        return Err(ApiError::not_found(format!(
            "session {session_id} has no question {question}"
        )));
    };
    let answer = match body.action {
        ElicitationAction::Accept => {
            let content = body.content.unwrap_or_else(|| json!({}));
            let form = FormSchema::parse(&pending.schema).map_err(|why| {
                ApiError::conflict("refused_form", format!("keel refuses this form: {why}"))
            })?;
            if let Err(why) = form.validate(&content) {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "invalid_answer",
                    format!("the answer does not match the form: {why}"),
                ));
            }
            ElicitationAnswer::accept(content, BY_REMOTE)
        }
        ElicitationAction::Decline => ElicitationAnswer::decline(BY_REMOTE, "declined over HTTP"),
        ElicitationAction::Cancel => ElicitationAnswer::cancel(BY_REMOTE, "cancelled over HTTP"),
    };
    if !host.approvals.answer_question(session_id, &question, answer) {
        return Err(ApiError::conflict(
            "not_waiting",
            format!(
                "no run on this host waits for question {question}: the MCP request that asked \
                 it ends with the process that made it"
            ),
        ));
    }
    let recorded = |events: &[keel_contracts::RuntimeEvent]| {
        let (action, by, seq) = ledger::answered(events, &question)?;
        Some(Ok(axum::Json(json!({
            "question": question, "action": action, "by": by, "answered_seq": seq,
        }))
        .into_response()))
    };
    let accepted = json!({"question": question, "state": "accepted", "note": "not recorded yet"});
    reply_once_recorded(host, session_id, recorded, accepted).await
}

/// 200 when the recorded answer is the one given, 409 when another one came first.
fn settled_reply(
    answer: PermissionAnswer,
    settled: &ledger::Settled,
) -> Result<Response, ApiError> {
    if settled.answer == answer {
        Ok(axum::Json(json!({
            "answer": settled.answer, "by": settled.by, "settled_seq": settled.seq,
            "remote": settled.by == BY_REMOTE,
        }))
        .into_response())
    } else {
        Err(ApiError::conflict(
            "already_answered",
            format!(
                "the request was answered {} first ({})",
                answer_text(settled.answer),
                settled.by
            ),
        ))
    }
}

fn answer_text(answer: PermissionAnswer) -> &'static str {
    match answer {
        PermissionAnswer::AllowOnce => "allow_once",
        PermissionAnswer::AllowSession => "allow_session",
        PermissionAnswer::AllowExact => "allow_exact",
        PermissionAnswer::Deny => "deny",
    }
}
