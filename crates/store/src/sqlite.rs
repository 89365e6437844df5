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

mod leases;
mod readers;
mod schedules;
mod schema;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

use crate::error::OpenError;
use crate::record::{self, Batch, normalize_prefix, parse_session_id, parse_timestamp, timestamp};
use crate::summary;

/// How long an operation waits for another connection's write lock before failing with
/// "database is locked".
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The schema version this build reads and writes (see [`OpenError::NewerSchema`]).
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

/// How long a look at the pending cancel requests stands in for the table: a session not
/// among them is answered "none pending" without I/O until it is this old. Requests made
/// through this handle are seen at once; ones made by another process within this time.
pub const CANCEL_PROBE_TTL: Duration = Duration::from_millis(100);

/// The sessions with a pending cancel request, as last read, and when.
#[derive(Default)]
struct CancelProbe {
    /// Bumped by every [`SqliteStore::request_cancel`] of this handle: a look begun
    /// before one is not kept.
    generation: u64,
    seen: Option<(std::time::Instant, std::collections::HashSet<SessionId>)>,
}

/// The appends waiting for a commit. At most one writer (a blocking task) runs at a time:
/// the append that finds none starts it, and it commits groups until the queue is empty.
#[derive(Default)]
struct Queue {
    pending: Vec<QueuedAppend>,
    /// Other writes (lease takes, run starts, cancels), run by the writer one after
    /// another before its next group.
    ops: Vec<QueuedOp>,
    writing: bool,
}

/// Another write on the connection, waiting in [`Queue`]: it answers its caller itself.
type QueuedOp = Box<dyn FnOnce(&mut Connection) + Send>;

/// One caller's append, waiting in [`SqliteStore`]'s queue.
struct QueuedAppend {
    batch: Batch,
    lease: Option<keel_contracts::Lease>,
    answer: tokio::sync::oneshot::Sender<Result<(), AppendError>>,
}

