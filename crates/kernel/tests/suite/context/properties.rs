//! Properties of the projection over generated ledgers: every request keeps calls and
//! results paired and fits its window, and the incremental context equals the one built
//! from scratch.

use keel_contracts::{
    ApproxCounter, ContextPolicy, EventKind, FinishReason, Outcome, RuntimeEvent, Seq, SessionId,
    ToolCall, ToolCallId, estimate_messages_tokens,
};
use keel_kernel::context::{self, Window};
use keel_kernel::projection;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Input(usize),
    Answer(usize),
    Calls(Vec<(usize, u8)>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1usize..400).prop_map(Step::Input),
        (0usize..400).prop_map(Step::Answer),
        proptest::collection::vec((0usize..60_000, 0u8..4), 1..4).prop_map(Step::Calls),
    ]
}

fn history(steps: &[Step]) -> Vec<RuntimeEvent> {
    let mut events = Vec::new();
    let mut push = |kind: EventKind| {
        let seq = Seq(events.len() as u64 + 1);
        events.push(RuntimeEvent {
            seq,
            session_id: SessionId(uuid::Uuid::nil()),
            turn_id: None,
            run_id: None,
            ts: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            kind,
        });
    };
    push(EventKind::TurnStarted { input: "the original task: keep it".into() });
    let mut next_call = 0;
    for step in steps {
        match step {
            Step::Input(n) => push(EventKind::TurnStarted { input: "u".repeat(*n) }),
            Step::Answer(n) => push(EventKind::ModelResponse {
                text: "a".repeat(*n),
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
                usage: Default::default(),
                raw_usage: None,
                finish_reason: FinishReason::Stop,
                cost_usd: None,
                estimated_usage: None,
                purpose: keel_contracts::RequestPurpose::Conversation,
            }),
            Step::Calls(calls) => {
                let ids: Vec<String> = calls
                    .iter()
                    .map(|_| {
                        next_call += 1;
                        format!("c{next_call}")
                    })
                    .collect();
                push(EventKind::ModelResponse {
                    text: String::new(),
                    reasoning: Vec::new(),
                    tool_calls: ids
                        .iter()
                        .map(|id| ToolCall {
                            call_id: ToolCallId(id.clone()),
                            name: "read_file".into(),
                            arguments: serde_json::json!({"path": format!("{id}.rs")}),
                            arguments_error: None,
                        })
                        .collect(),
                    usage: Default::default(),
                    raw_usage: None,
                    finish_reason: FinishReason::ToolCalls,
                    cost_usd: None,
                    estimated_usage: None,
                    purpose: keel_contracts::RequestPurpose::Conversation,
                });
                for (id, (bytes, outcome)) in ids.iter().zip(calls) {
                    // Some calls never get a result (a crash): the projection answers them.
                    if *outcome == 3 && *bytes % 2 == 0 {
                        continue;
                    }
                    let outcome =
                        [Outcome::Ok, Outcome::Error, Outcome::Refused, Outcome::Cancelled]
                            [*outcome as usize];
                    push(EventKind::ToolResult {
                        call_id: ToolCallId(id.clone()),
                        attempt_id: None,
                        tool: "read_file".into(),
                        outcome,
                        content: "r".repeat(*bytes),
                        bytes: *bytes as u64,
                        raw: None,
                    });
                }
            }
        }
    }
    events
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Pruning and the drop-oldest fallback never produce orphans or unanswered calls,
    /// and never exceed the budget when they say they fit.
    #[test]
    fn pruning_and_dropping_keep_pairs_and_the_budget(
        steps in proptest::collection::vec(step(), 0..40),
        window in 800u64..20_000,
    ) {
        let events = history(&steps);
        let policy = ContextPolicy::for_window(Some(window));
        let budget = policy.budget().unwrap();
        let window = Window { policy: &policy, counter: &ApproxCounter, fixed_tokens: 300, scale: 1.0 };
        let mut verified = Default::default();
        let entries = context::retained_entries(&events, policy.inline_limit_bytes, &mut verified);
        for fitted in [context::fit(entries, &window), keel_kernel::compaction::drop_oldest(&events, &window)] {
            prop_assert!(projection::check_pairing(&fitted.messages).is_ok(), "{:?}", projection::check_pairing(&fitted.messages));
            let recount = 300 + estimate_messages_tokens(&fitted.messages, &ApproxCounter);
            prop_assert_eq!(recount, fitted.tokens);
            if !fitted.over_budget {
                prop_assert!(fitted.tokens <= budget);
            }
        }
        let dropped = keel_kernel::compaction::drop_oldest(&events, &window);
        let text = serde_json::to_string(&dropped.messages).unwrap();
        prop_assert!(text.contains("the original task: keep it"));
    }
}

