//! Reading: the `after` bound and round-tripping.

use keel_contracts::{EventKind, Outcome, Seq, ToolCallId};

use super::{Events, StoreFactory, must, session};

pub(super) async fn read_returns_events_after_the_bound<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    let mut chain = events.chain(s1, 4);
    // A kind with nested data and non-ASCII text must round-trip exactly.
    chain.push(events.event(
        s1,
        5,
        EventKind::ToolResult {
            call_id: "c1".into(),
            attempt_id: None,
            tool: "read_file".to_owned(),
            outcome: Outcome::Ok,
            content: "fn main() {}\n// ünïcödé ✓ \"quoted\"\t\u{0}".to_owned(),
            bytes: 40,
            raw: None,
        },
    ));
    must(store.append(&chain).await, "append 1..=5");
    must(store.append(&events.chain(s2, 2)).await, "append other session");

    assert_eq!(must(store.read(s1, Seq(0)).await, "read after 0"), chain);
    assert_eq!(must(store.read(s1, Seq(3)).await, "read after 3"), chain[3..]);
    assert!(must(store.read(s1, Seq(5)).await, "read after 5").is_empty());
    assert!(must(store.read(s1, Seq(99)).await, "read after 99").is_empty());
    assert!(must(store.read(s1, Seq(u64::MAX)).await, "read after max").is_empty());
    assert!(must(store.read(session(3), Seq(0)).await, "unknown session").is_empty());
}

pub(super) async fn reads_by_kind_select_exactly_those_events<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    // 1 session_created, 2..=6 model_requested, 7 and 9 turn_started, 8 model_requested.
    let mut chain = events.chain(s1, 6);
    chain.push(events.event(s1, 7, EventKind::TurnStarted { input: "first".into() }));
    chain.push(events.filler(s1, 8));
    chain.push(events.event(s1, 9, EventKind::TurnStarted { input: "second".into() }));
    must(store.append(&chain).await, "append s1");
    must(store.append(&events.chain(s2, 3)).await, "append s2");

    let kinds = ["session_created", "turn_started"];
    let all = must(store.read_kinds(s1, &kinds, Seq(u64::MAX)).await, "read kinds");
    let expected: Vec<_> =
        chain.iter().filter(|event| kinds.contains(&event.kind.name())).cloned().collect();
    assert_eq!(all, expected);
    assert_eq!(all.iter().map(|event| event.seq.0).collect::<Vec<_>>(), [1, 7, 9]);
    let bounded = must(store.read_kinds(s1, &kinds, Seq(8)).await, "read kinds up to 8");
    assert_eq!(bounded, expected[..2]);
    // Kinds a store may not index (SQLite indexes facts and compactions only) read the same.
    let mixed =
        must(store.read_kinds(s1, &["model_requested", "turn_started"], Seq(7)).await, "mixed");
    assert_eq!(mixed.iter().map(|event| event.seq.0).collect::<Vec<_>>(), [2, 3, 4, 5, 6, 7]);
    assert!(must(store.read_kinds(s1, &[], Seq(9)).await, "no kinds").is_empty());
    assert!(must(store.read_kinds(session(3), &kinds, Seq(9)).await, "unknown").is_empty());

    let last = must(store.last_of_kind(s1, "model_requested").await, "last of kind");
    assert_eq!(last.as_ref(), Some(&chain[7]));
    assert_eq!(
        must(store.last_of_kind(s1, "turn_started").await, "last turn"),
        Some(chain[8].clone())
    );
    assert_eq!(must(store.last_of_kind(s1, "compaction").await, "none"), None);
    assert_eq!(
        must(store.last_of_kind(s2, "model_requested").await, "other session").map(|e| e.seq),
        Some(Seq(3))
    );
}

/// `last_tool_result` finds the latest `tool_result` of the session for exactly that call
/// id: not a call id only proposed (in a `model_response`), not another session's, not a
/// prefix; ids with quotes, backslashes, non-ASCII and NUL are found as written.
pub(super) async fn tool_results_are_found_by_call_id<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    let result = |seq: u64, session_id, call_id: &str| {
        events.event(
            session_id,
            seq,
            EventKind::ToolResult {
                call_id: call_id.into(),
                attempt_id: None,
                tool: "read_file".to_owned(),
                outcome: Outcome::Ok,
                content: "body with a \u{0} and \"quotes\"".to_owned(),
                bytes: 28,
                raw: None,
            },
        )
    };
    let odd = "call \"q\" \\ ünï \u{0} ✓";
    let mut chain = events.chain(s1, 2);
    chain.push(events.event(
        s1,
        3,
        EventKind::ModelResponse {
            text: String::new(),
            reasoning: Vec::new(),
            tool_calls: vec![keel_contracts::ToolCall {
                call_id: "proposed".into(),
                name: "read_file".into(),
                arguments: serde_json::json!({"path": "a"}),
                arguments_error: None,
            }],
            usage: keel_contracts::Usage::default(),
            raw_usage: None,
            finish_reason: keel_contracts::FinishReason::ToolCalls,
            cost_usd: None,
            estimated_usage: None,
            purpose: keel_contracts::RequestPurpose::Conversation,
        },
    ));
    chain.push(result(4, s1, "call_1"));
    chain.push(result(5, s1, odd));
    chain.push(result(6, s1, "call_1"));
    must(store.append(&chain).await, "append s1");
    let mut other = events.chain(s2, 1);
    other.push(result(2, s2, "only_in_s2"));
    must(store.append(&other).await, "append s2");

    let last = |session_id, id: &str| {
        let store = store.clone();
        let id = ToolCallId::from(id);
        async move { must(store.last_tool_result(session_id, &id).await, "last_tool_result") }
    };
    let has = |session_id, id: &'static str| {
        let found = last(session_id, id);
        async move { found.await.is_some() }
    };
    // The latest of two results with one id, whole.
    assert_eq!(last(s1, "call_1").await.as_ref(), chain.get(5));
    assert_eq!(last(s1, odd).await.as_ref(), chain.get(4));
    assert!(!has(s1, "proposed").await, "a proposed call without a result");
    assert!(!has(s1, "call_").await, "a prefix");
    assert!(!has(s1, "call_12").await);
    assert!(!has(s1, "only_in_s2").await, "another session's result");
    assert!(has(s2, "only_in_s2").await);
    assert!(!has(session(3), "call_1").await, "an unknown session");
}
