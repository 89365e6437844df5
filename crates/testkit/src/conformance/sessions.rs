//! The session listing (status, title, lineage) and id prefix resolution.

use keel_contracts::{
    EventKind, ResolveError, RuntimeEvent, Seq, SessionId, SessionStatus, SessionSummary,
    UsageTotals,
};
use uuid::Uuid;

use super::{Events, StoreFactory, created_kind, must, run_started, session};

fn ended(kind: &str) -> EventKind {
    let reason = format!("{kind} for the test");
    let usage = UsageTotals::default();
    match kind {
        "completed" => EventKind::RunCompleted { reason, usage, answer: None, duration_ms: None },
        "failed" => EventKind::RunFailed { reason, usage, answer: None, duration_ms: None },
        "suspended" => EventKind::RunSuspended { reason, usage, answer: None, duration_ms: None },
        "denied" => EventKind::RunDenied { reason, usage, answer: None, duration_ms: None },
        _ => EventKind::RunCancelled { reason, usage, answer: None, duration_ms: None },
    }
}

fn turn(input: &str) -> EventKind {
    EventKind::TurnStarted { input: input.to_owned() }
}

/// What a store must report for a session holding exactly `events`.
fn summary(
    events: &[RuntimeEvent],
    workspace: &str,
    title: &str,
    status: SessionStatus,
    parent: Option<SessionId>,
) -> SessionSummary {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        panic!("a summary needs events");
    };
    SessionSummary {
        id: first.session_id,
        created_at: first.ts,
        updated_at: last.ts,
        workspace: workspace.to_owned(),
        model: "scripted:fix.json".to_owned(),
        title: title.to_owned(),
        last_seq: last.seq,
        status,
        parent,
        usage: UsageTotals::default(),
    }
}

/// A `model_response` from its wire form: `usage` and `cost_usd` as given, with keel's
/// estimate for what was not reported, and `purpose` (`None`: a conversation step).
fn response(usage: serde_json::Value, cost: Option<f64>, purpose: Option<&str>) -> EventKind {
    let mut wire = serde_json::json!({
        "kind": "model_response",
        "text": "ok",
        "tool_calls": [],
        "usage": usage,
        "finish_reason": "stop",
        "cost_usd": cost,
        "estimated_usage": {"input_tokens": 40, "output_tokens": 4},
    });
    if let Some(purpose) = purpose {
        wire["purpose"] = serde_json::json!(purpose);
    }
    must(serde_json::from_value(wire), "model_response from its wire form")
}

pub(super) async fn usage_totals_are_kept_in_the_listing<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (priced, unpriced) = (session(11), session(12));
    let reported = serde_json::json!({"input_tokens": 1000, "output_tokens": 50,
        "cached_input_tokens": 600, "reasoning_tokens": 7});
    let chain = vec![
        events.created(priced, "/w/priced"),
        events.event(priced, 2, response(reported.clone(), Some(0.125), None)),
        // A summary request is a model call like any other (DESIGN.md §4).
        events.event(priced, 3, response(reported.clone(), Some(0.25), Some("compaction"))),
    ];
    must(store.append(&chain).await, "append priced");
    // Totals continue across appends: an unreported figure counts keel's estimate.
    let later = vec![events.event(priced, 4, response(serde_json::json!({}), Some(0.5), None))];
    must(store.append(&later).await, "append priced later");
    // An unknown cost makes the total unknown.
    let unknown = vec![
        events.created(unpriced, "/w/unpriced"),
        events.event(unpriced, 2, response(reported.clone(), Some(1.0), None)),
        events.event(unpriced, 3, response(reported, None, None)),
    ];
    must(store.append(&unknown).await, "append unpriced");

    let fold = |events: &[RuntimeEvent]| {
        let mut usage = UsageTotals::default();
        for event in events {
            if let EventKind::ModelResponse { usage: reported, estimated_usage, cost_usd, .. } =
                &event.kind
            {
                usage.add(reported, estimated_usage.as_ref(), *cost_usd);
            }
        }
        usage
    };
    let all_priced: Vec<RuntimeEvent> = chain.iter().chain(&later).cloned().collect();
    let listed = must(store.sessions().await, "sessions");
    let usage_of = |id: SessionId| {
        listed.iter().find(|row| row.id == id).map(|row| row.usage).unwrap_or_default()
    };
    let expected = fold(&all_priced);
    assert_eq!(usage_of(priced), expected);
    assert_eq!(
        (expected.responses, expected.input_tokens, expected.output_tokens),
        (3, 2040, 104),
        "the fold itself"
    );
    assert_eq!((expected.responses_without_usage, expected.estimated_tokens), (1, 44));
    assert_eq!(expected.cost_usd, Some(0.875));
    let unknown_usage = usage_of(unpriced);
    assert_eq!(unknown_usage, fold(&unknown));
    assert_eq!((unknown_usage.responses, unknown_usage.cost_usd), (2, None));
    // A new handle reads the same totals back.
    drop(store);
    let reopened = factory.open(&ledger).await;
    assert_eq!(must(reopened.sessions().await, "sessions after reopen"), listed);
}

