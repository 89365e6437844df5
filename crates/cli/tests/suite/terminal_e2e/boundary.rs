//! A wider boundary needs a person (#11 item 7): neither `--approval auto` nor
//! `sandboxed` grants `request_boundary`, only the user's own rule does, and only what it
//! names; `sandboxed` approves nothing outside the workspace, in git metadata, or when the
//! sandbox is bypassed.

use std::path::Path;

use super::harness::{ledger, session_id};
use crate::suite::support::{Env, scripted, stderr, stdout};

/// A write in the workspace, then a request for write access to `extra`.
fn boundary_script(env: &Env, extra: &Path) -> String {
    scripted(
        env,
        &format!(
            r#"{{"steps":[
                {{"tool_calls":[{{"name":"write_file","arguments":{{"path":"in_ws.txt","content":"ok\n"}}}}]}},
                {{"tool_calls":[{{"name":"request_boundary","arguments":{{"paths":[{{"path":"{}","access":"write"}}],"justification":"the build writes its cache there"}}}}]}},
                {{"text":"widened"}}
            ]}}"#,
            extra.display()
        ),
    )
}

/// How each permission request of `tool` was settled: (answer, by).
fn settled_by(events: &[serde_json::Value], tool: &str) -> Vec<(String, String)> {
    events
        .iter()
        .filter(|e| e["kind"] == "permission_settled" && e["tool"] == tool)
        .map(|e| (e["answer"].as_str().unwrap().to_owned(), e["by"].as_str().unwrap().to_owned()))
        .collect()
}

/// Whether the boundary was revised (widened).
fn widened(events: &[serde_json::Value]) -> bool {
    events.iter().any(|e| e["kind"] == "boundary_revised")
}

/// Under `--approval APPROVAL` the boundary request is denied, and the run ends exit 4.
fn check_refused_boundary(approval: &str) {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    let model = boundary_script(&env, &extra);
    let output = env.run_t(&ws, &model, &["--approval", approval]);
    // The denial finalizes the turn (exit 4), with the reason shown.
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    let err = stderr(&output);
    assert!(
        err.contains("request_boundary") && err.contains("a wider boundary needs a person"),
        "{err}"
    );
    let events = ledger(&env, &session_id(&env));
    assert!(!widened(&events), "approval {approval} widened the boundary");
    let (answer, by) = settled_by(&events, "request_boundary").pop().unwrap();
    assert_eq!(answer, "deny");
    assert!(
        by.starts_with(&format!("approval={approval}: a wider boundary needs a person")),
        "{by}"
    );
    // The neighbour: the same mode approved the ordinary write inside the workspace.
    assert_eq!(std::fs::read_to_string(ws.join("in_ws.txt")).unwrap(), "ok\n");
}

#[test]
fn redteam_boundary_auto_never_grants_request_boundary() {
    check_refused_boundary("auto");
}

#[test]
fn redteam_boundary_sandboxed_never_grants_request_boundary() {
    check_refused_boundary("sandboxed");
}

