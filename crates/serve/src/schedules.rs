//! Schedules and wakes on the host (DESIGN.md §9 "Schedules and wakes"): `POST/GET
//! /v1/schedules`, `DELETE /v1/schedules/{id}`, `POST /v1/wakes/{wake_id}`, the firer that
//! turns a claimed slot into a turn, and the sweep that resumes waiting runs whose wake
//! arrived (or whose deadline passed) — from boot, with no client connected.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, post};
use chrono::{DateTime, Utc};
use keel_contracts::{ApprovalMode, EventKind, RuntimeEvent, Seq, SessionId, SessionStatus, Store};
use keel_host::root::{self, RunSettings};
use keel_host::schedule::{self, FireOutcome, Firer, ScheduleSpec, Target};
use keel_store::{ScheduleRow, Schedules, WakeRow};
use serde_json::json;

use crate::auth::AppState;
use crate::error::ApiError;
use crate::extract::{Body, Params};
use crate::ledger;
use crate::sessions::new_session;
use crate::state::{Host, Job};
use crate::wire::{ScheduleBody, WakeBody};

/// How often the scheduler ticks and waiting runs are checked.
pub(crate) const TICK: Duration = Duration::from_millis(250);

pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/schedules", post(create_schedule).get(list_schedules))
        .route("/v1/schedules/{id}", delete(delete_schedule))
        .route("/v1/wakes/{wake_id}", post(post_wake))
}

fn schedules(host: &Host) -> Result<Arc<dyn Schedules>, ApiError> {
    host.schedules.get().cloned().ok_or_else(|| ApiError::internal("schedules are not open"))
}

/// Starts the scheduler and the wake sweep: they run for the life of the host.
pub(crate) fn start(host: Arc<Host>, schedules: Arc<dyn Schedules>) {
    let _ = host.schedules.set(schedules.clone());
    let scheduler = schedule::Scheduler::new(
        schedules,
        Arc::new(keel_contracts::SystemClock),
        root::lease_holder(),
        Arc::new(HostFirer { host: host.clone() }),
    );
    tokio::spawn(async move {
        loop {
            if let Err(error) = scheduler.tick().await {
                eprintln!("keel serve: the scheduler cannot read its schedules: {error:#}");
            }
            sweep_wakes(&host).await;
            tokio::time::sleep(TICK).await;
        }
    });
}

/// Fires claimed slots as turns of this host.
#[derive(Debug)]
struct HostFirer {
    host: Arc<Host>,
}

#[async_trait]
impl Firer for HostFirer {
    async fn fire(
        &self,
        row: &ScheduleRow,
        spec: &ScheduleSpec,
        slot: DateTime<Utc>,
    ) -> FireOutcome {
        let host = &self.host;
        let settings = RunSettings {
            max_steps: spec.max_steps,
            max_cost_usd: spec.max_cost_usd,
            ..RunSettings::default()
        };
        let session_id = match &spec.target {
            Target::Session { session_id } => {
                let events = match host.events(*session_id).await {
                    Ok(events) => events,
                    Err(error) => return FireOutcome::Refused(error.message),
                };
                if let Some(reason) = admission(host, &events) {
                    return FireOutcome::Refused(reason);
                }
                *session_id
            }
            Target::Template { workspace, model, approval } => {
                match create_session(host, workspace, model, *approval, &settings).await {
                    Ok(session_id) => session_id,
                    Err(error) => return FireOutcome::Refused(error.message),
                }
            }
        };
        if let Err(error) = record_fired(&host.store, session_id, row.id, slot).await {
            return FireOutcome::Failed(format!("cannot record schedule_fired: {error}"));
        }
        match host.start(session_id, Job::Turn(spec.task.clone()), settings).await {
            Ok(_) => FireOutcome::Fired(session_id),
            Err(error) if error.status == StatusCode::SERVICE_UNAVAILABLE => {
                FireOutcome::Failed(error.message)
            }
            Err(error) => FireOutcome::Refused(error.message),
        }
    }

    async fn running(&self, session_id: SessionId) -> bool {
        if self.host.is_active(session_id) {
            return true;
        }
        // A run parked on `wait` still goes on: a fire would end its wait (a new turn
        // answers the open `wait` cancelled), so it counts as running for overlap.
        match self.host.store.read(session_id, Seq(0)).await {
            Ok(events) => ledger::run_open(&events) || keel_kernel::waiting(&events).is_some(),
            Err(_) => true, // unknown: the safe side is "still runs"
        }
    }

