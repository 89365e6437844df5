//! Budgets end to end: each ceiling suspends with exit 3, a checkpoint and a tools-off
//! report, and `keel resume` completes the turn.

use std::time::Duration;

use super::support::{Env, json_lines, scripted, stderr, stdout};

#[test]
fn max_steps_suspends_with_exit_3_and_resume_by_prefix_completes() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"read_file","arguments":{"path":"a.txt"}}]},
            {"text":"Report: read a.txt, it says alpha. Next: answer.","expect":{"contains":"Tools are off"}},
            {"text":"a.txt says alpha","expect":{"contains":"Report: read a.txt"}}
        ]}"#,
    );
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
    let events = json_lines(&output);
    assert_eq!(events.last().unwrap()["kind"], "run_suspended");
    assert!(events.last().unwrap()["reason"].as_str().unwrap().starts_with("stopped early"));
    let checkpoint = events.iter().find(|e| e["kind"] == "checkpoint").unwrap();
    assert_eq!(checkpoint["report"], "Report: read a.txt, it says alpha. Next: answer.");
    assert_eq!(checkpoint["evidence"][0]["tool"], "read_file");
    let session = events[0]["session_id"].as_str().unwrap().to_owned();

    let listed = env.run(&["sessions"]);
    assert!(
        stdout(&listed).contains(&session) && stdout(&listed).contains("suspended"),
        "{}",
        stdout(&listed)
    );

    let prefix = &session[..13];
    let output = env.run(&["resume", prefix]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "a.txt says alpha");

    let log = stdout(&env.run(&["log", prefix, "-v"]));
    assert!(log.contains("run_suspended") && log.contains("run_completed"), "{log}");
    // Nothing left to resume.
    let output = env.run(&["resume", prefix]);
    assert_eq!(output.status.code(), Some(2));
    let sessions = stdout(&env.run(&["sessions", "--json"]));
    assert!(sessions.contains("\"status\":\"completed\""), "{sessions}");
}

#[test]
fn token_and_time_budgets_suspend_with_a_checkpoint_and_resume_to_completion() {
    let env = Env::new();
    let ws = env.workspace();
    let step = r#"{"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":300,"output_tokens":100}}"#;
    let model = scripted(
        &env,
        &format!(
            r#"{{"steps":[{step},{{"text":"Report: listed the folder.","usage":{{"input_tokens":400,"output_tokens":20}}}},{{"text":"all done"}}]}}"#
        ),
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--max-tokens",
        "1000",
        "--json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let events = json_lines(&output);
    let exhausted = events.iter().find(|e| e["kind"] == "budget_exhausted").unwrap();
    assert_eq!(exhausted["report_requested"], true);
    assert!(exhausted["reason"].as_str().unwrap().contains("token budget"), "{exhausted}");
    assert!(events.iter().any(|e| e["kind"] == "checkpoint"));
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    let output = env.run(&["resume", &session]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "all done");

    // Wall clock: the command outlives the budget and is stopped while it runs.
    let model = scripted(
        &env,
        r#"{"steps":[{"tool_calls":[{"name":"bash","arguments":{"command":"sleep 20; echo late > late.txt"}}]},{"text":"resumed"}]}"#,
    );
    let started = std::time::Instant::now();
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--max-time",
        "2s",
        "--approval",
        "auto",
        "--sandbox",
        "bypass",
        "--json",
        "t",
    ]);
    assert!(started.elapsed() < Duration::from_secs(15), "the time budget did not stop the tool");
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let events = json_lines(&output);
    let result = events.iter().find(|e| e["kind"] == "tool_result").unwrap();
    assert_eq!(result["outcome"], "cancelled");
    assert!(result["content"].as_str().unwrap().contains("stopped early"));
    std::thread::sleep(Duration::from_millis(300));
    assert!(!ws.join("late.txt").exists());
}

#[test]
fn a_cost_budget_suspends_with_a_report_and_resume_completes() {
    let env = Env::new();
    let ws = env.workspace();
    let step = r#"{"tool_calls":[{"name":"list_dir","arguments":{"path":"."}}],"usage":{"input_tokens":100000,"output_tokens":10000}}"#;
    let script = env.write_script(
        "costly.json",
        &format!(
            r#"{{"steps":[{step},{step},{{"text":"Report: listed twice.","usage":{{"input_tokens":100000,"output_tokens":10000}}}},{{"text":"finished","usage":{{"input_tokens":1000,"output_tokens":0}}}}]}}"#
        ),
    );
    // $1 per million input tokens, $2 per million output: each step costs $0.12.
    std::fs::write(
        env.home.path().join("prices.toml"),
        format!(
            "[\"scripted:{}\"]\ninput_per_mtok = 1.0\noutput_per_mtok = 2.0\n",
            script.display()
        ),
    )
    .unwrap();
    let model = format!("scripted:{}", script.display());
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--max-cost-usd",
        "0.40",
        "--json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let events = json_lines(&output);
    let exhausted = events.iter().find(|e| e["kind"] == "budget_exhausted").unwrap();
    assert!(exhausted["reason"].as_str().unwrap().starts_with("stopped early: cost budget"));
    let checkpoint = events.iter().find(|e| e["kind"] == "checkpoint").unwrap();
    assert_eq!(checkpoint["report"], "Report: listed twice.");
    let suspended = events.last().unwrap();
    assert!((suspended["usage"]["cost_usd"].as_f64().unwrap() - 0.36).abs() < 1e-9, "{suspended}");
    let session = events[0]["session_id"].as_str().unwrap().to_owned();
    let output = env.run(&["resume", &session]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "finished");
    let listed = stdout(&env.run(&["sessions"]));
    // Session totals: the 3 steps of the first run and the final answer ($0.001).
    assert!(listed.contains("$0.3610"), "{listed}");
}
