//! `PgStore` against a real PostgreSQL server: the shared conformance suite, writers
//! racing for every seq, migrations, open errors, and text PostgreSQL cannot hold as is.
//!
//! The server is `keel_testkit::postgres::PgServer::shared()`: `KEEL_TEST_POSTGRES_URL`,
//! or a throwaway server started from the machine's PostgreSQL binaries. Without either
//! these tests fail loudly, unless `KEEL_SKIP_POSTGRES=1`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use keel_contracts::{
    AppendError, Envelope, EventKind, ExecutionMode, RuntimeEvent, Seq, SessionId, Store,
};
use keel_store::{LOCK_TIMEOUT, OpenError, PG_SCHEMA_VERSION, PgStore};
use keel_testkit::conformance::{self, StoreFactory};
use keel_testkit::postgres::{PgDatabase, PgServer};
use keel_testkit::{MemStore, SeqIds};
use tokio::sync::Barrier;

/// Each ledger is a fresh database on the shared server.
struct PgFactory {
    server: &'static PgServer,
}

#[async_trait]
impl StoreFactory for PgFactory {
    type Ledger = PgDatabase;

    async fn create(&self) -> PgDatabase {
        self.server.create_database()
    }

    async fn open(&self, ledger: &PgDatabase) -> Arc<dyn Store> {
        Arc::new(PgStore::connect(ledger.url()).await.unwrap())
    }

    /// Writes straight into `keel.events.body` with raw SQL, behind the store's back.
    async fn corrupt(&self, ledger: &PgDatabase, session_id: SessionId, seq: Seq, garbage: &str) {
        let client = raw_client(ledger).await;
        let changed = client
            .execute(
                "UPDATE keel.events SET body = $1 WHERE session_id = $2 AND seq = $3",
                &[&garbage, &session_id.0, &i64::try_from(seq.0).unwrap()],
            )
            .await
            .unwrap();
        assert_eq!(changed, 1, "no event at {seq}");
    }
}

