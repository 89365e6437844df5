//! `FaultyStore` fails exactly the appends it was told to, and writes nothing when it does.

use std::sync::Arc;

use keel_contracts::{
    AppendError, Clock, EventKind, IdGen, Outcome, RuntimeEvent, Seq, SessionId, Store,
};
use keel_testkit::{FakeClock, Fault, FaultyStore, MemStore, SeqIds};

fn event(clock: &FakeClock, session_id: SessionId, seq: u64, kind: EventKind) -> RuntimeEvent {
    RuntimeEvent { seq: Seq(seq), session_id, turn_id: None, run_id: None, ts: clock.now(), kind }
}

fn note(step: u64) -> EventKind {
    EventKind::ModelRequested {
        step: u32::try_from(step).unwrap(),
        messages: step,
        request_sha256: String::new(),
        tokens: None,
        tokens_before_pruning: None,
        pruned_results: 0,
        purpose: keel_contracts::RequestPurpose::Conversation,
    }
}

fn backend_message(result: Result<(), AppendError>) -> String {
    match result {
        Err(AppendError::Backend { message }) => message,
        other => panic!("expected a Backend error, got {other:?}"),
    }
}

#[tokio::test]
async fn nth_append_fails_once_and_writes_nothing() {
    let clock = FakeClock::new();
    let session_id = SeqIds::new().session_id();
    let store = FaultyStore::new(Arc::new(MemStore::new()));
    store.fail_nth_append(2, Fault::DiskFull);

    store.append(&[event(&clock, session_id, 1, note(1))]).await.unwrap();
    let second = [event(&clock, session_id, 2, note(2))];
    assert_eq!(backend_message(store.append(&second).await), "database or disk is full");
    assert_eq!(store.inner().read(session_id, Seq(0)).await.unwrap().len(), 1);
    // The retry is the third call and goes through.
    store.append(&second).await.unwrap();
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap().len(), 2);
    assert_eq!(store.append_calls(), 3);
}

#[tokio::test]
async fn every_append_after_n_fails_until_healed() {
    let clock = FakeClock::new();
    let session_id = SeqIds::new().session_id();
    let store = FaultyStore::new(Arc::new(MemStore::new()));
    store.fail_appends_after(1, Fault::FsyncFailed);

    store.append(&[event(&clock, session_id, 1, note(1))]).await.unwrap();
    let second = [event(&clock, session_id, 2, note(2))];
    for _ in 0..3 {
        assert_eq!(backend_message(store.append(&second).await), Fault::FsyncFailed.message());
    }
    store.heal();
    store.append(&second).await.unwrap();
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap().len(), 2);
}

#[tokio::test]
async fn appends_of_a_kind_fail_like_a_crash_between_prepare_and_result() {
    let clock = FakeClock::new();
    let session_id = SeqIds::new().session_id();
    let store = FaultyStore::new(Arc::new(MemStore::new()));
    store.fail_appends_of_kind("tool_result", Fault::Io("disk I/O error".to_owned()));

    store.append(&[event(&clock, session_id, 1, note(1))]).await.unwrap();
    let result = EventKind::ToolResult {
        call_id: "c1".into(),
        attempt_id: None,
        tool: "bash".to_owned(),
        outcome: Outcome::Ok,
        content: String::new(),
        bytes: 0,
        raw: None,
    };
    let batch = [event(&clock, session_id, 2, note(2)), event(&clock, session_id, 3, result)];
    assert_eq!(backend_message(store.append(&batch).await), "disk I/O error");
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap().len(), 1, "the whole batch failed");
    store.append(&batch[..1]).await.unwrap();
}

#[tokio::test]
async fn other_operations_pass_through() {
    let store = FaultyStore::new(Arc::new(MemStore::new()));
    store.fail_appends_after(0, Fault::DiskFull);
    let session_id = SeqIds::new().session_id();
    store.request_cancel(session_id).await.unwrap();
    assert!(store.take_cancel_request(session_id).await.unwrap());
    assert!(store.sessions().await.unwrap().is_empty());
}
