//! Group commit (issue 13, docs/decisions.md "Group commit in the kernel"): a tool step
//! costs at most two durable commits (the model request with the previous step's results,
//! then the model's response, gate and consent with `tool_attempt_prepared`, before the
//! effect), counted through a [`CountingStore`]; what must be durable before something
//! happens outside the loop still is.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use expect_test::expect;
use keel_contracts::{
    Access, PermissionAnswer, Seq, Store, Tool, ToolContext, ToolOutput, ToolSpec,
};
use keel_kernel::{Cancellation, PermissionHook, PermissionRequest, TurnOutcome};
use keel_testkit::{CountingStore, ScriptedModel};

use super::support::{Harness, spec};

/// A read step, a write step (consent), a step with two calls, then the answer.
const SCRIPT: &str = r#"{"steps":[
    {"tool_calls":[{"name":"read","arguments":{"path":"a"}}]},
    {"tool_calls":[{"name":"witness","arguments":{"path":"w"}}]},
    {"tool_calls":[{"name":"read","arguments":{"path":"b"}},{"name":"write","arguments":{"path":"c"}}]},
    {"text":"done"}
]}"#;

/// A write tool that records, when it runs, the kinds of the last two events the store
/// holds for its session: what was durable at the moment of the effect.
#[derive(Debug)]
struct Witness {
    spec: ToolSpec,
    store: Arc<dyn Store>,
    seen: Arc<Mutex<Vec<Vec<&'static str>>>>,
}

#[async_trait]
impl Tool for Witness {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    async fn invoke(&self, context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        let events = self.store.read(context.session_id, Seq(0)).await.unwrap();
        let tail = events.iter().rev().take(2).rev().map(|event| event.kind.name()).collect();
        self.seen.lock().unwrap().push(tail);
        ToolOutput::ok("witnessed")
    }
}

/// A consent hook that may wait on a person (the default `answers_at_once`), and records
/// the last durable event kind at the moment it is asked.
#[derive(Debug)]
struct Prompt {
    store: Arc<dyn Store>,
    seen: Arc<Mutex<Vec<&'static str>>>,
}

#[async_trait]
impl PermissionHook for Prompt {
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let events = self.store.read(request.session_id, Seq(0)).await.unwrap();
        self.seen.lock().unwrap().push(events.last().unwrap().kind.name());
        (PermissionAnswer::AllowOnce, "user".to_owned())
    }
}

struct Counted {
    harness: Harness,
    store: Arc<CountingStore>,
    witnessed: Arc<Mutex<Vec<Vec<&'static str>>>>,
}

fn counted() -> Counted {
    let mut harness = Harness::new();
    let store = Arc::new(CountingStore::new(harness.store.clone()));
    harness.store = store.clone();
    let witnessed = Arc::new(Mutex::new(Vec::new()));
    harness.extra_tools.push(Arc::new(Witness {
        spec: spec("witness", Access::Write, false),
        store: store.clone(),
        seen: witnessed.clone(),
    }));
    Counted { harness, store, witnessed }
}

/// The commits of each conversation step: from the commit holding its `model_requested`
/// up to the next step's (the last step's up to the end).
fn commits_per_step(commits: &[Vec<&'static str>]) -> Vec<usize> {
    let starts: Vec<usize> = commits
        .iter()
        .enumerate()
        .filter(|(_, kinds)| kinds.contains(&"model_requested"))
        .map(|(index, _)| index)
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, start)| starts.get(n + 1).unwrap_or(&commits.len()) - start)
        .collect()
}

