//! The `otlp` sink against a loopback OTLP/HTTP collector that decodes the protobuf it
//! receives: exact GenAI span names, attributes, parents and links; no content unless the
//! sink opts in; a collector outage (and a restart of the process) after which every span
//! arrives once, in order; a resumed run that never shows an execution it did not make.
//! The collector and the ledgers are in `support::collector` and `support::ledger`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use keel_contracts::{
    AttemptId, EventKind, FinishReason, Lineage, Outcome, RunId, Seq, SessionId, ToolCallId,
    TurnId, UsageTotals,
};
use keel_outbox::Mirror;
use keel_testkit::{FakeClock, MemStore};
use opentelemetry_proto::tonic::metrics::v1::metric;
use opentelemetry_proto::tonic::trace::v1::Span;

use super::support::collector::{
    Collector, attributes, deliver_all, expected, hex, names, otlp_sink,
};
use super::support::ledger::{ATTEMPT, Ledger, RUN, SESSION, TURN, call, id, one_run, usage};
use super::support::{eventually, fast_config, store_arc};

#[tokio::test]
async fn spans_follow_the_genai_conventions_with_exact_attributes_and_parents() {
    let collector = deliver_all(&one_run(), 100, "").await;
    let spans = collector.spans();
    assert_eq!(
        names(&spans),
        ["chat gpt-4o", "execute_tool read_file", "chat gpt-4o", "invoke_agent"],
        "in the order their closing events were recorded"
    );
    let run = RunId(id(RUN));
    let agent = &spans[3];
    for span in &spans {
        assert_eq!(span.trace_id, run.0.as_bytes().to_vec(), "one trace per run: the run id");
        assert_eq!(span.span_id.len(), 8);
    }
    assert!(agent.parent_span_id.is_empty(), "invoke_agent is the root");
    for child in &spans[..3] {
        assert_eq!(hex(&child.parent_span_id), hex(&agent.span_id), "{}", child.name);
    }
    let ids: BTreeSet<Vec<u8>> = spans.iter().map(|span| span.span_id.clone()).collect();
    assert_eq!(ids.len(), 4, "distinct span ids");

    let session = id(SESSION).to_string();
    let run_text = run.to_string();
    let turn_text = id(TURN).to_string();
    let chat = &spans[0];
    assert_eq!(chat.kind, 3, "CLIENT");
    assert_eq!(
        attributes(&chat.attributes),
        expected(&[
            ("gen_ai.operation.name", "chat"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "gpt-4o"),
            ("gen_ai.conversation.id", &session),
            ("gen_ai.response.finish_reasons", "[tool_calls]"),
            ("gen_ai.usage.input_tokens", "100"),
            ("gen_ai.usage.output_tokens", "27"),
            ("gen_ai.usage.cache_read.input_tokens", "60"),
            ("gen_ai.usage.reasoning.output_tokens", "7"),
            ("keel.model.step", "1"),
            ("keel.run.id", &run_text),
        ])
    );
    // model_requested at seq 5, model_response at seq 6: one second.
    assert_eq!(chat.end_time_unix_nano - chat.start_time_unix_nano, 1_000_000_000);

    let tool = &spans[1];
    assert_eq!(tool.kind, 1, "INTERNAL");
    assert_eq!(
        attributes(&tool.attributes),
        expected(&[
            ("gen_ai.operation.name", "execute_tool"),
            ("gen_ai.tool.name", "read_file"),
            ("gen_ai.tool.call.id", "call_1"),
            ("gen_ai.tool.type", "function"),
            ("gen_ai.conversation.id", &session),
            ("keel.tool.outcome", "ok"),
            ("keel.tool.attempt.id", &id(ATTEMPT).to_string()),
            ("keel.run.id", &run_text),
        ])
    );
    assert_eq!(tool.status.as_ref().unwrap().code, 0, "unset: ok");

    assert_eq!(
        attributes(&agent.attributes),
        expected(&[
            ("gen_ai.operation.name", "invoke_agent"),
            ("gen_ai.provider.name", "openai"),
            ("gen_ai.request.model", "gpt-4o"),
            ("gen_ai.conversation.id", &session),
            ("gen_ai.usage.input_tokens", "250"),
            ("gen_ai.usage.output_tokens", "32"),
            ("gen_ai.usage.cache_read.input_tokens", "60"),
            ("gen_ai.usage.reasoning.output_tokens", "7"),
            ("keel.run.outcome", "completed"),
            ("keel.run.id", &run_text),
            ("keel.turn.id", &turn_text),
        ])
    );
    // The refused call did not run: an event of the run, not an execute_tool span.
    assert_eq!(agent.events.len(), 1);
    assert_eq!(agent.events[0].name, "keel.tool_call.not_executed");
    assert_eq!(
        attributes(&agent.events[0].attributes),
        expected(&[
            ("gen_ai.tool.name", "bash"),
            ("gen_ai.tool.call.id", "call_2"),
            ("keel.tool.outcome", "refused"),
        ])
    );
    // No content by default: not in any attribute, event or byte sent.
    for body in collector.raw.lock().unwrap().iter() {
        assert!(!String::from_utf8_lossy(body).contains("SECRET"), "content was exported");
    }

    let metrics = collector.metrics.lock().unwrap().clone();
    let mut points = BTreeMap::new();
    for metric in metrics
        .iter()
        .flat_map(|request| &request.resource_metrics)
        .flat_map(|resource| &resource.scope_metrics)
        .flat_map(|scope| &scope.metrics)
    {
        let Some(metric::Data::Histogram(histogram)) = &metric.data else {
            panic!("{} is not a histogram", metric.name)
        };
        assert_eq!(histogram.aggregation_temporality, 1, "delta");
        for point in &histogram.data_points {
            let attrs = attributes(&point.attributes);
            let key = format!(
                "{} {} {}",
                metric.name,
                attrs["gen_ai.operation.name"],
                attrs
                    .get("gen_ai.token.type")
                    .or(attrs.get("gen_ai.tool.name"))
                    .cloned()
                    .unwrap_or_default()
            );
            points.insert(key, (point.count, point.sum.unwrap()));
        }
        assert_eq!(metric.unit, if metric.name.contains("token") { "{token}" } else { "s" });
    }
    assert_eq!(
        points,
        BTreeMap::from([
            ("gen_ai.client.operation.duration chat ".to_owned(), (2, 2.0)),
            ("gen_ai.client.operation.duration execute_tool read_file".to_owned(), (1, 1.0)),
            ("gen_ai.client.token.usage chat input".to_owned(), (2, 250.0)),
            ("gen_ai.client.token.usage chat output".to_owned(), (2, 32.0)),
        ])
    );
}

