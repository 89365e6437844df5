//! Reading: the `after` bound and round-tripping.

use keel_contracts::{EventKind, Outcome, Seq};

use super::{Events, StoreFactory, must, session};

pub(super) async fn read_returns_events_after_the_bound<F: StoreFactory>(factory: &F) {
    let ledger = factory.create().await;
    let store = factory.open(&ledger).await;
    let events = Events::new();
    let (s1, s2) = (session(1), session(2));
    let mut chain = events.chain(s1, 4);
    // A kind with nested data and non-ASCII text must round-trip exactly.
    chain.push(events.event(
        s1,
        5,
        EventKind::ToolResult {
            call_id: "c1".into(),
            attempt_id: None,
            tool: "read_file".to_owned(),
            outcome: Outcome::Ok,
            content: "fn main() {}\n// ünïcödé ✓ \"quoted\"\t\u{0}".to_owned(),
            bytes: 40,
            raw: None,
        },
    ));
    must(store.append(&chain).await, "append 1..=5");
    must(store.append(&events.chain(s2, 2)).await, "append other session");

    assert_eq!(must(store.read(s1, Seq(0)).await, "read after 0"), chain);
    assert_eq!(must(store.read(s1, Seq(3)).await, "read after 3"), chain[3..]);
    assert!(must(store.read(s1, Seq(5)).await, "read after 5").is_empty());
    assert!(must(store.read(s1, Seq(99)).await, "read after 99").is_empty());
    assert!(must(store.read(s1, Seq(u64::MAX)).await, "read after max").is_empty());
    assert!(must(store.read(session(3), Seq(0)).await, "unknown session").is_empty());
}