impl SqliteStore {
    /// Opens (creating if needed) the ledger at `path`: creates missing parent
    /// directories, switches to WAL with `synchronous=FULL`, sets [`BUSY_TIMEOUT`] and
    /// migrates the schema to [`SCHEMA_VERSION`].
    ///
    /// This blocks on disk; call it at startup or from a blocking task.
    ///
    /// # Errors
    ///
    /// [`OpenError::NotADirectory`] when the parent exists and is not a directory;
    /// [`OpenError::CreateDir`] when a parent directory cannot be created (new ones are
    /// made 0700); [`OpenError::CreateFile`] when a new ledger file cannot be made (0600);
    /// [`OpenError::Sqlite`] when SQLite fails; [`OpenError::NoWal`] when the file system
    /// refuses WAL; [`OpenError::NewerSchema`] when a newer keel wrote the file.
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, OpenError> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|parent| !parent.as_os_str().is_empty()) {
            let not_a_directory = match std::fs::metadata(parent) {
                Ok(meta) if meta.is_dir() => None,
                Ok(meta) => Some(kind_name(meta.file_type()).unwrap_or("a file")),
                // A link whose target is missing (or a loop of links): creating the folder
                // would only say "File exists".
                Err(_) => parent
                    .symlink_metadata()
                    .is_ok_and(|meta| meta.file_type().is_symlink())
                    .then_some("a symbolic link to nothing (its target is missing, or a loop)"),
            };
            if let Some(kind) = not_a_directory {
                return Err(OpenError::NotADirectory { path: parent.to_path_buf(), kind });
            }
            create_private_dir(parent)
                .map_err(|source| OpenError::CreateDir { path: parent.to_path_buf(), source })?;
        }
        refuse_non_regular(&path)?;
        create_private_file(&path)
            .map_err(|source| OpenError::CreateFile { path: path.clone(), source })?;
        let mut connection = Connection::open(&path).map_err(sqlite_error(&path))?;
        // SQLite answers "database is locked" without waiting while another connection is
        // switching a new file to WAL, so a second process opening a fresh ledger at the
        // same moment retries here instead of failing.
        let mut n_attempts: u32 = 0;
        loop {
            match configure_file(&mut connection, &path) {
                Err(OpenError::Sqlite { source, .. })
                    if is_busy(&*source) && n_attempts < OPEN_BUSY_RETRIES =>
                {
                    n_attempts += 1;
                    std::thread::sleep(OPEN_BUSY_RETRY_DELAY);
                }
                result => break result?,
            }
        }
        Ok(SqliteStore::with_connection(connection, Some(path)))
    }

    /// Opens an existing ledger at `path` for reading only, for listings and logs: nothing
    /// is created, configured, migrated or checkpointed, so no ledger page is written and
    /// nothing is fsynced (SQLite still maps its `-shm` index, as any reader does). Reads
    /// run on this one connection; a write through the handle fails (SQLite refuses it).
    ///
    /// `Ok(None)` when the file cannot be read as it is: it does not exist, it is not in WAL
    /// mode, its schema is older than [`SCHEMA_VERSION`] (migrating it is a write), or a
    /// process killed while writing it left a repair to do first (a hot rollback journal, a
    /// WAL index to rebuild). [`SqliteStore::open`] it then. In a folder it cannot write
    /// (a read-only `KEEL_HOME`), where SQLite cannot create the `-shm` index, a ledger
    /// with no `-wal` and no `-journal` beside it is read `immutable=1` (the file alone is
    /// the whole ledger).
    ///
    /// This blocks on disk; call it at startup or from a blocking task.
    ///
    /// # Errors
    ///
    /// [`OpenError::Sqlite`] when SQLite fails; [`OpenError::NewerSchema`] when a newer
    /// keel wrote the file; [`OpenError::NotRegular`] for a FIFO, device or folder there;
    /// [`OpenError::ReadOnlyHome`] when the folder cannot be written and the ledger has a
    /// `-wal` or `-journal` that reading it would need to write beside.
    pub fn open_read_only(path: impl AsRef<Path>) -> Result<Option<SqliteStore>, OpenError> {
        let path = path.as_ref().to_path_buf();
        refuse_non_regular(&path)?;
        if !path.try_exists().unwrap_or(false) {
            return Ok(None);
        }
        let (connection, found) = match read_only_connection(&path, false) {
            Ok(Some(opened)) => opened,
            Ok(None) => return Ok(None),
            // In a folder it cannot write, SQLite cannot create the `-shm` index a WAL
            // reader needs (and the writer's open could not write either).
            Err(source) if cannot_create_shm(&path, &source) => read_in_read_only_folder(&path)?,
            // A process killed mid-write left the file needing a write before it can be
            // read (a hot rollback journal from its first moments, or a WAL index to
            // rebuild): the writer's open does that repair.
            Err(source) if needs_repair(&source) => return Ok(None),
            Err(source) => return Err(sqlite_error(&path)(source)),
        };
        match found {
            Some(found) if found > SCHEMA_VERSION => {
                Err(OpenError::NewerSchema { path, found, supported: SCHEMA_VERSION })
            }
            Some(found) if found == SCHEMA_VERSION => {
                let mut store = SqliteStore::with_connection(connection, Some(path));
                // Reads use the one read-only connection: a reader connection is opened
                // read-write, and the last one to close would checkpoint the WAL.
                store.readers = None;
                Ok(Some(store))
            }
            Some(_) | None => Ok(None),
        }
    }

    /// A private, empty ledger in memory, gone when the handle is dropped. For tests.
    ///
    /// # Errors
    ///
    /// [`OpenError::Sqlite`] when SQLite fails.
    pub fn open_in_memory() -> Result<SqliteStore, OpenError> {
        let path = PathBuf::from(":memory:");
        let mut connection = Connection::open_in_memory().map_err(sqlite_error(&path))?;
        stable_plans(&connection).map_err(sqlite_error(&path))?;
        migrate(&mut connection, &path)?;
        Ok(SqliteStore::with_connection(connection, None))
    }

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

    /// Queues `batch` for the next group commit and waits for its own answer.
    ///
    /// The first append to find no writer running starts one on the blocking pool; it takes
    /// the connection, then every queued append, writes them as one group, and repeats
    /// until the queue is empty. Appends that arrive while a group commits wait for the
    /// next group. The writer owns what it touches, so a dropped caller's append still
    /// completes.
    async fn append_grouped(
        &self,
        batch: Batch,
        lease: Option<keel_contracts::Lease>,
    ) -> Result<(), AppendError> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.enqueue(|queue| queue.pending.push(QueuedAppend { batch, lease, answer }));
        // The writer dropped this append's answer without sending it: it panicked.
        answered.await.unwrap_or_else(|_| {
            Err(AppendError::Backend { message: "the ledger writer stopped unexpectedly".into() })
        })
    }

    /// Puts work in the writer's queue with `push`, and starts the writer on the blocking
    /// pool when none is running.
    fn enqueue(&self, push: impl FnOnce(&mut Queue)) {
        let start_writer = {
            let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            push(&mut queue);
            !std::mem::replace(&mut queue.writing, true)
        };
        if start_writer {
            let connection = Arc::clone(&self.connection);
            let queue = Arc::clone(&self.queue);
            let n_commits = Arc::clone(&self.n_commits);
            tokio::task::spawn_blocking(move || write_groups(&connection, &queue, &n_commits));
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

    /// Runs `op` on the connection on the writer's thread (the blocking pool), queued with
    /// the appends: the writer runs every queued operation, one after another, before its
    /// next group commit, so waiting operations hold no thread and do not each wait for a
    /// group's fsync.
    ///
    /// The writer owns everything it touches, so an operation it began runs to completion
    /// even when the returned future is dropped: a transaction it began is committed or
    /// rolled back, never left half done. Dropped before the writer reaches it, nothing
    /// runs. A panic in `op` is answered as `task_failed` and the writer goes on.
    async fn blocking<T, E>(
        &self,
        task_failed: fn(String) -> E,
        op: impl FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let (answer, answered) = tokio::sync::oneshot::channel::<Result<T, E>>();
        let run: QueuedOp = Box::new(move |connection: &mut Connection| {
            if answer.is_closed() {
                // The caller stopped waiting before its turn: nothing runs.
                return;
            }
            let result = if connection.is_autocommit() {
                // A panic inside `op` unwinds through rusqlite's `Transaction`, whose drop
                // rolls back; the connection itself is still sound.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(connection)))
                    .unwrap_or_else(|_| Err(task_failed("ledger task panicked".to_owned())))
            } else {
                // Defensive: never let a later operation run inside a stale transaction.
                match connection.execute_batch("ROLLBACK") {
                    Ok(()) => {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| op(connection)))
                            .unwrap_or_else(|_| Err(task_failed("ledger task panicked".to_owned())))
                    }
                    Err(error) => {
                        Err(task_failed(format!("cannot roll back stale transaction: {error}")))
                    }
                }
            };
            let _ = answer.send(result);
        });
        self.enqueue(|queue| queue.ops.push(run));
        answered.await.unwrap_or_else(|_| Err(task_failed("ledger task did not finish".to_owned())))
    }
}

