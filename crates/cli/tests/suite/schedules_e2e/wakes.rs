//! A run parked on `wait` and its wake: `kill -9` at every step of park, wake and resume,
//! a wake over HTTP applied once, a deadline that passes, and `keel run`'s exit 3.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{hosted_wait, sessions, wait_results, wake, wake_id_of};
use crate::suite::serve_e2e::harness::{Host, TOKEN, ledger};
use crate::suite::support::{Env, events_of, stderr, stdout};

/// Starts `keel` with `args` and `KEEL_FAILPOINT=point`, waits for the marker, kills it.
fn kill_at(env: &Env, point: &str, args: &[&str]) {
    let mut child = env
        .keel()
        .env("KEEL_FAILPOINT", point)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            panic!("{point}: exited without reaching it: {seen}");
        }
        seen.push_str(&line);
        if line.starts_with("keel-failpoint-reached") {
            break;
        }
        assert!(Instant::now() < deadline, "{point}: not reached: {seen}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn wake_crash_at_every_step_of_park_wake_resume_applies_once_and_runs_nothing_twice() {
    let env = Env::new();
    let workspace = env.workspace();
    let ws = workspace.to_str().unwrap();
    let script = env.write_script(
        "wake.json",
        r#"{"steps":[
            {"text":"waiting","tool_calls":[{"name":"wait","arguments":{"event":"ci","timeout":"1h"}}]},
            {"text":"writing","expect":{"contains":"first payload"},
             "tool_calls":[{"name":"write_file","arguments":{"path":"out.txt","content":"once\n"}}]},
            {"text":"done"}
        ]}"#,
    );
    let model = format!("scripted:{}", script.display());

    // 1. Park, killed after run_suspended is durable: the wait survives the process.
    kill_at(
        &env,
        "after_terminal",
        &["run", "-C", ws, "-m", &model, "--approval", "auto", "wait for ci"],
    );
    let session = sessions(&env, &[]).remove(0);
    let events = ledger(&env, &session);
    assert_eq!(events.last().unwrap()["kind"], "run_suspended");
    assert_eq!(events.last().unwrap()["reason"], "waiting");
    let wake_id = wake_id_of(&events);
    // `keel resume` is not a wake.
    let resumed = env.run(&["resume", &session]);
    assert_eq!(resumed.status.code(), Some(2), "{}", stderr(&resumed));
    assert!(stderr(&resumed).contains(&wake_id), "{}", stderr(&resumed));

    // 2. The wake is recorded, then `keel wake` is killed before it resumes anything.
    kill_at(&env, "wake_claimed", &["wake", &wake_id, "first payload"]);
    assert_eq!(ledger(&env, &session), events, "nothing applied yet");

    // 3. The resumed run is killed after its write is prepared (before the tool runs).
    kill_at(&env, "after_prepare", &["wake", &wake_id, "second payload", "--approval", "auto"]);
    let events = ledger(&env, &session);
    let results = wait_results(&events);
    assert_eq!(results.len(), 1, "the wake applied once");
    let content = results[0]["content"].as_str().unwrap();
    assert!(content.contains("first payload") && !content.contains("second"), "{content}");
    // Already applied: again, the first result, nothing appended.
    let again = env.run(&["wake", &wake_id, "third payload"]);
    assert_eq!(again.status.code(), Some(0), "{}", stderr(&again));
    assert!(stdout(&again).contains("already woken (cli)"), "{}", stdout(&again));
    assert_eq!(ledger(&env, &session), events);

    // 4. The interrupted run is an ordinary one: closed, the write never replayed.
    let finished = env.run(&["resume", &session, "--approval", "auto"]);
    assert_eq!(finished.status.code(), Some(0), "{}", stderr(&finished));
    let events = ledger(&env, &session);
    assert_eq!(wait_results(&events).len(), 1);
    let writes: Vec<&Value> =
        events.iter().filter(|e| e["kind"] == "tool_result" && e["tool"] == "write_file").collect();
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(writes[0]["outcome"], "indeterminate");
    assert!(!workspace.join("out.txt").exists(), "the write never ran (killed before it)");
    let started = events_of(&events, "run_started");
    assert_eq!(started.len(), 3, "park, wake, resume: one run each");
}

