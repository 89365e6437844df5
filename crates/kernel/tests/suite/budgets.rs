//! Budgets suspend, never complete: the last permitted step runs with tools off for a
//! report, a checkpoint records it with evidence, and resume continues with fresh budgets.

use std::time::Duration;

use expect_test::expect;
use keel_contracts::{Budget, EventKind, Price};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::Harness;

const REPORT_MARKER: &str = "Tools are off for this last step";

#[tokio::test]
async fn step_budget_runs_a_tools_off_report_step_then_resume_completes() {
    let mut harness = Harness::new();
    harness.max_steps = Some(2);
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"a"}}]},
        {"text":"Report: read a (ok). Next: summarise it.","expect":{"contains":"Tools are off for this last step"}},
        {"text":"a holds its contents","expect":{"contains":"Report: read a"}}
    ]}"#;
    let (kernel, requests) = harness.recording_kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Suspended {
            reason: "stopped early: step budget: step 2 of 2 is the last".into(),
            report: "Report: read a (ok). Next: summarise it.".into()
        }
    );
    {
        let requests = requests.lock().unwrap();
        assert!(!requests[0].tools.is_empty());
        assert_eq!(requests[0].tool_choice, keel_contracts::ToolChoice::Auto);
        // The last permitted step has tools off, yet keeps their definitions: its history
        // holds tool calls, which Anthropic's API refuses without defined tools.
        assert_eq!(requests[1].tools, requests[0].tools);
        assert_eq!(
            requests[1].tool_choice,
            keel_contracts::ToolChoice::None,
            "the last permitted step has tools off"
        );
    }
    let report = kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "a holds its contents".into() });
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "go"
        #3 run_started Live Auto max_steps=Some(2)
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 read {"path":"a"}]
        #7 gate_decision call_1_1 Allow scope.reads
        #8 tool_attempt_prepared call_1_1/id4
        #9 tool_result call_1_1/id4 ok "contents of a"
        #10 budget_exhausted report_requested=true stopped early: step budget: step 2 of 2 is the last
        #11 model_requested step=2 messages=4
        #12 model_response stop "Report: read a (ok). Next: summarise it." []
        #13 checkpoint "Report: read a (ok). Next: summarise it." evidence=[#9 read ok]
        #14 run_suspended stopped early: step budget: step 2 of 2 is the last
        #15 run_started Live Auto max_steps=Some(2) resumes=id3
        #16 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #17 model_requested step=1 messages=6
        #18 model_response stop "a holds its contents" []
        #19 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&harness.render(session).await);
}

#[tokio::test]
async fn token_budget_predicts_the_last_step_from_the_previous_one() {
    let mut harness = Harness::new();
    harness.budget = Budget { max_tokens: Some(1300), ..Budget::default() };
    // 400 tokens a step: after two steps (800), one more fits (1200) but not two (1600).
    let step = r#"{"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":350,"output_tokens":50}}"#;
    let script = format!(
        r#"{{"steps":[{step},{step},{{"text":"report","usage":{{"input_tokens":380,"output_tokens":20}},"expect":{{"contains":"{REPORT_MARKER}"}}}}]}}"#
    );
    let (report, ledger) = harness.run(&script, "go").await;
    assert!(
        matches!(&report.outcome, TurnOutcome::Suspended { reason, .. } if reason == "stopped early: token budget: 800 of 1300 tokens used, room for one more step"),
        "{report:?}"
    );
    assert_eq!(harness.invocations().len(), 2);
    // The ceiling holds, report step included.
    assert_eq!(report.usage.input_tokens + report.usage.output_tokens, 1200);
    assert!(ledger.contains("budget_exhausted report_requested=true stopped early: token budget"));
    assert!(
        ledger.contains("checkpoint \"report\" evidence=[#9 read ok, #14 read ok]"),
        "{ledger}"
    );
}

#[tokio::test]
async fn cost_budget_uses_the_price_and_records_cost_per_response() {
    let mut harness = Harness::new();
    harness.price =
        Some(Price { input_per_mtok: 1.0, cached_input_per_mtok: None, output_per_mtok: 2.0 });
    harness.budget = Budget { max_cost_usd: Some(0.40), ..Budget::default() };
    // Each step: 100k input ($0.10) + 10k output ($0.02) = $0.12: two steps and a report
    // ($0.36) fit under $0.40; a fourth step would not.
    let step = r#"{"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":100000,"output_tokens":10000}}"#;
    let script = format!(
        r#"{{"steps":[{step},{step},{{"text":"report","usage":{{"input_tokens":100000,"output_tokens":10000}}}}]}}"#
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{report:?}");
    let costs: Vec<Option<f64>> = harness
        .events(session)
        .await
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ModelResponse { cost_usd, .. } => Some(*cost_usd),
            _ => None,
        })
        .collect();
    assert_eq!(costs.len(), 3);
    for cost in &costs {
        assert!((cost.unwrap() - 0.12).abs() < 1e-9, "{costs:?}");
    }
    assert!((report.usage.cost_usd.unwrap() - 0.36).abs() < 1e-9);
}

#[tokio::test]
async fn unknown_price_records_unknown_cost_never_zero() {
    let harness = Harness::new();
    let (report, _) = harness
        .run(r#"{"steps":[{"text":"hi","usage":{"input_tokens":5,"output_tokens":1}}]}"#, "t")
        .await;
    assert_eq!(report.usage.cost_usd, None);
    assert_eq!(report.usage.input_tokens, 5);
}

#[tokio::test(start_paused = true)]
async fn time_budget_stops_a_running_tool_and_suspends() {
    let mut harness = Harness::new();
    harness.budget = Budget { max_time: Some(Duration::from_secs(10)), ..Budget::default() };
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"slow","arguments":{}},{"name":"read","arguments":{"path":"a"}}]},
        {"text":"resumed and done","expect":{"last_outcomes":["cancelled","cancelled"]}}
    ]}"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Suspended {
            reason: "stopped early: time budget exhausted (10000 ms) while a tool ran".into(),
            report: String::new()
        }
    );
    let ledger = harness.render(session).await;
    assert!(
        ledger.contains("stopped early: the time budget ran out while this tool was running"),
        "{ledger}"
    );
    assert!(ledger.contains("cancelled: stopped early (budget exhausted)"), "{ledger}");
    assert_eq!(harness.invocations(), vec!["slow {}"]);
    let report = kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "resumed and done".into() });
}

/// A `max_time` whose deadline no clock can represent (a hostile config's, a library
/// caller's `Duration::MAX`) is no deadline: the turn runs, never a panic.
#[tokio::test]
async fn redteam_budget_an_unrepresentable_time_budget_runs_the_turn_without_panic() {
    for max_time in [Duration::MAX, Duration::from_secs(9_223_372_036_854_775_807)] {
        let mut harness = Harness::new();
        harness.budget = Budget { max_time: Some(max_time), ..Budget::default() };
        let (report, _) = harness.run(r#"{"steps":[{"text":"done"}]}"#, "t").await;
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    }
}
