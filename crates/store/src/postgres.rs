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
//! `text` cannot store; those columns escape NUL reversibly (see [`to_column`]), so the
//! listing gives back exactly what `MemStore` and SQLite give back. Event bodies are JSON,
//! where NUL is already escaped.

mod leases;
mod schedules;
mod schema;

use std::borrow::Cow;
use std::fmt;
use std::pin::pin;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{Manager, Pool, Runtime, Transaction};
use futures::TryStreamExt;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Config, NoTls, Row};
use uuid::Uuid;

use crate::error::OpenError;
use crate::record::{self, Batch, normalize_prefix, parse_timestamp, timestamp};
use crate::summary;

/// The schema version this build reads and writes (see [`OpenError::NewerDatabaseSchema`]).
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
    /// Connects to the database at `url` (`postgres://user:password@host:port/dbname`, or
    /// libpq's `key=value` form) and migrates its `keel` schema to [`PG_SCHEMA_VERSION`].
    ///
    /// # Errors
    ///
    /// [`OpenError::DatabaseUrl`] when `url` does not parse; [`OpenError::Postgres`] when
    /// the server cannot be reached or refuses (authentication, missing database,
    /// permissions); [`OpenError::NewerDatabaseSchema`] when a newer keel migrated it.
    ///
    /// # Cancel safety
    ///
    /// If dropped, a migration in flight is rolled back by the server or committed whole.
    pub async fn connect(url: &str) -> Result<PgStore, OpenError> {
        let mut config = Config::from_str(url)
            .map_err(|source| OpenError::DatabaseUrl { source: Box::new(source) })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("keel");
        }
        let target = describe_target(&config);
        let postgres_error = |source: Box<dyn std::error::Error + Send + Sync>| {
            OpenError::Postgres { target: target.clone(), source }
        };
        let pool = Pool::builder(Manager::new(config, NoTls))
            .max_size(MAX_CONNECTIONS)
            .runtime(Runtime::Tokio1)
            .create_timeout(Some(CONNECT_TIMEOUT))
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .build()
            .map_err(|error| postgres_error(Box::new(error)))?;
        let mut client = pool.get().await.map_err(|error| postgres_error(Box::new(error)))?;
        match schema::migrate(&mut client).await.map_err(|error| postgres_error(Box::new(error)))? {
            schema::Migration::Current => {}
            schema::Migration::Newer(found) => {
                return Err(OpenError::NewerDatabaseSchema {
                    target,
                    found,
                    supported: PG_SCHEMA_VERSION,
                });
            }
        }
        drop(client);
        Ok(PgStore { pool, target })
    }

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
        let task = tokio::spawn(async move { append_batch(&pool, &batch, None).await });
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
        let task = tokio::spawn(async move { append_batch(&pool, &batch, Some(&lease)).await });
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
        let client = self.pool.get().await.map_err(read_backend)?;
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
        let client = self.pool.get().await.map_err(read_backend)?;
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
        let client = self.pool.get().await.map_err(read_backend)?;
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
        let key = record::result_call_key(call_id);
        let client = self.pool.get().await.map_err(read_backend)?;
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
        let client = self.pool.get().await.map_err(read_backend)?;
        let select = client
            .prepare_cached(&format!(
                "SELECT {SUMMARY_COLUMNS} FROM keel.sessions ORDER BY created_at DESC, id DESC"
            ))
            .await
            .map_err(read_backend)?;
        let rows = client.query(&select, &[]).await.map_err(read_backend)?;
        rows.iter()
            .map(|row| decode_summary(row).map_err(|message| ReadError::Backend { message }))
            .collect()
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
        let client = self.pool.get().await.map_err(read_backend)?;
        let select = client
            .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM keel.sessions WHERE id = $1"))
            .await
            .map_err(read_backend)?;
        let row = client.query_opt(&select, &[&session_id.0]).await.map_err(read_backend)?;
        row.map(|row| decode_summary(&row).map_err(|message| ReadError::Backend { message }))
            .transpose()
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
        let not_found = || ResolveError::NotFound { prefix: prefix.to_owned() };
        let Some(wanted) = normalize_prefix(prefix) else { return Err(not_found()) };
        let bound = |fill: &str| {
            Uuid::parse_str(&format!("{wanted}{}", fill.repeat(32 - wanted.len())))
                .map_err(|error| ReadError::Backend { message: error.to_string() })
        };
        let (lowest, highest) = (bound("0")?, bound("f")?);
        let client = self.pool.get().await.map_err(read_backend)?;
        let select = client
            .prepare_cached(
                "SELECT id, count(*) OVER () FROM keel.sessions
                 WHERE id BETWEEN $1 AND $2 ORDER BY id LIMIT 1",
            )
            .await
            .map_err(read_backend)?;
        let found = client.query_opt(&select, &[&lowest, &highest]).await.map_err(read_backend)?;
        let Some(row) = found else { return Err(not_found()) };
        let id: Uuid = row.try_get(0).map_err(read_backend)?;
        let count: i64 = row.try_get(1).map_err(read_backend)?;
        match count {
            1 => Ok(SessionId(id)),
            more => Err(ResolveError::Ambiguous {
                prefix: prefix.to_owned(),
                count: usize::try_from(more).unwrap_or(usize::MAX),
            }),
        }
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
        let client = self.pool.get().await.map_err(append_backend)?;
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
        let client = self.pool.get().await.map_err(read_backend)?;
        let delete = client
            .prepare_cached("DELETE FROM keel.cancel_requests WHERE session_id = $1")
            .await
            .map_err(read_backend)?;
        let deleted = client.execute(&delete, &[&session_id.0]).await.map_err(read_backend)?;
        Ok(deleted > 0)
    }
}

