//! [`SqliteStore`]: the ledger in one embedded SQLite file.
//!
//! Durability: WAL journal with `synchronous=FULL`, so `COMMIT` returns only after the WAL
//! is fsynced; a committed append survives power loss. Concurrency: every write is a
//! `BEGIN IMMEDIATE` transaction, which takes SQLite's single write lock up front, so two
//! processes can never interleave the read-check-insert of an append; a writer that finds
//! the lock taken waits up to [`BUSY_TIMEOUT`].
//!
//! rusqlite is synchronous. The writing connection lives in a `std::sync::Mutex` and each
//! write runs on tokio's blocking pool (`spawn_blocking`), so the async executor never
//! waits on disk. Reads of a file ledger run on their own connections, on reader threads
//! (`readers`): WAL lets them run beside the writer, each seeing the last commit made
//! before it began, so a read never waits for a group commit's fsync. An in-memory ledger
//! has one connection for both. Every async method needs a tokio runtime.
//!
//! Group commit: appends are queued, and one writer (a blocking task, started by the
//! append that finds none running) writes every queued append in one `BEGIN IMMEDIATE`
//! transaction, each inside its own savepoint, and commits once (one fsync for all of
//! them). While one group's fsync runs, the next group gathers, so concurrent sessions
//! share commits. Each caller gets its own
//! answer: an append that fails its checks (a seq conflict, a newer lease) rolls back to its
//! savepoint and fails alone; only a failed `COMMIT` fails the whole group.
//!
//! Module map: `open` (creating, configuring and opening a ledger file, read-only opens),
//! `schema` (tables and migrations), `writer` (the queue, group commit and every other
//! write on the writing connection), `append` (one append's checks and inserts), `reads`
//! (event reads and where they run), `readers` (the read connections' threads),
//! `summaries` (the `sessions` listing rows), `leases`, `cancel` (cancel requests and the
//! probe that spares polling runs a write), `schedules`.

mod append;
mod cancel;
mod leases;
mod open;
mod readers;
mod reads;
mod schedules;
mod schema;
mod summaries;
mod writer;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};
use rusqlite::Connection;

use crate::record::{Batch, normalize_prefix};
use cancel::CancelProbe;
use writer::Queue;

pub use cancel::CANCEL_PROBE_TTL;

/// How long an operation waits for another connection's write lock before failing with
/// "database is locked".
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema version this build reads and writes (see
/// [`OpenError::NewerSchema`](crate::OpenError::NewerSchema)).
pub const SCHEMA_VERSION: i64 = schema::LATEST;

/// Where the embedded ledger lives under `KEEL_HOME`: `keel_home/keel.sqlite`.
pub fn default_path(keel_home: &Path) -> PathBuf {
    keel_home.join("keel.sqlite")
}

/// The default [`Store`]: an embedded SQLite ledger.
///
/// One handle holds one writing connection and, for a file, two read
/// connections made on the first read. Share a handle with `Arc`; open several handles (in
/// one process or many) on one file when needed: they coordinate through SQLite's locks.
/// Writes on one handle run one at a time; reads run beside them.
pub struct SqliteStore {
    connection: Arc<Mutex<Connection>>,
    /// Appends waiting for the next group commit, and whether a writer is running.
    queue: Arc<Mutex<Queue>>,
    /// Append transactions this handle committed.
    n_commits: Arc<AtomicU64>,
    /// The read connections of a file ledger; `None` in memory, where reads use the one
    /// connection.
    readers: Option<readers::Readers>,
    /// What the last look at the pending cancel requests found (see
    /// [`SqliteStore::take_cancel_request`]).
    cancel_probe: Mutex<CancelProbe>,
    /// `None` for an in-memory ledger.
    path: Option<PathBuf>,
}

impl SqliteStore {
    /// A handle on `connection` (already configured and migrated), with read connections
    /// for a file ledger.
    fn with_connection(connection: Connection, path: Option<PathBuf>) -> SqliteStore {
        SqliteStore {
            connection: Arc::new(Mutex::new(connection)),
            queue: Arc::new(Mutex::new(Queue::default())),
            n_commits: Arc::new(AtomicU64::new(0)),
            readers: path.as_deref().map(readers::Readers::new),
            cancel_probe: Mutex::new(CancelProbe::default()),
            path,
        }
    }

    /// How many append transactions this handle has committed: with group commit, fewer
    /// than the appends when callers append concurrently (one fsync per commit on a file).
    pub fn n_commits(&self) -> u64 {
        self.n_commits.load(Ordering::Relaxed)
    }

    /// The ledger file, or `None` for an in-memory ledger.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let location = self.path.as_deref().unwrap_or(Path::new(":memory:"));
        f.debug_struct("SqliteStore").field("path", &location).finish_non_exhaustive()
    }
}