impl SqliteStore {
    /// Runs the read-only `op` on a read connection of a file ledger (never waiting for the
    /// writer), or on the one connection of an in-memory ledger.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the answer; the read still runs.
    async fn reading<T, E>(
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

    /// Whether `session_id` may have a pending cancel request: `false` when a look at the
    /// table younger than [`CANCEL_PROBE_TTL`] (and no newer request of this handle) does
    /// not list it; otherwise looks again, on a read connection.
    async fn cancel_may_be_pending(&self, session_id: SessionId) -> Result<bool, ReadError> {
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
    fn cancel_requests_changed(&self) {
        let mut probe = self.cancel_probe.lock().unwrap_or_else(PoisonError::into_inner);
        probe.generation = probe.generation.wrapping_add(1);
        probe.seen = None;
    }
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
        self.reading(read_backend, move |connection| read_events(connection, session_id, after))
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
            read_kinds(connection, session_id, &kinds, up_to)
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
            let sql = if schema::INDEXED_KINDS.contains(&kind.as_str()) {
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
            let sql = format!(
                "SELECT seq, body FROM events INDEXED BY events_by_result_call
                 WHERE session_id = ?1 AND kind = 'tool_result' AND {} = ?2
                 ORDER BY seq DESC LIMIT 1",
                schema::RESULT_CALL_ID
            );
            select_events(connection, session_id, &sql, &[&session_id.to_string(), &call_id])
                .map(|mut events| events.pop())
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
        self.reading(read_backend, list_sessions).await
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
        self.reading(read_backend, move |connection| one_session(connection, &key)).await
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
            .reading(read_backend, move |connection| sessions_with_prefix(connection, &wanted))
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
                move |connection| {
                    connection
                        .prepare_cached(
                            "INSERT INTO cancel_requests (session_id, requested_at)
                     VALUES (?1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                     ON CONFLICT (session_id) DO NOTHING",
                        )
                        .and_then(|mut insert| insert.execute([session_id.to_string()]))
                        .map(drop)
                        .map_err(append_backend)
                },
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
                connection
                    .prepare_cached("DELETE FROM cancel_requests WHERE session_id = ?1")
                    .and_then(|mut delete| delete.execute([session_id.to_string()]))
                    .map(|deleted| deleted > 0)
                    .map_err(read_backend_sqlite)
            })
            .await;
        self.cancel_requests_changed();
        taken
    }
}

/// Writes a group of queued appends in one transaction and answers each caller.
///
/// Each append runs in its own savepoint: one that fails is rolled back alone and its
/// caller gets its error; the others are committed together, with one fsync. When the
/// `COMMIT` itself fails, nothing of the group is published and every append that had
/// succeeded gets that error (a retry of the identical batch is correct either way, see
/// [`SqliteStore::append`]).
/// The writer: commits queued groups until the queue is empty, then marks itself gone.
/// The connection is released between groups, so reads get their turn.
fn write_groups(connection: &Mutex<Connection>, queue: &Mutex<Queue>, n_commits: &AtomicU64) {
    let _stopped = WriterStopped(queue);
    loop {
        let mut connection = connection.lock().unwrap_or_else(PoisonError::into_inner);
        let (ops, group) = {
            let mut queue = queue.lock().unwrap_or_else(PoisonError::into_inner);
            if queue.pending.is_empty() && queue.ops.is_empty() {
                queue.writing = false;
                return;
            }
            (std::mem::take(&mut queue.ops), std::mem::take(&mut queue.pending))
        };
        for op in ops {
            op(&mut connection);
        }
        if !group.is_empty() {
            commit_group(&mut connection, group, n_commits);
        }
    }
}

/// Unwinding out of the writer (a panic): let the next append start a new writer, and
/// answer the waiting appends with an error (their senders are dropped) rather than never.
struct WriterStopped<'a>(&'a Mutex<Queue>);

