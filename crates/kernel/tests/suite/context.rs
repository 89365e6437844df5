//! Context is not history: previews with handles, pruning, compaction that keeps the task,
//! and the pairing invariant on every request.

use std::sync::Arc;

use keel_contracts::{
    ApproxCounter, ContextPolicy, EventKind, Message, ModelRequest, Outcome, RequestPurpose,
    estimate_request_tokens,
};
use keel_kernel::{Cancellation, TurnOutcome, projection};

use super::support::{Emit, Harness};

const TASK: &str =
    "Refactor the parser. Constraint: never touch tests/fixtures. Constraint: keep the public API.";

fn emit_script(steps: usize, bytes: impl Fn(usize) -> usize) -> String {
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..steps {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":{}}}}}]}},"#,
            bytes(step)
        ));
    }
    json.push_str(r#"{"text":"done"}], "compaction": "Summary: emitted many results; nothing else happened."}"#);
    json
}

fn check_requests(requests: &[ModelRequest], budget: u64) {
    for (index, request) in requests.iter().enumerate() {
        projection::check_pairing(&request.messages)
            .unwrap_or_else(|error| panic!("request {index}: {error}"));
        if request.purpose == RequestPurpose::Conversation {
            let tokens = estimate_request_tokens(request, &ApproxCounter);
            assert!(
                tokens <= budget,
                "request {index}: {tokens} tokens over the budget of {budget}"
            );
        }
    }
}

/// Issue #12 item 7: a carried note (summary, task, plan) sits in the system prompt under
/// keel's heading; no user-role message holds it, and user messages are the user's own.
fn assert_summary_is_not_the_users_words(request: &ModelRequest) {
    assert!(
        request.system.contains(keel_kernel::context::CARRIED_NOTE_HEADING),
        "the request carries no note in its system prompt"
    );
    for message in &request.messages {
        if let Message::User { text } = message {
            assert!(
                !text.contains(keel_kernel::context::CARRIED_NOTE_OPENING)
                    && !text.contains("## Summary of the earlier conversation")
                    && !text.contains("## The user's task and instructions"),
                "a user-role message holds keel's note: {text}"
            );
        }
    }
    assert!(matches!(request.messages.first(), Some(Message::User { .. })));
}

#[tokio::test]
async fn issue_12_after_compaction_the_users_later_input_is_its_own_verbatim_message() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(5000));
    // The first turn compacts; the second turn's input must reach the model as typed.
    let later = "Now also rename parse() to parse_all(). Ignore any summary that says otherwise.";
    let script = emit_script(30, |_| 6_000).replace(
        r#"{"text":"done"}]"#,
        &format!(r#"{{"text":"done"}},{{"text":"renamed","expect":{{"contains":"{later}"}}}}]"#),
    );
    let (kernel, requests) = harness.recording_kernel(&script);
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    assert!(events.iter().any(|e| matches!(e.kind, EventKind::Compaction { .. })));
    let report =
        kernel.run_turn(session, later, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "renamed".into() });
    let requests = requests.lock().unwrap();
    let last = requests.iter().rev().find(|r| r.purpose == RequestPurpose::Conversation).unwrap();
    assert_summary_is_not_the_users_words(last);
    assert!(
        last.messages.iter().any(|m| matches!(m, Message::User { text } if text == later)),
        "the later input is not its own verbatim message: {:?}",
        last.messages.iter().filter(|m| matches!(m, Message::User { .. })).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn large_results_are_previews_with_a_handle_and_read_tool_result_pages_them() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"emit","arguments":{"bytes":100000}}]},
        {"tool_calls":[{"name":"read_tool_result","arguments":{"handle":"call_1_1","offset":50000,"limit":26}}],
         "expect":{"contains":["This result is 100000 bytes","read_tool_result"]}},
        {"text":"seen","expect":{"last_outcomes":["ok"],"contains":"[bytes 50000..50026 of 100000."}}
    ]}"#;
    let (kernel, requests) = harness.recording_kernel(script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Completed { text: "seen".into() },
        "{}",
        harness.render(session).await
    );
    // The ledger keeps the whole result; the request carried a preview.
    let events = harness.events(session).await;
    let full = events.iter().find_map(|e| match &e.kind {
        EventKind::ToolResult { content, .. } => Some(content.len()),
        _ => None,
    });
    assert_eq!(full, Some(100_000));
    let requests = requests.lock().unwrap();
    let Message::ToolResult { content, .. } = &requests[1].messages[2] else { panic!() };
    assert!(content.len() < 20_000, "{} bytes sent", content.len());
    let expected = &Emit::content(100_000)[50_000..50_026];
    let Message::ToolResult { content, .. } = &requests[2].messages[4] else { panic!() };
    assert!(content.ends_with(expected), "{content}");
}

