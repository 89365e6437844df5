//! What a run may do: shadow mode, `--approval deny` and `--forbid`, the default without
//! a terminal, permission rules from the config files, a boundary request, and deny rules
//! that hold for every file tool.

use crate::suite::support::{Env, json_lines, scripted, stderr, stdout};

/// A read, a write and a command that writes, in one step.
const READ_WRITE_BASH: &str = r#"{"steps":[
    {"tool_calls":[
        {"name":"read_file","arguments":{"path":"a.txt"}},
        {"name":"write_file","arguments":{"path":"a.txt","content":"changed\n"}},
        {"name":"bash","arguments":{"command":"echo changed > b.txt"}}
    ]},
    {"text":"done"}
]}"#;

/// Every file of `dir` (not recursive) with its bytes, sorted by name.
fn snapshot(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap_or_default(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn shadow_mode_leaves_the_workspace_byte_identical() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "original\n").unwrap();
    let before = snapshot(&ws);
    let model = scripted(&env, READ_WRITE_BASH);
    let output = env.run_t(
        &ws,
        &model,
        &["--mode", "shadow", "--approval", "auto", "--sandbox", "bypass", "--json"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(snapshot(&ws), before, "shadow mode changed the workspace");
    let events = json_lines(&output);
    let intents: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "shadow_intent")
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(intents, vec!["write_file", "bash"]);
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["ok", "shadow_denied", "shadow_denied"]);
    assert_eq!(events.iter().find(|e| e["kind"] == "run_started").unwrap()["mode"], "shadow");
}

#[test]
fn approval_deny_refuses_writes_and_forbid_refuses_tools() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "original\n").unwrap();
    let before = snapshot(&ws);
    let model = scripted(&env, READ_WRITE_BASH);
    let output = env.run_t(&ws, &model, &["--approval", "deny", "--sandbox", "bypass", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(snapshot(&ws), before);
    let events = json_lines(&output);
    let outcomes: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, vec!["ok", "refused", "refused"]);
    let asked: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "permission_requested")
        .map(|e| e["access"].as_str().unwrap())
        .collect();
    assert_eq!(asked, vec!["write", "write"]);

    let output = env.run_t(
        &ws,
        &model,
        &["--approval", "auto", "--sandbox", "bypass", "--forbid", "bash,write_file", "--json"],
    );
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(snapshot(&ws), before);
    let events = json_lines(&output);
    let refusals: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "gate_decision" && e["decision"] == "refuse")
        .map(|e| e["tool"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(refusals, vec!["write_file", "bash"]);
}

#[test]
fn without_a_terminal_the_default_approval_is_deny() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[{"tool_calls":[{"name":"write_file","arguments":{"path":"x","content":"y"}}]},{"text":"ok","expect":{"last_outcomes":["refused"]}}]}"#,
    );
    let output = env.run_t(&ws, &model, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The notice comes with the refused call, not before the run.
    let err = stderr(&output);
    assert!(
        err.lines().any(|line| line.contains("✗ write_file x · refused: no terminal to ask")),
        "{err}"
    );
    assert!(!ws.join("x").exists());
}

#[test]
fn config_rules_pre_answer_and_forbid_refuses_an_intrinsic_tool() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.home.path().join("config.toml"),
        "[permissions]\nallow = [\"write_file(notes/**)\"]\n",
    )
    .unwrap();
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        ws.join(".keel/config.toml"),
        "[permissions]\ndeny = [\"write_file(notes/private*)\"]\n",
    )
    .unwrap();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[
                {"name":"write_file","arguments":{"path":"notes/a.md","content":"a"}},
                {"name":"write_file","arguments":{"path":"notes/private.md","content":"b"}},
                {"name":"todo","arguments":{"items":[{"text":"write notes","status":"done"}]}}
            ]},
            {"text":"done","expect":{"last_outcomes":["ok","refused","refused"]}}
        ]}"#,
    );
    let output = env.run_t(&ws, &model, &["--approval", "ask", "--forbid", "todo", "--json"]);
    // --approval ask without a terminal is a usage error, even with rules.
    assert_eq!(output.status.code(), Some(2));
    let output = env.run_t(&ws, &model, &["--forbid", "todo", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(std::fs::read_to_string(ws.join("notes/a.md")).unwrap(), "a");
    assert!(!ws.join("notes/private.md").exists());
    let events = json_lines(&output);
    let by: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "permission_settled")
        .map(|e| e["by"].as_str().unwrap())
        .collect();
    assert_eq!(by, vec!["rule:write_file(notes/**)", "rule:write_file(notes/private*)"]);
    let todo_gate =
        events.iter().find(|e| e["kind"] == "gate_decision" && e["tool"] == "todo").unwrap();
    assert_eq!(todo_gate["decision"], "refuse");

    // A workspace file may not widen the boundary: its allow rule is ignored, with a note.
    std::fs::write(ws.join(".keel/config.toml"), "[permissions]\nallow = [\"bash\"]\n").unwrap();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"true"}}]},
            {"text":"done","expect":{"last_outcomes":["refused"]}}
        ]}"#,
    );
    let output = env.run_t(&ws, &model, &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("ignored `permissions.allow`"), "{}", stderr(&output));
    let by: Vec<String> = json_lines(&output)
        .iter()
        .filter(|e| e["kind"] == "permission_settled")
        .map(|e| e["by"].as_str().unwrap().to_owned())
        .collect();
    assert!(by.iter().all(|by| by != "rule:bash"), "{by:?}");
}

