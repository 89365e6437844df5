//! Retries are facts (issue 12, item 9): each retry a provider client reports becomes a
//! `model_retry` event, durable while the client waits, in order, before the step's
//! `model_response` (or the run's failure).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use expect_test::expect;
use keel_contracts::{
    EventKind, FinishReason, ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest,
    ModelResponse, RetryNotice, Seq, SessionId, Store, StreamDelta, Usage,
};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::Harness;

#[tokio::test]
async fn issue_12_retries_are_ledger_events_in_order_before_model_response() {
    let harness = Harness::new();
    let (report, ledger) = harness
        .run(
            r#"{"steps":[
                {"tool_calls":[{"name":"read","arguments":{"path":"a"}}],
                 "retries":[{"status":429,"error":"rate_limited","wait_ms":4000},
                            {"status":500,"error":"server","partial":"Half an ans","wait_ms":250}]},
                {"text":"Done.","retries":[{"error":"transport","wait_ms":500}]}
            ]}"#,
            "read a",
        )
        .await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "Done.".into() });
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "read a"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_retry step=1 attempt=2 status=Some(429) rate_limited wait_ms=4000
        #7 model_retry step=1 attempt=3 status=Some(500) server wait_ms=250
        #8 model_response tool_calls "" [call_1_1 read {"path":"a"}]
        #9 gate_decision call_1_1 Allow scope.reads
        #10 tool_attempt_prepared call_1_1/id4
        #11 tool_result call_1_1/id4 ok "contents of a"
        #12 model_requested step=2 messages=3
        #13 model_retry step=2 attempt=2 status=None transport wait_ms=500
        #14 model_response stop "Done." []
        #15 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&ledger);
}

/// A provider client that reports one retry, then waits (as a real client does) and looks
/// whether the retry is already durable in the store before it answers or fails.
#[derive(Debug)]
struct RetryingClient {
    store: Arc<dyn Store>,
    session: Mutex<Option<SessionId>>,
    fail: bool,
    durable_before_answer: Mutex<Option<bool>>,
}

#[async_trait]
impl ModelClient for RetryingClient {
    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "test".into(), model: "m".into(), context_window: None }
    }

    async fn complete(
        &self,
        _request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        on_delta(StreamDelta::Text("lost ".into()));
        on_delta(StreamDelta::Retrying(RetryNotice {
            attempt: 2,
            status: Some(503),
            error: "overloaded".into(),
            message: "Service Unavailable".into(),
            wait: Duration::from_millis(20),
        }));
        let session = self.session.lock().unwrap().expect("the session is known");
        let mut durable = false;
        // The wait before the next attempt: the kernel records the retry meanwhile.
        for _ in 0..100 {
            tokio::time::sleep(Duration::from_millis(5)).await;
            let events = self.store.read(session, Seq(0)).await.unwrap();
            if events.iter().any(|e| matches!(e.kind, EventKind::ModelRetry { .. })) {
                durable = true;
                break;
            }
        }
        *self.durable_before_answer.lock().unwrap() = Some(durable);
        if self.fail {
            return Err(ModelError::new(ModelErrorKind::Overloaded, Some(503), "still overloaded"));
        }
        on_delta(StreamDelta::Text("kept".into()));
        Ok(ModelResponse {
            text: "kept".into(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
            usage: Usage { input_tokens: Some(3), output_tokens: Some(1), ..Usage::default() },
            raw_usage: None,
            finish_reason: FinishReason::Stop,
        })
    }
}

async fn run_retrying(fail: bool) -> (TurnOutcome, Vec<EventKind>, Option<bool>) {
    let harness = Harness::new();
    let client = Arc::new(RetryingClient {
        store: harness.store.clone(),
        session: Mutex::new(None),
        fail,
        durable_before_answer: Mutex::new(None),
    });
    let kernel = harness.kernel_with(client.clone());
    let session = harness.session(&kernel).await;
    *client.session.lock().unwrap() = Some(session);
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let kinds = harness.events(session).await.into_iter().map(|e| e.kind).collect();
    let durable = *client.durable_before_answer.lock().unwrap();
    (report.outcome, kinds, durable)
}

