//! The HTTP API (DESIGN.md §9): routes, the bearer token, request bodies and the one
//! mapping from failures to `{"error": {"code", "message"}}` answers.

use std::sync::Arc;

use axum::Router;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::Sse;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keel_contracts::{ApprovalMode, ExecutionMode, PermissionAnswer, Seq, SessionId};
use keel_kernel::{KernelError, SessionConfig};
use serde::Deserialize;
use serde_json::json;

use super::approvals::BY_REMOTE;
use super::ledger;
use super::state::{Host, Job};
use keel_host::root::{self, RunSettings};

/// The shared state of every handler: the host and its token.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) host: Arc<Host>,
    pub(crate) token: Arc<str>,
    /// The web timeline's login links and logged-in browsers.
    pub(crate) web: Arc<super::web::WebAuth>,
}

/// Leaves the token out, so no `{:?}` can log it.
impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").field("host", &self.host).finish_non_exhaustive()
    }
}

/// The router: `/v1/health` open, everything else behind the bearer token; bodies capped
/// at `max_body_bytes`; no CORS headers (a browser page from elsewhere cannot call it).
pub(crate) fn router(state: AppState) -> Router {
    let limit = state.host.config.max_body_bytes;
    let protected = Router::new()
        .route("/v1/openapi.json", get(openapi))
        .route("/v1/sessions", post(create_session).get(list_sessions))
        .route("/v1/sessions/{id}", get(get_session))
        .route("/v1/sessions/{id}/turns", post(post_turn))
        .route("/v1/sessions/{id}/input", post(super::steer::post_input))
        .route("/v1/sessions/{id}/plan/approve", post(super::steer::post_approve_plan))
        .route("/v1/sessions/{id}/resume", post(post_resume))
        .route("/v1/sessions/{id}/cancel", post(post_cancel))
        .route("/v1/sessions/{id}/seal", post(post_seal))
        .route("/v1/sessions/{id}/events", get(get_events))
        .route("/v1/sessions/{id}/permissions", get(list_permissions))
        .route("/v1/sessions/{id}/permissions/{call_id}", post(answer_permission))
        .route("/v1/sessions/{id}/questions", get(list_questions))
        .route("/v1/sessions/{id}/questions/{question}", post(answer_question))
        .merge(super::schedules::routes())
        // The bearer token, or a logged-in browser's cookie (with CSRF checks).
        .route_layer(middleware::from_fn_with_state(state.clone(), super::web::require_auth));
    Router::new()
        .route("/v1/health", get(health))
        .merge(protected)
        .merge(super::web::router(state.clone()))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(limit))
        .with_state(state)
}

/// A failure, as the client sees it.
#[derive(Debug)]
pub(crate) struct ApiError {
    pub(crate) status: StatusCode,
    pub(crate) code: &'static str,
    pub(crate) message: String,
    retry_after: Option<u64>,
}

impl ApiError {
    pub(crate) fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError { status, code, message: message.into(), retry_after: None }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }

    pub(crate) fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    pub(crate) fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }

    pub(crate) fn locked(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::LOCKED, "locked", message)
    }

    pub(crate) fn overloaded(message: impl Into<String>) -> ApiError {
        ApiError {
            retry_after: Some(5),
            ..ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message)
        }
    }

    pub(crate) fn forbidden(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message)
    }

    pub(crate) fn internal(error: impl std::fmt::Display) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", error.to_string())
    }

    /// A composition-root error: a usage error is the client's (400), the rest ours.
    pub(crate) fn from_root(error: anyhow::Error) -> ApiError {
        if keel_host::error::is_usage(&error) {
            ApiError::bad_request(format!("{error:#}"))
        } else {
            ApiError::internal(format!("{error:#}"))
        }
    }

    /// The one mapping of kernel errors.
    pub(crate) fn from_kernel(error: KernelError) -> ApiError {
        match &error {
            KernelError::Sealed(_) => ApiError::locked(error.to_string()),
            KernelError::SessionNotFound(_) => ApiError::not_found(error.to_string()),
            KernelError::Leased { .. } => ApiError::conflict("run_active", error.to_string()),
            KernelError::NothingToResume(_) => {
                ApiError::conflict("nothing_to_resume", error.to_string())
            }
            KernelError::Append(keel_contracts::AppendError::SeqConflict { .. }) => {
                ApiError::conflict("run_active", error.to_string())
            }
            _ => ApiError::internal(error.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// A JSON body whose rejections answer in our format: malformed JSON and a body of the
/// wrong shape (a missing or unknown field, a wrong type) 400 `bad_request`, too large 413
/// `payload_too_large`, not JSON 415 `unsupported_media_type`.
pub(crate) struct Body<T>(pub(crate) T);

impl<S, T> FromRequest<S> for Body<T>
where
    axum::Json<T>: FromRequest<S, Rejection = JsonRejection>,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(Body(value)),
            // axum answers a body of the wrong shape 422 and malformed JSON 400; both are
            // a bad request here (400 `bad_request`), so the status and the code agree.
            Err(rejection) => Err(match rejection.status() {
                StatusCode::PAYLOAD_TOO_LARGE => ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "payload_too_large",
                    rejection.body_text(),
                ),
                StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "unsupported_media_type",
                    rejection.body_text(),
                ),
                _ => ApiError::bad_request(rejection.body_text()),
            }),
        }
    }
}

/// Path parameters whose rejections (say, bytes that are not UTF-8) answer in our format.
pub(crate) struct Params<T>(pub(crate) T);

impl<S, T> axum::extract::FromRequestParts<S> for Params<T>
where
    T: serde::de::DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, Self::Rejection> {
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(Params(value)),
            Err(rejection) => Err(ApiError::bad_request(rejection.body_text())),
        }
    }
}