impl Drop for WriterStopped<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut queue = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            queue.writing = false;
            queue.pending.clear();
            queue.ops.clear();
        }
    }
}

/// Counts a commit in `n_commits` before anyone is answered.
fn commit_group(connection: &mut Connection, group: Vec<QueuedAppend>, n_commits: &AtomicU64) {
    let (results, committed) = write_group(connection, &group).unwrap_or_else(|message| {
        let failed = group.iter().map(|_| Err(AppendError::Backend { message: message.clone() }));
        (failed.collect(), false)
    });
    if committed {
        n_commits.fetch_add(1, Ordering::Relaxed);
    }
    for (queued, result) in group.into_iter().zip(results) {
        // A caller that stopped waiting does not need its answer.
        let _ = queued.answer.send(result);
    }
}

/// The group's transaction: each caller's result, and whether it committed. `Err` with
/// SQLite's message when it could not begin or a savepoint could not be handled; the
/// transaction is rolled back then and every caller gets that error.
///
/// Every append checks first (fence, stored tail, retries) and writes only after its checks
/// pass, so an append refused by its checks wrote nothing and needs no savepoint. The
/// group runs without savepoints; only when a write itself fails after others of the group
/// were written is the transaction rolled back and the group run again, each append in a
/// savepoint of its own ([`write_group_in_savepoints`]), so that the failed one is undone
/// alone.
fn write_group(
    connection: &mut Connection,
    group: &[QueuedAppend],
) -> Result<(Vec<Result<(), AppendError>>, bool), String> {
    roll_back_stale(connection)?;
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| error.to_string())?;
    let mut wrote = false;
    let mut results = Vec::with_capacity(group.len());
    for queued in group {
        let result = match check_batch(&tx, &queued.batch, queued.lease.as_ref()) {
            Ok(Some(checked)) => match write_batch(&tx, &queued.batch, checked) {
                Ok(()) => Ok(true),
                Err(error) => {
                    if tx.is_autocommit() {
                        return Err(backend_message(error));
                    }
                    // A write failed part way: undo the group, run it in savepoints.
                    tx.rollback().map_err(|error| error.to_string())?;
                    return write_group_in_savepoints(connection, group);
                }
            },
            Ok(None) => Ok(false),
            Err(error) if tx.is_autocommit() => return Err(backend_message(error)),
            Err(error) => Err(error),
        };
        wrote |= matches!(result, Ok(true));
        results.push(result.map(drop));
    }
    finish_group(tx, wrote, results)
}

/// [`write_group`] with each append in a savepoint: a failed append is undone alone.
fn write_group_in_savepoints(
    connection: &mut Connection,
    group: &[QueuedAppend],
) -> Result<(Vec<Result<(), AppendError>>, bool), String> {
    roll_back_stale(connection)?;
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| error.to_string())?;
    let run = |sql: &str| tx.prepare_cached(sql).and_then(|mut statement| statement.execute([]));
    let mut wrote = false;
    let mut results = Vec::with_capacity(group.len());
    for queued in group {
        run("SAVEPOINT keel_append").map_err(|error| error.to_string())?;
        let result = append_batch(&tx, &queued.batch, queued.lease.as_ref());
        if !matches!(result, Ok(true)) {
            if tx.is_autocommit() {
                // SQLite rolled the whole transaction back itself (a full disk, an I/O
                // error): nothing of the group is written; everyone gets the cause.
                return Err(match result {
                    Err(error) => backend_message(error),
                    Ok(_) => "the group's transaction was rolled back".to_owned(),
                });
            }
            // Undo whatever this append wrote before it failed. If that fails the
            // transaction cannot be trusted: the whole group fails and is rolled back.
            run("ROLLBACK TO keel_append")
                .map_err(|error| format!("cannot roll back a failed append: {error}"))?;
        }
        run("RELEASE keel_append").map_err(|error| error.to_string())?;
        wrote |= matches!(result, Ok(true));
        results.push(result.map(drop));
    }
    finish_group(tx, wrote, results)
}

