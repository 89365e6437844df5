//! Turns through the official ACP SDK: consent, cancel, a prompt queued into a running
//! turn, `session/load` replaying the live updates, and the client's own MCP servers.

use std::path::PathBuf;

use serde_json::{Value, json};

use super::harness::{keel_log, run_client, scripted_args, updates_of};
use crate::suite::support::{Env, events_of, repo_root};

const TURNS: &str = r#"{"steps":[
 {"tool_calls":[{"name":"todo","arguments":{"items":[{"text":"write the files","status":"in_progress"}]}},{"name":"write_file","arguments":{"path":"approved.txt","content":"approved\n"}}],"usage":{"input_tokens":1000,"output_tokens":100}},
 {"tool_calls":[{"name":"write_file","arguments":{"path":"denied.txt","content":"denied\n"}}],"expect":{"last_outcomes":["ok","ok"]},"usage":{"input_tokens":1200,"output_tokens":100}},
 {"text":"Wrote approved.txt; denied.txt was refused.","expect":{"last_outcomes":["refused"]},"usage":{"input_tokens":1400,"output_tokens":50}},
 {"tool_calls":[{"name":"bash","arguments":{"command":"sleep 30"}}],"usage":{"input_tokens":1500,"output_tokens":20}},
 {"text":"never reached"}
]}"#;

const QUEUE: &str = r#"{"steps":[
 {"tool_calls":[{"name":"bash","arguments":{"command":"sleep 1"}}]},
 {"text":"Slept, and hello.","expect":{"contains":"Also say hello."}}
]}"#;

#[test]
fn acp_a_prompt_sent_while_a_turn_runs_joins_it_and_is_answered_when_it_ends() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let args = scripted_args(&env, "queue.json", QUEUE);
    let seen = run_client(&env, "queue", &args, &ws, &[]);
    assert_eq!(seen["stops"], json!(["end_turn", "end_turn"]), "{seen}");
    let events = keel_log(&env, seen["sessionId"].as_str().unwrap());
    assert_eq!(events_of(&events, "turn_started").len(), 1, "the queued prompt is no turn");
    let joined = events_of(&events, "input_joined");
    assert_eq!(joined.len(), 1);
    assert_eq!(joined[0]["input"], "Also say hello.");
    // Never mid-call: after the command's result, before the next request.
    let result = events_of(&events, "tool_result")[0];
    assert_eq!(result["outcome"], "ok", "{result}");
    let result = result["seq"].as_u64().unwrap();
    assert!(joined[0]["seq"].as_u64().unwrap() > result);
    assert_eq!(events_of(&events, "run_completed").len(), 1);
}

