//! Cancel requests (`keel stop`): a row per session with a pending request, taken by one
//! delete; and the probe that answers a polling run "none pending" from a recent look at
//! the table, on a read connection, instead of a write per poll.

use std::sync::PoisonError;
use std::time::Duration;

use keel_contracts::{AppendError, ReadError, SessionId};
use rusqlite::Connection;

use super::{SqliteStore, append_backend, read_backend, read_backend_sqlite};
use crate::record::parse_session_id;

/// How long a look at the pending cancel requests stands in for the table: a session not
/// among them is answered "none pending" without I/O until it is this old. Requests made
/// through this handle are seen at once; ones made by another process within this time.
pub const CANCEL_PROBE_TTL: Duration = Duration::from_millis(100);

/// The sessions with a pending cancel request, as last read, and when.
#[derive(Default)]
pub(super) struct CancelProbe {
    /// Bumped by every [`SqliteStore::request_cancel`](keel_contracts::Store::request_cancel)
    /// of this handle: a look begun before one is not kept.
    generation: u64,
    seen: Option<(std::time::Instant, std::collections::HashSet<SessionId>)>,
}

impl SqliteStore {
    /// Whether `session_id` may have a pending cancel request: `false` when a look at the
    /// table younger than [`CANCEL_PROBE_TTL`] (and no newer request of this handle) does
    /// not list it; otherwise looks again, on a read connection.
    pub(super) async fn cancel_may_be_pending(
        &self,
        session_id: SessionId,
    ) -> Result<bool, ReadError> {
        if self.readers.is_none() {
            return Ok(true);
        }
        let generation = {
            let probe = self.cancel_probe.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((at, pending)) = &probe.seen
                && at.elapsed() < CANCEL_PROBE_TTL
            {
                return Ok(pending.contains(&session_id));
            }
            probe.generation
        };
        let started = std::time::Instant::now();
        let pending = self.reading(read_backend, pending_cancels).await?;
        let may_be = pending.contains(&session_id);
        let mut probe = self.cancel_probe.lock().unwrap_or_else(PoisonError::into_inner);
        if probe.generation == generation {
            probe.seen = Some((started, pending));
        }
        Ok(may_be)
    }

    /// Forgets the last look at the cancel requests (one was just made or taken here).
    pub(super) fn cancel_requests_changed(&self) {
        let mut probe = self.cancel_probe.lock().unwrap_or_else(PoisonError::into_inner);
        probe.generation = probe.generation.wrapping_add(1);
        probe.seen = None;
    }
}

/// Records a pending cancel request; a second request before a take is the same one.
pub(super) fn insert_request(
    connection: &mut Connection,
    session_id: SessionId,
) -> Result<(), AppendError> {
    connection
        .prepare_cached(
            "INSERT INTO cancel_requests (session_id, requested_at)
             VALUES (?1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
             ON CONFLICT (session_id) DO NOTHING",
        )
        .and_then(|mut insert| insert.execute([session_id.to_string()]))
        .map(drop)
        .map_err(append_backend)
}

/// Deletes the session's pending cancel request, returning whether there was one. One
/// statement, so of two concurrent takers exactly one sees `true`.
pub(super) fn delete_request(
    connection: &mut Connection,
    session_id: SessionId,
) -> Result<bool, ReadError> {
    connection
        .prepare_cached("DELETE FROM cancel_requests WHERE session_id = ?1")
        .and_then(|mut delete| delete.execute([session_id.to_string()]))
        .map(|deleted| deleted > 0)
        .map_err(read_backend_sqlite)
}

/// The sessions with a pending cancel request (rows whose id does not parse are skipped:
/// no session has them).
fn pending_cancels(
    connection: &mut Connection,
) -> Result<std::collections::HashSet<SessionId>, ReadError> {
    let mut select = connection
        .prepare_cached("SELECT session_id FROM cancel_requests")
        .map_err(read_backend_sqlite)?;
    let ids = select.query_map([], |row| row.get::<_, String>(0)).map_err(read_backend_sqlite)?;
    let mut pending = std::collections::HashSet::new();
    for id in ids {
        if let Ok(id) = parse_session_id(&id.map_err(read_backend_sqlite)?) {
            pending.insert(id);
        }
    }
    Ok(pending)
}
