//! [`PgStore`]: the ledger in a PostgreSQL database, shared by several hosts.
//!
//! Durability: each append is one transaction; `COMMIT` returns once PostgreSQL made it
//! durable as the server is configured (with the default `synchronous_commit = on`, after
//! the WAL is flushed).
//!
//! Concurrency: an append first takes a transaction-scoped advisory lock keyed by its
//! session (`pg_advisory_xact_lock`), then reads the session's tail, checks the batch and
//! inserts it. Appends to one session, from any handle in any process on any host, run one
//! after another and never interleave their read-check-insert; a writer that waits for the
//! lock sees the first writer's committed rows (read committed takes a fresh snapshot per
//! statement). Appends to different sessions run in parallel. The primary key
//! `(session_id, seq)` is the backstop. Reads are single statements, so each sees one
//! consistent snapshot.
//!
//! Connections: a pool of at most [`MAX_CONNECTIONS`] per handle, opened on demand. TLS is
//! not supported yet (FIXME(#5)): connect over a Unix socket, loopback or a trusted network;
//! a URL asking for `sslmode=require` fails to connect.
//!
//! Text that comes from users (workspace, model, title) may hold NUL, which PostgreSQL's
//! `text` cannot store; those columns escape NUL reversibly (see
//! [`to_column`](user_text::to_column)), so the listing gives back exactly what `MemStore`
//! and SQLite give back. Event bodies are JSON, where NUL is already escaped.
//!
//! Module map: `connect` (the pool and the first migration), `schema` (tables and
//! migrations), `append` (the append transaction), `reads` (event reads), `summaries` (the
//! `keel.sessions` listing rows), `user_text` (the stored spelling of user text),
//! `leases`, `cancel`, `schedules`.

mod append;
mod cancel;
mod connect;
mod leases;
mod reads;
mod schedules;
mod schema;
mod summaries;
mod user_text;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::Pool;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};

use crate::record::Batch;

/// The schema version this build reads and writes (see
/// [`OpenError::NewerDatabaseSchema`](crate::OpenError::NewerDatabaseSchema)).
pub const PG_SCHEMA_VERSION: i64 = schema::LATEST;

/// Most connections one [`PgStore`] handle opens at once.
pub const MAX_CONNECTIONS: usize = 8;

/// How long opening one connection may take, unless the URL sets `connect_timeout`.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an operation waits for a free pooled connection before failing.
pub const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an append waits for another writer's lock on its session before failing.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);

/// How long an append transaction may sit idle (its client gone quiet) before the server
/// ends it and releases its lock.
pub const IDLE_IN_TRANSACTION_TIMEOUT: Duration = Duration::from_secs(60);

/// A [`Store`] in a PostgreSQL database.
///
/// One handle holds a connection pool; share it with `Arc`. Several handles (in one
/// process or many, on one host or many) may use one database at once: they coordinate
/// through PostgreSQL's locks. Every async method (and [`PgStore::connect`]) needs a tokio
/// runtime with its I/O and time drivers enabled (`enable_all`, as `#[tokio::main]` does):
/// connections are tokio sockets and every wait has a timeout.
pub struct PgStore {
    pool: Pool,
    /// `user@host:port/dbname`, for messages; never the password.
    target: String,
}

