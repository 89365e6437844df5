//! Reads side by side: plain reads of one response run concurrently, writes alone and in
//! order, results recorded in call order, every gate per call.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    Access, Effects, EventKind, Outcome, PermissionRules, Rule, Tool, ToolContext, ToolOutput,
    ToolSpec,
};
use keel_kernel::TurnOutcome;

use super::support::Harness;

/// What the timed tools did: (tool, path, "start"/"end", ms since the test began).
type Timeline = Arc<Mutex<Vec<(String, String, &'static str, u128)>>>;

/// A tool that sleeps `ms` and notes when it started and ended.
#[derive(Debug)]
struct Timed {
    spec: ToolSpec,
    timeline: Timeline,
    origin: tokio::time::Instant,
}

#[async_trait]
impl Tool for Timed {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let path = arguments["path"].as_str().unwrap_or_default().to_owned();
        let ms = arguments["ms"].as_u64().unwrap_or(0);
        let note = |what| {
            self.timeline.lock().unwrap().push((
                self.spec.name.clone(),
                path.clone(),
                what,
                self.origin.elapsed().as_millis(),
            ));
        };
        note("start");
        tokio::time::sleep(Duration::from_millis(ms)).await;
        note("end");
        ToolOutput::ok(format!("{} {path}", self.spec.name))
    }
}

fn timed(name: &str, access: Access, timeline: &Timeline) -> Arc<dyn Tool> {
    Arc::new(Timed {
        spec: ToolSpec {
            name: name.into(),
            description: format!("timed {name}"),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"path": {"type": "string"}, "ms": {"type": "integer"}},
                "additionalProperties": false
            }),
            access,
            effects: match access {
                Access::Read => Effects::LOCAL_READ,
                Access::Write => Effects::LOCAL_WRITE,
            },
            intrinsic: false,
            first_party: true,
        },
        timeline: timeline.clone(),
        origin: tokio::time::Instant::now(),
    })
}

fn harness(timeline: &Timeline) -> Harness {
    let mut harness = Harness::new();
    harness.extra_tools.push(timed("peek", Access::Read, timeline));
    harness.extra_tools.push(timed("poke", Access::Write, timeline));
    harness
}

fn call(tool: &str, path: &str, ms: u64) -> String {
    format!(r#"{{"name":"{tool}","arguments":{{"path":"{path}","ms":{ms}}}}}"#)
}

fn script(calls: &[String], outcomes: &[&str]) -> String {
    let outcomes: Vec<String> = outcomes.iter().map(|o| format!("\"{o}\"")).collect();
    format!(
        r#"{{"steps":[{{"tool_calls":[{}]}},{{"text":"done","expect":{{"last_outcomes":[{}]}}}}]}}"#,
        calls.join(","),
        outcomes.join(",")
    )
}

/// The recorded results in ledger order: (call id, outcome, content).
fn results(events: &[keel_contracts::RuntimeEvent]) -> Vec<(String, Outcome, String)> {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { call_id, outcome, content, .. } => {
                Some((call_id.to_string(), *outcome, content.clone()))
            }
            _ => None,
        })
        .collect()
}

fn at(timeline: &Timeline, path: &str, what: &str) -> u128 {
    timeline.lock().unwrap().iter().find(|(_, p, w, _)| p == path && *w == what).unwrap().3
}

#[tokio::test(start_paused = true)]
async fn four_reads_run_side_by_side_and_results_are_recorded_in_call_order() {
    let timeline = Timeline::default();
    let harness = harness(&timeline);
    // The slowest first: they finish in the opposite order to the calls.
    let calls = [
        call("peek", "a", 400),
        call("peek", "b", 300),
        call("peek", "c", 200),
        call("peek", "d", 100),
    ];
    let started = tokio::time::Instant::now();
    let (report, _) = harness.run(&script(&calls, &["ok", "ok", "ok", "ok"]), "read").await;
    let elapsed = started.elapsed();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    // One read's time (the longest), not the sum (1000 ms).
    assert!(
        elapsed >= Duration::from_millis(400) && elapsed < Duration::from_millis(600),
        "{elapsed:?}"
    );
    for path in ["a", "b", "c", "d"] {
        assert_eq!(at(&timeline, path, "start"), 0, "{path} started late");
    }
    let events = harness.events(report.session_id).await;
    let contents: Vec<String> = results(&events).into_iter().map(|r| r.2).collect();
    assert_eq!(contents, vec!["peek a", "peek b", "peek c", "peek d"]);
    // Every call's prepare is durable before any result, each call gated once.
    let kinds: Vec<&str> = events
        .iter()
        .map(|e| e.kind.name())
        .filter(|k| matches!(*k, "gate_decision" | "tool_attempt_prepared" | "tool_result"))
        .collect();
    let mut expected = ["gate_decision", "tool_attempt_prepared"].repeat(4);
    expected.extend(["tool_result"; 4]);
    assert_eq!(kinds, expected);
}

