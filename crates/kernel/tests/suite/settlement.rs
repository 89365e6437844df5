//! The settlement path's guards at their edges (issue #22): each test here holds a check
//! of the kernel's settlement (`crates/kernel/src/settlement.rs` and `settlement/`) that a
//! mutation run found no other transcript holding — a negotiation per step, a grant's
//! expiry to the instant and its tool, and a cancelled run's tool really stopping.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::{
    Access, Clock, Decision, Effects, EventKind, PermissionAnswer, RuntimeEvent, Tool, ToolContext,
    ToolOutput, ToolSpec,
};
use keel_kernel::{Cancellation, TurnOutcome};

use super::support::{Behaviour, FakeTool, Harness, spec};

/// The gate decisions of a ledger, in order: (call, decision, reason).
fn gates(events: &[RuntimeEvent]) -> Vec<(String, Decision, String)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::GateDecision { call_id, decision, reason, .. } => {
                Some((call_id.to_string(), *decision, reason.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A second write tool beside the harness's `write`, answering `written too`.
fn second_writer(harness: &Harness) -> Arc<dyn Tool> {
    Arc::new(FakeTool {
        spec: spec("write2", Access::Write, false),
        log: harness.log.clone(),
        behaviour: Behaviour::Reply("written too".into()),
    })
}

#[tokio::test]
async fn every_step_may_negotiate_its_own_boundary() {
    let harness = Harness::new();
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"request_boundary","arguments":{"network":true,"justification":"fetch deps"}}]},
        {"tool_calls":[{"name":"request_boundary","arguments":{"paths":[{"path":"/srv/data","access":"read"}],"justification":"read the data"}}]},
        {"text":"done","expect":{"last_outcomes":["ok"]}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{ledger}");
    assert!(ledger.contains("boundary_revised 1 read=[] write=[] network=true"), "{ledger}");
    assert!(
        ledger.contains(r#"boundary_revised 2 read=["/srv/data"] write=[] network=true"#),
        "the next step's request is negotiated, not refused as a second one: {ledger}"
    );
}

/// A clock that stands still where the test puts it.
#[derive(Debug)]
struct StoppedClock(Mutex<DateTime<Utc>>);

impl StoppedClock {
    fn set(&self, at: DateTime<Utc>) {
        *self.0.lock().unwrap() = at;
    }
}

impl Clock for StoppedClock {
    fn now(&self) -> DateTime<Utc> {
        *self.0.lock().unwrap()
    }
}

#[tokio::test]
async fn an_execution_grant_holds_until_the_instant_it_expires_and_not_at_it() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::AllowExact;
    let start = harness.clock.peek();
    let clock = Arc::new(StoppedClock(Mutex::new(start)));
    let write_a = r#"{"tool_calls":[{"name":"write","arguments":{"path":"a"}}]}"#;
    let script = format!(
        r#"{{"steps":[{write_a},{{"text":"1"}},{write_a},{{"text":"2"}},{write_a},{{"text":"3"}}]}}"#
    );
    let kernel = harness.kernel_with_clock(&script, clock.clone());
    let session = harness.session(&kernel).await;
    let config = harness.run_config();
    kernel.run_turn(session, "first", &config, &Cancellation::new()).await.unwrap();
    let until = harness
        .events(session)
        .await
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::PermissionSettled { expires_at, .. } => *expires_at,
            _ => None,
        })
        .expect("the grant carries its expiry");
    assert_eq!(until, start + chrono::TimeDelta::hours(24));

    clock.set(until - chrono::TimeDelta::milliseconds(1));
    kernel.run_turn(session, "just before", &config, &Cancellation::new()).await.unwrap();
    clock.set(until);
    kernel.run_turn(session, "at expiry", &config, &Cancellation::new()).await.unwrap();

    let reasons: Vec<String> =
        gates(&harness.events(session).await).into_iter().map(|(_, _, reason)| reason).collect();
    assert_eq!(reasons.len(), 3, "{reasons:?}");
    assert_eq!(reasons[0], "consent required: write access");
    assert!(reasons[1].starts_with("grant: this exact call is allowed until"), "{reasons:?}");
    assert_eq!(reasons[2], "consent required: write access", "an expired grant is never used");
    assert_eq!(harness.invocations().len(), 3);
}

