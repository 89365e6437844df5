//! A tool's questions to the user during a call (MCP elicitation), through the kernel:
//! recorded before and after, asked through the permission hook, checked against the form,
//! never shown to the model, cancelled when the process that asked dies.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{
    Access, ElicitationAction, ElicitationAnswer, ElicitationRequest, EventKind, Tool, ToolContext,
    ToolOutput, ToolSpec,
};
use keel_kernel::{Cancellation, ElicitationQuestion, PermissionHook, PermissionRequest};

use super::support::{Harness, spec};

/// A read tool that asks its `schema` and answers with what came back.
#[derive(Debug)]
struct Asker(ToolSpec);

#[async_trait]
impl Tool for Asker {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let Some(elicitor) = &context.elicitor else {
            return ToolOutput::error("no elicitor");
        };
        let answer = elicitor
            .elicit(ElicitationRequest {
                server: "srv".to_owned(),
                message: "Who are you?".to_owned(),
                schema: arguments["schema"].clone(),
            })
            .await;
        ToolOutput::ok(format!(
            "action={} content={}",
            answer.action.as_str(),
            answer.content.map(|c| c.to_string()).unwrap_or_default()
        ))
    }
}

/// Answers every question with its answer as it is (content and all, whatever the form),
/// or never.
#[derive(Debug)]
struct Answers(Option<ElicitationAnswer>);

impl Answers {
    /// Accepts every question with `content`, as the user.
    fn accepting(content: serde_json::Value) -> Answers {
        Answers(Some(ElicitationAnswer::accept(content, "user")))
    }
}

#[async_trait]
impl PermissionHook for Answers {
    async fn decide(
        &self,
        _request: &PermissionRequest<'_>,
    ) -> (keel_contracts::PermissionAnswer, String) {
        (keel_contracts::PermissionAnswer::AllowOnce, "test".to_owned())
    }

    async fn elicit(&self, _question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        match &self.0 {
            Some(answer) => answer.clone(),
            None => std::future::pending().await,
        }
    }
}

fn form() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {"name": {"type": "string"}},
        "required": ["name"]})
}

fn harness() -> Harness {
    let mut harness = Harness::new();
    let mut asker = spec("ask", Access::Read, false);
    asker.parameters = serde_json::json!({"type": "object"});
    harness.extra_tools.push(Arc::new(Asker(asker)));
    harness
}

fn script(expect: &str) -> String {
    serde_json::json!({"steps": [
        {"tool_calls": [{"name": "ask", "arguments": {"schema": form()}}]},
        {"text": "done", "expect": {"contains": [expect]}}
    ]})
    .to_string()
}

fn model(script: &str) -> Arc<keel_testkit::ScriptedModel> {
    Arc::new(keel_testkit::ScriptedModel::new(serde_json::from_str(script).unwrap(), "s"))
}

