//! [`Schedules`] on PostgreSQL: `keel.schedules`, `keel.schedule_fires` and `keel.wakes`.
//! A claim is `INSERT … ON CONFLICT DO NOTHING` on the primary key, so hosts sharing the
//! database claim each slot once (the key's unique index decides between concurrent
//! inserts).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::SessionId;
use tokio_postgres::Row;
use uuid::Uuid;

use super::PgStore;
use crate::schedules::{
    FireRow, FireState, ScheduleRow, Schedules, SchedulesError, WakeRow, from_millis, millis,
    state_of,
};

/// `text` cannot hold NUL: replaced (details and holders are messages, not data).
fn text(value: &str) -> String {
    value.replace('\0', "\u{fffd}")
}

const FIRE_COLUMNS: &str =
    "schedule_id, scheduled_at_ms, holder, claimed_at_ms, state, session_id, detail";

fn fire_of(row: &Row) -> Result<FireRow, SchedulesError> {
    let state: String = row.try_get(4).map_err(SchedulesError::new)?;
    let session: Option<Uuid> = row.try_get(5).map_err(SchedulesError::new)?;
    Ok(FireRow {
        schedule_id: row.try_get(0).map_err(SchedulesError::new)?,
        scheduled_at: from_millis(row.try_get(1).map_err(SchedulesError::new)?)?,
        holder: row.try_get(2).map_err(SchedulesError::new)?,
        claimed_at: from_millis(row.try_get(3).map_err(SchedulesError::new)?)?,
        state: state_of(&state)?,
        session_id: session.map(SessionId),
        detail: row.try_get(6).map_err(SchedulesError::new)?,
    })
}

impl PgStore {
    async fn schedules_client(&self) -> Result<deadpool_postgres::Object, SchedulesError> {
        self.pool.get().await.map_err(SchedulesError::new)
    }
}

#[async_trait]
impl Schedules for PgStore {
    async fn add_schedule(&self, row: &ScheduleRow) -> Result<(), SchedulesError> {
        let client = self.schedules_client().await?;
        client
            .execute(
                "INSERT INTO keel.schedules (id, created_at_ms, paused, spec)
                 VALUES ($1, $2, $3, $4)",
                &[&row.id, &millis(row.created_at), &row.paused, &row.spec.to_string()],
            )
            .await
            .map(drop)
            .map_err(SchedulesError::new)
    }

    async fn schedules(&self) -> Result<Vec<ScheduleRow>, SchedulesError> {
        let client = self.schedules_client().await?;
        let rows = client
            .query(
                "SELECT id, created_at_ms, paused, spec FROM keel.schedules
                 ORDER BY created_at_ms, id",
                &[],
            )
            .await
            .map_err(SchedulesError::new)?;
        rows.iter()
            .map(|row| {
                let spec: String = row.try_get(3).map_err(SchedulesError::new)?;
                Ok(ScheduleRow {
                    id: row.try_get(0).map_err(SchedulesError::new)?,
                    created_at: from_millis(row.try_get(1).map_err(SchedulesError::new)?)?,
                    paused: row.try_get(2).map_err(SchedulesError::new)?,
                    spec: serde_json::from_str(&spec).map_err(SchedulesError::new)?,
                })
            })
            .collect()
    }

    async fn set_schedule_paused(&self, id: Uuid, paused: bool) -> Result<bool, SchedulesError> {
        let client = self.schedules_client().await?;
        client
            .execute("UPDATE keel.schedules SET paused = $2 WHERE id = $1", &[&id, &paused])
            .await
            .map(|n| n > 0)
            .map_err(SchedulesError::new)
    }

    async fn remove_schedule(&self, id: Uuid) -> Result<bool, SchedulesError> {
        let client = self.schedules_client().await?;
        client
            .execute("DELETE FROM keel.schedules WHERE id = $1", &[&id])
            .await
            .map(|n| n > 0)
            .map_err(SchedulesError::new)
    }

