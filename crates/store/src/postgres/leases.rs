//! Run leases on PostgreSQL: `keel.leases` holds the newest lease per session, changed
//! under the session's transaction-scoped advisory lock (the same one appends take), so
//! the fence check and the append are serialized with every takeover.

use std::time::Duration;

use crate::record::{lease_expiry, lease_millis, lease_time, token_column, token_of};
use chrono::{DateTime, Utc};
use deadpool_postgres::{Pool, Transaction};
use keel_contracts::{AppendError, Lease, LeaseError, SessionId};

use super::session_lock_key;

fn backend(error: impl std::fmt::Display) -> LeaseError {
    LeaseError::Backend { message: error.to_string() }
}

async fn lock(tx: &Transaction<'_>, session_id: SessionId) -> Result<(), tokio_postgres::Error> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&session_lock_key(session_id)]).await.map(drop)
}

async fn current(
    tx: &Transaction<'_>,
    session_id: SessionId,
) -> Result<Option<(String, u64, i64)>, tokio_postgres::Error> {
    let row = tx
        .query_opt(
            "SELECT holder, token, expires_at_ms FROM keel.leases WHERE session_id = $1",
            &[&session_id.0],
        )
        .await?;
    Ok(row.map(|row| (row.get(0), token_of(row.get(1)), row.get(2))))
}

/// The session's newest lease, read without a lock (a snapshot of the row).
pub(super) async fn read(pool: &Pool, session_id: SessionId) -> Result<Option<Lease>, LeaseError> {
    let client = pool.get().await.map_err(backend)?;
    let row = client
        .query_opt(
            "SELECT holder, token, expires_at_ms FROM keel.leases WHERE session_id = $1",
            &[&session_id.0],
        )
        .await
        .map_err(backend)?;
    Ok(row.map(|row| Lease {
        session_id,
        holder: row.get(0),
        token: token_of(row.get(1)),
        expires_at: lease_time(row.get(2)),
    }))
}

pub(super) async fn acquire(
    pool: &Pool,
    session_id: SessionId,
    holder: &str,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Lease, LeaseError> {
    let mut client = pool.get().await.map_err(backend)?;
    let tx = client.transaction().await.map_err(backend)?;
    lock(&tx, session_id).await.map_err(backend)?;
    let previous = current(&tx, session_id).await.map_err(backend)?;
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
        "INSERT INTO keel.leases (session_id, holder, token, expires_at_ms) VALUES ($1, $2, $3, $4)
         ON CONFLICT (session_id) DO UPDATE SET holder = $2, token = $3, expires_at_ms = $4",
        &[&session_id.0, &holder, &token_column(token), &lease_millis(expires_at)],
    )
    .await
    .map_err(backend)?;
    tx.commit().await.map_err(backend)?;
    Ok(Lease { session_id, holder: holder.to_owned(), token, expires_at })
}

pub(super) async fn renew(
    pool: &Pool,
    lease: &Lease,
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<Lease, LeaseError> {
    let client = pool.get().await.map_err(backend)?;
    let expires_at = lease_expiry(now, ttl);
    let updated = client
        .execute(
            "UPDATE keel.leases SET expires_at_ms = $3 WHERE session_id = $1 AND token = $2",
            &[&lease.session_id.0, &token_column(lease.token), &lease_millis(expires_at)],
        )
        .await
        .map_err(backend)?;
    if updated == 0 {
        return Err(LeaseError::Lost { session_id: lease.session_id, token: lease.token });
    }
    Ok(Lease { expires_at, ..lease.clone() })
}

pub(super) async fn release(pool: &Pool, lease: &Lease) -> Result<(), LeaseError> {
    let client = pool.get().await.map_err(backend)?;
    client
        .execute(
            "UPDATE keel.leases SET expires_at_ms = $3 WHERE session_id = $1 AND token = $2",
            &[&lease.session_id.0, &token_column(lease.token), &i64::MIN],
        )
        .await
        .map(drop)
        .map_err(backend)
}

/// Inside an append transaction that holds the session's advisory lock: refuse unless
/// `lease` is the session's newest.
pub(super) async fn check_fence(tx: &Transaction<'_>, lease: &Lease) -> Result<(), AppendError> {
    let newest = current(tx, lease.session_id)
        .await
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