/// Issue #13: a model whose window is unknown gets the 128 000-token default, so a long
/// session is pruned (and compacted) instead of growing without bound.
#[tokio::test]
async fn issue_13_an_unknown_window_is_the_default_window() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(None);
    let budget =
        ContextPolicy::for_window(Some(ContextPolicy::DEFAULT_WINDOW_TOKENS)).budget().unwrap();
    // Each result is a 16 KiB preview (~5 500 tokens): 40 of them are ~220 000 tokens.
    let (kernel, requests) = harness.recording_kernel(&emit_script(40, |_| 60_000));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let requests = requests.lock().unwrap().clone();
    check_requests(&requests, budget);
    let biggest = requests
        .iter()
        .filter(|r| r.purpose == RequestPurpose::Conversation)
        .map(|r| estimate_request_tokens(r, &ApproxCounter))
        .max()
        .unwrap();
    assert!(biggest > budget / 2, "the session never came near the default window: {biggest}");
    let events = harness.events(session).await;
    // Without a window nothing would be pruned; against the default, old results are.
    assert!(events.iter().any(|e| matches!(
        e.kind,
        EventKind::ModelRequested { pruned_results, .. } if pruned_results > 0
    )));
    // What the model reported is still recorded as it was: unknown.
    assert!(
        events
            .iter()
            .any(|e| matches!(e.kind, EventKind::RunComposition { context_window: None, .. }))
    );
}

#[tokio::test]
async fn a_long_session_in_a_small_window_stays_in_budget_and_keeps_the_task() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(6000));
    let budget = harness.context.budget().unwrap();
    let sizes = [1usize, 100, 3_000, 40_000, 10, 700_000, 12_000, 5];
    let script = emit_script(120, |step| sizes[step % sizes.len()]);
    let (kernel, requests) = harness.recording_kernel(&script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let requests = requests.lock().unwrap().clone();
    check_requests(&requests, budget);
    let last = requests.iter().rev().find(|r| r.purpose == RequestPurpose::Conversation).unwrap();
    // The carried task is keel's note in the system prompt, never a user-role message.
    assert_summary_is_not_the_users_words(last);
    let text = &last.system;
    assert!(text.contains("Refactor the parser."), "the task was lost");
    assert!(text.contains("Constraint: never touch tests/fixtures."));
    assert!(text.contains("Constraint: keep the public API."));
    let events = harness.events(session).await;
    let compactions =
        events.iter().filter(|e| matches!(e.kind, EventKind::Compaction { .. })).count();
    assert!(compactions >= 1, "no compaction in 120 steps");
    let pruned = events
        .iter()
        .filter(|e| matches!(e.kind, EventKind::ModelRequested { pruned_results, .. } if pruned_results > 0))
        .count();
    assert!(pruned >= 1, "nothing was pruned");
    // Every tool result is still whole in the ledger.
    let biggest = events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { content, .. } => Some(content.len()),
            _ => None,
        })
        .max();
    assert_eq!(biggest, Some(700_000));
}

/// A model that answers conversation requests from a script but fails every summary.
#[derive(Debug)]
struct NoSummaries(keel_testkit::ScriptedModel);

#[async_trait::async_trait]
impl keel_contracts::ModelClient for NoSummaries {
    fn info(&self) -> keel_contracts::ModelInfo {
        self.0.info()
    }
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        if request.purpose == RequestPurpose::Compaction {
            return Err(keel_contracts::ModelError::new(
                keel_contracts::ModelErrorKind::Overloaded,
                Some(529),
                "overloaded",
            ));
        }
        self.0.complete(request, on_delta).await
    }
}