/// Decodes a `seq, body` row of `session_id`'s events.
fn decode_event(session_id: SessionId, row: &Row) -> Result<RuntimeEvent, ReadError> {
    let raw_seq: i64 = row.try_get(0).map_err(read_backend)?;
    let seq = Seq(u64::try_from(raw_seq).map_err(|_| ReadError::Backend {
        message: format!("negative seq {raw_seq} in session {session_id}"),
    })?);
    let body: &str = row.try_get(1).map_err(read_backend)?;
    record::decode(session_id, seq, body.as_bytes())
}

const SUMMARY_COLUMNS: &str =
    "id, created_at, updated_at, workspace, model, title, last_seq, status, parent, usage";

/// The append transaction: lock the session, check the stored tail, insert what is new,
/// update the listing.
async fn append_batch(
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

    let mut summary = stored.unwrap_or_else(|| summary::start(&first_new.event));
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
        summary::apply(&mut summary, event);
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

/// The session's listing row, if it has one.
async fn load_summary(
    tx: &Transaction<'_>,
    session: Uuid,
) -> Result<Option<SessionSummary>, AppendError> {
    let select = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM keel.sessions WHERE id = $1"))
        .await
        .map_err(append_backend)?;
    let row = tx.query_opt(&select, &[&session]).await.map_err(append_backend)?;
    row.map(|row| decode_summary(&row).map_err(|message| AppendError::Backend { message }))
        .transpose()
}

async fn store_summary(tx: &Transaction<'_>, summary: &SessionSummary) -> Result<(), AppendError> {
    let upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO keel.sessions ({SUMMARY_COLUMNS})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (id) DO UPDATE SET
                 created_at = excluded.created_at, updated_at = excluded.updated_at,
                 workspace = excluded.workspace, model = excluded.model,
                 title = excluded.title, last_seq = excluded.last_seq,
                 status = excluded.status, parent = excluded.parent,
                 usage = excluded.usage"
        ))
        .await
        .map_err(append_backend)?;
    let last_seq = i64::try_from(summary.last_seq.0).map_err(|_| AppendError::InvalidBatch {
        reason: format!("seq {} is out of range", summary.last_seq),
    })?;
    tx.execute(
        &upsert,
        &[
            &summary.id.0,
            &timestamp(summary.created_at),
            &timestamp(summary.updated_at),
            &to_column(&summary.workspace),
            &to_column(&summary.model),
            &to_column(&summary.title),
            &last_seq,
            &summary.status.as_str(),
            &summary.parent.map(|parent| parent.0),
            &record::usage_column(&summary.usage),
        ],
    )
    .await
    .map(drop)
    .map_err(append_backend)
}

