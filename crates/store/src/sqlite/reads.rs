//! Reading events: where a read runs (a read connection of a file ledger, never waiting
//! for the writer), and the queries, each decoding every row it selects.

use keel_contracts::{ReadError, RuntimeEvent, Seq, SessionId};
use rusqlite::Connection;
use rusqlite::types::ValueRef;

use super::{SqliteStore, read_backend_sqlite, schema};
use crate::record;

impl SqliteStore {
    /// Runs the read-only `op` on a read connection of a file ledger (never waiting for the
    /// writer), or on the one connection of an in-memory ledger.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the answer; the read still runs.
    pub(super) async fn reading<T, E>(
        &self,
        task_failed: fn(String) -> E,
        op: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        match &self.readers {
            Some(readers) => {
                readers
                    .run(
                        move |connection| match connection {
                            Ok(connection) => op(connection),
                            Err(message) => Err(task_failed(message)),
                        },
                        || Err(task_failed("the ledger reader stopped unexpectedly".to_owned())),
                    )
                    .await
            }
            None => self.blocking(task_failed, op).await,
        }
    }
}

/// The events after `after`, in seq order.
pub(super) fn read_events(
    connection: &mut Connection,
    session_id: SessionId,
    after: Seq,
) -> Result<Vec<RuntimeEvent>, ReadError> {
    let after = i64::try_from(after.0).unwrap_or(i64::MAX);
    select_events(
        connection,
        session_id,
        "SELECT seq, body FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq",
        &[&session_id.to_string(), &after],
    )
}

/// The events of `kinds` at or below `up_to`: through the partial kind index when every
/// kind is one it holds ([`schema::INDEXED_KINDS`]).
pub(super) fn read_kinds(
    connection: &mut Connection,
    session_id: SessionId,
    kinds: &[String],
    up_to: Seq,
) -> Result<Vec<RuntimeEvent>, ReadError> {
    if kinds.is_empty() {
        return Ok(Vec::new());
    }
    let up_to = i64::try_from(up_to.0).unwrap_or(i64::MAX);
    let placeholders: Vec<String> = (0..kinds.len()).map(|i| format!("?{}", i + 3)).collect();
    let indexed = kinds.iter().all(|kind| schema::INDEXED_KINDS.contains(&kind.as_str()));
    let sql = if indexed {
        format!(
            "SELECT seq, body FROM events INDEXED BY events_by_fact_kind
             WHERE session_id = ?1 AND seq <= ?2 AND kind IN ({}) AND {} ORDER BY seq",
            placeholders.join(", "),
            schema::INDEXED_KINDS_TERM
        )
    } else {
        format!(
            "SELECT seq, body FROM events
             WHERE session_id = ?1 AND seq <= ?2 AND kind IN ({}) ORDER BY seq",
            placeholders.join(", ")
        )
    };
    let session_key = session_id.to_string();
    let mut params: Vec<&dyn rusqlite::ToSql> = vec![&session_key, &up_to];
    params.extend(kinds.iter().map(|kind| kind as &dyn rusqlite::ToSql));
    select_events(connection, session_id, &sql, &params)
}

/// The latest event of `kind`: through the partial index on `(session_id, kind, seq)` for a
/// fact or compaction kind ([`schema::INDEXED_KINDS`]), else by scanning the session's
/// events.
pub(super) fn last_of_kind(
    connection: &mut Connection,
    session_id: SessionId,
    kind: &str,
) -> Result<Option<RuntimeEvent>, ReadError> {
    let sql = if schema::INDEXED_KINDS.contains(&kind) {
        format!(
            "SELECT seq, body FROM events INDEXED BY events_by_fact_kind
             WHERE session_id = ?1 AND kind = ?2 AND {}
             ORDER BY seq DESC LIMIT 1",
            schema::INDEXED_KINDS_TERM
        )
    } else {
        "SELECT seq, body FROM events
         WHERE session_id = ?1 AND kind = ?2 ORDER BY seq DESC LIMIT 1"
            .to_owned()
    };
    select_events(connection, session_id, &sql, &[&session_id.to_string(), &kind])
        .map(|mut events| events.pop())
}

/// The latest `tool_result` of the call `call_id`, through the partial index on the
/// results' call ids (`events_by_result_call`).
pub(super) fn last_tool_result(
    connection: &mut Connection,
    session_id: SessionId,
    call_id: &str,
) -> Result<Option<RuntimeEvent>, ReadError> {
    let sql = format!(
        "SELECT seq, body FROM events INDEXED BY events_by_result_call
         WHERE session_id = ?1 AND kind = 'tool_result' AND {} = ?2
         ORDER BY seq DESC LIMIT 1",
        schema::RESULT_CALL_ID
    );
    select_events(connection, session_id, &sql, &[&session_id.to_string(), &call_id])
        .map(|mut events| events.pop())
}

/// Runs `sql` (selecting `seq, body` of `session_id`'s events) and decodes every row, in
/// the order selected; the first undecodable one fails the read.
fn select_events(
    connection: &mut Connection,
    session_id: SessionId,
    sql: &str,
    params: &[&dyn rusqlite::ToSql],
) -> Result<Vec<RuntimeEvent>, ReadError> {
    let mut select = connection.prepare_cached(sql).map_err(read_backend_sqlite)?;
    let mut rows = select.query(params).map_err(read_backend_sqlite)?;
    let mut events = Vec::new();
    while let Some(row) = rows.next().map_err(read_backend_sqlite)? {
        let raw_seq: i64 = row.get(0).map_err(read_backend_sqlite)?;
        let seq = Seq(u64::try_from(raw_seq).map_err(|_| ReadError::Backend {
            message: format!("negative seq {raw_seq} in session {session_id}"),
        })?);
        let event = match row.get_ref(1).map_err(read_backend_sqlite)? {
            ValueRef::Text(bytes) | ValueRef::Blob(bytes) => {
                record::decode(session_id, seq, bytes)?
            }
            other @ (ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_)) => {
                return Err(ReadError::Corrupt {
                    session_id,
                    seq,
                    message: format!("body is {}, not JSON text", other.data_type()),
                });
            }
        };
        events.push(event);
    }
    Ok(events)
}
