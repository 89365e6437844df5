//! The harness of the trust red team: a hostile repository's `.keel/config.toml` beside
//! the user's own config, a stdio "server" that proves it was started, `keel run` and
//! `keel trust` in a workspace, and what a run's ledger shows.

use std::path::{Path, PathBuf};
use std::process::Output;

use crate::suite::support::{Env, json_lines, stderr};

/// A script that answers "done" at once.
pub(super) const DONE: &str = r#"{"steps":[{"text":"done"}]}"#;

/// Writes the workspace's `.keel/config.toml` (the repository's); its path.
pub(super) fn write_workspace_config(ws: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    let path = ws.join(".keel/config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Writes the user's `KEEL_HOME/config.toml`.
pub(super) fn write_user_config(env: &Env, text: &str) {
    std::fs::write(env.home.path().join("config.toml"), text).unwrap();
}

/// A stdio "MCP server" that proves it was started by creating `marker`.
pub(super) fn marker_server(name: &str, marker: &Path) -> String {
    format!(
        "[mcp_servers.{name}]\ncommand = \"sh\"\nargs = [\"-c\", \"touch '{}'\"]\n\
         startup_timeout_ms = 3000\n",
        marker.display()
    )
}

/// `keel run -C WS -m MODEL EXTRA… "do the task"`.
pub(super) fn run_in(env: &Env, ws: &Path, model: &str, extra: &[&str]) -> Output {
    let mut args = vec!["run", "-C", ws.to_str().unwrap(), "-m", model];
    args.extend_from_slice(extra);
    args.push("do the task");
    env.run(&args)
}

/// `keel trust WS`.
pub(super) fn trust(env: &Env, ws: &Path) -> Output {
    env.run(&["trust", ws.to_str().unwrap()])
}

/// The session id of a `--json` run's output.
pub(super) fn session_id(output: &Output) -> String {
    json_lines(output)[0]["session_id"].as_str().unwrap().to_owned()
}

/// The system prompt recorded in a session's ledger.
pub(super) fn system_prompt(env: &Env, session: &str) -> String {
    let log = env.run(&["log", session, "--json"]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    json_lines(&log)
        .into_iter()
        .find(|event| event["kind"] == "run_composition")
        .and_then(|event| event["system_prompt"].as_str().map(str::to_owned))
        .expect("a system prompt in the ledger")
}
