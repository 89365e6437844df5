//! `MemStore` passes the store conformance suite: it is the reference the others match.

use std::sync::Arc;

use async_trait::async_trait;
use keel_contracts::{Seq, SessionId, Store};
use keel_testkit::MemStore;
use keel_testkit::conformance::{self, StoreFactory};

struct MemStoreFactory;

#[async_trait]
impl StoreFactory for MemStoreFactory {
    type Ledger = MemStore;

    async fn create(&self) -> MemStore {
        MemStore::new()
    }

    async fn open(&self, ledger: &MemStore) -> Arc<dyn Store> {
        Arc::new(ledger.clone())
    }

    async fn corrupt(&self, ledger: &MemStore, session_id: SessionId, seq: Seq, garbage: &str) {
        assert!(ledger.corrupt(session_id, seq, garbage), "no event at {seq}");
    }
}

#[tokio::test]
async fn mem_store_conforms() {
    conformance::run_all(&MemStoreFactory).await;
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<MemStore>();
    assert_send_sync::<keel_testkit::FaultyStore>();
    assert_send_sync::<keel_testkit::FakeClock>();
    assert_send_sync::<keel_testkit::SeqIds>();
}
