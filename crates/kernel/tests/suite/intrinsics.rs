//! One path for every tool: an intrinsic defined here, outside keel, registered with
//! `Kernel::with_intrinsic`, is gated and carried out through its own hooks like keel's own
//! (no attempt when its admission refuses the call, its output recorded as the result).

use std::sync::Arc;

use async_trait::async_trait;
use expect_test::expect;
use keel_contracts::{Access, Effects, Tool, ToolContext, ToolOutput, ToolSpec};
use keel_kernel::{Admitted, Carried, Intrinsic, IntrinsicCall, TurnOutcome};

use super::support::Harness;

/// `tally(n)`: answers with `n` and how many events the ledger holds; a call with `n` 0 is
/// answered `error` at admission, without an attempt.
#[derive(Debug)]
struct Tally(ToolSpec);

impl Tally {
    fn shared() -> Arc<dyn Intrinsic> {
        Arc::new(Tally(ToolSpec {
            name: "tally".into(),
            description: "Count the session's events.".into(),
            parameters: serde_json::json!({
                "type": "object",
                "properties": {"n": {"type": "integer", "minimum": 0}},
                "required": ["n"],
                "additionalProperties": false
            }),
            access: Access::Read,
            effects: Effects::LOCAL_READ,
            intrinsic: true,
            first_party: true,
        }))
    }
}

#[async_trait]
impl Tool for Tally {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    async fn invoke(&self, _: &ToolContext, _: &serde_json::Value) -> ToolOutput {
        ToolOutput::error("error: tally is carried out by its hook")
    }
}

#[async_trait]
impl Intrinsic for Tally {
    fn admit(&self, call: &IntrinsicCall<'_>) -> Admitted {
        match call.arguments().get("n").and_then(serde_json::Value::as_u64) {
            Some(0) => Admitted::Invalid("error: n must be positive".into()),
            _ => Admitted::Attempt,
        }
    }

    async fn carry_out(&self, call: &mut IntrinsicCall<'_>) -> keel_kernel::Result<Carried> {
        let n = call.arguments()["n"].as_u64().unwrap_or_default();
        let steps = call.run_config().budget.max_steps.unwrap_or_default();
        let held = call.events().len();
        let text = format!("tally {n}: {held} events held, {steps} steps allowed");
        Ok(Carried::output(ToolOutput::ok(text)))
    }
}

#[tokio::test]
async fn an_intrinsic_defined_outside_keel_is_settled_through_its_hooks() {
    let mut harness = Harness::new();
    harness.max_steps = Some(5);
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"tally","arguments":{"n":0}}]},
        {"tool_calls":[{"name":"tally","arguments":{"n":2}}],
         "expect":{"last_outcomes":["error"],"contains":"n must be positive"}},
        {"text":"Tallied.","expect":{"last_outcomes":["ok"],"contains":"tally 2"}}
    ]}"#;
    let kernel = harness.kernel(script).with_intrinsic(Tally::shared()).unwrap();
    assert_eq!(kernel.registry().names().last().map(String::as_str), Some("tally"));
    let session = harness.session(&kernel).await;
    let report = kernel
        .run_turn(session, "tally", &harness.run_config(), &keel_kernel::Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "Tallied.".into() });
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "tally"
        #3 run_started Live Auto max_steps=Some(5)
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output,tally
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 tally {"n":0}]
        #7 gate_decision call_1_1 Allow intrinsic
        #8 tool_result call_1_1/- error "error: n must be positive"
        #9 model_requested step=2 messages=3
        #10 model_response tool_calls "" [call_2_1 tally {"n":2}]
        #11 gate_decision call_2_1 Allow intrinsic
        #12 tool_attempt_prepared call_2_1/id4
        #13 tool_result call_2_1/id4 ok "tally 2: 12 events held, 5 steps allowed"
        #14 model_requested step=3 messages=5
        #15 model_response stop "Tallied." []
        #16 run_completed the model answered without tool calls
    "##]].assert_eq(&harness.render(session).await);
    // Nothing ran through a workspace tool's path.
    assert!(harness.invocations().is_empty());
}
