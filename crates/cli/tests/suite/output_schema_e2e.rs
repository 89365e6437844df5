//! `keel run --output-schema FILE`: the final answer must match the schema, handed in
//! through the intrinsic `submit`; an invalid submission is answered with the validation
//! errors and retried within the budget; the answer is printed as JSON.

use super::support::{Env, json_lines, scripted, stderr, stdout};

const SCHEMA: &str = r#"{
  "type": "object",
  "properties": {
    "title": {"type": "string", "minLength": 1},
    "severity": {"enum": ["low", "high"]}
  },
  "required": ["title", "severity"],
  "additionalProperties": false
}"#;

fn run(env: &Env, script: &str, extra: &[&str]) -> std::process::Output {
    let schema = env.write_script("schema.json", SCHEMA);
    let ws = env.workspace();
    let model = scripted(env, script);
    let mut args = vec![
        "run",
        "-C",
        ws.to_str().unwrap(),
        "-m",
        &model,
        "--output-schema",
        schema.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push("triage the bug");
    env.run(&args)
}

#[test]
fn a_valid_submission_is_the_answer_printed_as_json() {
    let env = Env::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"submit","arguments":{"title":"crash on start","severity":"high"}}],
         "expect":{"contains":"call `submit`"}}
    ]}"#;
    let output = run(&env, script, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let answer: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(answer, serde_json::json!({"title": "crash on start", "severity": "high"}));

    // `--output-format json`: the one object carries the answer parsed as well.
    let output = run(&env, script, &["--output-format", "json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let object: serde_json::Value = serde_json::from_str(stdout(&output).trim()).unwrap();
    assert_eq!(
        object["structured_output"],
        serde_json::json!({"title": "crash on start", "severity": "high"})
    );
    assert_eq!(object["outcome"], "completed");
}

#[test]
fn an_invalid_submission_is_told_its_errors_and_the_valid_retry_completes() {
    let env = Env::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"submit","arguments":{"title":"","severity":"urgent"}}]},
        {"tool_calls":[{"name":"submit","arguments":{"title":"crash","severity":"low"}}],
         "expect":{"last_outcomes":["error"],"contains":"invalid arguments for submit"}}
    ]}"#;
    let output = run(&env, script, &["--json"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = json_lines(&output);
    let errors: Vec<&str> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result" && e["outcome"] == "error")
        .map(|e| e["content"].as_str().unwrap())
        .collect();
    assert_eq!(errors.len(), 1);
    // Both violations are named for the model.
    assert!(errors[0].contains("/title") && errors[0].contains("/severity"), "{}", errors[0]);
    let completed = events.iter().find(|e| e["kind"] == "run_completed").unwrap();
    let answer: serde_json::Value =
        serde_json::from_str(completed["answer"].as_str().unwrap()).unwrap();
    assert_eq!(answer, serde_json::json!({"title": "crash", "severity": "low"}));
}

#[test]
fn a_submission_never_valid_stops_at_the_budget_suspended() {
    let env = Env::new();
    let bad = r#"{"tool_calls":[{"name":"submit","arguments":{"title":"x"}}]}"#;
    let script = format!(r#"{{"steps":[{bad},{bad},{bad}]}}"#);
    let output = run(&env, &script, &["--max-steps", "3", "--json"]);
    // Exit 3: suspended (budget), never completed with an invalid answer.
    assert_eq!(output.status.code(), Some(3), "{}", stderr(&output));
    let events = json_lines(&output);
    assert!(events.iter().any(|e| e["kind"] == "run_suspended"));
    assert!(!events.iter().any(|e| e["kind"] == "run_completed"));
}

#[test]
fn an_invalid_schema_file_is_a_usage_error_before_the_run() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(&env, r#"{"steps":[{"text":"never asked"}]}"#);
    for (content, message) in
        [("{not json", "not JSON"), (r#"{"type": "no-such-type"}"#, "not a valid JSON Schema")]
    {
        let schema = env.write_script("bad-schema.json", content);
        let output = env.run(&[
            "run",
            "-C",
            ws.to_str().unwrap(),
            "-m",
            &model,
            "--output-schema",
            schema.to_str().unwrap(),
            "go",
        ]);
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        assert!(stderr(&output).contains(message), "{}", stderr(&output));
        assert!(stdout(&output).is_empty());
    }
    // No session was started.
    let sessions = env.run(&["sessions", "--json"]);
    let listed = stdout(&sessions);
    assert!(listed.trim().is_empty() || listed.trim() == "[]", "{listed}");
}