/// What happens next in a session the incremental projection is checked over.
#[derive(Debug, Clone)]
enum Event {
    /// A user input (a new turn).
    Input(usize),
    /// An answer without calls.
    Answer(usize),
    /// A response with calls; their results follow as separate events, some never.
    Calls(Vec<(usize, u8)>),
    /// A compaction covering seq 1 up to this share (of 256) of the ledger, with its
    /// digest right or wrong.
    Compact(u8, bool),
    /// A resumed run (after a report, it adds keel's resume note).
    Resume,
    /// The last permitted step's note.
    Report(usize),
    /// The provider reported more tokens than estimated: the scale goes up.
    Scale(u8),
    /// The in-memory ledger now starts at this share (of 256) of the events (a suffix).
    Trim(u8),
    /// A step whose request is not sent (over budget, cancelled): no take, or a take
    /// without giving the messages back.
    Unsent(bool),
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => (1usize..400).prop_map(Event::Input),
        2 => (0usize..400).prop_map(Event::Answer),
        8 => proptest::collection::vec((0usize..9_000, 0u8..4), 1..4).prop_map(Event::Calls),
        1 => (0u8..=255, proptest::bool::weighted(0.8)).prop_map(|(at, ok)| Event::Compact(at, ok)),
        1 => Just(Event::Resume),
        1 => (1usize..200).prop_map(Event::Report),
        1 => (0u8..=255).prop_map(Event::Scale),
        1 => (0u8..=255).prop_map(Event::Trim),
        1 => proptest::bool::ANY.prop_map(Event::Unsent),
    ]
}

fn at(events: &[RuntimeEvent], share: u8) -> usize {
    events.len() * usize::from(share) / 256
}