#[tokio::test]
async fn a_grant_covers_only_the_tool_it_was_given_for() {
    for answer in [PermissionAnswer::AllowExact, PermissionAnswer::AllowSession] {
        let mut harness = Harness::new();
        harness.approval = answer;
        harness.extra_tools.push(second_writer(&harness));
        // The same arguments for another write tool, then again for the first one.
        let script = r#"{"steps":[
            {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
            {"tool_calls":[{"name":"write2","arguments":{"path":"a"}}]},
            {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
            {"text":"done"}
        ]}"#;
        let (_, ledger) = harness.run(script, "t").await;
        assert!(ledger.contains("permission_requested call_1_1 write"), "{ledger}");
        assert!(
            ledger.contains("permission_requested call_2_1 write"),
            "{answer:?} for write is no grant for write2: {ledger}"
        );
        assert!(ledger.contains("gate_decision call_3_1 Allow grant: "), "{answer:?}: {ledger}");
        assert!(!ledger.contains("permission_requested call_3_1"), "{ledger}");
        assert_eq!(harness.invocations().len(), 3);
    }
}

/// `sentinel`: a read that sleeps for a minute; it notes when its future is dropped and
/// when it finished sleeping.
#[derive(Debug)]
struct Sentinel {
    spec: ToolSpec,
    dropped: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
}

/// Sets its flag when dropped.
struct OnDrop(Arc<AtomicBool>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

#[async_trait]
impl Tool for Sentinel {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        let _guard = OnDrop(self.dropped.clone());
        tokio::time::sleep(Duration::from_secs(60)).await;
        self.finished.store(true, Ordering::SeqCst);
        ToolOutput::ok("slept a minute")
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_run_stops_its_running_tool() {
    let mut harness = Harness::new();
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    harness.extra_tools.push(Arc::new(Sentinel {
        spec: ToolSpec {
            name: "sentinel".into(),
            description: "sleeps a minute".into(),
            parameters: serde_json::json!({"type": "object"}),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: false,
            first_party: true,
        },
        dropped: dropped.clone(),
        finished: finished.clone(),
    }));
    let kernel = harness.kernel(
        r#"{"steps":[{"tool_calls":[{"name":"sentinel","arguments":{}}]},{"text":"unused"}]}"#,
    );
    let session = harness.session(&kernel).await;
    let cancel = Cancellation::new();
    let trigger = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        trigger.cancel();
    });
    let report = kernel.run_turn(session, "go", &harness.run_config(), &cancel).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Cancelled { .. }), "{report:?}");
    // Let the runtime run whatever is still scheduled, for less than the tool's minute.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(dropped.load(Ordering::SeqCst), "the tool's task is aborted with its run");
    assert!(!finished.load(Ordering::SeqCst));
}

/// `bash`: a fake command tool (it only logs the line it was given).
fn bash(harness: &Harness) -> Arc<dyn Tool> {
    Arc::new(FakeTool {
        spec: ToolSpec {
            name: "bash".into(),
            description: "fake bash".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
                "additionalProperties": false
            }),
            access: Access::Write,
            effects: Effects::LOCAL_WRITE,
            intrinsic: false,
            first_party: true,
        },
        log: harness.log.clone(),
        behaviour: Behaviour::Reply("ran".into()),
    })
}

fn rules(allow: &[&str], deny: &[&str]) -> keel_contracts::PermissionRules {
    let parse = |rules: &[&str]| -> Vec<keel_contracts::Rule> {
        rules.iter().map(|rule| keel_contracts::Rule::parse(rule).unwrap()).collect()
    };
    keel_contracts::PermissionRules { allow: parse(allow), deny: parse(deny) }
}

