//! The HTTP API (DESIGN.md §9): the router, behind the bearer token or a logged-in
//! browser's cookie ([`crate::auth`]), and the session routes: create, list, read, turns,
//! resume, cancel, seal and the event stream. Answers to permission requests and questions
//! are in [`crate::answers`], steering in [`crate::steer`], schedules and wakes in
//! [`crate::schedules`], the web timeline in [`crate::web`]; the request bodies in
//! [`crate::wire`].

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware;
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_contracts::{ApprovalMode, Seq};
use keel_host::root::{self, RunSettings};
use serde_json::json;

use crate::auth::{AppState, require_auth};
use crate::error::ApiError;
use crate::extract::{Body, Params, session_id};
use crate::ledger;
use crate::sessions::{new_session, shown_state, visible, visible_row};
use crate::state::{Host, Job};
use crate::wire::{CreateBody, EventsQuery, ScopeText, SealBody, TurnBody};
use crate::{answers, events, openapi, schedules, steer, web};

/// The router: `/v1/health` open, everything else behind the bearer token; bodies capped
/// at `max_body_bytes`; no CORS headers (a browser page from elsewhere cannot call it).
pub(crate) fn router(state: AppState) -> Router {
    let limit = state.host.config.max_body_bytes;
    let protected = Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session))
        .route("/v1/sessions/{id}/turns", post(post_turn))
        .route("/v1/sessions/{id}/input", post(steer::post_input))
        .route("/v1/sessions/{id}/plan/approve", post(steer::post_approve_plan))
        .route("/v1/sessions/{id}/resume", post(post_resume))
        .route("/v1/sessions/{id}/cancel", post(post_cancel))
        .route("/v1/sessions/{id}/seal", post(post_seal))
        .route("/v1/sessions/{id}/events", get(get_events))
        .route("/v1/sessions/{id}/permissions", get(answers::list_permissions))
        .route("/v1/sessions/{id}/permissions/{call_id}", post(answers::answer_permission))
        .route("/v1/sessions/{id}/questions", get(answers::list_questions))
        .route("/v1/sessions/{id}/questions/{question}", post(answers::answer_question))
        .merge(schedules::routes())
        // The bearer token, or a logged-in browser's cookie (with CSRF checks).
        .route_layer(middleware::from_fn_with_state(state.clone(), require_auth));
    Router::new()
        .route("/v1/health", get(health))
        .merge(protected)
        .merge(web::router(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", "method not allowed here")
}

async fn health() -> axum::Json<serde_json::Value> {
    axum::Json(json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")}))
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], openapi::DOCUMENT)
        .into_response()
}

async fn create_session(
    State(state): State<AppState>,
    Body(body): Body<CreateBody>,
) -> Result<Response, ApiError> {
    let host = &state.host;
    let requested = std::path::Path::new(&body.workspace);
    if !requested.is_absolute() {
        return Err(ApiError::bad_request("workspace must be an absolute path"));
    }
    let canonical = requested
        .canonicalize()
        .map_err(|error| ApiError::bad_request(format!("workspace {}: {error}", body.workspace)))?;
    if !host.admits(&canonical) {
        return Err(ApiError::forbidden(format!(
            "workspace {} is outside the host's allowed workspace roots, or holds KEEL_HOME",
            canonical.display()
        )));
    }
    let workspace = root::canonical_workspace(Some(&canonical)).map_err(ApiError::from_root)?;
    let approval = body.approval.unwrap_or(ApprovalMode::Ask);
    let envelope = body.envelope;
    let (reads, writes, forbid) = match envelope {
        Some(envelope) => (
            envelope.reads.map(ScopeText::flag),
            envelope.writes.map(ScopeText::flag),
            envelope.forbid.map(ScopeText::flag),
        ),
        None => (None, None, None),
    };
    let settings = RunSettings {
        model: body.model,
        base_url: body.base_url,
        mode: body.mode,
        approval: Some(approval),
        reads,
        writes,
        forbid,
        over_http: true,
        ..RunSettings::default()
    };
    let session_id = new_session(host, &workspace, &settings, approval).await?;
    Ok((StatusCode::CREATED, axum::Json(json!({"session_id": session_id}))).into_response())
}