/// Checks the incremental projection against the projection from scratch after every
/// appended event: the fit's figures, the request's system prompt and messages (as
/// JSON, byte for byte) and its digest.
fn check_incremental(
    plan: &[Event],
    window: Option<u64>,
    inline_limit: usize,
) -> Result<(), TestCaseError> {
    use keel_contracts::{Message, ModelRequest, RequestPurpose, RunId, ToolChoice};
    let mut policy = ContextPolicy::for_window(window);
    policy.inline_limit_bytes = inline_limit;
    let mut cache = context::IncrementalContext::new();
    let mut events: Vec<RuntimeEvent> = Vec::new();
    // The ledger as the kernel holds it: all events, or a suffix after a trim.
    let mut from = 0;
    let mut scale = 1.0;
    let mut next_call = 0;
    let mut lent: Option<Vec<Message>> = None;
    let mut check =
        |events: &[RuntimeEvent], scale: f64, send: Option<bool>| -> Result<(), TestCaseError> {
            let window =
                Window { policy: &policy, counter: &ApproxCounter, fixed_tokens: 300, scale };
            let summary = cache.fit(events, &window);
            let mut verified = Default::default();
            let expected = context::fit(
                context::retained_entries(events, policy.inline_limit_bytes, &mut verified),
                &window,
            );
            prop_assert_eq!(summary, context::FitSummary::from(&expected));
            let Some(give_back) = send else { return Ok(()) };
            let (system, messages) = cache.take_request("SYSTEM");
            let (expected_system, expected_messages) =
                context::place_carried_note("SYSTEM", expected.messages);
            let request = |system: String, messages: Vec<Message>| ModelRequest {
                model: "m".into(),
                system,
                messages,
                tools: Vec::new(),
                tool_choice: ToolChoice::Auto,
                responses_in_session: 0,
                purpose: RequestPurpose::Conversation,
            };
            let sent = request(system, messages);
            let expected = request(expected_system, expected_messages);
            prop_assert_eq!(
                serde_json::to_string(&sent).unwrap(),
                serde_json::to_string(&expected).unwrap()
            );
            prop_assert_eq!(cache.digest(&sent), keel_kernel::digest::request_digest(&expected));
            if give_back {
                cache.restore(sent.messages);
            } else {
                lent = Some(sent.messages);
            }
            Ok(())
        };
    let push = |events: &mut Vec<RuntimeEvent>, kind: EventKind| {
        let seq = Seq(events.len() as u64 + 1);
        events.push(RuntimeEvent {
            seq,
            session_id: SessionId(uuid::Uuid::nil()),
            turn_id: None,
            run_id: None,
            ts: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            kind,
        });
    };
    push(&mut events, EventKind::TurnStarted { input: "the original task: keep it".into() });
    check(&events, scale, Some(true))?;
    for step in plan {
        let mut send = Some(true);
        match step {
            Event::Input(n) => push(&mut events, EventKind::TurnStarted { input: "u".repeat(*n) }),
            Event::Answer(n) => push(&mut events, response("a".repeat(*n), Vec::new())),
            Event::Calls(calls) => {
                let ids: Vec<String> = calls
                    .iter()
                    .map(|_| {
                        next_call += 1;
                        format!("c{next_call}")
                    })
                    .collect();
                let tool_calls = ids
                    .iter()
                    .map(|id| ToolCall {
                        call_id: ToolCallId(id.clone()),
                        name: "read_file".into(),
                        arguments: serde_json::json!({"path": format!("{id}.rs")}),
                        arguments_error: None,
                    })
                    .collect();
                push(&mut events, response(String::new(), tool_calls));
                for (id, (bytes, outcome)) in ids.iter().zip(calls) {
                    // Each result is checked as it arrives (the calls still open).
                    check(&events[from..], scale, Some(true))?;
                    if *outcome == 3 && *bytes % 2 == 0 {
                        continue;
                    }
                    let outcome =
                        [Outcome::Ok, Outcome::Error, Outcome::Refused, Outcome::Cancelled]
                            [*outcome as usize];
                    push(
                        &mut events,
                        EventKind::ToolResult {
                            call_id: ToolCallId(id.clone()),
                            attempt_id: None,
                            tool: "read_file".into(),
                            outcome,
                            content: "r".repeat(*bytes),
                            bytes: *bytes as u64,
                            raw: None,
                        },
                    );
                }
            }
            Event::Compact(share, valid) => {
                let end = at(&events, *share).max(1);
                let covers_to = events[end - 1].seq;
                let covered = context::covered(&events, Seq(1), covers_to);
                let digest = match (covered, valid) {
                    (Some(covered), true) => context::digest_of(covered),
                    _ => "not the digest".to_owned(),
                };
                let carried = context::carry(Default::default(), events.iter().take(end));
                push(
                    &mut events,
                    EventKind::Compaction {
                        covers_from: Seq(1),
                        covers_to,
                        digest,
                        chain: None,
                        responses_before: None,
                        failures: None,
                        summary: format!("summary up to #{covers_to}"),
                        carried,
                        tokens_before: 0,
                        tokens_after: 0,
                    },
                );
            }
            Event::Resume => push(
                &mut events,
                EventKind::RunStarted {
                    mode: keel_contracts::ExecutionMode::Live,
                    sandbox: keel_contracts::SandboxMode::Bypass,
                    approval: keel_contracts::ApprovalMode::Auto,
                    budget: Default::default(),
                    resumes: Some(RunId(uuid::Uuid::nil())),
                },
            ),
            Event::Report(n) => push(
                &mut events,
                EventKind::BudgetExhausted {
                    reason: format!("stopped early: {}", "b".repeat(*n)),
                    report_requested: true,
                },
            ),
            Event::Scale(more) => scale = (scale + f64::from(*more) / 128.0).min(4.0),
            Event::Trim(share) => from = from.max(at(&events, *share)),
            Event::Unsent(give_back) => send = if *give_back { None } else { Some(false) },
        }
        from = from.min(events.len().saturating_sub(1));
        check(&events[from..], scale, send)?;
    }
    drop(lent);
    Ok(())
}

fn response(text: String, tool_calls: Vec<ToolCall>) -> EventKind {
    EventKind::ModelResponse {
        finish_reason: if tool_calls.is_empty() {
            FinishReason::Stop
        } else {
            FinishReason::ToolCalls
        },
        text,
        reasoning: Vec::new(),
        tool_calls,
        usage: Default::default(),
        raw_usage: None,
        cost_usd: None,
        estimated_usage: None,
        purpose: keel_contracts::RequestPurpose::Conversation,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Issue #13: the incremental projection sends exactly what the projection from
    /// scratch sends (figures, system prompt, messages byte for byte, digest) over random
    /// histories with compactions (valid and not), pruning, previews, shrinking, open
    /// calls, resumes, scale changes, ledgers that start at a later seq, and requests
    /// not sent or not given back.
    #[test]
    fn incremental_projection_equals_the_projection_from_scratch(
        plan in proptest::collection::vec(event(), 0..50),
        window in prop_oneof![Just(None), (800u64..40_000).prop_map(Some)],
        inline_limit in prop_oneof![Just(ContextPolicy::DEFAULT_INLINE_LIMIT_BYTES), 600usize..8_000],
    ) {
        check_incremental(&plan, window, inline_limit)?;
    }
}