pub(super) async fn sessions_list_newest_first_with_status_and_title<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    // Created in this order; the ids sort differently on purpose.
    let (idle, running, child) = (session(9), session(2), session(5));
    let ended_ids = [session(7), session(1), session(8), session(3), session(4)];

    let idle_events = vec![events.created(idle, "/w/idle")];
    let running_events = vec![
        events.created(running, "/w/running"),
        events.event(running, 2, turn("  ")),
        events.event(running, 3, turn("Fix the\nparser  bug")),
        events.event(running, 4, turn("a later turn")),
        events.event(running, 5, run_started()),
    ];
    let child_events = vec![events.event(child, 1, created_kind("/w/child", Some(running)))];
    must(store.append(&idle_events).await, "append idle");
    must(store.append(&running_events).await, "append running");
    must(store.append(&child_events).await, "append child");

    let endings = ["completed", "failed", "suspended", "cancelled", "denied"];
    let mut ended_events = Vec::new();
    for (id, ending) in ended_ids.iter().zip(endings) {
        let chain = vec![
            events.created(*id, "/w/ended"),
            events.event(*id, 2, turn(ending)),
            events.event(*id, 3, run_started()),
            events.event(*id, 4, ended(ending)),
        ];
        must(store.append(&chain).await, "append ended");
        ended_events.push(chain);
    }
    // A late event on the oldest session updates it but does not move it up the list.
    let mut idle_events = idle_events;
    idle_events.push(events.event(idle, 2, turn("late title")));
    must(store.append(&idle_events[1..]).await, "append late");

    let statuses = [
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Suspended,
        SessionStatus::Cancelled,
        SessionStatus::Denied,
    ];
    let mut expected: Vec<SessionSummary> = ended_events
        .iter()
        .zip(endings.iter().zip(statuses))
        .map(|(chain, (ending, status))| summary(chain, "/w/ended", ending, status, None))
        .rev()
        .collect();
    expected.push(summary(&child_events, "/w/child", "", SessionStatus::Idle, Some(running)));
    expected.push(summary(
        &running_events,
        "/w/running",
        "Fix the parser bug",
        SessionStatus::Running,
        None,
    ));
    expected.push(summary(&idle_events, "/w/idle", "late title", SessionStatus::Idle, None));
    assert_eq!(must(store.sessions().await, "sessions"), expected);
    // One row by id is the listing's row; an unknown id has none.
    for row in &expected {
        assert_eq!(must(store.session(row.id).await, "one session").as_ref(), Some(row));
    }
    assert_eq!(must(store.session(session(99)).await, "an unknown session"), None);
}