#[tokio::test]
async fn content_is_exported_only_when_the_sink_opts_in() {
    let collector = deliver_all(&one_run(), 100, "capture_content = true").await;
    let spans = collector.spans();
    let chat = attributes(&spans[0].attributes);
    let output: serde_json::Value = serde_json::from_str(&chat["gen_ai.output.messages"]).unwrap();
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["parts"][0]["content"], "SECRET-TEXT let me look");
    assert_eq!(output[0]["parts"][1]["name"], "read_file");
    assert_eq!(output[0]["finish_reason"], "tool_calls");
    let tool = attributes(&spans[1].attributes);
    assert_eq!(tool["gen_ai.tool.call.arguments"], r#"{"path":"SECRET-ARG.txt"}"#);
    assert_eq!(tool["gen_ai.tool.call.result"], "SECRET-RESULT contents");
    let agent = attributes(&spans[3].attributes);
    assert!(agent["gen_ai.input.messages"].contains("SECRET-INPUT fix the bug"), "{agent:?}");
    assert!(agent["gen_ai.output.messages"].contains("done SECRET-ANSWER"), "{agent:?}");
    assert!(agent["gen_ai.system_instructions"].contains("SECRET-SYSTEM prompt"), "{agent:?}");
}

#[tokio::test]
async fn small_batches_and_fresh_sinks_yield_the_same_spans() {
    let whole = deliver_all(&one_run(), 100, "").await.spans();
    assert_eq!(whole.len(), 4);
    // Small batches: spans start in one batch and end in another.
    for max_batch in [1, 2, 3, 5, 7] {
        let split = deliver_all(&one_run(), max_batch, "").await.spans();
        assert_eq!(whole, split, "max_batch = {max_batch}");
    }
}

#[tokio::test]
async fn after_a_collector_outage_and_a_restart_each_span_arrives_once_in_order() {
    let ledger = one_run();
    let expected_spans = deliver_all(&ledger, 100, "").await.spans();

    let (collector, address) = Collector::start().await;
    let store = MemStore::new();
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(FakeClock::new());
    let cursor_dir = dir.path().join("outbox");
    let first = Mirror::from_config(
        store_arc(&store),
        &[otlp_sink(address, 3, "")],
        fast_config(&cursor_dir, clock.clone()),
    )
    .unwrap();
    // The first chat closes in events 1..=8; they go through.
    ledger.store(&store, 1..=8).await;
    assert!(first.flush(ledger.session_id).await.is_empty());
    assert_eq!(names(&collector.spans()), ["chat gpt-4o"]);

    // The collector goes down for the rest of the run.
    collector.set_down(true);
    ledger.store(&store, 9..=ledger.seq).await;
    let lags = first.flush(ledger.session_id).await;
    assert_eq!(lags.len(), 1, "{lags:?}");
    assert_eq!(lags[0].delivered, Seq(8));
    assert!(lags[0].error.contains("503"), "{}", lags[0].error);
    assert!(*collector.refused.lock().unwrap() >= 1);
    drop(first);

    // It comes back; a new process (a new sink, nothing cached) catches up.
    collector.set_down(false);
    let second = Mirror::from_config(
        store_arc(&store),
        &[otlp_sink(address, 3, "")],
        fast_config(&cursor_dir, clock),
    )
    .unwrap();
    eventually("the rest of the spans", || collector.spans().len() >= 4).await;
    assert!(second.flush(ledger.session_id).await.is_empty());
    let spans = collector.spans();
    assert_eq!(spans, expected_spans, "same spans, same ids, in order, each once");
    let ids: BTreeSet<Vec<u8>> = spans.iter().map(|span| span.span_id.clone()).collect();
    assert_eq!(ids.len(), spans.len());
}