fn answered(events: &[keel_contracts::RuntimeEvent]) -> Vec<(ElicitationAction, String)> {
    events
        .iter()
        .filter_map(|event| match &event.kind {
            EventKind::ElicitationAnswered { action, by, .. } => Some((*action, by.clone())),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_question_is_recorded_asked_and_its_answer_checked_and_kept_from_the_model() {
    let harness = harness();
    let kernel = harness.kernel_with_permissions(
        model(&script(r#"action=accept content={\"name\":\"Ann\"}"#)),
        Arc::new(Answers::accepting(serde_json::json!({"name": "Ann"}))),
    );
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    // The script's `expect` saw the answer's content in the tool's result.
    assert_eq!(report.outcome, keel_kernel::TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.kind.name()).collect();
    let asked = kinds.iter().position(|k| *k == "elicitation_requested").unwrap();
    let answer = kinds.iter().position(|k| *k == "elicitation_answered").unwrap();
    let result = kinds.iter().position(|k| *k == "tool_result").unwrap();
    assert!(asked < answer && answer < result, "{kinds:?}");
    assert_eq!(answered(&events), vec![(ElicitationAction::Accept, "user".to_owned())]);
    // The question id goes into a URL path as it is: no `#`.
    let question = events.iter().find_map(|event| match &event.kind {
        EventKind::ElicitationRequested { call_id, question, .. } => {
            Some((call_id.0.clone(), question.clone()))
        }
        _ => None,
    });
    let (call, question) = question.unwrap();
    assert_eq!(question, format!("{call}.q1"));
}

#[test]
fn question_ids_are_url_path_safe_whatever_the_provider_call_id() {
    use keel_contracts::ToolCallId;
    let id = |call: &str, n| keel_kernel::question_id(&ToolCallId(call.to_owned()), n);
    assert_eq!(id("call_1_1", 1), "call_1_1.q1");
    assert_eq!(id("toolu_01-AbZ", 12), "toolu_01-AbZ.q12");
    // A program's nested call, and a provider id with what a URL path cannot carry.
    assert_eq!(id("call_1_4/1", 2), "call_1_4~2F1.q2");
    assert_eq!(id("a#b?c%d e.f~g", 1), "a~23b~3Fc~25d~20e~2Ef~7Eg.q1");
    assert_eq!(id("é", 1), "~C3~A9.q1");
    for call in ["x.q1", "x~2Eq1", "x/1", "x~2F1", "", "~"] {
        let question = id(call, 1);
        assert!(
            question.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.~".contains(&b)),
            "{question}"
        );
    }
    // One to one: calls that differ never share a question id.
    assert_ne!(id("x.q1", 1), id("x", 1));
    assert_ne!(id("x/1", 1), id("x~2F1", 1));
    assert_ne!(id("x.q1", 1), id("x~2Eq1", 1));
}

#[tokio::test]
async fn redteam_mcp_elicit_an_answer_that_fails_the_form_is_refused_and_not_sent() {
    let harness = harness();
    // The person's client sends a number where the form asks for text, and a field the
    // form does not have: nothing of it reaches the tool.
    let kernel = harness.kernel_with_permissions(
        model(&script("action=decline content=")),
        Arc::new(Answers::accepting(serde_json::json!({"name": 7, "card": "4111"}))),
    );
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    let declined = events.iter().find_map(|event| match &event.kind {
        EventKind::ElicitationAnswered { action, by, reason, content, .. } => {
            Some((*action, by.clone(), reason.clone(), content.clone()))
        }
        _ => None,
    });
    let (action, by, reason, content) = declined.unwrap();
    assert_eq!((action, by.as_str(), content), (ElicitationAction::Decline, "keel", None));
    assert!(reason.unwrap().contains("does not match the form"));
    // The legitimate neighbour: a fitting answer goes through (the test above).
}

#[tokio::test(start_paused = true)]
async fn a_question_open_when_the_process_died_is_recorded_as_cancelled_on_resume() {
    let harness = harness();
    let waiting =
        harness.kernel_with_permissions(model(&script("action=cancel")), Arc::new(Answers(None)));
    let session = harness.session(&waiting).await;
    let (config, never) = (harness.run_config(), Cancellation::new());
    let driving = waiting.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(5), driving).await.is_err());
    let before = harness.events(session).await;
    assert!(matches!(before.last().unwrap().kind, EventKind::ElicitationRequested { .. }));
    harness.clock.advance(keel_kernel::LEASE_TTL * 2);
    // The next process closes the dead run: the question ends as cancel, recorded.
    let kernel = harness.kernel(&script("indeterminate"));
    kernel.resume(session, &harness.run_config(), &Cancellation::new()).await.unwrap();
    let after = harness.events(session).await;
    assert_eq!(answered(&after)[0], (ElicitationAction::Cancel, "keel".to_owned()));
    let reason = after.iter().find_map(|event| match &event.kind {
        EventKind::ElicitationAnswered { reason, .. } => reason.clone(),
        _ => None,
    });
    assert_eq!(reason.as_deref(), Some(keel_kernel::recovery::QUESTION_ENDED_TEXT));
}

/// `--approval auto` and `--approval deny` answer questions by themselves: auto with the
/// form's defaults (declining a form whose required field has none), deny with a decline;
/// what they answered reaches the tool, and the run goes on.
#[tokio::test]
async fn fixed_policies_answer_with_the_defaults_or_decline() {
    use keel_contracts::PermissionAnswer;
    use keel_kernel::{StaticPermissions, TurnOutcome};
    let with_default = serde_json::json!({"type": "object",
        "properties": {"name": {"type": "string", "default": "Ann"}}, "required": ["name"]});
    let cases = [
        (
            PermissionAnswer::AllowOnce,
            with_default.clone(),
            r#"action=accept content={\"name\":\"Ann\"}"#,
            ElicitationAction::Accept,
            "approval=auto",
        ),
        (
            PermissionAnswer::AllowOnce,
            form(),
            "action=decline content=",
            ElicitationAction::Decline,
            "approval=auto",
        ),
        (
            PermissionAnswer::Deny,
            with_default,
            "action=decline content=",
            ElicitationAction::Decline,
            "approval=deny",
        ),
    ];
    for (answer, schema, expect, action, by) in cases {
        let harness = harness();
        let script = serde_json::json!({"steps": [
            {"tool_calls": [{"name": "ask", "arguments": {"schema": schema}}]},
            {"text": "done", "expect": {"contains": [expect]}}
        ]})
        .to_string();
        let kernel =
            harness.kernel_with_permissions(model(&script), Arc::new(StaticPermissions(answer)));
        let session = harness.session(&kernel).await;
        let report = kernel
            .run_turn(session, "go", &harness.run_config(), &Cancellation::new())
            .await
            .unwrap();
        let events = harness.events(session).await;
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() }, "{expect}");
        assert_eq!(answered(&events), vec![(action, by.to_owned())], "{expect}");
    }
}

/// Runs `ask` with `schema` against a hook that says `answer`; the recorded answer's
/// action and content, and the tool's result (what reached the server).
async fn ask_and_answer(
    schema: serde_json::Value,
    answer: ElicitationAnswer,
) -> (ElicitationAction, Option<serde_json::Value>, String) {
    let harness = harness();
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "ask", "arguments": {"schema": schema}}]},
        {"text": "done"}
    ]})
    .to_string();
    let kernel = harness.kernel_with_permissions(model(&script), Arc::new(Answers(Some(answer))));
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    let recorded = events.iter().find_map(|event| match &event.kind {
        EventKind::ElicitationAnswered { action, content, .. } => Some((*action, content.clone())),
        _ => None,
    });
    let result = events.iter().find_map(|event| match &event.kind {
        EventKind::ToolResult { content, .. } => Some(content.clone()),
        _ => None,
    });
    let (action, content) = recorded.unwrap();
    (action, content, result.unwrap())
}

