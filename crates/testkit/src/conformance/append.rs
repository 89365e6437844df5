//! Appending: seq discipline, idempotent retries, conflicts and batch atomicity.

use super::{
    Events, StoreFactory, assert_conflict, assert_invalid_batch, filler_kind, must, read_all,
    session,
};

pub(super) async fn empty_batch_is_a_no_op<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    must(store.append(&[]).await, "empty append");
    assert!(must(store.sessions().await, "sessions").is_empty(), "an empty batch creates nothing");
}

pub(super) async fn seq_starts_at_one<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);

    assert_conflict(store.append(&[events.filler(s1, 2)]).await, s1, 1, 2);
    assert_invalid_batch(store.append(&[events.filler(s1, 0)]).await);
    assert!(read_all(&*store, s1).await.is_empty(), "nothing written before seq 1");
    assert!(must(store.sessions().await, "sessions").is_empty(), "no session row either");

    let first = events.created(s1, "/w");
    must(store.append(std::slice::from_ref(&first)).await, "append seq 1");
    assert_eq!(read_all(&*store, s1).await, vec![first]);
}

pub(super) async fn seq_is_contiguous<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    must(store.append(&events.chain(s1, 3)).await, "append 1..=3");

    // A gap after the stored tail.
    assert_conflict(store.append(&[events.filler(s1, 5)]).await, s1, 4, 5);
    // A gap inside one batch.
    assert_invalid_batch(store.append(&[events.filler(s1, 4), events.filler(s1, 6)]).await);
    // Going backwards inside one batch.
    assert_invalid_batch(store.append(&[events.filler(s1, 5), events.filler(s1, 4)]).await);
    // Two sessions in one batch.
    assert_invalid_batch(store.append(&[events.filler(s1, 4), events.created(s2, "/w")]).await);
    assert_eq!(read_all(&*store, s1).await.len(), 3, "rejected batches wrote nothing");
    assert!(read_all(&*store, s2).await.is_empty(), "rejected batches wrote nothing");

    let next = [events.filler(s1, 4), events.filler(s1, 5)];
    must(store.append(&next).await, "append 4..=5");
    let stored = read_all(&*store, s1).await;
    let seqs: Vec<u64> = stored.iter().map(|event| event.seq.0).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5]);
}

pub(super) async fn identical_reappend_is_a_no_op<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);
    let mut chain = events.chain(s1, 3);
    must(store.append(&chain).await, "append 1..=3");
    let before = must(store.sessions().await, "sessions");

    // A retry of a batch that did commit (the caller never saw the answer).
    must(store.append(&chain[1..]).await, "retry 2..=3");
    must(store.append(&chain).await, "retry 1..=3");
    assert_eq!(read_all(&*store, s1).await, chain, "retries changed nothing");
    assert_eq!(must(store.sessions().await, "sessions"), before, "summary untouched");

    // A batch that overlaps the stored tail identically and extends it.
    chain.push(events.filler(s1, 4));
    must(store.append(&chain[2..]).await, "overlapping 3..=4");
    assert_eq!(read_all(&*store, s1).await, chain);
}

pub(super) async fn different_event_at_a_stored_seq_conflicts<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);
    let chain = events.chain(s1, 2);
    must(store.append(&chain).await, "append 1..=2");

    let mut other = chain[1].clone();
    other.kind = filler_kind(2, "other");
    assert_conflict(store.append(&[other]).await, s1, 3, 2);

    // Same content, different timestamp: still a different event.
    let later = events.filler(s1, 2);
    assert_conflict(store.append(&[later]).await, s1, 3, 2);
    assert_eq!(read_all(&*store, s1).await, chain, "the stored event is never replaced");
}

pub(super) async fn a_failing_batch_writes_nothing<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let s1 = session(1);
    let chain = events.chain(s1, 3);
    must(store.append(&chain).await, "append 1..=3");
    let before = must(store.sessions().await, "sessions");

    // seq 2 is identical, seq 3 differs, seq 4 is new: the conflict sinks the whole batch.
    let mut bad_third = chain[2].clone();
    bad_third.kind = filler_kind(3, "other");
    let batch = [chain[1].clone(), bad_third, events.filler(s1, 4), events.filler(s1, 5)];
    assert_conflict(store.append(&batch).await, s1, 4, 3);
    assert_eq!(read_all(&*store, s1).await, chain, "nothing from the failed batch");
    assert_eq!(must(store.sessions().await, "sessions"), before, "summary untouched");

    // A brand-new session whose batch is rejected leaves no trace at all.
    let s2 = session(2);
    let fresh = [events.created(s2, "/w"), events.filler(s2, 2), events.filler(s2, 4)];
    assert_invalid_batch(store.append(&fresh).await);
    assert!(read_all(&*store, s2).await.is_empty());
    assert_eq!(must(store.sessions().await, "sessions").len(), 1);
}
