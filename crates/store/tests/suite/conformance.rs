//! `SqliteStore` runs the same conformance suite as `MemStore` (and later PostgreSQL).

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Seq, SessionId, Store};
use keel_store::SqliteStore;
use keel_testkit::conformance::{self, StoreFactory};
use tempfile::TempDir;

/// A ledger is a file in its own temporary directory, removed when the test ends.
struct SqliteFactory;

struct SqliteLedger {
    _dir: TempDir,
    path: PathBuf,
}

#[async_trait]
impl StoreFactory for SqliteFactory {
    type Ledger = SqliteLedger;

    async fn create(&self) -> SqliteLedger {
        let dir = tempfile::tempdir().unwrap();
        let path = keel_store::default_path(dir.path());
        SqliteLedger { _dir: dir, path }
    }

    async fn open(&self, ledger: &SqliteLedger) -> Arc<dyn Store> {
        Arc::new(SqliteStore::open(&ledger.path).unwrap())
    }

    /// Writes straight into `events.body` with raw SQL, behind the store's back.
    async fn corrupt(&self, ledger: &SqliteLedger, session_id: SessionId, seq: Seq, garbage: &str) {
        let connection = rusqlite::Connection::open(&ledger.path).unwrap();
        let changed = connection
            .execute(
                "UPDATE events SET body = ?1 WHERE session_id = ?2 AND seq = ?3",
                rusqlite::params![garbage, session_id.to_string(), i64::try_from(seq.0).unwrap()],
            )
            .unwrap();
        assert_eq!(changed, 1, "no event at {seq}");
    }
}

#[tokio::test]
async fn sqlite_store_conforms() {
    conformance::run_all(&SqliteFactory).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_store_conforms_on_a_multi_thread_runtime() {
    conformance::run_all(&SqliteFactory).await;
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<SqliteStore>();
}
