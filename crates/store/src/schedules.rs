//! Schedules, their fires and wakes (DESIGN.md §9 "Schedules and wakes"): the durable
//! rows behind `keel schedule` and `POST /v1/wakes/{wake_id}`, kept beside the ledger in the
//! same database (SQLite file or PostgreSQL), so every host sharing a ledger shares them.
//!
//! The one guarantee the rest is built on: a fire is the row `(schedule_id, scheduled_at)`,
//! claimed by an `INSERT` that a unique key lets succeed once, on one host or many
//! ([`Schedules::claim_fire`]); a wake is the row `wake_id`, whose first payload wins
//! ([`Schedules::claim_wake`]). What a schedule means (cron, interval, target) is the host's:
//! this crate stores its spec as JSON.

use std::fmt::Debug;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::SessionId;
use uuid::Uuid;

/// A schedule as stored: its id, when it was created, whether it is paused, and the
/// host's JSON description of it (when it fires, what it starts).
#[derive(Debug, Clone, PartialEq)]
pub struct ScheduleRow {
    /// The schedule's id (UUIDv7).
    pub id: Uuid,
    /// When it was created (its first slot comes after this).
    pub created_at: DateTime<Utc>,
    /// A paused schedule claims no fires.
    pub paused: bool,
    /// The host's description of the schedule.
    pub spec: serde_json::Value,
}

/// Where a fire stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FireState {
    /// Claimed by a host; nothing known to have run yet.
    Claimed,
    /// Claimed and waiting for the schedule's running fire to end (overlap `buffer`).
    Buffered,
    /// A turn was started (its outcome is the session's ledger).
    Fired,
    /// Not run: an earlier fire still ran (overlap `skip`), or a later slot caught up.
    Skipped,
    /// Not run: admission refused it at fire time (its reason in `detail`).
    Refused,
    /// Failed before its turn started, or its outcome is unknown after a crash.
    Failed,
}

impl FireState {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            FireState::Claimed => "claimed",
            FireState::Buffered => "buffered",
            FireState::Fired => "fired",
            FireState::Skipped => "skipped",
            FireState::Refused => "refused",
            FireState::Failed => "failed",
        }
    }

    /// Parses [`FireState::as_str`]'s spelling.
    pub fn parse(text: &str) -> Option<FireState> {
        Some(match text {
            "claimed" => FireState::Claimed,
            "buffered" => FireState::Buffered,
            "fired" => FireState::Fired,
            "skipped" => FireState::Skipped,
            "refused" => FireState::Refused,
            "failed" => FireState::Failed,
            _ => return None,
        })
    }

    /// Whether the fire is settled: nothing more happens to it.
    pub fn is_settled(self) -> bool {
        !matches!(self, FireState::Claimed | FireState::Buffered)
    }
}

/// One slot of one schedule, claimed once.
#[derive(Debug, Clone, PartialEq)]
pub struct FireRow {
    /// The schedule.
    pub schedule_id: Uuid,
    /// The slot (millisecond precision).
    pub scheduled_at: DateTime<Utc>,
    /// Who claimed it (`keel pid 4242 on build-7`).
    pub holder: String,
    /// When it was claimed.
    pub claimed_at: DateTime<Utc>,
    /// Where it stands.
    pub state: FireState,
    /// The session it started or continued, once known.
    pub session_id: Option<SessionId>,
    /// Why it stands so (a refusal's reason, an error), or empty.
    pub detail: String,
}

/// A wake as stored: the first payload delivered for `wake_id`.
#[derive(Debug, Clone, PartialEq)]
pub struct WakeRow {
    /// The wake id the waiting run recorded.
    pub wake_id: String,
    /// The session whose run waits.
    pub session_id: SessionId,
    /// The payload (`None`: the deadline passed).
    pub payload: Option<String>,
    /// Who delivered it (`http`, `cli`, `deadline`).
    pub by: String,
    /// When it was delivered.
    pub received_at: DateTime<Utc>,
}

