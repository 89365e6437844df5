//! Reading events: single statements, so each read sees one consistent snapshot; every
//! row selected is decoded, and the first that does not decode fails the read.

use std::pin::pin;

use deadpool_postgres::Pool;
use futures::TryStreamExt;
use keel_contracts::{ReadError, RuntimeEvent, Seq, SessionId};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::read_backend;
use crate::record;

/// The events after `after`, in seq order, streamed.
pub(super) async fn read(
    pool: &Pool,
    session_id: SessionId,
    after: Seq,
) -> Result<Vec<RuntimeEvent>, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(
            "SELECT seq, body FROM keel.events
             WHERE session_id = $1 AND seq > $2 ORDER BY seq",
        )
        .await
        .map_err(read_backend)?;
    let after = i64::try_from(after.0).unwrap_or(i64::MAX);
    let params: [&(dyn ToSql + Sync); 2] = [&session_id.0, &after];
    let mut rows = pin!(client.query_raw(&select, params).await.map_err(read_backend)?);
    let mut events = Vec::new();
    while let Some(row) = rows.try_next().await.map_err(read_backend)? {
        let raw_seq: i64 = row.try_get(0).map_err(read_backend)?;
        let seq = Seq(u64::try_from(raw_seq).map_err(|_| ReadError::Backend {
            message: format!("negative seq {raw_seq} in session {session_id}"),
        })?);
        let body: &str = row.try_get(1).map_err(read_backend)?;
        events.push(record::decode(session_id, seq, body.as_bytes())?);
    }
    Ok(events)
}

/// The events of `kinds` at or below `up_to`, in seq order.
pub(super) async fn read_kinds(
    pool: &Pool,
    session_id: SessionId,
    kinds: &[&str],
    up_to: Seq,
) -> Result<Vec<RuntimeEvent>, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(
            "SELECT seq, body FROM keel.events
             WHERE session_id = $1 AND seq <= $2 AND kind = ANY($3) ORDER BY seq",
        )
        .await
        .map_err(read_backend)?;
    let up_to = i64::try_from(up_to.0).unwrap_or(i64::MAX);
    let kinds: Vec<&str> = kinds.to_vec();
    let rows =
        client.query(&select, &[&session_id.0, &up_to, &kinds]).await.map_err(read_backend)?;
    rows.iter().map(|row| decode_event(session_id, row)).collect()
}

/// The latest event of `kind`.
pub(super) async fn last_of_kind(
    pool: &Pool,
    session_id: SessionId,
    kind: &str,
) -> Result<Option<RuntimeEvent>, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(
            "SELECT seq, body FROM keel.events
             WHERE session_id = $1 AND kind = $2 ORDER BY seq DESC LIMIT 1",
        )
        .await
        .map_err(read_backend)?;
    let row = client.query_opt(&select, &[&session_id.0, &kind]).await.map_err(read_backend)?;
    row.map(|row| decode_event(session_id, &row)).transpose()
}

/// The latest `tool_result` of the call `call_id`, by its `call_id` column.
pub(super) async fn last_tool_result(
    pool: &Pool,
    session_id: SessionId,
    call_id: &keel_contracts::ToolCallId,
) -> Result<Option<RuntimeEvent>, ReadError> {
    let key = record::result_call_key(call_id);
    let client = pool.get().await.map_err(read_backend)?;
    let select = client
        .prepare_cached(
            "SELECT seq, body FROM keel.events
             WHERE session_id = $1 AND call_id = $2 ORDER BY seq DESC LIMIT 1",
        )
        .await
        .map_err(read_backend)?;
    let row = client.query_opt(&select, &[&session_id.0, &key]).await.map_err(read_backend)?;
    row.map(|row| decode_event(session_id, &row)).transpose()
}

/// Decodes an event row selected as `seq, body`.
/// Decodes a `seq, body` row of `session_id`'s events.
fn decode_event(session_id: SessionId, row: &Row) -> Result<RuntimeEvent, ReadError> {
    let raw_seq: i64 = row.try_get(0).map_err(read_backend)?;
    let seq = Seq(u64::try_from(raw_seq).map_err(|_| ReadError::Backend {
        message: format!("negative seq {raw_seq} in session {session_id}"),
    })?);
    let body: &str = row.try_get(1).map_err(read_backend)?;
    record::decode(session_id, seq, body.as_bytes())
}
