//! Boundary requests (one negotiation at a time, approval records a revision, denial
//! finalizes the turn) and execution grants (exact call, mandatory expiry, fail closed).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    Access, Effects, EventKind, PermissionAnswer, Tool, ToolContext, ToolOutput, ToolSpec,
};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::Harness;

/// `whereami`: reports the boundary its context carries.
#[derive(Debug)]
struct WhereAmI(ToolSpec);

#[async_trait]
impl Tool for WhereAmI {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn invoke(&self, context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::ok(serde_json::to_string(&context.boundary).unwrap())
    }
}

fn whereami() -> Arc<dyn Tool> {
    Arc::new(WhereAmI(ToolSpec {
        name: "whereami".into(),
        description: "reports the boundary".into(),
        parameters: serde_json::json!({"type": "object"}),
        access: Access::Write,
        effects: Effects::LOCAL_WRITE,
        intrinsic: false,
        first_party: true,
    }))
}

const ASK_THEN_USE: &str = r#"{"steps":[
    {"tool_calls":[
        {"name":"request_boundary","arguments":{"paths":[{"path":"/srv/data","access":"read"},{"path":"out","access":"write"}],"network":true,"justification":"the build downloads crates and writes to ../out"}},
        {"name":"whereami","arguments":{}}
    ]},
    {"text":"done","expect":{"contains":"boundary widened (revision 1)"}}
]}"#;

#[tokio::test]
async fn an_approved_request_records_a_revision_and_widens_later_calls() {
    let mut harness = Harness::new();
    harness.extra_tools.push(whereami());
    let (report, ledger) = harness.run(ASK_THEN_USE, "build it").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{ledger}");
    assert!(ledger.contains("permission_requested call_1_1 write"), "{ledger}");
    assert!(
        ledger.contains(r#"boundary_revised 1 read=["/srv/data"] write=["/ws/out"] network=true"#),
        "{ledger}"
    );
    assert!(
        ledger.contains(r#"{\"read\":[\"/srv/data\"],\"write\":[\"/ws/out\"],\"network\":true}"#),
        "the next call runs with the widened boundary: {ledger}"
    );
}

#[tokio::test]
async fn a_denied_request_finalizes_the_turn_without_a_wider_retry() {
    let mut harness = Harness::new();
    harness.extra_tools.push(whereami());
    harness.approval = PermissionAnswer::Deny;
    let (report, ledger) = harness.run(ASK_THEN_USE, "build it").await;
    assert!(matches!(report.outcome, TurnOutcome::Denied { .. }), "{report:?}");
    assert!(ledger.contains("tool_result call_1_1/id"), "{ledger}");
    assert!(ledger.contains("refused \"refused: widening the boundary was denied"), "{ledger}");
    assert!(ledger.contains("tool_result call_1_2/- cancelled"), "{ledger}");
    assert!(ledger.trim_end().ends_with("run_denied widening the boundary was denied"), "{ledger}");
    assert!(!ledger.contains("boundary_revised"));
    assert!(harness.invocations().is_empty());
}

#[tokio::test]
async fn one_negotiation_at_a_time_and_a_justification_is_required() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[
            {"name":"request_boundary","arguments":{"network":true,"justification":"  "}},
            {"name":"request_boundary","arguments":{"network":true,"justification":"fetch deps"}},
            {"name":"request_boundary","arguments":{"network":true,"justification":"fetch more"}}
        ]},
        {"text":"ok","expect":{"last_outcomes":["error","ok","error"],"contains":"one boundary negotiation at a time"}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}\n{ledger}");
}

#[tokio::test]
async fn an_execution_grant_covers_the_exact_call_until_it_expires() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::AllowExact;
    let write = |path: &str| {
        format!(r#"{{"tool_calls":[{{"name":"write","arguments":{{"path":"{path}"}}}}]}}"#)
    };
    let script = format!(
        r#"{{"steps":[{},{},{},{{"text":"report"}},{},{{"text":"done"}}]}}"#,
        write("a"),
        write("a"),
        write("b"),
        write("a")
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let config = harness.run_config();
    // Steps 1–3 now (step 4 is the budget's report); step 5 after the grant expired.
    let mut limited = config.clone();
    limited.budget.max_steps = Some(4);
    let report = kernel.run_turn(session, "t", &limited, &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{report:?}");
    let ledger = harness.render(session).await;
    assert!(
        ledger.contains("permission_settled call_1_1 AllowExact by approval=auto until 2026-01-02"),
        "{ledger}"
    );
    assert!(
        ledger.contains("gate_decision call_2_1 Allow grant: this exact call is allowed until"),
        "{ledger}"
    );
    assert!(!ledger.contains("permission_requested call_2_1"), "{ledger}");
    assert!(
        ledger.contains("permission_requested call_3_1"),
        "other arguments are asked again: {ledger}"
    );

    harness.clock.advance(Duration::from_secs(25 * 3600));
    let report = kernel.resume(session, &config, &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}");
    let events = harness.events(session).await;
    let asked_for_last_a = events.iter().any(|e| {
        matches!(&e.kind, EventKind::PermissionRequested { call_id, .. } if call_id.as_str() == "call_5_1")
    });
    assert!(asked_for_last_a, "an expired grant is never used");
}
