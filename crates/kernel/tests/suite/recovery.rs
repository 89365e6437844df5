//! Cancellation, crash recovery and ledger faults.

use std::sync::Arc;
use std::time::Duration;

use expect_test::expect;
use keel_contracts::{EventKind, Outcome};
use keel_kernel::{Cancellation, KernelError, TurnOutcome, projection};
use keel_testkit::{Fault, FaultyStore};

use super::support::Harness;

const SLOW_THEN_READ: &str = r#"{"steps":[
    {"tool_calls":[{"name":"slow","arguments":{}},{"name":"read","arguments":{"path":"a"}}]},
    {"text":"after","expect":{"contains":"resume please"}}
]}"#;

#[tokio::test(start_paused = true)]
async fn cancel_while_a_tool_runs_answers_every_open_call() {
    let harness = Harness::new();
    let kernel = harness.kernel(SLOW_THEN_READ);
    let session = harness.session(&kernel).await;
    let cancel = Cancellation::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.cancel();
    });
    let report = kernel.run_turn(session, "go", &harness.run_config(), &cancel).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Cancelled { .. }));
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "go"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 slow {}; call_1_2 read {"path":"a"}]
        #7 gate_decision call_1_1 Ask consent required: write access
        #8 permission_requested call_1_1 write
        #9 permission_settled call_1_1 AllowOnce by approval=auto
        #10 tool_attempt_prepared call_1_1/id4
        #11 tool_result call_1_1/id4 cancelled "cancelled: the run was cancelled while this tool was running; its effect may be partial"
        #12 tool_result call_1_2/- cancelled "cancelled: the run was cancelled before this call was executed"
        #13 run_cancelled cancelled by the user
    "##]]
    .assert_eq(&harness.render(session).await);
    // B03: the next request carries a result for every call, in order.
    let report = kernel
        .run_turn(session, "resume please", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "after".into() });
    let messages = projection::messages(&harness.events(session).await);
    projection::check_pairing(&messages).unwrap();
}

#[tokio::test(start_paused = true)]
async fn keel_stop_through_the_store_cancels_the_run() {
    let harness = Harness::new();
    let kernel = harness.kernel(SLOW_THEN_READ);
    let session = harness.session(&kernel).await;
    let store = harness.store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(2)).await;
        store.request_cancel(session).await.unwrap();
    });
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Cancelled { .. }), "{report:?}");
}

#[tokio::test(start_paused = true)]
async fn a_dropped_run_is_closed_on_resume_with_indeterminate_and_never_replayed() {
    let harness = Harness::new();
    let kernel = harness.kernel(SLOW_THEN_READ);
    let session = harness.session(&kernel).await;
    // The process "dies" while the slow write runs: the driving future is dropped.
    let config = harness.run_config();
    let never = Cancellation::new();
    let driving = kernel.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(1), driving).await.is_err());
    let before = harness.events(session).await;
    assert!(matches!(before.last().unwrap().kind, EventKind::ToolAttemptPrepared { .. }));

    let report = kernel
        .run_turn(session, "resume please", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "after".into() });
    let after = harness.events(session).await;
    // The reopened ledger extends what was committed.
    assert_eq!(&after[..before.len()], &before[..]);
    let outcomes: Vec<Outcome> = after
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(outcomes, vec![Outcome::Indeterminate, Outcome::Cancelled]);
    assert!(
        after.iter().any(|e| matches!(&e.kind, EventKind::RunFailed { reason, .. } if reason.starts_with("interrupted"))),
    );
    assert_eq!(harness.invocations(), vec!["slow {}"], "nothing was replayed");
}

#[tokio::test]
async fn ledger_write_failure_is_an_error_never_a_completed_run() {
    let mut harness = Harness::new();
    let faulty = Arc::new(FaultyStore::new(harness.store.clone()));
    harness.store = faulty.clone();
    let kernel = harness.kernel(
        r#"{"steps":[{"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},{"text":"done"}]}"#,
    );
    let session = harness.session(&kernel).await;
    faulty.fail_appends_of_kind("tool_attempt_prepared", Fault::DiskFull);
    let result = kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await;
    assert!(matches!(result, Err(KernelError::Append(_))), "{result:?}");
    assert!(harness.invocations().is_empty(), "no effect without a durable prepare");
    let events = faulty.inner().read(session, keel_contracts::Seq(0)).await.unwrap();
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::RunCompleted { .. })));
}

/// A person who never answers: the permission request stays pending.
#[derive(Debug)]
struct NeverAnswers;

