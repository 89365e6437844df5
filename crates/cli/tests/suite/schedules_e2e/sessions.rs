//! Schedules into an existing session: each fire a turn of it, admission checked at every
//! fire, and a session waiting on a wake skipped.

use std::time::Duration;

use keel_store::{FireRow, FireState};
use reqwest::StatusCode;
use serde_json::json;

use super::harness::{
    create_session, fires, hosted_wait, post_schedule, sqlite_schedules, wait_results, wake,
};
use crate::suite::serve_e2e::harness::{Host, ledger};
use crate::suite::support::Env;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedule_into_a_session_fires_turns_and_admission_is_checked_at_every_fire() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = env.write_script(
        "turns.json",
        r#"{"steps":[{"text":"one"},{"text":"two"},{"text":"three"},{"text":"four"},{"text":"five"}]}"#,
    );
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = create_session(&client, &workspace, &script).await;
    // A session's fires use its own approval: a schedule cannot choose another.
    let (status, body) = client
        .post(
            "/v1/schedules",
            json!({"every": "1s", "session_id": session, "task": "again", "approval": "auto"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // A cron that never fires (30 February) is refused, naming it.
    let (status, body) = client
        .post(
            "/v1/schedules",
            json!({"cron": "0 0 30 2 *", "session_id": session, "task": "again"}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("\"cron\" \"0 0 30 2 *\" never fires"), "{body}");
    let schedule =
        post_schedule(&client, json!({"every": "1s", "session_id": session, "task": "again"}))
            .await;
    // A cost budget for a model without a known price is refused at fire time.
    let priced = post_schedule(
        &client,
        json!({"every": "1s", "workspace": workspace, "model": format!("scripted:{}", script.display()),
               "task": "priced", "max_cost_usd": 0.5}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(2600)).await;
    // Sealed: every later fire is refused with that reason.
    let (status, _) = client.post(&format!("/v1/sessions/{session}/seal"), json!({})).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    host.kill9();

    let store = sqlite_schedules(&env);
    let fires = fires(&store, &schedule).await;
    let events = ledger(&env, &session);
    let fired: Vec<&FireRow> = fires.iter().filter(|f| f.state == FireState::Fired).collect();
    assert!(fired.len() >= 2, "{fires:?}");
    assert!(fired.iter().all(|f| f.session_id.map(|s| s.to_string()) == Some(session.clone())));
    // Each fire: `schedule_fired`, then its turn.
    let kinds: Vec<&str> = events.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    for (index, kind) in kinds.iter().enumerate() {
        if *kind == "schedule_fired"
            && index + 1 < kinds.len()
            && kinds[index + 1] != "session_sealed"
        {
            assert_eq!(kinds[index + 1], "turn_started", "{kinds:?}");
        }
    }
    assert_eq!(
        kinds.iter().filter(|k| **k == "schedule_fired").count(),
        fired.len() + fires.iter().filter(|f| f.state == FireState::Failed).count()
    );
    // The kill -9 may land between a fire's claim and its decision: that fire stays
    // claimed (the next host's recovery closes it). The last one decided was refused.
    let last = fires.iter().rev().find(|f| f.state != FireState::Claimed).unwrap();
    assert_eq!(last.state, FireState::Refused, "{fires:?}");
    assert!(last.detail.contains("sealed"), "{}", last.detail);
    assert!(fires.iter().filter(|f| f.state == FireState::Claimed).count() <= 1, "{fires:?}");
    let priced = self::fires(&store, &priced).await;
    assert!(!priced.is_empty());
    assert!(
        priced.iter().all(|f| f.state == FireState::Refused && f.detail.contains("price")),
        "{priced:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_into_a_waiting_session_skips_and_never_ends_the_wait() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (session, wake_id) = hosted_wait(&env, &client, "1h", "woken").await;
    let schedule =
        post_schedule(&client, json!({"every": "1s", "session_id": session, "task": "poke"})).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let events = ledger(&env, &session);
    assert_eq!(events.last().unwrap()["kind"], "run_suspended", "still parked");
    assert!(!events.iter().any(|e| e["kind"] == "schedule_fired"));
    let (status, _) = wake(&client, &wake_id, "now").await;
    assert_eq!(status, StatusCode::OK);
    client.wait_state(&session, "completed").await;
    host.kill9();
    let store = sqlite_schedules(&env);
    let fires = fires(&store, &schedule).await;
    assert!(
        fires.iter().any(|f| f.state == FireState::Skipped && f.detail.contains("overlap")),
        "{fires:?}"
    );
    let results = wait_results(&ledger(&env, &session)).len();
    assert_eq!(results, 1);
}