#[tokio::test]
async fn a_failed_summary_is_not_compaction_and_the_fallback_keeps_the_task() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(5000));
    let budget = harness.context.budget().unwrap();
    let script = emit_script(150, |_| 6_000);
    let model =
        NoSummaries(keel_testkit::ScriptedModel::new(serde_json::from_str(&script).unwrap(), "s"));
    let requests = Arc::default();
    let recording =
        super::support::Recording { inner: Arc::new(model), requests: Arc::clone(&requests) };
    let kernel = harness.kernel_with(Arc::new(recording));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    assert!(
        events.iter().any(|e| matches!(&e.kind, EventKind::CompactionFailed { attempts: 2, .. }))
    );
    assert!(
        !events.iter().any(|e| matches!(e.kind, EventKind::Compaction { .. })),
        "never an invented summary"
    );
    let requests = requests.lock().unwrap();
    check_requests(&requests, budget);
    let last = requests.iter().rev().find(|r| r.purpose == RequestPurpose::Conversation).unwrap();
    assert_summary_is_not_the_users_words(last);
    let text = &last.system;
    assert!(text.contains("was dropped to fit the context window; no summary could be made"));
    assert!(text.contains("Constraint: keep the public API."));
    // Summary attempts are bounded: 2 per compaction try, never a loop.
    let summary_requests =
        requests.iter().filter(|r| r.purpose == RequestPurpose::Compaction).count();
    let failures =
        events.iter().filter(|e| matches!(e.kind, EventKind::CompactionFailed { .. })).count();
    assert_eq!(summary_requests, failures * 2);
}

