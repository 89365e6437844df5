//! The turn loop: tool round trips, errors as data, step ceilings, provider failures.

use std::sync::Arc;

use async_trait::async_trait;
use expect_test::expect;
use keel_contracts::{
    FinishReason, ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest, ModelResponse,
    Outcome, StreamDelta, ToolCall, ToolCallId, Usage,
};
use keel_kernel::{Cancellation, Instruction, TurnOutcome, projection};

use super::support::Harness;

#[tokio::test]
async fn tool_round_trip_then_answer() {
    let harness = Harness::new();
    let (report, ledger) = harness
        .run(
            r#"{"steps":[
                {"text":"Reading.","tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":10,"output_tokens":3}},
                {"text":"Done.","expect":{"last_outcomes":["ok"],"contains":"contents of a"},"usage":{"input_tokens":20,"output_tokens":2}}
            ]}"#,
            "read a",
        )
        .await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "Done.".into() });
    assert_eq!((report.usage.input_tokens, report.usage.output_tokens), (30, 5));
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "read a"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "Reading." [call_1_1 read {"path":"a"}]
        #7 gate_decision call_1_1 Allow scope.reads
        #8 tool_attempt_prepared call_1_1/id4
        #9 tool_result call_1_1/id4 ok "contents of a"
        #10 model_requested step=2 messages=3
        #11 model_response stop "Done." []
        #12 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&ledger);
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn unknown_tool_and_invalid_arguments_are_error_results_and_the_run_goes_on() {
    let harness = Harness::new();
    let (report, ledger) = harness
        .run(
            r#"{"steps":[
                {"tool_calls":[
                    {"name":"nope","arguments":{}},
                    {"name":"read","arguments":{"path":7}},
                    {"name":"read","arguments":{"extra":true,"path":"a"}}
                ]},
                {"text":"Recovered.","expect":{"last_outcomes":["error","error","error"]}}
            ]}"#,
            "try things",
        )
        .await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "try things"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 nope {}; call_1_2 read {"path":7}; call_1_3 read {"extra":true,"path":"a"}]
        #7 tool_result call_1_1/- error "error: unknown tool 'nope'. Available tools: read, write, broken, boom, slow, nap, todo, plan, read_tool_result, request_boundary, run_code, spawn_agent, wait_agent, list_agents, read_agent_output"
        #8 tool_result call_1_2/- error "error: invalid arguments for read: /path: 7 is not of type \"string\""
        #9 tool_result call_1_3/- error "error: invalid arguments for read: Additional properties are not allowed ('extra' was unexpected)"
        #10 model_requested step=2 messages=5
        #11 model_response stop "Recovered." []
        #12 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&ledger);
    assert!(harness.invocations().is_empty(), "no invalid call reached a tool");
}

#[tokio::test]
async fn failing_tool_and_panicking_tool_are_errors_not_crashes() {
    let harness = Harness::new();
    let (report, ledger) = harness
        .run(
            r#"{"steps":[
                {"tool_calls":[{"name":"broken","arguments":{}},{"name":"boom","arguments":{}}]},
                {"text":"ok","expect":{"last_outcomes":["error","error"]}}
            ]}"#,
            "t",
        )
        .await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    assert!(ledger.contains("tool_result call_1_2/id"), "{ledger}");
    assert!(ledger.contains("error \"error: the tool failed unexpectedly"), "{ledger}");
}

#[tokio::test]
async fn identical_failing_calls_are_blocked_after_the_limit() {
    let harness = Harness::new();
    let call = r#"{"name":"broken","arguments":{"path":"x"}}"#;
    let script = format!(
        r#"{{"steps":[{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"tool_calls":[{call}]}},{{"text":"gave up","expect":{{"contains":"blocked: this exact call already failed 3 times"}}}}]}}"#
    );
    let (report, _ledger) = harness.run(&script, "t").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}");
    assert_eq!(harness.invocations().len(), 3, "the fourth identical call never ran");
}

#[tokio::test]
async fn a_second_turn_sees_the_first_and_instructions_reach_the_system_prompt() {
    let mut harness = Harness::new();
    harness.instructions =
        vec![Instruction { source: "AGENTS.md".into(), text: "Always run the tests.".into() }];
    let script = r#"{"steps":[
        {"text":"first answer","expect":{"contains":["Always run the tests.","Instructions from AGENTS.md"]}},
        {"text":"second answer","expect":{"contains":["first answer","second task"]}}
    ]}"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let config = harness.run_config();
    kernel.run_turn(session, "first task", &config, &Cancellation::new()).await.unwrap();
    let report =
        kernel.run_turn(session, "second task", &config, &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "second answer".into() });
}

