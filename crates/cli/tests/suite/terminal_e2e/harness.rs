//! The harness of the terminal suite: the session a run made, and its ledger.

use crate::suite::support::{Env, json_lines, stdout};

/// The id of the newest session.
pub(super) fn session_id(env: &Env) -> String {
    let listed = stdout(&env.run(&["sessions", "--json"]));
    let line = listed.lines().next().expect("a session");
    let session: serde_json::Value = serde_json::from_str(line).unwrap();
    session["session_id"].as_str().unwrap().to_owned()
}

/// The session's ledger, as `keel log --json` prints it.
pub(super) fn ledger(env: &Env, session: &str) -> Vec<serde_json::Value> {
    json_lines(&env.run(&["log", session, "--json"]))
}
