//! Issue #12 item 1 through the real binary: command output and file reads that are not
//! UTF-8 text reach the model escaped and stay exact (base64 `raw`) in the ledger.

use super::support::{Env, json_lines, scripted, stderr, stdout};

#[test]
fn issue_12_the_ledger_keeps_the_exact_bytes_of_tool_output() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("latin1.txt"), b"caf\xe9\n").unwrap();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"printf 'ok \\xe9\\xff\\000'"}}]},
            {"tool_calls":[{"name":"read_file","arguments":{"path":"latin1.txt"}}],
             "expect":{"contains":"ok \\xe9\\xff\\x00"}},
            {"text":"done","expect":{"contains":"caf\\xe9"}}
        ]}"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "--sandbox",
        "bypass",
        "--json",
        "show me",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();

    let log = env.run(&["log", &session, "--json"]);
    let results: Vec<serde_json::Value> =
        json_lines(&log).into_iter().filter(|event| event["kind"] == "tool_result").collect();
    assert_eq!(results.len(), 2, "{}", stdout(&log));
    let decode = |event: &serde_json::Value| {
        assert!(event["raw"].is_string(), "raw is recorded as base64: {event}");
        serde_json::from_value::<keel_contracts::RawBytes>(event["raw"].clone()).unwrap().0
    };
    let bash = &results[0];
    assert!(bash["content"].as_str().unwrap().starts_with("ok \\xe9\\xff\\x00\n"), "{bash}");
    assert!(bash["content"].as_str().unwrap().contains("[keel: 3 bytes shown as"), "{bash}");
    assert!(!bash["content"].as_str().unwrap().contains('\u{fffd}'));
    assert_eq!(decode(bash), b"ok \xe9\xff\0\n[exit code 0]");
    let read = &results[1];
    assert_eq!(decode(read), b"     1\tcaf\xe9\n");
}