/// Defensive: never let a group run inside a stale transaction.
fn roll_back_stale(connection: &Connection) -> Result<(), String> {
    if connection.is_autocommit() {
        return Ok(());
    }
    connection
        .execute_batch("ROLLBACK")
        .map_err(|error| format!("cannot roll back stale transaction: {error}"))
}

/// The message a whole group fails with when SQLite gave up its transaction.
fn backend_message(error: AppendError) -> String {
    match error {
        AppendError::Backend { message } => message,
        _ => "the group's transaction was rolled back".to_owned(),
    }
}

/// Commits the group when it wrote anything (no commit and no fsync for retries and
/// refusals only); a failed commit fails every append that had succeeded.
fn finish_group(
    tx: rusqlite::Transaction<'_>,
    wrote: bool,
    mut results: Vec<Result<(), AppendError>>,
) -> Result<(Vec<Result<(), AppendError>>, bool), String> {
    let finished = if wrote { tx.commit() } else { tx.rollback() };
    if let Err(error) = finished {
        let message = error.to_string();
        for result in &mut results {
            if result.is_ok() {
                *result = Err(AppendError::Backend { message: message.clone() });
            }
        }
        return Ok((results, false));
    }
    Ok((results, wrote))
}

/// One append inside the group's transaction: check the stored tail, insert what is new,
/// update the listing. `Ok(false)` when every event was already stored (nothing written).
fn append_batch(
    tx: &Connection,
    batch: &Batch,
    lease: Option<&keel_contracts::Lease>,
) -> Result<bool, AppendError> {
    match check_batch(tx, batch, lease)? {
        Some(checked) => write_batch(tx, batch, checked).map(|()| true),
        None => Ok(false),
    }
}

/// What an append's checks found: where its new rows start, and the session's stored
/// listing row (`None` for a new session).
struct Checked {
    first_new: usize,
    stored: Option<SessionSummary>,
}

/// An append's checks, which write nothing: the lease's fence, the stored tail, and that
/// events at or below it are byte-identical retries. `None` when every event was already
/// stored.
fn check_batch(
    tx: &Connection,
    batch: &Batch,
    lease: Option<&keel_contracts::Lease>,
) -> Result<Option<Checked>, AppendError> {
    let session_key = batch.session_id.to_string();
    if let Some(lease) = lease {
        leases::check_fence(tx, lease)?;
    }
    let stored = load_summary(tx, &session_key)?;
    let last_seq = stored.as_ref().map_or(Seq(0), |summary| summary.last_seq);
    let conflict = |got: Seq| AppendError::SeqConflict {
        session_id: batch.session_id,
        expected: last_seq.next(),
        got,
    };

    // Events at or below the stored tail must be byte-identical retries.
    let mut select = tx
        .prepare_cached("SELECT body FROM events WHERE session_id = ?1 AND seq = ?2")
        .map_err(append_backend)?;
    for (index, row) in batch.rows.iter().enumerate() {
        if row.event.seq > last_seq {
            if row.event.seq != last_seq.next() {
                return Err(conflict(row.event.seq));
            }
            return Ok(Some(Checked { first_new: index, stored }));
        }
        let identical = select
            .query_row(params![session_key, row.seq], |stored| {
                Ok(match stored.get_ref(0)? {
                    ValueRef::Text(bytes) | ValueRef::Blob(bytes) => bytes == row.body.as_bytes(),
                    ValueRef::Null | ValueRef::Integer(_) | ValueRef::Real(_) => false,
                })
            })
            .optional()
            .map_err(append_backend)?;
        if identical != Some(true) {
            return Err(conflict(row.event.seq));
        }
    }
    Ok(None)
}

