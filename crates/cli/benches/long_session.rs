//! Step cost over a long session (issue #13): a scripted session of many steps through the
//! real kernel on the real `SqliteStore` (WAL, `synchronous=FULL`, a file on disk).
//!
//! 1. Step time at step N: the time between consecutive model calls (projection, gate,
//!    prepare, invoke, result and every append of the step), median of steps 50–250 versus
//!    the median of the last 200, with an unknown context window (the kernel's 128 000-token
//!    default) and with a known one (32 000 tokens). Both as wall time and as the process's
//!    CPU time over the same interval (`CLOCK_PROCESS_CPUTIME_ID`, every thread: the work a
//!    step does, without the fsync waits and the other processes' load that swing the wall
//!    time on a shared machine).
//! 2. Peak RSS (`VmHWM` of `/proc/self/status`) after N steps, unknown window.
//!
//! The model is generated per request ([`Generated`]), not a parsed script of N replies:
//! a script holds ~1 KiB a step, which the peak of a 20 000-step session measured as
//! keel's growth (docs/decisions.md, "Peak memory of a long session").
//!
//! Every measurement runs in its own child process (this binary re-executes itself), once
//! per allocator: glibc's `malloc` and mimalloc, chosen at the child's first allocation by
//! `KEEL_BENCH_ALLOCATOR`, and interleaved so both see the same load.
//!
//! Run: `cargo bench -p keel-cli --bench long_session`
//! Sizes: `KEEL_BENCH_STEPS` (default 10000) for the step times, `KEEL_BENCH_RSS_STEPS`
//! (default `1000,20000`) for the peaks; `KEEL_BENCH_WINDOWS=unknown|known` runs one mode,
//! `KEEL_BENCH_ALLOCATORS=glibc|mimalloc` one allocator, `KEEL_BENCH_RSS_WINDOW` (tokens;
//! default unknown) the peaks' window (with a known window the session compacts, and the
//! in-memory ledger drops what is covered). A plain `harness = false` binary:
//! criterion's repeated iterations are the wrong shape for "the time of step N".
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

/// The allocator of this process, chosen once, at its first allocation (before `main`),
/// from `KEEL_BENCH_ALLOCATOR` (`mimalloc`, or glibc's `malloc` otherwise): every block is
/// freed by the allocator that made it.
#[allow(unsafe_code)]
mod allocator {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::sync::atomic::{AtomicU8, Ordering};

    use mimalloc::MiMalloc;

    /// 0: not chosen yet, 1: glibc, 2: mimalloc.
    static CHOICE: AtomicU8 = AtomicU8::new(0);

    /// Whether this process allocates with mimalloc.
    pub(crate) fn mimalloc() -> bool {
        let choice = CHOICE.load(Ordering::Relaxed);
        if choice != 0 {
            return choice == 2;
        }
        // SAFETY: `getenv` reads the environment without allocating; the name is a valid C
        // string, and the result, when not null, is a C string owned by the environment.
        let value = unsafe { libc::getenv(c"KEEL_BENCH_ALLOCATOR".as_ptr()) };
        let mimalloc = !value.is_null()
            // SAFETY: see above.
            && unsafe { std::ffi::CStr::from_ptr(value) }.to_bytes() == b"mimalloc";
        // Threads racing here read the same environment and store the same choice.
        CHOICE.store(if mimalloc { 2 } else { 1 }, Ordering::Relaxed);
        mimalloc
    }

    #[derive(Debug)]
    pub(crate) struct Switch;

    // SAFETY: every call is forwarded to one allocator, the same for the whole process.
    unsafe impl GlobalAlloc for Switch {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe { if mimalloc() { MiMalloc.alloc(layout) } else { System.alloc(layout) } }
        }
        unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
            // SAFETY: forwarded with the caller's guarantees.
            unsafe {
                if mimalloc() { MiMalloc.alloc_zeroed(layout) } else { System.alloc_zeroed(layout) }
            }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: `ptr` came from the same allocator (the choice never changes).
            unsafe {
                if mimalloc() { MiMalloc.dealloc(ptr, layout) } else { System.dealloc(ptr, layout) }
            }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            // SAFETY: `ptr` came from the same allocator (the choice never changes).
            unsafe {
                if mimalloc() {
                    MiMalloc.realloc(ptr, layout, new_size)
                } else {
                    System.realloc(ptr, layout, new_size)
                }
            }
        }
    }
}