#[test]
fn a_boundary_request_widens_managed_bash_when_approved_and_denial_exits_4() {
    let env = Env::new();
    let ws = env.workspace();
    let outside = tempfile::tempdir().unwrap();
    let target = outside.path().join("report.txt");
    let script = format!(
        r#"{{"steps":[
            {{"tool_calls":[{{"name":"bash","arguments":{{"command":"echo one > {target}"}}}}]}},
            {{"tool_calls":[{{"name":"request_boundary","arguments":{{"paths":[{{"path":"{dir}","access":"write"}}],"justification":"the report goes to the shared folder"}}}}]}},
            {{"tool_calls":[{{"name":"bash","arguments":{{"command":"echo two > {target}"}}}}],"expect":{{"last_outcomes":["ok"]}}}},
            {{"text":"written"}}
        ]}}"#,
        target = target.display(),
        dir = outside.path().display()
    );
    let model = scripted(&env, &script);
    // `--approval auto` alone never widens the boundary (#11): the user's own rule does.
    let config = env.home.path().join("config.toml");
    std::fs::write(
        &config,
        format!("[permissions]\nallow = [\"request_boundary({})\"]\n", outside.path().display()),
    )
    .unwrap();
    let output = env.run_t(&ws, &model, &["--approval", "auto", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    std::fs::remove_file(&config).unwrap();
    let events = json_lines(&output);
    let first = events.iter().find(|e| e["kind"] == "tool_result").unwrap();
    assert!(
        first["content"].as_str().unwrap().contains("Permission denied"),
        "managed mode blocked the first write: {first}"
    );
    let revised = events.iter().find(|e| e["kind"] == "boundary_revised").unwrap();
    assert_eq!(revised["revision"], 1);
    assert_eq!(revised["justification"], "the report goes to the shared folder");
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "two\n");

    std::fs::remove_file(&target).unwrap();
    let output = env.run_t(&ws, &model, &["--approval", "deny"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(stderr(&output).contains("✗ denied: "), "{}", stderr(&output));
    assert!(!target.exists());
    // The listing round-trips the denied status (it once broke every later listing).
    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("denied"), "{}", stdout(&listed));
}

/// ../shared/cases/bugs/B09: deny rules on a folder hold for every file tool, recursive
/// searches of an ancestor included, and a link into the folder does not dodge them.
#[test]
fn b09_deny_rules_hold_for_reads_searches_and_links() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::create_dir_all(ws.join("docs/private")).unwrap();
    std::fs::create_dir_all(ws.join("docs/public")).unwrap();
    std::fs::write(ws.join("docs/private/plan.md"), "0000-CANARY\n").unwrap();
    std::fs::write(ws.join("docs/public/readme.md"), "public\n").unwrap();
    std::os::unix::fs::symlink("docs/private", ws.join("alias")).unwrap();
    std::fs::write(
        env.home.path().join("config.toml"),
        "[permissions]\ndeny = [\"read_file(docs/private/**)\", \"grep(docs/private/**)\", \
         \"glob(docs/private/**)\", \"list_dir(docs/private/**)\", \"write_file(docs/private/**)\"]\n",
    )
    .unwrap();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[
                {"name":"read_file","arguments":{"path":"docs/private/plan.md"}},
                {"name":"read_file","arguments":{"path":"alias/plan.md"}},
                {"name":"grep","arguments":{"pattern":"CANARY","path":"."}},
                {"name":"grep","arguments":{"pattern":"CANARY"}},
                {"name":"glob","arguments":{"pattern":"**/*.md"}},
                {"name":"list_dir","arguments":{"path":"docs"}},
                {"name":"write_file","arguments":{"path":"alias/new.md","content":"x"}},
                {"name":"read_file","arguments":{"path":"docs/public/readme.md"}}
            ]},
            {"text":"done","expect":{"last_outcomes":["refused","refused","refused","refused","refused","refused","refused","ok"]}}
        ]}"#,
    );
    let output = env.run_t(&ws, &model, &["--approval", "auto", "--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stdout(&output).contains("0000-CANARY"), "the canary leaked");
    assert!(!ws.join("docs/private/new.md").exists());
}
