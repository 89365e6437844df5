//! `keel` on a PostgreSQL ledger: `KEEL_DATABASE_URL` selects it, and `run`, `log`,
//! `sessions` and `resume` work on it end to end through the real binary.
//!
//! The server is `keel_testkit::postgres::PgServer::shared()` (a throwaway server, or
//! `KEEL_TEST_POSTGRES_URL`); without one these tests fail loudly unless
//! `KEEL_SKIP_POSTGRES=1`.

use std::process::Output;

use keel_testkit::postgres::{PgDatabase, PgServer};

use super::support::{Env, json_lines, stderr, stdout};

fn keel_on(env: &Env, database: &PgDatabase, args: &[&str]) -> Output {
    env.keel().env("KEEL_DATABASE_URL", database.url()).args(args).output().unwrap()
}

#[test]
fn run_log_sessions_and_resume_use_the_postgres_ledger() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let script = env.write_script(
        "script.json",
        r#"{"steps":[
            {"tool_calls":[{"name":"read_file","arguments":{"path":"a.txt"}}]},
            {"text":"a.txt says alpha","expect":{"last_outcomes":["ok"],"contains":"alpha"}},
            {"text":"still alpha","expect":{"contains":"and again"}}
        ]}"#,
    );
    let model = format!("scripted:{}", script.display());
    let ws = ws.to_str().unwrap();

    let output = keel_on(&env, &database, &["run", "-C", ws, "-m", &model, "--json", "read a.txt"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = json_lines(&output);
    assert_eq!(events.first().unwrap()["kind"], "session_created");
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
    let session = events[0]["session_id"].as_str().unwrap().to_owned();

    // The ledger holds exactly what the run reported, found by an id prefix.
    let log = keel_on(&env, &database, &["log", &session[..13], "--json"]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    assert_eq!(json_lines(&log), events);
    let human = stdout(&keel_on(&env, &database, &["log", &session[..8], "-v"]));
    assert!(human.contains("run_completed"), "{human}");

    let listed = stdout(&keel_on(&env, &database, &["sessions", "--json"]));
    let rows: Vec<serde_json::Value> =
        listed.lines().map(|line| serde_json::from_str(line).unwrap()).collect();
    assert_eq!(rows.len(), 1, "{listed}");
    assert_eq!(rows[0]["session_id"], session.as_str());
    assert_eq!(rows[0]["status"], "completed");
    assert_eq!(rows[0]["title"], "read a.txt");

    // A second process continues the session from the shared ledger.
    let output = keel_on(&env, &database, &["resume", &session[..13], "and again"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "still alpha");
    let log = json_lines(&keel_on(&env, &database, &["log", &session, "--json"]));
    assert_eq!(log[..events.len()], events[..], "the first run's events are untouched");
    let seqs: Vec<u64> = log.iter().map(|event| event["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=log.len() as u64).collect::<Vec<_>>());

    // Nothing went to the embedded ledger, which knows no such session.
    assert!(!env.home.path().join("keel.sqlite").exists());
    let output = env.run(&["log", &session]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn a_keel_database_url_that_is_not_postgres_or_not_reachable_fails_clearly() {
    let env = Env::new();
    let output = env.keel().env("KEEL_DATABASE_URL", "sqlite:///tmp/x").args(["sessions"]).output();
    let output = output.unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("KEEL_DATABASE_URL must be a postgres:// URL"));

    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://keel:hunter2@127.0.0.1:{port}/ledger");
    let output = env.keel().env("KEEL_DATABASE_URL", &url).args(["sessions"]).output().unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("cannot open the PostgreSQL ledger"), "{message}");
    assert!(message.contains(&format!("keel@127.0.0.1:{port}/ledger")), "{message}");
    assert!(!message.contains("hunter2"), "{message}");
    assert!(!env.home.path().join("keel.sqlite").exists());
}
