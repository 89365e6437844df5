//! Code Mode and plan mode through the real binary, real tools and real files (issue #20).

use serde_json::{Value, json};

use super::support::{Env, json_lines, scripted, stderr, stdout};

fn results_of<'a>(events: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    events
        .iter()
        .filter(|e| {
            e["kind"] == "tool_result" && e["call_id"].as_str().unwrap().starts_with(prefix)
        })
        .collect()
}

#[test]
fn code_mode_e2e_a_nested_write_under_approval_deny_is_refused_and_paired() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let code = "const w = await tools.write_file({path: 'b.txt', content: 'b'});\n\
                const r = await tools.read_file({path: 'a.txt'});\n\
                print('write:', w.split('\\n')[0]);\n\
                print('read ok:', r.includes('alpha'));";
    let model = scripted(
        &env,
        &json!({"steps": [
            {"tool_calls": [{"name": "run_code", "arguments": {"code": code}}]},
            {"text": "Done."}
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
        "deny",
        "--json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!ws.join("b.txt").exists(), "the nested write ran");
    let events = json_lines(&output);
    let parent = events
        .iter()
        .find(|e| e["kind"] == "model_response")
        .map(|e| e["tool_calls"][0]["call_id"].as_str().unwrap().to_owned())
        .unwrap();
    let nested: Vec<&Value> = events.iter().filter(|e| e["kind"] == "tool_call").collect();
    assert_eq!(nested.len(), 2);
    for call in &nested {
        assert_eq!(call["parent_call_id"], parent.as_str());
        let id = call["call_id"].as_str().unwrap();
        assert_eq!(results_of(&events, id).len(), 1, "{id} has exactly one result");
    }
    let write = results_of(&events, nested[0]["call_id"].as_str().unwrap())[0];
    assert_eq!(write["outcome"], "refused");
    let cell = events
        .iter()
        .find(|e| e["kind"] == "tool_result" && e["call_id"] == parent.as_str())
        .unwrap();
    assert_eq!(cell["outcome"], "ok");
    assert_eq!(
        cell["content"],
        "write: refused: permission was denied for this call; do not retry it, report what you \
         would have done\nread ok: true\n"
    );
}

#[test]
fn redteam_codemode_a_nested_command_stays_in_the_sandbox() {
    let env = Env::new();
    let ws = env.workspace();
    let outside = env.scratch.path().join("outside.txt");
    let code = format!(
        "print(await tools.bash({{command: 'echo escaped > {}'}}));\n\
         print(await tools.bash({{command: 'echo inside > inside.txt && cat inside.txt'}}));",
        outside.display()
    );
    let model = scripted(
        &env,
        &json!({"steps": [
            {"tool_calls": [{"name": "run_code", "arguments": {"code": code}}]},
            {"text": "Done."}
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
        "--json",
        "t",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    // The managed sandbox contains the program's commands as it contains the model's.
    assert!(!outside.exists(), "a nested command wrote outside the workspace");
    // The legitimate neighbour: a write inside the workspace works.
    assert_eq!(std::fs::read_to_string(ws.join("inside.txt")).unwrap(), "inside\n");
    let events = json_lines(&output);
    assert_eq!(events.iter().filter(|e| e["kind"] == "tool_call").count(), 2);
}

#[test]
fn plan_mode_e2e_plans_then_resume_approve_plan_carries_it_out() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::write(ws.join("a.txt"), "alpha\n").unwrap();
    let model = scripted(
        &env,
        &json!({"steps": [
            {"tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "write_file", "arguments": {"path": "b.txt", "content": "b\n"}},
                {"name": "plan", "arguments": {"items": [{"text": "write b.txt", "status": "pending"}]}}
            ]},
            {"text": "Plan: write b.txt.", "expect": {"last_outcomes": ["ok", "refused", "ok"]}},
            {"tool_calls": [{"name": "write_file", "arguments": {"path": "b.txt", "content": "b\n"}}],
             "expect": {"contains": "approved"}},
            {"text": "b.txt written.", "expect": {"last_outcomes": ["ok"]}}
        ]})
        .to_string(),
    );
    let output = env.run(&[
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--mode",
        "plan",
        "--approval",
        "auto",
        "-q",
        "plan b",
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "Plan: write b.txt.");
    assert!(!ws.join("b.txt").exists(), "plan mode wrote");
    let hint = stderr(&output);
    assert!(hint.contains("--approve-plan"), "{hint}");
    let listed = env.run(&["sessions", "--json"]);
    let session: Value = serde_json::from_str(stdout(&listed).lines().next().unwrap()).unwrap();
    let session = session["session_id"].as_str().unwrap().to_owned();

    // Approving carries the plan out, live.
    let output = env.run(&["resume", &session, "--approve-plan", "--approval", "auto", "-q"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(stdout(&output).trim(), "b.txt written.");
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "b\n");
    let log: Vec<Value> = stdout(&env.run(&["log", &session, "--json"]))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(log.iter().filter(|e| e["kind"] == "plan_approved").count(), 1);
    let modes: Vec<&str> = log
        .iter()
        .filter(|e| e["kind"] == "run_started")
        .map(|e| e["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["plan", "live"]);
    // A second approval is refused: there is no plan waiting.
    let again = env.run(&["resume", &session, "--approve-plan", "--approval", "auto"]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}

#[test]
fn redteam_plan_mode_resume_approve_plan_needs_a_plan() {
    let env = Env::new();
    let ws = env.workspace();
    // The plan-mode run fails before it completes (the script's expectation fails), so
    // the session has no plan.
    let model = scripted(
        &env,
        &json!({"steps": [
            {"text": "Plan: write b.txt.", "expect": {"contains": "a phrase the request lacks"}}
        ]})
        .to_string(),
    );
    let args = ["run", "-C", ws.to_str().unwrap(), "-m", &model, "--mode", "plan", "-q", "p"];
    let output = env.run(&args);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    let listed = env.run(&["sessions", "--json"]);
    let session: Value = serde_json::from_str(stdout(&listed).lines().next().unwrap()).unwrap();
    let session = session["session_id"].as_str().unwrap().to_owned();

    let output = env.run(&["resume", &session, "--approve-plan", "--approval", "auto", "-q"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(stderr(&output).contains("no plan to approve"), "{}", stderr(&output));
    let log: Vec<Value> = stdout(&env.run(&["log", &session, "--json"]))
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(log.iter().filter(|e| e["kind"] == "plan_approved").count(), 0);
    assert_eq!(log.iter().filter(|e| e["kind"] == "run_started").count(), 1, "a run started");
    // The neighbour (a completed plan is approved and carried out) is
    // plan_mode_e2e_plans_then_resume_approve_plan_carries_it_out.
}
