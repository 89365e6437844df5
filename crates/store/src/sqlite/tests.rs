//! Unit tests that need the connection itself: pragmas, schema versions, a full disk.

use chrono::{TimeZone, Utc};
use keel_contracts::{EventKind, Outcome, TurnId};
use uuid::Uuid;

use super::open::needs_repair;
use super::reads::read_events;
use super::*;
use crate::error::OpenError;
use crate::record::timestamp;

fn pragma<T: rusqlite::types::FromSql>(store: &SqliteStore, name: &str) -> T {
    let connection = store.connection.lock().unwrap();
    connection.pragma_query_value(None, name, |row| row.get(0)).unwrap()
}

fn event(session_id: SessionId, seq: u64, content: String) -> RuntimeEvent {
    RuntimeEvent {
        seq: Seq(seq),
        session_id,
        turn_id: Some(TurnId(Uuid::from_u128(7))),
        run_id: None,
        ts: Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap(),
        kind: EventKind::ToolResult {
            call_id: "c1".into(),
            attempt_id: None,
            tool: "bash".to_owned(),
            outcome: Outcome::Ok,
            bytes: content.len() as u64,
            raw: None,
            content,
        },
    }
}

#[test]
fn open_creates_parents_and_sets_durable_pragmas() {
    let dir = tempfile::tempdir().unwrap();
    let path = default_path(&dir.path().join("nested").join("home"));
    assert!(path.ends_with("nested/home/keel.sqlite"));
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.path(), Some(path.as_path()));
    assert_eq!(pragma::<String>(&store, "journal_mode"), "wal");
    assert_eq!(pragma::<i64>(&store, "synchronous"), 2, "FULL");
    assert_eq!(pragma::<i64>(&store, "busy_timeout"), 5000);
    let version: i64 = {
        let connection = store.connection.lock().unwrap();
        connection.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap()
    };
    assert_eq!(version, SCHEMA_VERSION);
    drop(store);
    // Reopening an up-to-date file is fine and keeps the version.
    SqliteStore::open(&path).unwrap();
}

#[test]
fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    Connection::open(&path).unwrap().execute("UPDATE schema_version SET version = 99", []).unwrap();
    match SqliteStore::open(&path) {
        Err(OpenError::NewerSchema { found: 99, supported, .. }) => {
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected NewerSchema, got {other:?}"),
    }
}

/// A read-only handle reads what the writer committed and writes nothing: the file, its
/// WAL and its folder are byte-for-byte the same after reads and a close, and a write
/// through it fails. A missing file, or one needing a migration, is `None` (open it then).
#[tokio::test]
async fn a_read_only_open_reads_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    assert!(SqliteStore::open_read_only(&path).unwrap().is_none());
    assert!(!path.exists(), "a read-only open creates nothing");
    let writer = SqliteStore::open(&path).unwrap();
    let id = SessionId(Uuid::from_u128(9));
    writer.append(&[event(id, 1, "one".to_owned())]).await.unwrap();
    let lease = writer.acquire_lease(id, "a", Utc::now(), Duration::from_secs(30)).await.unwrap();
    let snapshot = |suffix: &str| std::fs::read(format!("{}{suffix}", path.display())).unwrap();
    let (db, wal) = (snapshot(""), snapshot("-wal"));
    let store = SqliteStore::open_read_only(&path).unwrap().unwrap();
    assert_eq!(store.read(id, Seq(0)).await.unwrap().len(), 1);
    assert_eq!(store.sessions().await.unwrap().len(), 1);
    let current = store.current_lease(id).await.unwrap().unwrap();
    assert_eq!((current.holder, current.token), (lease.holder, lease.token));
    assert!(store.append(&[event(id, 2, "two".to_owned())]).await.is_err());
    drop(store);
    assert_eq!((snapshot(""), snapshot("-wal")), (db, wal), "nothing was written");
    // The writer is unaffected.
    writer.append(&[event(id, 2, "two".to_owned())]).await.unwrap();
    drop(writer);
    Connection::open(&path).unwrap().execute("UPDATE schema_version SET version = 1", []).unwrap();
    assert!(SqliteStore::open_read_only(&path).unwrap().is_none(), "older: needs a migration");
    Connection::open(&path).unwrap().execute("UPDATE schema_version SET version = 99", []).unwrap();
    assert!(matches!(
        SqliteStore::open_read_only(&path),
        Err(OpenError::NewerSchema { found: 99, .. })
    ));
}

