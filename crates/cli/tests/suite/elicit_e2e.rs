//! A server's questions (MCP `elicitation/create`) through the whole loop: the real `keel`
//! binary, a scripted model, and a small stdio MCP server
//! (crates/mcp/tests/servers/elicit_server.py) that asks what a test tells it to.

use super::support::{Env, events_of, json_lines, repo_root, stderr, stdout};

/// `[mcp_servers.NAME]` for the elicit server, with `ask` declared a read when `read`.
pub(crate) fn elicit_server(name: &str, read: bool) -> String {
    let script = repo_root().join("crates/mcp/tests/servers/elicit_server.py");
    let mut text = format!(
        "[mcp_servers.{name}]\ncommand = \"python3\"\nargs = [{}]\n",
        toml::Value::String(script.display().to_string())
    );
    if read {
        text.push_str(&format!(
            "[mcp_servers.{name}.tools.ask]\naccess = \"read\"\n\
             [mcp_servers.{name}.tools.unprompted]\naccess = \"read\"\n\
             [mcp_servers.{name}.tools.ask_later]\naccess = \"read\"\n"
        ));
    }
    text
}

fn run(
    env: &Env,
    config: &str,
    script: serde_json::Value,
    args: &[&str],
) -> Vec<serde_json::Value> {
    std::fs::write(env.home.path().join("config.toml"), config).unwrap();
    let workspace = env.workspace();
    let script = env.write_script("script.json", &script.to_string());
    let model = format!("scripted:{}", script.display());
    let mut all = vec!["run", "-C", workspace.to_str().unwrap(), "-m", &model, "--json"];
    all.extend_from_slice(args);
    all.push("use the server");
    let output = env.run(&all);
    assert_eq!(
        output.status.code(),
        Some(0),
        "stderr: {}\nstdout: {}",
        stderr(&output),
        stdout(&output)
    );
    json_lines(&output)
}

fn defaults_form() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {
        "color": {"type": "string", "enum": ["red", "green"], "default": "green"}
    }, "required": ["color"]})
}

#[test]
fn elicitation_under_approval_auto_takes_defaults_and_is_recorded() {
    let env = Env::new();
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask",
            "arguments": {"message": "Pick a colour", "schema": defaults_form()}}]},
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {}}],
         "expect": {"contains": ["action=accept content={\"color\": \"green\"}"]}},
        {"text": "Done.", "expect": {"contains": ["action=decline content=null"]}}
    ]});
    let events = run(&env, &elicit_server("el", false), script, &["--approval", "auto"]);
    let asked = events_of(&events, "elicitation_requested");
    assert_eq!(asked.len(), 2, "{asked:?}");
    assert_eq!(asked[0]["server"], "el");
    assert_eq!(asked[0]["message"], "Pick a colour");
    assert_eq!(asked[0]["tool"], "mcp__el__ask");
    assert_eq!(asked[0]["schema"], defaults_form());
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered.len(), 2, "{answered:?}");
    assert_eq!(answered[0]["action"], "accept");
    assert_eq!(answered[0]["by"], "approval=auto");
    assert_eq!(answered[0]["content"], serde_json::json!({"color": "green"}));
    assert_eq!(answered[0]["question"], asked[0]["question"]);
    // A required field without a default cannot be answered headless: declined, saying so.
    assert_eq!(answered[1]["action"], "decline");
    assert!(answered[1]["reason"].as_str().unwrap().contains("name"), "{}", answered[1]);
    assert!(answered[1].get("content").is_none());
    assert_eq!(events.last().unwrap()["kind"], "run_completed");
}

#[test]
fn elicitation_under_approval_deny_is_declined_and_recorded() {
    let env = Env::new();
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": defaults_form()}}]},
        {"text": "Declined.", "expect": {"last_outcomes": ["ok"],
            "contains": ["action=decline content=null"]}}
    ]});
    let events = run(&env, &elicit_server("el", true), script, &["--approval", "deny"]);
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["action"], "decline");
    assert_eq!(answered[0]["by"], "approval=deny");
}

#[test]
fn redteam_mcp_elicit_a_question_while_no_call_runs_is_declined() {
    let env = Env::new();
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask_later", "arguments": {}}]},
        // The server asks while keel runs something else (no call of it is running).
        {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 1.5"}}]},
        {"tool_calls": [{"name": "mcp__el__unprompted", "arguments": {}}]},
        // The legitimate neighbour: a question during a call of the server is asked.
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": defaults_form()}}],
         "expect": {"contains": ["unprompted: action=decline"]}},
        {"text": "Done.", "expect": {"contains": ["action=accept"]}}
    ]});
    let events = run(&env, &elicit_server("el", true), script, &["--approval", "auto"]);
    // Only the neighbour's question reached the user's channel and the ledger.
    let asked = events_of(&events, "elicitation_requested");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["tool"], "mcp__el__ask");
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered[0]["action"], "accept");
}