pub(super) async fn title_is_collapsed_and_truncated<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let long = format!(" Refactor\tthe  store\n\nmodule {}", "x".repeat(200));
    let exactly_80 = "y".repeat(80);
    let accented = "é".repeat(100);
    let cut_at_space = format!("{} tail of the input", "z".repeat(78));
    let cases = [
        (long.as_str(), format!("Refactor the store module {}…", "x".repeat(53))),
        (exactly_80.as_str(), exactly_80.clone()),
        (accented.as_str(), format!("{}…", "é".repeat(79))),
        (cut_at_space.as_str(), format!("{}…", "z".repeat(78))),
    ];
    for (n, (input, _)) in (1..).zip(&cases) {
        let id = session(n);
        let chain = [events.created(id, "/w"), events.event(id, 2, turn(input))];
        must(store.append(&chain).await, "append");
    }
    let listed = must(store.sessions().await, "sessions");
    for (n, (_, title)) in (1..).zip(&cases) {
        let found = listed.iter().find(|row| row.id == session(n));
        assert_eq!(found.map(|row| row.title.as_str()), Some(title.as_str()), "session {n}");
    }
}

pub(super) async fn sealing_is_final<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let id = session(1);
    let chain = [
        events.created(id, "/w"),
        events.event(id, 2, run_started()),
        events.event(id, 3, EventKind::SessionSealed { reason: "done".to_owned() }),
    ];
    must(store.append(&chain).await, "append");
    let status = |rows: Vec<SessionSummary>| rows.first().map(|row| (row.status, row.last_seq));
    assert_eq!(
        status(must(store.sessions().await, "sessions")),
        Some((SessionStatus::Sealed, Seq(3)))
    );
    // The ledger records whatever comes after (it never loses a fact), but a sealed
    // session never looks runnable again.
    must(store.append(&[events.event(id, 4, run_started())]).await, "append after seal");
    assert_eq!(
        status(must(store.sessions().await, "sessions")),
        Some((SessionStatus::Sealed, Seq(4)))
    );
}

pub(super) async fn prefix_resolution<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let id = |text: &str| SessionId(Uuid::parse_str(text).unwrap_or_default());
    let a = id("0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b");
    let b = id("0190a1c3-0000-7000-8000-000000000000");
    let c = id("ffffffff-ffff-7fff-bfff-ffffffffffff");
    for session_id in [a, b, c] {
        must(store.append(&[events.created(session_id, "/w")]).await, "append");
    }

    let found = [
        ("0190a1b", a),
        ("0190A1B2-C3D4", a),
        ("0190a1b2c3d4", a),
        ("0190-a1-b", a),
        ("0190a1b2-c3d4-7e5f-8a6b-7c8d9e0f1a2b", a),
        ("0190A1B2C3D47E5F8A6B7C8D9E0F1A2B", a),
        (" 0190a1c ", b),
        ("f", c),
    ];
    for (prefix, expected) in found {
        match store.resolve_session(prefix).await {
            Ok(resolved) => assert_eq!(resolved, expected, "prefix {prefix:?}"),
            Err(error) => panic!("prefix {prefix:?}: {error:?}"),
        }
    }
    for prefix in ["0190a1", "01", "0-1-9-0"] {
        match store.resolve_session(prefix).await {
            Err(ResolveError::Ambiguous { prefix: given, count: 2 }) => assert_eq!(given, prefix),
            other => panic!("prefix {prefix:?}: expected Ambiguous with 2, got {other:?}"),
        }
    }
    let too_long = "0190a1b2c3d47e5f8a6b7c8d9e0f1a2b0";
    for prefix in ["", "-", "e", "zz", "0190a1b 2", "0190a1b%", "0190a1b_", too_long] {
        match store.resolve_session(prefix).await {
            Err(ResolveError::NotFound { prefix: given }) => assert_eq!(given, prefix),
            other => panic!("prefix {prefix:?}: expected NotFound, got {other:?}"),
        }
    }
}