/// A process killed in its first moments, while a new ledger was still switching to WAL,
/// leaves a hot rollback journal. SQLite cannot roll it back on a read-only connection
/// (`SQLITE_READONLY_ROLLBACK`), so a read-only open answers `None` and the writer's open
/// repairs the file: `keel sessions` after such a kill lists, it does not fail.
#[test]
fn a_hot_journal_left_by_a_killed_writer_is_repaired_by_the_writers_open() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live.sqlite");
    let path = dir.path().join("keel.sqlite");
    // A transaction whose pages spill into the file before it commits: the journal is
    // synced and the file changed, as at a kill mid-write. A copy of both, with no process
    // holding a lock on it, is a hot journal.
    let connection = Connection::open(&live).unwrap();
    connection
        .execute_batch(
            "PRAGMA journal_mode = DELETE; PRAGMA cache_size = 1;
             CREATE TABLE filler (body BLOB); INSERT INTO filler VALUES (zeroblob(100000));",
        )
        .unwrap();
    connection
        .execute_batch(
            "BEGIN; UPDATE filler SET body = randomblob(100000);
             INSERT INTO filler SELECT randomblob(100000) FROM filler;",
        )
        .unwrap();
    let journal = format!("{}-journal", live.display());
    assert!(Path::new(&journal).exists(), "the transaction has a journal");
    std::fs::copy(&live, &path).unwrap();
    std::fs::copy(&journal, format!("{}-journal", path.display())).unwrap();
    drop(connection);

    let read_only = Connection::open_with_flags(&path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap()
        .query_row("SELECT count(*) FROM filler", [], |row| row.get::<_, i64>(0))
        .unwrap_err();
    assert!(needs_repair(&read_only), "{read_only:?}");
    assert!(SqliteStore::open_read_only(&path).unwrap().is_none());
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(pragma::<String>(&store, "journal_mode"), "wal");
    drop(store);
    assert!(!Path::new(&format!("{}-journal", path.display())).exists(), "rolled back");
    assert!(SqliteStore::open_read_only(&path).unwrap().is_some());
}

/// The ledger holds every prompt and tool result: a new one, its WAL and shared-memory
/// files and a folder made for it are the owner's alone. An existing file keeps its mode.
#[tokio::test]
async fn a_new_ledger_is_private_to_its_owner() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let path = home.join("keel.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    store.append(&[event(SessionId(Uuid::from_u128(1)), 1, "x".to_owned())]).await.unwrap();
    assert_eq!(mode(&home), 0o700);
    for file in ["keel.sqlite", "keel.sqlite-wal", "keel.sqlite-shm"] {
        assert_eq!(mode(&home.join(file)), 0o600, "{file}");
    }
    drop(store);
    let chosen = dir.path().join("shared.sqlite");
    std::fs::write(&chosen, b"").unwrap();
    std::fs::set_permissions(&chosen, std::fs::Permissions::from_mode(0o640)).unwrap();
    drop(SqliteStore::open(&chosen).unwrap());
    assert_eq!(mode(&chosen), 0o640);
}

#[test]
fn an_unusable_path_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    match SqliteStore::open(file.join("keel.sqlite")) {
        Err(OpenError::NotADirectory { path, kind }) => {
            assert_eq!((path, kind), (file.clone(), "a file"));
        }
        other => panic!("expected NotADirectory, got {other:?}"),
    }
    // Below a file: the folder cannot be made.
    match SqliteStore::open(file.join("sub").join("keel.sqlite")) {
        Err(OpenError::CreateDir { path, .. }) => assert_eq!(path, file.join("sub")),
        other => panic!("expected CreateDir, got {other:?}"),
    }
    std::fs::write(dir.path().join("garbage.sqlite"), vec![0x5a_u8; 8192]).unwrap();
    match SqliteStore::open(dir.path().join("garbage.sqlite")) {
        Err(error @ OpenError::Sqlite { .. }) => {
            assert!(error.to_string().starts_with("cannot open ledger"), "{error}");
        }
        other => panic!("expected Sqlite, got {other:?}"),
    }
}

