//! Schedules, fires and wakes on both backends (SQLite file, PostgreSQL): a slot is
//! claimed once however many handles race for it, a settled fire never changes, the first
//! wake payload wins.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use keel_contracts::SessionId;
use keel_store::{FireRow, FireState, PgStore, ScheduleRow, Schedules, SqliteStore, WakeRow};
use keel_testkit::postgres::PgServer;
use uuid::Uuid;

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(1_800_000_000_000 + ms).unwrap()
}

fn fire(schedule_id: Uuid, slot: i64, holder: &str) -> FireRow {
    FireRow {
        schedule_id,
        scheduled_at: at(slot),
        holder: holder.to_owned(),
        claimed_at: at(slot + 5),
        state: FireState::Claimed,
        session_id: None,
        detail: String::new(),
    }
}

/// The same checks for any backend, with `handles` open on one database.
async fn check(handles: Vec<Arc<dyn Schedules>>) {
    let first = handles[0].clone();
    let id = Uuid::now_v7();
    let row = ScheduleRow {
        id,
        created_at: at(0),
        paused: false,
        spec: serde_json::json!({"every_ms": 1000, "task": "tick \u{0} nul"}),
    };
    first.add_schedule(&row).await.unwrap();
    assert!(first.add_schedule(&row).await.is_err(), "an id is stored once");
    assert_eq!(handles[1].schedules().await.unwrap(), vec![row.clone()]);
    assert!(first.set_schedule_paused(id, true).await.unwrap());
    assert!(handles[1].schedules().await.unwrap()[0].paused);
    assert!(!first.set_schedule_paused(Uuid::now_v7(), true).await.unwrap());

    // Every handle races for the same 20 slots: each slot is won exactly once.
    let mut tasks = Vec::new();
    for (n, handle) in handles.iter().enumerate() {
        let handle = handle.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for slot in 0..20 {
                if handle.claim_fire(&fire(id, slot * 1000, &format!("h{n}"))).await.unwrap() {
                    won.push(slot);
                }
            }
            won
        }));
    }
    let mut won: Vec<i64> = Vec::new();
    for task in tasks {
        won.extend(task.await.unwrap());
    }
    won.sort_unstable();
    assert_eq!(won, (0..20).collect::<Vec<_>>(), "each slot claimed once");

    assert_eq!(first.unsettled_fires().await.unwrap().len(), 20);
    let session = SessionId(Uuid::now_v7());
    assert!(first.settle_fire(id, at(0), FireState::Fired, Some(session), "").await.unwrap());
    // Settled is final: a second settle (another host's recovery, say) changes nothing.
    assert!(!handles[1].settle_fire(id, at(0), FireState::Failed, None, "late").await.unwrap());
    let fires = first.fires(id, 100).await.unwrap();
    assert_eq!(fires.len(), 20);
    assert_eq!(fires[0].scheduled_at, at(19_000), "newest first");
    let oldest = fires.last().unwrap();
    assert_eq!(
        (oldest.state, oldest.session_id, oldest.detail.as_str()),
        (FireState::Fired, Some(session), "")
    );
    assert_eq!(first.fires(id, 3).await.unwrap().len(), 3);
    assert_eq!(first.unsettled_fires().await.unwrap().len(), 19);

    assert!(first.remove_schedule(id).await.unwrap());
    assert!(first.schedules().await.unwrap().is_empty());
    assert!(!first.remove_schedule(id).await.unwrap());
    assert_eq!(first.fires(id, 100).await.unwrap().len(), 20, "fires stay as history");

    // Wakes: the first payload wins, whoever asks again gets it back.
    let wake = |payload: &str, by: &str| WakeRow {
        wake_id: "wake-1".to_owned(),
        session_id: session,
        payload: Some(payload.to_owned()),
        by: by.to_owned(),
        received_at: at(1),
    };
    assert_eq!(first.wake("wake-1").await.unwrap(), None);
    let stored = first.claim_wake(&wake("first \u{0} payload", "http")).await.unwrap();
    assert_eq!(stored.payload.as_deref(), Some("first \u{0} payload"));
    let again = handles[1].claim_wake(&wake("second", "cli")).await.unwrap();
    assert_eq!(again, stored);
    let timed_out = WakeRow { wake_id: "wake-2".into(), payload: None, ..wake("", "deadline") };
    assert_eq!(first.claim_wake(&timed_out).await.unwrap().payload, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_schedules_claim_each_slot_once_across_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sqlite");
    let handles: Vec<Arc<dyn Schedules>> =
        (0..3).map(|_| Arc::new(SqliteStore::open(&path).unwrap()) as Arc<dyn Schedules>).collect();
    check(handles).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_schedules_claim_each_slot_once_across_handles() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let mut handles: Vec<Arc<dyn Schedules>> = Vec::new();
    for _ in 0..3 {
        handles.push(Arc::new(PgStore::connect(database.url()).await.unwrap()));
    }
    check(handles).await;
}
