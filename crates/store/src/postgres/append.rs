//! The append transaction: the session's advisory lock (bounded waits), the lease's fence,
//! the stored tail and byte-identical retries, then one insert of the new rows and the
//! session's listing row.

use deadpool_postgres::Pool;
use keel_contracts::{AppendError, Seq};

use super::summaries::{load_summary, store_summary};
use super::{IDLE_IN_TRANSACTION_TIMEOUT, LOCK_TIMEOUT, append_backend, leases, session_lock_key};
use crate::record::{Batch, timestamp};
use crate::summary;

/// The append transaction: lock the session, check the stored tail, insert what is new,
/// update the listing.
pub(super) async fn append_batch(
    pool: &Pool,
    batch: &Batch,
    lease: Option<&keel_contracts::Lease>,
) -> Result<(), AppendError> {
    let mut client = pool.get().await.map_err(append_backend)?;
    let tx = client.transaction().await.map_err(append_backend)?;
    let session = batch.session_id.0;
    // One round trip: bound the wait for the lock and the time this transaction may sit
    // idle holding it (a writer cut off mid-append must not block the session for the
    // hours TCP takes to notice), then take it.
    tx.batch_execute(&format!(
        "SET LOCAL lock_timeout = {lock_ms};
         SET LOCAL idle_in_transaction_session_timeout = {idle_ms};
         SELECT pg_advisory_xact_lock({key});",
        lock_ms = LOCK_TIMEOUT.as_millis(),
        idle_ms = IDLE_IN_TRANSACTION_TIMEOUT.as_millis(),
        key = session_lock_key(batch.session_id),
    ))
    .await
    .map_err(append_backend)?;
    if let Some(lease) = lease {
        leases::check_fence(&tx, lease).await?;
    }

    let stored = load_summary(&tx, session).await?;
    let last_seq = stored.as_ref().map_or(Seq(0), |summary| summary.last_seq);
    let conflict = |got: Seq| AppendError::SeqConflict {
        session_id: batch.session_id,
        expected: last_seq.next(),
        got,
    };

    // Events at or below the stored tail must be byte-identical retries.
    let n_stored = batch.rows.iter().take_while(|row| row.event.seq <= last_seq).count();
    let (retried, new_rows) = batch.rows.split_at(n_stored);
    if let (Some(first), Some(last)) = (retried.first(), retried.last()) {
        let select = tx
            .prepare_cached(
                "SELECT seq, body FROM keel.events
                 WHERE session_id = $1 AND seq BETWEEN $2 AND $3 ORDER BY seq",
            )
            .await
            .map_err(append_backend)?;
        let rows =
            tx.query(&select, &[&session, &first.seq, &last.seq]).await.map_err(append_backend)?;
        let mut stored_rows = rows.iter();
        for row in retried {
            let identical = match stored_rows.next() {
                Some(stored) => {
                    let seq: i64 = stored.try_get(0).map_err(append_backend)?;
                    let body: &str = stored.try_get(1).map_err(append_backend)?;
                    seq == row.seq && body == row.body
                }
                None => false,
            };
            if !identical {
                return Err(conflict(row.event.seq));
            }
        }
    }
    // Everything was already stored: nothing to write.
    let Some(first_new) = new_rows.first() else {
        return tx.rollback().await.map_err(append_backend);
    };
    if first_new.event.seq != last_seq.next() {
        return Err(conflict(first_new.event.seq));
    }

    let mut summary =
        stored.unwrap_or_else(|| summary::start(first_new.event.session_id, first_new.event.ts));
    let mut seqs = Vec::with_capacity(new_rows.len());
    let mut turn_ids = Vec::with_capacity(new_rows.len());
    let mut run_ids = Vec::with_capacity(new_rows.len());
    let mut timestamps = Vec::with_capacity(new_rows.len());
    let mut kinds = Vec::with_capacity(new_rows.len());
    let mut bodies = Vec::with_capacity(new_rows.len());
    let mut call_ids = Vec::with_capacity(new_rows.len());
    for row in new_rows {
        let event = &row.event;
        seqs.push(row.seq);
        turn_ids.push(event.turn_id.map(|id| id.0));
        run_ids.push(event.run_id.map(|id| id.0));
        timestamps.push(timestamp(event.ts));
        kinds.push(event.kind);
        bodies.push(row.body.as_str());
        call_ids.push(event.result_call_key.as_deref());
        summary::apply(&mut summary, event.seq, event.ts, &event.fold);
    }
    let insert = tx
        .prepare_cached(
            "INSERT INTO keel.events (session_id, seq, turn_id, run_id, ts, kind, body, call_id)
             SELECT $1, new.seq, new.turn_id, new.run_id, new.ts, new.kind, new.body, new.call_id
             FROM unnest($2::bigint[], $3::uuid[], $4::uuid[], $5::text[], $6::text[], $7::text[],
                         $8::text[])
                 AS new (seq, turn_id, run_id, ts, kind, body, call_id)",
        )
        .await
        .map_err(append_backend)?;
    tx.execute(
        &insert,
        &[&session, &seqs, &turn_ids, &run_ids, &timestamps, &kinds, &bodies, &call_ids],
    )
    .await
    .map_err(append_backend)?;
    store_summary(&tx, &summary).await?;
    tx.commit().await.map_err(append_backend)
}
