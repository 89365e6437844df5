//! One append inside a group's transaction: its checks (the lease's fence, the stored tail,
//! byte-identical retries), which write nothing, then its inserts and the session's
//! listing row.

use keel_contracts::{AppendError, Seq, SessionSummary};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, params};

use super::{append_backend, leases, summaries};
use crate::record::{Batch, timestamp};
use crate::summary;

/// What an append's checks found: where its new rows start, and the session's stored
/// listing row (`None` for a new session).
pub(super) struct Checked {
    first_new: usize,
    stored: Option<SessionSummary>,
}

/// An append's checks, which write nothing: the lease's fence, the stored tail, and that
/// events at or below it are byte-identical retries. `None` when every event was already
/// stored.
pub(super) fn check_batch(
    tx: &Connection,
    batch: &Batch,
    lease: Option<&keel_contracts::Lease>,
) -> Result<Option<Checked>, AppendError> {
    let session_key = batch.session_id.to_string();
    if let Some(lease) = lease {
        leases::check_fence(tx, lease)?;
    }
    let stored = summaries::load_summary(tx, &session_key)?;
    let last_seq = stored.as_ref().map_or(Seq(0), |summary| summary.last_seq);
    let conflict = |got: Seq| AppendError::SeqConflict {
        session_id: batch.session_id,
        expected: last_seq.next(),
        got,
    };

    // Events at or below the stored tail must be byte-identical retries.
    let mut select = tx
        .prepare_cached("SELECT body FROM events WHERE session_id = ?1 AND seq = ?2")
        .map_err(append_backend)?;
    for (index, row) in batch.rows.iter().enumerate() {
        if row.event.seq > last_seq {
            if row.event.seq != last_seq.next() {
                return Err(conflict(row.event.seq));
            }
            return Ok(Some(Checked { first_new: index, stored }));
        }
        let identical = select
            .query_row(params![session_key, row.seq], |stored| {
                Ok(match stored.get_ref(0)? {
                    ValueRef::Text(bytes) | ValueRef::Blob(bytes) => bytes == row.body.as_bytes(),
                    ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => false,
                })
            })
            .optional()
            .map_err(append_backend)?;
        if identical != Some(true) {
            return Err(conflict(row.event.seq));
        }
    }
    Ok(None)
}

/// Inserts `batch`'s new rows (as [`check_batch`] found them) and updates the session's
/// listing row.
pub(super) fn write_batch(
    tx: &Connection,
    batch: &Batch,
    checked: Checked,
) -> Result<(), AppendError> {
    let session_key = batch.session_id.to_string();
    let new_rows = &batch.rows[checked.first_new..];
    let mut summary = checked
        .stored
        .unwrap_or_else(|| summary::start(new_rows[0].event.session_id, new_rows[0].event.ts));
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO events (session_id, seq, turn_id, run_id, ts, kind, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(append_backend)?;
    for row in new_rows {
        let event = &row.event;
        insert
            .execute(params![
                session_key,
                row.seq,
                event.turn_id.map(|id| id.to_string()),
                event.run_id.map(|id| id.to_string()),
                timestamp(event.ts),
                event.kind,
                row.body,
            ])
            .map_err(append_backend)?;
        summary::apply(&mut summary, event.seq, event.ts, &event.fold);
    }
    summaries::store_summary(tx, &summary)
}