/// Answers 401 unless `Authorization: Bearer TOKEN` carries the host's token (compared in
/// constant time). The token is never logged or echoed.
pub(crate) async fn require_token(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let offered = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim);
    match offered {
        Some(offered) if constant_time_eq(offered.as_bytes(), state.token.as_bytes()) => {
            next.run(request).await
        }
        _ => {
            let mut response = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token (Authorization: Bearer TOKEN; the token is \
                 KEEL_SERVE_TOKEN or KEEL_HOME/serve.token)",
            )
            .into_response();
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
    (
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        super::openapi::DOCUMENT,
    )
        .into_response()
}

/// A session id in a path: a full UUID, nothing else (no prefixes, no paths).
pub(crate) fn session_id(text: &str) -> Result<SessionId, ApiError> {
    uuid::Uuid::try_parse(text)
        .map(SessionId)
        .map_err(|_| ApiError::bad_request("a session id is a UUID (36 characters)"))
}

/// A scope as a flag spells it, or as a list of tool names.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ScopeText {
    Text(String),
    List(Vec<String>),
}

impl ScopeText {
    fn flag(self) -> String {
        match self {
            ScopeText::Text(text) => text,
            ScopeText::List(names) => names.join(","),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeBody {
    reads: Option<ScopeText>,
    writes: Option<ScopeText>,
    forbid: Option<ScopeText>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    workspace: String,
    model: Option<String>,
    base_url: Option<String>,
    envelope: Option<EnvelopeBody>,
    mode: Option<ExecutionMode>,
    approval: Option<ApprovalMode>,
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

/// Creates a hosted session in `workspace` (canonical, already admitted) with `settings`:
/// the one composition root assembles it (config, trust, tools), the envelope's tool names
/// are checked, and the session's approval mode is remembered for its runs. Used by
/// `POST /v1/sessions` and by schedules that start a new session per fire.
///
/// # Errors
///
/// An [`ApiError`] for an invalid setting or config (400), a kernel or store failure.
pub(crate) async fn new_session(
    host: &Host,
    workspace: &std::path::Path,
    settings: &RunSettings,
    approval: ApprovalMode,
) -> Result<SessionId, ApiError> {
    let prepared =
        root::prepare(&host.home, workspace, settings, None, &host.store, Some(host.person()))
            .map_err(ApiError::from_root)?;
    let assembly =
        root::assemble(prepared, &host.home, workspace, host.store.clone(), host.observer())
            .await
            .map_err(ApiError::from_root)?;
    root::check_tool_names(&assembly.kernel, &assembly.resolved.envelope)
        .map_err(ApiError::from_root)?;
    let resolved = &assembly.resolved;
    let session_id = assembly
        .kernel
        .create_session(&SessionConfig {
            workspace: workspace.to_path_buf(),
            model_spec: resolved.model_spec.clone(),
            envelope: resolved.envelope.clone(),
            mode: resolved.mode,
            base_url: resolved.recorded_base_url.clone(),
        })
        .await
        .map_err(ApiError::from_kernel)?;
    host.remember_approval(session_id, approval).map_err(ApiError::internal)?;
    Ok(session_id)
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

/// The session's `state` as every listing names it ([`keel_host::root::shown_state`]): an open
/// run whose process is gone is `interrupted`, not `running`; a run this host drives is
/// what its row says.
///
/// # Cancel safety
///
/// Cancel-safe: it only reads.
pub(crate) async fn shown_state(host: &Host, row: &keel_contracts::SessionSummary) -> &'static str {
    if host.is_active(row.id) {
        row.status.as_str()
    } else {
        keel_host::root::shown_state(host.store.as_ref(), row).await
    }
}

/// Whether the host shows a session at all: its workspace (canonical now) is one the host
/// admits. A session of another workspace in the same `KEEL_HOME` (a `keel run` elsewhere,
/// another host's roots) is not this host's to read, stream, answer or cancel: it answers
/// 404, as if absent, and is left out of the list.
pub(crate) fn visible(host: &super::state::Host, row: &keel_contracts::SessionSummary) -> bool {
    std::path::Path::new(&row.workspace)
        .canonicalize()
        .is_ok_and(|workspace| host.admits(&workspace))
}

/// [`visible`] for one session: its summary row, or 404.
pub(crate) async fn visible_row(
    host: &super::state::Host,
    session_id: keel_contracts::SessionId,
) -> Result<keel_contracts::SessionSummary, ApiError> {
    let row = host.store.session(session_id).await.map_err(ApiError::internal)?;
    row.filter(|row| visible(host, row))
        .ok_or_else(|| ApiError::not_found(format!("no session {session_id}")))
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

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TurnBody {
    input: String,
    max_steps: Option<u32>,
    max_tokens: Option<u64>,
    max_cost_usd: Option<f64>,
    max_time: Option<String>,
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

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SealBody {
    reason: Option<String>,
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

#[derive(Debug, Deserialize)]
struct EventsQuery {
    after: Option<String>,
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
    let stream = super::events::stream(state.host.clone(), session_id, after);
    Ok(Sse::new(stream).into_response())
}

async fn list_permissions(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    list_open(&state.host, &id, ledger::pending).await
}

async fn list_questions(
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswerBody {
    answer: PermissionAnswer,
}

async fn answer_permission(
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct QuestionBody {
    action: keel_contracts::ElicitationAction,
    #[serde(default)]
    content: Option<serde_json::Value>,
}

/// Answers a server's question: the content is checked against the requested form (422
/// when it does not match), handed to the run that waits for it (409 `not_waiting` when
/// none does on this host: the MCP request that asked ended with the process that made
/// it), and the reply comes once the kernel recorded `elicitation_answered`.
async fn answer_question(
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
