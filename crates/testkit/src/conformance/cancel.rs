//! Cancel requests: recorded durably, taken exactly once.

use super::{Events, StoreFactory, must, session};

pub(super) async fn cancel_request_is_taken_once<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    must(store.append(&events.chain(s1, 1)).await, "append");

    assert!(!must(store.take_cancel_request(s1).await, "take"), "nothing pending yet");
    must(store.request_cancel(s1).await, "request");
    assert!(!must(store.take_cancel_request(s2).await, "take"), "requests are per session");
    assert!(must(store.take_cancel_request(s1).await, "take"), "pending");
    assert!(!must(store.take_cancel_request(s1).await, "take"), "taken only once");

    must(store.request_cancel(s1).await, "request");
    must(store.request_cancel(s1).await, "request again");
    assert!(must(store.take_cancel_request(s1).await, "take"), "pending");
    assert!(!must(store.take_cancel_request(s1).await, "take"), "two requests are one");

    // `keel stop` may race the session's creation: a request needs no session row.
    must(store.request_cancel(s2).await, "request for a session not yet written");
    assert!(must(store.take_cancel_request(s2).await, "take"), "pending");
}