#[test]
fn redteam_boundary_an_explicit_user_rule_grants_only_what_it_names() {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    std::fs::write(
        env.home.path().join("config.toml"),
        format!(
            "[permissions]\nallow = [\"request_boundary({}/*)\"]\n",
            env.scratch.path().display()
        ),
    )
    .unwrap();
    let model = boundary_script(&env, &extra);
    let output = env.run_t(&ws, &model, &["--approval", "auto"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let events = ledger(&env, &session_id(&env));
    assert!(widened(&events));
    let (answer, by) = settled_by(&events, "request_boundary").pop().unwrap();
    assert_eq!(
        (answer.as_str(), by.as_str()),
        (
            "allow_once",
            format!("rule:request_boundary({}/*)", env.scratch.path().display()).as_str()
        )
    );
    assert!(stderr(&output).contains("⚠ boundary widened: write"), "{}", stderr(&output));

    // The rule does not reach past its pattern: `..` or another folder is refused.
    let env2 = Env::new();
    let ws2 = env2.workspace();
    std::fs::write(
        env2.home.path().join("config.toml"),
        format!(
            "[permissions]\nallow = [\"request_boundary({}/*)\"]\n",
            env2.scratch.path().join("cache").display()
        ),
    )
    .unwrap();
    let escape = env2.scratch.path().join("cache/../../etc");
    let model = boundary_script(&env2, &escape);
    let output = env2.run_t(&ws2, &model, &["--approval", "auto"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(!widened(&ledger(&env2, &session_id(&env2))));

    // Nor through a link inside the pattern that leads out of it (a command could have made
    // it, or retarget it after the grant).
    let env3 = Env::new();
    let ws3 = env3.workspace();
    let allowed = env3.scratch.path().join("cache");
    let outside = env3.scratch.path().join("outside");
    std::fs::create_dir_all(&allowed).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("link")).unwrap();
    std::fs::write(
        env3.home.path().join("config.toml"),
        format!("[permissions]\nallow = [\"request_boundary({}/*)\"]\n", allowed.display()),
    )
    .unwrap();
    let model = boundary_script(&env3, &allowed.join("link"));
    let output = env3.run_t(&ws3, &model, &["--approval", "auto"]);
    assert_eq!(output.status.code(), Some(4), "{}", stderr(&output));
    assert!(!widened(&ledger(&env3, &session_id(&env3))));
}

#[test]
fn redteam_boundary_a_workspace_rule_does_not_grant() {
    let env = Env::new();
    let ws = env.workspace();
    let extra = env.scratch.path().join("cache");
    std::fs::create_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        ws.join(".keel/config.toml"),
        "[permissions]\nallow = [\"request_boundary\", \"request_boundary(/*)\"]\n",
    )
    .unwrap();
    let model = boundary_script(&env, &extra);
    let output = env.run_t(&ws, &model, &["--approval", "auto"]);
    assert_ne!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).contains("permissions.allow"), "{}", stderr(&output));
    // Whatever ran, nothing was widened.
    let listed = stdout(&env.run(&["sessions", "--json"]));
    for line in listed.lines() {
        let session: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(!widened(&ledger(&env, session["session_id"].as_str().unwrap())));
    }
    // The neighbour: the same rule in the user's own config does grant.
    std::fs::remove_dir_all(ws.join(".keel")).unwrap();
    std::fs::write(
        env.home.path().join("config.toml"),
        "[permissions]\nallow = [\"request_boundary\"]\n",
    )
    .unwrap();
    let output = env.run_t(&ws, &model, &["--approval", "auto"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
}

#[test]
fn redteam_boundary_sandboxed_approves_nothing_when_the_sandbox_is_bypassed() {
    let env = Env::new();
    let ws = env.workspace();
    let model = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"echo ran > ran.txt"}}]},
            {"tool_calls":[{"name":"write_file","arguments":{"path":"w.txt","content":"x"}}]},
            {"text":"done","expect":{"last_outcomes":["refused"]}}
        ]}"#,
    );
    let output = env.run_t(&ws, &model, &["--approval", "sandboxed", "--sandbox", "bypass"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!ws.join("ran.txt").exists() && !ws.join("w.txt").exists());
    let err = stderr(&output);
    assert!(
        err.contains(
            "✗ bash echo ran > ran.txt · refused: approval=sandboxed: the sandbox is bypassed"
        ),
        "{err}"
    );
    // The neighbour: managed, the same calls run without asking.
    let managed = scripted(
        &env,
        r#"{"steps":[
            {"tool_calls":[{"name":"bash","arguments":{"command":"echo ran > ran.txt"}}]},
            {"tool_calls":[{"name":"write_file","arguments":{"path":"w.txt","content":"x"}}]},
            {"text":"done","expect":{"last_outcomes":["ok"]}}
        ]}"#,
    );
    let output = env.run_t(&ws, &managed, &["--approval", "sandboxed"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(ws.join("ran.txt").exists() && ws.join("w.txt").exists());
}

#[test]
fn redteam_boundary_sandboxed_refuses_writes_outside_the_workspace() {
    let env = Env::new();
    let ws = env.workspace();
    let outside = env.scratch.path().join("outside.txt");
    let model = scripted(
        &env,
        &format!(
            r#"{{"steps":[
                {{"tool_calls":[{{"name":"write_file","arguments":{{"path":"../outside.txt","content":"x"}}}},
                               {{"name":"edit_file","arguments":{{"path":"{}","old":"a","new":"b"}}}}]}},
                {{"text":"done","expect":{{"last_outcomes":["refused","refused"]}}}}
            ]}}"#,
            outside.display()
        ),
    );
    let output = env.run_t(&ws, &model, &["--approval", "sandboxed"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(!outside.exists());
    assert_eq!(
        stderr(&output).matches("writes outside the workspace, and no terminal to ask").count(),
        2,
        "{}",
        stderr(&output)
    );
}

#[test]
fn redteam_boundary_sandboxed_does_not_approve_edits_of_git_metadata_or_links_out() {
    let env = Env::new();
    let ws = env.workspace();
    std::fs::create_dir_all(ws.join(".git/hooks")).unwrap();
    let outside = env.scratch.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
    std::os::unix::fs::symlink(ws.join(".git/hooks"), ws.join("hooks")).unwrap();
    let model = scripted(
        &env,
        r##"{"steps":[
            {"tool_calls":[
                {"name":"write_file","arguments":{"path":".git/hooks/pre-commit","content":"#!/bin/sh\nid\n"}},
                {"name":"write_file","arguments":{"path":"hooks/post-checkout","content":"#!/bin/sh\nid\n"}},
                {"name":"write_file","arguments":{"path":"out/planted","content":"x"}},
                {"name":"write_file","arguments":{"path":"src/ok.txt","content":"fine\n"}}
            ]},
            {"text":"done","expect":{"last_outcomes":["refused","refused","refused","ok"]}}
        ]}"##,
    );
    let output = env.run_t(&ws, &model, &["--approval", "sandboxed"]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let err = stderr(&output);
    assert_eq!(err.matches("writes git or keel metadata").count(), 2, "{err}");
    assert_eq!(err.matches("writes outside the workspace").count(), 1, "{err}");
    assert!(
        !ws.join(".git/hooks/pre-commit").exists() && !ws.join(".git/hooks/post-checkout").exists()
    );
    assert!(!outside.join("planted").exists());
    // The neighbour: an ordinary new file in the workspace was written without asking.
    assert_eq!(std::fs::read_to_string(ws.join("src/ok.txt")).unwrap(), "fine\n");
}