    async fn claim_fire(&self, fire: &FireRow) -> Result<bool, SchedulesError> {
        let client = self.schedules_client().await?;
        let session = fire.session_id.map(|id| id.0);
        client
            .execute(
                &format!(
                    "INSERT INTO keel.schedule_fires ({FIRE_COLUMNS})
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (schedule_id, scheduled_at_ms) DO NOTHING"
                ),
                &[
                    &fire.schedule_id,
                    &millis(fire.scheduled_at),
                    &text(&fire.holder),
                    &millis(fire.claimed_at),
                    &fire.state.as_str(),
                    &session,
                    &text(&fire.detail),
                ],
            )
            .await
            .map(|n| n == 1)
            .map_err(SchedulesError::new)
    }

    async fn settle_fire(
        &self,
        schedule_id: Uuid,
        scheduled_at: DateTime<Utc>,
        state: FireState,
        session_id: Option<SessionId>,
        detail: &str,
    ) -> Result<bool, SchedulesError> {
        let client = self.schedules_client().await?;
        let session = session_id.map(|id| id.0);
        client
            .execute(
                "UPDATE keel.schedule_fires
                 SET state = $3, session_id = COALESCE($4, session_id), detail = $5
                 WHERE schedule_id = $1 AND scheduled_at_ms = $2
                   AND state IN ('claimed', 'buffered')",
                &[&schedule_id, &millis(scheduled_at), &state.as_str(), &session, &text(detail)],
            )
            .await
            .map(|n| n > 0)
            .map_err(SchedulesError::new)
    }

    async fn fires(&self, schedule_id: Uuid, limit: u32) -> Result<Vec<FireRow>, SchedulesError> {
        let client = self.schedules_client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {FIRE_COLUMNS} FROM keel.schedule_fires WHERE schedule_id = $1
                     ORDER BY scheduled_at_ms DESC LIMIT $2"
                ),
                &[&schedule_id, &i64::from(limit)],
            )
            .await
            .map_err(SchedulesError::new)?;
        rows.iter().map(fire_of).collect()
    }

    async fn unsettled_fires(&self) -> Result<Vec<FireRow>, SchedulesError> {
        let client = self.schedules_client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT {FIRE_COLUMNS} FROM keel.schedule_fires
                     WHERE state IN ('claimed', 'buffered') ORDER BY claimed_at_ms"
                ),
                &[],
            )
            .await
            .map_err(SchedulesError::new)?;
        rows.iter().map(fire_of).collect()
    }

    async fn claim_wake(&self, wake: &WakeRow) -> Result<WakeRow, SchedulesError> {
        let client = self.schedules_client().await?;
        let payload = wake
            .payload
            .as_ref()
            .map(|payload| serde_json::to_string(payload).map_err(SchedulesError::new))
            .transpose()?;
        client
            .execute(
                "INSERT INTO keel.wakes (wake_id, session_id, payload, delivered_by, received_at_ms)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (wake_id) DO NOTHING",
                &[
                    &text(&wake.wake_id),
                    &wake.session_id.0,
                    &payload,
                    &text(&wake.by),
                    &millis(wake.received_at),
                ],
            )
            .await
            .map_err(SchedulesError::new)?;
        drop(client);
        self.wake(&wake.wake_id)
            .await?
            .ok_or_else(|| SchedulesError::new("a delivered wake is not in the store"))
    }

    async fn wake(&self, wake_id: &str) -> Result<Option<WakeRow>, SchedulesError> {
        let client = self.schedules_client().await?;
        let row = client
            .query_opt(
                "SELECT wake_id, session_id, payload, delivered_by, received_at_ms
                 FROM keel.wakes WHERE wake_id = $1",
                &[&text(wake_id)],
            )
            .await
            .map_err(SchedulesError::new)?;
        row.map(|row| {
            let payload: Option<String> = row.try_get(2).map_err(SchedulesError::new)?;
            Ok(WakeRow {
                wake_id: row.try_get(0).map_err(SchedulesError::new)?,
                session_id: SessionId(row.try_get(1).map_err(SchedulesError::new)?),
                payload: payload
                    .map(|json| serde_json::from_str::<String>(&json).map_err(SchedulesError::new))
                    .transpose()?,
                by: row.try_get(3).map_err(SchedulesError::new)?,
                received_at: from_millis(row.try_get(4).map_err(SchedulesError::new)?)?,
            })
        })
        .transpose()
    }
}