    fn holder_alive(&self, holder: &str) -> Option<bool> {
        keel_kernel::HolderLiveness::alive(&root::LocalProcesses, holder)
    }
}

/// Why the host would not run the session now (sealed, workspace not admitted), if so.
fn admission(host: &Host, events: &[RuntimeEvent]) -> Option<String> {
    if let Some(reason) = ledger::sealed(events) {
        return Some(format!("the session is sealed ({reason})"));
    }
    match events.first().map(|event| &event.kind) {
        Some(EventKind::SessionCreated { workspace, .. }) => {
            let admitted =
                Path::new(workspace).canonicalize().is_ok_and(|workspace| host.admits(&workspace));
            (!admitted).then(|| {
                format!(
                    "workspace {workspace} is outside the host's allowed workspace roots, or \
                     holds KEEL_HOME"
                )
            })
        }
        _ => Some("the session has no session_created".to_owned()),
    }
}

/// A new hosted session from a schedule's template, admitted as `POST /v1/sessions` is.
async fn create_session(
    host: &Host,
    workspace: &str,
    model: &str,
    approval: ApprovalMode,
    settings: &RunSettings,
) -> Result<SessionId, ApiError> {
    let canonical = Path::new(workspace)
        .canonicalize()
        .map_err(|error| ApiError::bad_request(format!("workspace {workspace}: {error}")))?;
    if !host.admits(&canonical) {
        return Err(ApiError::forbidden(format!(
            "workspace {} is outside the host's allowed workspace roots, or holds KEEL_HOME",
            canonical.display()
        )));
    }
    let workspace = root::canonical_workspace(Some(&canonical)).map_err(ApiError::from_root)?;
    let settings =
        RunSettings { model: Some(model.to_owned()), approval: Some(approval), ..settings.clone() };
    new_session(host, &workspace, &settings, approval).await
}

/// Appends `schedule_fired` to the session (no turn, no run), retrying when another
/// writer took the seq first.
async fn record_fired(
    store: &Arc<dyn Store>,
    session_id: SessionId,
    schedule_id: uuid::Uuid,
    scheduled_at: DateTime<Utc>,
) -> Result<(), String> {
    let mut last_error = String::new();
    for _ in 0..5 {
        let events = store.read(session_id, Seq(0)).await.map_err(|e| e.to_string())?;
        let seq = events.last().map_or(Seq(0), |event| event.seq).next();
        let event = RuntimeEvent {
            seq,
            session_id,
            turn_id: None,
            run_id: None,
            ts: Utc::now(),
            kind: EventKind::ScheduleFired { schedule_id, scheduled_at },
        };
        match store.append(&[event]).await {
            Ok(()) => return Ok(()),
            Err(keel_contracts::AppendError::SeqConflict { .. }) => {
                last_error = "the session's ledger kept moving".to_owned();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.to_string()),
        }
    }
    Err(last_error)
}

/// Waiting runs whose wake was delivered (and not applied: a host stopped in between) or
/// whose deadline passed are resumed here.
async fn sweep_wakes(host: &Arc<Host>) {
    let Some(schedules) = host.schedules.get() else { return };
    let Ok(sessions) = host.store.sessions().await else { return };
    for session in sessions.iter().filter(|s| s.status == SessionStatus::Suspended) {
        if host.is_active(session.id) {
            continue;
        }
        // Only sessions that ever waited, read from their last wait on (index lookups).
        let Ok(Some(started)) = host.store.last_of_kind(session.id, "wait_started").await else {
            continue;
        };
        let after = Seq(started.seq.0.saturating_sub(1));
        let Ok(events) = host.store.read(session.id, after).await else { continue };
        let Some(waiting) = keel_kernel::waiting(&events) else { continue };
        let Ok(mut head) = host.store.read_kinds(session.id, &["session_created"], Seq(1)).await
        else {
            continue;
        };
        match host.store.last_of_kind(session.id, "session_sealed").await {
            Ok(sealed) => head.extend(sealed),
            Err(_) => continue,
        }
        if admission(host, &head).is_some() {
            continue;
        }
        let stored = match schedules.wake(&waiting.wake_id).await {
            Ok(Some(stored)) => stored,
            Ok(None) if Utc::now() >= waiting.deadline => {
                let timed_out = WakeRow {
                    wake_id: waiting.wake_id.clone(),
                    session_id: session.id,
                    payload: None,
                    by: "deadline".to_owned(),
                    received_at: Utc::now(),
                };
                match schedules.claim_wake(&timed_out).await {
                    Ok(stored) => stored,
                    Err(_) => continue,
                }
            }
            Ok(None) | Err(_) => continue,
        };
        apply(host, &stored).await;
    }
}

