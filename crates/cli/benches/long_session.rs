//! Step cost over a long session (issue #13): a scripted session of many steps through the
//! real kernel on the real `SqliteStore` (WAL, `synchronous=FULL`, a file on disk).
//!
//! 1. Step time at step N: the time between consecutive model calls (projection, gate,
//!    prepare, invoke, result and every append of the step), median of steps 50–250 versus
//!    the median of the last 200, with an unknown context window and with a known one.
//! 2. Peak RSS (`VmHWM` of `/proc/self/status`) after N steps, each size in its own
//!    process (this binary re-executes itself) so peaks do not mix.
//!
//! Run: `cargo bench -p keel-cli --bench long_session`
//! Sizes: `KEEL_BENCH_STEPS` (default 10000) for the step times, `KEEL_BENCH_RSS_STEPS`
//! (default `1000,20000`) for the peaks, `KEEL_BENCH_RSS_WINDOW` (tokens; default unknown)
//! for the peaks' window. A plain `harness = false` binary: criterion's
//! repeated iterations are the wrong shape for "the time of step N".
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_contracts::{
    Access, ApprovalMode, ContextPolicy, Effects, Envelope, ExecutionMode, ModelClient, ModelError,
    ModelInfo, ModelRequest, ModelResponse, PermissionAnswer, RequestPurpose, SandboxMode, Store,
    StreamDelta, SystemClock, Tool, ToolContext, ToolOutput, ToolSpec, UuidV7Ids,
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
        ToolOutput::ok("fn main() { println!(\"hello\"); }\n".repeat(4))
    }
}

/// Records when each conversation request reached the model.
#[derive(Debug)]
struct Timed {
    inner: ScriptedModel,
    at: Arc<Mutex<Vec<Instant>>>,
    summaries: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait]
impl ModelClient for Timed {
    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        if request.purpose == RequestPurpose::Conversation {
            self.at.lock().unwrap().push(Instant::now());
        } else {
            self.summaries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.complete(request, on_delta).await
    }
}

fn script(steps: usize) -> ScriptedModel {
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..steps {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"noop","arguments":{{"path":"src/f{}.rs"}}}}]}},"#,
            step % 50
        ));
    }
    json.push_str(r#"{"text":"done"}]}"#);
    ScriptedModel::new(serde_json::from_str(&json).unwrap(), "bench")
}

/// Runs one turn of `steps` tool steps on a fresh SQLite ledger; returns the instants of
/// the conversation model calls and the number of summary (compaction) calls.
fn run(steps: usize, window: Option<u64>) -> (Vec<Instant>, u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(keel_store::SqliteStore::open(dir.path().join("long.sqlite")).unwrap());
    let at = Arc::new(Mutex::new(Vec::with_capacity(steps + 1)));
    let summaries = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let spec = ToolSpec {
        name: "noop".into(),
        description: "returns a small file".into(),
        parameters: serde_json::json!({"type":"object","properties":{"path":{"type":"string"}}}),
        access: Access::Read,
        effects: Effects::LOCAL_READ,
        intrinsic: false,
        first_party: true,
    };
    let kernel = Kernel::new(KernelDeps {
        store,
        model: Arc::new(Timed {
            inner: script(steps),
            at: at.clone(),
            summaries: summaries.clone(),
        }),
        tools: vec![Arc::new(Noop(spec))],
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(StaticPermissions(PermissionAnswer::AllowOnce)),
        observer: Arc::new(NoopObserver),
        counter: Arc::new(keel_contracts::ApproxCounter),
    })
    .unwrap();
    let config = RunConfig {
        sandbox: SandboxMode::Bypass,
        approval: ApprovalMode::Auto,
        budget: Default::default(),
        price: None,
        context: ContextPolicy::for_window(window),
        instructions: Vec::new(),
        rules: Default::default(),
        cancel_poll: Duration::from_secs(3600),
        grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
    };
    runtime.block_on(async {
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
        let report =
            kernel.run_turn(session, "work for a long time", &config, &Cancellation::new()).await;
        let report = report.unwrap();
        assert!(
            matches!(report.outcome, keel_kernel::TurnOutcome::Completed { .. }),
            "{:?}",
            report.outcome
        );
    });
    let at = at.lock().unwrap().clone();
    (at, summaries.load(std::sync::atomic::Ordering::Relaxed))
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values.get(values.len() / 2).copied().unwrap_or_default()
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn step_times(steps: usize, window: Option<u64>) {
    let started = Instant::now();
    let (at, summaries) = run(steps, window);
    // Step i (1-based) is the time from model call i to model call i + 1.
    let durations: Vec<Duration> = at.windows(2).map(|pair| pair[1] - pair[0]).collect();
    let early = median(durations[49.min(durations.len())..250.min(durations.len())].to_vec());
    let late = median(durations[durations.len().saturating_sub(200)..].to_vec());
    let label = window.map_or_else(|| "unknown".to_owned(), |w| format!("{w} tokens"));
    println!(
        "long_session/step_time window={label} steps={steps}: median steps 50-250 {early:.2?}, \
         median last 200 {late:.2?}, ratio {:.2}x (whole run {:.1?}, {summaries} summary calls)",
        late.as_secs_f64() / early.as_secs_f64().max(1e-9),
        started.elapsed()
    );
}

fn main() {
    // `KEEL_BENCH_RSS_WINDOW`: the window of the peak-RSS children (default unknown). With
    // a known window the session compacts, and the in-memory ledger drops what is covered.
    let rss_window: Option<u64> =
        std::env::var("KEEL_BENCH_RSS_WINDOW").ok().and_then(|s| s.parse().ok());
    if let Ok(steps) = std::env::var("KEEL_BENCH_CHILD_STEPS") {
        let steps: usize = steps.parse().unwrap();
        let _ = run(steps, rss_window);
        println!("{}", vm_hwm_kib());
        return;
    }
    // `cargo bench` passes `--bench`; a filter argument other than flags is ignored.
    let steps: usize =
        std::env::var("KEEL_BENCH_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let rss_sizes: Vec<usize> = std::env::var("KEEL_BENCH_RSS_STEPS")
        .unwrap_or_else(|_| "1000,20000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    // `KEEL_BENCH_WINDOWS`: `unknown`, `known` or both (the default).
    let windows = std::env::var("KEEL_BENCH_WINDOWS").unwrap_or_else(|_| "unknown,known".into());
    if steps > 0 {
        if windows.contains("unknown") {
            step_times(steps, None);
        }
        if windows.split(',').any(|w| w.trim() == "known") {
            step_times(steps, Some(32_000));
        }
    }
    let exe = std::env::current_exe().unwrap();
    let mut peaks = Vec::new();
    for size in &rss_sizes {
        let started = Instant::now();
        let output = std::process::Command::new(&exe)
            .env("KEEL_BENCH_CHILD_STEPS", size.to_string())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let kib: u64 = String::from_utf8_lossy(&output.stdout).trim().parse().unwrap();
        println!(
            "long_session/peak_rss steps={size} window={}: VmHWM {:.1} MiB ({:.1?})",
            rss_window.map_or_else(|| "unknown".to_owned(), |w| format!("{w} tokens")),
            kib as f64 / 1024.0,
            started.elapsed()
        );
        peaks.push(kib);
    }
    if let (Some(first), Some(last)) = (peaks.first(), peaks.last())
        && peaks.len() > 1
    {
        println!("long_session/peak_rss ratio last/first {:.2}x", *last as f64 / *first as f64);
    }
}
