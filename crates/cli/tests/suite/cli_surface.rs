//! The CLI contract of DESIGN.md §9: exit statuses, usage errors, resume, log, sessions,
//! stop, Ctrl-C, shadow mode and approval answers, end to end through the real binary.

use std::time::{Duration, Instant};

use super::support::{Env, json_lines, scripted, stderr, stdout};

#[test]
fn usage_errors_exit_2_with_a_message() {
    let env = Env::new();
    let ws = env.workspace();
    let ws = ws.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["run", "-C", ws, "-m", "nonsense", "t"], "invalid model spec"),
        (&["run", "-C", ws, "-m", "scripted:/nonexistent.json", "t"], "cannot read script"),
        (&["run", "-C", ws, "-m", "scripted:x", "--approval", "ask", "t"], "needs a terminal"),
        (&["run", "-C", ws, "-m", "nonsense:x", "t"], "unknown provider"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-time", "soon", "t"],
            "invalid duration 'soon'",
        ),
        (
            &["run", "-C", ws, "-m", "openai:no-such-model", "--max-cost-usd", "1", "t"],
            "no price known",
        ),
        // Unknown is not zero: an unpriced scripted model cannot take a cost ceiling either.
        (&["run", "-C", ws, "-m", "scripted:x", "--max-cost-usd", "1", "t"], "no price known"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--sandbox", "loose", "t"],
            "invalid value 'loose'",
        ),
        (&["run", "-C", "/nonexistent/dir", "-m", "scripted:x", "t"], "workspace /nonexistent/dir"),
        (&["log", "zzzz"], "no session matches 'zzzz'"),
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-steps", "0", "t"],
            "--max-steps must be at least 1",
        ),
        (&["run", "-C", ws, "-m", "scripted:x", "--max-time", "0s", "t"], "give a positive time"),
        // A duration needs its unit: is `10` seconds or minutes?
        (&["run", "-C", ws, "-m", "scripted:x", "--max-time", "10", "t"], "with its unit"),
        // Beyond 100 years: refused where parsed, never an overflowing deadline.
        (
            &["run", "-C", ws, "-m", "scripted:x", "--max-time", "9223372036854775807s", "t"],
            "at most 876000h",
        ),
        (&["wake", "0", "--max-time", "9300000000000000000s"], "at most 876000h"),
        // Missing key, empty model name, unknown provider: usage errors before a session.
        (&["run", "-C", ws, "-m", "openai:gpt-4o", "t"], "OPENAI_API_KEY is not set"),
        (
            &["run", "-C", ws, "-m", "anthropic:claude-sonnet-4-5", "t"],
            "ANTHROPIC_API_KEY is not set",
        ),
        (&["run", "-C", ws, "-m", "openai:", "t"], "names no model"),
        (&["run", "-C", ws, "-m", "gemini:pro", "t"], "unknown provider 'gemini'"),
        (&["log", "--last"], "there are no sessions yet"),
    ];
    for (args, message) in cases {
        let output = env.run(args);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        assert!(stderr(&output).contains(message), "{args:?}: {}", stderr(&output));
    }
    // None of them created a session.
    assert_eq!(stdout(&env.run(&["sessions", "--json"])), "");
}

const READ_WRITE_BASH: &str = r#"{"steps":[
    {"tool_calls":[
        {"name":"read_file","arguments":{"path":"a.txt"}},
        {"name":"write_file","arguments":{"path":"a.txt","content":"changed\n"}},
        {"name":"bash","arguments":{"command":"echo changed > b.txt"}}
    ]},
    {"text":"done"}
]}"#;

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
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--mode",
        "shadow",
        "--approval",
        "auto",
        "--sandbox",
        "bypass",
        "--json",
        "t",
    ]);
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
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "deny",
        "--sandbox",
        "bypass",
        "--json",
        "t",
    ]);
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
        "--forbid",
        "bash,write_file",
        "--json",
        "t",
    ]);
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
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The notice comes with the refused call, not before the run.
    let err = stderr(&output);
    assert!(
        err.lines().any(|line| line.contains("✗ write_file x · refused: no terminal to ask")),
        "{err}"
    );
    assert!(!ws.join("x").exists());
}

