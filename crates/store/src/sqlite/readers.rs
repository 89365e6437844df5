//! Read connections of a file ledger: reads never wait behind the writer.
//!
//! WAL lets readers run beside the one writer: each read sees the last commit made before
//! it began. So a file ledger reads on its own connections, each owned by a dedicated
//! thread fed from one queue, instead of taking the writer's connection on tokio's
//! blocking pool. Under many concurrent sessions that pool otherwise grows to hundreds of
//! threads parked on the writer's mutex while a group commit fsyncs (BENCHMARKS.md, "Host:
//! many sessions"). The threads and connections are made on the first read and end when
//! the [`Readers`] is dropped (after the reads already queued).
//!
//! Reader connections only read: `query_only` is on, so a mistaken write on one fails
//! instead of competing with the writer for SQLite's write lock.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};

use rusqlite::{Connection, OpenFlags};

use super::BUSY_TIMEOUT;

/// How many read connections (and threads) a file ledger uses.
pub(crate) const N_READERS: usize = 2;

/// One read: runs on a reader thread with its connection.
type Job = Box<dyn FnOnce(Result<&mut Connection, String>) + Send>;

/// The reads waiting for a reader, and whether the owner is gone.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// The reader threads of one [`super::SqliteStore`].
pub(crate) struct Readers {
    path: PathBuf,
    /// Started on the first read.
    shared: OnceLock<Arc<Shared>>,
}

impl Readers {
    pub(crate) fn new(path: &Path) -> Readers {
        Readers { path: path.to_path_buf(), shared: OnceLock::new() }
    }

    /// Runs `op` on a read connection and waits for its answer.
    ///
    /// `op` gets `Err` with the reason when a reader connection could not be opened (each
    /// thread opens its own and tries again on its next job) or a reader thread could not
    /// be started.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the answer, not the read: it still runs (reads change
    /// nothing).
    pub(crate) async fn run<T: Send + 'static>(
        &self,
        op: impl FnOnce(Result<&mut Connection, String>) -> T + Send + 'static,
        gone: impl FnOnce() -> T,
    ) -> T {
        let (answer, answered) = tokio::sync::oneshot::channel();
        let job: Job = Box::new(move |connection| {
            // A caller that stopped waiting does not need its answer.
            let _ = answer.send(op(connection));
        });
        let shared = self.shared.get_or_init(|| self.start());
        {
            let mut queue = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            queue.jobs.push_back(job);
        }
        shared.ready.notify_one();
        // The job was dropped without running: its reader thread panicked or none started.
        answered.await.unwrap_or_else(|_| gone())
    }

    fn start(&self) -> Arc<Shared> {
        let shared = Arc::new(Shared::default());
        for n in 0..N_READERS {
            let (theirs, path) = (Arc::clone(&shared), self.path.clone());
            let started = std::thread::Builder::new()
                .name(format!("keel-sqlite-read-{n}"))
                .spawn(move || serve(&theirs, &path));
            if started.is_err() && n == 0 {
                // No reader at all: queued jobs would never run. Closing makes `run`'s jobs
                // drop at once (answered by `gone`).
                shared.queue.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
            }
        }
        shared
    }
}

impl Drop for Readers {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.get() {
            shared.queue.lock().unwrap_or_else(PoisonError::into_inner).closed = true;
            shared.ready.notify_all();
        }
    }
}

/// A reader thread: takes jobs until the queue is closed and empty.
fn serve(shared: &Shared, path: &Path) {
    let mut connection: Option<Connection> = None;
    loop {
        let job = {
            let mut queue = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if queue.closed {
                    return;
                }
                queue = shared.ready.wait(queue).unwrap_or_else(PoisonError::into_inner);
            }
        };
        if connection.is_none() {
            connection = open(path).ok();
        }
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            match connection.as_mut() {
                Some(connection) => {
                    if !connection.is_autocommit() {
                        // Defensive: never let a read run inside a stale transaction.
                        let _ = connection.execute_batch("ROLLBACK");
                    }
                    job(Ok(connection));
                }
                None => job(Err(format!("cannot open a read connection to {}", path.display()))),
            }
        }));
        if ran.is_err() {
            // The read panicked (its caller gets `gone`); start over with a new connection
            // rather than trust one a panic unwound through.
            connection = None;
        }
    }
}

/// A read connection to the ledger at `path` (already made and migrated by the writer).
pub(super) fn open(path: &Path) -> rusqlite::Result<Connection> {
    let connection = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )?;
    connection.busy_timeout(BUSY_TIMEOUT)?;
    connection.pragma_update(None, "query_only", true)?;
    super::open::stable_plans(&connection)?;
    Ok(connection)
}