/// Resumes the waiting run with the delivered wake (a run already applying it elsewhere
/// answers 409, which is fine: the wake is applied once, by whoever holds the lease).
async fn apply(host: &Arc<Host>, stored: &WakeRow) {
    // Crash tests stop here: the wake is durable, its run not resumed yet.
    keel_host::failpoints::host_point("wake_claimed").await;
    let job = Job::Wake(stored.wake_id.clone(), schedule::answer_of(stored));
    match host.start(stored.session_id, job, RunSettings::default()).await {
        Ok(_) => eprintln!("keel serve: woke session {} ({})", stored.session_id, stored.by),
        Err(error) if error.status == StatusCode::CONFLICT => {}
        Err(error) => {
            eprintln!("keel serve: cannot wake session {}: {}", stored.session_id, error.message)
        }
    }
}

/// The spec a request asks for, checked against what this host admits.
async fn spec_of(host: &Host, body: ScheduleBody) -> Result<ScheduleSpec, ApiError> {
    let usage = |error: anyhow::Error| ApiError::bad_request(format!("{error:#}"));
    let when = schedule::parse_when(
        body.every.as_deref(),
        body.cron.as_deref(),
        body.tz.as_deref(),
        schedule::WhenFields::JSON,
    )
    .map_err(usage)?;
    let target = match (&body.session_id, &body.workspace) {
        (Some(id), None) => {
            if body.approval.is_some() || body.model.is_some() {
                return Err(ApiError::bad_request(
                    "a schedule of an existing session runs with the session's model and \
                     approval; approval and model are for a workspace template",
                ));
            }
            let session_id = uuid::Uuid::try_parse(id)
                .map(SessionId)
                .map_err(|_| ApiError::bad_request("a session id is a UUID (36 characters)"))?;
            let events = host.events(session_id).await?;
            if let Some(reason) = admission(host, &events) {
                // Not this host's to schedule: as if absent.
                return Err(ApiError::not_found(format!(
                    "no session {session_id} here ({reason})"
                )));
            }
            Target::Session { session_id }
        }
        (None, Some(workspace)) => {
            let requested = Path::new(workspace);
            if !requested.is_absolute() {
                return Err(ApiError::bad_request("workspace must be an absolute path"));
            }
            let canonical = requested.canonicalize().map_err(|error| {
                ApiError::bad_request(format!("workspace {workspace}: {error}"))
            })?;
            if !host.admits(&canonical) {
                return Err(ApiError::forbidden(format!(
                    "workspace {} is outside the host's allowed workspace roots, or holds KEEL_HOME",
                    canonical.display()
                )));
            }
            let model = body
                .model
                .clone()
                .ok_or_else(|| ApiError::bad_request("a workspace template needs a model"))?;
            // The spec's shape and provider now, not at the first fire (no file is read
            // and no key looked for here).
            keel_host::provider::check_model_spec(&model)
                .map_err(|error| ApiError::bad_request(format!("model: {error}")))?;
            Target::Template {
                workspace: canonical.display().to_string(),
                model,
                // Nobody is there to ask: a scheduled run's consent is denied unless the
                // schedule says otherwise.
                approval: body.approval.unwrap_or(ApprovalMode::Deny),
            }
        }
        _ => return Err(ApiError::bad_request("give exactly one of session_id and workspace")),
    };
    let catch_up = match &body.catch_up {
        Some(text) => keel_host::duration::parse_duration(text).ok_or_else(|| {
            ApiError::bad_request(
                "\"catch_up\": a duration such as 5m, at most 876000h (100 years)",
            )
        })?,
        None => schedule::DEFAULT_CATCH_UP,
    };
    Ok(ScheduleSpec {
        when,
        target,
        task: body.task,
        overlap: body.overlap.unwrap_or_default(),
        catch_up_ms: u64::try_from(catch_up.as_millis())
            .unwrap_or(u64::MAX)
            .max(schedule::MIN_CATCH_UP_MS),
        max_steps: body.max_steps,
        max_cost_usd: body.max_cost_usd,
    })
}