/// Decodes a `keel.sessions` row selected as [`SUMMARY_COLUMNS`].
fn decode_summary(row: &Row) -> Result<SessionSummary, String> {
    let id: Uuid = row.try_get(0).map_err(|error| describe(&error))?;
    let context = |what: &str| format!("sessions row {id}: bad {what}");
    let text = |index: usize, what: &str| {
        row.try_get::<_, String>(index)
            .map_err(|error| format!("{}: {}", context(what), describe(&error)))
    };
    let user_text = |index: usize, what: &str| {
        text(index, what).and_then(|stored| from_column(stored).ok_or_else(|| context(what)))
    };
    let last_seq: i64 = row.try_get(6).map_err(|error| describe(&error))?;
    let parent: Option<Uuid> = row.try_get(8).map_err(|error| describe(&error))?;
    Ok(SessionSummary {
        id: SessionId(id),
        created_at: parse_timestamp(&text(1, "created_at")?)
            .ok_or_else(|| context("created_at"))?,
        updated_at: parse_timestamp(&text(2, "updated_at")?)
            .ok_or_else(|| context("updated_at"))?,
        workspace: user_text(3, "workspace")?,
        model: user_text(4, "model")?,
        title: user_text(5, "title")?,
        last_seq: Seq(u64::try_from(last_seq).map_err(|_| context("last_seq"))?),
        status: summary::parse_status(&text(7, "status")?).ok_or_else(|| context("status"))?,
        parent: parent.map(SessionId),
        usage: row
            .try_get::<_, Option<String>>(9)
            .map_err(|error| describe(&error))?
            .as_deref()
            .and_then(record::parse_usage)
            .ok_or_else(|| context("usage"))?,
    })
}

/// The escape character of [`to_column`]: a Unicode noncharacter, which no real text
/// carries, so almost every string is stored exactly as it is.
const ESCAPE: char = '\u{FFFF}';

/// The stored spelling of user text: NUL (which `text` cannot hold) becomes `ESCAPE 0`
/// and `ESCAPE` itself becomes `ESCAPE ESCAPE`; everything else is kept. Reversed by
/// [`from_column`].
fn to_column(text: &str) -> Cow<'_, str> {
    if !text.contains(['\0', ESCAPE]) {
        return Cow::Borrowed(text);
    }
    let mut stored = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => stored.extend([ESCAPE, '0']),
            ESCAPE => stored.extend([ESCAPE, ESCAPE]),
            other => stored.push(other),
        }
    }
    Cow::Owned(stored)
}

/// Reverses [`to_column`]; `None` for a dangling or unknown escape.
fn from_column(stored: String) -> Option<String> {
    if !stored.contains(ESCAPE) {
        return Some(stored);
    }
    let mut text = String::with_capacity(stored.len());
    let mut chars = stored.chars();
    while let Some(c) = chars.next() {
        if c != ESCAPE {
            text.push(c);
            continue;
        }
        match chars.next()? {
            '0' => text.push('\0'),
            ESCAPE => text.push(ESCAPE),
            _ => return None,
        }
    }
    Some(text)
}

/// The advisory lock key of a session: the two halves of its uuid XORed, as a signed
/// 64-bit number. Two sessions may share a key; that only makes their appends wait for
/// each other, never wrong.
fn session_lock_key(session_id: SessionId) -> i64 {
    let (high, low) = session_id.0.as_u64_pair();
    i64::from_ne_bytes((high ^ low).to_ne_bytes())
}

/// `user@host:port/dbname`, leaving out the password and anything unset.
fn describe_target(config: &Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|host| match host {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let mut target = String::new();
    if let Some(user) = config.get_user() {
        target.push_str(user);
        target.push('@');
    }
    target.push_str(&hosts.join(","));
    if let [port] = config.get_ports() {
        target.push_str(&format!(":{port}"));
    }
    if let Some(dbname) = config.get_dbname() {
        target.push('/');
        target.push_str(dbname);
    }
    target
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
