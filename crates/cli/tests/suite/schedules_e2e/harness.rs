//! The harness of the schedules suite: hosts come from the `keel serve` harness; here are
//! the schedules made over HTTP and with `keel schedule add`, their fires as the store
//! keeps them, the sessions a keel lists, and runs parked on `wait`.

use std::path::Path;
use std::sync::Arc;

use keel_store::{FireRow, Schedules};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::suite::serve_e2e::harness::{Client, ledger};
use crate::suite::support::{Env, json_lines, stderr, stdout};

/// The `scripted:` model that answers "tick" once.
pub(super) fn tick_script(env: &Env) -> String {
    let path = env.write_script("tick.json", r#"{"steps":[{"text":"tick"}]}"#);
    format!("scripted:{}", path.display())
}

/// The spec of a schedule firing every second into a new session of `model` in
/// `workspace`, with the task "tick".
pub(super) fn every_second(workspace: &Path, model: &str) -> Value {
    json!({"every": "1s", "workspace": workspace, "model": model, "task": "tick"})
}

/// Posts `spec` to `/v1/schedules`; the new schedule's id.
pub(super) async fn post_schedule(client: &Client, spec: Value) -> String {
    let (status, body) = client.post("/v1/schedules", spec).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["schedule_id"].as_str().unwrap().to_owned()
}

/// `keel schedule add --every 1s -C WORKSPACE -m MODEL [EXTRA…] TASK`; the new schedule's id.
pub(super) fn add_every_second(
    env: &Env,
    workspace: &Path,
    model: &str,
    extra: &[&str],
    task: &str,
) -> String {
    let mut args = vec!["schedule", "add", "--every", "1s", "-C"];
    args.extend([workspace.to_str().unwrap(), "-m", model]);
    args.extend_from_slice(extra);
    args.push(task);
    let added = env.run(&args);
    assert_eq!(added.status.code(), Some(0), "{}", stderr(&added));
    stdout(&added).trim().to_owned()
}

/// The schedules of the SQLite ledger in KEEL_HOME.
pub(super) fn sqlite_schedules(env: &Env) -> Arc<dyn Schedules> {
    Arc::new(keel_store::SqliteStore::open(env.home.path().join("keel.sqlite")).unwrap())
}

/// Every fire of a schedule, oldest first.
pub(super) async fn fires(store: &Arc<dyn Schedules>, schedule: &str) -> Vec<FireRow> {
    let id = uuid::Uuid::parse_str(schedule).unwrap();
    let mut fires = store.fires(id, 10_000).await.unwrap();
    fires.reverse();
    fires
}

/// The ids of the sessions `keel sessions` lists, read with `vars` in its environment.
pub(super) fn sessions(env: &Env, vars: &[(&str, &str)]) -> Vec<String> {
    let output = env.keel().envs(vars.iter().copied()).args(["sessions", "--json"]).output();
    json_lines(&output.unwrap())
        .iter()
        .map(|row| row["session_id"].as_str().unwrap().to_owned())
        .collect()
}

/// The wake id of the last `wait` the events started.
pub(super) fn wake_id_of(events: &[Value]) -> String {
    events.iter().rev().find(|e| e["kind"] == "wait_started").unwrap()["wake_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// The results of the `wait` calls among the events.
pub(super) fn wait_results(events: &[Value]) -> Vec<&Value> {
    events.iter().filter(|e| e["kind"] == "tool_result" && e["tool"] == "wait").collect()
}

/// Creates a session of the scripted model `script` in `workspace`, with the approval the
/// host gives when none is asked for; its id.
pub(super) async fn create_session(client: &Client, workspace: &Path, script: &Path) -> String {
    let (status, body) = client
        .post(
            "/v1/sessions",
            json!({"workspace": workspace, "model": format!("scripted:{}", script.display())}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

/// Posts a wake with `payload` to `/v1/wakes/WAKE_ID`.
pub(super) async fn wake(client: &Client, wake_id: &str, payload: &str) -> (StatusCode, Value) {
    client.post(&format!("/v1/wakes/{wake_id}"), json!({"payload": payload})).await
}

/// A hosted session whose run parks on `wait`; returns (session, wake id).
pub(super) async fn hosted_wait(
    env: &Env,
    client: &Client,
    timeout: &str,
    then: &str,
) -> (String, String) {
    let workspace = env.workspace();
    let script = env.write_script(
        &format!("hosted-{timeout}.json"),
        &json!({"steps": [
            {"tool_calls": [{"name": "wait", "arguments": {"event": "deploy", "timeout": timeout}}]},
            {"text": then}
        ]})
        .to_string(),
    );
    let session = create_session(client, &workspace, &script).await;
    client.turn(&session, "go").await;
    client.wait_state(&session, "suspended").await;
    let wake_id = wake_id_of(&ledger(env, &session));
    (session, wake_id)
}
