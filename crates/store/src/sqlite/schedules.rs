//! [`Schedules`] on SQLite: the `schedules`, `schedule_fires` and `wakes` tables of the
//! ledger file. A claim is `INSERT … ON CONFLICT DO NOTHING` on the primary key, so two
//! processes sharing the file claim each slot once.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::SessionId;
use rusqlite::{OptionalExtension, params};
use uuid::Uuid;

use super::SqliteStore;
use crate::schedules::{
    FireRow, FireState, ScheduleRow, Schedules, SchedulesError, WakeRow, from_millis, millis,
    state_of,
};

fn backend(error: rusqlite::Error) -> SchedulesError {
    SchedulesError::new(error)
}

fn uuid_of(text: &str) -> Result<Uuid, SchedulesError> {
    Uuid::try_parse(text).map_err(|_| SchedulesError::new(format!("bad id {text:?} in a row")))
}

/// A raw fire row: schedule id, slot, holder, claimed at, state, session, detail.
type RawFire = (String, i64, String, i64, String, Option<String>, String);

fn fire_of(raw: RawFire) -> Result<FireRow, SchedulesError> {
    let (schedule_id, scheduled_at, holder, claimed_at, state, session_id, detail) = raw;
    Ok(FireRow {
        schedule_id: uuid_of(&schedule_id)?,
        scheduled_at: from_millis(scheduled_at)?,
        holder,
        claimed_at: from_millis(claimed_at)?,
        state: state_of(&state)?,
        session_id: session_id.as_deref().map(uuid_of).transpose()?.map(SessionId),
        detail,
    })
}

fn raw_fire(row: &rusqlite::Row<'_>) -> rusqlite::Result<RawFire> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?, row.get(5)?, row.get(6)?))
}

const FIRE_COLUMNS: &str =
    "schedule_id, scheduled_at_ms, holder, claimed_at_ms, state, session_id, detail";

fn payload_column(payload: Option<&String>) -> Result<Option<String>, SchedulesError> {
    payload.map(|text| serde_json::to_string(text).map_err(SchedulesError::new)).transpose()
}

fn payload_of(column: Option<String>) -> Result<Option<String>, SchedulesError> {
    column
        .map(|json| serde_json::from_str::<String>(&json).map_err(SchedulesError::new))
        .transpose()
}