#[tokio::test]
async fn a_resumed_run_never_shows_an_execution_it_did_not_attempt() {
    let (turn, crashed, resumed) = (TurnId(id(TURN)), RunId(id(30)), RunId(id(31)));
    let (bash, write) = (AttemptId(id(40)), AttemptId(id(41)));
    let mut ledger = Ledger::new(SessionId(id(SESSION)), "openai:gpt-4o", None);
    ledger.push(Some(turn), None, EventKind::TurnStarted { input: "go".into() });
    ledger.run_started(turn, crashed, None);
    ledger.requested(turn, crashed, 1);
    ledger.response(
        turn,
        crashed,
        "",
        vec![
            call("call_b", "bash", serde_json::json!({"command": "make"})),
            call("call_w", "write_file", serde_json::json!({"path": "x"})),
        ],
        usage(10, 2, None, None),
        FinishReason::ToolCalls,
    );
    ledger.prepared(turn, crashed, "call_b", bash, "bash");
    // The process dies while bash runs and write_file waits for consent. Recovery answers
    // bash `indeterminate` and closes the run; write_file stays open for the next run.
    ledger.result(
        turn,
        crashed,
        "call_b",
        Some(bash),
        "bash",
        Outcome::Indeterminate,
        "indeterminate",
    );
    ledger.push(
        Some(turn),
        Some(crashed),
        EventKind::RunFailed {
            reason: "interrupted".into(),
            usage: UsageTotals::default(),
            answer: None,
            duration_ms: None,
        },
    );
    // `keel resume`: a new run asks again for write_file, runs it, and answers.
    ledger.run_started(turn, resumed, Some(crashed));
    ledger.prepared(turn, resumed, "call_w", write, "write_file");
    ledger.result(turn, resumed, "call_w", Some(write), "write_file", Outcome::Ok, "wrote x");
    ledger.requested(turn, resumed, 1);
    ledger.response(turn, resumed, "done", vec![], usage(20, 1, None, None), FinishReason::Stop);
    ledger.push(
        Some(turn),
        Some(resumed),
        EventKind::RunCompleted {
            reason: "answered".into(),
            usage: UsageTotals::default(),
            answer: None,
            duration_ms: None,
        },
    );

    let spans = deliver_all(&ledger, 100, "").await.spans();
    let in_trace = |run: RunId| -> Vec<&Span> {
        spans.iter().filter(|span| span.trace_id == run.0.as_bytes().to_vec()).collect()
    };
    let crashed_spans = in_trace(crashed);
    let resumed_spans = in_trace(resumed);
    assert_eq!(
        crashed_spans.iter().map(|span| span.name.as_str()).collect::<Vec<_>>(),
        ["chat gpt-4o", "execute_tool bash", "invoke_agent"]
    );
    let indeterminate = crashed_spans[1];
    let attrs = attributes(&indeterminate.attributes);
    assert_eq!(attrs["error.type"], "indeterminate");
    assert_eq!(attrs["keel.tool.outcome"], "indeterminate");
    assert_eq!(indeterminate.status.as_ref().unwrap().code, 2, "error");
    assert_eq!(
        indeterminate.end_time_unix_nano, indeterminate.start_time_unix_nano,
        "an unknown end claims no duration"
    );
    assert_eq!(attributes(&crashed_spans[2].attributes)["error.type"], "failed");
    assert_eq!(
        resumed_spans.iter().map(|span| span.name.as_str()).collect::<Vec<_>>(),
        ["execute_tool write_file", "chat gpt-4o", "invoke_agent"],
        "bash was not attempted again, so the resumed run shows no execution of it"
    );
    let agent = resumed_spans[2];
    assert_eq!(agent.links.len(), 1);
    assert_eq!(agent.links[0].trace_id, crashed.0.as_bytes().to_vec());
    assert_eq!(hex(&agent.links[0].span_id), hex(&crashed_spans[2].span_id));
    assert_eq!(attributes(&agent.attributes)["keel.run.resumes"], crashed.to_string());
    let bash_spans = spans.iter().filter(|span| span.name == "execute_tool bash").count();
    assert_eq!(bash_spans, 1);
}

