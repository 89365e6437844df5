//! Sub-agents shrink, never escape: read-only tools within the parent's scope, the
//! parent's envelope and mode, durable lineage, budgets within what the parent has left,
//! and cancellation that cascades.

use std::time::Duration;

use keel_contracts::{Budget, EventKind, ExecutionMode, Outcome, Seq};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::Harness;

fn child_sessions(events: &[keel_contracts::RuntimeEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { tool, content, .. } if tool == "spawn_agent" => {
                content.split_whitespace().nth(1).map(str::to_owned)
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_child_reads_and_its_answer_comes_back_as_the_tool_result() {
    let harness = Harness::new();
    let script = r#"{
        "steps": [
            {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"read a and summarise"}}],"usage":{"input_tokens":1,"output_tokens":1}},
            {"tool_calls":[{"name":"list_agents","arguments":{}}],"expect":{"last_outcomes":["ok"],"contains":"completed: a holds contents"},"usage":{"input_tokens":1,"output_tokens":1}},
            {"text":"the child says a holds contents","expect":{"contains":"read a and summarise"},"usage":{"input_tokens":1,"output_tokens":1}}
        ],
        "agents": {"read a and summarise": {"steps": [
            {"tool_calls":[{"name":"read","arguments":{"path":"a"}},{"name":"write","arguments":{"path":"a"}},{"name":"spawn_agent","arguments":{"task":"deeper"}}],
             "usage":{"input_tokens":100,"output_tokens":10}},
            {"text":"a holds contents","expect":{"last_outcomes":["ok","error","error"]},"usage":{"input_tokens":150,"output_tokens":5}}
        ]}}
    }"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Completed { text: "the child says a holds contents".into() }
    );
    // The child's spend counts against the parent's run (the parent's own 3 responses
    // report 1 input token each).
    assert_eq!(report.usage.input_tokens, 253);
    assert_eq!(report.usage.estimated_tokens, 0);
    // The child could read; `write` and `spawn_agent` were not in its registry.
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);

    let children = child_sessions(&harness.events(session).await);
    assert_eq!(children.len(), 1);
    let child = harness.store.resolve_session(&children[0]).await.unwrap();
    let child_events = harness.store.read(child, Seq(0)).await.unwrap();
    let EventKind::SessionCreated { lineage: Some(lineage), envelope, mode, .. } =
        &child_events[0].kind
    else {
        panic!("the child has no lineage: {:?}", child_events[0]);
    };
    assert_eq!(lineage.parent_session_id, session);
    assert_eq!(lineage.parent_call_id.as_str(), "call_1_1");
    assert_eq!(*envelope, harness.envelope);
    assert_eq!(*mode, ExecutionMode::Live);
    let EventKind::RunComposition { tools, system_prompt, .. } = &child_events[3].kind else {
        panic!("{:?}", child_events[3]);
    };
    assert_eq!(tools, &["read", "broken", "boom", "nap", "todo", "plan", "read_tool_result"]);
    assert!(!system_prompt.contains("Instructions from"), "a child inherits no instructions");
    let summaries = harness.store.sessions().await.unwrap();
    assert_eq!(summaries.iter().find(|s| s.id == child).unwrap().parent, Some(session));
}

#[tokio::test]
async fn a_child_asked_to_write_is_refused() {
    let harness = Harness::new();
    let script = r#"{"steps": [
        {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"fix it","tools":["read","write"]}}]},
        {"text":"could not delegate","expect":{"last_outcomes":["refused"],"contains":"not allowed: write"}}
    ]}"#;
    let (report, ledger) = harness.run(script, "go").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}\n{ledger}");
    assert!(harness.invocations().is_empty());
    assert_eq!(harness.store.sessions().await.unwrap().len(), 1, "no child session was created");
}

