//! Group commit across sessions: durable events per second when 1, 10 or 100 sessions
//! append concurrently through one `SqliteStore` handle, each appending one event per call
//! (the worst case: every append wants its own commit) or five (a kernel step's commit:
//! response, gate, consent and prepare, or a result with the next request). Concurrent
//! appends share a transaction and its fsync, so throughput grows with the appenders.
//!
//! Run: `cargo bench -p keel-store --bench group_commit`. The file lives under Cargo's
//! target tmp directory (a real disk, not tmpfs), WAL with `synchronous=FULL`. After each
//! group the bench prints the events per commit it saw (`n_commits`).
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark harness: any failure should abort the run loudly"
)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_contracts::{AttemptId, EventKind, Outcome, RuntimeEvent, Seq, SessionId, Store, TurnId};
use keel_store::SqliteStore;
use uuid::Uuid;

/// Appends each appender makes per measured iteration.
const APPENDS_PER_ITERATION: u64 = 20;

/// A representative event: a tool result of ~200 bytes, ~450 bytes of JSON (as in the
/// `append` bench).
fn event(session_id: SessionId, seq: u64) -> RuntimeEvent {
    let start = DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap();
    let content =
        format!("{seq:>8}: {}", "src/lib.rs:12: fn parse(input: &str) -> Result<Ast> ".repeat(4));
    RuntimeEvent {
        seq: Seq(seq),
        session_id,
        turn_id: Some(TurnId(Uuid::from_u128(2))),
        run_id: None,
        ts: start + TimeDelta::milliseconds(i64::try_from(seq).unwrap()),
        kind: EventKind::ToolResult {
            call_id: format!("call_{seq}").as_str().into(),
            attempt_id: Some(AttemptId(Uuid::from_u128(u128::from(seq)))),
            tool: "grep".to_owned(),
            outcome: Outcome::Ok,
            bytes: content.len() as u64,
            raw: None,
            content,
        },
    }
}

fn concurrent_appenders(c: &mut Criterion) {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Arc::new(SqliteStore::open(keel_store::default_path(dir.path())).unwrap());
    let mut group = c.benchmark_group("store/group_commit");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    let mut first_session = 1_u128;
    for (appenders, batch_len) in [(1_u64, 1_u64), (10, 1), (100, 1), (1, 5), (10, 5), (100, 5)] {
        // Each appender owns a session and its next seq, across iterations.
        let sessions: Arc<Vec<(SessionId, AtomicU64)>> = Arc::new(
            (0..appenders)
                .map(|n| (SessionId(Uuid::from_u128(first_session + u128::from(n))), 1.into()))
                .collect(),
        );
        first_session += u128::from(appenders);
        let (events_before, commits_before) = (Arc::new(AtomicU64::new(0)), store.n_commits());
        let per_iteration = appenders * APPENDS_PER_ITERATION * batch_len;
        group.throughput(Throughput::Elements(per_iteration));
        let name = format!("appenders_{appenders}/events_per_append_{batch_len}");
        group.bench_function(&name, |bencher| {
            bencher.iter_custom(|iterations| {
                let started = Instant::now();
                for _ in 0..iterations {
                    runtime.block_on(async {
                        let tasks: Vec<_> = (0..sessions.len())
                            .map(|index| {
                                let (store, sessions) = (Arc::clone(&store), Arc::clone(&sessions));
                                tokio::spawn(async move {
                                    let (session_id, next) = &sessions[index];
                                    for _ in 0..APPENDS_PER_ITERATION {
                                        let first = next.fetch_add(batch_len, Ordering::Relaxed);
                                        let events: Vec<_> = (first..first + batch_len)
                                            .map(|seq| event(*session_id, seq))
                                            .collect();
                                        store.append(&events).await.unwrap();
                                    }
                                })
                            })
                            .collect();
                        for task in tasks {
                            task.await.unwrap();
                        }
                    });
                    events_before.fetch_add(per_iteration, Ordering::Relaxed);
                }
                started.elapsed()
            });
        });
        let events = events_before.load(Ordering::Relaxed);
        let commits = store.n_commits() - commits_before;
        eprintln!(
            "store/group_commit/{name}: {events} events in {commits} commits \
             ({:.1} events per commit)",
            events as f64 / commits.max(1) as f64
        );
    }
    group.finish();
}

criterion_group!(benches, concurrent_appenders);
criterion_main!(benches);