/// An accept without content, for a form with no required field, is the empty answer:
/// `{}` is what is recorded and sent (the form was checked against it).
#[tokio::test]
async fn an_accept_without_content_sends_the_empty_answer_it_was_checked_as() {
    let optional = serde_json::json!({"type": "object",
        "properties": {"name": {"type": "string"}}});
    let accept =
        ElicitationAnswer { content: None, ..ElicitationAnswer::accept(optional.clone(), "user") };
    let (action, content, result) = ask_and_answer(optional, accept).await;
    assert_eq!((action, content), (ElicitationAction::Accept, Some(serde_json::json!({}))));
    assert_eq!(result, "action=accept content={}");
}

/// A decline or a cancel carries no content, whatever the answering side put in it: what
/// someone typed before declining never reaches the server or the ledger.
#[tokio::test]
async fn redteam_mcp_elicit_a_declined_or_cancelled_answer_carries_no_content() {
    let typed = serde_json::json!({"name": "Ann", "card": "4111"});
    for action in [ElicitationAction::Decline, ElicitationAction::Cancel] {
        let answer = ElicitationAnswer {
            action,
            content: Some(typed.clone()),
            by: "user".to_owned(),
            reason: Some("changed my mind".to_owned()),
        };
        let (recorded, content, result) = ask_and_answer(form(), answer).await;
        assert_eq!((recorded, content), (action, None));
        assert_eq!(result, format!("action={} content=", action.as_str()));
    }
    // The legitimate neighbour: an accepted answer's content does reach the server.
    let accept = ElicitationAnswer::accept(serde_json::json!({"name": "Ann"}), "user");
    let (action, content, result) = ask_and_answer(form(), accept).await;
    assert_eq!(
        (action, content),
        (ElicitationAction::Accept, Some(serde_json::json!({"name": "Ann"})))
    );
    assert_eq!(result, r#"action=accept content={"name":"Ann"}"#);
}

/// A fixed policy answers at once, so its question is committed together with its answer
/// (one commit); a hook that may wait on someone gets a question that is durable first.
#[tokio::test]
async fn a_fixed_policy_commits_its_question_with_the_answer_a_person_gets_it_durable_first() {
    use keel_contracts::PermissionAnswer;
    use keel_kernel::StaticPermissions;
    let with_default = serde_json::json!({"type": "object",
        "properties": {"name": {"type": "string", "default": "Ann"}}, "required": ["name"]});
    let hooks: [(Arc<dyn PermissionHook>, bool); 3] = [
        (Arc::new(StaticPermissions(PermissionAnswer::AllowOnce)), true),
        (Arc::new(StaticPermissions(PermissionAnswer::Deny)), true),
        (Arc::new(Answers::accepting(serde_json::json!({"name": "Ann"}))), false),
    ];
    for (hook, at_once) in hooks {
        let mut harness = harness();
        let store = Arc::new(keel_testkit::CountingStore::new(harness.store.clone()));
        harness.store = store.clone();
        let script = serde_json::json!({"steps": [
            {"tool_calls": [{"name": "ask", "arguments": {"schema": with_default}}]},
            {"text": "done"}
        ]})
        .to_string();
        let kernel = harness.kernel_with_permissions(model(&script), hook);
        let session = harness.session(&kernel).await;
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
        let commits = store.commits();
        let holding = |kind| commits.iter().position(|kinds| kinds.contains(&kind)).unwrap();
        let (asked, answered) = (holding("elicitation_requested"), holding("elicitation_answered"));
        assert_eq!(asked == answered, at_once, "{commits:?}");
        if !at_once {
            assert_eq!(commits[asked].last(), Some(&"elicitation_requested"), "{commits:?}");
        }
    }
}