#[async_trait]
impl Schedules for SqliteStore {
    async fn add_schedule(&self, row: &ScheduleRow) -> Result<(), SchedulesError> {
        let (id, created, paused, spec) =
            (row.id.to_string(), millis(row.created_at), row.paused, row.spec.to_string());
        self.blocking(SchedulesError::new, move |connection| {
            connection
                .execute(
                    "INSERT INTO schedules (id, created_at_ms, paused, spec) VALUES (?1, ?2, ?3, ?4)",
                    params![id, created, paused, spec],
                )
                .map(drop)
                .map_err(backend)
        })
        .await
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, SchedulesError> {
        let rows: Vec<(String, i64, bool, String)> = self
            .blocking(SchedulesError::new, |connection| {
                let mut statement = connection
                    .prepare(
                        "SELECT id, created_at_ms, paused, spec FROM schedules
                         ORDER BY created_at_ms, id",
                    )
                    .map_err(backend)?;
                statement
                    .query_map([], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)))
                    .map_err(backend)?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(backend)
            })
            .await?;
        rows.into_iter()
            .map(|(id, created, paused, spec)| {
                Ok(ScheduleRow {
                    id: uuid_of(&id)?,
                    created_at: from_millis(created)?,
                    paused,
                    spec: serde_json::from_str(&spec).map_err(SchedulesError::new)?,
                })
            })
            .collect()
    }

    async fn set_schedule_paused(&self, id: Uuid, paused: bool) -> Result<bool, SchedulesError> {
        let id = id.to_string();
        self.blocking(SchedulesError::new, move |connection| {
            connection
                .execute("UPDATE schedules SET paused = ?2 WHERE id = ?1", params![id, paused])
                .map(|n| n > 0)
                .map_err(backend)
        })
        .await
    }

    async fn remove_schedule(&self, id: Uuid) -> Result<bool, SchedulesError> {
        let id = id.to_string();
        self.blocking(SchedulesError::new, move |connection| {
            connection
                .execute("DELETE FROM schedules WHERE id = ?1", [id])
                .map(|n| n > 0)
                .map_err(backend)
        })
        .await
    }

    async fn claim_fire(&self, fire: &FireRow) -> Result<bool, SchedulesError> {
        let values = (
            fire.schedule_id.to_string(),
            millis(fire.scheduled_at),
            fire.holder.clone(),
            millis(fire.claimed_at),
            fire.state.as_str(),
            fire.session_id.map(|id| id.to_string()),
            fire.detail.clone(),
        );
        self.blocking(SchedulesError::new, move |connection| {
            let (schedule, at, holder, claimed, state, session, detail) = values;
            connection
                .execute(
                    &format!(
                        "INSERT INTO schedule_fires ({FIRE_COLUMNS})
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
                         ON CONFLICT (schedule_id, scheduled_at_ms) DO NOTHING"
                    ),
                    params![schedule, at, holder, claimed, state, session, detail],
                )
                .map(|n| n == 1)
                .map_err(backend)
        })
        .await
    }

    async fn settle_fire(
        &self,
        schedule_id: Uuid,
        scheduled_at: DateTime<Utc>,
        state: FireState,
        session_id: Option<SessionId>,
        detail: &str,
    ) -> Result<bool, SchedulesError> {
        let values = (
            schedule_id.to_string(),
            millis(scheduled_at),
            state.as_str(),
            session_id.map(|id| id.to_string()),
            detail.to_owned(),
        );
        self.blocking(SchedulesError::new, move |connection| {
            let (schedule, at, state, session, detail) = values;
            connection
                .execute(
                    "UPDATE schedule_fires SET state = ?3, session_id = COALESCE(?4, session_id),
                         detail = ?5
                     WHERE schedule_id = ?1 AND scheduled_at_ms = ?2
                       AND state IN ('claimed', 'buffered')",
                    params![schedule, at, state, session, detail],
                )
                .map(|n| n > 0)
                .map_err(backend)
        })
        .await
    }

    async fn fires(&self, schedule_id: Uuid, limit: u32) -> Result<Vec<FireRow>, SchedulesError> {
        let id = schedule_id.to_string();
        let rows: Vec<RawFire> = self
            .blocking(SchedulesError::new, move |connection| {
                let mut statement = connection
                    .prepare(&format!(
                        "SELECT {FIRE_COLUMNS} FROM schedule_fires WHERE schedule_id = ?1
                         ORDER BY scheduled_at_ms DESC LIMIT ?2"
                    ))
                    .map_err(backend)?;
                statement
                    .query_map(params![id, i64::from(limit)], raw_fire)
                    .map_err(backend)?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(backend)
            })
            .await?;
        rows.into_iter().map(fire_of).collect()
    }

    async fn unsettled_fires(&self) -> Result<Vec<FireRow>, SchedulesError> {
        let rows: Vec<RawFire> = self
            .blocking(SchedulesError::new, |connection| {
                let mut statement = connection
                    .prepare(&format!(
                        "SELECT {FIRE_COLUMNS} FROM schedule_fires
                         WHERE state IN ('claimed', 'buffered') ORDER BY claimed_at_ms"
                    ))
                    .map_err(backend)?;
                statement
                    .query_map([], raw_fire)
                    .map_err(backend)?
                    .collect::<rusqlite::Result<_>>()
                    .map_err(backend)
            })
            .await?;
        rows.into_iter().map(fire_of).collect()
    }

    async fn claim_wake(&self, wake: &WakeRow) -> Result<WakeRow, SchedulesError> {
        let values = (
            wake.wake_id.clone(),
            wake.session_id.to_string(),
            payload_column(wake.payload.as_ref())?,
            wake.by.clone(),
            millis(wake.received_at),
        );
        let wake_id = wake.wake_id.clone();
        self.blocking(SchedulesError::new, move |connection| {
            let (id, session, payload, by, at) = values;
            connection
                .execute(
                    "INSERT INTO wakes (wake_id, session_id, payload, delivered_by, received_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (wake_id) DO NOTHING",
                    params![id, session, payload, by, at],
                )
                .map(drop)
                .map_err(backend)
        })
        .await?;
        self.wake(&wake_id)
            .await?
            .ok_or_else(|| SchedulesError::new("a delivered wake is not in the store"))
    }

    async fn wake(&self, wake_id: &str) -> Result<Option<WakeRow>, SchedulesError> {
        let id = wake_id.to_owned();
        let row: Option<(String, String, Option<String>, String, i64)> = self
            .blocking(SchedulesError::new, move |connection| {
                connection
                    .query_row(
                        "SELECT wake_id, session_id, payload, delivered_by, received_at_ms
                         FROM wakes WHERE wake_id = ?1",
                        [id],
                        |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?, row.get(4)?)),
                    )
                    .optional()
                    .map_err(backend)
            })
            .await?;
        row.map(|(wake_id, session, payload, by, at)| {
            Ok(WakeRow {
                wake_id,
                session_id: SessionId(uuid_of(&session)?),
                payload: payload_of(payload)?,
                by,
                received_at: from_millis(at)?,
            })
        })
        .transpose()
    }
}