impl PgStore {
    /// `user@host:port/dbname` of the database (never the password).
    pub fn target(&self) -> &str {
        &self.target
    }
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore").field("target", &self.target).finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for PgStore {
    /// Appends `events` in one transaction under the session's advisory lock.
    ///
    /// # Errors
    ///
    /// [`AppendError::InvalidBatch`] for mixed sessions, a gap inside the batch or seq 0;
    /// [`AppendError::SeqConflict`] when the first new seq is not the session's last + 1 or
    /// a stored event differs from the one offered at its seq;
    /// [`AppendError::Backend`] with PostgreSQL's message when the server fails, refuses or
    /// cannot be reached, another writer holds the session's lock past [`LOCK_TIMEOUT`], or
    /// no pooled connection frees up within [`POOL_WAIT_TIMEOUT`].
    /// Before `COMMIT` nothing is written. A connection lost *during* `COMMIT` is the one
    /// ambiguous case: the batch may or may not be stored. Retrying the identical batch is
    /// correct either way (a no-op if it was).
    ///
    /// # Cancel safety
    ///
    /// The transaction runs in a task of its own: if the future is dropped, the task still
    /// commits or rolls back, so the batch ends up wholly written or not at all, and the
    /// caller does not learn which. Re-appending the identical batch answers it.
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        let Some(batch) = Batch::prepare(events)? else { return Ok(()) };
        let pool = self.pool.clone();
        let task = tokio::spawn(async move { append::append_batch(&pool, &batch, None).await });
        match task.await {
            Ok(result) => result,
            Err(error) => Err(AppendError::Backend {
                message: format!("ledger task did not finish: {error}"),
            }),
        }
    }

    /// [`Store::append`] fenced by `lease`, checked under the session's advisory lock in
    /// the same transaction.
    ///
    /// # Errors
    ///
    /// As [`PgStore::append`], plus [`AppendError::Fenced`] when a newer lease exists.
    ///
    /// # Cancel safety
    ///
    /// As [`PgStore::append`].
    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &keel_contracts::Lease,
    ) -> Result<(), AppendError> {
        let Some(batch) = Batch::prepare(events)? else { return Ok(()) };
        let pool = self.pool.clone();
        let lease = lease.clone();
        let task =
            tokio::spawn(async move { append::append_batch(&pool, &batch, Some(&lease)).await });
        match task.await {
            Ok(result) => result,
            Err(error) => Err(AppendError::Backend {
                message: format!("ledger task did not finish: {error}"),
            }),
        }
    }

    /// Takes the session's lease (a new, larger fencing token).
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Held`] while another holder's lease has not expired.
    async fn acquire_lease(
        &self,
        session_id: SessionId,
        holder: &str,
        now: chrono::DateTime<chrono::Utc>,
        ttl: Duration,
    ) -> Result<keel_contracts::Lease, keel_contracts::LeaseError> {
        leases::acquire(&self.pool, session_id, holder, now, ttl).await
    }

    /// Extends the lease, keeping its token.
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Lost`] when a newer lease exists.
    async fn renew_lease(
        &self,
        lease: &keel_contracts::Lease,
        now: chrono::DateTime<chrono::Utc>,
        ttl: Duration,
    ) -> Result<keel_contracts::Lease, keel_contracts::LeaseError> {
        leases::renew(&self.pool, lease, now, ttl).await
    }

    /// The session's newest lease, read without taking the session's lock.
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Backend`] when PostgreSQL fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn current_lease(
        &self,
        session_id: SessionId,
    ) -> Result<Option<keel_contracts::Lease>, keel_contracts::LeaseError> {
        leases::read(&self.pool, session_id).await
    }

    /// Lets the lease lapse now (a no-op when a newer one exists).
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Backend`] when PostgreSQL fails.
    async fn release_lease(
        &self,
        lease: &keel_contracts::Lease,
    ) -> Result<(), keel_contracts::LeaseError> {
        leases::release(&self.pool, lease).await
    }

    /// Reads and decodes the events after `after` in one statement (one snapshot),
    /// decoding rows as they stream in.
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] with the lowest seq in range whose body does not decode or
    /// names another seq or session: nothing is skipped and no partial list is returned;
    /// read past it with `after` set to that seq. [`ReadError::Backend`] when the server
    /// fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn read(
        &self,
        session_id: SessionId,
        after: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        reads::read(&self.pool, session_id, after).await
    }

    /// Through the index on `(session_id, kind, seq)`: only the selected records are read.
    ///
    /// # Errors
    ///
    /// As [`PgStore::read`], for the selected records.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn read_kinds(
        &self,
        session_id: SessionId,
        kinds: &[&str],
        up_to: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        reads::read_kinds(&self.pool, session_id, kinds, up_to).await
    }

    /// Through the index on `(session_id, kind, seq)`: one record is read.
    ///
    /// # Errors
    ///
    /// As [`PgStore::read`], for that record.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn last_of_kind(
        &self,
        session_id: SessionId,
        kind: &str,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        reads::last_of_kind(&self.pool, session_id, kind).await
    }

    /// Through the partial index on the results' call ids (`events_by_result_call`): one
    /// record is read.
    ///
    /// # Errors
    ///
    /// As [`PgStore::read`], for that record.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn last_tool_result(
        &self,
        session_id: SessionId,
        call_id: &keel_contracts::ToolCallId,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        reads::last_tool_result(&self.pool, session_id, call_id).await
    }

    /// Every session, newest `created_at` first (ties: larger id first).
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when the server fails or a listing row does not decode.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError> {
        summaries::list(&self.pool).await
    }

    /// One session's listing row, by its primary key.
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when the server fails or the row does not decode.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn session(&self, session_id: SessionId) -> Result<Option<SessionSummary>, ReadError> {
        summaries::one(&self.pool, session_id).await
    }

    /// The one session whose id, without dashes, starts with `prefix` without dashes,
    /// compared case-insensitively: a range scan of the primary key, since a uuid's byte
    /// order is the order of its hex text.
    ///
    /// # Errors
    ///
    /// [`ResolveError::NotFound`] when none matches (also for an empty or non-hex
    /// prefix); [`ResolveError::Ambiguous`] when several do.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn resolve_session(&self, prefix: &str) -> Result<SessionId, ResolveError> {
        summaries::resolve(&self.pool, prefix).await
    }

    /// Records a pending cancel request; a second request before a take is the same one.
    ///
    /// # Errors
    ///
    /// [`AppendError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the request is recorded or not; requesting again is harmless.
    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError> {
        cancel::request(&self.pool, session_id).await
    }

    /// Deletes the session's pending cancel request, returning whether there was one.
    /// One statement, so of two concurrent takers exactly one sees `true`.
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when the server fails.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if dropped after the delete ran, the request is consumed and the
    /// answer lost. Poll it to completion.
    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError> {
        cancel::take(&self.pool, session_id).await
    }
}

