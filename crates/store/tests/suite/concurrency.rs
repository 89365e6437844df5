//! Several handles on one file, as several keel processes would hold: each on its own
//! thread and runtime, so SQLite's file locks (not one handle's mutex) keep order.

use std::path::Path;
use std::sync::{Arc, Barrier};

use keel_contracts::{Clock, EventKind, RuntimeEvent, Seq, SessionId, Store};
use keel_store::SqliteStore;
use keel_testkit::{FakeClock, SeqIds};

const N_EVENTS: u64 = 150;

fn chain(clock: &FakeClock, session_id: SessionId) -> Vec<RuntimeEvent> {
    (1..=N_EVENTS)
        .map(|seq| RuntimeEvent {
            seq: Seq(seq),
            session_id,
            turn_id: None,
            run_id: None,
            ts: clock.now(),
            kind: EventKind::ModelRequested {
                step: u32::try_from(seq).unwrap(),
                messages: seq,
                request_sha256: format!("{session_id}-{seq}"),
                tokens: None,
                tokens_before_pruning: None,
                pruned_results: 0,
                purpose: keel_contracts::RequestPurpose::Conversation,
            },
        })
        .collect()
}

/// Opens its own handle (racing the other thread for a possibly brand-new file), then
/// appends `events` one transaction at a time.
fn writer(path: &Path, start: &Barrier, events: &[RuntimeEvent]) {
    start.wait();
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(path).unwrap();
        for event in events {
            store.append(std::slice::from_ref(event)).await.unwrap();
        }
    });
}

#[test]
fn two_handles_on_one_file_append_to_different_sessions_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let path = keel_store::default_path(dir.path());
    let clock = FakeClock::new();
    let (s1, s2) = (SeqIds::nth(1), SeqIds::nth(2));
    let (s1, s2) = (SessionId(s1), SessionId(s2));
    let (chain1, chain2) = (chain(&clock, s1), chain(&clock, s2));

    let start = Arc::new(Barrier::new(2));
    std::thread::scope(|scope| {
        scope.spawn(|| writer(&path, &start, &chain1));
        scope.spawn(|| writer(&path, &start, &chain2));
    });

    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.read(s1, Seq(0)).await.unwrap(), chain1);
        assert_eq!(store.read(s2, Seq(0)).await.unwrap(), chain2);
        let tails: Vec<_> =
            store.sessions().await.unwrap().iter().map(|row| (row.id, row.last_seq)).collect();
        assert_eq!(tails.len(), 2);
        assert!(tails.iter().all(|(_, last_seq)| *last_seq == Seq(N_EVENTS)), "{tails:?}");
    });
}

#[test]
fn two_handles_racing_on_one_session_never_interleave() {
    let dir = tempfile::tempdir().unwrap();
    let path = keel_store::default_path(dir.path());
    let session_id = SessionId(SeqIds::nth(1));
    let clock = FakeClock::new();
    // Both writers try to write the *same* session, each its own version of every seq, and
    // retry on conflict by re-reading the tail: the ledger must stay gap-free with every
    // seq owned by exactly one writer.
    let versions: Vec<Vec<RuntimeEvent>> = ["a", "b"]
        .iter()
        .map(|writer| {
            chain(&clock, session_id)
                .into_iter()
                .map(|mut event| {
                    event.kind = EventKind::ModelRequested {
                        step: 0,
                        messages: event.seq.0,
                        request_sha256: (*writer).to_owned(),
                        tokens: None,
                        tokens_before_pruning: None,
                        pruned_results: 0,
                        purpose: keel_contracts::RequestPurpose::Conversation,
                    };
                    event
                })
                .collect()
        })
        .collect();

    let start = Barrier::new(2);
    std::thread::scope(|scope| {
        for version in &versions {
            let (path, start) = (&path, &start);
            scope.spawn(move || {
                start.wait();
                let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
                runtime.block_on(async {
                    let store = SqliteStore::open(path).unwrap();
                    let mut written = 0;
                    while written < 40 {
                        let next = store.read(session_id, Seq(0)).await.unwrap().len();
                        let Some(event) = version.get(next) else { break };
                        match store.append(std::slice::from_ref(event)).await {
                            Ok(()) => written += 1,
                            Err(keel_contracts::AppendError::SeqConflict { .. }) => {}
                            Err(other) => panic!("{other:?}"),
                        }
                    }
                });
            });
        }
    });

    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let stored = store.read(session_id, Seq(0)).await.unwrap();
        assert!(stored.len() >= 40, "{}", stored.len());
        for (index, event) in stored.iter().enumerate() {
            assert_eq!(event.seq, Seq(index as u64 + 1));
            assert!(versions.iter().any(|version| version[index] == *event));
        }
    });
}