#[tokio::test]
async fn a_full_disk_is_a_backend_error_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("keel.sqlite")).unwrap();
    let session_id = SessionId(Uuid::from_u128(1));
    store.append(&[event(session_id, 1, "small".to_owned())]).await.unwrap();
    {
        // Cap the file at its current size: the next page SQLite needs fails with
        // SQLITE_FULL, exactly as a full disk would.
        let connection = store.connection.lock().unwrap();
        let pages: i64 =
            connection.pragma_query_value(None, "page_count", |row| row.get(0)).unwrap();
        connection.pragma_update(None, "max_page_count", pages).unwrap();
    }
    let big = [event(session_id, 2, "x".repeat(256 * 1024))];
    match store.append(&big).await {
        Err(AppendError::Backend { message }) => {
            assert_eq!(message, "database or disk is full");
        }
        other => panic!("expected Backend, got {other:?}"),
    }
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap().len(), 1);
    assert_eq!(store.sessions().await.unwrap()[0].last_seq, Seq(1));
    {
        let connection = store.connection.lock().unwrap();
        connection.pragma_update(None, "max_page_count", 1_000_000).unwrap();
    }
    store.append(&big).await.unwrap();
    let stored = store.read(session_id, Seq(1)).await.unwrap();
    assert!(stored == big, "the retried event is stored as offered");
}

/// A group's appends run without savepoints; when one of them fails part way through its
/// writes (here a trigger refuses its second event, after its first was inserted), the
/// group is rolled back and run again with a savepoint per append: the failed append is
/// undone alone, and the others of its group commit in the same one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_that_fails_in_a_group_is_undone_alone_and_the_others_commit() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("keel.sqlite")).unwrap());
    let ids = [1, 2, 3].map(|n| SessionId(Uuid::from_u128(n)));
    for id in ids {
        store.append(&[event(id, 1, "first".to_owned())]).await.unwrap();
    }
    let commits_before = store.n_commits();
    let appends = {
        // Hold the writer's connection so that the three appends queue up as one group.
        let connection = store.connection.lock().unwrap();
        connection
            .execute_batch(&format!(
                "CREATE TEMP TRIGGER refuse BEFORE INSERT ON main.events
                 WHEN NEW.session_id = '{}' AND NEW.seq = 3
                 BEGIN SELECT RAISE(ABORT, 'refused by the test'); END;",
                ids[1]
            ))
            .unwrap();
        let batches =
            ids.map(|id| vec![event(id, 2, "second".into()), event(id, 3, "third".into())]);
        let appends: Vec<_> = batches
            .into_iter()
            .map(|batch| {
                let store = Arc::clone(&store);
                tokio::spawn(async move { store.append(&batch).await })
            })
            .collect();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while store.queue.lock().unwrap().pending.len() < 3 {
            assert!(std::time::Instant::now() < deadline, "the appends never queued");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        appends
    };
    let mut results = Vec::new();
    for append in appends {
        results.push(append.await.unwrap());
    }
    assert!(results[0].is_ok() && results[2].is_ok(), "{results:?}");
    assert!(
        matches!(&results[1], Err(AppendError::Backend { message }) if message.contains("refused by the test")),
        "{results:?}"
    );
    assert_eq!(store.n_commits(), commits_before + 1, "one group, one commit");
    for (id, last) in ids.into_iter().zip([3_u64, 1, 3]) {
        assert_eq!(store.read(id, Seq(0)).await.unwrap().len() as u64, last, "{id}");
        assert_eq!(store.session(id).await.unwrap().unwrap().last_seq, Seq(last), "{id}");
    }
}

#[tokio::test]
async fn in_memory_ledgers_work_and_are_private() {
    let first = SqliteStore::open_in_memory().unwrap();
    let second = SqliteStore::open_in_memory().unwrap();
    assert_eq!(first.path(), None);
    let session_id = SessionId(Uuid::from_u128(1));
    let events = [event(session_id, 1, "a".to_owned()), event(session_id, 2, "b".to_owned())];
    first.append(&events).await.unwrap();
    assert_eq!(first.read(session_id, Seq(0)).await.unwrap(), events);
    assert!(second.read(session_id, Seq(0)).await.unwrap().is_empty());
    assert!(format!("{first:?}").contains(":memory:"));
}