fn render(commits: &[Vec<&'static str>]) -> String {
    commits
        .iter()
        .enumerate()
        .map(|(n, kinds)| format!("{} {}\n", n + 1, kinds.join(" ")))
        .collect()
}

#[tokio::test]
async fn a_tool_step_costs_at_most_two_commits_and_the_prepare_is_durable_before_the_effect() {
    let counted = counted();
    let kernel = counted.harness.kernel(SCRIPT);
    let session = counted.harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "go", &counted.harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });

    let commits = counted.store.commits();
    expect![[r#"
        1 session_created
        2 turn_started run_started run_composition model_requested
        3 model_response gate_decision tool_attempt_prepared
        4 tool_result model_requested
        5 model_response gate_decision permission_requested permission_settled tool_attempt_prepared
        6 tool_result model_requested
        7 model_response gate_decision tool_attempt_prepared
        8 tool_result gate_decision permission_requested permission_settled tool_attempt_prepared
        9 tool_result model_requested
        10 model_response run_completed
    "#]]
    .assert_eq(&render(&commits));
    // Steps 1 and 2 (one call each): exactly two commits; step 3 (two calls): one more
    // for the second prepare; the answer: its request, then its response with the terminal
    // event (no outbox delivers, so nothing needs committing before a flush).
    assert_eq!(commits_per_step(&commits), vec![2, 2, 3, 2]);
    // Every event reached the store, once, in seq order.
    let stored = counted.store.inner().read(session, Seq(0)).await.unwrap();
    assert_eq!(stored.len(), commits.iter().map(Vec::len).sum::<usize>());
    assert!(stored.windows(2).all(|pair| pair[1].seq == pair[0].seq.next()));
    // When the write ran, its prepare (and the consent before it) was already durable.
    assert_eq!(
        *counted.witnessed.lock().unwrap(),
        vec![vec!["permission_settled", "tool_attempt_prepared"]]
    );
    assert_eq!(
        counted.harness.invocations(),
        vec![r#"read {"path":"a"}"#, r#"read {"path":"b"}"#, r#"write {"path":"c"}"#]
    );
}

#[tokio::test]
async fn a_consent_someone_may_take_time_to_give_is_durable_before_it_is_asked() {
    let counted = counted();
    let asked = Arc::new(Mutex::new(Vec::new()));
    let prompt = Prompt { store: counted.store.clone(), seen: asked.clone() };
    let model = ScriptedModel::new(serde_json::from_str(SCRIPT).unwrap(), "test-script");
    let kernel = counted.harness.kernel_with_permissions(Arc::new(model), Arc::new(prompt));
    let session = counted.harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "go", &counted.harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    // Each question was asked with its request already in the store.
    assert_eq!(*asked.lock().unwrap(), vec!["permission_requested", "permission_requested"]);
    let commits = counted.store.commits();
    expect![[r#"
        1 session_created
        2 turn_started run_started run_composition model_requested
        3 model_response gate_decision tool_attempt_prepared
        4 tool_result model_requested
        5 model_response gate_decision permission_requested
        6 permission_settled tool_attempt_prepared
        7 tool_result model_requested
        8 model_response gate_decision tool_attempt_prepared
        9 tool_result gate_decision permission_requested
        10 permission_settled tool_attempt_prepared
        11 tool_result model_requested
        12 model_response run_completed
    "#]]
    .assert_eq(&render(&commits));
    // A step that asks a person costs one commit more, before the question.
    assert_eq!(commits_per_step(&commits), vec![2, 3, 4, 2]);
}

#[tokio::test]
async fn a_lost_commit_drops_the_staged_events_and_resume_asks_the_model_again() {
    // The response, the gate and the prepare share one commit: when it fails, none of them
    // is kept, the write never ran, and the resumed run asks the model again.
    let counted = counted();
    let faulty = Arc::new(keel_testkit::FaultyStore::new(counted.store.clone()));
    let mut harness = counted.harness;
    harness.store = faulty.clone();
    faulty.fail_appends_of_kind(
        "tool_attempt_prepared",
        keel_testkit::Fault::Io("disk I/O error".into()),
    );
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
        {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
        {"text":"done"}
    ]}"#;
    let kernel = harness.kernel(script);
    let session = harness.session(&kernel).await;
    let failed = kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await;
    assert!(failed.is_err(), "{failed:?}");
    assert!(harness.invocations().is_empty(), "{:?}", harness.invocations());
    let kinds: Vec<_> =
        harness.events(session).await.iter().map(|event| event.kind.name()).collect();
    assert_eq!(
        kinds,
        ["session_created", "turn_started", "run_started", "run_composition", "model_requested"]
    );
    faulty.heal();
    let report = kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    assert_eq!(harness.invocations(), vec![r#"write {"path":"a"}"#, r#"write {"path":"a"}"#]);
}
