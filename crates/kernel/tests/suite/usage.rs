//! Every fact exact (issue #12): usage a provider did not report is estimated, marked and
//! charged; keel's own model calls (compaction summaries) are ledger facts charged like any
//! other; terminal events carry what a script needs.

use keel_contracts::{
    Budget, ContextPolicy, EventKind, Price, RequestPurpose, RuntimeEvent, UsageTotals,
};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::{Emit, Harness};

fn responses(events: &[RuntimeEvent]) -> Vec<&EventKind> {
    events
        .iter()
        .map(|e| &e.kind)
        .filter(|k| matches!(k, EventKind::ModelResponse { .. }))
        .collect()
}

/// The totals a reader folds from the ledger's `model_response` events alone.
fn folded(events: &[RuntimeEvent]) -> UsageTotals {
    let mut totals = UsageTotals::default();
    for kind in responses(events) {
        if let EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } = kind {
            totals.add(usage, estimated_usage.as_ref(), *cost_usd);
        }
    }
    totals
}

#[tokio::test]
async fn issue_12_unreported_usage_is_estimated_and_a_token_budget_still_stops_the_run() {
    let mut harness = Harness::new();
    harness.budget = Budget { max_tokens: Some(3_000), ..Budget::default() };
    // Twenty steps with no usage at all: counted as zero, the budget would never stop them.
    let step =
        r#"{"text":"reading a again","tool_calls":[{"name":"read","arguments":{"path":"a"}}]}"#;
    let steps = vec![step; 20].join(",");
    let script = format!(r#"{{"steps":[{steps},{{"text":"report"}}]}}"#);
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let TurnOutcome::Suspended { reason, .. } = &report.outcome else {
        panic!("a token budget must stop a run whose usage is unreported: {report:?}");
    };
    assert!(reason.starts_with("stopped early: token budget"), "{reason}");
    assert!(harness.invocations().len() < 20, "{} reads ran", harness.invocations().len());

    let events = harness.events(session).await;
    for kind in responses(&events) {
        let EventKind::ModelResponse { usage, estimated_usage, .. } = kind else { unreachable!() };
        assert_eq!(usage.input_tokens, None, "the provider's report stays as it was");
        let estimate = estimated_usage.expect("an unreported response carries keel's estimate");
        assert!(estimate.input_tokens.unwrap() > 0 && estimate.output_tokens.unwrap() > 0);
    }
    let usage = report.usage;
    assert_eq!(usage.responses_without_usage, usage.responses);
    assert_eq!(usage.estimated_tokens, usage.input_tokens + usage.output_tokens);
    assert!(usage.input_tokens > 0);
    // The ledger alone gives the same totals.
    assert_eq!(folded(&events), usage);
}

/// A provider that reports input tokens but not output tokens on its tool-free answers.
#[derive(Debug)]
struct NoOutputCount(keel_testkit::ScriptedModel);

#[async_trait::async_trait]
impl keel_contracts::ModelClient for NoOutputCount {
    fn info(&self) -> keel_contracts::ModelInfo {
        self.0.info()
    }
    async fn complete(
        &self,
        request: &keel_contracts::ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        let mut response = self.0.complete(request, on_delta).await?;
        if response.tool_calls.is_empty() {
            response.usage.output_tokens = None;
        }
        Ok(response)
    }
}

#[tokio::test]
async fn issue_12_reported_figures_are_kept_and_only_the_missing_one_is_estimated() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":120,"output_tokens":7}},
        {"text":"a holds contents","usage":{"input_tokens":150,"output_tokens":999}}
    ]}"#;
    let model = keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "s");
    let kernel = harness.kernel_with(std::sync::Arc::new(NoOutputCount(model)));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "a holds contents".into() });
    let events = harness.events(session).await;
    let estimates: Vec<_> = responses(&events)
        .into_iter()
        .map(|kind| match kind {
            EventKind::ModelResponse { estimated_usage, .. } => *estimated_usage,
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(estimates[0], None, "a fully reported response has no estimate");
    let partial = estimates[1].expect("the missing output figure is estimated");
    assert_eq!(partial.input_tokens, None, "a reported figure is never replaced");
    // "a holds contents" is 16 bytes: ceil(16 / 3) = 6 tokens with the test counter.
    assert_eq!(partial.output_tokens, Some(6));
    assert_eq!(report.usage.input_tokens, 270);
    assert_eq!(report.usage.output_tokens, 13);
    assert_eq!(report.usage.estimated_tokens, 6);
    assert_eq!(report.usage.responses_without_usage, 1);
}

#[tokio::test]
async fn issue_12_compaction_summaries_are_recorded_model_calls_charged_to_the_run() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(5000));
    harness.price =
        Some(Price { input_per_mtok: 1.0, cached_input_per_mtok: None, output_per_mtok: 2.0 });
    let mut steps = String::new();
    for step in 0..40 {
        steps.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":3000}}}}],"usage":{{"input_tokens":1000,"output_tokens":10}}}},"#
        ));
    }
    let script = format!(
        r#"{{"steps":[{steps}{{"text":"done","usage":{{"input_tokens":1000,"output_tokens":10}}}}],"compaction":"Summary: emitted results."}}"#
    );
    let (kernel, requests) = harness.recording_kernel(&script);
    let session = harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "emit", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;

    // Each summary request is a model_requested, then a model_response, both with purpose
    // compaction, before the compaction event that uses the summary.
    let kinds: Vec<&EventKind> = events.iter().map(|e| &e.kind).collect();
    let compaction_at = kinds
        .iter()
        .position(|k| matches!(k, EventKind::Compaction { .. }))
        .expect("the run compacted");
    assert!(matches!(
        kinds[compaction_at - 1],
        EventKind::ModelResponse { purpose: RequestPurpose::Compaction, text, cost_usd: Some(_), .. }
            if text == "Summary: emitted results."
    ));
    assert!(matches!(
        kinds[compaction_at - 2],
        EventKind::ModelRequested { purpose: RequestPurpose::Compaction, .. }
    ));
    let summaries = kinds
        .iter()
        .filter(|k| {
            matches!(k, EventKind::ModelResponse { purpose: RequestPurpose::Compaction, .. })
        })
        .count();
    let summary_requests =
        requests.lock().unwrap().iter().filter(|r| r.purpose == RequestPurpose::Compaction).count();
    assert_eq!(summaries, summary_requests, "every summary call the model saw is recorded");

    // The run's totals include the summaries: the same as folding every model_response.
    let conversation = responses(&events)
        .into_iter()
        .filter(|k| {
            matches!(k, EventKind::ModelResponse { purpose: RequestPurpose::Conversation, .. })
        })
        .count() as u64;
    assert_eq!(report.usage.responses, conversation + summaries as u64);
    let ledger_totals = folded(&events);
    assert_eq!(ledger_totals.responses, report.usage.responses);
    assert_eq!(ledger_totals.input_tokens, report.usage.input_tokens);
    let (Some(run_cost), Some(ledger_cost)) = (report.usage.cost_usd, ledger_totals.cost_usd)
    else {
        panic!("every response had a price: {report:?}");
    };
    assert!((run_cost - ledger_cost).abs() < 1e-12);

    // A summary response is never part of the conversation the model sees.
    for request in requests.lock().unwrap().iter() {
        if request.purpose != RequestPurpose::Conversation {
            continue;
        }
        for message in &request.messages {
            if let keel_contracts::Message::Assistant { text, .. } = message {
                assert_ne!(text, "Summary: emitted results.");
            }
        }
    }
}