#[tokio::test]
async fn a_dropped_append_still_commits_or_rolls_back_whole() {
    let store = Arc::new(SqliteStore::open_in_memory().unwrap());
    let session_id = SessionId(Uuid::from_u128(1));
    let events: Vec<_> = (1..=64).map(|seq| event(session_id, seq, format!("{seq}"))).collect();
    {
        // Poll once so the blocking task starts, then drop the future.
        let append = store.append(&events);
        let mut append = std::pin::pin!(append);
        let _ = futures_poll_once(append.as_mut()).await;
    }
    // Whatever happened, the ledger holds all 64 events or none, and a retry settles it.
    let stored = store.read(session_id, Seq(0)).await.unwrap();
    assert!(stored.is_empty() || stored == events, "partial batch: {} events", stored.len());
    store.append(&events).await.unwrap();
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap(), events);
}

/// Polls `future` exactly once.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut future: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut future).poll(cx) {
            std::task::Poll::Ready(output) => Some(output),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[test]
fn prefixes_normalize_to_lowercase_hex() {
    assert_eq!(normalize_prefix(" 01-9A ").as_deref(), Some("019a"));
    assert_eq!(normalize_prefix("--"), None);
    assert_eq!(normalize_prefix("01%"), None);
    assert_eq!(timestamp(Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap()).len(), 30);
}

/// Waits (yielding) until `n` appends are queued behind the held connection.
async fn until_queued(store: &SqliteStore, n: usize) {
    for _ in 0..10_000 {
        if store.queue.lock().unwrap().pending.len() >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{n} appends never queued");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(
    clippy::await_holding_lock,
    reason = "the test holds the connection on purpose, so the appends queue behind it"
)]
async fn concurrent_appends_share_one_commit_and_each_caller_gets_its_own_answer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("keel.sqlite")).unwrap());
    let session = |n: u128| SessionId(Uuid::from_u128(n));
    // A session whose lease was taken over (its old holder is fenced), and a session with
    // an event at seq 1 already (a second, different seq 1 conflicts).
    let t0 = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    let ttl = Duration::from_secs(10);
    let stale = store.acquire_lease(session(100), "old", t0, ttl).await.unwrap();
    let later = t0 + chrono::TimeDelta::seconds(60);
    let current = store.acquire_lease(session(100), "new", later, ttl).await.unwrap();
    store.append(&[event(session(101), 1, "first".into())]).await.unwrap();
    let before = store.n_commits();

    // Hold the connection, so every append below queues; then let them go at once.
    let held = store.connection.lock().unwrap();
    let mut good = Vec::new();
    for n in 1..=20 {
        let store = Arc::clone(&store);
        good.push(tokio::spawn(async move {
            let events: Vec<_> =
                (1..=3).map(|seq| event(session(n), seq, format!("{n}"))).collect();
            store.append(&events).await
        }));
    }
    let fenced = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store.append_leased(&[event(session(100), 1, "late".into())], &stale).await
        })
    };
    let conflict = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.append(&[event(session(101), 1, "other".into())]).await })
    };
    let leased = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            store.append_leased(&[event(session(100), 1, "owner".into())], &current).await
        })
    };
    until_queued(&store, 23).await;
    drop(held);

    for task in good {
        task.await.unwrap().unwrap();
    }
    leased.await.unwrap().unwrap();
    match fenced.await.unwrap() {
        Err(AppendError::Fenced { .. }) => {}
        other => panic!("a stale lease must be fenced, got {other:?}"),
    }
    match conflict.await.unwrap() {
        Err(AppendError::SeqConflict { expected: Seq(2), got: Seq(1), .. }) => {}
        other => panic!("a different seq 1 must conflict, got {other:?}"),
    }
    // One transaction, one fsync, for all 21 successful appends.
    assert_eq!(store.n_commits() - before, 1);
    for n in 1..=20 {
        assert_eq!(store.read(session(n), Seq(0)).await.unwrap().len(), 3, "session {n}");
    }
    let owner = store.read(session(100), Seq(0)).await.unwrap();
    assert_eq!(owner, vec![event(session(100), 1, "owner".into())]);
    let kept = store.read(session(101), Seq(0)).await.unwrap();
    assert_eq!(kept, vec![event(session(101), 1, "first".into())]);
    let listed = store.sessions().await.unwrap();
    assert_eq!(listed.len(), 22);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(
    clippy::await_holding_lock,
    reason = "the test holds the connection on purpose, so the appends queue behind it"
)]
async fn a_group_of_refused_and_repeated_appends_commits_nothing() {
    let store = Arc::new(SqliteStore::open_in_memory().unwrap());
    let session_id = SessionId(Uuid::from_u128(1));
    let stored = event(session_id, 1, "kept".into());
    store.append(std::slice::from_ref(&stored)).await.unwrap();
    let before = store.n_commits();
    let held = store.connection.lock().unwrap();
    let retry = {
        let (store, stored) = (Arc::clone(&store), stored.clone());
        tokio::spawn(async move { store.append(&[stored]).await })
    };
    let gap = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.append(&[event(session_id, 3, "gap".into())]).await })
    };
    until_queued(&store, 2).await;
    drop(held);
    retry.await.unwrap().unwrap();
    assert!(matches!(gap.await.unwrap(), Err(AppendError::SeqConflict { .. })));
    assert_eq!(store.n_commits(), before, "nothing new, nothing committed");
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap(), vec![stored]);
}

