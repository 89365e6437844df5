//! Resume cost against session length (issue #13): `Kernel::resume` and a new turn
//! (`Kernel::run_turn`) on a session of ~10 events versus one of ~100 000, through the real
//! kernel on the real `SqliteStore` (WAL, `synchronous=FULL`, a file on disk).
//!
//! Each session is one turn of scripted tool steps in a 6 000-token window (so it compacts
//! as it goes), suspended by its step budget, so the turn is resumable. The events are
//! produced once on an in-memory store, then each measurement copies them into a fresh
//! SQLite file (not timed) and times: opening the file, building the kernel and driving
//! the resumed run (or the new turn) to its end. The resumed run and the new turn are one
//! model step each, so what grows with the session is only what loading it costs.
//!
//! Each is timed as wall time and as the process's CPU time over the same interval
//! (`CLOCK_PROCESS_CPUTIME_ID`, every thread: the work done, without the fsync waits and
//! the other processes' load that swing the wall time on a shared machine).
//!
//! Run: `cargo bench -p keel-cli --bench resume`
//! Sizes: `KEEL_BENCH_RESUME_STEPS` (default `2,20000`: steps of the suspended turn; a
//! step is ~5 events). A plain `harness = false` binary.
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use keel_contracts::{
    Access, ApprovalMode, Budget, ContextPolicy, Effects, Envelope, ExecutionMode,
    PermissionAnswer, RuntimeEvent, SandboxMode, Seq, SessionId, Store, SystemClock, Tool,
    ToolContext, ToolOutput, ToolSpec, UuidV7Ids,
};
use keel_kernel::{
    Cancellation, Kernel, KernelDeps, NoopObserver, RunConfig, SessionConfig, StaticPermissions,
    TurnOutcome,
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

/// `steps` tool steps, then answers for the resumed run and the new turn.
fn script(steps: usize) -> ScriptedModel {
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..steps {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"noop","arguments":{{"path":"src/f{}.rs"}}}}]}},"#,
            step % 50
        ));
    }
    json.push_str(
        r#"{"text":"done"},{"text":"done again"}], "compaction": "Summary: read many files."}"#,
    );
    ScriptedModel::new(serde_json::from_str(&json).unwrap(), "bench")
}

fn kernel(store: Arc<dyn Store>, model: Arc<dyn keel_contracts::ModelClient>) -> Kernel {
    let spec = ToolSpec {
        name: "noop".into(),
        description: "returns a small file".into(),
        parameters: serde_json::json!({"type":"object","properties":{"path":{"type":"string"}}}),
        access: Access::Read,
        effects: Effects::LOCAL_READ,
        intrinsic: false,
        first_party: true,
    };
    Kernel::new(KernelDeps {
        store,
        model,
        tools: vec![Arc::new(Noop(spec))],
        clock: Arc::new(SystemClock),
        ids: Arc::new(UuidV7Ids),
        permissions: Arc::new(StaticPermissions(PermissionAnswer::AllowOnce)),
        observer: Arc::new(NoopObserver),
        counter: Arc::new(keel_contracts::ApproxCounter),
    })
    .unwrap()
}

fn config(max_steps: Option<u32>) -> RunConfig {
    RunConfig {
        sandbox: SandboxMode::Bypass,
        approval: ApprovalMode::Auto,
        budget: Budget { max_steps, ..Budget::default() },
        price: None,
        context: ContextPolicy::for_window(Some(6_000)),
        instructions: Vec::new(),
        rules: Default::default(),
        cancel_poll: Duration::from_secs(3600),
        grant_ttl: keel_kernel::DEFAULT_GRANT_TTL,
        skills: keel_kernel::Skills::default(),
        output_schema: None,
    }
}

/// The events of a session whose one turn ran `steps` steps and was suspended.
async fn build(steps: usize) -> (SessionId, Vec<RuntimeEvent>) {
    let store: Arc<dyn Store> = Arc::new(keel_testkit::MemStore::new());
    let kernel = kernel(store.clone(), Arc::new(script(steps)));
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
    let max = Some(u32::try_from(steps).unwrap());
    let report =
        kernel.run_turn(session, "work for a long time", &config(max), &Cancellation::new()).await;
    let outcome = report.unwrap().outcome;
    assert!(matches!(outcome, TurnOutcome::Suspended { .. }), "{outcome:?}");
    (session, store.read(session, Seq(0)).await.unwrap())
}