/// A plain client on `database`, its connection driven by a spawned task.
async fn raw_client(database: &PgDatabase) -> tokio_postgres::Client {
    let (client, connection) =
        tokio_postgres::connect(database.url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

fn event(session_id: SessionId, seq: u64, kind: EventKind) -> RuntimeEvent {
    let start = DateTime::<Utc>::from_timestamp(1_767_225_600, 0).unwrap();
    RuntimeEvent {
        seq: Seq(seq),
        session_id,
        turn_id: None,
        run_id: None,
        // Nanoseconds on purpose: PostgreSQL's own timestamps keep only microseconds.
        ts: start + TimeDelta::nanoseconds(i64::try_from(seq).unwrap() * 1_000_001),
        kind,
    }
}

fn created(session_id: SessionId, workspace: &str) -> RuntimeEvent {
    let kind = EventKind::SessionCreated {
        workspace: workspace.to_owned(),
        model: "scripted:fix.json".to_owned(),
        envelope: Envelope::executor(),
        mode: ExecutionMode::Live,
        base_url: None,
        lineage: None,
    };
    event(session_id, 1, kind)
}

fn turn(session_id: SessionId, seq: u64, input: &str) -> RuntimeEvent {
    event(session_id, seq, EventKind::TurnStarted { input: input.to_owned() })
}

#[tokio::test]
async fn postgres_store_conforms() {
    let Some(server) = PgServer::shared() else { return };
    conformance::run_all(&PgFactory { server }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_conforms_on_a_multi_thread_runtime() {
    let Some(server) = PgServer::shared() else { return };
    conformance::run_all(&PgFactory { server }).await;
}

/// Two handles (two pools, as two processes would hold) offer different events for the
/// same seq at the same instant, seq after seq, starting with the session's creation:
/// each time exactly one wins and the other is told the seq is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_handles_racing_for_every_seq_exactly_one_wins_each() {
    const N_SEQS: u64 = 60;
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let handles = [
        Arc::new(PgStore::connect(database.url()).await.unwrap()),
        Arc::new(PgStore::connect(database.url()).await.unwrap()),
    ];
    let session_id = SessionId(SeqIds::nth(1));
    let version = |writer: &str, seq: u64| match seq {
        1 => created(session_id, &format!("/w/{writer}")),
        _ => turn(session_id, seq, &format!("{writer} wrote {seq}")),
    };

    let start = Arc::new(Barrier::new(2));
    let mut winners = Vec::new();
    let mut wins = [0_u32; 2];
    for seq in 1..=N_SEQS {
        let attempts: Vec<_> = ["a", "b"]
            .into_iter()
            .zip(&handles)
            .map(|(writer, store)| {
                let (store, start, event) =
                    (Arc::clone(store), Arc::clone(&start), version(writer, seq));
                tokio::spawn(async move {
                    start.wait().await;
                    let result = store.append(std::slice::from_ref(&event)).await;
                    (event, result)
                })
            })
            .collect();
        let mut outcomes = Vec::new();
        for attempt in attempts {
            outcomes.push(attempt.await.unwrap());
        }
        let mut won = None;
        for (index, (event, result)) in outcomes.into_iter().enumerate() {
            match result {
                Ok(()) => {
                    assert!(won.is_none(), "both writers won seq {seq}");
                    won = Some(event);
                    wins[index] += 1;
                }
                Err(AppendError::SeqConflict { session_id: s, expected, got }) => {
                    assert_eq!((s, expected, got), (session_id, Seq(seq + 1), Seq(seq)));
                }
                Err(other) => panic!("seq {seq}: {other:?}"),
            }
        }
        winners.push(won.unwrap_or_else(|| panic!("nobody won seq {seq}")));
    }

    for store in &handles {
        assert_eq!(store.read(session_id, Seq(0)).await.unwrap(), winners);
        let listed = store.sessions().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].last_seq, Seq(N_SEQS));
        assert_eq!(listed[0].workspace, workspace_of(&winners[0]));
    }
    eprintln!("wins per writer: {wins:?}");
}

/// The workspace of a `session_created` event.
fn workspace_of(event: &RuntimeEvent) -> &str {
    match &event.kind {
        EventKind::SessionCreated { workspace, .. } => workspace,
        other => panic!("not session_created: {other:?}"),
    }
}

/// Writers that do not synchronize but retry on conflict, as kernels on two hosts would:
/// the ledger stays gap-free and every seq holds one writer's event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn free_running_writers_never_interleave() {
    const N_EVENTS: usize = 80;
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let session_id = SessionId(SeqIds::nth(2));
    let first = created(session_id, "/w");
    PgStore::connect(database.url())
        .await
        .unwrap()
        .append(std::slice::from_ref(&first))
        .await
        .unwrap();

    let mut writers = Vec::new();
    for writer in ["a", "b", "c"] {
        let url = database.url().to_owned();
        writers.push(tokio::spawn(async move {
            let store = PgStore::connect(&url).await.unwrap();
            loop {
                let next = store.read(session_id, Seq(0)).await.unwrap().len() as u64 + 1;
                if next > N_EVENTS as u64 {
                    break;
                }
                let event = turn(session_id, next, &format!("{writer} wrote {next}"));
                match store.append(std::slice::from_ref(&event)).await {
                    Ok(()) | Err(AppendError::SeqConflict { .. }) => {}
                    Err(other) => panic!("{other:?}"),
                }
            }
        }));
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let store = PgStore::connect(database.url()).await.unwrap();
    let stored = store.read(session_id, Seq(0)).await.unwrap();
    assert_eq!(stored.len(), N_EVENTS);
    for (index, event) in stored.iter().enumerate().skip(1) {
        let seq = index as u64 + 1;
        assert_eq!(event.seq, Seq(seq));
        let EventKind::TurnStarted { input } = &event.kind else { panic!("{event:?}") };
        assert!(["a", "b", "c"].iter().any(|w| *input == format!("{w} wrote {seq}")), "{input}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_connects_migrate_a_new_database_once() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let connects: Vec<_> = (0..4)
        .map(|_| {
            let url = database.url().to_owned();
            tokio::spawn(async move { PgStore::connect(&url).await })
        })
        .collect();
    for connect in connects {
        connect.await.unwrap().unwrap();
    }
    let client = raw_client(&database).await;
    let rows = client.query("SELECT version FROM keel.schema_version", &[]).await.unwrap();
    let versions: Vec<i64> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(versions, [PG_SCHEMA_VERSION]);
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    drop(PgStore::connect(database.url()).await.unwrap());
    raw_client(&database)
        .await
        .execute("UPDATE keel.schema_version SET version = 99", &[])
        .await
        .unwrap();
    match PgStore::connect(database.url()).await {
        Err(OpenError::NewerDatabaseSchema { target, found: 99, supported }) => {
            assert_eq!(supported, PG_SCHEMA_VERSION);
            assert!(target.ends_with(database.name()), "{target}");
        }
        other => panic!("expected NewerDatabaseSchema, got {other:?}"),
    }
}

/// A database written before the listing kept usage (schema 2) gets its totals once, from
/// its `model_response` events; a session with an unreadable response reads as unknown.
#[tokio::test]
async fn migrating_a_version_2_database_backfills_usage_once() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let store = PgStore::connect(database.url()).await.unwrap();
    let (good, damaged) =
        (SessionId(uuid::Uuid::from_u128(1)), SessionId(uuid::Uuid::from_u128(2)));
    let response = |session_id: SessionId, seq: u64, cost: f64| {
        let kind: EventKind = serde_json::from_value(serde_json::json!({
            "kind": "model_response", "text": "ok", "tool_calls": [],
            "usage": {"input_tokens": 100, "output_tokens": 10},
            "finish_reason": "stop", "cost_usd": cost,
        }))
        .unwrap();
        event(session_id, seq, kind)
    };
    // A result with a NUL in its id and its body, whose call id the migration fills in.
    let result = event(
        good,
        4,
        EventKind::ToolResult {
            call_id: "call \u{0} 1".into(),
            attempt_id: None,
            tool: "read_file".to_owned(),
            outcome: keel_contracts::Outcome::Ok,
            content: "nul \u{0} here".to_owned(),
            bytes: 12,
            raw: None,
        },
    );
    store
        .append(&[
            created(good, "/w/good"),
            response(good, 2, 0.5),
            response(good, 3, 0.25),
            result.clone(),
        ])
        .await
        .unwrap();
    store.append(&[created(damaged, "/w/damaged"), response(damaged, 2, 1.0)]).await.unwrap();
    drop(store);
    raw_client(&database)
        .await
        .batch_execute(
            "DROP INDEX keel.events_by_kind; ALTER TABLE keel.events DROP COLUMN call_id;
             DROP TABLE keel.schedules; DROP TABLE keel.schedule_fires; DROP TABLE keel.wakes;
             ALTER TABLE keel.sessions DROP COLUMN usage;
             UPDATE keel.schema_version SET version = 2;
             UPDATE keel.events SET body = '{not json'
                 WHERE seq = 2 AND session_id = '00000000-0000-0000-0000-000000000002';",
        )
        .await
        .unwrap();
    let store = PgStore::connect(database.url()).await.unwrap();
    let listed = store.sessions().await.unwrap();
    let usage_of = |id| listed.iter().find(|row| row.id == id).unwrap().usage;
    assert_eq!((usage_of(good).responses, usage_of(good).input_tokens), (2, 200));
    assert_eq!(usage_of(good).cost_usd, Some(0.75));
    assert_eq!(usage_of(damaged), keel_contracts::UsageTotals::unknown());
    assert!(matches!(
        store.read(damaged, Seq(0)).await,
        Err(keel_contracts::ReadError::Corrupt { .. })
    ));
    // Schema 5's call ids were filled in for the results written before it.
    let found = store.last_tool_result(good, &"call \u{0} 1".into()).await.unwrap();
    assert_eq!(found, Some(result));
}

/// Every error in `error`'s chain, one per line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push('\n');
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[tokio::test]
async fn bad_urls_and_unreachable_servers_are_open_errors_without_the_password() {
    match PgStore::connect("postgres://keel:hunter2@127.0.0.1:notaport/ledger").await {
        Err(error @ OpenError::DatabaseUrl { .. }) => {
            assert!(!chain(&error).contains("hunter2"), "{}", chain(&error));
        }
        other => panic!("expected DatabaseUrl, got {other:?}"),
    }
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let url = format!("postgres://keel:hunter2@127.0.0.1:{port}/ledger");
    match PgStore::connect(&url).await {
        Err(error @ OpenError::Postgres { .. }) => {
            let text = chain(&error);
            assert!(text.starts_with(&format!("cannot open ledger keel@127.0.0.1:{port}/ledger")));
            assert!(!text.contains("hunter2"), "{text}");
        }
        other => panic!("expected Postgres, got {other:?}"),
    }
    let Some(server) = PgServer::shared() else { return };
    let missing = format!("{}_missing", server.create_database().url());
    match PgStore::connect(&missing).await {
        Err(error @ OpenError::Postgres { .. }) => {
            assert!(chain(&error).contains("does not exist"), "{}", chain(&error));
        }
        other => panic!("expected Postgres, got {other:?}"),
    }
}

/// Text PostgreSQL's `text` cannot hold as is (NUL) and the escape character of its
/// column spelling: the listing matches the reference store exactly.
#[tokio::test]
async fn user_text_with_nul_lists_exactly_like_mem_store() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let pg = PgStore::connect(database.url()).await.unwrap();
    let mem = MemStore::new();
    let (s1, s2) = (SessionId(SeqIds::nth(1)), SessionId(SeqIds::nth(2)));
    let batches = [
        vec![created(s1, "/w/\u{FFFF}0 odd"), turn(s1, 2, "fix\0 the \u{FFFF}\u{FFFF} bug\0")],
        vec![created(s2, "/w/plain"), turn(s2, 2, "\u{FFFF}")],
    ];
    for batch in &batches {
        pg.append(batch).await.unwrap();
        mem.append(batch).await.unwrap();
    }
    assert_eq!(pg.sessions().await.unwrap(), mem.sessions().await.unwrap());
    assert_eq!(pg.sessions().await.unwrap()[1].title, "fix\0 the \u{FFFF}\u{FFFF} bug\0");
    // Retrying is still a no-op, and the events round-trip.
    pg.append(&batches[0]).await.unwrap();
    assert_eq!(pg.read(s1, Seq(0)).await.unwrap(), batches[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_append_still_commits_or_rolls_back_whole() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let store = PgStore::connect(database.url()).await.unwrap();
    let session_id = SessionId(SeqIds::nth(3));
    let mut events = vec![created(session_id, "/w")];
    events.extend((2..=64).map(|seq| turn(session_id, seq, &format!("{seq}"))));
    for _ in 0..2 {
        // Start the append, then drop it after one poll.
        let append = store.append(&events);
        let mut append = std::pin::pin!(append);
        let _ = tokio::time::timeout(std::time::Duration::ZERO, append.as_mut()).await;
    }
    // Whatever happened, the ledger holds all 64 events or none, and a retry settles it.
    let stored = store.read(session_id, Seq(0)).await.unwrap();
    assert!(stored.is_empty() || stored == events, "partial batch: {} events", stored.len());
    store.append(&events).await.unwrap();
    assert_eq!(store.read(session_id, Seq(0)).await.unwrap(), events);
}

/// The lock is per session, and a writer that holds it too long (a process stopped or cut
/// off mid-append) makes others fail after `LOCK_TIMEOUT` instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_session_lock_delays_only_that_session_and_times_out() {
    let Some(server) = PgServer::shared() else { return };
    let database = server.create_database();
    let store = PgStore::connect(database.url()).await.unwrap();
    let (held, free) = (SessionId(SeqIds::nth(4)), SessionId(SeqIds::nth(5)));
    let mut holder = raw_client(&database).await;
    let holding = holder.transaction().await.unwrap();
    // The documented key: the uuid's two halves XORed.
    let (high, low) = held.0.as_u64_pair();
    let key = i64::from_ne_bytes((high ^ low).to_ne_bytes());
    holding.execute("SELECT pg_advisory_xact_lock($1)", &[&key]).await.unwrap();

    let other_session = [created(free, "/w")];
    let append = store.append(&other_session);
    tokio::time::timeout(Duration::from_secs(5), append).await.unwrap().unwrap();
    let started = Instant::now();
    match store.append(&[created(held, "/w")]).await {
        Err(AppendError::Backend { message }) => {
            assert!(message.contains("lock timeout"), "{message}");
        }
        other => panic!("expected a lock timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= LOCK_TIMEOUT - Duration::from_millis(500));
    assert!(store.read(held, Seq(0)).await.unwrap().is_empty());

    holding.rollback().await.unwrap();
    store.append(&[created(held, "/w")]).await.unwrap();
}

#[test]
fn handles_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PgStore>();
}