#[tokio::test]
async fn issue_12_a_retry_is_durable_while_the_client_waits() {
    let (outcome, kinds, durable) = run_retrying(false).await;
    assert_eq!(outcome, TurnOutcome::Completed { text: "kept".into() });
    assert_eq!(durable, Some(true), "model_retry was appended before the wait ended");
    let retry_at = kinds.iter().position(|k| matches!(k, EventKind::ModelRetry { .. })).unwrap();
    assert_eq!(
        kinds[retry_at],
        EventKind::ModelRetry {
            step: 1,
            attempt: 2,
            status: Some(503),
            error: "overloaded".into(),
            message: "Service Unavailable".into(),
            wait_ms: 20,
            purpose: keel_contracts::RequestPurpose::Conversation,
        }
    );
    assert!(matches!(kinds[retry_at - 1], EventKind::ModelRequested { step: 1, .. }));
    assert!(
        matches!(&kinds[retry_at + 1], EventKind::ModelResponse { text, .. } if text == "kept")
    );
}

#[tokio::test]
async fn issue_12_retries_before_a_failure_are_recorded_before_run_failed() {
    let (outcome, kinds, durable) = run_retrying(true).await;
    assert!(
        matches!(outcome, TurnOutcome::Failed { ref reason } if reason.contains("still overloaded"))
    );
    assert_eq!(durable, Some(true));
    let names: Vec<&str> = kinds.iter().map(EventKind::name).collect();
    assert_eq!(
        &names[names.len() - 3..],
        ["model_requested", "model_retry", "run_failed"],
        "{names:?}"
    );
}

/// A scripted model whose summary (compaction) requests are retried once before they
/// are answered.
#[derive(Debug)]
struct RetryOnSummary(keel_testkit::ScriptedModel);

#[async_trait]
impl ModelClient for RetryOnSummary {
    fn info(&self) -> ModelInfo {
        self.0.info()
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        if request.purpose == keel_contracts::RequestPurpose::Compaction {
            on_delta(StreamDelta::Retrying(RetryNotice {
                attempt: 2,
                status: Some(529),
                error: "overloaded".into(),
                message: "Overloaded".into(),
                wait: Duration::from_millis(1),
            }));
        }
        self.0.complete(request, on_delta).await
    }
}

#[tokio::test]
async fn issue_12_a_summary_call_s_retries_are_recorded_with_its_purpose() {
    use keel_contracts::RequestPurpose;
    let mut harness = Harness::new();
    harness.extra_tools.push(super::support::Emit::tool());
    harness.context = keel_contracts::ContextPolicy::for_window(Some(5000));
    let mut steps = String::new();
    for step in 0..40 {
        steps.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":3000}}}}]}},"#
        ));
    }
    let script = format!(r#"{{"steps":[{steps}{{"text":"done"}}],"compaction":"Summary."}}"#);
    let model = keel_testkit::ScriptedModel::new(serde_json::from_str(&script).unwrap(), "s");
    let kernel = harness.kernel_with(Arc::new(RetryOnSummary(model)));
    let session = harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "emit", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let kinds: Vec<EventKind> = harness.events(session).await.into_iter().map(|e| e.kind).collect();
    let retries: Vec<usize> = kinds
        .iter()
        .enumerate()
        .filter(|(_, k)| matches!(k, EventKind::ModelRetry { .. }))
        .map(|(idx, _)| idx)
        .collect();
    assert!(!retries.is_empty(), "the run compacted and its summary call was retried");
    for idx in retries {
        assert!(
            matches!(
                kinds[idx],
                EventKind::ModelRetry {
                    purpose: RequestPurpose::Compaction,
                    status: Some(529),
                    ..
                }
            ),
            "{:?}",
            kinds[idx]
        );
        assert!(matches!(
            kinds[idx - 1],
            EventKind::ModelRequested { purpose: RequestPurpose::Compaction, .. }
        ));
        assert!(matches!(
            kinds[idx + 1],
            EventKind::ModelResponse { purpose: RequestPurpose::Compaction, .. }
        ));
    }
}
