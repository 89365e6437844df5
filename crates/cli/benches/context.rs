//! Context benchmarks (issue: context is not history).
//!
//! 1. Tokens sent over a 50-step task with large tool outputs: keel's projection (previews,
//!    pruning, compaction in a 32k window) versus naive accumulation of every full result.
//!    Printed once, before the timings (a count, not a timing).
//! 2. Projection time per request as the session grows, with and without a compaction
//!    near the end: with one, the work depends on the retained window, not the history.
//!
//! Run: `cargo bench -p keel-cli --bench context`
#![allow(clippy::unwrap_used, clippy::print_stdout)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use keel_contracts::{
    Access, ApprovalMode, ApproxCounter, CarriedContext, ContextPolicy, Effects, Envelope,
    EventKind, ExecutionMode, FinishReason, ModelClient, ModelError, ModelInfo, ModelRequest,
    ModelResponse, PermissionAnswer, RequestPurpose, RuntimeEvent, SandboxMode, Seq, SessionId,
    StreamDelta, SystemClock, Tool, ToolCall, ToolCallId, ToolContext, ToolOutput, ToolSpec,
    UuidV7Ids, estimate_request_tokens,
};
use keel_kernel::context::{self, Window};
use keel_kernel::{
    Cancellation, Kernel, KernelDeps, NoopObserver, RunConfig, SessionConfig, StaticPermissions,
};
use keel_providers::ScriptedModel;

#[derive(Debug)]
struct Big(ToolSpec);

#[async_trait]
impl Tool for Big {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn invoke(&self, _context: &ToolContext, arguments: &serde_json::Value) -> ToolOutput {
        let bytes = usize::try_from(arguments["bytes"].as_u64().unwrap()).unwrap();
        ToolOutput::ok("0123456789abcdef\n".repeat(bytes / 17 + 1))
    }
}

#[derive(Debug)]
struct Counting {
    inner: ScriptedModel,
    sent: Arc<Mutex<u64>>,
}

#[async_trait]
impl ModelClient for Counting {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        *self.sent.lock().unwrap() += estimate_request_tokens(request, &ApproxCounter);
        self.inner.complete(request, on_delta).await
    }
}

fn tokens_sent_over_a_50_step_task() {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let sizes = [2_000, 40_000, 300_000, 5_000, 120_000];
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..50 {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"big","arguments":{{"bytes":{}}}}}]}},"#,
            sizes[step % sizes.len()]
        ));
    }
    json.push_str(r#"{"text":"done"}]}"#);
    let sent = Arc::new(Mutex::new(0));
    let model = Counting {
        inner: ScriptedModel::new(serde_json::from_str(&json).unwrap(), "bench"),
        sent: sent.clone(),
    };
    let store: Arc<keel_testkit::MemStore> = Arc::new(keel_testkit::MemStore::new());
    let spec = ToolSpec {
        name: "big".into(),
        description: "emits bytes".into(),
        parameters: serde_json::json!({"type":"object","properties":{"bytes":{"type":"integer"}}}),
        access: Access::Read,
        effects: Effects::LOCAL_READ,
        intrinsic: false,
        first_party: true,
    };
    let kernel = Kernel::new(KernelDeps {
        store: store.clone(),
        model: Arc::new(model),
        tools: vec![Arc::new(Big(spec))],
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(StaticPermissions(PermissionAnswer::AllowOnce)),
        observer: Arc::new(NoopObserver),
        counter: Arc::new(ApproxCounter),
    })
    .unwrap();
    let config = RunConfig {
        sandbox: SandboxMode::Bypass,
        approval: ApprovalMode::Auto,
        budget: Default::default(),
        price: None,
        context: ContextPolicy::for_window(Some(32_000)),
        instructions: Vec::new(),
        rules: Default::default(),
        cancel_poll: Duration::from_secs(3600),
        grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
        skills: keel_kernel::Skills::default(),
        output_schema: None,
    };
    let naive = runtime.block_on(async {
        let session = kernel
            .create_session(&SessionConfig {
                workspace: "/bench".into(),
                model_spec: "scripted:bench".into(),
                envelope: Envelope::executor(),
                mode: ExecutionMode::Live,
                base_url: None,
            })
            .await
            .unwrap();
        kernel.run_turn(session, "emit things", &config, &Cancellation::new()).await.unwrap();
        // Naive accumulation: every request carries every earlier full result.
        let events = keel_contracts::Store::read(store.as_ref(), session, Seq(0)).await.unwrap();
        let mut naive = 0;
        for index in 0..events.len() {
            if matches!(events[index].kind, EventKind::ModelRequested { .. }) {
                let messages = keel_kernel::projection::messages(&events[..index]);
                naive += keel_contracts::estimate_messages_tokens(&messages, &ApproxCounter);
            }
        }
        naive
    });
    let keel = *sent.lock().unwrap();
    println!(
        "tokens sent over a 50-step task (ApproxCounter): keel {keel}, naive accumulation {naive}, \
         ratio {:.1}x",
        naive as f64 / keel.max(1) as f64
    );
}