#[tokio::test]
async fn script_expectation_failure_fails_the_run_with_a_clear_reason() {
    let harness = Harness::new();
    let (report, ledger) =
        harness.run(r#"{"steps":[{"text":"x","expect":{"contains":"absent text"}}]}"#, "t").await;
    assert_eq!(
        report.outcome,
        TurnOutcome::Failed {
            reason: "model error: script step 1: expected the request to contain \"absent text\""
                .into()
        }
    );
    assert!(ledger.ends_with(
        "run_failed model error: script step 1: expected the request to contain \"absent text\"\n"
    ));
    let (report, _) = harness.run(r#"{"steps":[]}"#, "t").await;
    assert!(
        matches!(report.outcome, TurnOutcome::Failed { reason } if reason.contains("script exhausted"))
    );
}

/// A model that returns fixed responses in order, for shapes the scripted model cannot
/// produce (malformed arguments, truncation).
#[derive(Debug)]
pub(crate) struct Fixed(pub(crate) std::sync::Mutex<Vec<Result<ModelResponse, ModelError>>>);

#[async_trait]
impl ModelClient for Fixed {
    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "fixed".into(), model: "fixed".into(), context_window: Some(1000) }
    }
    async fn complete(
        &self,
        _request: &ModelRequest,
        _on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        self.0.lock().unwrap().remove(0)
    }
}

pub(crate) fn response(
    text: &str,
    tool_calls: Vec<ToolCall>,
    finish_reason: FinishReason,
) -> ModelResponse {
    ModelResponse {
        text: text.into(),
        reasoning: Vec::new(),
        tool_calls,
        usage: Usage::default(),
        raw_usage: None,
        finish_reason,
    }
}

#[tokio::test]
async fn malformed_arguments_are_reported_never_executed() {
    let harness = Harness::new();
    let malformed = ToolCall {
        call_id: ToolCallId("c1".into()),
        name: "write".into(),
        arguments: serde_json::Value::String("{\"path\":\"a\"}{\"path\":\"b\"}".into()),
        arguments_error: Some("trailing characters at line 1 column 13".into()),
    };
    let model = Fixed(std::sync::Mutex::new(vec![
        Ok(response("", vec![malformed], FinishReason::ToolCalls)),
        Ok(response("noted", vec![], FinishReason::Stop)),
    ]));
    let kernel = harness.kernel_with(Arc::new(model));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    assert!(harness.invocations().is_empty());
    let events = harness.events(session).await;
    let messages = projection::messages(&events);
    projection::check_pairing(&messages).unwrap();
    assert!(matches!(
        &messages[2],
        keel_contracts::Message::ToolResult { outcome: Outcome::Error, content, .. }
            if content.contains("not valid JSON")
    ));
}

#[tokio::test]
async fn truncated_answer_and_provider_error_fail_the_run() {
    let harness = Harness::new();
    let model = Fixed(std::sync::Mutex::new(vec![Ok(response(
        "half an ans",
        vec![],
        FinishReason::Length,
    ))]));
    let kernel = harness.kernel_with(Arc::new(model));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(
        matches!(&report.outcome, TurnOutcome::Failed { reason } if reason.contains("cut off"))
    );

    let model = Fixed(std::sync::Mutex::new(vec![Err(ModelError::new(
        ModelErrorKind::Auth,
        Some(401),
        "Incorrect API key provided",
    ))]));
    let kernel = harness.kernel_with(Arc::new(model));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Failed { reason: "model error (HTTP 401): Incorrect API key provided".into() }
    );
}

#[tokio::test]
async fn repeated_call_ids_get_fresh_ones_so_every_result_keeps_its_call() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"id":"dup","name":"read","arguments":{"path":"a"}},{"id":"dup","name":"broken","arguments":{}}]},
        {"tool_calls":[{"id":"dup","name":"read","arguments":{"path":"b"}}],"expect":{"last_outcomes":["ok","error"]}},
        {"text":"done","expect":{"last_outcomes":["ok"]}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{ledger}");
    assert!(ledger.contains("[dup read {\"path\":\"a\"}; dup-2 broken {}]"), "{ledger}");
    assert!(ledger.contains("[dup-3 read {\"path\":\"b\"}]"), "{ledger}");
    assert!(ledger.contains("tool_result dup-2/id5 error \"it broke\""), "{ledger}");
}
