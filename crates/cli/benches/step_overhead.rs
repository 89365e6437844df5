//! Kernel overhead per step: a scripted model and a no-op tool, on the durable SQLite
//! ledger (synchronous=FULL) and on the in-memory store, so the ledger's share is visible.
//!
//! Run: `cargo bench -p keel-cli --bench step_overhead`
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keel_contracts::{
    Access, ApprovalMode, Effects, Envelope, ExecutionMode, PermissionAnswer, SandboxMode, Store,
    SystemClock, Tool, ToolContext, ToolOutput, ToolSpec, UuidV7Ids,
};
use keel_kernel::{
    Cancellation, Kernel, KernelDeps, NoopObserver, RunConfig, SessionConfig, StaticPermissions,
};
use keel_providers::ScriptedModel;

#[derive(Debug)]
struct Noop(ToolSpec);

#[async_trait]
impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }
    async fn invoke(&self, _context: &ToolContext, _arguments: &serde_json::Value) -> ToolOutput {
        ToolOutput::ok("ok")
    }
}

fn script(steps: usize) -> ScriptedModel {
    let mut json = String::from(r#"{"steps":["#);
    for _ in 0..steps {
        json.push_str(r#"{"tool_calls":[{"name":"noop","arguments":{"path":"src/lib.rs"}}]},"#);
    }
    json.push_str(r#"{"text":"done"}]}"#);
    ScriptedModel::new(serde_json::from_str(&json).unwrap(), "bench")
}

fn kernel(store: Arc<dyn Store>, steps: usize) -> Kernel {
    let spec = ToolSpec {
        name: "noop".into(),
        description: "does nothing".into(),
        parameters: serde_json::json!({"type":"object","properties":{"path":{"type":"string"}}}),
        access: Access::Read,
        effects: Effects::LOCAL_READ,
        intrinsic: false,
        first_party: true,
    };
    Kernel::new(KernelDeps {
        store,
        model: Arc::new(script(steps)),
        tools: vec![Arc::new(Noop(spec))],
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
    let steps = 20;
    let mut group = c.benchmark_group("turn_of_20_steps");
    group.throughput(Throughput::Elements(steps as u64));
    group.sample_size(20);
    let dir = tempfile::tempdir().unwrap();
    let stores: Vec<(&str, Arc<dyn Store>)> = vec![
        (
            "sqlite",
            Arc::new(keel_store::SqliteStore::open(dir.path().join("bench.sqlite")).unwrap()),
        ),
        ("memory", Arc::new(keel_testkit::MemStore::new())),
    ];
    for (name, store) in stores {
        let kernel = kernel(store, steps);
        group.bench_function(BenchmarkId::from_parameter(name), |b| {
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