/// A session's summary: the listing's row, usage and cost included (the store keeps
/// them with the row). `session_id` and `id` are the same (`id` for older clients).
/// Token counts include keel's estimates for responses whose usage the provider did not
/// report: `estimated_tokens` of them, and `estimated` says whether any are.
///
/// `state` is named as `keel sessions` names it ([`keel_host::root::shown_state`]): an open run
/// whose process is gone is `interrupted`, not `running`.
async fn summary(host: &Host, row: &keel_contracts::SessionSummary) -> serde_json::Value {
    let usage = &row.usage;
    let state = shown_state(host, row).await;
    json!({
        "session_id": row.id,
        "id": row.id,
        "workspace": row.workspace,
        "model": row.model,
        "title": row.title,
        "state": state,
        "active_here": host.is_active(row.id),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
        "last_seq": row.last_seq,
        "parent": row.parent,
        "usage": {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                  "estimated_tokens": usage.estimated_tokens,
                  "estimated": usage.estimated_tokens > 0 || usage.responses_without_usage > 0,
                  "responses": usage.responses,
                  "responses_without_usage": usage.responses_without_usage},
        "cost_usd": usage.cost_usd,
    })
}

async fn list_sessions(State(state): State<AppState>) -> Result<Response, ApiError> {
    let rows = state.host.store.sessions().await.map_err(ApiError::internal)?;
    let mut sessions = Vec::with_capacity(rows.len());
    for row in rows.iter().filter(|row| visible(&state.host, row)) {
        sessions.push(summary(&state.host, row).await);
    }
    Ok(axum::Json(json!({"sessions": sessions})).into_response())
}

async fn get_session(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    let row = visible_row(&state.host, session_id).await?;
    Ok(axum::Json(summary(&state.host, &row).await).into_response())
}

async fn post_turn(
    State(state): State<AppState>,
    Params(id): Params<String>,
    Body(body): Body<TurnBody>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    if body.input.trim().is_empty() {
        return Err(ApiError::bad_request("the input is empty"));
    }
    let settings = RunSettings {
        max_steps: body.max_steps,
        max_tokens: body.max_tokens,
        max_cost_usd: body.max_cost_usd,
        max_time: body.max_time,
        over_http: true,
        ..RunSettings::default()
    };
    let started = state.host.start(session_id, Job::Turn(body.input), settings).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"turn_id": started.turn_id, "run_id": started.run_id})),
    )
        .into_response())
}

async fn post_resume(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    let started = state.host.start(session_id, Job::Resume, RunSettings::default()).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(json!({"turn_id": started.turn_id, "run_id": started.run_id})),
    )
        .into_response())
}

async fn post_cancel(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    visible_row(&state.host, session_id).await?;
    let events = state.host.events(session_id).await?;
    if state.host.cancel(session_id) {
        return Ok(
            (StatusCode::ACCEPTED, axum::Json(json!({"cancelling": "here"}))).into_response()
        );
    }
    if ledger::run_open(&events) {
        // Driven by another process: ask through the store, as `keel stop` does.
        state.host.store.request_cancel(session_id).await.map_err(ApiError::internal)?;
        return Ok(
            (StatusCode::ACCEPTED, axum::Json(json!({"cancelling": "requested"}))).into_response()
        );
    }
    Err(ApiError::conflict("no_active_run", format!("session {session_id} has no active run")))
}

async fn post_seal(
    State(state): State<AppState>,
    Params(id): Params<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    visible_row(&state.host, session_id).await?;
    // The body is optional: none, or `{"reason": TEXT}`.
    let body: SealBody = if body.iter().all(u8::is_ascii_whitespace) {
        SealBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|error| ApiError::bad_request(format!("invalid seal body: {error}")))?
    };
    let events = state.host.events(session_id).await?;
    if let Some(reason) = ledger::sealed(&events) {
        return Ok(axum::Json(json!({"sealed": true, "reason": reason})).into_response());
    }
    if state.host.is_active(session_id) {
        return Err(ApiError::conflict(
            "run_active",
            format!("session {session_id} has an active run; cancel it first"),
        ));
    }
    let reason = body
        .reason
        .map(|reason| reason.trim().to_owned())
        .filter(|reason| !reason.is_empty())
        .unwrap_or_else(|| "sealed over the host API".to_owned());
    let kernel = root::inert_kernel(state.host.store.clone(), state.host.observer())
        .map_err(ApiError::from_root)?;
    let seq = kernel.seal_session(session_id, &reason).await.map_err(ApiError::from_kernel)?;
    Ok(axum::Json(json!({"sealed": true, "reason": reason, "seq": seq})).into_response())
}

async fn get_events(
    State(state): State<AppState>,
    Params(id): Params<String>,
    Query(query): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let session_id = session_id(&id)?;
    visible_row(&state.host, session_id).await?;
    state.host.events(session_id).await?;
    let from_header = headers.get("last-event-id").map(|value| value.to_str().unwrap_or("x"));
    let after = match from_header.or(query.after.as_deref()) {
        None => Seq(0),
        Some(text) => Seq(text.trim().parse::<u64>().map_err(|_| {
            ApiError::bad_request("Last-Event-ID and ?after= are a ledger seq (a whole number)")
        })?),
    };
    let stream = events::stream(state.host.clone(), session_id, after);
    Ok(Sse::new(stream).into_response())
}
