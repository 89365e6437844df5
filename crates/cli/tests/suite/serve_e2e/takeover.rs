//! `kill -9` of the host, or of a `keel run`, and what the next host makes of the dead
//! process's run: asked again, taken over, closed, or listed as interrupted.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::harness::{Host, assert_frames_are_the_ledger, ledger, question_script, write_script};
use crate::suite::support::{Env, events_of, stdout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_with_a_pending_approval_then_restart_asks_again() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "crash.json", &["e.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write e").await;
    let before = client.pending(&session).await;
    host.kill9();

    let host = Host::start(&env, &[]);
    let client = host.client();
    // The restarted host asks again (a newer request for the same call), never cancels it.
    let asked = before["requested_seq"].as_u64();
    let after = client.pending_after(&session, asked, Duration::from_secs(30)).await;
    assert_eq!(after["call_id"], before["call_id"]);
    let call = after["call_id"].as_str().unwrap();
    let (status, body) = client.answer(&session, call, "allow_once").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    client.wait_state(&session, "completed").await;
    assert_eq!(std::fs::read_to_string(workspace.join("e.txt")).unwrap(), "e.txt\n");
    let ledger = ledger(&env, &session);
    let results = events_of(&ledger, "tool_result");
    assert_eq!(results.len(), 1, "the call got exactly one result");
    assert_eq!(results[0]["outcome"], "ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_an_answer_right_after_a_restart_is_kept_and_the_dead_hosts_run_taken_over() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "window.json", &["w.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "write w").await;
    let before = client.pending(&session).await;
    let call = before["call_id"].as_str().unwrap().to_owned();
    // Killed and not reaped (a zombie, as under a parent that has not waited yet): its pid
    // still exists, yet it is provably dead.
    let mut dead = host;
    dead.child.kill().unwrap();
    let stat_path = format!("/proc/{}/stat", dead.child.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&stat_path).unwrap_or_default().contains(") Z") {
        assert!(Instant::now() < deadline, "the killed host never became a zombie");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Answered at once: the new host takes the dead one's run over at boot (its lease is
    // still the dead process's), not after the lease lapses, and keeps the answer.
    let restarted = Instant::now();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let (status, body) = client.answer(&session, &call, "allow_once").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["by"], "remote (keel serve)");
    client.wait_state(&session, "completed").await;
    assert!(
        restarted.elapsed() < Duration::from_secs(8),
        "took {:?}: the dead host's lease was waited out",
        restarted.elapsed()
    );
    assert_eq!(std::fs::read_to_string(workspace.join("w.txt")).unwrap(), "w.txt\n");
    let ledger = ledger(&env, &session);
    let results = events_of(&ledger, "tool_result");
    assert_eq!(results.len(), 1, "the call got exactly one result");
    assert_eq!(results[0]["outcome"], "ok");
    let settled = events_of(&ledger, "permission_settled");
    assert_eq!(settled.len(), 1, "one answer recorded");
    assert_eq!(settled[0]["answer"], "allow_once");
    drop(dead);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_mid_stream_then_reconnect_loses_and_repeats_nothing() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "stream.json", &["f.txt", "g.txt"]);
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    let mut sse = client.events(&session, None).await;
    client.turn(&session, "write f and g").await;
    let mut frames = Vec::new();
    assert!(sse.until("permission_requested", &mut frames).await);
    host.kill9();
    // The stream breaks with the host.
    while sse.next().await.is_some() {}

    let host = Host::start(&env, &[]);
    let client = host.client();
    let last = frames.last().and_then(|frame| frame.id);
    let mut sse = client.events(&session, last).await;
    for _ in 0..2 {
        // Each request (the one asked again after the restart, then the next call's).
        let pending = client.pending_after(&session, last, Duration::from_secs(30)).await;
        let call = pending["call_id"].as_str().unwrap();
        let (status, body) = client.answer(&session, call, "allow_once").await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert!(sse.until("run_completed", &mut frames).await);
    assert_frames_are_the_ledger(&frames, &ledger(&env, &session));
    assert!(workspace.join("f.txt").exists() && workspace.join("g.txt").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_kill_9_with_a_pending_question_then_restart_records_it_cancelled() {
    let env = Env::new();
    let workspace = env.workspace();
    let script = question_script(&env, "k.json", json!({}), "done");
    let host = Host::start(&env, &[]);
    let client = host.client();
    let session = client.create(&workspace, &script, "ask").await;
    client.turn(&session, "ask").await;
    let before = client.question(&session).await;
    host.kill9();

    // The MCP request died with the host: the restarted host closes the dead run and
    // records the question as cancelled (a later ask of the resumed run times out fast).
    let host = Host::start(&env, &["--approval-timeout", "2s"]);
    let client = host.client();
    let deadline = Instant::now() + Duration::from_secs(60);
    let cancelled = loop {
        let ledger = ledger(&env, &session);
        let found = ledger
            .iter()
            .find(|e| e["kind"] == "elicitation_answered" && e["question"] == before["question"]);
        if let Some(found) = found {
            break found.clone();
        }
        assert!(Instant::now() < deadline, "the open question was never closed");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(cancelled["action"], "cancel", "{cancelled}");
    assert_eq!(cancelled["by"], "keel", "{cancelled}");
    assert!(cancelled["reason"].as_str().unwrap().starts_with("keel stopped"), "{cancelled}");
    drop(client);
}

/// A `keel run --approval auto` writing q.txt then r.txt, stopped at a failpoint after its
/// first result (q.txt written): the process lives until the caller kills it.
fn run_stopped_after_its_first_result(env: &Env, workspace: &Path) -> Child {
    let script = write_script(env, "killed.json", &["q.txt", "r.txt"]);
    let mut run = env
        .keel()
        .env("KEEL_FAILPOINT", "after_result")
        .args(["run", "-C", workspace.to_str().unwrap(), "--approval", "auto", "-m"])
        .arg(format!("scripted:{}", script.display()))
        .arg("write q and r")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(run.stderr.take().unwrap()).lines();
    assert!(lines.any(|line| line.unwrap().starts_with("keel-failpoint-reached")));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redteam_host_a_killed_keel_run_with_approval_auto_is_closed_not_resumed() {
    let env = Env::new();
    let workspace = env.workspace();
    // A `keel run --approval auto`, killed by its user mid-run (after its first result).
    let mut run = run_stopped_after_its_first_result(&env, &workspace);
    run.kill().unwrap();
    run.wait().unwrap();
    assert!(workspace.join("q.txt").exists() && !workspace.join("r.txt").exists());

    let host = Host::start(&env, &[]);
    let client = host.client();
    let (_, list) = client.get("/v1/sessions").await;
    let session = list["sessions"][0]["id"].as_str().unwrap().to_owned();
    // The host closes the dead run but does not bring it back in the background.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host.stderr().contains("not resumed here") {
        assert!(Instant::now() < deadline, "{}", host.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let ledger = ledger(&env, &session);
    assert_eq!(ledger.iter().filter(|e| e["kind"] == "run_started").count(), 1);
    assert_eq!(ledger.last().unwrap()["kind"], "run_failed");
    assert!(!workspace.join("r.txt").exists());
    // The neighbour: asked to, the host resumes it.
    let (status, body) = client.post(&format!("/v1/sessions/{session}/resume"), json!({})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    client.wait_state(&session, "completed").await;
    assert!(workspace.join("r.txt").exists());
}

/// The HTTP listing names a killed `keel run` as `keel sessions` does: `interrupted`, not
/// `running` (no live process holds its lease). The neighbour: while its process lives
/// (stopped at a failpoint), the same session is `running` in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lists_a_killed_keel_run_as_interrupted_like_keel_sessions() {
    let env = Env::new();
    let workspace = env.workspace();
    let host = Host::start(&env, &[]);
    let client = host.client();
    let mut run = run_stopped_after_its_first_result(&env, &workspace);
    let cli_state = || {
        let listed = stdout(&env.run(&["sessions", "--json"]));
        let row: Value = serde_json::from_str(listed.trim()).unwrap();
        row["state"].as_str().unwrap().to_owned()
    };
    let (_, list) = client.get("/v1/sessions").await;
    let session = list["sessions"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(list["sessions"][0]["state"], "running", "{list}");
    assert_eq!(cli_state(), "running");
    run.kill().unwrap();
    run.wait().unwrap();

    let (status, one) = client.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    let (_, list) = client.get("/v1/sessions").await;
    let listed = &list["sessions"][0]["state"];
    if one["state"] == "interrupted" {
        assert_eq!(listed, "interrupted", "{list}");
        assert_eq!(cli_state(), "interrupted");
    } else {
        // The host's takeover check (every 10 s) may close the dead run first: then it is
        // closed (`failed`) everywhere, and the host says it closed it. Never `running`.
        let deadline = Instant::now() + Duration::from_secs(5);
        let note = format!("closed the interrupted run of session {session}");
        while !host.stderr().contains(&note) {
            assert!(Instant::now() < deadline, "{one} / {}", host.stderr());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(one["state"], "failed", "{one}");
        assert_eq!(cli_state(), "failed");
    }
}
