//! Plan mode: reads and `plan` only, writes refused and recorded; the run ends with the
//! plan; once approved (`plan_approved`), the session's runs are live (issue #20).

use keel_contracts::{EventKind, ExecutionMode, Outcome, REFUSAL_PLAN};
use keel_kernel::{Cancellation, KernelError, TurnOutcome};

use super::support::Harness;

const PLAN_THEN_CARRY_OUT: &str = r#"{"steps":[
    {"tool_calls":[
        {"name":"read","arguments":{"path":"a"}},
        {"name":"write","arguments":{"path":"b"}},
        {"name":"plan","arguments":{"items":[{"text":"write b","status":"pending"}]}},
        {"name":"run_code","arguments":{"code":"print(await tools.write({path: 'c'}))"}}
    ]},
    {"text":"Plan: 1. write b","expect":{"last_outcomes":["ok","refused","ok","ok"]}},
    {"tool_calls":[{"name":"write","arguments":{"path":"b"}}],"expect":{"contains":"approved"}},
    {"text":"b written","expect":{"last_outcomes":["ok"]}}
]}"#;

#[tokio::test]
async fn plan_mode_refuses_writes_then_the_approved_plan_runs_live() {
    let mut harness = Harness::new();
    harness.mode = ExecutionMode::Plan;
    let kernel = harness.kernel(PLAN_THEN_CARRY_OUT);
    let session = harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "plan b", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "Plan: 1. write b".into() });
    let ledger = harness.render(session).await;
    assert!(ledger.contains(&format!("gate_decision call_1_2 Refuse {REFUSAL_PLAN}")), "{ledger}");
    assert!(
        ledger.contains(&format!("tool_result call_1_2/- refused \"{REFUSAL_PLAN}\"")),
        "{ledger}"
    );
    // A program's write is refused the same way.
    assert!(
        ledger.contains(&format!("tool_result call_1_4/1/- refused \"{REFUSAL_PLAN}\"")),
        "{ledger}"
    );
    assert!(ledger.contains("run_started Plan"), "{ledger}");
    let events = harness.events(session).await;
    let prompt = events.iter().find_map(|e| match &e.kind {
        EventKind::RunComposition { system_prompt, .. } => Some(system_prompt.clone()),
        _ => None,
    });
    assert!(prompt.unwrap().contains("# Plan mode"));
    // Only the read ran.
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);

    let approved = kernel.approve_plan(session, "user").await.unwrap();
    let events = harness.events(session).await;
    let event = events.iter().find(|e| e.seq == approved).unwrap();
    assert!(matches!(&event.kind, EventKind::PlanApproved { by } if by == "user"));
    assert!(matches!(kernel.approve_plan(session, "user").await, Err(KernelError::NotPlanning(_))));

    let report = kernel
        .run_turn(
            session,
            "The plan is approved: carry it out",
            &harness.run_config(),
            &Cancellation::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "b written".into() });
    let events = harness.events(session).await;
    let last_run = events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::RunStarted { mode, .. } => Some(*mode),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_run, ExecutionMode::Live);
    let last_result = events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, tool, .. } => Some((tool.clone(), *outcome)),
            _ => None,
        })
        .unwrap();
    assert_eq!(last_result, ("write".to_owned(), Outcome::Ok));
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#, r#"write {"path":"b"}"#]);
}

#[tokio::test]
async fn plan_approval_is_refused_for_a_session_that_is_not_planning() {
    let harness = Harness::new();
    let kernel = harness.kernel(r#"{"steps":[{"text":"x"}]}"#);
    let session = harness.session(&kernel).await;
    assert!(matches!(kernel.approve_plan(session, "user").await, Err(KernelError::NotPlanning(_))));
    assert!(!harness.render(session).await.contains("plan_approved"));
}

#[tokio::test]
async fn redteam_plan_approval_is_refused_before_any_plan_exists() {
    let mut harness = Harness::new();
    harness.mode = ExecutionMode::Plan;
    let kernel = harness.kernel(PLAN_THEN_CARRY_OUT);
    let session = harness.session(&kernel).await;
    // No plan-mode run has completed: there is no plan to approve.
    assert!(matches!(kernel.approve_plan(session, "user").await, Err(KernelError::NotPlanning(_))));
    assert!(!harness.render(session).await.contains("plan_approved"));
    // The neighbour: once the plan-mode run completed, the same approval is accepted.
    let report = kernel
        .run_turn(session, "plan b", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "Plan: 1. write b".into() });
    kernel.approve_plan(session, "user").await.unwrap();
    assert!(harness.render(session).await.contains("plan_approved"));
}
