//! One process drives a session at a time: a second kernel is refused while the first
//! holds the lease, and a writer whose lease was taken over is fenced.

use std::time::Duration;

use keel_contracts::{EventKind, Seq};
use keel_kernel::{Cancellation, KernelError, TurnOutcome};

use super::support::Harness;

#[tokio::test(start_paused = true)]
async fn a_second_process_cannot_drive_a_leased_session() {
    let harness = Harness::new();
    let script = r#"{"steps":[{"tool_calls":[{"name":"nap","arguments":{}}]},{"text":"done"}]}"#;
    let first = harness.kernel(script).with_lease_holder("keel pid 1");
    let second = harness.kernel(script).with_lease_holder("keel pid 2");
    let session = harness.session(&first).await;
    let config = harness.run_config();
    let cancel = Cancellation::new();
    let running = first.run_turn(session, "go", &config, &cancel);
    tokio::pin!(running);
    // Let the first run reach its tool, then try to drive the session from the second.
    assert!(tokio::time::timeout(Duration::from_millis(500), &mut running).await.is_err());
    let refused = second.run_turn(session, "me too", &config, &Cancellation::new()).await;
    match refused {
        Err(KernelError::Leased { holder, .. }) => assert_eq!(holder, "keel pid 1"),
        other => panic!("expected a lease refusal, got {other:?}"),
    }
    // The second kernel did not close the first one's live run.
    let events = harness.store.read(session, Seq(0)).await.unwrap();
    assert!(!events.iter().any(|e| matches!(e.kind, EventKind::RunFailed { .. })));
    let report = running.await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    // Released at the end: the second kernel may drive it now.
    let script_done = second.run_turn(session, "again", &config, &Cancellation::new()).await;
    assert!(script_done.is_ok(), "{script_done:?}");
}

#[tokio::test]
async fn a_writer_whose_lease_was_taken_over_is_fenced() {
    let harness = Harness::new();
    let kernel = harness.kernel(r#"{"steps":[]}"#);
    let session = harness.session(&kernel).await;
    let store = harness.store.clone();
    let now = harness.clock.peek();
    let old = store.acquire_lease(session, "a", now, Duration::from_secs(30)).await.unwrap();
    // Another holder cannot take an unexpired lease…
    assert!(store.acquire_lease(session, "b", now, Duration::from_secs(30)).await.is_err());
    // …but can after it lapsed, with a newer token.
    let later = now + chrono::TimeDelta::seconds(31);
    let new = store.acquire_lease(session, "b", later, Duration::from_secs(30)).await.unwrap();
    assert!(new.token > old.token);
    let events = store.read(session, Seq(0)).await.unwrap();
    let mut next = events[0].clone();
    next.seq = Seq(2);
    next.kind = EventKind::SessionSealed { reason: "stale writer".into() };
    let fenced = store.append_leased(std::slice::from_ref(&next), &old).await;
    assert!(matches!(fenced, Err(keel_contracts::AppendError::Fenced { .. })), "{fenced:?}");
    store.append_leased(std::slice::from_ref(&next), &new).await.unwrap();
    // The old holder cannot renew either.
    assert!(store.renew_lease(&old, later, Duration::from_secs(30)).await.is_err());
}

#[derive(Debug)]
struct DeadIf(&'static str);

impl keel_kernel::HolderLiveness for DeadIf {
    fn alive(&self, holder: &str) -> Option<bool> {
        Some(holder != self.0)
    }
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holder_is_taken_over_at_once_and_startup_repair_closes_its_run() {
    let harness = Harness::new();
    let script = r#"{"steps":[{"tool_calls":[{"name":"nap","arguments":{}}]},{"text":"done"}]}"#;
    let crashed = harness.kernel(script).with_lease_holder("keel pid 1");
    let session = harness.session(&crashed).await;
    let config = harness.run_config();
    let never = Cancellation::new();
    // The first process "dies" mid-tool: its lease is still unexpired.
    let dying = crashed.run_turn(session, "go", &config, &never);
    assert!(tokio::time::timeout(Duration::from_millis(500), dying).await.is_err());

    // Without knowing the holder is dead, another process must wait.
    let unsure = harness.kernel(script).with_lease_holder("keel pid 2");
    assert!(unsure.repair_interrupted().await.unwrap().is_empty());
    // Knowing it is dead, it takes over at once and closes the interrupted run.
    let sure = harness
        .kernel(script)
        .with_lease_holder("keel pid 3")
        .with_holder_liveness(std::sync::Arc::new(DeadIf("keel pid 1")));
    assert_eq!(sure.repair_interrupted().await.unwrap(), vec![session]);
    let events = harness.store.read(session, Seq(0)).await.unwrap();
    assert!(matches!(events.last().unwrap().kind, EventKind::RunFailed { .. }));
    // Nothing else to repair, and the session can be driven again.
    assert!(sure.repair_interrupted().await.unwrap().is_empty());
    let report = sure.resume(session, &config, &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
}
