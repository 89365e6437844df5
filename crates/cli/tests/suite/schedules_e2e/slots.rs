//! Every slot of a schedule fires at most once: across `kill -9` and restart of the host,
//! with two hosts on one PostgreSQL, with a catch-up window too large to keep, and beside a
//! stored schedule the host cannot read.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use keel_store::{FireRow, FireState, Schedules};
use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{
    add_every_second, every_second, fires, post_schedule, sessions, sqlite_schedules, tick_script,
};
use crate::suite::serve_e2e::harness::{Host, TOKEN, ledger, ledger_with};
use crate::suite::support::{Env, json_lines};

/// The slots of an every-1s schedule form one unbroken run, each with one row; every
/// `fired` row has exactly one `schedule_fired` event in the ledger, and no event lacks
/// its row.
fn check_each_slot_once(fires: &[FireRow], events: &[Value]) {
    let slots: Vec<i64> = fires.iter().map(|fire| fire.scheduled_at.timestamp_millis()).collect();
    for pair in slots.windows(2) {
        assert_eq!(pair[1] - pair[0], 1000, "slots are one second apart, none missing: {slots:?}");
    }
    let fired: BTreeSet<i64> = fires
        .iter()
        .filter(|fire| fire.state == FireState::Fired)
        .map(|fire| fire.scheduled_at.timestamp_millis())
        .collect();
    let recorded: Vec<i64> = events
        .iter()
        .filter(|event| event["kind"] == "schedule_fired")
        .map(|event| {
            chrono::DateTime::parse_from_rfc3339(event["scheduled_at"].as_str().unwrap())
                .unwrap()
                .timestamp_millis()
        })
        .collect();
    let unique: BTreeSet<i64> = recorded.iter().copied().collect();
    assert_eq!(unique.len(), recorded.len(), "a slot fired twice: {recorded:?}");
    assert!(
        fired.is_subset(&unique),
        "a fired slot has no schedule_fired: {fired:?} vs {unique:?}"
    );
    let newest = slots.last().copied();
    for slot in &unique {
        let row = fires.iter().find(|f| f.scheduled_at.timestamp_millis() == *slot).unwrap();
        // A host killed between the event and the settle leaves the row failed (or, for the
        // slot in flight when the last host was killed, claimed), never fired twice.
        let in_flight = row.state == FireState::Claimed && Some(*slot) == newest;
        assert!(matches!(row.state, FireState::Fired | FireState::Failed) || in_flight, "{row:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_every_1s_fires_each_slot_once_across_kill_9_and_restart() {
    let env = Env::new();
    let workspace = env.workspace();
    let model = tick_script(&env);
    let schedule = add_every_second(&env, &workspace, &model, &["--catch-up", "5s"], "tick");
    // No host yet: nothing fires without one, and adding needed none.
    assert!(sessions(&env, &[]).is_empty());

    let host = Host::start(&env, &[]);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    host.kill9();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let host = Host::start(&env, &[]);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let log = host.stderr();
    host.kill9();
    // Paused, then one more host start: whatever the killed host left claimed is recorded
    // failed (outcome unknown), and nothing fires again.
    assert_eq!(env.run(&["schedule", "pause", &schedule]).status.code(), Some(0));
    let host = Host::start(&env, &[]);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    host.kill9();

    let store = sqlite_schedules(&env);
    let fires = fires(&store, &schedule).await;
    assert!(fires.iter().all(|f| f.state.is_settled()), "an unsettled fire is left: {fires:?}");
    let mut events = Vec::new();
    for session in sessions(&env, &[]) {
        events.extend(ledger(&env, &session));
    }
    check_each_slot_once(&fires, &events);
    let fired = fires.iter().filter(|f| f.state == FireState::Fired).count();
    assert!(fired >= 4, "too few fires: {fires:?}\n{log}");
    // The slots of the outage were caught up once: fired or recorded skipped, never twice.
    assert!(
        fires.iter().any(|f| f.state == FireState::Skipped && f.detail.contains("caught up")),
        "{fires:?}"
    );
    // The list shows the schedule and its last fire.
    let listed = json_lines(&env.run(&["schedule", "list", "--json"]));
    assert_eq!(listed[0]["schedule_id"], schedule.as_str());
    assert!(listed[0]["last_fire"]["state"].is_string());
    // Paused, resumed and removed by prefix.
    assert_eq!(json_lines(&env.run(&["schedule", "list", "--json"]))[0]["paused"], true);
    assert_eq!(env.run(&["schedule", "resume", &schedule[..13]]).status.code(), Some(0));
    assert_eq!(json_lines(&env.run(&["schedule", "list", "--json"]))[0]["paused"], false);
    assert_eq!(env.run(&["schedule", "rm", &schedule]).status.code(), Some(0));
    assert!(json_lines(&env.run(&["schedule", "list", "--json"])).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_two_hosts_on_one_postgres_fire_each_slot_once() {
    let Some(server) = keel_testkit::postgres::PgServer::shared() else { return };
    let database = server.create_database();
    let url = database.url().to_owned();
    let vars = [("KEEL_DATABASE_URL", url.as_str())];
    let env = Env::new();
    let other = Env::new();
    let workspace = env.workspace();
    let model = tick_script(&env);
    let root = env.scratch.path().to_str().unwrap().to_owned();
    let first = Host::start_with_vars(&env, &[], &vars);
    let second = Host::start_with_vars(&other, &["--workspace-root", &root], &vars);
    let (a, b) = (first.client(), second.client());
    let mut spec = every_second(&workspace, &model);
    spec["overlap"] = json!("allow");
    let schedule = post_schedule(&a, spec).await;
    let (_, listed) = b.get("/v1/schedules").await;
    assert_eq!(listed[0]["schedule_id"], schedule.as_str(), "either host shows it");
    tokio::time::sleep(Duration::from_millis(3000)).await;
    // One host dies; the other goes on alone.
    first.kill9();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (status, _) = b.post(&format!("/v1/schedules/{schedule}"), json!({})).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    let removed = reqwest::Client::new()
        .delete(second.url(&format!("/v1/schedules/{schedule}")))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), StatusCode::OK);
    let log = second.stderr();
    second.kill9();

    let store: Arc<dyn Schedules> = Arc::new(keel_store::PgStore::connect(&url).await.unwrap());
    let fires = fires(&store, &schedule).await;
    let mut events = Vec::new();
    for session in sessions(&env, &vars) {
        events.extend(ledger_with(&env, &vars, &session));
    }
    check_each_slot_once(&fires, &events);
    let fired = fires.iter().filter(|f| f.state == FireState::Fired).count();
    assert!(fired >= 4, "too few fires: {fires:?}\n{log}");
    let holders: BTreeSet<&str> = fires.iter().map(|f| f.holder.as_str()).collect();
    assert!(!holders.is_empty());
}

/// A catch-up window beyond the representable is a 400 naming `"catch_up"`; one written
/// into the store behind the host's back (an older keel accepted it) neither stops the
/// schedule worker nor the schedule itself, and the neighbour schedule fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_catch_up_is_400_and_a_stored_one_stops_no_schedule() {
    let env = Env::new();
    let workspace = env.workspace();
    let model = tick_script(&env);
    let huge_id = add_every_second(&env, &workspace, &model, &[], "huge");
    {
        let db = rusqlite::Connection::open(env.home.path().join("keel.sqlite")).unwrap();
        let spec: String =
            db.query_row("SELECT spec FROM schedules", [], |row| row.get(0)).unwrap();
        let mut spec: Value = serde_json::from_str(&spec).unwrap();
        spec["catch_up_ms"] = json!(u64::MAX);
        let changed = db.execute("UPDATE schedules SET spec = ?1", [spec.to_string()]).unwrap();
        assert_eq!(changed, 1);
    }
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client
        .post(
            "/v1/schedules",
            json!({"every": "1s", "workspace": workspace, "model": model, "task": "x",
                   "catch_up": "10000000000000s"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("\"catch_up\""), "{body}");
    let tick_id = post_schedule(&client, every_second(&workspace, &model)).await;
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let log = host.stderr();
    host.kill9();
    assert!(!log.contains("panicked"), "{log}");
    let store = sqlite_schedules(&env);
    for id in [&huge_id, &tick_id] {
        let fired = fires(&store, id).await;
        assert!(fired.iter().any(|f| f.state == FireState::Fired), "{id}: {fired:?}");
    }
}

/// A stored schedule whose spec this keel cannot read (written by hand or another
/// version) is not skipped unsaid: `keel serve` warns once on stderr, naming it and why,
/// keeps ticking, and never panics. The neighbour: a good schedule beside it fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_warns_once_of_a_stored_schedule_it_cannot_read_and_fires_the_others() {
    let env = Env::new();
    let workspace = env.workspace();
    let store = sqlite_schedules(&env);
    let bad = keel_store::ScheduleRow {
        id: uuid::Uuid::now_v7(),
        created_at: chrono::Utc::now(),
        paused: false,
        spec: json!({"when": {"hourly": true}, "task": "never"}),
    };
    store.add_schedule(&bad).await.unwrap();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let model = format!(
        "scripted:{}",
        env.write_script("t.json", r#"{"steps":[{"text":"one"}]}"#).display()
    );
    let good = post_schedule(&client, every_second(&workspace, &model)).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while fires(&store, &good).await.is_empty() {
        assert!(Instant::now() < deadline, "the good schedule never fired: {}", host.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Several ticks (250 ms apart) have passed; the warning was given once.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let err = host.stderr();
    let warning = format!("keel serve: warning: schedule {} never fires: its stored spec", bad.id);
    assert_eq!(err.matches(&warning).count(), 1, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(fires(&store, &bad.id.to_string()).await.is_empty());
}