/// Inserts `batch`'s new rows (as [`check_batch`] found them) and updates the session's
/// listing row.
fn write_batch(tx: &Connection, batch: &Batch, checked: Checked) -> Result<(), AppendError> {
    let session_key = batch.session_id.to_string();
    let new_rows = &batch.rows[checked.first_new..];
    let mut summary = checked.stored.unwrap_or_else(|| summary::start(&new_rows[0].event));
    let mut insert = tx
        .prepare_cached(
            "INSERT INTO events (session_id, seq, turn_id, run_id, ts, kind, body)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .map_err(append_backend)?;
    for row in new_rows {
        let event = &row.event;
        insert
            .execute(params![
                session_key,
                row.seq,
                event.turn_id.map(|id| id.to_string()),
                event.run_id.map(|id| id.to_string()),
                timestamp(event.ts),
                event.kind,
                row.body,
            ])
            .map_err(append_backend)?;
        summary::apply(&mut summary, event);
    }
    store_summary(tx, &summary)
}

fn read_events(
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
fn read_kinds(
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

/// A `sessions` row as SQLite holds it, before decoding.
#[derive(Debug)]
struct SummaryColumns {
    id: String,
    created_at: String,
    updated_at: String,
    workspace: String,
    model: String,
    title: String,
    last_seq: i64,
    status: String,
    parent: Option<String>,
    usage: Option<String>,
}

const SUMMARY_COLUMNS: &str =
    "id, created_at, updated_at, workspace, model, title, last_seq, status, parent, usage";

impl SummaryColumns {
    fn from_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<SummaryColumns> {
        Ok(SummaryColumns {
            id: row.get(0)?,
            created_at: row.get(1)?,
            updated_at: row.get(2)?,
            workspace: row.get(3)?,
            model: row.get(4)?,
            title: row.get(5)?,
            last_seq: row.get(6)?,
            status: row.get(7)?,
            parent: row.get(8)?,
            usage: row.get(9)?,
        })
    }

    fn decode(self) -> Result<SessionSummary, String> {
        let id = parse_session_id(&self.id)?;
        let context = |what: &str| format!("sessions row {id}: bad {what}");
        Ok(SessionSummary {
            id,
            created_at: parse_timestamp(&self.created_at).ok_or_else(|| context("created_at"))?,
            updated_at: parse_timestamp(&self.updated_at).ok_or_else(|| context("updated_at"))?,
            workspace: self.workspace,
            model: self.model,
            title: self.title,
            last_seq: Seq(u64::try_from(self.last_seq).map_err(|_| context("last_seq"))?),
            status: summary::parse_status(&self.status).ok_or_else(|| context("status"))?,
            parent: self
                .parent
                .as_deref()
                .map(parse_session_id)
                .transpose()
                .map_err(|_| context("parent"))?,
            usage: self
                .usage
                .as_deref()
                .and_then(record::parse_usage)
                .ok_or_else(|| context("usage"))?,
        })
    }
}

fn load_summary(tx: &Connection, session_key: &str) -> Result<Option<SessionSummary>, AppendError> {
    let columns = tx
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1"))
        .and_then(|mut select| select.query_row([session_key], SummaryColumns::from_row).optional())
        .map_err(append_backend)?;
    columns
        .map(|columns| columns.decode().map_err(|message| AppendError::Backend { message }))
        .transpose()
}

fn store_summary(tx: &Connection, summary: &SessionSummary) -> Result<(), AppendError> {
    let mut upsert = tx
        .prepare_cached(&format!(
            "INSERT INTO sessions ({SUMMARY_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
             ON CONFLICT (id) DO UPDATE SET
                 created_at = excluded.created_at, updated_at = excluded.updated_at,
                 workspace = excluded.workspace, model = excluded.model,
                 title = excluded.title, last_seq = excluded.last_seq,
                 status = excluded.status, parent = excluded.parent,
                 usage = excluded.usage"
        ))
        .map_err(append_backend)?;
    let last_seq = i64::try_from(summary.last_seq.0).map_err(|_| AppendError::InvalidBatch {
        reason: format!("seq {} is out of range", summary.last_seq),
    })?;
    upsert
        .execute(params![
            summary.id.to_string(),
            timestamp(summary.created_at),
            timestamp(summary.updated_at),
            summary.workspace,
            summary.model,
            summary.title,
            last_seq,
            summary.status.as_str(),
            summary.parent.map(|parent| parent.to_string()),
            record::usage_column(&summary.usage),
        ])
        .map(drop)
        .map_err(append_backend)
}

fn list_sessions(connection: &mut Connection) -> Result<Vec<SessionSummary>, ReadError> {
    let mut select = connection
        .prepare_cached(&format!(
            "SELECT {SUMMARY_COLUMNS} FROM sessions ORDER BY created_at DESC, id DESC"
        ))
        .map_err(read_backend_sqlite)?;
    let rows = select.query_map([], SummaryColumns::from_row).map_err(read_backend_sqlite)?;
    rows.map(|columns| {
        columns
            .map_err(read_backend_sqlite)?
            .decode()
            .map_err(|message| ReadError::Backend { message })
    })
    .collect()
}

fn one_session(
    connection: &mut Connection,
    session_key: &str,
) -> Result<Option<SessionSummary>, ReadError> {
    let columns = connection
        .prepare_cached(&format!("SELECT {SUMMARY_COLUMNS} FROM sessions WHERE id = ?1"))
        .and_then(|mut select| select.query_row([session_key], SummaryColumns::from_row).optional())
        .map_err(read_backend_sqlite)?;
    columns
        .map(|columns| columns.decode().map_err(|message| ReadError::Backend { message }))
        .transpose()
}

fn sessions_with_prefix(
    connection: &mut Connection,
    wanted: &str,
) -> Result<Vec<SessionId>, ReadError> {
    let mut select = connection
        .prepare_cached(
            "SELECT id FROM sessions WHERE substr(replace(id, '-', ''), 1, ?1) = ?2 ORDER BY id",
        )
        .map_err(read_backend_sqlite)?;
    let length = i64::try_from(wanted.len()).unwrap_or(i64::MAX);
    let ids = select
        .query_map(params![length, wanted], |row| row.get::<_, String>(0))
        .map_err(read_backend_sqlite)?;
    ids.map(|id| {
        parse_session_id(&id.map_err(read_backend_sqlite)?)
            .map_err(|message| ReadError::Backend { message })
    })
    .collect()
}

/// Pause between attempts of [`configure_file`] that found the file busy.
const OPEN_BUSY_RETRY_DELAY: Duration = Duration::from_millis(10);
/// Attempts of [`configure_file`] after the first, together about [`BUSY_TIMEOUT`].
const OPEN_BUSY_RETRIES: u32 = 500;

/// Sets the file's pragmas and migrates it. Every step is idempotent, so a busy attempt can
/// simply be repeated.
fn configure_file(connection: &mut Connection, path: &Path) -> Result<(), OpenError> {
    let sqlite = sqlite_error(path);
    connection.busy_timeout(BUSY_TIMEOUT).map_err(&sqlite)?;
    let journal_mode: String = connection
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(&sqlite)?;
    if !journal_mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::NoWal { path: path.to_path_buf(), journal_mode });
    }
    // FULL, not NORMAL: NORMAL in WAL mode may lose the last commits on power loss.
    connection.pragma_update(None, "synchronous", "FULL").map_err(&sqlite)?;
    stable_plans(connection).map_err(&sqlite)?;
    migrate(connection, path)
}

/// Turns on SQLite's query planner stability guarantee (`SQLITE_DBCONFIG_ENABLE_QPSG`): a
/// cached statement keeps its plan whatever values are bound. Without it, SQLite marks a
/// statement for re-preparing when a bound parameter *might* change the plan (the
/// `events` table's partial index makes every `session_id = ?` such a parameter), so every
/// cached read of the events re-parsed and re-planned its SQL (~8% of `keel serve`'s CPU
/// under load, BENCHMARKS.md #15). keel's queries are planned by their indexes, never by
/// the values bound.
pub(crate) fn stable_plans(connection: &Connection) -> rusqlite::Result<()> {
    connection.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

fn is_busy(error: &(dyn std::error::Error + Send + Sync + 'static)) -> bool {
    error.downcast_ref::<rusqlite::Error>().and_then(rusqlite::Error::sqlite_error_code)
        == Some(rusqlite::ErrorCode::DatabaseBusy)
}

/// Whether a read-only open failed because SQLite could not create the ledger's `-shm`
/// index: `SQLITE_CANTOPEN` while no `-shm` exists (a read-only connection creates one
/// wherever it can, so the folder cannot be written).
fn cannot_create_shm(path: &Path, error: &rusqlite::Error) -> bool {
    let mut shm = path.as_os_str().to_owned();
    shm.push("-shm");
    error.sqlite_error().map(|error| error.code) == Some(rusqlite::ErrorCode::CannotOpen)
        && Path::new(&shm).symlink_metadata().is_err()
}

/// The read-only open of a ledger in a read-only folder: with no `-wal` and no
/// `-journal` beside it, the file alone is the whole ledger, and SQLite reads it
/// `immutable=1` (no `-shm`, no locks: nothing can be written there). A `-wal` or a
/// `-journal` would need a write to read correctly, so that is a clear error, never a
/// read that skips committed events.
fn read_in_read_only_folder(path: &Path) -> Result<(Connection, Option<i64>), OpenError> {
    for (suffix, why) in [
        ("-wal", "its write-ahead log (-wal) needs an index (-shm) created beside it"),
        ("-journal", "its rollback journal (-journal) must be rolled back first"),
    ] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        if Path::new(&name).symlink_metadata().is_ok() {
            return Err(OpenError::ReadOnlyHome {
                path: path.to_path_buf(),
                why: format!(
                    "{why}; make the folder writable (or copy it somewhere writable and point \
                     KEEL_HOME there)"
                ),
            });
        }
    }
    match read_only_connection(path, true) {
        Ok(Some(opened)) => Ok(opened),
        Ok(None) => Err(OpenError::ReadOnlyHome {
            path: path.to_path_buf(),
            why: "the file is not a keel ledger this version reads without migrating it".into(),
        }),
        Err(source) => Err(sqlite_error(path)(source)),
    }
}

/// `path` as an SQLite `file:` URI: every byte but unreserved ones percent-encoded.
fn file_uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt as _;
    let mut uri = String::from("file:");
    for byte in path.as_os_str().as_bytes() {
        match byte {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'-' | b'.' | b'_' | b'~' => {
                uri.push(char::from(*byte));
            }
            _ => uri.push_str(&format!("%{byte:02X}")),
        }
    }
    uri.push('?');
    uri.push_str(query);
    uri
}

/// Opens `path` read-only (`immutable=1` when `immutable`) and reads its schema version:
/// `None` when it is not a WAL ledger with a `schema_version` table,
/// `Some((connection, None))` when that table is empty.
fn read_only_connection(
    path: &Path,
    immutable: bool,
) -> rusqlite::Result<Option<(Connection, Option<i64>)>> {
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
        | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX
        | rusqlite::OpenFlags::SQLITE_OPEN_URI;
    let connection = if immutable {
        Connection::open_with_flags(file_uri(path, "immutable=1"), flags)?
    } else {
        Connection::open_with_flags(path, flags)?
    };
    connection.busy_timeout(BUSY_TIMEOUT)?;
    // An immutable open reports journal mode `delete` whatever the file's header says.
    let journal_mode: String =
        connection.pragma_query_value(None, "journal_mode", |row| row.get(0))?;
    if !immutable && !journal_mode.eq_ignore_ascii_case("wal") {
        return Ok(None);
    }
    let has_version: bool = connection.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version')",
        [],
        |row| row.get(0),
    )?;
    if !has_version {
        return Ok(None);
    }
    let found: Option<i64> = connection
        .query_row("SELECT version FROM schema_version", [], |row| row.get(0))
        .optional()?;
    Ok(Some((connection, found)))
}

