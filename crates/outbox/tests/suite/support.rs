//! A ledger to mirror: sessions of simple events in a `MemStore`, and a fast mirror config;
//! for the `otlp` sink, a loopback collector (`collector`) and GenAI-shaped ledgers
//! (`ledger`).

pub(crate) mod collector;
pub(crate) mod ledger;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{
    Clock, Envelope, EventKind, ExecutionMode, RuntimeEvent, Seq, SessionId, Store,
};
use keel_outbox::{MirrorConfig, RetryPolicy};
use keel_testkit::{FakeClock, MemStore};

pub(crate) fn session(n: u128) -> SessionId {
    SessionId(uuid::Uuid::from_u128(n))
}

/// Appends events `from..=to` of `session_id`: seq 1 creates the session, later ones are
/// turn inputs ("input N").
pub(crate) async fn record(
    store: &MemStore,
    clock: &FakeClock,
    session_id: SessionId,
    from: u64,
    to: u64,
) {
    let events: Vec<RuntimeEvent> = (from..=to)
        .map(|seq| RuntimeEvent {
            seq: Seq(seq),
            session_id,
            turn_id: None,
            run_id: None,
            ts: clock.now(),
            kind: if seq == 1 {
                EventKind::SessionCreated {
                    workspace: "/ws".into(),
                    model: "scripted:x".into(),
                    envelope: Envelope::executor(),
                    mode: ExecutionMode::Live,
                    base_url: None,
                    lineage: None,
                }
            } else {
                EventKind::TurnStarted { input: format!("input {seq}") }
            },
        })
        .collect();
    store.append(&events).await.unwrap();
}

/// Every stored event of `session_id`, as `keel log --json` prints it.
pub(crate) async fn stored_lines(store: &MemStore, session_id: SessionId) -> Vec<String> {
    store
        .read(session_id, Seq(0))
        .await
        .unwrap()
        .iter()
        .map(|event| serde_json::to_string(event).unwrap())
        .collect()
}

pub(crate) fn file_lines(path: &Path) -> Vec<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => text.lines().map(str::to_owned).collect(),
        Err(_) => Vec::new(),
    }
}

/// Cursors in `cursor_dir`; quick polls and retries so redrive tests finish fast.
pub(crate) fn fast_config(cursor_dir: &Path, clock: Arc<FakeClock>) -> MirrorConfig {
    let mut config = MirrorConfig::new(cursor_dir.to_path_buf(), clock);
    config.poll_interval = Duration::from_millis(50);
    config.retry =
        RetryPolicy { first: Duration::from_millis(20), max: Duration::from_millis(200) };
    config.flush_attempts = 5;
    config
}

/// Polls `done` every 20 ms for up to 10 s (real time).
pub(crate) async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

pub(crate) fn store_arc(store: &MemStore) -> Arc<dyn Store> {
    Arc::new(store.clone())
}
