//! The repeated-failure guard counts every kind of failing call and survives a resume
//! (issue #12, item 11).

use keel_contracts::{EventKind, Outcome};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::Harness;

const BLOCKED: &str = "blocked: this exact call already failed 3 times";

fn repeated(call: &str, times: usize, then: &str) -> String {
    let step = format!(r#"{{"tool_calls":[{call}]}}"#);
    format!(r#"{{"steps":[{},{then}]}}"#, vec![step; times].join(","))
}

fn outcomes(events: &[keel_contracts::RuntimeEvent]) -> Vec<(Outcome, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, content, .. } => Some((*outcome, content.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn issue_12_unknown_tools_and_invalid_arguments_count_toward_the_guard() {
    for call in [
        r#"{"name":"no_such_tool","arguments":{"x":1}}"#,
        r#"{"name":"read","arguments":{"not_a_path":1}}"#,
    ] {
        let harness = Harness::new();
        let script = repeated(
            call,
            4,
            &format!(r#"{{"text":"gave up","expect":{{"contains":"{BLOCKED}"}}}}"#),
        );
        let (report, _) = harness.run(&script, "go").await;
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "gave up".into() }, "{call}");
        let session = harness.store.sessions().await.unwrap()[0].id;
        let results = outcomes(&harness.events(session).await);
        assert_eq!(results.len(), 4);
        assert!(results.iter().all(|(outcome, _)| *outcome == Outcome::Error));
        assert!(!results[2].1.contains(BLOCKED), "three failures run before the block");
        assert!(results[3].1.contains(BLOCKED), "{call}: {:?}", results[3]);
    }
    // The neighbour: a different argument is a different call and is not blocked.
    let harness = Harness::new();
    let bad = r#"{"name":"no_such_tool","arguments":{"x":1}}"#;
    let other = r#"{"name":"no_such_tool","arguments":{"x":2}}"#;
    let script = format!(
        r#"{{"steps":[{{"tool_calls":[{bad}]}},{{"tool_calls":[{bad}]}},{{"tool_calls":[{bad}]}},{{"tool_calls":[{other}]}},{{"text":"ok"}}]}}"#
    );
    harness.run(&script, "go").await;
    let session = harness.store.sessions().await.unwrap()[0].id;
    let results = outcomes(&harness.events(session).await);
    assert!(results[3].1.starts_with("error: unknown tool"), "{:?}", results[3]);
}

#[tokio::test]
async fn issue_12_the_guard_survives_a_resume_of_the_turn() {
    let mut harness = Harness::new();
    harness.max_steps = Some(3);
    let call = r#"{"name":"broken","arguments":{}}"#;
    // Run 1: two failures, then the tools-off report step. Run 2 (resume): the third
    // failure, then the fourth identical call is blocked although it is a new run.
    let script = format!(
        r#"{{"steps":[{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"text":"report"}},{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"text":"gave up","expect":{{"contains":"{BLOCKED}"}}}}]}}"#
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let first =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(first.outcome, TurnOutcome::Suspended { .. }), "{first:?}");
    harness.max_steps = None;
    let second = kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(second.outcome, TurnOutcome::Completed { text: "gave up".into() });
    let results = outcomes(&harness.events(session).await);
    assert_eq!(results.len(), 4);
    assert!(results[3].1.contains(BLOCKED), "{:?}", results[3]);
    assert_eq!(harness.invocations().len(), 3, "the blocked call never reached the tool");
}

#[tokio::test]
async fn a_failing_read_beside_other_reads_counts_as_often_as_one_run_alone() {
    // The same failing read four times: alone in its step (settled on its own), and beside
    // a succeeding read (the two run side by side). Both are blocked at the fourth.
    let broken = r#"{"name":"broken","arguments":{}}"#;
    let read = r#"{"name":"read","arguments":{"path":"a"}}"#;
    for beside in [false, true] {
        let harness = Harness::new();
        let calls = if beside { format!("{broken},{read}") } else { broken.to_owned() };
        let script = repeated(
            &calls,
            4,
            &format!(r#"{{"text":"gave up","expect":{{"contains":"{BLOCKED}"}}}}"#),
        );
        let (report, _) = harness.run(&script, "go").await;
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "gave up".into() });
        let session = harness.store.sessions().await.unwrap()[0].id;
        let results = outcomes(&harness.events(session).await);
        let per_step = if beside { 2 } else { 1 };
        assert_eq!(results.len(), 4 * per_step, "{results:?}");
        let failing: Vec<_> = results.iter().step_by(per_step).collect();
        for (step, (outcome, text)) in failing.iter().enumerate() {
            assert_eq!(*outcome, Outcome::Error, "beside={beside} step {step}: {text}");
            assert_eq!(text.contains(BLOCKED), step == 3, "beside={beside} step {step}: {text}");
        }
        // The neighbour: the succeeding read is never counted, so never blocked.
        if beside {
            for (outcome, text) in results.iter().skip(1).step_by(2) {
                assert_eq!((*outcome, text.as_str()), (Outcome::Ok, "contents of a"));
            }
        }
        let invoked = harness.invocations();
        assert_eq!(invoked.iter().filter(|i| i.starts_with("broken ")).count(), 3, "{invoked:?}");
        assert_eq!(invoked.iter().filter(|i| i.starts_with("read ")).count(), 4 * (per_step - 1));
    }
}

#[tokio::test]
async fn a_wait_with_invalid_arguments_counts_toward_the_guard() {
    let harness = Harness::new();
    let call = r#"{"name":"wait","arguments":{"event":"ci","timeout":"forever"}}"#;
    let script =
        repeated(call, 4, &format!(r#"{{"text":"gave up","expect":{{"contains":"{BLOCKED}"}}}}"#));
    let kernel = harness.kernel(&script).with_wait().unwrap();
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "gave up".into() });
    let events = harness.events(session).await;
    assert_eq!(keel_kernel::waiting(&events), None, "no call parked the run");
    let results = outcomes(&events);
    assert_eq!(results.len(), 4, "{results:?}");
    assert!(results.iter().all(|(outcome, _)| *outcome == Outcome::Error), "{results:?}");
    assert!(results[..3].iter().all(|(_, text)| !text.contains(BLOCKED)), "{results:?}");
    assert!(results[3].1.contains(BLOCKED), "{:?}", results[3]);
    // The neighbour: a valid wait after the failures still parks the run.
    let harness = Harness::new();
    let good = r#"{"name":"wait","arguments":{"event":"ci","timeout":"10m"}}"#;
    let script = format!(
        r#"{{"steps":[{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"tool_calls":[{good}]}}]}}"#
    );
    let kernel = harness.kernel(&script).with_wait().unwrap();
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{report:?}");
    assert!(keel_kernel::waiting(&harness.events(session).await).is_some());
}