#[async_trait]
impl Store for SqliteStore {
    /// Appends `events` atomically, in one `BEGIN IMMEDIATE` transaction shared with the
    /// appends other callers made meanwhile (group commit; each in its own savepoint).
    ///
    /// # Errors
    ///
    /// [`AppendError::InvalidBatch`] for mixed sessions, a gap inside the batch or seq 0;
    /// [`AppendError::SeqConflict`] when the first new seq is not the session's last + 1 or
    /// a stored event differs from the one offered at its seq;
    /// [`AppendError::Backend`] with SQLite's message for I/O errors, a full disk, a failed
    /// fsync, or a lock held past [`BUSY_TIMEOUT`]. Before `COMMIT` nothing is written.
    /// An I/O error *at* `COMMIT` (a failed fsync) is the one ambiguous case: SQLite does not
    /// publish the batch, but its WAL frames may be recovered on the next open. Retrying the
    /// identical batch is correct either way (a no-op if it survived).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped, the blocking task still finishes its transaction: the
    /// batch ends up wholly written or not at all, and the caller does not learn which.
    /// Re-appending the identical batch answers it (a no-op when it was written).
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        let Some(batch) = Batch::prepare(events)? else { return Ok(()) };
        self.append_grouped(batch, None).await
    }

    /// [`Store::append`] fenced by `lease`, checked inside the same transaction.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::append`], plus [`AppendError::Fenced`] when a newer lease exists.
    ///
    /// # Cancel safety
    ///
    /// As [`SqliteStore::append`].
    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &keel_contracts::Lease,
    ) -> Result<(), AppendError> {
        let Some(batch) = Batch::prepare(events)? else { return Ok(()) };
        self.append_grouped(batch, Some(lease.clone())).await
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
        let holder = holder.to_owned();
        self.blocking(
            |message| keel_contracts::LeaseError::Backend { message },
            move |connection| leases::acquire(connection, session_id, &holder, now, ttl),
        )
        .await
    }

    /// The session's newest lease, on a read connection.
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Backend`] when SQLite fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn current_lease(
        &self,
        session_id: SessionId,
    ) -> Result<Option<keel_contracts::Lease>, keel_contracts::LeaseError> {
        self.reading(
            |message| keel_contracts::LeaseError::Backend { message },
            move |connection| leases::read(connection, session_id),
        )
        .await
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
        let lease = lease.clone();
        self.blocking(
            |message| keel_contracts::LeaseError::Backend { message },
            move |connection| leases::renew(connection, &lease, now, ttl),
        )
        .await
    }

    /// Lets the lease lapse now (a no-op when a newer one exists).
    ///
    /// # Errors
    ///
    /// [`keel_contracts::LeaseError::Backend`] when SQLite fails.
    async fn release_lease(
        &self,
        lease: &keel_contracts::Lease,
    ) -> Result<(), keel_contracts::LeaseError> {
        let lease = lease.clone();
        self.blocking(
            |message| keel_contracts::LeaseError::Backend { message },
            move |connection| leases::release(connection, &lease),
        )
        .await
    }

    /// Reads and decodes the events after `after`, in one consistent snapshot.
    ///
    /// # Errors
    ///
    /// [`ReadError::Corrupt`] with the lowest seq in range whose body does not decode or
    /// names another seq or session: nothing is skipped and no partial list is returned;
    /// read past it with `after` set to that seq. [`ReadError::Backend`] when SQLite fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn read(
        &self,
        session_id: SessionId,
        after: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        self.reading(read_backend, move |connection| {
            reads::read_events(connection, session_id, after)
        })
        .await
    }

    /// Through the partial index on `(session_id, kind, seq)` when every kind is one of the
    /// facts and compactions it holds (only the selected records are read); other kinds
    /// scan the session's events.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::read`], for the selected records.
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
        let kinds: Vec<String> = kinds.iter().map(|kind| (*kind).to_owned()).collect();
        self.reading(read_backend, move |connection| {
            reads::read_kinds(connection, session_id, &kinds, up_to)
        })
        .await
    }

    /// Through the partial index on `(session_id, kind, seq)` for a fact or compaction kind
    /// (one record is read); other kinds scan the session's events.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::read`], for that record.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn last_of_kind(
        &self,
        session_id: SessionId,
        kind: &str,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        let kind = kind.to_owned();
        self.reading(read_backend, move |connection| {
            reads::last_of_kind(connection, session_id, &kind)
        })
        .await
    }

    /// Through the partial index on the results' call ids (`events_by_result_call`): one
    /// record is read.
    ///
    /// # Errors
    ///
    /// As [`SqliteStore::read`], for that record.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn last_tool_result(
        &self,
        session_id: SessionId,
        call_id: &keel_contracts::ToolCallId,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        let call_id = call_id.as_str().to_owned();
        self.reading(read_backend, move |connection| {
            reads::last_tool_result(connection, session_id, &call_id)
        })
        .await
    }

    /// Every session, newest `created_at` first (ties: larger id first).
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when SQLite fails or a listing row does not decode.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError> {
        self.reading(read_backend, summaries::list_sessions).await
    }

    /// One session's listing row, by its primary key.
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when SQLite fails or the row does not decode.
    ///
    /// # Cancel safety
    ///
    /// Read-only; dropping the future changes nothing.
    async fn session(&self, session_id: SessionId) -> Result<Option<SessionSummary>, ReadError> {
        let key = session_id.to_string();
        self.reading(read_backend, move |connection| summaries::one_session(connection, &key)).await
    }

    /// The one session whose id, without dashes, starts with `prefix` without dashes,
    /// compared case-insensitively.
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
        let given = prefix.to_owned();
        let not_found = || ResolveError::NotFound { prefix: given.clone() };
        let Some(wanted) = normalize_prefix(prefix) else { return Err(not_found()) };
        let matches = self
            .reading(read_backend, move |connection| {
                summaries::sessions_with_prefix(connection, &wanted)
            })
            .await?;
        match matches.as_slice() {
            [] => Err(not_found()),
            [only] => Ok(*only),
            more => Err(ResolveError::Ambiguous { prefix: given.clone(), count: more.len() }),
        }
    }

    /// Records a pending cancel request; a second request before a take is the same one.
    ///
    /// # Errors
    ///
    /// [`AppendError::Backend`] when SQLite fails.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the request is recorded or not; requesting again is harmless.
    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError> {
        let requested = self
            .blocking(
                |message| AppendError::Backend { message },
                move |connection| cancel::insert_request(connection, session_id),
            )
            .await;
        self.cancel_requests_changed();
        requested
    }

    /// Deletes the session's pending cancel request, returning whether there was one.
    /// One statement, so of two concurrent takers exactly one sees `true`. On a file
    /// ledger a read of the pending requests, at most [`CANCEL_PROBE_TTL`] old, answers
    /// `false` for a session it does not list without writing: a request made by another
    /// handle (another process) is seen within that time, one of this handle at once.
    ///
    /// # Errors
    ///
    /// [`ReadError::Backend`] when SQLite fails.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if dropped after the delete ran, the request is consumed and the
    /// answer lost. Poll it to completion.
    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError> {
        // Runs watch for stop requests by polling this: with many runs, a write per poll
        // would queue behind every group commit. A look at the (small) table on a read
        // connection stands in for it for a moment; the delete decides.
        if !self.cancel_may_be_pending(session_id).await? {
            return Ok(false);
        }
        let taken = self
            .blocking(read_backend, move |connection| {
                cancel::delete_request(connection, session_id)
            })
            .await;
        self.cancel_requests_changed();
        taken
    }
}

fn append_backend(error: rusqlite::Error) -> AppendError {
    AppendError::Backend { message: error.to_string() }
}

fn read_backend(message: String) -> ReadError {
    ReadError::Backend { message }
}

fn read_backend_sqlite(error: rusqlite::Error) -> ReadError {
    ReadError::Backend { message: error.to_string() }
}

#[cfg(test)]
mod tests;