/// Whether a read-only connection failed because the file needs a write first: SQLite's
/// `SQLITE_READONLY_ROLLBACK` (a hot journal to roll back), `SQLITE_READONLY_RECOVERY` (a
/// WAL index to rebuild), `SQLITE_READONLY_CANTINIT` and `SQLITE_READONLY_CANTLOCK` (the
/// shared-memory index cannot be set up read-only). Source: <https://sqlite.org/rescode.html>.
fn needs_repair(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error().map(|error| error.extended_code),
        Some(
            rusqlite::ffi::SQLITE_READONLY_ROLLBACK
                | rusqlite::ffi::SQLITE_READONLY_RECOVERY
                | rusqlite::ffi::SQLITE_READONLY_CANTINIT
                | rusqlite::ffi::SQLITE_READONLY_CANTLOCK
        )
    )
}

fn migrate(connection: &mut Connection, path: &Path) -> Result<(), OpenError> {
    match schema::migrate(connection).map_err(sqlite_error(path))? {
        schema::Migration::Current => Ok(()),
        schema::Migration::Newer(found) => Err(OpenError::NewerSchema {
            path: path.to_path_buf(),
            found,
            supported: schema::LATEST,
        }),
    }
}

fn sqlite_error(path: &Path) -> impl Fn(rusqlite::Error) -> OpenError + use<> {
    let path = path.to_path_buf();
    move |source| OpenError::Sqlite { path: path.clone(), source: Box::new(source) }
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

/// Creates `dir` and its missing parents with mode 0700: the ledger holds every prompt,
/// tool result and diff of every session. An existing folder is left as it is.
fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Refuses a ledger whose file, or one of SQLite's files beside it, exists and is not a
/// regular file: SQLite opens them blocking, so a FIFO there would hang keel forever. It
/// is a `stat` (following symlinks), never an open, so the check itself cannot block.
/// What does not exist (yet) passes; what cannot be inspected is left to SQLite's error.
fn refuse_non_regular(path: &Path) -> Result<(), OpenError> {
    for suffix in ["", "-wal", "-shm", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        let Ok(metadata) = std::fs::metadata(&name) else { continue };
        let Some(kind) = kind_name(metadata.file_type()) else { continue };
        return Err(OpenError::NotRegular { path: PathBuf::from(name), kind });
    }
    Ok(())
}

/// What a file of `kind` is, for an error; `None` for a regular file.
fn kind_name(kind: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt as _;
    Some(if kind.is_file() {
        return None;
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_socket() {
        "a socket"
    } else if kind.is_block_device() || kind.is_char_device() {
        "a device"
    } else {
        "not a file"
    })
}

/// Creates the ledger file with mode 0600 when it does not exist, so SQLite (which gives
/// its `-wal` and `-shm` files the mode of the database file) never makes a readable one.
/// An existing file keeps its mode: the user may have chosen it.
fn create_private_file(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Ok(_) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests;