#[global_allocator]
static GLOBAL: allocator::Switch = allocator::Switch;

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

/// The CPU time this process (all its threads) has used so far.
#[allow(unsafe_code)]
fn process_cpu_time() -> Duration {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid, writable timespec; the clock id is a constant Linux knows.
    let status = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &raw mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_PROCESS_CPUTIME_ID) failed");
    Duration::new(u64::try_from(now.tv_sec).unwrap(), u32::try_from(now.tv_nsec).unwrap())
}

/// When each conversation request reached the model: wall clock, process CPU time.
type Instants = Arc<Mutex<Vec<(Instant, Duration)>>>;

/// Records when each conversation request reached the model: the wall-clock instant and
/// the process's CPU time, when `at` is given (the step-time run; the peak-RSS run keeps
/// no per-step record, so its peak is keel's).
#[derive(Debug)]
struct Timed {
    inner: Generated,
    at: Option<Instants>,
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
            if let Some(at) = &self.at {
                at.lock().unwrap().push((Instant::now(), process_cpu_time()));
            }
        } else {
            self.summaries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.inner.complete(request, on_delta).await
    }
}

/// The bench's model: answers step `n` (the request's `responses_in_session`) with the
/// reply a script of `steps` steps would give (`step n` and one call of `noop` on
/// `src/f{n % 50}.rs`, id `call_{n + 1}_1`), then `done`; summaries as `ScriptedModel`.
/// Generated per request, so the bench holds no script of `steps` replies: a parsed
/// `ScriptedModel` script costs ~1 KiB a step (20 MiB at 20 000 steps), which is the
/// bench's memory, not keel's (docs/decisions.md, "Peak memory of a long session").
#[derive(Debug)]
struct Generated {
    steps: usize,
    summaries: ScriptedModel,
}

impl Generated {
    fn new(steps: usize) -> Generated {
        let script = serde_json::from_str(r#"{"steps":[]}"#).unwrap();
        Generated { steps, summaries: ScriptedModel::new(script, "bench") }
    }
}

#[async_trait]
impl ModelClient for Generated {
    fn info(&self) -> ModelInfo {
        self.summaries.info()
    }
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        if request.purpose != RequestPurpose::Conversation {
            return self.summaries.complete(request, on_delta).await;
        }
        let position = usize::try_from(request.responses_in_session).unwrap();
        let (text, tool_calls) = if position < self.steps {
            on_delta(StreamDelta::Text(format!("step {position}")));
            on_delta(StreamDelta::ToolCallStarted { name: "noop".into() });
            let call = keel_contracts::ToolCall {
                call_id: keel_contracts::ToolCallId(format!("call_{}_1", position + 1)),
                name: "noop".into(),
                arguments: serde_json::json!({"path": format!("src/f{}.rs", position % 50)}),
                arguments_error: None,
            };
            (format!("step {position}"), vec![call])
        } else {
            on_delta(StreamDelta::Text("done".into()));
            ("done".to_owned(), Vec::new())
        };
        let finish_reason = if tool_calls.is_empty() {
            keel_contracts::FinishReason::Stop
        } else {
            keel_contracts::FinishReason::ToolCalls
        };
        Ok(ModelResponse {
            text,
            reasoning: Vec::new(),
            tool_calls,
            usage: keel_contracts::Usage::default(),
            raw_usage: None,
            finish_reason,
        })
    }
}