/// The advisory lock key of a session: the two halves of its uuid XORed, as a signed
/// 64-bit number. Two sessions may share a key; that only makes their appends wait for
/// each other, never wrong.
pub(super) fn session_lock_key(session_id: SessionId) -> i64 {
    let (high, low) = session_id.0.as_u64_pair();
    i64::from_ne_bytes((high ^ low).to_ne_bytes())
}

/// An error and its sources on one line: tokio-postgres puts the server's message in the
/// source (`db error: ERROR: …`).
fn describe(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn append_backend(error: impl std::error::Error) -> AppendError {
    AppendError::Backend { message: describe(&error) }
}

fn read_backend(error: impl std::error::Error) -> ReadError {
    ReadError::Backend { message: describe(&error) }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;
    use std::str::FromStr;

    use tokio_postgres::Config;
    use uuid::Uuid;

    use super::connect::describe_target;
    use super::user_text::{from_column, to_column};
    use super::*;

    #[test]
    fn user_text_round_trips_through_its_column_spelling() {
        let cases = [
            "",
            "plain",
            "nul \0 inside",
            "\0",
            "escape \u{FFFF} inside",
            "\u{FFFF}0",
            "\0\u{FFFF}\0",
        ];
        for text in cases {
            let stored = to_column(text);
            assert!(!stored.contains('\0'), "{text:?} stored as {stored:?}");
            assert_eq!(from_column(stored.into_owned()).as_deref(), Some(text), "{text:?}");
        }
        assert!(matches!(to_column("plain"), Cow::Borrowed(_)));
        assert_eq!(from_column("dangling \u{FFFF}".to_owned()), None);
        assert_eq!(from_column("unknown \u{FFFF}x".to_owned()), None);
    }

    #[test]
    fn the_target_never_shows_the_password() {
        let config = Config::from_str("postgres://keel:secret@db.internal:6543/ledger").unwrap();
        assert_eq!(describe_target(&config), "keel@db.internal:6543/ledger");
        let config = Config::from_str("host=/run/postgresql dbname=keel").unwrap();
        assert_eq!(describe_target(&config), "/run/postgresql/keel");
    }

    #[test]
    fn lock_keys_differ_for_neighbouring_sessions() {
        let key = |n: u128| session_lock_key(SessionId(Uuid::from_u128(n)));
        assert_ne!(key(1), key(2));
        assert_eq!(key(7), key(7));
    }
}