async fn create_schedule(
    State(state): State<AppState>,
    Body(body): Body<ScheduleBody>,
) -> Result<Response, ApiError> {
    let host = &state.host;
    let spec = spec_of(host, body).await?;
    let row = schedule::new_row(&spec, Utc::now()).map_err(ApiError::from_root)?;
    schedules(host)?.add_schedule(&row).await.map_err(ApiError::internal)?;
    Ok((StatusCode::CREATED, axum::Json(json!({"schedule_id": row.id}))).into_response())
}

/// Whether the host shows a schedule: its workspace (or its session's) is admitted here.
async fn visible(host: &Host, row: &ScheduleRow) -> bool {
    match serde_json::from_value::<ScheduleSpec>(row.spec.clone()).map(|spec| spec.target) {
        Ok(Target::Template { workspace, .. }) => {
            Path::new(&workspace).canonicalize().is_ok_and(|w| host.admits(&w))
        }
        Ok(Target::Session { session_id }) => match host.store.read(session_id, Seq(0)).await {
            Ok(events) => admission(host, &events).is_none_or(|reason| reason.contains("sealed")),
            Err(_) => false,
        },
        Err(_) => false,
    }
}

async fn list_schedules(State(state): State<AppState>) -> Result<Response, ApiError> {
    let host = &state.host;
    let store = schedules(host)?;
    let mut out = Vec::new();
    for row in store.schedules().await.map_err(ApiError::internal)? {
        if visible(host, &row).await {
            let fires = store.fires(row.id, 1).await.map_err(ApiError::internal)?;
            out.push(schedule::describe(&row, &fires));
        }
    }
    Ok(axum::Json(out).into_response())
}

async fn delete_schedule(
    State(state): State<AppState>,
    Params(id): Params<String>,
) -> Result<Response, ApiError> {
    let host = &state.host;
    let id = uuid::Uuid::try_parse(&id)
        .map_err(|_| ApiError::bad_request("a schedule id is a UUID (36 characters)"))?;
    let store = schedules(host)?;
    let row = store.schedules().await.map_err(ApiError::internal)?.into_iter().find(|r| r.id == id);
    let Some(row) = row else {
        return Err(ApiError::not_found(format!("no schedule {id}")));
    };
    if !visible(host, &row).await {
        return Err(ApiError::not_found(format!("no schedule {id}")));
    }
    store.remove_schedule(id).await.map_err(ApiError::internal)?;
    Ok(axum::Json(json!({"schedule_id": id, "removed": true})).into_response())
}

fn wake_json(stored: &WakeRow) -> serde_json::Value {
    json!({"wake_id": stored.wake_id, "session_id": stored.session_id, "payload": stored.payload,
           "by": stored.by, "received_at": stored.received_at})
}

/// `POST /v1/wakes/{wake_id}`: the first payload wins; again, 200 with the first result.
async fn post_wake(
    State(state): State<AppState>,
    Params(wake_id): Params<String>,
    Body(body): Body<WakeBody>,
) -> Result<Response, ApiError> {
    let host = &state.host;
    let not_found = || ApiError::not_found("no run waits for this wake id");
    let session_id = keel_kernel::wake_session(&wake_id).ok_or_else(not_found)?;
    let events = host.events(session_id).await.map_err(|_| not_found())?;
    if admission(host, &events).is_some_and(|reason| !reason.contains("sealed")) {
        return Err(not_found());
    }
    let payload = match body.payload {
        serde_json::Value::String(text) => text,
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    };
    if payload.len() > schedule::MAX_WAKE_PAYLOAD {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("a wake payload is at most {} bytes", schedule::MAX_WAKE_PAYLOAD),
        ));
    }
    let store = schedules(host)?;
    let waiting = keel_kernel::waiting(&events)
        .filter(|waiting| keel_kernel::same_wake_id(&waiting.wake_id, &wake_id));
    let stored = store.wake(&wake_id).await.map_err(ApiError::internal)?;
    let stored = match (stored, &waiting) {
        (Some(stored), _) => stored,
        (None, Some(_)) => store
            .claim_wake(&WakeRow {
                wake_id: wake_id.clone(),
                session_id,
                payload: Some(payload),
                by: "http".to_owned(),
                received_at: Utc::now(),
            })
            .await
            .map_err(ApiError::internal)?,
        (None, None) => return Err(not_found()),
    };
    if stored.session_id != session_id {
        return Err(not_found());
    }
    if waiting.is_some() {
        apply(host, &stored).await;
    }
    Ok(axum::Json(wake_json(&stored)).into_response())
}