/// Runs one turn of `steps` tool steps on a fresh SQLite ledger; returns the instants of
/// the conversation model calls (wall clock, process CPU time; empty unless `timed`) and
/// the number of summary (compaction) calls.
fn run(steps: usize, window: Option<u64>, timed: bool) -> (Vec<(Instant, Duration)>, u64) {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let store: Arc<dyn Store> =
        Arc::new(keel_store::SqliteStore::open(dir.path().join("long.sqlite")).unwrap());
    let at = timed.then(|| Arc::new(Mutex::new(Vec::with_capacity(steps + 1))));
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
            inner: Generated::new(steps),
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
        skills: keel_kernel::Skills::default(),
        output_schema: None,
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
    let at = at.map(|at| at.lock().unwrap().clone()).unwrap_or_default();
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
    let (at, summaries) = run(steps, window, true);
    // Step i (1-based) is the time from model call i to model call i + 1.
    let wall: Vec<Duration> = at.windows(2).map(|pair| pair[1].0 - pair[0].0).collect();
    let cpu: Vec<Duration> = at.windows(2).map(|pair| pair[1].1 - pair[0].1).collect();
    let early_late = |durations: &[Duration]| {
        let early = median(durations[49.min(durations.len())..250.min(durations.len())].to_vec());
        let late = median(durations[durations.len().saturating_sub(200)..].to_vec());
        (early, late, late.as_secs_f64() / early.as_secs_f64().max(1e-9))
    };
    let (early, late, ratio) = early_late(&wall);
    let (early_cpu, late_cpu, ratio_cpu) = early_late(&cpu);
    let label = window.map_or_else(|| "unknown".to_owned(), |w| format!("{w} tokens"));
    let allocator = if allocator::mimalloc() { "mimalloc" } else { "glibc" };
    println!(
        "long_session/step_time alloc={allocator} window={label} steps={steps}: median steps \
         50-250 {early:.2?}, median last 200 {late:.2?}, ratio {ratio:.2}x; CPU {early_cpu:.2?} \
         and {late_cpu:.2?}, ratio {ratio_cpu:.2}x (whole run {:.1?}, {summaries} summary \
         calls)",
        started.elapsed()
    );
}

/// Runs this binary again with `child` as `KEEL_BENCH_CHILD` under `allocator`; returns
/// its output.
fn child(child: &str, allocator: &str) -> String {
    let output = std::process::Command::new(std::env::current_exe().unwrap())
        .env("KEEL_BENCH_CHILD", child)
        .env("KEEL_BENCH_ALLOCATOR", allocator)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn main() {
    // A child: one measurement (`steps:N:unknown|known` or `rss:N`).
    if let Ok(job) = std::env::var("KEEL_BENCH_CHILD") {
        let parts: Vec<&str> = job.split(':').collect();
        match parts.as_slice() {
            ["steps", steps, window] => {
                step_times(steps.parse().unwrap(), (*window == "known").then_some(32_000));
            }
            ["rss", steps] => {
                let rss_window: Option<u64> =
                    std::env::var("KEEL_BENCH_RSS_WINDOW").ok().and_then(|s| s.parse().ok());
                let _ = run(steps.parse().unwrap(), rss_window, false);
                println!("{}", vm_hwm_kib());
            }
            _ => panic!("unknown KEEL_BENCH_CHILD {job}"),
        }
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
    let listed = |variable: &str, default: &str, all: &[&'static str]| -> Vec<&'static str> {
        let value = std::env::var(variable).unwrap_or_else(|_| default.into());
        all.iter().copied().filter(|name| value.split(',').any(|v| v.trim() == *name)).collect()
    };
    let windows = listed("KEEL_BENCH_WINDOWS", "unknown,known", &["unknown", "known"]);
    let allocators = listed("KEEL_BENCH_ALLOCATORS", "glibc,mimalloc", &["glibc", "mimalloc"]);
    if steps > 0 {
        for window in &windows {
            for allocator in &allocators {
                println!("{}", child(&format!("steps:{steps}:{window}"), allocator));
            }
        }
    }
    let rss_window = std::env::var("KEEL_BENCH_RSS_WINDOW").unwrap_or_else(|_| "unknown".into());
    let mut peaks: Vec<(&str, u64)> = Vec::new();
    for size in &rss_sizes {
        for allocator in &allocators {
            let started = Instant::now();
            let kib: u64 = child(&format!("rss:{size}"), allocator).parse().unwrap();
            println!(
                "long_session/peak_rss alloc={allocator} steps={size} window={rss_window}: VmHWM \
                 {:.1} MiB ({:.1?})",
                kib as f64 / 1024.0,
                started.elapsed()
            );
            peaks.push((allocator, kib));
        }
    }
    for allocator in &allocators {
        let mine: Vec<u64> =
            peaks.iter().filter(|(name, _)| name == allocator).map(|(_, kib)| *kib).collect();
        if let (Some(first), Some(last)) = (mine.first(), mine.last())
            && mine.len() > 1
        {
            println!(
                "long_session/peak_rss alloc={allocator} ratio last/first {:.2}x",
                *last as f64 / *first as f64
            );
        }
    }
}