#[tokio::test]
async fn a_sub_agent_run_is_its_own_trace_linked_to_the_parent_call() {
    let (turn, run) = (TurnId(id(TURN)), RunId(id(RUN)));
    let mut parent = Ledger::new(SessionId(id(SESSION)), "openai:gpt-4o", None);
    parent.push(Some(turn), None, EventKind::TurnStarted { input: "delegate".into() });
    parent.run_started(turn, run, None);
    parent.requested(turn, run, 1);
    parent.response(
        turn,
        run,
        "",
        vec![call("call_spawn", "spawn_agent", serde_json::json!({"task": "t"}))],
        usage(10, 2, None, None),
        FinishReason::ToolCalls,
    );
    parent.prepared(turn, run, "call_spawn", AttemptId(id(50)), "spawn_agent");
    parent.result(
        turn,
        run,
        "call_spawn",
        Some(AttemptId(id(50))),
        "spawn_agent",
        Outcome::Ok,
        "ok",
    );

    let (child_turn, child_run) = (TurnId(id(60)), RunId(id(61)));
    let mut child = Ledger::new(
        SessionId(id(62)),
        "openai:gpt-4o",
        Some(Lineage {
            parent_session_id: SessionId(id(SESSION)),
            parent_run_id: run,
            parent_turn_id: turn,
            parent_call_id: ToolCallId::from("call_spawn"),
        }),
    );
    child.push(Some(child_turn), None, EventKind::TurnStarted { input: "t".into() });
    child.run_started(child_turn, child_run, None);
    child.requested(child_turn, child_run, 1);
    child.response(
        child_turn,
        child_run,
        "done",
        vec![],
        usage(5, 1, None, None),
        FinishReason::Stop,
    );
    child.push(
        Some(child_turn),
        Some(child_run),
        EventKind::RunCompleted {
            reason: "answered".into(),
            usage: UsageTotals::default(),
            answer: None,
            duration_ms: None,
        },
    );

    let parent_spans = deliver_all(&parent, 100, "").await.spans();
    let parent_call =
        parent_spans.iter().find(|span| span.name == "execute_tool spawn_agent").unwrap();
    let child_spans = deliver_all(&child, 100, "").await.spans();
    let agent = child_spans.iter().find(|span| span.name == "invoke_agent").unwrap();
    assert_eq!(agent.trace_id, child_run.0.as_bytes().to_vec(), "its own trace");
    assert!(agent.parent_span_id.is_empty());
    assert_eq!(agent.links.len(), 1);
    assert_eq!(agent.links[0].trace_id, parent_call.trace_id);
    assert_eq!(hex(&agent.links[0].span_id), hex(&parent_call.span_id));
    assert_eq!(attributes(&agent.links[0].attributes)["keel.link.type"], "parent_call");
    let attrs = attributes(&agent.attributes);
    assert_eq!(attrs["keel.parent.session_id"], id(SESSION).to_string());
    assert_eq!(attrs["keel.parent.call_id"], "call_spawn");
    assert_eq!(attrs["gen_ai.conversation.id"], id(62).to_string());
}

#[tokio::test]
async fn redteam_otlp_headers_reach_the_collector_and_never_an_error_or_the_cursor() {
    let (collector, address) = Collector::start().await;
    collector.set_down(true);
    let store = MemStore::new();
    let ledger = one_run();
    ledger.store(&store, 1..=ledger.seq).await;
    let dir = tempfile::tempdir().unwrap();
    let cursor_dir = dir.path().join("outbox");
    let mut config = fast_config(&cursor_dir, Arc::new(FakeClock::new()));
    config.otlp_env.headers = Some("x-env-key=env-hunter2".into());
    let table = otlp_sink(address, 100, "headers = { authorization = \"Bearer table-hunter2\" }");
    let mirror = Mirror::from_config(store_arc(&store), &[table], config).unwrap();
    let lags = mirror.flush(ledger.session_id).await;
    assert_eq!(lags.len(), 1);
    let shown = format!("{lags:?} {mirror:?}");
    assert!(!shown.contains("hunter2"), "{shown}");
    let cursor = std::fs::read_to_string(cursor_dir.join("traces.json")).unwrap();
    assert!(!cursor.contains("hunter2"), "{cursor}");
    // The legitimate use: the collector got both headers.
    let headers = collector.headers.lock().unwrap().clone();
    let first = &headers[0];
    assert_eq!(first["authorization"], "Bearer table-hunter2");
    assert_eq!(first["x-env-key"], "env-hunter2");
    assert_eq!(first["content-type"], "application/x-protobuf");
    collector.set_down(false);
    assert!(mirror.flush(ledger.session_id).await.is_empty());
    assert_eq!(collector.spans().len(), 4);
}