const LONG_COMMAND: &str = r#"{"steps":[
    {"tool_calls":[{"name":"bash","arguments":{"command":"sleep 30; echo late > late.txt"}},{"name":"read_file","arguments":{"path":"a.txt"}}]},
    {"text":"never"}
]}"#;

fn wait_for_prepared(env: &Env) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let listed = env.run(&["sessions", "--json"]);
        if let Some(line) = stdout(&listed).lines().next() {
            let session: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = session["session_id"].as_str().unwrap().to_owned();
            if stdout(&env.run(&["log", &id, "-v"])).contains("run call_1_1: bash") {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "the run never started its command");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn check_cancelled(env: &Env, session: &str, ws: &std::path::Path) {
    let events: Vec<serde_json::Value> = stdout(&env.run(&["log", session, "--json"]))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
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
    let child = env
        .keel()
        .args([
            "run",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            &model,
            "--approval",
            "auto",
            "--sandbox",
            "bypass",
            "t",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let session = wait_for_prepared(&env);
    // SAFETY-free: `kill` is the ordinary command-line tool.
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
}

#[test]
fn keel_stop_from_another_process_cancels_the_run() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = env
        .keel()
        .args([
            "run",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            &model,
            "--approval",
            "auto",
            "--sandbox",
            "bypass",
            "t",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let session = wait_for_prepared(&env);
    let stop = env.run(&["stop", &session[..12]]);
    assert_eq!(stop.status.code(), Some(0), "{}", stderr(&stop));
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
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
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "ask",
        "--forbid",
        "todo",
        "--json",
        "t",
    ]);
    // --approval ask without a terminal is a usage error, even with rules.
    assert_eq!(output.status.code(), Some(2));
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--forbid",
        "todo",
        "--json",
        "t",
    ]);
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
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--json", "t"]);
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
fn sub_agents_appear_under_their_parent_in_sessions_tree() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("notes.txt"), "the answer is 42\n").unwrap();
    let model = scripted(
        &env,
        r#"{
            "steps": [
                {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"Find the answer in notes.txt."}}]},
                {"text":"The child found 42.","expect":{"last_outcomes":["ok"],"contains":"completed: 42"}}
            ],
            "agents": {"Find the answer in notes.txt.": {"steps": [
                {"tool_calls":[{"name":"read_file","arguments":{"path":"notes.txt"}},{"name":"write_file","arguments":{"path":"x","content":"y"}}]},
                {"text":"42","expect":{"last_outcomes":["ok","error"]}}
            ]}}
        }"#,
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "ask a child",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "The child found 42.");
    assert!(!ws.join("x").exists(), "a child cannot write");
    let tree = stdout(&env.run(&["sessions", "--tree"]));
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 2, "{tree}");
    assert!(lines[0].contains("ask a child") && !lines[0].starts_with(' '), "{tree}");
    assert!(lines[1].starts_with("  ") && lines[1].contains("Find the answer"), "{tree}");
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
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "--json",
        "t",
    ]);
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
    let output =
        env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "deny", "t"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(stderr(&output).contains("✗ denied: "), "{}", stderr(&output));
    assert!(!target.exists());
    // The listing round-trips the denied status (it once broke every later listing).
    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains("denied"), "{}", stdout(&listed));
}