#[test]
fn wait_killed_before_it_parks_is_closed_and_the_turn_goes_on() {
    let env = Env::new();
    let ws = env.workspace();
    let script = env.write_script(
        "park.json",
        r#"{"steps":[
            {"tool_calls":[{"name":"wait","arguments":{"event":"x","timeout":60}}]},
            {"text":"went on","expect":{"last_outcomes":["cancelled"]}}
        ]}"#,
    );
    let model = format!("scripted:{}", script.display());
    kill_at(&env, "before_terminal", &["run", "-C", ws.to_str().unwrap(), "-m", &model, "park"]);
    let session = sessions(&env, &[]).remove(0);
    let resumed = env.run(&["resume", &session]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    let events = ledger(&env, &session);
    let results = wait_results(&events);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["outcome"], "cancelled", "never dispatched, answered once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_wake_resumes_the_run_once_and_again_answers_the_first_result() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (session, wake_id) = hosted_wait(&env, &client, "1h", "deployed").await;
    let (status, first) = wake(&client, &wake_id, "v2 is live").await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["payload"], "v2 is live");
    client.wait_state(&session, "completed").await;
    let (status, again) = wake(&client, &wake_id, "other").await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again, first, "the first payload wins");
    let events = ledger(&env, &session);
    let results = wait_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0]["content"].as_str().unwrap().contains("v2 is live"));
    assert_eq!(events.iter().filter(|e| e["kind"] == "run_started").count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_wait_whose_deadline_passes_resumes_with_timed_out() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (session, _) = hosted_wait(&env, &client, "1s", "gave up").await;
    client.wait_state(&session, "completed").await;
    let events = ledger(&env, &session);
    let results = wait_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0]["content"].as_str().unwrap().starts_with("timed out"), "{}", results[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_a_wake_claimed_by_a_killed_host_is_applied_once_after_restart() {
    let env = Env::new();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (session, wake_id) = hosted_wait(&env, &client, "1h", "after restart").await;
    host.kill9();
    let host = Host::start_with_vars(&env, &[], &[("KEEL_FAILPOINT", "wake_claimed")]);
    let request = reqwest::Client::new()
        .post(host.url(&format!("/v1/wakes/{wake_id}")))
        .bearer_auth(TOKEN)
        .json(&json!({"payload": "before the crash"}))
        .timeout(Duration::from_secs(2))
        .send()
        .await;
    assert!(request.is_err(), "the host stops at wake_claimed");
    host.kill9();
    assert_eq!(ledger(&env, &session).last().unwrap()["kind"], "run_suspended");
    // A new host finds the delivered wake and applies it, once, with the first payload.
    let host = Host::start(&env, &[]);
    let client = host.client();
    client.wait_state(&session, "completed").await;
    let (status, again) = wake(&client, &wake_id, "late").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["payload"], "before the crash");
    let events = ledger(&env, &session);
    let results = wait_results(&events);
    assert_eq!(results.len(), 1);
    assert!(results[0]["content"].as_str().unwrap().contains("before the crash"));
}

#[test]
fn a_parked_keel_run_exits_3_and_names_its_wake_and_bad_schedules_are_usage_errors() {
    let env = Env::new();
    let ws = env.workspace();
    let script = env.write_script(
        "park.json",
        r#"{"steps":[{"tool_calls":[{"name":"wait","arguments":{"event":"x","timeout":60}}]},{"text":"woke"}]}"#,
    );
    let model = format!("scripted:{}", script.display());
    let parked = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "park"]);
    assert_eq!(parked.status.code(), Some(3), "{}", stderr(&parked));
    let shown = format!("{}{}", stdout(&parked), stderr(&parked));
    assert!(shown.contains("keel wake wake_"), "{shown}");
    // The hint is the wake, never `keel resume` (which refuses a waiting run).
    assert!(!shown.contains("continue with `keel resume"), "{shown}");
    // The deadline is RFC 3339 to the second, in UTC: `until 2026-03-01T10:05:00Z —`.
    let deadline = stderr(&parked)
        .lines()
        .find_map(|line| line.split_once("waiting for x until ").map(|(_, rest)| rest.to_owned()))
        .and_then(|rest| rest.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| panic!("no deadline in {}", stderr(&parked)));
    assert_eq!(deadline.len(), "2026-03-01T10:05:00Z".len(), "{deadline}");
    assert!(chrono::DateTime::parse_from_rfc3339(&deadline).is_ok(), "{deadline}");
    assert!(deadline.ends_with('Z'), "{deadline}");
    let session = sessions(&env, &[]).remove(0);
    let wake_id = wake_id_of(&ledger(&env, &session));
    let woken = env.run(&["wake", &wake_id, "go"]);
    assert_eq!(woken.status.code(), Some(0), "{}", stderr(&woken));
    assert_eq!(stdout(&woken).trim(), "woke");
    // The woken run shows the session's header, as `keel run` and `keel resume` do.
    let header = stderr(&parked).lines().next().unwrap_or_default().to_owned();
    assert!(header.starts_with("keel session "), "{header}");
    assert_eq!(stderr(&woken).lines().next(), Some(header.as_str()), "{}", stderr(&woken));
    for bad in [
        vec!["schedule", "add", "--cron", "61 * * * *", "--session", &session, "x"],
        vec![
            "schedule",
            "add",
            "--cron",
            "* * * * *",
            "--tz",
            "Mars/Base",
            "--session",
            &session,
            "x",
        ],
        vec!["schedule", "add", "--every", "100ms", "--session", &session, "x"],
        vec!["schedule", "add", "--every", "1s", "--session", "nope", "x"],
        vec!["wake", "wake_nothing_here"],
    ] {
        let output = env.run(&bad);
        assert_eq!(output.status.code(), Some(2), "{bad:?}: {}", stderr(&output));
    }
}
