//! `keel sessions` against the number and length of sessions (issue #13): the real `keel`
//! binary listing a real SQLite ledger under `KEEL_HOME`, with 1 000 short sessions
//! (10 events each, usage on every response), then the same plus one session of 100 000
//! events. The listing reads the store's summary table only, so the long session must not
//! slow it.
//!
//! Times are the wall time of the whole process (start, open and migrate-check the file,
//! list, print), median of `KEEL_BENCH_SESSIONS_RUNS` (default 15), and, for comparison,
//! `Store::sessions` alone in process.
//!
//! Run: `cargo bench -p keel-cli --bench sessions`
//! Sizes: `KEEL_BENCH_SESSIONS` (default 1000), `KEEL_BENCH_LONG_EVENTS` (default 100000).
#![allow(clippy::unwrap_used, clippy::print_stdout, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, TimeZone, Utc};
use keel_contracts::{EventKind, RuntimeEvent, Seq, SessionId, Store};

fn event(session_id: SessionId, seq: u64, kind: EventKind) -> RuntimeEvent {
    let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap();
    RuntimeEvent {
        seq: Seq(seq),
        session_id,
        turn_id: None,
        run_id: None,
        ts: start + TimeDelta::milliseconds(i64::try_from(seq).unwrap()),
        kind,
    }
}

fn kind(wire: serde_json::Value) -> EventKind {
    serde_json::from_value(wire).unwrap()
}

/// A session of `len` events: created, a turn, then model responses with usage and cost.
fn session(n: u128, len: u64) -> Vec<RuntimeEvent> {
    let id = SessionId(uuid::Uuid::from_u128(n + 1));
    let mut events = vec![
        event(
            id,
            1,
            kind(serde_json::json!({
                "kind": "session_created", "workspace": format!("/work/repo{}", n % 7),
                "model": "scripted:bench", "envelope": keel_contracts::Envelope::executor(),
                "mode": "live",
            })),
        ),
        event(id, 2, EventKind::TurnStarted { input: format!("task number {n}") }),
    ];
    for seq in 3..=len {
        events.push(event(
            id,
            seq,
            kind(serde_json::json!({
                "kind": "model_response", "text": "ok", "tool_calls": [],
                "usage": {"input_tokens": 1200, "output_tokens": 40},
                "finish_reason": "stop", "cost_usd": 0.0042,
            })),
        ));
    }
    events
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

fn measure(home: &std::path::Path, store: &Arc<dyn Store>, runs: usize, label: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut process = Vec::new();
    let mut rows = 0;
    for _ in 0..runs {
        let started = Instant::now();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
            .arg("sessions")
            .env("KEEL_HOME", home)
            .env_remove("KEEL_DATABASE_URL")
            .output()
            .unwrap();
        process.push(started.elapsed());
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        rows = String::from_utf8_lossy(&output.stdout).lines().count();
    }
    let mut listing = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let sessions = runtime.block_on(store.sessions()).unwrap();
        listing.push(started.elapsed());
        assert!(!sessions.is_empty());
    }
    println!(
        "sessions/{label}: `keel sessions` median {:.2?} (min {:.2?}, max {:.2?}, {rows} rows); \
         Store::sessions median {:.2?}",
        median(process.clone()),
        process.iter().min().unwrap(),
        process.iter().max().unwrap(),
        median(listing)
    );
}

fn main() {
    let count: u128 =
        std::env::var("KEEL_BENCH_SESSIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(1000);
    let long: u64 = std::env::var("KEEL_BENCH_LONG_EVENTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let runs: usize =
        std::env::var("KEEL_BENCH_SESSIONS_RUNS").ok().and_then(|s| s.parse().ok()).unwrap_or(15);
    let home = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store: Arc<dyn Store> =
        Arc::new(keel_store::SqliteStore::open(keel_store::default_path(home.path())).unwrap());
    runtime.block_on(async {
        for n in 0..count {
            store.append(&session(n, 10)).await.unwrap();
        }
    });
    measure(home.path(), &store, runs, &format!("{count}_sessions"));
    runtime.block_on(async {
        for batch in session(count, long).chunks(5_000) {
            store.append(batch).await.unwrap();
        }
    });
    measure(home.path(), &store, runs, &format!("{count}_sessions_plus_one_of_{long}_events"));
}
