//! Steering: input sent while a run is active joins at the next step boundary, as one
//! durable `input_joined` event, never while a call is being settled (issue #20).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{EventKind, ModelClient, RuntimeEvent, Seq};
use keel_kernel::{Cancellation, Steering, SteeringClosed, TurnOutcome};
use keel_testkit::ScriptedModel;

use super::support::Harness;

fn position(events: &[RuntimeEvent], wanted: impl Fn(&EventKind) -> bool) -> usize {
    events.iter().position(|event| wanted(&event.kind)).expect("the event is recorded")
}

#[tokio::test(start_paused = true)]
async fn steering_input_sent_while_a_tool_runs_joins_after_its_result() {
    let harness = Harness::new();
    let kernel = harness.kernel(
        r#"{"steps":[
            {"tool_calls":[{"name":"nap","arguments":{}},{"name":"read","arguments":{"path":"a"}}]},
            {"text":"done, and b too","expect":{"contains":"also check b"}}
        ]}"#,
    );
    let session = harness.session(&kernel).await;
    let steering = Steering::new();
    let sender = steering.clone();
    let joined = tokio::spawn(async move {
        // While `nap` sleeps (60 s): mid-call.
        tokio::time::sleep(Duration::from_secs(1)).await;
        sender.send("also check b").unwrap().wait().await
    });
    let report = kernel
        .run_turn_steered(
            session,
            "check a",
            &harness.run_config(),
            &Cancellation::new(),
            &steering,
        )
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done, and b too".into() });
    let seq = joined.await.unwrap().expect("the input joined");
    let events = harness.events(session).await;
    let at = position(&events, |kind| matches!(kind, EventKind::InputJoined { .. }));
    assert_eq!(events[at].seq, seq, "the sender got the durable event's seq");
    assert!(
        matches!(&events[at].kind, EventKind::InputJoined { input } if input == "also check b")
    );
    // Never mid-call: after both results of the step, before the next model request.
    let last_result =
        events.iter().rposition(|e| matches!(e.kind, EventKind::ToolResult { .. })).unwrap();
    assert!(last_result < at);
    assert!(matches!(events[at + 1].kind, EventKind::ModelRequested { step: 2, .. }));
    assert_eq!(harness.invocations(), vec!["nap {}", r#"read {"path":"a"}"#]);
}

/// A model that sends steering input while it answers its first request.
#[derive(Debug)]
struct SteersWhileAnswering {
    inner: ScriptedModel,
    steering: Steering,
    joined: Mutex<Option<keel_kernel::Joined>>,
}

#[async_trait]
impl ModelClient for SteersWhileAnswering {
    fn info(&self) -> keel_contracts::ModelInfo {
        self.inner.info()
    }
    async fn complete(
        &self,
        request: &keel_contracts::ModelRequest,
        on_delta: &(dyn Fn(keel_contracts::StreamDelta) + Send + Sync),
    ) -> Result<keel_contracts::ModelResponse, keel_contracts::ModelError> {
        {
            let mut joined = self.joined.lock().unwrap();
            if joined.is_none() {
                *joined = Some(self.steering.send("one more thing: b").unwrap());
            }
        }
        self.inner.complete(request, on_delta).await
    }
}

#[tokio::test]
async fn steering_input_sent_while_the_model_gives_its_answer_keeps_the_run_going() {
    let harness = Harness::new();
    let steering = Steering::new();
    let script = r#"{"steps":[
        {"text":"a is fine"},
        {"text":"b is fine too","expect":{"contains":"one more thing: b"}}
    ]}"#;
    let model = Arc::new(SteersWhileAnswering {
        inner: ScriptedModel::new(serde_json::from_str(script).unwrap(), "test-script"),
        steering: steering.clone(),
        joined: Mutex::new(None),
    });
    let kernel = harness.kernel_with(model.clone());
    let session = harness.session(&kernel).await;
    let report = kernel
        .run_turn_steered(
            session,
            "check a",
            &harness.run_config(),
            &Cancellation::new(),
            &steering,
        )
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "b is fine too".into() });
    let joined = model.joined.lock().unwrap().take().unwrap();
    let seq = joined.wait().await.expect("joined");
    let events = harness.events(session).await;
    let answers: Vec<Seq> =
        events.iter().filter(|e| e.kind.is_conversation_response()).map(|e| e.seq).collect();
    assert_eq!(answers.len(), 2);
    assert!(answers[0] < seq && seq < answers[1], "joined between the two answers");
    assert_eq!(
        events.iter().filter(|e| e.kind.is_run_terminal()).count(),
        1,
        "one run, one terminal event"
    );
    // After the run, the inbox refuses: the input is handed back for a new turn.
    assert_eq!(steering.send("late").unwrap_err(), SteeringClosed("late".into()));
}

#[tokio::test(start_paused = true)]
async fn steering_input_queued_when_the_run_is_cancelled_is_reported_unjoined() {
    let harness = Harness::new();
    let kernel = harness
        .kernel(r#"{"steps":[{"tool_calls":[{"name":"nap","arguments":{}}]},{"text":"x"}]}"#);
    let session = harness.session(&kernel).await;
    let steering = Steering::new();
    let cancel = Cancellation::new();
    let (sender, trigger) = (steering.clone(), cancel.clone());
    let joined = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let joined = sender.send("never mind").unwrap();
        trigger.cancel();
        joined.wait().await
    });
    let report = kernel
        .run_turn_steered(session, "go", &harness.run_config(), &cancel, &steering)
        .await
        .unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Cancelled { .. }));
    assert_eq!(joined.await.unwrap(), None, "the sender learns it did not join");
    let events = harness.events(session).await;
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::InputJoined { .. })));
}
