//! Requests to a session beyond turns: `POST /v1/sessions/{id}/plan/approve` (plan mode's
//! approval, then the live turn), and `POST /v1/sessions/{id}/input`: steering. Input sent while the session's run is active
//! here joins that run at its next step boundary (docs/decisions.md, "Steering"); the
//! answer comes once its `input_joined` event is durable. `POST /turns` still answers 409
//! while a run is active: a new turn and input to the running one are different requests.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use keel_host::root::{self, RunSettings};
use serde_json::json;

use crate::approvals::BY_REMOTE;
use crate::auth::AppState;
use crate::error::ApiError;
use crate::extract::{Body, Params, session_id};
use crate::sessions::visible_row;
use crate::state::Job;
use crate::wire::InputBody;

/// 200 `{"joined": true, "seq"}` once the input is in the ledger; 409 `no_active_run`
/// when this host drives no run of the session (start a turn instead), 409 `run_ending`
/// when the run ended before the input could join (it did not: send it as a new turn).
pub(crate) async fn post_input(
    State(state): State<AppState>,
    Params(id): Params<String>,
    Body(body): Body<InputBody>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    visible_row(&state.host, session_id).await?;
    if body.input.trim().is_empty() {
        return Err(ApiError::bad_request("the input is empty"));
    }
    let Some(steering) = state.host.steering(session_id) else {
        return Err(ApiError::conflict(
            "no_active_run",
            format!(
                "session {session_id} has no run active on this host; POST \
                 /v1/sessions/{session_id}/turns starts one with this input"
            ),
        ));
    };
    let ended = || {
        ApiError::conflict(
            "run_ending",
            format!(
                "the run of session {session_id} ended before the input could join; it was not \
                 recorded: POST /v1/sessions/{session_id}/turns with it"
            ),
        )
    };
    let joined = steering.send(body.input).map_err(|_| ended())?;
    match joined.wait().await {
        Some(seq) => {
            Ok((StatusCode::OK, axum::Json(json!({"joined": true, "seq": seq.0}))).into_response())
        }
        None => Err(ended()),
    }
}

/// 202 `{approved_seq, turn_id, run_id}`: `plan_approved` is recorded (by the remote
/// person) and the live turn that carries the plan out has started. 409 `not_planning`
/// when the session has no plan to approve (not in plan mode, no plan-mode run completed
/// yet, or its plan was approved; the rule is `Kernel::approve_plan`'s), 409 `run_active` while a
/// run is active.
pub(crate) async fn post_approve_plan(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    visible_row(&state.host, session_id).await?;
    if state.host.is_active(session_id) {
        return Err(ApiError::conflict(
            "run_active",
            format!("session {session_id} has an active run; approve its plan when it ends"),
        ));
    }
    let kernel = root::inert_kernel(state.host.store.clone(), state.host.observer())
        .map_err(ApiError::from_root)?;
    let approved =
        kernel.approve_plan(session_id, BY_REMOTE).await.map_err(|error| match error {
            keel_kernel::KernelError::NotPlanning(_) => {
                ApiError::conflict("not_planning", error.to_string())
            }
            other => ApiError::from_kernel(other),
        })?;
    let task = Job::Turn(keel_kernel::APPROVED_PLAN_TASK.to_owned());
    let started = state.host.start(session_id, task, RunSettings::default()).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({
            "approved_seq": approved.0,
            "turn_id": started.turn_id,
            "run_id": started.run_id,
        })),
    )
        .into_response())
}