#[test]
fn redteam_mcp_elicit_nested_or_huge_forms_are_declined_unasked() {
    let env = Env::new();
    // A nested object is not even a form to rmcp's typed decoding: the server gets an
    // error answer and nobody is asked.
    let nested = serde_json::json!({"type": "object", "properties": {
        "card": {"type": "object", "properties": {"number": {"type": "string"}}}
    }});
    let huge = serde_json::json!({"type": "object", "properties": {
        "pick": {"type": "string", "enum": (0..5000).map(|i| format!("v{i}")).collect::<Vec<_>>()}
    }});
    let many = serde_json::json!({"type": "object", "properties": (0..100)
        .map(|i| (format!("f{i}"), serde_json::json!({"type": "string", "default": "x"})))
        .collect::<serde_json::Map<_, _>>()});
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": nested}}]},
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": huge}}],
         "expect": {"contains": ["error="]}},
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": many}}],
         "expect": {"contains": ["action=decline"]}},
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": defaults_form()}}],
         "expect": {"contains": ["action=decline"]}},
        {"text": "Done.", "expect": {"contains": ["action=accept"]}}
    ]});
    let events = run(&env, &elicit_server("el", true), script, &["--approval", "auto"]);
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered.len(), 3, "{answered:?}");
    for refused in &answered[..2] {
        assert_eq!(refused["action"], "decline", "{refused}");
        assert_eq!(refused["by"], "keel", "{refused}");
        assert!(refused["reason"].as_str().unwrap().starts_with("keel refuses this form"));
    }
    assert!(answered[0]["reason"].as_str().unwrap().contains("5000"), "{}", answered[0]);
    assert!(answered[1]["reason"].as_str().unwrap().contains("100 fields"), "{}", answered[1]);
    // The legitimate neighbour: a flat form is answered.
    assert_eq!(answered[2]["action"], "accept");
}

#[test]
fn redteam_mcp_elicit_plan_mode_and_deny_rules_ask_nothing_past_consent() {
    let env = Env::new();
    // `el`'s ask is an undeclared local tool (a write); `elr`'s is declared a read.
    let config = format!(
        "{}{}[permissions]\ndeny = [\"mcp__elr__unprompted\"]\n",
        elicit_server("el", false),
        elicit_server("elr", true)
    );
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {"schema": defaults_form()}}]},
        {"tool_calls": [{"name": "mcp__elr__unprompted", "arguments": {}}],
         "expect": {"last_outcomes": ["refused"]}},
        {"tool_calls": [{"name": "mcp__elr__ask", "arguments": {"schema": defaults_form()}}],
         "expect": {"last_outcomes": ["refused"]}},
        {"text": "The plan.", "expect": {"last_outcomes": ["ok"], "contains": ["action=accept"]}}
    ]});
    let events = run(&env, &config, script, &["--approval", "auto", "--mode", "plan"]);
    let results: Vec<(&str, &str)> = events_of(&events, "tool_result")
        .iter()
        .map(|event| (event["tool"].as_str().unwrap(), event["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        results,
        [("mcp__el__ask", "refused"), ("mcp__elr__unprompted", "refused"), ("mcp__elr__ask", "ok")]
    );
    // The refused write never ran, so its server asked nothing; the read's question was.
    let asked = events_of(&events, "elicitation_requested");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["tool"], "mcp__elr__ask");
    // No answer was turned into consent: the refused calls stay refused.
    assert!(events_of(&events, "permission_settled").iter().all(|e| e["answer"] == "deny"));
}

#[test]
fn tools_list_changed_is_offered_at_a_next_step_recorded_and_still_gated() {
    let env = Env::new();
    let config = format!(
        "{}[mcp_servers.el.tools.add_tool]\naccess = \"read\"\n\
         [mcp_servers.el.tools.remove_tool]\naccess = \"read\"\n",
        elicit_server("el", true)
    );
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__add_tool", "arguments": {}}]},
        // A second list_changed that changes nothing is not recorded.
        {"tool_calls": [{"name": "mcp__el__add_tool", "arguments": {}}]},
        {"tool_calls": [{"name": "mcp__el__unprompted", "arguments": {}}],
         "expect": {"last_outcomes": ["ok"]}},
        // The new tool is in this request's tool list; it is an undeclared local tool, so
        // a write, and `--approval deny` refuses it.
        {"tool_calls": [{"name": "mcp__el__extra", "arguments": {}}],
         "expect": {"contains": ["mcp__el__extra"]}},
        {"tool_calls": [{"name": "mcp__el__remove_tool", "arguments": {}}],
         "expect": {"last_outcomes": ["refused"]}},
        {"tool_calls": [{"name": "mcp__el__unprompted", "arguments": {}}]},
        {"tool_calls": [{"name": "mcp__el__extra", "arguments": {}}]},
        {"text": "Gone.", "expect": {"last_outcomes": ["error"],
            "contains": ["tool 'mcp__el__extra' was removed by its server"]}}
    ]});
    let events = run(&env, &config, script, &["--approval", "deny"]);
    let changes = events_of(&events, "tools_changed");
    assert_eq!(changes.len(), 2, "{changes:?}");
    assert_eq!(changes[0]["added"], serde_json::json!(["mcp__el__extra"]));
    assert_eq!(changes[0]["removed"], serde_json::json!([]));
    assert_eq!(changes[1]["added"], serde_json::json!([]));
    assert_eq!(changes[1]["removed"], serde_json::json!(["mcp__el__extra"]));
    // Gating applied to the new tool as to any: asked as a write, refused.
    let asked = events_of(&events, "permission_requested");
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!(asked[0]["tool"], "mcp__el__extra");
    assert_eq!(asked[0]["access"], "write");
    // The run's composition named the tools at its start; the change came after it.
    let composition = events_of(&events, "run_composition");
    assert!(!composition[0]["tools"].as_array().unwrap().iter().any(|t| t == "mcp__el__extra"));
}
