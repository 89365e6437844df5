//! A run whose process was killed: `keel stop` and `keel sessions` call it interrupted
//! and write nothing, and the next unrelated run closes it without showing its leftovers.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::harness::{LONG_COMMAND, start_run, wait_for_prepared};
use crate::suite::support::{Env, json_lines, scripted, stderr, stdout};

#[test]
fn stop_on_a_run_whose_process_was_killed_says_it_was_interrupted_and_exits_1() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let mut child = start_run(&env, &ws, &model, Stdio::null);
    let session = wait_for_prepared(&env);
    child.kill().unwrap();
    child.wait().unwrap();
    let before = stdout(&env.run(&["log", &session, "--json"]));
    let stop = env.run(&["stop", &session]);
    assert_eq!(stop.status.code(), Some(1), "{}", stderr(&stop));
    let message = stderr(&stop);
    assert!(message.contains("has no live run"), "{message}");
    assert!(message.contains("interrupted"), "{message}");
    assert!(message.contains(&format!("keel resume {session}")), "{message}");
    assert!(!message.contains("stop requested"), "{message}");
    // It asked nothing of the ledger: no cancel request a later run would trip over.
    assert_eq!(stdout(&env.run(&["log", &session, "--json"])), before);
}

/// A run whose process was killed is not shown as running: `keel sessions` and its JSON
/// say `interrupted` (its lease holder is gone), and `keel log` ends saying so, while a
/// live run says `running`; and the
/// listing writes nothing to the ledger (its file and WAL are byte-for-byte unchanged).
#[test]
fn sessions_show_a_killed_run_as_interrupted_and_write_nothing() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let mut child = start_run(&env, &ws, &model, Stdio::null);
    let session = wait_for_prepared(&env);
    let state = |env: &Env| {
        let listed = stdout(&env.run(&["sessions", "--json"]));
        let row: serde_json::Value = serde_json::from_str(listed.trim()).unwrap();
        assert_eq!(row["session_id"], session.as_str());
        row
    };
    // The neighbour: a run whose process lives is running. `state` is the HTTP API's name
    // for it; `status` stays, the same value.
    let live = state(&env);
    assert_eq!((&live["state"], &live["status"]), (&"running".into(), &"running".into()));
    assert!(!stdout(&env.run(&["log", &session])).contains("interrupted"));
    child.kill().unwrap();
    child.wait().unwrap();

    let ledger = env.home.path().join("keel.sqlite");
    let files = || {
        ["", "-wal"].map(|suffix| std::fs::read(format!("{}{suffix}", ledger.display())).unwrap())
    };
    let before = files();
    let killed = state(&env);
    assert_eq!(
        (&killed["state"], &killed["status"]),
        (&"interrupted".into(), &"interrupted".into())
    );
    let table = stdout(&env.run(&["sessions"]));
    assert!(table.contains("interrupted") && !table.contains("running"), "{table}");
    assert!(stdout(&env.run(&["log", &session, "-v"])).contains("run call_1_1: bash"));
    // `keel log` says so too, by the same rule; its `--json` stays the ledger's events.
    let log = stdout(&env.run(&["log", &session]));
    let note = log.lines().last().unwrap_or_default();
    assert!(note.starts_with("interrupted: the process that ran it (keel pid "), "{log}");
    assert!(note.contains(&format!("`keel resume {session}` continues it")), "{log}");
    assert!(!stdout(&env.run(&["log", &session, "--json"])).contains("interrupted"));
    assert!(files() == before, "a listing wrote to the ledger");
}

/// Starts `keel run` on [`LONG_COMMAND`] in `ws`, waits until its command runs, and
/// `kill -9`s it; returns the killed run's session id.
fn kill_a_run(env: &Env, ws: &Path, known: &[String]) -> String {
    let model = format!("scripted:{}", env.write_script("long.json", LONG_COMMAND).display());
    let mut child = start_run(env, ws, &model, Stdio::null);
    let deadline = Instant::now() + Duration::from_secs(20);
    let session = loop {
        let listed = stdout(&env.run(&["sessions", "--json"]));
        let started = listed
            .lines()
            .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
            .map(|session| session["session_id"].as_str().unwrap().to_owned())
            .filter(|id| !known.contains(id))
            .find(|id| stdout(&env.run(&["log", id, "-v"])).contains("run call_1_1: bash"));
        if let Some(id) = started {
            break id;
        }
        assert!(Instant::now() < deadline, "the run never started its command");
        std::thread::sleep(Duration::from_millis(100));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    session
}

#[test]
fn a_killed_runs_leftovers_stay_out_of_the_next_unrelated_run() {
    let env = Env::new();
    let ws_a = env.workspace();
    let ws_b = env.scratch.path().join("b");
    std::fs::create_dir_all(&ws_b).unwrap();
    let hello = env.write_script("hello.json", r#"{"steps":[{"text":"hello there"}]}"#);
    let hello = format!("scripted:{}", hello.display());
    let run_b = |format: &[&str]| {
        let mut args = vec!["run", "-C", ws_b.to_str().unwrap(), "-m", &hello];
        args.extend_from_slice(format);
        args.push("say hello");
        let output = env.run(&args);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        output
    };
    let mut known = Vec::new();
    let closed_once = |output: &std::process::Output, killed: &str| {
        let err = stderr(output);
        let note = format!("keel: closed the interrupted run of session {killed}");
        assert_eq!(err.matches(&note).count(), 1, "{err}");
        // None of the other session's events, and nothing shown as a sub-agent's.
        for leftover in ["indeterminate", "interrupted:", "┊"] {
            assert!(!err.contains(leftover), "{leftover:?} in {err}");
        }
    };

    // The terminal view.
    let killed = kill_a_run(&env, &ws_a, &known);
    known.push(killed.clone());
    let output = run_b(&[]);
    closed_once(&output, &killed);
    assert_eq!(stdout(&output), "hello there\n", "{}", stderr(&output));
    assert!(stderr(&output).contains("✓ completed"), "{}", stderr(&output));

    // --json: only this run's session, from its session_created on.
    let killed = kill_a_run(&env, &ws_a, &known);
    known.push(killed.clone());
    let output = run_b(&["--json"]);
    closed_once(&output, &killed);
    let events = json_lines(&output);
    assert_eq!(events[0]["kind"], "session_created", "{events:?}");
    let session = events[0]["session_id"].as_str().unwrap();
    assert_ne!(session, killed);
    assert!(events.iter().all(|e| e["session_id"] == session), "{events:?}");
    assert!(events.iter().all(|e| e["kind"] != "run_failed"), "{events:?}");

    // -q: the answer, once, plain.
    let killed = kill_a_run(&env, &ws_a, &known);
    let output = run_b(&["-q"]);
    closed_once(&output, &killed);
    assert_eq!(stdout(&output), "hello there\n");
    // The killed runs were closed for real: their sessions are no longer running.
    for id in known.iter().chain([&killed]) {
        let log = stdout(&env.run(&["log", id, "--json"]));
        assert!(log.contains("\"run_failed\""), "{log}");
    }
}