/// A schedule or wake operation failed in the backend (I/O, a lock held too long, a
/// corrupt row). Nothing half-done is left: each operation is one statement or transaction.
#[derive(Debug, Clone, thiserror::Error)]
#[error("schedule store: {message}")]
pub struct SchedulesError {
    /// The backend's message.
    pub message: String,
}

impl SchedulesError {
    pub(crate) fn new(message: impl std::fmt::Display) -> SchedulesError {
        SchedulesError { message: message.to_string() }
    }
}

/// Schedules, fires and wakes, durably. Implemented by `SqliteStore` and `PgStore`.
///
/// Every method needs a tokio runtime. Each is one statement or one transaction, so a
/// dropped future leaves either all of its write or none of it (cancel safe in that sense).
#[async_trait]
pub trait Schedules: Send + Sync + Debug {
    /// Stores a new schedule.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails or the id exists.
    async fn add_schedule(&self, row: &ScheduleRow) -> Result<(), SchedulesError>;

    /// Every schedule, oldest first.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails or a row does not decode.
    async fn schedules(&self) -> Result<Vec<ScheduleRow>, SchedulesError>;

    /// Pauses or resumes a schedule; whether it exists.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails.
    async fn set_schedule_paused(&self, id: Uuid, paused: bool) -> Result<bool, SchedulesError>;

    /// Removes a schedule (its fires stay, as history); whether it existed.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails.
    async fn remove_schedule(&self, id: Uuid) -> Result<bool, SchedulesError>;

    /// Claims the slot `(fire.schedule_id, fire.scheduled_at)`: `true` when this call
    /// inserted it, `false` when anyone (this host or another) claimed it before. Only the
    /// caller that got `true` may run anything for the slot.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails (the slot is then not claimed by this
    /// call; a retry tells).
    async fn claim_fire(&self, fire: &FireRow) -> Result<bool, SchedulesError>;

    /// Moves an unsettled fire to `state` (with its session and detail); whether it was
    /// unsettled. A settled fire never changes again.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails.
    async fn settle_fire(
        &self,
        schedule_id: Uuid,
        scheduled_at: DateTime<Utc>,
        state: FireState,
        session_id: Option<SessionId>,
        detail: &str,
    ) -> Result<bool, SchedulesError>;

    /// The schedule's newest `limit` fires, newest first.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails or a row does not decode.
    async fn fires(&self, schedule_id: Uuid, limit: u32) -> Result<Vec<FireRow>, SchedulesError>;

    /// Every unsettled fire (claimed or buffered), of any schedule, oldest first.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails or a row does not decode.
    async fn unsettled_fires(&self) -> Result<Vec<FireRow>, SchedulesError>;

    /// Delivers a wake: stores `wake` unless a wake with its id was delivered before, and
    /// returns the stored one (the first delivery wins; a later one gets the first back).
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails.
    async fn claim_wake(&self, wake: &WakeRow) -> Result<WakeRow, SchedulesError>;

    /// The delivered wake with this id, if any.
    ///
    /// # Errors
    ///
    /// [`SchedulesError`] when the backend fails or the row does not decode.
    async fn wake(&self, wake_id: &str) -> Result<Option<WakeRow>, SchedulesError>;
}

/// Milliseconds since the epoch: the stored form of every schedule time (exact, ordered).
pub(crate) fn millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

/// [`millis`] back to a time.
pub(crate) fn from_millis(ms: i64) -> Result<DateTime<Utc>, SchedulesError> {
    DateTime::from_timestamp_millis(ms)
        .ok_or_else(|| SchedulesError::new(format!("time {ms} ms is out of range")))
}

/// A stored fire state back to [`FireState`].
pub(crate) fn state_of(text: &str) -> Result<FireState, SchedulesError> {
    FireState::parse(text).ok_or_else(|| SchedulesError::new(format!("unknown fire state {text}")))
}