fn response(session_id: SessionId, seq: u64, cost: Option<f64>) -> RuntimeEvent {
    let kind = serde_json::from_value(serde_json::json!({
        "kind": "model_response",
        "text": "ok",
        "tool_calls": [],
        "usage": {"input_tokens": 100, "output_tokens": 10},
        "finish_reason": "stop",
        "cost_usd": cost,
    }))
    .unwrap();
    RuntimeEvent { kind, ..event(session_id, seq, String::new()) }
}

/// A file written before the listing kept usage (schema 2) gets its totals once, from its
/// `model_response` events; a session with an unreadable response reads as unknown.
#[tokio::test]
async fn migrating_a_version_2_file_backfills_usage_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    let (good, damaged, quiet) = (
        SessionId(Uuid::from_u128(1)),
        SessionId(Uuid::from_u128(2)),
        SessionId(Uuid::from_u128(3)),
    );
    let store = SqliteStore::open(&path).unwrap();
    let good_events: Vec<_> = (1..=4)
        .map(|seq| {
            if seq % 2 == 0 { response(good, seq, Some(0.5)) } else { event(good, seq, "x".into()) }
        })
        .collect();
    store.append(&good_events).await.unwrap();
    store.append(&[event(damaged, 1, "x".into()), response(damaged, 2, Some(1.0))]).await.unwrap();
    store.append(&[event(quiet, 1, "x".into())]).await.unwrap();
    drop(store);
    {
        let connection = Connection::open(&path).unwrap();
        connection
            .execute_batch(
                "DROP INDEX events_by_fact_kind; DROP INDEX events_by_result_call;
                 DROP TABLE schedules; DROP TABLE schedule_fires; DROP TABLE wakes;
                 ALTER TABLE sessions DROP COLUMN usage;
                 UPDATE schema_version SET version = 2;
                 UPDATE events SET body = '{not json' WHERE seq = 2 AND session_id = '00000000-0000-0000-0000-000000000002';",
            )
            .unwrap();
    }
    let store = SqliteStore::open(&path).unwrap();
    let listed = store.sessions().await.unwrap();
    let usage_of = |id| listed.iter().find(|row| row.id == id).unwrap().usage;
    let mut expected = keel_contracts::UsageTotals::default();
    for _ in 0..2 {
        expected.add(
            &keel_contracts::Usage {
                input_tokens: Some(100),
                output_tokens: Some(10),
                ..Default::default()
            },
            None,
            Some(0.5),
        );
    }
    assert_eq!(usage_of(good), expected);
    assert_eq!(usage_of(good).cost_usd, Some(1.0));
    assert_eq!(usage_of(damaged), keel_contracts::UsageTotals::unknown());
    assert_eq!(usage_of(quiet), keel_contracts::UsageTotals::default());
    // The ledger is untouched: the damaged record still fails its read, never skipped.
    assert!(matches!(store.read(damaged, Seq(0)).await, Err(ReadError::Corrupt { .. })));
    // Appends after the migration keep folding onto the backfilled totals.
    store.append(&[response(good, 5, Some(0.25))]).await.unwrap();
    let after = store.sessions().await.unwrap();
    assert_eq!(after.iter().find(|row| row.id == good).unwrap().usage.cost_usd, Some(1.25));
    let version: i64 = {
        let connection = store.connection.lock().unwrap();
        connection.query_row("SELECT version FROM schema_version", [], |row| row.get(0)).unwrap()
    };
    assert_eq!(version, SCHEMA_VERSION);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_a_file_ledger_do_not_wait_for_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(SqliteStore::open(dir.path().join("keel.sqlite")).unwrap());
    let session_id = SessionId(Uuid::from_u128(1));
    store.append(&[event(session_id, 1, "one".into())]).await.unwrap();

    // The writer's connection is held (as during a group commit's fsync) while every kind
    // of read runs: they use the read connections, so they finish meanwhile. Were they on
    // the writer's connection, this test would hang (the guard below bounds that).
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (holding, held) = std::sync::mpsc::channel::<()>();
    let writer = Arc::clone(&store.connection);
    let holder = std::thread::spawn(move || {
        let _guard = writer.lock().unwrap();
        holding.send(()).unwrap();
        released.recv().unwrap();
    });
    held.recv().unwrap();
    let reads = async {
        assert_eq!(store.read(session_id, Seq(0)).await.unwrap().len(), 1);
        assert_eq!(store.read_kinds(session_id, &["tool_result"], Seq(9)).await.unwrap().len(), 1);
        assert!(store.last_of_kind(session_id, "tool_result").await.unwrap().is_some());
        assert_eq!(store.sessions().await.unwrap().len(), 1);
        assert!(store.session(session_id).await.unwrap().is_some());
        assert_eq!(store.resolve_session("0000").await.unwrap(), session_id);
        // No cancel request is pending: answered without the writer too.
        assert!(!store.take_cancel_request(session_id).await.unwrap());
    };
    tokio::time::timeout(Duration::from_secs(120), reads)
        .await
        .expect("reads finished while the writer was held");
    release.send(()).unwrap();
    holder.join().unwrap();

    // An append made after the hold is seen by the next read (read connections see every
    // commit made before the read began).
    store.append(&[event(session_id, 2, "two".into())]).await.unwrap();
    assert_eq!(store.read(session_id, Seq(1)).await.unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_are_seen_by_this_handle_at_once_and_by_another_after_the_probe_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    let here = SqliteStore::open(&path).unwrap();
    let there = SqliteStore::open(&path).unwrap();
    let (s1, s2) = (SessionId(Uuid::from_u128(1)), SessionId(Uuid::from_u128(2)));

    // A look that found nothing does not hide a request made through the same handle.
    assert!(!here.take_cancel_request(s1).await.unwrap());
    here.request_cancel(s1).await.unwrap();
    assert!(here.take_cancel_request(s1).await.unwrap());
    assert!(!here.take_cancel_request(s1).await.unwrap(), "taken only once");

    // Another handle's request is seen once the last look is older than the TTL.
    assert!(!here.take_cancel_request(s2).await.unwrap());
    there.request_cancel(s2).await.unwrap();
    tokio::time::sleep(CANCEL_PROBE_TTL + Duration::from_millis(20)).await;
    assert!(here.take_cancel_request(s2).await.unwrap());
    assert!(!there.take_cancel_request(s2).await.unwrap(), "the delete decides: one taker");
}