#[test]
fn acp_turns_consent_cancel_and_load_replay_with_the_official_sdk() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let args = scripted_args(&env, "turns.json", TURNS);
    let seen = run_client(&env, "turns", &args, &ws, &[]);

    // initialize: what an editor needs to know.
    let caps = &seen["initialize"]["agentCapabilities"];
    assert_eq!(caps["loadSession"], true, "{caps}");
    assert!(caps["sessionCapabilities"]["list"].is_object(), "{caps}");
    assert_eq!(caps["promptCapabilities"]["embeddedContext"], true, "{caps}");

    // The approved write happened, the denied one did not; the command was cancelled.
    assert_eq!(seen["stops"], json!(["end_turn", "cancelled"]), "{seen}");
    assert_eq!(std::fs::read_to_string(ws.join("approved.txt")).unwrap(), "approved\n");
    assert!(!ws.join("denied.txt").exists());
    assert!(seen["cancelMs"].as_u64().unwrap() < 10_000, "{seen}");
    // A prompt while a turn runs is queued into it; cancelled before its next step, the
    // turn never took it, and the prompt is answered so (not lost, not run).
    assert_eq!(seen["busy"]["code"], -32600, "{seen}");
    assert!(
        seen["busy"]["data"].as_str().unwrap().contains("before this prompt could join"),
        "{seen}"
    );
    let answers: Vec<&str> = seen["permissions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["answer"].as_str().unwrap())
        .collect();
    assert_eq!(answers, ["allow_once", "reject_once", "allow_once"], "{seen}");
    assert_eq!(
        seen["permissions"][0]["options"],
        json!(["allow_once", "allow_always", "reject_once", "reject_always"])
    );

    // Updates: kinds, titles, locations, a diff for the edit, a plan, usage with cost.
    let calls = updates_of(&seen, "tool_call");
    let write =
        calls.iter().find(|c| c["title"] == "write_file approved.txt").expect("a tool_call");
    assert_eq!(write["kind"], "edit");
    assert_eq!(write["locations"][0]["path"], "approved.txt");
    assert!(calls.iter().any(|c| c["kind"] == "execute" && c["title"] == "bash sleep 30"));
    let results = updates_of(&seen, "tool_call_update");
    assert!(results.iter().any(|u| u["status"] == "completed"
        && u["content"][0]["type"] == "diff"
        && u["content"][0]["newText"] == "approved\n"));
    assert!(results.iter().any(|u| u["status"] == "failed"
        && u["content"][0]["content"]["text"].as_str().unwrap().starts_with("refused")));
    assert_eq!(updates_of(&seen, "plan")[0]["entries"][0]["content"], "write the files");
    let usage = updates_of(&seen, "usage_update");
    assert_eq!(usage[0]["size"], 100000);
    assert_eq!(usage[0]["used"], 1100);
    // $1/M input + $2/M output: 1000 in + 100 out = $0.0012.
    assert!((usage[0]["cost"]["amount"].as_f64().unwrap() - 0.0012).abs() < 1e-9, "{usage:?}");
    assert_eq!(usage[0]["cost"]["currency"], "USD");
    assert_eq!(
        updates_of(&seen, "agent_message_chunk")[0]["content"]["text"],
        "Wrote approved.txt; denied.txt was refused."
    );

    // One identity: the ACP session is the keel session, and the ledger says what happened.
    let session = seen["sessionId"].as_str().unwrap();
    let events = keel_log(&env, session);
    let settled = events_of(&events, "permission_settled");
    let by: Vec<&str> = settled.iter().map(|e| e["by"].as_str().unwrap()).collect();
    assert_eq!(by, ["client: allow_once", "client: reject_once", "client: allow_once"]);
    assert_eq!(events_of(&events, "run_cancelled").len(), 1);
    assert_eq!(events_of(&events, "turn_started").len(), 2, "the queued prompt is no turn");
    assert!(events_of(&events, "input_joined").is_empty(), "the cancelled turn never took it");

    // session/load in a new process replays exactly what the live stream sent, with the
    // user's prompts (which the live stream leaves to the client).
    let loaded = run_client(&env, "load", &args, &ws, &[("ACP_SESSION", session)]);
    let listed = loaded["list"]["sessions"].as_array().unwrap();
    assert!(listed.iter().any(|s| s["sessionId"] == session && s["cwd"] == ws.to_str().unwrap()));
    let replayed: Vec<&Value> = loaded["updates"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|u| u["sessionUpdate"] != "user_message_chunk")
        .collect();
    let live: Vec<&Value> = seen["updates"].as_array().unwrap().iter().collect();
    assert_eq!(replayed, live, "session/load must replay the live updates");
    let prompts: Vec<&Value> = updates_of(&loaded, "user_message_chunk")
        .into_iter()
        .map(|u| &u["content"]["text"])
        .collect();
    assert_eq!(
        prompts,
        [&json!("Write approved.txt and denied.txt."), &json!("Run the long command.")]
    );
}

#[test]
fn acp_client_mcp_servers_run_as_the_users_and_their_calls_are_asked() {
    let env = Env::new();
    let ws = env.workspace().canonicalize().unwrap();
    let servers = std::env::var_os("KEEL_MCP_SERVERS_DIR")
        .filter(|dir| !dir.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("crates/mcp/tests/servers"));
    let everything =
        servers.join("node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(everything.is_file(), "the MCP test servers are not installed: run scripts/test");
    let mcp = json!([{"name": "every thing", "command": "node",
        "args": [everything, "stdio"], "env": []}]);
    let script = r#"{"steps":[
      {"tool_calls":[{"name":"mcp__acp_every_thing__echo","arguments":{"message":"from the editor's server"}}]},
      {"text":"echoed","expect":{"last_outcomes":["ok"],"contains":["Echo: from the editor's server"]}}]}"#;
    let args = scripted_args(&env, "mcp.json", script);
    let seen = run_client(&env, "one", &args, &ws, &[("ACP_MCP", &mcp.to_string())]);
    assert_eq!(seen["stops"], json!(["end_turn"]), "{seen}");
    // Declared by the client, so started without `keel trust`; still asked before it ran.
    let asked = seen["permissions"].as_array().unwrap();
    assert_eq!(asked.len(), 1, "{seen}");
    assert_eq!(asked[0]["title"], "mcp__acp_every_thing__echo");
    let results = updates_of(&seen, "tool_call_update");
    assert!(results.iter().any(|u| u["status"] == "completed"
        && u["content"][0]["content"]["text"].as_str().is_some_and(|t| t.contains("Echo: from"))));
}
