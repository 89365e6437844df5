//! Two hosts on one PostgreSQL ledger: either shows the session, one drives its run, and
//! the other takes it over when the first is killed.

use std::time::Duration;

use reqwest::StatusCode;

use super::harness::{Host, ledger_with, write_script};
use crate::suite::support::{Env, events_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_two_hosts_on_one_postgres_ledger_take_over_a_killed_hosts_run() {
    let Some(server) = keel_testkit::postgres::PgServer::shared() else { return };
    let database = server.create_database();
    let url = database.url().to_owned();
    let vars = [("KEEL_DATABASE_URL", url.as_str())];
    let env = Env::new();
    let other = Env::new();
    let workspace = env.workspace();
    let script = write_script(&env, "pg.json", &["p.txt"]);
    let root = env.scratch.path().to_str().unwrap().to_owned();
    let first = Host::start_with_vars(&env, &[], &vars);
    let second = Host::start_with_vars(&other, &["--workspace-root", &root], &vars);
    let (a, b) = (first.client(), second.client());
    let session = a.create(&workspace, &script, "ask").await;
    a.turn(&session, "write p").await;
    let before = a.pending(&session).await;
    // Either host shows the same ledger.
    let mut frames = Vec::new();
    assert!(b.events(&session, None).await.until("permission_requested", &mut frames).await);
    assert_eq!(frames.last().and_then(|f| f.id), before["requested_seq"].as_u64());
    // The first host drives the run: the second does not take it while it lives.
    let call = before["call_id"].as_str().unwrap().to_owned();
    let (status, body) = b.answer(&session, &call, "allow_once").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "driven_elsewhere");

    first.kill9();
    // Within the lease time the second host takes the run over and asks again.
    let asked = before["requested_seq"].as_u64();
    let after = b.pending_after(&session, asked, Duration::from_secs(40)).await;
    assert_eq!(after["call_id"], call.as_str());
    let (status, body) = b.answer(&session, &call, "allow_once").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    b.wait_state(&session, "completed").await;
    assert!(second.stderr().contains("took over session"), "{}", second.stderr());
    assert_eq!(std::fs::read_to_string(workspace.join("p.txt")).unwrap(), "p.txt\n");
    let ledger = ledger_with(&env, &vars, &session);
    let results = events_of(&ledger, "tool_result");
    assert_eq!(results.len(), 1, "the call ran once");
    assert_eq!(results[0]["outcome"], "ok");
    let seqs: Vec<u64> = ledger.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=ledger.len() as u64).collect::<Vec<_>>());
}