#[test]
fn a_second_process_is_refused_while_a_run_holds_the_session() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = env
        .keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "--sandbox"])
        .args(["bypass", "t"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
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

#[test]
fn sigterm_cancels_like_ctrl_c_and_kills_the_tool() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let child = env
        .keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto", "--sandbox"])
        .args(["bypass", "t"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let session = wait_for_prepared(&env);
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", stderr(&output));
    check_cancelled(&env, &session, &ws);
}

#[test]
fn a_closed_stdout_is_not_a_panic() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"a long answer"}]}"#);
    for _ in 0..3 {
        assert_eq!(
            env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]).status.code(),
            Some(0)
        );
    }
    for args in [vec!["sessions"], vec!["run", "-C", ws.to_str().unwrap(), "-m", &model, "t"]] {
        let mut child = env
            .keel()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let output = child.wait_with_output().unwrap();
        assert!(!stderr(&output).contains("panicked"), "{args:?}: {}", stderr(&output));
        assert_eq!(output.status.code(), Some(0), "{args:?}: {}", stderr(&output));
    }
}

#[test]
fn a_typo_in_a_tool_scope_is_a_usage_error_not_a_silent_no_op() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    for flag in ["--forbid", "--reads", "--writes"] {
        let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, flag, "bsh", "t"]);
        assert_eq!(output.status.code(), Some(2), "{flag}: {}", stderr(&output));
        assert!(
            stderr(&output).contains(&format!("unknown tool 'bsh' in {flag}")),
            "{}",
            stderr(&output)
        );
    }
}

#[test]
fn a_relative_script_path_is_recorded_absolute_so_resume_works_from_anywhere() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(
        env.scratch.path().join("two.json"),
        r#"{"steps":[{"text":"first"},{"text":"second"}]}"#,
    )
    .unwrap();
    let output = env
        .keel()
        .current_dir(env.scratch.path())
        .args(["run", "-C", ws.to_str().unwrap(), "-m", "scripted:two.json", "--json", "t"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = json_lines(&output);
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    assert!(events[0]["model"].as_str().unwrap().starts_with("scripted:/"), "{}", events[0]);
    let resumed = env.keel().current_dir("/").args(["resume", &session, "again"]).output().unwrap();
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(stdout(&resumed).trim(), "second");
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
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--approval",
        "auto",
        "--json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!stdout(&output).contains("0000-CANARY"), "the canary leaked");
    assert!(!ws.join("docs/private/new.md").exists());
}

/// A damaged record in one session (../shared/cases/bugs/B05's kind) is reported by what
/// reads it, and every session is still listed (`keel sessions` reads the summary table,
/// never the events: issue #13).
#[test]
fn one_corrupt_session_does_not_hide_the_others() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"hi"}]}"#);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--json", "t"]);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        ids.push(json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned());
    }
    let db = rusqlite::Connection::open(env.home.path().join("keel.sqlite")).unwrap();
    db.execute("UPDATE events SET body = '{\"torn' WHERE session_id = ?1 AND seq = 3", [&ids[0]])
        .unwrap();
    drop(db);
    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&ids[1]), "{}", stdout(&listed));
    assert!(stdout(&listed).contains(&ids[0]), "{}", stdout(&listed));
    let log = env.run(&["log", &ids[0]]);
    assert_eq!(log.status.code(), Some(1));
    assert!(stderr(&log).contains("corrupt event at seq 3"), "{}", stderr(&log));
}

/// Issue #13: `keel sessions` shows each session's usage from the summary table the store
/// keeps with every append, summed over every response of every turn.
#[test]
fn sessions_show_usage_summed_over_every_turn() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":300,"output_tokens":100}},
            {"text":"first","usage":{"input_tokens":400,"output_tokens":20}},
            {"text":"second","usage":{"input_tokens":500,"output_tokens":7}}
        ]}"#,
    );
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "--json", "t"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let output = env.run(&["resume", &session, "and more"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed: serde_json::Value =
        serde_json::from_str(stdout(&env.run(&["sessions", "--json"])).trim()).unwrap();
    assert_eq!(listed["session_id"], session.as_str());
    let usage = &listed["usage"];
    assert_eq!(
        (&usage["input_tokens"], &usage["output_tokens"], &usage["responses"]),
        (&serde_json::json!(1200), &serde_json::json!(127), &serde_json::json!(3)),
        "{listed}"
    );
    let table = stdout(&env.run(&["sessions"]));
    assert!(table.contains(&session) && table.contains("1327 tok"), "{table}");
}

#[test]
fn stop_on_a_run_whose_process_was_killed_says_it_was_interrupted_and_exits_1() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, LONG_COMMAND);
    let mut child = env
        .keel()
        .args([
            "run",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            &model,
            "--approval",
            "auto",
            "--sandbox",
            "bypass",
            "t",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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
    let mut child = env
        .keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto"])
        .args(["--sandbox", "bypass", "t"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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

#[test]
fn the_test_environment_has_a_private_home() {
    let env = Env::new();
    let ws = env.workspace();
    let home = env.home.path().to_str().unwrap();
    let model = scripted(
        &env,
        &serde_json::json!({"steps": [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo \"home=$HOME\""}}]},
            {"text": "done", "expect": {"contains": format!("home={home}")}}
        ]})
        .to_string(),
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
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "done\n");
}