#[async_trait::async_trait]
impl keel_kernel::PermissionHook for NeverAnswers {
    async fn decide(
        &self,
        _request: &keel_kernel::PermissionRequest<'_>,
    ) -> (keel_contracts::PermissionAnswer, String) {
        std::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn issue_12_a_pending_permission_request_is_asked_again_after_a_crash() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"a"}},{"name":"write","arguments":{"path":"a"}},{"name":"read","arguments":{"path":"b"}}]},
        {"text":"wrote a","expect":{"last_outcomes":["ok","ok","ok"]}}
    ]}"#;
    let model =
        || Arc::new(keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "s"));
    // The process dies while the write waits for its answer.
    let waiting = harness.kernel_with_permissions(model(), Arc::new(NeverAnswers));
    let session = harness.session(&waiting).await;
    let (config, never) = (harness.run_config(), Cancellation::new());
    let driving = waiting.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(5), driving).await.is_err());
    // The dead process's lease runs out before the next one starts.
    harness.clock.advance(keel_kernel::LEASE_TTL * 2);
    let before = harness.events(session).await;
    assert!(matches!(before.last().unwrap().kind, EventKind::PermissionRequested { .. }));

    // The next process resumes the turn: the request is asked again, the write runs once,
    // the read after it runs, and the model continues from complete results.
    let kernel = harness.kernel(script);
    let report = kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "wrote a".into() });
    assert_eq!(
        harness.invocations(),
        vec![r#"read {"path":"a"}"#, r#"write {"path":"a"}"#, r#"read {"path":"b"}"#]
    );
    let after = harness.events(session).await;
    let asked = after
        .iter()
        .filter(
            |e| matches!(&e.kind, EventKind::PermissionRequested { tool, .. } if tool == "write"),
        )
        .count();
    assert_eq!(asked, 2, "asked once before the crash and again after it");
    let results: Vec<Outcome> = after
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(results, vec![Outcome::Ok, Outcome::Ok, Outcome::Ok], "never silently cancelled");
}

#[tokio::test(start_paused = true)]
async fn issue_12_a_new_turn_answers_a_request_left_pending_without_running_it() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
        {"text":"moved on","expect":{"contains":["something else","a new turn began before this call"]}}
    ]}"#;
    let model =
        || Arc::new(keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "s"));
    let waiting = harness.kernel_with_permissions(model(), Arc::new(NeverAnswers));
    let session = harness.session(&waiting).await;
    let (config, never) = (harness.run_config(), Cancellation::new());
    let driving = waiting.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(5), driving).await.is_err());
    // The dead process's lease runs out before the next one starts.
    harness.clock.advance(keel_kernel::LEASE_TTL * 2);

    let kernel = harness.kernel(script);
    let report = kernel
        .run_turn(session, "something else", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "moved on".into() });
    assert!(harness.invocations().is_empty(), "the pending write never ran");
    let events = harness.events(session).await;
    projection::check_pairing(
        &projection::entries(&events, None).into_iter().map(|e| e.message).collect::<Vec<_>>(),
    )
    .unwrap();
}

#[tokio::test(start_paused = true)]
async fn issue_12_a_re_asked_call_that_crashes_again_is_never_attempted_twice() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"slow","arguments":{}}]},
        {"text":"after","expect":{"last_outcomes":["indeterminate"]}}
    ]}"#;
    let model =
        || Arc::new(keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "s"));
    // Run 1 dies while the write waits for consent.
    let waiting = harness.kernel_with_permissions(model(), Arc::new(NeverAnswers));
    let session = harness.session(&waiting).await;
    let (config, never) = (harness.run_config(), Cancellation::new());
    let driving = waiting.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(5), driving).await.is_err());
    harness.clock.advance(keel_kernel::LEASE_TTL * 2);
    // Run 2 asks again, is allowed, and dies while the write runs.
    let second = harness.kernel(script);
    let resuming = second.resume(session, &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(5), resuming).await.is_err());
    harness.clock.advance(keel_kernel::LEASE_TTL * 2);
    // Run 3: the write's outcome is unknown; it is never attempted a second time.
    let third = harness.kernel(script);
    let report = third.resume(session, &config, &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "after".into() });
    assert_eq!(harness.invocations(), vec!["slow {}"], "attempted once");
    let events = harness.events(session).await;
    let prepared =
        events.iter().filter(|e| matches!(e.kind, EventKind::ToolAttemptPrepared { .. })).count();
    assert_eq!(prepared, 1);
    let results: Vec<Outcome> = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(results, vec![Outcome::Indeterminate]);
}
