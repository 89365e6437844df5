//! The JSON-lines sink holds each session's events, in order, exactly as stored.

use std::sync::Arc;

use keel_outbox::{JsonlSink, Mirror, SinkName};
use keel_testkit::{FakeClock, MemStore};

use super::support::{fast_config, file_lines, record, session, store_arc, stored_lines};

#[tokio::test]
async fn flush_delivers_every_event_of_the_session_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log/events.jsonl");
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let (first, second) = (session(1), session(2));
    record(&store, &clock, first, 1, 1200).await;
    record(&store, &clock, second, 1, 3).await;
    let mirror = Mirror::start(
        store_arc(&store),
        vec![(SinkName::new("audit").unwrap(), Arc::new(JsonlSink::new(path.clone())))],
        fast_config(&dir.path().join("outbox"), clock.clone()),
    )
    .unwrap();

    // More than one batch (1000 events per append), and only the flushed session.
    assert!(mirror.flush(first).await.is_empty());
    let lines = file_lines(&path);
    let first_lines = stored_lines(&store, first).await;
    let second_lines = stored_lines(&store, second).await;
    assert!(lines.starts_with(&first_lines), "the first session, whole and in order");

    // Later events follow; nothing is delivered twice.
    record(&store, &clock, first, 1201, 1203).await;
    assert!(mirror.flush(first).await.is_empty());
    assert!(mirror.flush(second).await.is_empty());
    let lines = file_lines(&path);
    let first_lines = stored_lines(&store, first).await;
    let mut of_first: Vec<&String> = Vec::new();
    let mut of_second: Vec<&String> = Vec::new();
    for line in &lines {
        let value: serde_json::Value = serde_json::from_str(line).unwrap();
        if value["session_id"] == first.to_string() {
            of_first.push(line);
        } else {
            of_second.push(line);
        }
    }
    assert_eq!(of_first, first_lines.iter().collect::<Vec<_>>());
    assert_eq!(of_second, second_lines.iter().collect::<Vec<_>>());
}

#[tokio::test]
async fn notified_events_are_delivered_in_the_background() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let mirror = Mirror::start(
        store_arc(&store),
        vec![(SinkName::new("audit").unwrap(), Arc::new(JsonlSink::new(path.clone())))],
        fast_config(&dir.path().join("outbox"), clock.clone()),
    )
    .unwrap();
    let id = session(7);
    for seq in 1..=5 {
        record(&store, &clock, id, seq, seq).await;
        mirror.notify(id, keel_contracts::Seq(seq));
    }
    let expected = stored_lines(&store, id).await;
    super::support::eventually("five lines", || file_lines(&path) == expected).await;
}