#[tokio::test]
async fn issue_12_terminal_events_carry_the_answer_the_duration_and_the_usage() {
    let mut harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"a"}}],"usage":{"input_tokens":10,"output_tokens":2}},
        {"text":"a holds contents","usage":{"input_tokens":20,"output_tokens":3}}
    ]}"#;
    let (report, _) = harness.run(script, "go").await;
    let session = harness.store.sessions().await.unwrap()[0].id;
    let events = harness.events(session).await;
    let Some(EventKind::RunCompleted { answer, duration_ms, usage, .. }) =
        events.last().map(|e| &e.kind)
    else {
        panic!("the run did not complete: {events:?}");
    };
    assert_eq!(answer.as_deref(), Some("a holds contents"));
    assert!(duration_ms.is_some());
    assert_eq!(*usage, report.usage);
    assert_eq!((usage.input_tokens, usage.output_tokens), (30, 5));

    // A suspended run's last line carries its report.
    harness.max_steps = Some(1);
    let script = r#"{"steps":[{"text":"Report: nothing done yet."}]}"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    let Some(EventKind::RunSuspended { answer, duration_ms, .. }) = events.last().map(|e| &e.kind)
    else {
        panic!("the run was not suspended: {events:?}");
    };
    assert_eq!(answer.as_deref(), Some("Report: nothing done yet."));
    assert!(duration_ms.is_some());
}