#[tokio::test(start_paused = true)]
async fn a_write_between_reads_waits_for_the_reads_before_it_and_holds_the_reads_after() {
    let timeline = Timeline::default();
    let harness = harness(&timeline);
    let calls = [
        call("peek", "r1", 200),
        call("peek", "r2", 100),
        call("poke", "w", 50),
        call("peek", "r3", 100),
        call("peek", "r4", 100),
    ];
    let (report, _) = harness.run(&script(&calls, &["ok", "ok", "ok", "ok", "ok"]), "mixed").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    // r1 and r2 overlap; the write starts after both ended; r3 and r4 after it ended.
    assert_eq!(at(&timeline, "r1", "start"), at(&timeline, "r2", "start"));
    assert!(at(&timeline, "w", "start") >= at(&timeline, "r1", "end"));
    assert!(at(&timeline, "w", "start") >= at(&timeline, "r2", "end"));
    assert!(at(&timeline, "r3", "start") >= at(&timeline, "w", "end"));
    assert!(at(&timeline, "r4", "start") >= at(&timeline, "w", "end"));
    assert_eq!(at(&timeline, "r3", "start"), at(&timeline, "r4", "start"));
    let events = harness.events(report.session_id).await;
    let contents: Vec<String> = results(&events).into_iter().map(|r| r.2).collect();
    assert_eq!(contents, vec!["peek r1", "peek r2", "poke w", "peek r3", "peek r4"]);
}

#[tokio::test(start_paused = true)]
async fn a_denied_read_among_parallel_reads_is_refused_alone() {
    let timeline = Timeline::default();
    let mut harness = harness(&timeline);
    harness.rules =
        PermissionRules { allow: Vec::new(), deny: vec![Rule::parse("path(secret)").unwrap()] };
    let calls = [call("peek", "a", 100), call("peek", "secret", 100), call("peek", "c", 100)];
    let (report, _) = harness.run(&script(&calls, &["ok", "refused", "ok"]), "read").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    // Recorded in call order too: the refusal, answered at its gate, is held back until
    // the read before it has its result.
    let events = harness.events(report.session_id).await;
    let results = results(&events);
    assert_eq!(results.len(), 3);
    assert_eq!((results[0].1, results[0].2.as_str()), (Outcome::Ok, "peek a"));
    assert_eq!(results[1].1, Outcome::Refused);
    assert_eq!((results[2].1, results[2].2.as_str()), (Outcome::Ok, "peek c"));
    // The denied read never ran; its neighbours ran side by side.
    assert!(!timeline.lock().unwrap().iter().any(|(_, path, _, _)| path == "secret"));
    assert_eq!(at(&timeline, "a", "start"), at(&timeline, "c", "start"));
    // It was refused at its gate, with no attempt prepared.
    let refused_attempts = events
        .iter()
        .filter(|e| matches!(&e.kind, EventKind::ToolAttemptPrepared { call_id, .. } if call_id.to_string() == results[1].0))
        .count();
    assert_eq!(refused_attempts, 0);
}

#[tokio::test]
async fn a_crash_while_reads_run_side_by_side_leaves_them_indeterminate_never_replayed() {
    let harness = Harness::new();
    // `read` answers at once, `nap` sleeps 60 s; the write after them never starts.
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"a"}},{"name":"nap","arguments":{"path":"b"}},
                       {"name":"nap","arguments":{"path":"c"}},{"name":"write","arguments":{"path":"d"}}]},
        {"text":"after"}
    ]}"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let never = keel_kernel::Cancellation::new();
    let config = harness.run_config();
    let driving = kernel.run_turn(session, "go", &config, &never);
    // The process "dies" while the naps run: the driving future is dropped.
    assert!(tokio::time::timeout(Duration::from_secs(1), driving).await.is_err());
    let before = harness.events(session).await;
    // Each read's prepare was durable before any read ran.
    let prepared =
        before.iter().filter(|e| matches!(e.kind, EventKind::ToolAttemptPrepared { .. })).count();
    assert_eq!(prepared, 3);
    assert!(!before.iter().any(|e| matches!(e.kind, EventKind::ToolResult { .. })));

    let report = kernel
        .run_turn(
            session,
            "resume please",
            &harness.run_config(),
            &keel_kernel::Cancellation::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "after".into() });
    let after = harness.events(session).await;
    assert_eq!(&after[..before.len()], &before[..]);
    let outcomes: Vec<Outcome> = after
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolResult { outcome, .. } => Some(*outcome),
            _ => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        vec![
            Outcome::Indeterminate,
            Outcome::Indeterminate,
            Outcome::Indeterminate,
            Outcome::Cancelled
        ]
    );
    let mut invocations = harness.invocations();
    invocations.sort();
    assert_eq!(
        invocations,
        vec![r#"nap {"path":"b"}"#, r#"nap {"path":"c"}"#, r#"read {"path":"a"}"#],
        "nothing was replayed, the write never ran"
    );
}
