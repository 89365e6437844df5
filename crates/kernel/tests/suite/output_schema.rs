//! Structured output: `submit` takes the run's output schema as its parameters; the first
//! valid submission completes the run with the answer as JSON text.

use keel_contracts::{EventKind, Outcome};
use keel_kernel::TurnOutcome;

use super::support::Harness;

fn outcomes(events: &[keel_contracts::RuntimeEvent]) -> Vec<Outcome> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_schema_that_is_not_an_objects_is_wrapped_and_unwrapped() {
    let mut harness = Harness::new();
    harness.output_schema = Some(serde_json::json!({"type": "integer", "minimum": 1}));
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"submit","arguments":{"answer":0}}]},
        {"tool_calls":[{"name":"submit","arguments":{"answer":42}}],
         "expect":{"last_outcomes":["error"],"contains":"/answer"}}
    ]}"#;
    let (report, _) = harness.run(script, "count").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "42".into() });
    let events = harness.events(report.session_id).await;
    assert_eq!(outcomes(&events), vec![Outcome::Error, Outcome::Ok]);
    let completed = events.iter().find_map(|e| match &e.kind {
        EventKind::RunCompleted { answer, .. } => answer.clone(),
        _ => None,
    });
    assert_eq!(completed.as_deref(), Some("42"));
}

#[tokio::test]
async fn calls_after_the_submission_in_its_response_still_get_results_and_a_second_is_refused() {
    let mut harness = Harness::new();
    harness.output_schema = Some(serde_json::json!({
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]
    }));
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"submit","arguments":{"ok":true}},
                       {"name":"submit","arguments":{"ok":false}},
                       {"name":"read","arguments":{"path":"a"}}]}
    ]}"#;
    let (report, _) = harness.run(script, "check").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: r#"{"ok":true}"#.into() });
    let events = harness.events(report.session_id).await;
    assert_eq!(outcomes(&events), vec![Outcome::Ok, Outcome::Error, Outcome::Ok]);
}

#[tokio::test]
async fn a_tool_free_answer_completes_only_as_json_matching_the_schema() {
    let schema = serde_json::json!({
        "type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]
    });
    let mut harness = Harness::new();
    harness.output_schema = Some(schema.clone());
    let (report, _) = harness.run(r#"{"steps":[{"text":" {\"n\": 3} "}]}"#, "go").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: r#"{"n":3}"#.into() });

    let mut harness = Harness::new();
    harness.output_schema = Some(schema);
    let (report, _) = harness.run(r#"{"steps":[{"text":"three"}]}"#, "go").await;
    let TurnOutcome::Failed { reason } = report.outcome else { panic!("{:?}", report.outcome) };
    assert!(reason.contains("without calling submit") && reason.contains("not JSON"), "{reason}");
}

#[tokio::test]
async fn without_a_schema_there_is_no_submit_tool() {
    let harness = Harness::new();
    let (report, _) = harness.run(r#"{"steps":[{"text":"plain"}]}"#, "go").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "plain".into() });
    let events = harness.events(report.session_id).await;
    assert!(events.iter().all(|e| match &e.kind {
        EventKind::RunComposition { tools, system_prompt, .. } => {
            !tools.contains(&"submit".to_owned()) && !system_prompt.contains("call `submit`")
        }
        _ => true,
    }));
}