/// A fresh SQLite file holding `events` (not timed).
async fn copy(dir: &std::path::Path, events: &[RuntimeEvent]) -> std::path::PathBuf {
    let path = dir.join(format!("resume-{}.sqlite", uuid::Uuid::now_v7()));
    let store = keel_store::SqliteStore::open(&path).unwrap();
    for batch in events.chunks(2_000) {
        store.append(batch).await.unwrap();
    }
    drop(store);
    // The store's writer thread may still hold the connection, and closing it checkpoints
    // the WAL (megabytes for the long session): finish that here, not inside the timed
    // open. `TRUNCATE` waits for the other connection and leaves an empty WAL, as a file
    // closed long before a `keel resume` is.
    let connection = rusqlite::Connection::open(&path).unwrap();
    connection.busy_timeout(Duration::from_secs(30)).unwrap();
    let (busy, _, _): (i64, i64, i64) = connection
        .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    assert_eq!(busy, 0, "the WAL checkpoint of the copy did not complete");
    drop(connection);
    path
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

#[derive(Clone, Copy)]
enum What {
    Resume,
    NewTurn,
}

async fn once(
    dir: &std::path::Path,
    session: SessionId,
    events: &[RuntimeEvent],
    model: &Arc<dyn keel_contracts::ModelClient>,
    what: What,
) -> (Duration, Duration) {
    let path = copy(dir, events).await;
    // The script is parsed before the clock starts: its size is the bench's, not keel's.
    let started = Instant::now();
    let cpu_started = process_cpu_time();
    let store: Arc<dyn Store> = Arc::new(keel_store::SqliteStore::open(&path).unwrap());
    let kernel = kernel(store, model.clone());
    let report = match what {
        What::Resume => kernel.resume(session, &config(None), &Cancellation::new()).await,
        What::NewTurn => {
            kernel.run_turn(session, "one more thing", &config(None), &Cancellation::new()).await
        }
    };
    let elapsed = started.elapsed();
    let cpu = process_cpu_time().saturating_sub(cpu_started);
    let outcome = report.unwrap().outcome;
    assert!(matches!(outcome, TurnOutcome::Completed { .. }), "{outcome:?}");
    let _ = std::fs::remove_file(&path);
    (elapsed, cpu)
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn main() {
    let sizes: Vec<usize> = std::env::var("KEEL_BENCH_RESUME_STEPS")
        .unwrap_or_else(|_| "2,20000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let runs: usize =
        std::env::var("KEEL_BENCH_RESUME_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(7);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let mut medians = Vec::new();
    for steps in sizes {
        let built = Instant::now();
        let (session, events) = runtime.block_on(build(steps));
        let compactions = events
            .iter()
            .filter(|event| matches!(event.kind, keel_contracts::EventKind::Compaction { .. }))
            .count();
        let largest = events
            .iter()
            .map(|event| (serde_json::to_string(event).unwrap().len(), event.kind.name()))
            .max()
            .unwrap_or_default();
        println!(
            "resume/session steps={steps}: {} events, {compactions} compactions, largest event \
             {} ({} bytes of JSON) (built in {:.1?})",
            events.len(),
            largest.1,
            largest.0,
            built.elapsed()
        );
        let model: Arc<dyn keel_contracts::ModelClient> = Arc::new(script(steps));
        let mut row = Vec::new();
        for (label, what) in [("resume", What::Resume), ("new_turn", What::NewTurn)] {
            let measured: Vec<(Duration, Duration)> = (0..runs)
                .map(|_| runtime.block_on(once(dir.path(), session, &events, &model, what)))
                .collect();
            let times: Vec<Duration> = measured.iter().map(|(wall, _)| *wall).collect();
            let cpu_times: Vec<Duration> = measured.iter().map(|(_, cpu)| *cpu).collect();
            let median = median(times.clone());
            let cpu_median = self::median(cpu_times.clone());
            println!(
                "resume/{label} events={}: median {median:.2?} of {runs} (min {:.2?}, max {:.2?}); \
                 CPU median {cpu_median:.2?} (min {:.2?}, max {:.2?})",
                events.len(),
                times.iter().min().unwrap(),
                times.iter().max().unwrap(),
                cpu_times.iter().min().unwrap(),
                cpu_times.iter().max().unwrap()
            );
            row.push((median, cpu_median));
        }
        medians.push((events.len(), row));
    }
    if let (Some((small, first)), Some((large, last))) = (medians.first(), medians.last())
        && medians.len() > 1
    {
        for (index, label) in ["resume", "new_turn"].iter().enumerate() {
            let ratio = |of: fn(&(Duration, Duration)) -> Duration| {
                of(&last[index]).as_secs_f64() / of(&first[index]).as_secs_f64().max(1e-9)
            };
            println!(
                "resume/{label} ratio {large} events / {small} events: wall {:.2}x, CPU {:.2}x",
                ratio(|pair| pair.0),
                ratio(|pair| pair.1)
            );
        }
    }
}