/// Starts `keel run` on [`LONG_COMMAND`] in `ws`, waits until its command runs, and
/// `kill -9`s it; returns the killed run's session id.
fn kill_a_run(env: &Env, ws: &std::path::Path, known: &[String]) -> String {
    let model = format!("scripted:{}", env.write_script("long.json", LONG_COMMAND).display());
    let mut child = env
        .keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto"])
        .args(["--sandbox", "bypass", "t"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
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

/// With no ledger yet, the read-only commands say so and create nothing under KEEL_HOME
/// (no keel.sqlite, no -wal); the neighbour: after a run, the same listing shows it.
#[test]
fn sessions_and_log_without_a_ledger_create_nothing() {
    let env = Env::new();
    let listing = |env: &Env| {
        std::fs::read_dir(env.home.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with("keel.sqlite"))
            .collect::<Vec<_>>()
    };
    let sessions = env.run(&["sessions"]);
    assert_eq!(sessions.status.code(), Some(0), "{}", stderr(&sessions));
    assert!(stderr(&sessions).contains("no sessions yet"), "{}", stderr(&sessions));
    let json = env.run(&["sessions", "--json"]);
    assert_eq!((json.status.code(), stdout(&json)), (Some(0), String::new()));
    let log = env.run(&["log", "zzzz"]);
    assert_eq!(log.status.code(), Some(2), "{}", stderr(&log));
    assert!(stderr(&log).contains("no session matches 'zzzz'"), "{}", stderr(&log));
    let last = env.run(&["log", "--last"]);
    assert_eq!(last.status.code(), Some(2), "{}", stderr(&last));
    assert!(stderr(&last).contains("there are no sessions yet"), "{}", stderr(&last));
    assert_eq!(listing(&env), Vec::<String>::new(), "nothing was created");
    let ws = env.workspace();
    let model = format!("scripted:{}", env.write_script("d.json", DONE_SCRIPT).display());
    let run = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &model, "-q", "t"]);
    assert_eq!(run.status.code(), Some(0), "{}", stderr(&run));
    let json = env.run(&["sessions", "--json"]);
    assert_eq!(stdout(&json).lines().count(), 1, "{}", stdout(&json));
}

const DONE_SCRIPT: &str = r#"{"steps":[{"text":"done"}]}"#;

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
    let mut child = env
        .keel()
        .args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "--approval", "auto"])
        .args(["--sandbox", "bypass", "t"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let session = wait_for_prepared(&env);
    let pid = child.id().to_string();
    let signal = |name: &str| {
        let sent = std::process::Command::new("kill").arg(name).arg(&pid).status();
        assert!(sent.unwrap().success(), "kill {name}");
    };
    signal("-STOP");
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
    signal("-CONT");
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

/// Runs `command` (stdout and stderr captured, stdin closed), failing the test instead of
/// hanging when it has not ended within 30 s.
fn output_within_30s(mut command: std::process::Command) -> std::process::Output {
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            let output = child.wait_with_output().unwrap();
            panic!("keel hung; stderr: {}", stderr(&output));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn mkfifo(path: &std::path::Path) {
    let status = std::process::Command::new("mkfifo").arg(path).status().unwrap();
    assert!(status.success(), "mkfifo {}", path.display());
}

/// A FIFO given as the scripted model's file is refused (exit 2), never opened for a
/// blocking read that would hang keel; so is a script past the 16 MiB cap. The neighbour:
/// a regular script beside them runs.
#[test]
fn redteam_input_a_fifo_or_oversized_scripted_model_file_is_refused_not_hung() {
    let env = Env::new();
    let ws = env.workspace();
    let fifo = env.scratch.path().join("script.fifo");
    mkfifo(&fifo);
    let run = |model: String| {
        let mut command = env.keel();
        command.args(["run", "-C", ws.to_str().unwrap(), "-m", &model, "hi"]);
        output_within_30s(command)
    };
    let output = run(format!("scripted:{}", fifo.display()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("is not a regular file"), "{}", stderr(&output));
    let huge = env.scratch.path().join("huge.json");
    std::fs::File::create(&huge).unwrap().set_len(16 * 1024 * 1024 + 1).unwrap();
    let output = run(format!("scripted:{}", huge.display()));
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("more than the 16777216 bytes"), "{}", stderr(&output));
    let hello = env.write_script("hello.json", r#"{"steps":[{"text":"hello there"}]}"#);
    let output = run(format!("scripted:{}", hello.display()));
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output), "hello there\n");
}

/// A FIFO at `KEEL_HOME/keel.sqlite` (or at its `-wal`) is refused with a clear error by
/// the listing and by a run, never opened (SQLite's blocking open would hang). The
/// neighbour: with a regular ledger there, both work.
#[test]
fn redteam_home_a_fifo_as_the_ledger_is_refused_not_hung() {
    let env = Env::new();
    let ws = env.workspace();
    let ledger = env.home.path().join("keel.sqlite");
    let hello = scripted(&env, r#"{"steps":[{"text":"hello there"}]}"#);
    let keel = |args: &[&str]| {
        let mut command = env.keel();
        command.args(args);
        output_within_30s(command)
    };
    let run_args = ["run", "-C", ws.to_str().unwrap(), "-m", hello.as_str(), "hi"];
    mkfifo(&ledger);
    for args in [&["sessions"][..], &run_args[..]] {
        let output = keel(args);
        assert_ne!(output.status.code(), Some(0), "{args:?}");
        let err = stderr(&output);
        assert!(
            err.contains(&format!("ledger {} is not a regular file", ledger.display())),
            "{err}"
        );
        assert!(err.contains("FIFO"), "{err}");
    }
    std::fs::remove_file(&ledger).unwrap();
    let output = keel(&run_args);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // A FIFO beside a real ledger, as its WAL, is refused too.
    let wal = env.home.path().join("keel.sqlite-wal");
    // Checkpointed first, so the run's events are in the file, not only in the WAL.
    {
        let connection = rusqlite::Connection::open(&ledger).unwrap();
        connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    assert!(!wal.exists());
    mkfifo(&wal);
    let output = keel(&["sessions"]);
    assert!(
        stderr(&output).contains("keel.sqlite-wal is not a regular file"),
        "{}",
        stderr(&output)
    );
    std::fs::remove_file(&wal).unwrap();
    let output = keel(&["sessions"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).lines().count(), 1, "{}", stdout(&output));

    // KEEL_HOME itself a FIFO, a plain file or a dangling link: refused by what it is.
    let scratch = tempfile::tempdir().unwrap();
    for (home, kind) in [
        (scratch.path().join("fifo"), "a FIFO"),
        (scratch.path().join("file"), "a file"),
        (scratch.path().join("dangling"), "a symbolic link to nothing"),
    ] {
        match kind {
            "a file" => std::fs::write(&home, "not a folder").unwrap(),
            "a FIFO" => mkfifo(&home),
            _ => std::os::unix::fs::symlink(scratch.path().join("missing"), &home).unwrap(),
        }
        // (Through a dangling link there is no ledger to list: `keel sessions` says so.)
        let dangling = kind.starts_with("a symbolic link");
        let commands =
            if dangling { &[&run_args[..]][..] } else { &[&["sessions"][..], &run_args[..]] };
        for args in commands {
            let mut command = env.keel();
            command.env("KEEL_HOME", &home).args(*args);
            let output = output_within_30s(command);
            assert_ne!(output.status.code(), Some(0), "{args:?}");
            let err = stderr(&output);
            let said = format!("cannot keep the ledger in {}: it is {kind}", home.display());
            assert!(err.contains(&said), "{err}");
            assert!(!err.contains("os error"), "{err}");
        }
    }
}

/// `keel ARGS` with `KEEL_HOME` bind-mounted read-only in a private mount namespace (a
/// read-only mount binds root too, unlike permission bits); the shell first proves the
/// folder cannot be written.
fn keel_in_read_only_home(env: &Env, args: &[&str]) -> std::process::Output {
    let keel = env.keel();
    let mut command = std::process::Command::new("unshare");
    command
        .args(["-m", "sh", "-c"])
        .arg(
            "mount --bind \"$KEEL_HOME\" \"$KEEL_HOME\" && mount -o remount,bind,ro \"$KEEL_HOME\" \
             && ! touch \"$KEEL_HOME/probe\" 2>/dev/null && exec \"$0\" \"$@\"",
        )
        .arg(keel.get_program())
        .args(args);
    for (key, value) in keel.get_envs() {
        match value {
            Some(value) => command.env(key, value),
            None => command.env_remove(key),
        };
    }
    output_within_30s(command)
}

/// With `KEEL_HOME` read-only and only the ledger file there (no `-wal`, no `-shm`),
/// `keel sessions` and `keel log` still read it; with a `-wal` that would need a `-shm`
/// created beside it, they say clearly that KEEL_HOME cannot be written. The neighbour:
/// writable again, the same home lists as before.
#[test]
fn sessions_and_log_read_a_ledger_in_a_read_only_keel_home() {
    let env = Env::new();
    let ws = env.workspace();
    let hello = scripted(&env, r#"{"steps":[{"text":"hello there"}]}"#);
    let output = env.run(&["run", "-C", ws.to_str().unwrap(), "-m", &hello, "--json", "hi"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let session = json_lines(&output)[0]["session_id"].as_str().unwrap().to_owned();
    let ledger = env.home.path().join("keel.sqlite");
    let beside = |suffix: &str| env.home.path().join(format!("keel.sqlite{suffix}"));
    // Checkpointed and closed by the last connection: the file alone is the ledger.
    {
        let connection = rusqlite::Connection::open(&ledger).unwrap();
        connection.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).unwrap();
    }
    assert!(!beside("-wal").exists() && !beside("-shm").exists());
    let before = std::fs::read(&ledger).unwrap();

    let listed = keel_in_read_only_home(&env, &["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&session) && stdout(&listed).contains("completed"));
    let log = keel_in_read_only_home(&env, &["log", &session]);
    assert_eq!(log.status.code(), Some(0), "{}", stderr(&log));
    assert!(stdout(&log).contains("hello there"), "{}", stdout(&log));
    assert_eq!(std::fs::read(&ledger).unwrap(), before);

    // A WAL beside it (its events may be only there): a clear error, never a short read.
    std::fs::copy(&ledger, beside("-wal")).unwrap();
    let refused = keel_in_read_only_home(&env, &["sessions"]);
    assert_ne!(refused.status.code(), Some(0));
    let err = stderr(&refused);
    assert!(err.contains("its folder (KEEL_HOME) cannot be written"), "{err}");
    assert!(err.contains("-wal"), "{err}");
    std::fs::remove_file(beside("-wal")).unwrap();

    let listed = env.run(&["sessions"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    assert!(stdout(&listed).contains(&session));
}