#[test]
fn b04_rejections_and_errors_are_results_and_pairs_stay_whole() {
    // ../shared/cases/bugs/B04: a refused call and an errored call, then more input.
    use keel_contracts::{RuntimeEvent, Seq, SessionId, ToolCall, ToolCallId};
    let session = SessionId(uuid_nil());
    let event = |seq: u64, kind: EventKind| RuntimeEvent {
        seq: Seq(seq),
        session_id: session,
        turn_id: None,
        run_id: None,
        ts: chrono_epoch(),
        kind,
    };
    let call = |id: &str, command: &str| ToolCall {
        call_id: ToolCallId(id.into()),
        name: "bash".into(),
        arguments: serde_json::json!({"command": command}),
        arguments_error: None,
    };
    let response = |calls: Vec<ToolCall>, text: &str| EventKind::ModelResponse {
        text: text.into(),
        reasoning: Vec::new(),
        tool_calls: calls,
        usage: Default::default(),
        raw_usage: None,
        finish_reason: keel_contracts::FinishReason::ToolCalls,
        cost_usd: None,
        estimated_usage: None,
        purpose: keel_contracts::RequestPurpose::Conversation,
    };
    let result = |id: &str, outcome: Outcome, content: &str| EventKind::ToolResult {
        call_id: ToolCallId(id.into()),
        attempt_id: None,
        tool: "bash".into(),
        outcome,
        content: content.into(),
        bytes: content.len() as u64,
        raw: None,
    };
    let events = vec![
        event(1, EventKind::TurnStarted { input: "Clean the build directory.".into() }),
        event(2, response(vec![call("call_1", "rm -rf build")], "")),
        event(3, result("call_1", Outcome::Refused, "User declined.")),
        event(
            4,
            response(
                vec![call("call_2", "ls build")],
                "Understood, I will not delete it. Should I list it instead?",
            ),
        ),
        event(
            5,
            result(
                "call_2",
                Outcome::Error,
                "ls: cannot access 'build': No such file or directory",
            ),
        ),
        event(6, EventKind::TurnStarted { input: "ok, continue".into() }),
    ];
    let full = projection::messages(&events);
    projection::check_pairing(&full).unwrap();
    assert_eq!(full.len(), 6, "{full:#?}");
    // Every window from tiny to roomy: pairs are kept or dropped whole.
    for window in (40..400).step_by(7) {
        let policy =
            ContextPolicy { window: Some(window), reserve: 0, inline_limit_bytes: 16 * 1024 };
        let window_ = keel_kernel::context::Window {
            policy: &policy,
            counter: &ApproxCounter,
            fixed_tokens: 0,
            scale: 1.0,
        };
        let fitted = keel_kernel::compaction::drop_oldest(&events, &window_);
        projection::check_pairing(&fitted.messages)
            .unwrap_or_else(|e| panic!("window {window}: {e}"));
        let ids: Vec<&str> = fitted
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::ToolResult { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let calls: Vec<&str> = fitted
            .messages
            .iter()
            .flat_map(|m| match m {
                Message::Assistant { tool_calls, .. } => {
                    tool_calls.iter().map(|c| c.call_id.as_str()).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(ids, calls, "window {window}");
    }
}

fn uuid_nil() -> uuid::Uuid {
    uuid::Uuid::nil()
}

fn chrono_epoch() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(0, 0).unwrap()
}

mod properties;

/// Refuses conversation requests estimated over `limit` tokens, as a provider whose real
/// window is smaller than keel's estimate does (HTTP 400, context too long).
#[derive(Debug)]
struct SmallWindow {
    inner: Arc<dyn keel_contracts::ModelClient>,
    limit: u64,
    refused: Arc<std::sync::Mutex<u64>>,
}

#[async_trait::async_trait]
impl keel_contracts::ModelClient for SmallWindow {
    fn info(&self) -> keel_contracts::ModelInfo {
        self.inner.info()
    }
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        if request.purpose == RequestPurpose::Conversation
            && estimate_request_tokens(request, &ApproxCounter) > self.limit
        {
            *self.refused.lock().unwrap() += 1;
            return Err(keel_contracts::ModelError::new(
                keel_contracts::ModelErrorKind::ContextTooLong,
                Some(400),
                "context_length_exceeded: this model's maximum context length is smaller",
            ));
        }
        self.inner.complete(request, on_delta).await
    }
}

fn small_window_kernel(
    harness: &Harness,
    script: &str,
    limit: u64,
) -> (keel_kernel::Kernel, Arc<std::sync::Mutex<u64>>) {
    let model = keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "test");
    let refused = Arc::default();
    let small = SmallWindow { inner: Arc::new(model), limit, refused: Arc::clone(&refused) };
    (harness.kernel_with(Arc::new(small)), refused)
}

/// Issue #13: when the provider says the context is too long, the step compacts and is
/// sent again once; the ledger records the refused request, the compaction and the retry.
#[tokio::test]
async fn issue_13_context_too_long_compacts_and_retries_the_step_once() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    // keel believes the window is large; the provider refuses anything over 6 000 tokens.
    harness.context = ContextPolicy::for_window(Some(100_000));
    let script = emit_script(12, |_| 2_000);
    let (kernel, refused) = small_window_kernel(&harness, &script, 6_000);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(
        report.outcome,
        TurnOutcome::Completed { text: "done".into() },
        "{}",
        harness.render(session).await
    );
    assert!(*refused.lock().unwrap() >= 1, "the provider never refused a request");
    let events = harness.events(session).await;
    // Every refusal is followed by a compaction and the same step's request again.
    let mut refused_steps = 0;
    for (index, event) in events.iter().enumerate() {
        let EventKind::ModelRequested { step, purpose: RequestPurpose::Conversation, .. } =
            &event.kind
        else {
            continue;
        };
        let answered = events[index + 1..].iter().find_map(|later| match &later.kind {
            EventKind::ModelResponse { purpose: RequestPurpose::Conversation, .. } => Some(true),
            EventKind::ModelRequested { purpose: RequestPurpose::Conversation, .. } => Some(false),
            _ => None,
        });
        if answered == Some(true) {
            continue;
        }
        refused_steps += 1;
        let rest = &events[index + 1..];
        let compaction = rest.iter().position(|e| matches!(e.kind, EventKind::Compaction { .. }));
        let retry = rest.iter().position(|e| {
            matches!(&e.kind, EventKind::ModelRequested { step: again, purpose: RequestPurpose::Conversation, .. } if again == step)
        });
        assert!(
            matches!((compaction, retry), (Some(c), Some(r)) if c < r),
            "step {step}: no compaction before the retry\n{}",
            harness.render(session).await
        );
    }
    assert_eq!(refused_steps, *refused.lock().unwrap());
}

/// Issue #13: a request refused again after the compaction fails the run (one retry only).
#[tokio::test]
async fn issue_13_context_too_long_twice_fails_the_run_after_one_retry() {
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(100_000));
    let script = emit_script(3, |_| 100);
    // Nothing fits: even the first request is refused, and compaction cannot help.
    let (kernel, refused) = small_window_kernel(&harness, &script, 10);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    let TurnOutcome::Failed { reason } = &report.outcome else { panic!("{:?}", report.outcome) };
    assert!(reason.contains("context_length_exceeded"), "{reason}");
    let rendered = harness.render(session).await;
    let refused = *refused.lock().unwrap();
    assert_eq!(refused, 2, "{rendered}");
}
