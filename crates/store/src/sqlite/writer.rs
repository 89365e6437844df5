//! The writer: one blocking task at a time owns the writing connection and runs what is
//! queued for it, every other write first, then the queued appends as one group commit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use keel_contracts::AppendError;
use rusqlite::{Connection, TransactionBehavior};

use super::{SqliteStore, append};
use crate::record::Batch;

/// The appends waiting for a commit. At most one writer (a blocking task) runs at a time:
/// the append that finds none starts it, and it commits groups until the queue is empty.
#[derive(Default)]
pub(super) struct Queue {
    /// The appends queued for the next group.
    pub(super) pending: Vec<QueuedAppend>,
    /// Other writes (lease takes, run starts, cancels), run by the writer one after
    /// another before its next group.
    ops: Vec<QueuedOp>,
    writing: bool,
}

/// Another write on the connection, waiting in [`Queue`]: it answers its caller itself.
type QueuedOp = Box<dyn FnOnce(&mut Connection) + Send>;

/// One caller's append, waiting in [`SqliteStore`]'s queue.
pub(super) struct QueuedAppend {
    batch: Batch,
    lease: Option<keel_contracts::Lease>,
    answer: tokio::sync::oneshot::Sender<Result<(), AppendError>>,
}

impl SqliteStore {
    /// Queues `batch` for the next group commit and waits for its own answer.
    ///
    /// The first append to find no writer running starts one on the blocking pool; it takes
    /// the connection, then every queued append, writes them as one group, and repeats
    /// until the queue is empty. Appends that arrive while a group commits wait for the
    /// next group. The writer owns what it touches, so a dropped caller's append still
    /// completes.
    pub(super) async fn append_grouped(
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

    /// Runs `op` on the connection on the writer's thread (the blocking pool), queued with
    /// the appends: the writer runs every queued operation, one after another, before its
    /// next group commit, so waiting operations hold no thread and do not each wait for a
    /// group's fsync.
    ///
    /// The writer owns everything it touches, so an operation it began runs to completion
    /// even when the returned future is dropped: a transaction it began is committed or
    /// rolled back, never left half done. Dropped before the writer reaches it, nothing
    /// runs. A panic in `op` is answered as `task_failed` and the writer goes on.
    pub(super) async fn blocking<T, E>(
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

/// Writes a group of queued appends in one transaction and answers each caller.
///
/// Each append is kept apart ([`write_group`]): one that fails is undone alone and its
/// caller gets its error; the others are committed together, with one fsync. When the
/// `COMMIT` itself fails, nothing of the group is published and every append that had
/// succeeded gets that error (a retry of the identical batch is correct either way, see
/// [`SqliteStore::append`](keel_contracts::Store::append)). Counts a commit in `n_commits`
/// before anyone is answered.
fn commit_group(connection: &mut Connection, group: Vec<QueuedAppend>, n_commits: &AtomicU64) {
    let (results, committed) = write_group(connection, &group, Isolation::ChecksFirst)
        .unwrap_or_else(|message| {
            let failed =
                group.iter().map(|_| Err(AppendError::Backend { message: message.clone() }));
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

/// How the appends of a group are kept apart in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Isolation {
    /// No savepoints: every append checks before it writes, so an append refused by its
    /// checks wrote nothing and needs none.
    ChecksFirst,
    /// Each append in a savepoint of its own, so that one whose write failed is undone
    /// alone.
    Savepoints,
}

/// The group's transaction: each caller's result, and whether it committed. `Err` with
/// SQLite's message when it could not begin or a savepoint could not be handled; the
/// transaction is rolled back then and every caller gets that error.
///
/// Every append checks first (fence, stored tail, retries) and writes only after its checks
/// pass, so an append refused by its checks wrote nothing and needs no savepoint. The
/// group runs without savepoints ([`Isolation::ChecksFirst`]); only when a write itself
/// fails after others of the group were written is the transaction rolled back and the
/// group run again, each append in a savepoint of its own ([`Isolation::Savepoints`]), so
/// that the failed one is undone alone.
fn write_group(
    connection: &mut Connection,
    group: &[QueuedAppend],
    isolation: Isolation,
) -> Result<(Vec<Result<(), AppendError>>, bool), String> {
    roll_back_stale(connection)?;
    let tx = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| error.to_string())?;
    let savepoints = isolation == Isolation::Savepoints;
    let run = |sql: &str| tx.prepare_cached(sql).and_then(|mut statement| statement.execute([]));
    let mut wrote = false;
    let mut results = Vec::with_capacity(group.len());
    for queued in group {
        if savepoints {
            run("SAVEPOINT keel_append").map_err(|error| error.to_string())?;
        }
        let result = match append::check_batch(&tx, &queued.batch, queued.lease.as_ref()) {
            Ok(Some(checked)) => match append::write_batch(&tx, &queued.batch, checked) {
                Ok(()) => Ok(true),
                // A write failed part way: undo the group, run it in savepoints.
                Err(_) if !savepoints && !tx.is_autocommit() => {
                    tx.rollback().map_err(|error| error.to_string())?;
                    return write_group(connection, group, Isolation::Savepoints);
                }
                Err(error) => Err(error),
            },
            Ok(None) => Ok(false),
            Err(error) => Err(error),
        };
        if !matches!(result, Ok(true)) {
            if tx.is_autocommit() {
                // SQLite rolled the whole transaction back itself (a full disk, an I/O
                // error): nothing of the group is written; everyone gets the cause.
                return Err(match result {
                    Err(error) => backend_message(error),
                    Ok(_) => "the group's transaction was rolled back".to_owned(),
                });
            }
            if savepoints {
                // Undo whatever this append wrote before it failed. If that fails the
                // transaction cannot be trusted: the whole group fails and is rolled back.
                run("ROLLBACK TO keel_append")
                    .map_err(|error| format!("cannot roll back a failed append: {error}"))?;
            }
        }
        if savepoints {
            run("RELEASE keel_append").map_err(|error| error.to_string())?;
        }
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
