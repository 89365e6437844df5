//! Gates: scope, forbidden, consent and shadow mode. Each test also checks the fake
//! tool's invocation log, so a bypassed gate turns the test red.

use expect_test::expect;
use keel_contracts::{
    Access, Authorization, Envelope, ExecutionMode, PermissionAnswer, Scope,
    authorize_tool_invocation,
};
use keel_kernel::TurnOutcome;
use proptest::prelude::*;

use super::support::{FakeTool, Harness, spec};

const READ_WRITE_NOTE: &str = r#"{"steps":[
    {"tool_calls":[
        {"name":"read","arguments":{"path":"a"}},
        {"name":"write","arguments":{"path":"b"}},
        {"name":"todo","arguments":{"items":[{"status":"done","text":"check a"}]}}
    ]},
    {"text":"done"}
]}"#;

#[tokio::test]
async fn approval_deny_refuses_writes_and_leaves_reads_alone() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::Deny;
    let (report, ledger) = harness.run(READ_WRITE_NOTE, "t").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "t"
        #3 run_started Live Deny max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 read {"path":"a"}; call_1_2 write {"path":"b"}; call_1_3 todo {"items":[{"status":"done","text":"check a"}]}]
        #7 gate_decision call_1_1 Allow scope.reads
        #8 tool_attempt_prepared call_1_1/id4
        #9 tool_result call_1_1/id4 ok "contents of a"
        #10 gate_decision call_1_2 Ask consent required: write access
        #11 permission_requested call_1_2 write
        #12 permission_settled call_1_2 Deny by approval=deny
        #13 tool_result call_1_2/- refused "refused: permission was denied for this call; do not retry it, report what you would have done"
        #14 gate_decision call_1_3 Allow intrinsic
        #15 tool_attempt_prepared call_1_3/id5
        #16 tool_result call_1_3/id5 ok "todo recorded: 1/1 done\n[x] check a\n"
        #17 model_requested step=2 messages=5
        #18 model_response stop "done" []
        #19 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&ledger);
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn forbidden_refuses_workspace_and_intrinsic_tools() {
    let mut harness = Harness::new();
    harness.envelope.forbidden = ["write".to_owned(), "todo".to_owned()].into();
    let (_, ledger) = harness.run(READ_WRITE_NOTE, "t").await;
    assert!(
        ledger.contains("gate_decision call_1_2 Refuse refused: this tool is forbidden"),
        "{ledger}"
    );
    assert!(
        ledger.contains("gate_decision call_1_3 Refuse refused: this tool is forbidden"),
        "{ledger}"
    );
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn scope_limits_reads_and_writes_but_not_intrinsic_tools() {
    let mut harness = Harness::new();
    harness.envelope = Envelope {
        reads: Scope::Tools(["broken".to_owned()].into()),
        writes: Scope::Tools(Default::default()),
        forbidden: Default::default(),
    };
    let (_, ledger) = harness.run(READ_WRITE_NOTE, "t").await;
    assert!(ledger.contains("call_1_1 Refuse refused: this read tool is outside"), "{ledger}");
    assert!(ledger.contains("call_1_2 Refuse refused: this write tool is outside"), "{ledger}");
    assert!(harness.invocations().is_empty());
    assert!(ledger.contains("call_1_3 Allow intrinsic"), "{ledger}");
}

#[tokio::test]
async fn shadow_mode_executes_first_party_reads_and_intrinsics_only() {
    let mut harness = Harness::new();
    harness.mode = ExecutionMode::Shadow;
    let (report, ledger) = harness.run(READ_WRITE_NOTE, "t").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }));
    expect![[r##"
        #1 session_created scripted:test Shadow forbidden={}
        #2 turn_started "t"
        #3 run_started Shadow Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 read {"path":"a"}; call_1_2 write {"path":"b"}; call_1_3 todo {"items":[{"status":"done","text":"check a"}]}]
        #7 gate_decision call_1_1 Allow scope.reads
        #8 tool_attempt_prepared call_1_1/id4
        #9 tool_result call_1_1/id4 ok "contents of a"
        #10 gate_decision call_1_2 Shadow shadow_denied: this session runs in shadow mode; the call was recorded as an intent and not executed
        #11 shadow_intent call_1_2 write {"path":"b"}
        #12 tool_result call_1_2/- shadow_denied "shadow_denied: this session runs in shadow mode; the call was recorded as an intent and not executed"
        #13 gate_decision call_1_3 Allow intrinsic
        #14 tool_attempt_prepared call_1_3/id5
        #15 tool_result call_1_3/id5 ok "todo recorded: 1/1 done\n[x] check a\n"
        #16 model_requested step=2 messages=5
        #17 model_response stop "done" []
        #18 run_completed the model answered without tool calls
    "##]]
    .assert_eq(&ledger);
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn allow_for_session_is_a_durable_grant_used_by_later_calls() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::AllowSession;
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"write","arguments":{"path":"a"}}]},
        {"tool_calls":[{"name":"write","arguments":{"path":"b"}}]},
        {"text":"done"}
    ]}"#;
    let (_, ledger) = harness.run(script, "t").await;
    assert!(
        ledger.contains("permission_settled call_1_1 AllowSession by approval=auto"),
        "{ledger}"
    );
    assert!(
        ledger.contains("gate_decision call_2_1 Allow grant: allowed for this session"),
        "{ledger}"
    );
    assert!(!ledger.contains("permission_requested call_2_1"), "{ledger}");
    assert_eq!(harness.invocations().len(), 2);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// For random envelopes, every tool the kernel invoked is allowed by
    /// `authorize_tool_invocation`, and no forbidden tool is ever touched.
    #[test]
    fn kernel_never_invokes_what_the_contract_refuses(
        reads_all: bool,
        writes_all: bool,
        reads in proptest::collection::btree_set(prop_oneof!["read", "broken", "write", "todo"], 0..4),
        writes in proptest::collection::btree_set(prop_oneof!["read", "broken", "write", "todo"], 0..4),
        forbidden in proptest::collection::btree_set(prop_oneof!["read", "broken", "write", "todo"], 0..4),
    ) {
        let envelope = Envelope {
            reads: if reads_all { Scope::All } else { Scope::Tools(reads.into_iter().collect()) },
            writes: if writes_all { Scope::All } else { Scope::Tools(writes.into_iter().collect()) },
            forbidden: forbidden.into_iter().collect(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let invoked = runtime.block_on(async {
            let mut harness = Harness::new();
            harness.envelope = envelope.clone();
            harness.run(READ_WRITE_NOTE, "t").await;
            harness.invocations()
        });
        let kernel = Harness::new().kernel(r#"{"steps":[]}"#);
        let specs: Vec<_> = kernel.registry().specs().cloned().collect();
        for line in invoked {
            let name = line.split(' ').next().unwrap();
            let spec = specs.iter().find(|s| s.name == name).unwrap();
            let allowed = matches!(authorize_tool_invocation(spec, &envelope), Authorization::Allow { .. });
            prop_assert!(allowed);
            prop_assert!(!envelope.forbidden.contains(name));
            if spec.access == Access::Write && !spec.intrinsic {
                prop_assert!(envelope.writes.contains(name));
            }
        }
    }
}

#[test]
fn only_keel_makes_a_tool_intrinsic() {
    let claimant = FakeTool {
        spec: spec("sneaky", Access::Write, true),
        log: Default::default(),
        behaviour: super::support::Behaviour::Reply(String::new()),
    };
    let error = keel_kernel::Registry::new(
        vec![std::sync::Arc::new(claimant)],
        keel_kernel::AgentTools::Withheld,
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "tool 'sneaky' claims to be intrinsic; only keel's own tools are"
    );
}

#[tokio::test]
async fn rules_pre_answer_consent_and_deny_beats_allow_and_grants() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::AllowSession;
    harness.rules = keel_contracts::PermissionRules {
        allow: vec![keel_contracts::Rule::parse("write(src/**)").unwrap()],
        deny: vec![keel_contracts::Rule::parse("write(src/secret*)").unwrap()],
    };
    let script = r#"{"steps":[
        {"tool_calls":[{"name":"write","arguments":{"path":"src/a"}}]},
        {"tool_calls":[{"name":"write","arguments":{"path":"docs/b"}}]},
        {"tool_calls":[{"name":"write","arguments":{"path":"./src/x/../secret.key"}}]},
        {"text":"done","expect":{"last_outcomes":["refused"]}}
    ]}"#;
    let (report, ledger) = harness.run(script, "t").await;
    assert!(matches!(report.outcome, TurnOutcome::Completed { .. }), "{report:?}");
    assert!(
        ledger.contains("permission_settled call_1_1 AllowOnce by rule:write(src/**)"),
        "{ledger}"
    );
    assert!(
        ledger.contains("permission_settled call_2_1 AllowSession by approval=auto"),
        "{ledger}"
    );
    // The session grant for `write` does not beat a deny rule.
    assert!(
        ledger.contains("permission_settled call_3_1 Deny by rule:write(src/secret*)"),
        "{ledger}"
    );
    assert_eq!(
        harness.invocations(),
        vec![r#"write {"path":"src/a"}"#, r#"write {"path":"docs/b"}"#]
    );
}
