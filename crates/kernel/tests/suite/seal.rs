//! Inert sessions (DESIGN.md §6): a sealed session never runs agent code again.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use expect_test::expect;
use keel_contracts::{
    ModelClient, ModelError, ModelInfo, ModelRequest, ModelResponse, StreamDelta,
};
use keel_kernel::{Cancellation, KernelError, TurnOutcome};

use super::support::Harness;

/// A model that must never be asked: a sealed session runs no agent code.
#[derive(Debug)]
struct MustNotBeCalled;

#[async_trait]
impl ModelClient for MustNotBeCalled {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "none".into(),
            model: "must-not-be-called".into(),
            context_window: None,
        }
    }

    async fn complete(
        &self,
        request: &ModelRequest,
        _on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        panic!("a sealed session asked the model: {} messages", request.messages.len())
    }
}

#[tokio::test]
async fn a_sealed_session_never_calls_the_model_and_refuses_every_continuation() {
    let harness = Harness::new();
    let kernel = harness.kernel(r#"{"steps":[{"text":"first answer"}]}"#);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "go", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "first answer".into() });

    let seq = kernel.seal_session(session, "handed over").await.unwrap();
    let sealed = harness.render(session).await;
    assert!(sealed.ends_with(&format!("#{} session_sealed handed over\n", seq.0)), "{sealed}");

    let inert = harness.kernel_with(Arc::new(MustNotBeCalled));
    let config = harness.run_config();
    let refused = [
        inert.run_turn(session, "again", &config, &Cancellation::new()).await.map(|_| ()),
        inert.resume(session, &config, &Cancellation::new()).await.map(|_| ()),
        inert.compact_session(session, &config, &Cancellation::new()).await.map(|_| ()),
        inert.seal_session(session, "twice").await.map(|_| ()),
    ];
    for result in refused {
        assert!(matches!(result, Err(KernelError::Sealed(id)) if id == session), "{result:?}");
    }
    // Nothing was appended by the refused calls.
    assert_eq!(harness.render(session).await, sealed);
    assert!(harness.invocations().is_empty());
}

#[tokio::test(start_paused = true)]
async fn sealing_leaves_a_dangling_run_as_it_is_and_never_replays_it() {
    let harness = Harness::new();
    let kernel = harness
        .kernel(r#"{"steps":[{"tool_calls":[{"name":"slow","arguments":{}}]},{"text":"after"}]}"#);
    let session = harness.session(&kernel).await;
    // The process "dies" while the slow write runs.
    let config = harness.run_config();
    let never = Cancellation::new();
    let driving = kernel.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(1), driving).await.is_err());

    kernel.seal_session(session, "abandoned").await.unwrap();
    let inert = harness.kernel_with(Arc::new(MustNotBeCalled));
    let result = inert.resume(session, &config, &Cancellation::new()).await;
    assert!(matches!(result, Err(KernelError::Sealed(_))), "{result:?}");
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "go"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 slow {}]
        #7 gate_decision call_1_1 Ask consent required: write access
        #8 permission_requested call_1_1 write
        #9 permission_settled call_1_1 AllowOnce by approval=auto
        #10 tool_attempt_prepared call_1_1/id4
        #11 session_sealed abandoned
    "##]]
    .assert_eq(&harness.render(session).await);
    assert_eq!(harness.invocations(), vec!["slow {}"], "the write ran once and was not replayed");
}