/// How often the cached statement of [`read_events`] was re-prepared over `reads` reads of
/// growing sessions on `connection`.
fn reprepares_over_reads(connection: &mut Connection, reads: u64) -> i32 {
    const SQL: &str =
        "SELECT seq, body FROM events WHERE session_id = ?1 AND seq > ?2 ORDER BY seq";
    for n in 0..reads {
        let session_id = SessionId(Uuid::from_u128(u128::from(n % 3) + 1));
        read_events(connection, session_id, Seq(n % 2)).unwrap();
    }
    let statement = connection.prepare_cached(SQL).unwrap();
    statement.get_status(rusqlite::StatementStatus::RePrepare)
}

#[tokio::test]
async fn cached_reads_keep_their_plan_instead_of_being_prepared_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    for n in 1..=3 {
        let session_id = SessionId(Uuid::from_u128(n));
        store
            .append(&[event(session_id, 1, "one".into()), event(session_id, 2, "two".into())])
            .await
            .unwrap();
    }
    // As the store opens its read connections.
    let mut reader = readers::open(&path).unwrap();
    assert_eq!(reprepares_over_reads(&mut reader, 30), 0, "no read re-prepared");
    // The neighbour: the same reads on a connection without the guarantee are re-prepared
    // (what this guards against), and both read the same events.
    let mut plain = Connection::open(&path).unwrap();
    assert!(reprepares_over_reads(&mut plain, 30) > 0, "SQLite re-prepares without QPSG");
    let session_id = SessionId(Uuid::from_u128(2));
    let stable = read_events(&mut reader, session_id, Seq(0)).unwrap();
    assert_eq!(stable, read_events(&mut plain, session_id, Seq(0)).unwrap());
    assert_eq!(stable.len(), 2);
}
