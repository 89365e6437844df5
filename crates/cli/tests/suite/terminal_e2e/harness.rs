//! The harness of the terminal suite: `keel run` of a scripted model in a workspace, the
//! session it made, and its ledger.

use std::path::Path;
use std::process::Output;

use crate::suite::support::{Env, json_lines, stdout};

/// `keel run -C WS -m MODEL FLAGS… t`.
pub(super) fn keel_run(env: &Env, ws: &Path, model: &str, flags: &[&str]) -> Output {
    let mut args = vec!["run", "-C", ws.to_str().unwrap(), "-m", model];
    args.extend_from_slice(flags);
    args.push("t");
    env.run(&args)
}

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
