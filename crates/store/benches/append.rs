//! Store throughput: durable appends per second (one event per transaction vs group commit
//! of 16), and reopening a ledger to read a 100k-event session, for `SqliteStore` and
//! `PgStore`.
//!
//! Run: `cargo bench -p keel-store --bench append`. SQLite files live under Cargo's target
//! tmp directory (a real disk, not tmpfs), so every commit pays a real fsync. PostgreSQL is
//! `keel_testkit::postgres::PgServer::shared()`: `KEEL_TEST_POSTGRES_URL`, or a throwaway
//! server with default (durable) settings, `fsync` and `synchronous_commit` on, in a temp
//! folder; without PostgreSQL the `store_pg` groups are skipped with a note.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "benchmark harness: any failure should abort the run loudly"
)]

use std::cell::Cell;
use std::hint::black_box;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use keel_contracts::{AttemptId, EventKind, Outcome, RuntimeEvent, Seq, SessionId, Store, TurnId};
use keel_store::{PgStore, SqliteStore};
use keel_testkit::postgres::PgServer;
use uuid::Uuid;

/// Events in the session that is reopened and read back.
const LONG_SESSION_EVENTS: u64 = 100_000;

/// A representative event: a tool result of ~200 bytes, ~450 bytes of JSON.
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

/// One worker thread; I/O and timers enabled, which `PgStore` needs (sockets, timeouts).
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap()
}

fn append_throughput(c: &mut Criterion) {
    let runtime = runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = SqliteStore::open(keel_store::default_path(dir.path())).unwrap();
    let mut group = c.benchmark_group("store/append");
    for (n, batch_len) in [(1_u128, 1_u64), (2, 16)] {
        let session_id = SessionId(Uuid::from_u128(n));
        let next_seq = Cell::new(1_u64);
        group.throughput(Throughput::Elements(batch_len));
        group.bench_function(format!("durable/batch_{batch_len}"), |bencher| {
            bencher.iter_batched(
                || {
                    let first = next_seq.get();
                    next_seq.set(first + batch_len);
                    (first..first + batch_len).map(|seq| event(session_id, seq)).collect::<Vec<_>>()
                },
                |events| runtime.block_on(store.append(&events)).unwrap(),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn reopen_and_read(c: &mut Criterion) {
    let runtime = runtime();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = keel_store::default_path(dir.path());
    let session_id = SessionId(Uuid::from_u128(3));
    {
        let store = SqliteStore::open(&path).unwrap();
        let events: Vec<_> = (1..=LONG_SESSION_EVENTS).map(|seq| event(session_id, seq)).collect();
        for chunk in events.chunks(1_000) {
            runtime.block_on(store.append(chunk)).unwrap();
        }
    }
    let mut group = c.benchmark_group("store/reopen_and_read");
    group.sample_size(10).measurement_time(Duration::from_secs(30));
    group.throughput(Throughput::Elements(LONG_SESSION_EVENTS));
    group.bench_function(format!("{LONG_SESSION_EVENTS}_events"), |bencher| {
        bencher.iter(|| {
            let store = SqliteStore::open(&path).unwrap();
            let events = runtime.block_on(store.read(session_id, Seq(0))).unwrap();
            assert_eq!(events.len() as u64, LONG_SESSION_EVENTS);
            black_box(events)
        });
    });
    group.finish();
}

/// The shared PostgreSQL server, or `None` (with a note) when none can be had.
fn postgres() -> Option<&'static PgServer> {
    match std::panic::catch_unwind(PgServer::shared) {
        Ok(Some(server)) => Some(server),
        Ok(None) | Err(_) => {
            eprintln!("store_pg benchmarks skipped: no PostgreSQL server (see above)");
            None
        }
    }
}

fn pg_append_throughput(c: &mut Criterion) {
    let Some(server) = postgres() else { return };
    let runtime = runtime();
    let database = server.create_database();
    let store = runtime.block_on(PgStore::connect(database.url())).unwrap();
    let mut group = c.benchmark_group("store_pg/append");
    for (n, batch_len) in [(1_u128, 1_u64), (2, 16)] {
        let session_id = SessionId(Uuid::from_u128(n));
        let next_seq = Cell::new(1_u64);
        group.throughput(Throughput::Elements(batch_len));
        group.bench_function(format!("durable/batch_{batch_len}"), |bencher| {
            bencher.iter_batched(
                || {
                    let first = next_seq.get();
                    next_seq.set(first + batch_len);
                    (first..first + batch_len).map(|seq| event(session_id, seq)).collect::<Vec<_>>()
                },
                |events| runtime.block_on(store.append(&events)).unwrap(),
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

fn pg_reopen_and_read(c: &mut Criterion) {
    let Some(server) = postgres() else { return };
    let runtime = runtime();
    let database = server.create_database();
    let session_id = SessionId(Uuid::from_u128(3));
    runtime.block_on(async {
        let store = PgStore::connect(database.url()).await.unwrap();
        let events: Vec<_> = (1..=LONG_SESSION_EVENTS).map(|seq| event(session_id, seq)).collect();
        for chunk in events.chunks(1_000) {
            store.append(chunk).await.unwrap();
        }
    });
    let mut group = c.benchmark_group("store_pg/reopen_and_read");
    group.sample_size(10).measurement_time(Duration::from_secs(30));
    group.throughput(Throughput::Elements(LONG_SESSION_EVENTS));
    group.bench_function(format!("{LONG_SESSION_EVENTS}_events"), |bencher| {
        bencher.iter(|| {
            // A new handle: a new connection pool, the schema check, then the read.
            let events = runtime.block_on(async {
                let store = PgStore::connect(database.url()).await.unwrap();
                store.read(session_id, Seq(0)).await.unwrap()
            });
            assert_eq!(events.len() as u64, LONG_SESSION_EVENTS);
            black_box(events)
        });
    });
    group.finish();
}

criterion_group!(
    benches,
    append_throughput,
    reopen_and_read,
    pg_append_throughput,
    pg_reopen_and_read
);
criterion_main!(benches);