#[tokio::test]
async fn a_child_outside_the_parents_scope_is_refused_and_forbidden_binds() {
    let mut harness = Harness::new();
    harness.envelope.forbidden.insert("read".into());
    let script = r#"{"steps": [
        {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"peek","tools":["read"]}}]},
        {"text":"ok","expect":{"last_outcomes":["refused"]}}
    ]}"#;
    let (report, _) = harness.run(script, "go").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}");
}

#[tokio::test]
async fn a_child_of_a_shadow_parent_is_in_shadow_mode_and_performs_no_effects() {
    let mut harness = Harness::new();
    harness.mode = ExecutionMode::Shadow;
    let script = r#"{
        "steps": [
            {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"look"}}]},
            {"text":"done","expect":{"last_outcomes":["ok"]}}
        ],
        "agents": {"look": {"steps": [
            {"tool_calls":[{"name":"write","arguments":{"path":"x"}},{"name":"slow","arguments":{}}]},
            {"text":"looked","expect":{"last_outcomes":["error","error"]}}
        ]}}
    }"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}");
    assert!(harness.invocations().is_empty(), "no effect: {:?}", harness.invocations());
    let children = child_sessions(&harness.events(session).await);
    let child = harness.store.resolve_session(&children[0]).await.unwrap();
    let events = harness.store.read(child, Seq(0)).await.unwrap();
    assert!(matches!(
        &events[0].kind,
        EventKind::SessionCreated { mode: ExecutionMode::Shadow, .. }
    ));
    assert!(matches!(&events[2].kind, EventKind::RunStarted { mode: ExecutionMode::Shadow, .. }));
}

#[tokio::test(start_paused = true)]
async fn cancelling_the_parent_cancels_the_child() {
    let harness = Harness::new();
    let script = r#"{
        "steps": [{"tool_calls":[{"name":"spawn_agent","arguments":{"task":"nap"}}]}],
        "agents": {"nap": {"steps": [{"tool_calls":[{"name":"nap","arguments":{}}]}]}}
    }"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let cancel = Cancellation::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.cancel();
    });
    let report = kernel.run_turn(session, "go", &harness.run_config(), &cancel).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Cancelled { .. }), "{report:?}");
    let children = child_sessions(&harness.events(session).await);
    let child = harness.store.resolve_session(&children[0]).await.unwrap();
    let events = harness.store.read(child, Seq(0)).await.unwrap();
    assert!(matches!(events.last().unwrap().kind, EventKind::RunCancelled { .. }));
    let parent_events = harness.events(session).await;
    let spawn_outcome = parent_events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { tool, outcome, .. } if tool == "spawn_agent" => Some(*outcome),
        _ => None,
    });
    assert_eq!(spawn_outcome, Some(Outcome::Cancelled));
}

#[tokio::test]
async fn a_child_never_outspends_what_the_parent_has_left() {
    let mut harness = Harness::new();
    harness.budget = Budget { max_tokens: Some(1000), ..Budget::default() };
    let script = r#"{
        "steps": [
            {"tool_calls":[{"name":"spawn_agent","arguments":{"task":"work"}}],"usage":{"input_tokens":300,"output_tokens":0}},
            {"text":"report","expect":{"contains":"Tools are off"}}
        ],
        "agents": {"work": {"steps": [
            {"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":300,"output_tokens":0}},
            {"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":300,"output_tokens":0}},
            {"text":"child report","usage":{"input_tokens":100,"output_tokens":0}},
            {"text":"never reached"}
        ]}}
    }"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    // The parent had 700 tokens left: the child stopped early at its own last step.
    let events = harness.events(session).await;
    let spawn = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { tool, content, .. } if tool == "spawn_agent" => {
            Some(content.clone())
        }
        _ => None,
    });
    assert!(
        spawn.as_deref().unwrap_or_default().contains("suspended (stopped early: token budget"),
        "{spawn:?}"
    );
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{report:?}");
    // Parent 300 + child 600: another parent step (300) would reach the 1000 ceiling, so
    // the parent stops without one; the ceiling is never passed.
    assert_eq!(report.usage.input_tokens, 900);
}
