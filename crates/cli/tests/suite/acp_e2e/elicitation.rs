//! An MCP server's question over ACP: asked with `elicitation/create` when the client
//! offers it, declined with the reason when it does not.

use serde_json::{Value, json};

use super::harness::{Raw, keel_log, scripted_args};
use crate::suite::support::{Env, events_of};

/// A prompt whose one call asks a question; the raw client offers elicitation or not.
fn ask_over_acp(env: &Env, capabilities: Value, expect: &str) -> (Raw, String) {
    std::fs::write(
        env.home.path().join("config.toml"),
        crate::suite::elicit_e2e::elicit_server("el", true),
    )
    .unwrap();
    let ws = env.workspace().canonicalize().unwrap();
    let script = json!({"steps": [
        {"tool_calls": [{"name": "mcp__el__ask", "arguments": {}}]},
        {"text": "done", "expect": {"contains": [expect]}}
    ]});
    let args = scripted_args(env, "ask.json", &script.to_string());
    let mut raw = Raw::start(env, &args);
    raw.send(
        &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": 1, "clientCapabilities": capabilities}})
        .to_string(),
    );
    raw.response(1);
    let session = raw.open_session(2, &ws);
    raw.prompt(3, &session, "ask");
    (raw, session)
}

#[test]
fn acp_a_servers_question_is_asked_with_elicitation_create_and_recorded() {
    let env = Env::new();
    let (mut raw, session) = ask_over_acp(
        &env,
        json!({"elicitation": {"form": {}}}),
        "action=accept content={\"color\": \"red\", \"name\": \"Zed\"}",
    );
    let asked = raw.until("an elicitation", |v| v["method"] == "elicitation/create");
    let params = &asked["params"];
    assert_eq!(params["mode"], "form", "{asked}");
    assert_eq!(params["sessionId"], session.as_str());
    assert!(params["toolCallId"].as_str().is_some_and(|id| !id.is_empty()), "{asked}");
    let message = params["message"].as_str().unwrap();
    assert!(message.starts_with("MCP server 'el' asks (its words, not keel's): "), "{message}");
    assert!(message.ends_with("Who are you?"), "{message}");
    assert_eq!(params["requestedSchema"]["required"], json!(["name"]));
    raw.send(
        &json!({"jsonrpc": "2.0", "id": asked["id"],
                "result": {"action": "accept", "content": {"name": "Zed", "color": "red"}}})
        .to_string(),
    );
    assert_eq!(raw.response(3)["result"]["stopReason"], "end_turn");
    let events = keel_log(&env, &session);
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["by"], "client");
    assert_eq!(answered[0]["content"], json!({"name": "Zed", "color": "red"}));
}

#[test]
fn acp_a_client_without_elicitation_has_the_question_declined_with_the_reason() {
    let env = Env::new();
    let (mut raw, session) = ask_over_acp(&env, json!({}), "action=decline content=null");
    assert_eq!(raw.response(3)["result"]["stopReason"], "end_turn");
    let events = keel_log(&env, &session);
    let answered = events_of(&events, "elicitation_answered");
    assert_eq!(answered[0]["action"], "decline", "{answered:?}");
    assert!(
        answered[0]["reason"].as_str().unwrap().contains("does not offer elicitation"),
        "{answered:?}"
    );
}
