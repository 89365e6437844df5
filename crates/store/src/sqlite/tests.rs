//! Unit tests that need the connection itself: pragmas, schema versions, a full disk.

use chrono::{TimeZone, Utc};
use keel_contracts::{EventKind, Outcome, TurnId};
use uuid::Uuid;

use super::*;

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

#[test]
fn an_unusable_path_is_an_open_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    match SqliteStore::open(file.join("keel.sqlite")) {
        Err(OpenError::CreateDir { path, .. }) => assert_eq!(path, file),
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