fn session(events_wanted: usize, compacted: bool) -> Vec<RuntimeEvent> {
    let session_id = SessionId(uuid::Uuid::nil());
    let mut events: Vec<RuntimeEvent> = Vec::new();
    let push = |events: &mut Vec<RuntimeEvent>, kind: EventKind| {
        let seq = Seq(events.len() as u64 + 1);
        events.push(RuntimeEvent {
            seq,
            session_id,
            turn_id: None,
            run_id: None,
            ts: chrono::DateTime::from_timestamp(0, 0).unwrap(),
            kind,
        });
    };
    push(&mut events, EventKind::TurnStarted { input: "the task".into() });
    let mut n = 0;
    while n * 2 + 1 < events_wanted {
        n += 1;
        let id = ToolCallId(format!("c{n}"));
        push(
            &mut events,
            EventKind::ModelResponse {
                text: format!("step {n}"),
                reasoning: Vec::new(),
                tool_calls: vec![ToolCall {
                    call_id: id.clone(),
                    name: "read_file".into(),
                    arguments: serde_json::json!({"path": format!("f{n}.rs")}),
                    arguments_error: None,
                }],
                usage: Default::default(),
                raw_usage: None,
                finish_reason: FinishReason::ToolCalls,
                cost_usd: None,
                estimated_usage: None,
                purpose: keel_contracts::RequestPurpose::Conversation,
            },
        );
        push(
            &mut events,
            EventKind::ToolResult {
                call_id: id,
                attempt_id: None,
                tool: "read_file".into(),
                outcome: keel_contracts::Outcome::Ok,
                content: "x".repeat(2_000),
                bytes: 2_000,
                raw: None,
            },
        );
    }
    if compacted {
        // A compaction covering all but the last 40 exchanges.
        let covers_to = Seq(events.len().saturating_sub(80) as u64);
        let covered = context::covered(&events, Seq(1), covers_to).unwrap().to_vec();
        let digest = context::digest_of(&covered);
        push(
            &mut events,
            EventKind::Compaction {
                covers_from: Seq(1),
                covers_to,
                digest,
                chain: None,
                responses_before: None,
                failures: None,
                summary: "summary".into(),
                carried: CarriedContext {
                    skills: Vec::new(),
                    inputs: vec!["the task".into()],
                    plan: None,
                    files: Vec::new(),
                },
                tokens_before: 0,
                tokens_after: 0,
            },
        );
    }
    events
}

fn projection_per_request(c: &mut Criterion) {
    tokens_sent_over_a_50_step_task();
    let mut group = c.benchmark_group("projection_per_request");
    group.sample_size(20);
    let policy = ContextPolicy::for_window(Some(32_000));
    for size in [1_000usize, 10_000, 50_000] {
        for compacted in [false, true] {
            let events = session(size, compacted);
            let mut verified = BTreeMap::new();
            // The digest of a compaction is checked once per run and cached.
            let _ = context::active_compaction(&events, &mut verified);
            let label = if compacted { "compacted" } else { "uncompacted" };
            group.bench_function(BenchmarkId::new(label, size), |b| {
                b.iter(|| {
                    let window = Window {
                        policy: &policy,
                        counter: &ApproxCounter,
                        fixed_tokens: 500,
                        scale: 1.0,
                    };
                    let entries = context::retained_entries(
                        &events,
                        policy.inline_limit_bytes,
                        &mut verified,
                    );
                    context::fit(entries, &window).tokens
                });
            });
        }
    }
    group.finish();
    let _ = RequestPurpose::Conversation;
}

criterion_group!(benches, projection_per_request);
criterion_main!(benches);
