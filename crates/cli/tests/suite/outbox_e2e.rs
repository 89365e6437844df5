//! The outbox (DESIGN.md §6): a JSON-lines sink declared in the user's config holds exactly
//! the session's ledger once `keel run` (or `keel resume`) exits, and a workspace config
//! cannot declare sinks.

use std::path::Path;

use super::support::{Env, json_lines, stderr, stdout};

fn declare_jsonl_sink(env: &Env, path: &Path) {
    std::fs::write(
        env.home.path().join("config.toml"),
        format!(
            "[[outbox]]\nname = \"audit\"\nkind = \"jsonl\"\npath = {:?}\n",
            path.display().to_string()
        ),
    )
    .unwrap();
}

fn log_lines(env: &Env, session: &str) -> Vec<String> {
    let output = env.run(&["log", session, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    stdout(&output).lines().map(str::to_owned).collect()
}

fn sink_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect()
}

#[test]
fn a_jsonl_sink_holds_exactly_the_ledger_after_run_and_resume() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let sink = env.scratch.path().join("mirror/audit.jsonl");
    declare_jsonl_sink(&env, &sink);
    let script = env.write_script(
        "script.json",
        r#"{"steps":[
            {"tool_calls":[{"name":"read_file","arguments":{"path":"a.txt"}}]},
            {"text":"Report: read a.txt. Next: answer."},
            {"text":"a.txt says alpha"}
        ]}"#,
    );
    let model = format!("scripted:{}", script.display());
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--max-steps",
        "2",
        "--json",
        "read a.txt",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let logged = log_lines(&env, &session);
    assert_eq!(sink_lines(&sink), logged, "the sink holds the ledger, terminal event included");
    assert!(logged.last().unwrap().contains("\"kind\":\"run_suspended\""));

    // A resumed run appends to the same file, each event once.
    let output = env.run(&["resume", &session, "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let logged = log_lines(&env, &session);
    assert_eq!(sink_lines(&sink), logged);
    assert!(logged.last().unwrap().contains("\"kind\":\"run_completed\""));

    let cursor: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(env.home.path().join("outbox/audit.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(cursor["sessions"][&session], logged.len());
}

#[test]
fn a_workspace_config_cannot_declare_sinks() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        ws.join(".keel/config.toml"),
        "[[outbox]]\nname = \"leak\"\nkind = \"webhook\"\nurl = \"http://127.0.0.1:9/\"\n",
    )
    .unwrap();
    let script = env.write_script("script.json", r#"{"steps":[{"text":"done"}]}"#);
    let model = format!("scripted:{}", script.display());
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "hello"]);
    // A warning, and the sink is not used: the run does not try to reach it.
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("ignored `outbox.leak`"), "{message}");
    assert!(!message.contains("127.0.0.1:9"), "{message}");
}

#[test]
fn an_invalid_sink_is_a_usage_error_naming_it() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        "[[outbox]]\nname = \"audit\"\nkind = \"jsonl\"\npath = \"relative.jsonl\"\n",
    )
    .unwrap();
    let script = env.write_script("script.json", r#"{"steps":[]}"#);
    let model = format!("scripted:{}", script.display());
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "hello"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("outbox sink 'audit': path relative.jsonl must be absolute"),
        "{}",
        stderr(&output)
    );
}
