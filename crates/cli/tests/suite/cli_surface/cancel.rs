//! Stopping a live run: Ctrl-C, SIGTERM and `keel stop` cancel it and answer every open
//! call; a second process is refused while the run holds the session; a stopped process
//! whose lease lapsed is still running.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::harness::{LONG_COMMAND, start_run, wait_for_prepared};
use crate::suite::support::{Env, json_lines, scripted, stderr, stdout};

/// Sends `signal` to `pid` with the ordinary `kill` tool.
fn send_signal(signal: &str, pid: u32) {
    let sent = Command::new("kill").arg(signal).arg(pid.to_string()).status();
    assert!(sent.unwrap().success(), "kill {signal} {pid}");
}

/// Both calls of [`LONG_COMMAND`] were answered `cancelled`, the run ended cancelled, and
/// the command's process group is gone.
fn check_cancelled(env: &Env, session: &str, ws: &Path) {
    let events = json_lines(&env.run(&["log", session, "--json"]));
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["cancelled", "cancelled"]);
    assert_eq!(events.last().unwrap()["kind"], "run_cancelled");
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ws.join("late.txt").exists(), "the command's process group outlived the cancel");
}

#[test]
fn ctrl_c_cancels_with_exit_130_and_answers_every_open_call() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = start_run(&env, &ws, &model, Stdio::piped);
    let session = wait_for_prepared(&env);
    send_signal("-INT", child.id());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
}

#[test]
fn keel_stop_from_another_process_cancels_the_run() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = start_run(&env, &ws, &model, Stdio::piped);
    let session = wait_for_prepared(&env);
    let stop = env.run(&["stop", &session[..12]]);
    assert_eq!(stop.status.code(), Some(0), "{}", stderr(&stop));
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
}

#[test]
fn sigterm_cancels_like_ctrl_c_and_kills_the_tool() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = start_run(&env, &ws, &model, Stdio::piped);
    let session = wait_for_prepared(&env);
    send_signal("-TERM", child.id());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
}

#[test]
fn a_second_process_is_refused_while_a_run_holds_the_session() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = start_run(&env, &ws, &model, Stdio::piped);
    let session = wait_for_prepared(&env);
    let second = env.run(&["resume", &session, "do something else", "--approval", "auto"]);
    assert_eq!(second.status.code(), Some(1), "{}", stderr(&second));
    assert!(
        stderr(&second).contains(&format!("is being driven by keel pid {}", child.id())),
        "{}",
        stderr(&second)
    );
    // The live run was not closed as interrupted by the second process.
    assert!(!stdout(&env.run(&["log", &session, "-v"])).contains("run_failed"));
    assert_eq!(env.run(&["stop", &session]).status.code(), Some(0));
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
}

/// A live run that is stopped (SIGSTOP, or starved) past its lease is still running: its
/// holder names this machine and a live pid. `keel sessions` says `running` and `keel
/// stop` asks it to cancel; once continued, the run ends cancelled. (The lapse is made by
/// moving the lease's expiry into the past while the process is stopped, as 30 s of
/// SIGSTOP would.)
#[test]
fn a_stopped_run_whose_lease_lapsed_is_running_and_keel_stop_cancels_it() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let mut child = start_run(&env, &ws, &model, Stdio::null);
    let session = wait_for_prepared(&env);
    send_signal("-STOP", child.id());
    {
        let db = rusqlite::Connection::open(env.home.path().join("keel.sqlite")).unwrap();
        db.busy_timeout(Duration::from_secs(5)).unwrap();
        let changed = db.execute("UPDATE leases SET expires_at_ms = 0", []).unwrap();
        assert_eq!(changed, 1);
    }
    let listed = stdout(&env.run(&["sessions", "--json"]));
    let row: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
    assert_eq!(row["state"], "running", "{row}");
    let stop = env.run(&["stop", &session]);
    assert_eq!(stop.status.code(), Some(0), "{}", stderr(&stop));
    assert!(stderr(&stop).contains("stop requested"), "{}", stderr(&stop));
    send_signal("-CONT", child.id());
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the continued run did not end");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "{status:?}");
    assert!(!ws.join("late.txt").exists(), "the cancelled command did not finish");
    let listed = stdout(&env.run(&["sessions", "--json"]));
    assert_ne!(
        serde_json::from_str::<serde_json::Value>(listed.trim()).unwrap()["state"],
        "running"
    );
}
