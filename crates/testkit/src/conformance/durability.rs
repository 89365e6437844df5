//! What must survive: reopening, corruption (loudly), and several writers.

use keel_contracts::{Seq, Store};

use super::{
    Events, StoreFactory, assert_conflict, assert_corrupt, filler_kind, must, read_all, session,
};

pub(super) async fn reopen_keeps_everything<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    let chain1 = events.chain(s1, 5);
    let chain2 = events.chain(s2, 3);
    let listed = {
        let store = factory.open(&ledger).await;
        must(store.append(&chain1).await, "append s1");
        must(store.append(&chain2).await, "append s2");
        must(store.request_cancel(s2).await, "request cancel");
        must(store.sessions().await, "sessions")
    };

    let store = factory.open(&ledger).await;
    assert_eq!(read_all(&*store, s1).await, chain1);
    assert_eq!(read_all(&*store, s2).await, chain2);
    assert_eq!(must(store.sessions().await, "sessions"), listed);
    assert!(must(store.take_cancel_request(s2).await, "take"), "the cancel request survived");
    // The seq discipline carries on where it stopped.
    must(store.append(&chain1[3..]).await, "identical retry after reopen");
    let mut changed = chain1[4].clone();
    changed.kind = filler_kind(5, "other");
    assert_conflict(store.append(&[changed]).await, s1, 6, 5);
    must(store.append(&[events.filler(s1, 6)]).await, "append 6 after reopen");
}

pub(super) async fn corrupt_record_fails_the_read_and_is_never_skipped<F: StoreFactory>(
    factory: &F,
) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);
    let chain = events.chain(s1, 6);
    must(store.append(&chain).await, "append 1..=6");

    factory.corrupt(&ledger, s1, Seq(3), "{\"seq\": 3, \"kind\": \"mode").await;
    // A well-formed body that belongs to another seq is corruption too.
    let misplaced = must(serde_json::to_string(&chain[5]), "serialize");
    factory.corrupt(&ledger, s1, Seq(5), &misplaced).await;

    // Any read whose range holds a corrupt record fails, naming the lowest one.
    assert_corrupt(store.read(s1, Seq(0)).await, s1, 3);
    assert_corrupt(store.read(s1, Seq(2)).await, s1, 3);
    assert_corrupt(store.read(s1, Seq(3)).await, s1, 5);
    // Reading past the corruption works.
    assert_eq!(must(store.read(s1, Seq(5)).await, "read after 5"), chain[5..]);
    // The events before it are intact: their identical retry is still a no-op…
    must(store.append(&chain[..2]).await, "retry 1..=2");
    // …while the corrupt records are never overwritten, not even with the right event.
    assert_conflict(store.append(&chain[2..3]).await, s1, 7, 3);
    // The ledger itself keeps going.
    must(store.append(&[events.filler(s1, 7)]).await, "append 7");
    assert_eq!(must(store.read(s1, Seq(6)).await, "read after 6").len(), 1);
}

pub(super) async fn two_handles_append_to_different_sessions_concurrently<F: StoreFactory>(
    factory: &F,
) {
    const N_EVENTS: u64 = 40;
    let ledger = factory.create().await;
    let first = factory.open(&ledger).await;
    let second = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    let chain1 = events.chain(s1, N_EVENTS);
    let chain2 = events.chain(s2, N_EVENTS);

    async fn one_by_one(store: &dyn Store, chain: &[keel_contracts::RuntimeEvent]) {
        for event in chain {
            must(store.append(std::slice::from_ref(event)).await, "concurrent append");
        }
    }
    tokio::join!(one_by_one(&*first, &chain1), one_by_one(&*second, &chain2));

    assert_eq!(read_all(&*first, s2).await, chain2, "each handle sees the other's writes");
    assert_eq!(read_all(&*second, s1).await, chain1);
    let listed = must(first.sessions().await, "sessions");
    let tails: Vec<(_, _)> = listed.iter().map(|row| (row.id, row.last_seq)).collect();
    assert_eq!(tails, [(s2, Seq(N_EVENTS)), (s1, Seq(N_EVENTS))]);
}

pub(super) async fn two_handles_racing_for_one_seq_one_wins<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let first = factory.open(&ledger).await;
    let second = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);
    let chain = events.chain(s1, 1);
    must(first.append(&chain).await, "append 1");

    let mine = events.filler(s1, 2);
    let mut theirs = mine.clone();
    theirs.kind = filler_kind(2, "theirs");
    let (a, b) = tokio::join!(
        first.append(std::slice::from_ref(&mine)),
        second.append(std::slice::from_ref(&theirs))
    );
    let winner = match (a, b) {
        (Ok(()), lost) => {
            assert_conflict(lost, s1, 3, 2);
            mine
        }
        (lost, Ok(())) => {
            assert_conflict(lost, s1, 3, 2);
            theirs
        }
        (a, b) => panic!("one writer must win: {a:?} / {b:?}"),
    };
    assert_eq!(read_all(&*second, s1).await, [chain[0].clone(), winner]);
}
