//! Code Mode: `run_code` cells whose `tools.NAME(args)` calls are ordinary, gated,
//! recorded tool calls (issue #20). Each test checks the fake tools' invocation log, so a
//! call that bypassed a gate turns it red, and the ledger's pairing of nested calls.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use expect_test::expect;
use keel_contracts::{
    EventKind, ExecutionMode, Outcome, PermissionAnswer, REFUSAL_NOT_IN_WRITES,
    REFUSAL_PERMISSION_DENIED, REFUSAL_SHADOW, RuntimeEvent, Scope,
};
use keel_kernel::{Cancellation, CodeLimits, TurnOutcome, projection};

use super::support::Harness;

/// A script whose first step runs `code` in a cell, then answers "done".
fn cell_script(code: &str) -> String {
    serde_json::json!({"steps": [
        {"tool_calls": [{"name": "run_code", "arguments": {"code": code}}]},
        {"text": "done"}
    ]})
    .to_string()
}

/// The content of the `tool_result` of `call_id`.
fn result_of(events: &[RuntimeEvent], call_id: &str) -> (Outcome, String) {
    events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::ToolResult { call_id: id, outcome, content, .. }
                if id.as_str() == call_id =>
            {
                Some((*outcome, content.clone()))
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no result for {call_id}"))
}

/// Checks that every nested `tool_call` has exactly one `tool_result` after it, that its
/// parent is `parent`, and that the parent's own result comes after all of them. Returns
/// the nested calls' tool names in order.
fn assert_nested_pairing(events: &[RuntimeEvent], parent: &str) -> Vec<String> {
    let mut nested = Vec::new();
    let mut results: BTreeMap<String, usize> = BTreeMap::new();
    let mut parent_result = None;
    for (index, event) in events.iter().enumerate() {
        match &event.kind {
            EventKind::ToolCall { parent_call_id, call_id, tool, .. } => {
                assert_eq!(parent_call_id.as_str(), parent);
                assert!(call_id.as_str().starts_with(&format!("{parent}/")));
                nested.push((call_id.as_str().to_owned(), tool.clone(), index));
            }
            EventKind::ToolResult { call_id, .. } => {
                *results.entry(call_id.as_str().to_owned()).or_insert(0) += 1;
                if call_id.as_str() == parent {
                    parent_result = Some(index);
                }
            }
            _ => {}
        }
    }
    let parent_result = parent_result.expect("the cell has its result");
    for (call_id, _, index) in &nested {
        assert_eq!(results.get(call_id), Some(&1), "{call_id} has exactly one result");
        let result_at = events
            .iter()
            .position(|e| matches!(&e.kind, EventKind::ToolResult { call_id: id, .. } if id.as_str() == call_id))
            .unwrap();
        assert!(
            *index < result_at && result_at < parent_result,
            "{call_id} is settled inside the cell"
        );
    }
    // The model's view stays paired: nested calls are not part of the conversation.
    projection::check_pairing(&projection::messages(events)).unwrap();
    nested.into_iter().map(|(_, tool, _)| tool).collect()
}

#[tokio::test]
async fn code_mode_a_cell_calls_tools_and_its_print_is_the_result() {
    let harness = Harness::new();
    let script = cell_script(
        "const a = await tools.read({path: 'a'});\n\
         const b = await tools.write({path: 'b'});\n\
         print('read:', a); print('write:', b);",
    );
    let (report, ledger) = harness.run(&script, "t").await;
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    expect![[r##"
        #1 session_created scripted:test Live forbidden={}
        #2 turn_started "t"
        #3 run_started Live Auto max_steps=None
        #4 run_composition scripted tools=read,write,broken,boom,slow,nap,todo,plan,read_tool_result,request_boundary,run_code,spawn_agent,wait_agent,list_agents,read_agent_output
        #5 model_requested step=1 messages=1
        #6 model_response tool_calls "" [call_1_1 run_code {"code":"const a = await tools.read({path: 'a'});\nconst b = await tools.write({path: 'b'});\nprint('read:', a); print('write:', b);"}]
        #7 gate_decision call_1_1 Allow intrinsic
        #8 tool_attempt_prepared call_1_1/id4
        #9 tool_call call_1_1/1 read {"path":"a"} parent=call_1_1
        #10 gate_decision call_1_1/1 Allow scope.reads
        #11 tool_attempt_prepared call_1_1/1/id5
        #12 tool_result call_1_1/1/id5 ok "contents of a"
        #13 tool_call call_1_1/2 write {"path":"b"} parent=call_1_1
        #14 gate_decision call_1_1/2 Ask consent required: write access
        #15 permission_requested call_1_1/2 write
        #16 permission_settled call_1_1/2 AllowOnce by approval=auto
        #17 tool_attempt_prepared call_1_1/2/id6
        #18 tool_result call_1_1/2/id6 ok "written"
        #19 tool_result call_1_1/id4 ok "read: contents of a\nwrite: written\n"
        #20 model_requested step=2 messages=3
        #21 model_response stop "done" []
        #22 run_completed the model answered without tool calls
    "##]].assert_eq(&ledger);
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#, r#"write {"path":"b"}"#]);
}

#[tokio::test]
async fn code_mode_a_nested_write_under_approval_deny_is_refused_and_the_program_sees_why() {
    let mut harness = Harness::new();
    harness.approval = PermissionAnswer::Deny;
    let script = cell_script(
        "const w = await tools.write({path: 'b'});\n\
         const r = await tools.read({path: 'a'});\n\
         print(w.startsWith('refused:') ? 'write refused: ' + w : 'write ran'); print(r);",
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    assert_eq!(assert_nested_pairing(&events, "call_1_1"), vec!["write", "read"]);
    let (outcome, write) = result_of(&events, "call_1_1/1");
    assert_eq!((outcome, write.as_str()), (Outcome::Refused, REFUSAL_PERMISSION_DENIED));
    assert!(events.iter().any(|e| matches!(&e.kind,
        EventKind::PermissionSettled { call_id, answer: PermissionAnswer::Deny, .. } if call_id.as_str() == "call_1_1/1")));
    let (outcome, cell) = result_of(&events, "call_1_1");
    assert_eq!(outcome, Outcome::Ok);
    assert_eq!(cell, format!("write refused: {REFUSAL_PERMISSION_DENIED}\ncontents of a\n"));
    // The write never ran; the read beside it did.
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn code_mode_nested_writes_in_shadow_mode_are_intents() {
    let mut harness = Harness::new();
    harness.mode = ExecutionMode::Shadow;
    let script =
        cell_script("print(await tools.write({path: 'b'})); print(await tools.read({path: 'a'}));");
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    assert_nested_pairing(&events, "call_1_1");
    assert!(events.iter().any(|e| matches!(&e.kind,
        EventKind::ShadowIntent { call_id, tool, .. } if call_id.as_str() == "call_1_1/1" && tool == "write")));
    let (_, cell) = result_of(&events, "call_1_1");
    assert_eq!(cell, format!("{REFUSAL_SHADOW}\ncontents of a\n"));
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn code_mode_a_syntax_error_is_an_error_result() {
    let harness = Harness::new();
    let (_, ledger) = harness.run(&cell_script("let = ;"), "t").await;
    assert!(
        ledger.contains(
            r#"tool_result call_1_1/id4 error "error: the program failed: SyntaxError: variable name expected\n    at run_code:1:19""#
        ),
        "{ledger}"
    );
    assert!(harness.invocations().is_empty());
}

#[tokio::test]
async fn code_mode_an_uncaught_throw_keeps_what_was_printed() {
    let harness = Harness::new();
    let (_, ledger) =
        harness.run(&cell_script("print('before'); throw new TypeError('bad input');"), "t").await;
    assert!(
        ledger.contains(r#"error "before\nerror: the program failed: TypeError: bad input"#),
        "{ledger}"
    );
}

/// Runs `code` in one cell under `limits` and returns the cell's result and how long the
/// turn took.
async fn run_limited(code: &str, limits: CodeLimits) -> ((Outcome, String), Duration) {
    let harness = Harness::new();
    let kernel = harness.kernel(&cell_script(code)).with_code_limits(limits);
    let session = harness.session(&kernel).await;
    let started = Instant::now();
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let took = started.elapsed();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    (result_of(&events, "call_1_1"), took)
}

#[tokio::test]
async fn code_mode_an_infinite_loop_is_stopped_by_the_cpu_limit() {
    let limits = CodeLimits { cpu: Duration::from_millis(200), ..CodeLimits::default() };
    let ((outcome, text), took) = run_limited("print('start'); while (true) {}", limits).await;
    assert_eq!(outcome, Outcome::Error);
    assert_eq!(
        text,
        "start\nerror: the program ran out of CPU time (limit 200 ms) and was stopped"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn code_mode_a_loop_that_catches_is_still_stopped() {
    // The interrupt is uncatchable: try/catch around the loop does not keep it alive.
    let limits = CodeLimits { cpu: Duration::from_millis(200), ..CodeLimits::default() };
    let ((outcome, text), _) =
        run_limited("for (;;) { try { while (true) {} } catch (e) { print('caught'); } }", limits)
            .await;
    assert_eq!(outcome, Outcome::Error);
    assert!(text.starts_with("error: the program ran out of CPU time"), "{text}");
}

#[tokio::test]
async fn code_mode_the_wall_limit_stops_a_long_cell() {
    let limits = CodeLimits {
        cpu: Duration::from_secs(60),
        wall: Duration::from_millis(300),
        ..CodeLimits::default()
    };
    let ((outcome, text), took) = run_limited("while (true) {}", limits).await;
    assert_eq!(outcome, Outcome::Error);
    assert_eq!(text, "error: the program ran out of wall time (limit 300 ms) and was stopped");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[tokio::test]
async fn code_mode_a_huge_allocation_is_stopped_by_the_memory_limit() {
    let limits = CodeLimits { memory_bytes: 16 * 1024 * 1024, ..CodeLimits::default() };
    let ((outcome, text), _) = run_limited(
        "const hoard = []; while (true) hoard.push(new Array(1 << 16).fill(7));",
        limits,
    )
    .await;
    assert_eq!(outcome, Outcome::Error);
    assert_eq!(
        text,
        "error: the program reached its memory limit (16777216 bytes) and was stopped"
    );
}

#[tokio::test]
async fn code_mode_a_huge_print_is_capped() {
    let limits = CodeLimits { output_bytes: 1024, ..CodeLimits::default() };
    let ((outcome, text), _) =
        run_limited("for (let i = 0; i < 100000; i++) print('x'.repeat(99));", limits).await;
    assert_eq!(outcome, Outcome::Ok);
    let (kept, note) = text.split_at(text.find("[keel]").unwrap());
    assert!(kept.len() <= 1024 + 1, "{}", kept.len());
    assert_eq!(
        note,
        format!(
            "[keel] output capped at 1024 bytes; {} more bytes were dropped\n",
            10_000_000 - 1024
        )
    );
}

#[tokio::test]
async fn code_mode_the_call_limit_answers_later_calls_with_an_error_text() {
    let limits = CodeLimits { max_calls: 2, ..CodeLimits::default() };
    let harness = Harness::new();
    let kernel = harness
        .kernel(&cell_script(
            "for (let i = 0; i < 3; i++) print(await tools.read({path: 'a' + i}));",
        ))
        .with_code_limits(limits);
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    assert_eq!(assert_nested_pairing(&events, "call_1_1"), vec!["read", "read"]);
    let (_, cell) = result_of(&events, "call_1_1");
    assert!(
        cell.ends_with(
            "error: this program already made 2 tool calls, its limit; this call was not made\n"
        ),
        "{cell}"
    );
    assert_eq!(harness.invocations().len(), 2);
}

#[tokio::test]
async fn redteam_codemode_no_fs_net_or_process_through_globals() {
    let harness = Harness::new();
    let probe = r#"
        const names = ['require', 'process', 'Deno', 'Bun', 'std', 'os', 'fetch',
          'XMLHttpRequest', 'WebSocket', 'setTimeout', 'setInterval', 'importScripts',
          '__keel_call', '__keel_print', 'scriptArgs', 'module', 'exports'];
        const global = Function('return this')();
        print(names.filter((n) => typeof global[n] !== 'undefined').join(',') || 'none');
        let imported;
        try { await import('fs'); imported = 'imported fs'; } catch (e) { imported = 'no import: ' + e.name; }
        print(imported);
        let osImport;
        try { await import('os'); osImport = 'imported os'; } catch (e) { osImport = 'no os'; }
        print(osImport);
        print(await tools.read({path: 'a'}));
    "#;
    let kernel = harness.kernel(&cell_script(probe));
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let (outcome, cell) = result_of(&harness.events(session).await, "call_1_1");
    assert_eq!(outcome, Outcome::Ok, "{cell}");
    let lines: Vec<&str> = cell.lines().collect();
    assert_eq!(lines[0], "none", "{cell}");
    assert!(lines[1].starts_with("no import"), "{cell}");
    assert_eq!(lines[2], "no os", "{cell}");
    // The legitimate neighbour: a tool call from the same cell works.
    assert_eq!(lines[3], "contents of a");
}

#[tokio::test]
async fn redteam_codemode_a_tool_outside_the_scope_is_refused_inside_a_cell() {
    let mut harness = Harness::new();
    harness.envelope.writes = Scope::parse("other");
    harness.envelope.forbidden = ["broken".to_owned()].into();
    let script = cell_script(
        "print(await tools.write({path: 'b'}));\n\
         print(await tools.broken({}));\n\
         print(await tools.nope({}));\n\
         print(await tools.read({path: 'a'}));",
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    let events = harness.events(session).await;
    assert_eq!(assert_nested_pairing(&events, "call_1_1"), vec!["write", "broken", "nope", "read"]);
    assert_eq!(result_of(&events, "call_1_1/1"), (Outcome::Refused, REFUSAL_NOT_IN_WRITES.into()));
    assert_eq!(result_of(&events, "call_1_1/2").0, Outcome::Refused);
    let (outcome, unknown) = result_of(&events, "call_1_1/3");
    assert_eq!(outcome, Outcome::Error);
    assert!(unknown.starts_with("error: unknown tool 'nope'"), "{unknown}");
    let (_, cell) = result_of(&events, "call_1_1");
    assert!(cell.ends_with("contents of a\n"), "{cell}");
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
}

#[tokio::test]
async fn redteam_codemode_no_escalation_through_nested_cells_agents_or_boundaries() {
    let harness = Harness::new();
    let script = cell_script(
        "print(await tools.run_code({code: 'print(await tools.write({path: \"b\"}))'}));\n\
         print(await tools.spawn_agent({task: 'write b for me'}));\n\
         print(await tools.request_boundary({network: true, justification: 'need it'}));\n\
         print(await tools.plan({items: []}));\n\
         print(await tools.read({path: 'a'}));",
    );
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, "t", &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    assert_eq!(
        assert_nested_pairing(&events, "call_1_1"),
        vec!["run_code", "spawn_agent", "request_boundary", "plan", "read"]
    );
    for nested in ["call_1_1/1", "call_1_1/2", "call_1_1/3", "call_1_1/4"] {
        let (outcome, text) = result_of(&events, nested);
        assert_eq!(outcome, Outcome::Refused, "{nested}");
        assert!(text.starts_with("refused: a run_code program may call workspace tools only"));
    }
    // Nothing ran but the read: no inner cell, no child session, no boundary revision.
    assert_eq!(harness.invocations(), vec![r#"read {"path":"a"}"#]);
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::BoundaryRevised { .. })));
    assert!(!events.iter().any(|e| matches!(&e.kind,
        EventKind::ToolCall { parent_call_id, .. } if parent_call_id.as_str() != "call_1_1")));
    assert_eq!(harness.store.sessions().await.unwrap().len(), 1, "no child session was created");
}

#[tokio::test]
async fn code_mode_a_crash_mid_cell_leaves_the_nested_write_indeterminate_never_replayed() {
    let harness = Harness::new();
    let script = serde_json::json!({"steps": [
        {"tool_calls": [{"name": "run_code", "arguments": {"code":
            "print(await tools.read({path: 'a'})); print(await tools.slow({}));"}}]},
        {"text": "after", "expect": {"contains": "resume please"}}
    ]})
    .to_string();
    let kernel = harness.kernel(&script);
    let session = harness.session(&kernel).await;
    // The process "dies" while the nested slow write runs: the driving future is dropped.
    let config = harness.run_config();
    let never = Cancellation::new();
    let driving = kernel.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_secs(2), driving).await.is_err());
    let before = harness.events(session).await;
    assert!(matches!(&before.last().unwrap().kind,
        EventKind::ToolAttemptPrepared { call_id, .. } if call_id.as_str() == "call_1_1/2"));

    let report = kernel
        .run_turn(session, "resume please", &harness.run_config(), &Cancellation::new())
        .await
        .unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "after".into() });
    let after = harness.events(session).await;
    assert_eq!(&after[..before.len()], &before[..]);
    assert_eq!(result_of(&after, "call_1_1/1").0, Outcome::Ok);
    assert_eq!(result_of(&after, "call_1_1/2").0, Outcome::Indeterminate);
    assert_eq!(result_of(&after, "call_1_1").0, Outcome::Indeterminate);
    projection::check_pairing(&projection::messages(&after)).unwrap();
    assert_eq!(
        harness.invocations(),
        vec![r#"read {"path":"a"}"#, "slow {}"],
        "nothing was replayed"
    );
}