/// The kernel parses a `bash` line into its simple commands before the rules see it: a
/// denied command after `&&` is refused, a lone allowed one runs by its rule, and a line
/// the parser cannot resolve is asked, saying why.
#[tokio::test]
async fn redteam_rules_bash_lines_are_decided_per_parsed_simple_command() {
    let mut harness = Harness::new();
    harness.extra_tools.push(bash(&harness));
    harness.rules = rules(&["bash(git status*)", "bash(eval *)"], &["bash(rm *)"]);
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"bash","arguments":{"command":"git status && rm -rf src"}}]},
        {"tool_calls":[{"name":"bash","arguments":{"command":"git status --short"}}]},
        {"tool_calls":[{"name":"bash","arguments":{"command":"eval \"$CMD\""}}]},
        {"text":"done","expect":{"last_outcomes":["ok"]}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{ledger}");
    assert!(ledger.contains("permission_settled call_1_1 Deny by rule:bash(rm *)"), "{ledger}");
    assert!(
        ledger.contains("permission_settled call_2_1 AllowOnce by rule:bash(git status*)"),
        "{ledger}"
    );
    assert!(
        ledger.contains(
            "gate_decision call_3_1 Ask consent required: write access; rules cannot allow \
             this command line ("
        ),
        "{ledger}"
    );
    assert!(ledger.contains("permission_settled call_3_1 AllowOnce by approval=auto"), "{ledger}");
    assert_eq!(
        harness.invocations(),
        vec![r#"bash {"command":"git status --short"}"#, r#"bash {"command":"eval \"$CMD\""}"#]
    );
}

/// A plain read is never asked, but a deny rule still refuses it — without a request.
#[tokio::test]
async fn a_deny_rule_refuses_a_plain_read_without_asking() {
    let mut harness = Harness::new();
    harness.rules = rules(&[], &["read(secret*)"]);
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"read","arguments":{"path":"secret.txt"}},{"name":"read","arguments":{"path":"a"}}]},
        {"text":"done","expect":{"last_outcomes":["refused","ok"]}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{ledger}");
    assert!(ledger.contains("gate_decision call_1_1 Refuse rule:read(secret*)"), "{ledger}");
    assert!(ledger.contains("gate_decision call_1_2 Allow scope.reads"), "{ledger}");
    assert!(!ledger.contains("permission_requested"), "{ledger}");
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

/// A fresh, canonical folder under the system's temporary folder.
fn workspace(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("keel-settlement-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.canonicalize().unwrap()
}

/// Rules see where a path really leads: a link into a denied folder is refused although
/// its spelling matches no deny rule (and an allow rule for the link's spelling), while an
/// ordinary path is allowed by its rule.
#[tokio::test]
async fn redteam_rules_a_deny_rule_holds_on_the_resolved_path_alone() {
    let root = workspace("resolved");
    std::fs::create_dir(root.join("secrets")).unwrap();
    std::os::unix::fs::symlink("secrets", root.join("link")).unwrap();
    let mut harness = Harness::new();
    harness.workspace = root.clone();
    harness.rules = rules(&["write(link/**)", "write(src/**)"], &["write(secrets/**)"]);
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"write","arguments":{"path":"link/key"}}]},
        {"tool_calls":[{"name":"write","arguments":{"path":"src/a"}}]},
        {"text":"done"}
    ]}"#;
    let (_, ledger) = harness.run(script, "t").await;
    std::fs::remove_dir_all(&root).unwrap();
    assert!(
        ledger.contains("permission_settled call_1_1 Deny by rule:write(secrets/**)"),
        "{ledger}"
    );
    assert!(
        ledger.contains("permission_settled call_2_1 AllowOnce by rule:write(src/**)"),
        "{ledger}"
    );
    assert_eq!(harness.invocations(), vec![r#"write {"path":"src/a"}"#]);
}

/// Malformed arguments count toward the repeated-failure guard like any failure: the
/// fourth identical malformed call is blocked.
#[tokio::test]
async fn identical_malformed_calls_are_blocked_after_three() {
    use keel_contracts::{FinishReason, Outcome, ToolCall, ToolCallId};

    use super::turn_loop::{Fixed, response};

    let harness = Harness::new();
    let malformed = |id: &str| ToolCall {
        call_id: ToolCallId(id.into()),
        name: "write".into(),
        arguments: serde_json::Value::String("{\"path\":\"a\"}{".into()),
        arguments_error: Some("trailing characters at line 1 column 13".into()),
    };
    let mut responses: Vec<_> = ["c1", "c2", "c3", "c4"]
        .into_iter()
        .map(|id| Ok(response("", vec![malformed(id)], FinishReason::ToolCalls)))
        .collect();
    responses.push(Ok(response("gave up", vec![], FinishReason::Stop)));
    let kernel = harness.kernel_with(Arc::new(Fixed(Mutex::new(responses))));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "gave up".into() });
    let results: Vec<(Outcome, String)> = harness
        .events(session)
        .await
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ToolResult { outcome, content, .. } => Some((*outcome, content.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(|(outcome, _)| *outcome == Outcome::Error), "{results:?}");
    assert!(results[..3].iter().all(|(_, text)| text.contains("not valid JSON")), "{results:?}");
    assert!(results[3].1.contains("blocked: this exact call already failed 3 times"));
    assert!(harness.invocations().is_empty());
}
