//! A mirror restarted over the same cursor folder resumes where the last one stopped: no
//! event lost, none delivered again.

use std::sync::Arc;

use keel_contracts::Seq;
use keel_outbox::{JsonlSink, Mirror, Sink, SinkName};
use keel_testkit::{FakeClock, MemStore};

use super::support::{
    eventually, fast_config, file_lines, record, session, store_arc, stored_lines,
};

fn sinks(path: &std::path::Path) -> Vec<(SinkName, Arc<dyn Sink>)> {
    vec![(SinkName::new("audit").unwrap(), Arc::new(JsonlSink::new(path.to_path_buf())))]
}

#[tokio::test]
async fn a_restarted_mirror_resumes_from_its_cursor_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let cursors = dir.path().join("outbox");
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let id = session(1);

    let mirror =
        Mirror::start(store_arc(&store), sinks(&path), fast_config(&cursors, clock.clone()))
            .unwrap();
    record(&store, &clock, id, 1, 5).await;
    assert!(mirror.flush(id).await.is_empty());
    drop(mirror);
    let cursor: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cursors.join("audit.json")).unwrap())
            .unwrap();
    assert_eq!(cursor["sessions"][id.to_string()], 5);
    assert_eq!(cursor["version"], 1);

    // Recorded while no mirror ran; a flush of the next one sends just these.
    record(&store, &clock, id, 6, 9).await;
    let mirror =
        Mirror::start(store_arc(&store), sinks(&path), fast_config(&cursors, clock.clone()))
            .unwrap();
    assert!(mirror.flush(id).await.is_empty());
    assert_eq!(file_lines(&path), stored_lines(&store, id).await);
    drop(mirror);

    // Without a flush or a notification, the next mirror catches up on its own: the
    // session is not running and its cursor is behind.
    record(&store, &clock, id, 10, 12).await;
    let _mirror =
        Mirror::start(store_arc(&store), sinks(&path), fast_config(&cursors, clock.clone()))
            .unwrap();
    let expected = stored_lines(&store, id).await;
    eventually("the catch-up", || file_lines(&path) == expected).await;
}

#[tokio::test]
async fn sessions_never_delivered_are_caught_up_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.jsonl");
    let cursors = dir.path().join("outbox");
    let store = MemStore::new();
    let clock = Arc::new(FakeClock::new());
    let (before, during) = (session(1), session(2));
    // A session from before the sink was set up is not the sink's business...
    record(&store, &clock, before, 1, 2).await;
    let mirror =
        Mirror::start(store_arc(&store), sinks(&path), fast_config(&cursors, clock.clone()))
            .unwrap();
    // ...one recorded by a process that died before delivering anything is.
    record(&store, &clock, during, 1, 3).await;
    drop(mirror);
    assert!(file_lines(&path).is_empty());

    let mirror =
        Mirror::start(store_arc(&store), sinks(&path), fast_config(&cursors, clock.clone()))
            .unwrap();
    let expected = stored_lines(&store, during).await;
    eventually("the catch-up", || file_lines(&path) == expected).await;
    // Touching the old session (a resume) mirrors it whole.
    record(&store, &clock, before, 3, 3).await;
    mirror.notify(before, Seq(3));
    let mut expected = expected;
    expected.extend(stored_lines(&store, before).await);
    eventually("the old session", || file_lines(&path) == expected).await;
}
