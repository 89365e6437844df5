//! Cancel requests (`keel stop`): a row per session with a pending request, taken by one
//! delete.

use deadpool_postgres::Pool;
use keel_contracts::{AppendError, ReadError, SessionId};

use super::{append_backend, read_backend};

/// Records a pending cancel request; a second request before a take is the same one.
pub(super) async fn request(pool: &Pool, session_id: SessionId) -> Result<(), AppendError> {
    let client = pool.get().await.map_err(append_backend)?;
    let insert = client
        .prepare_cached(
            "INSERT INTO keel.cancel_requests (session_id) VALUES ($1)
             ON CONFLICT (session_id) DO NOTHING",
        )
        .await
        .map_err(append_backend)?;
    client.execute(&insert, &[&session_id.0]).await.map(drop).map_err(append_backend)
}

/// Deletes the session's pending cancel request, returning whether there was one.
pub(super) async fn take(pool: &Pool, session_id: SessionId) -> Result<bool, ReadError> {
    let client = pool.get().await.map_err(read_backend)?;
    let delete = client
        .prepare_cached("DELETE FROM keel.cancel_requests WHERE session_id = $1")
        .await
        .map_err(read_backend)?;
    let deleted = client.execute(&delete, &[&session_id.0]).await.map_err(read_backend)?;
    Ok(deleted > 0)
}
