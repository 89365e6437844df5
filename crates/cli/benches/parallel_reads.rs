//! Reads side by side: four slow reads proposed in one model response take about one
//! read's time, while four slow writes (run alone and in order) take four. Each tool sleeps
//! 100 ms; the ledger is the in-memory store, so the figures are the tools' time plus the
//! kernel's overhead.
//!
//! Run: `cargo bench -p keel-cli --bench parallel_reads`
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use keel_contracts::{
    Access, ApprovalMode, Effects, Envelope, ExecutionMode, PermissionAnswer, SandboxMode,
    SystemClock, Tool, ToolContext, ToolOutput, ToolSpec, UuidV7Ids,
};
use keel_kernel::{
    Cancellation, Kernel, KernelDeps, NoopObserver, RunConfig, SessionConfig, StaticPermissions,
};
use keel_providers::ScriptedModel;

/// How long each tool call takes.
const TOOL_TIME: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Slow(ToolSpec);

#[async_trait]
impl Tool for Slow {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        tokio::time::sleep(TOOL_TIME).await;
        ToolOutput::ok("ok")
    }
}

fn slow(name: &str, access: Access) -> Arc<dyn Tool> {
    Arc::new(Slow(ToolSpec {
        name: name.into(),
        description: "sleeps".into(),
        parameters: serde_json::json!({"type":"object","properties":{"path":{"type":"string"}}}),
        access,
        effects: match access {
            Access::Read => Effects::LOCAL_READ,
            Access::Write => Effects::LOCAL_WRITE,
        },
        intrinsic: false,
        first_party: true,
    }))
}

fn kernel(tool: &str, calls: usize) -> Kernel {
    let call = format!(r#"{{"name":"{tool}","arguments":{{"path":"a"}}}}"#);
    let calls = vec![call; calls].join(",");
    let json = format!(r#"{{"steps":[{{"tool_calls":[{calls}]}},{{"text":"done"}}]}}"#);
    // One script per session: the scripted model answers from the session's ledger.
    let model = ScriptedModel::new(serde_json::from_str(&json).unwrap(), "bench");
    Kernel::new(KernelDeps {
        store: Arc::new(keel_testkit::MemStore::new()),
        model: Arc::new(model),
        tools: vec![slow("slow_read", Access::Read), slow("slow_write", Access::Write)],
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(StaticPermissions(PermissionAnswer::AllowOnce)),
        observer: Arc::new(NoopObserver),
        counter: Arc::new(keel_contracts::ApproxCounter),
    })
    .unwrap()
}

fn run_config() -> RunConfig {
    RunConfig {
        sandbox: SandboxMode::Bypass,
        approval: ApprovalMode::Auto,
        budget: Default::default(),
        price: None,
        context: Default::default(),
        instructions: Vec::new(),
        rules: Default::default(),
        cancel_poll: Duration::from_secs(3600),
        grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
        skills: keel_kernel::Skills::default(),
        output_schema: None,
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("one_response_of_slow_calls");
    group.sample_size(10);
    for (label, tool, calls) in
        [("1_read", "slow_read", 1), ("4_reads", "slow_read", 4), ("4_writes", "slow_write", 4)]
    {
        let kernel = kernel(tool, calls);
        group.bench_function(BenchmarkId::from_parameter(label), |b| {
            b.to_async(&runtime).iter(|| async {
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
                kernel.run_turn(session, "go", &run_config(), &Cancellation::new()).await.unwrap()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
