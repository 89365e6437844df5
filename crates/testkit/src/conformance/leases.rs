//! Run leases: one holder at a time, tokens that only grow, appends fenced by them.

use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use keel_contracts::{AppendError, LeaseError};

use super::{Events, StoreFactory, must, session};

fn at(seconds: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(1_767_225_600 + seconds, 0).unwrap_or_default()
}

const TTL: Duration = Duration::from_secs(30);

pub(super) async fn one_holder_at_a_time_and_tokens_only_grow<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let id = session(40);
    let first = must(store.acquire_lease(id, "a", at(0), TTL).await, "first lease");
    assert_eq!(first.expires_at, at(0) + TimeDelta::seconds(30));
    // Another holder is refused while it is unexpired, and told who holds it.
    match store.acquire_lease(id, "b", at(10), TTL).await {
        Err(LeaseError::Held { holder, expires_at, .. }) => {
            assert_eq!(holder, "a");
            assert_eq!(expires_at, at(30));
        }
        other => panic!("expected Held, got {other:?}"),
    }
    // Renewal keeps the token and moves the expiry.
    let renewed = must(store.renew_lease(&first, at(20), TTL).await, "renew");
    assert_eq!(renewed.token, first.token);
    assert!(store.acquire_lease(id, "b", at(40), TTL).await.is_err(), "renewed until 50");
    // After it lapses, another holder takes it with a larger token; the old one is lost.
    let second = must(store.acquire_lease(id, "b", at(51), TTL).await, "takeover");
    assert!(second.token > first.token);
    assert!(matches!(store.renew_lease(&first, at(52), TTL).await, Err(LeaseError::Lost { .. })));
    // A release lets anyone take it at once, still with a larger token.
    must(store.release_lease(&second).await, "release");
    let third = must(store.acquire_lease(id, "c", at(53), TTL).await, "after release");
    assert!(third.token > second.token);
    // Releasing a stale lease changes nothing.
    must(store.release_lease(&first).await, "stale release is a no-op");
    assert!(store.acquire_lease(id, "d", at(54), TTL).await.is_err(), "c still holds it");
}

pub(super) async fn appends_are_fenced_by_the_newest_lease<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let id = session(41);
    let old = must(store.acquire_lease(id, "a", at(0), TTL).await, "lease");
    let chain = events.chain(id, 3);
    must(store.append_leased(&chain[..1], &old).await, "append under the lease");
    let new = must(store.acquire_lease(id, "b", at(31), TTL).await, "takeover");
    match store.append_leased(&chain[1..2], &old).await {
        Err(AppendError::Fenced { current, offered, .. }) => {
            assert_eq!((current, offered), (new.token, old.token));
        }
        other => panic!("expected Fenced, got {other:?}"),
    }
    must(store.append_leased(&chain[1..2], &new).await, "the new holder appends");
    let stored = must(store.read(id, keel_contracts::Seq(0)).await, "read");
    assert_eq!(stored, chain[..2].to_vec(), "the fenced append wrote nothing");
}

pub(super) async fn the_current_lease_is_read_without_taking_it<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let id = session(42);
    assert_eq!(must(store.current_lease(id).await, "no lease yet"), None);
    let first = must(store.acquire_lease(id, "a", at(0), TTL).await, "lease");
    assert_eq!(must(store.current_lease(id).await, "held"), Some(first.clone()));
    // Reading it takes nothing: another holder is still refused, the holder still renews.
    assert!(store.acquire_lease(id, "b", at(1), TTL).await.is_err());
    let renewed = must(store.renew_lease(&first, at(2), TTL).await, "renew");
    assert_eq!(must(store.current_lease(id).await, "renewed"), Some(renewed));
    // A released lease reads as lapsed, with its token kept.
    must(store.release_lease(&first).await, "release");
    let released = must(store.current_lease(id).await, "released");
    let released = released.unwrap_or_else(|| panic!("a released lease keeps its row"));
    assert_eq!((released.holder.as_str(), released.token), ("a", first.token));
    assert!(released.expires_at < at(0), "released: {}", released.expires_at);
}
