//! Run leases on SQLite: the `leases` table holds the newest lease per session; tokens
//! only grow, so an append fenced by an older token is refused.

use std::time::Duration;

use crate::record::{lease_expiry, lease_millis, lease_time, token_column, token_of};
use chrono::{DateTime, Utc};
use keel_contracts::{AppendError, Lease, LeaseError, SessionId};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

fn backend(error: rusqlite::Error) -> LeaseError {
    LeaseError::Backend { message: error.to_string() }
}

/// (holder, token, expires_at_ms) of the session's newest lease.
fn current(tx: &Connection, session: &str) -> rusqlite::Result<Option<(String, u64, i64)>> {
    // Cached: every leased append checks its fence with it.
    tx.prepare_cached("SELECT holder, token, expires_at_ms FROM leases WHERE session_id = ?1")?
        .query_row([session], |row| Ok((row.get(0)?, token_of(row.get::<_, i64>(1)?), row.get(2)?)))
        .optional()
}

/// The session's newest lease, read only.
pub(super) fn read(
    connection: &Connection,
    session_id: SessionId,
) -> Result<Option<Lease>, LeaseError> {
    Ok(current(connection, &session_id.to_string()).map_err(backend)?.map(
        |(holder, token, until)| Lease { session_id, holder, token, expires_at: lease_time(until) },
    ))
}

pub(super) fn acquire(
    connection: &mut Connection,
    session_id: SessionId,
    holder: &str,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Lease, LeaseError> {
    let session = session_id.to_string();
    let tx =
        connection.transaction_with_behavior(TransactionBehavior::Immediate).map_err(backend)?;
    let previous = current(&tx, &session).map_err(backend)?;
    if let Some((held_by, _, until)) = &previous
        && held_by != holder
        && *until > lease_millis(now)
    {
        return Err(LeaseError::Held {
            session_id,
            holder: held_by.clone(),
            expires_at: lease_time(*until),
        });
    }
    let token = previous.map_or(0, |(_, token, _)| token) + 1;
    let expires_at = lease_expiry(now, ttl);
    tx.execute(
        "INSERT INTO leases (session_id, holder, token, expires_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (session_id) DO UPDATE SET holder = ?2, token = ?3, expires_at_ms = ?4",
        params![session, holder, token_column(token), lease_millis(expires_at)],
    )
    .map_err(backend)?;
    tx.commit().map_err(backend)?;
    Ok(Lease { session_id, holder: holder.to_owned(), token, expires_at })
}

pub(super) fn renew(
    connection: &mut Connection,
    lease: &Lease,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Lease, LeaseError> {
    let expires_at = lease_expiry(now, ttl);
    let updated = connection
        .execute(
            "UPDATE leases SET expires_at_ms = ?3 WHERE session_id = ?1 AND token = ?2",
            params![
                lease.session_id.to_string(),
                token_column(lease.token),
                lease_millis(expires_at)
            ],
        )
        .map_err(backend)?;
    if updated == 0 {
        return Err(LeaseError::Lost { session_id: lease.session_id, token: lease.token });
    }
    Ok(Lease { expires_at, ..lease.clone() })
}

pub(super) fn release(connection: &mut Connection, lease: &Lease) -> Result<(), LeaseError> {
    // The row (and its token) stays, so fencing stays monotonic; the lease just lapses.
    connection
        .execute(
            "UPDATE leases SET expires_at_ms = ?3 WHERE session_id = ?1 AND token = ?2",
            params![lease.session_id.to_string(), token_column(lease.token), i64::MIN],
        )
        .map(drop)
        .map_err(backend)
}

/// Inside an append transaction: refuse unless `lease` is the session's newest.
pub(super) fn check_fence(tx: &Connection, lease: &Lease) -> Result<(), AppendError> {
    let newest = current(tx, &lease.session_id.to_string())
        .map_err(|error| AppendError::Backend { message: error.to_string() })?
        .map_or(0, |(_, token, _)| token);
    if newest == lease.token {
        Ok(())
    } else {
        Err(AppendError::Fenced {
            session_id: lease.session_id,
            current: newest,
            offered: lease.token,
        })
    }
}
