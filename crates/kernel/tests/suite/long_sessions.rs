//! Issue #13: sessions of any length at constant cost. Compaction digests are chained (each
//! compaction hashes what it covers since the previous one, and a change to any covered
//! event still invalidates), and a session is loaded from its latest compaction on: the
//! facts below it and the events after it, never the whole ledger, with the same
//! projection as a full load.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use keel_contracts::{
    AppendError, ContextPolicy, DigestChain, EventKind, Lease, LeaseError, ModelRequest, Outcome,
    ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};
use keel_kernel::{Cancellation, TurnOutcome, context};
use keel_testkit::MemStore;

use super::support::{Emit, Harness, Recording};

const TASK: &str = "Refactor the parser. Constraint: keep the public API.";

/// `steps` emit calls of 3 000 bytes each, then "done", then the answer of a second turn.
fn script(steps: usize) -> String {
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..steps {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":3000}}}}]}},"#
        ));
    }
    json.push_str(r#"{"text":"done"},"#);
    json.push_str(
        r#"{"text":"step again","tool_calls":[{"name":"emit","arguments":{"bytes":10}}]},"#,
    );
    json.push_str(r#"{"text":"second done"}], "compaction": "Summary: emitted results."}"#);
    json
}

/// What a store was asked to read.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ReadCall {
    Read { after: Seq },
    Kinds { up_to: Seq },
    LastOf { kind: String },
}

/// A store that records its reads; with `hide_compactions`, `last_of_kind` finds nothing,
/// so the kernel falls back to reading the whole ledger.
#[derive(Debug)]
struct Watched {
    inner: Arc<dyn Store>,
    reads: Mutex<Vec<ReadCall>>,
    hide_compactions: bool,
}

impl Watched {
    fn new(inner: Arc<dyn Store>, hide_compactions: bool) -> Arc<Watched> {
        Arc::new(Watched { inner, reads: Mutex::default(), hide_compactions })
    }

    fn take(&self) -> Vec<ReadCall> {
        std::mem::take(&mut *self.reads.lock().unwrap())
    }
}

#[async_trait]
impl Store for Watched {
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        self.inner.append(events).await
    }
    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &Lease,
    ) -> Result<(), AppendError> {
        self.inner.append_leased(events, lease).await
    }
    async fn acquire_lease(
        &self,
        session_id: SessionId,
        holder: &str,
        now: chrono::DateTime<chrono::Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        self.inner.acquire_lease(session_id, holder, now, ttl).await
    }
    async fn renew_lease(
        &self,
        lease: &Lease,
        now: chrono::DateTime<chrono::Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        self.inner.renew_lease(lease, now, ttl).await
    }
    async fn release_lease(&self, lease: &Lease) -> Result<(), LeaseError> {
        self.inner.release_lease(lease).await
    }
    async fn read(
        &self,
        session_id: SessionId,
        after: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        self.reads.lock().unwrap().push(ReadCall::Read { after });
        self.inner.read(session_id, after).await
    }
    async fn read_kinds(
        &self,
        session_id: SessionId,
        kinds: &[&str],
        up_to: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        self.reads.lock().unwrap().push(ReadCall::Kinds { up_to });
        self.inner.read_kinds(session_id, kinds, up_to).await
    }
    async fn last_of_kind(
        &self,
        session_id: SessionId,
        kind: &str,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        self.reads.lock().unwrap().push(ReadCall::LastOf { kind: kind.to_owned() });
        if self.hide_compactions && kind == "compaction" {
            return Ok(None);
        }
        self.inner.last_of_kind(session_id, kind).await
    }
    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError> {
        self.inner.sessions().await
    }
    async fn resolve_session(&self, prefix: &str) -> Result<SessionId, ResolveError> {
        self.inner.resolve_session(prefix).await
    }
    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError> {
        self.inner.request_cancel(session_id).await
    }
    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError> {
        self.inner.take_cancel_request(session_id).await
    }
}

fn compactions(events: &[RuntimeEvent]) -> Vec<&RuntimeEvent> {
    events.iter().filter(|event| matches!(event.kind, EventKind::Compaction { .. })).collect()
}

fn chain_of(event: &RuntimeEvent) -> Option<&DigestChain> {
    match &event.kind {
        EventKind::Compaction { chain, .. } => chain.as_ref(),
        _ => None,
    }
}

/// One long turn in a small window: several compactions.
async fn long_session(harness: &mut Harness) -> (SessionId, Vec<RuntimeEvent>) {
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(6000));
    let kernel = harness.kernel(&script(150));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
    let events = harness.events(session).await;
    (session, events)
}

#[tokio::test]
async fn issue_13_each_compaction_hashes_only_what_it_covers_since_the_previous_one() {
    let mut harness = Harness::new();
    let (_, events) = long_session(&mut harness).await;
    let all = compactions(&events);
    assert!(all.len() >= 3, "only {} compactions", all.len());
    assert_eq!(chain_of(all[0]), None, "the first compaction hashes from seq 1");
    let mut responses = 0;
    let mut next = 0;
    for event in &events {
        if next < all.len() && event.seq == all[next].seq {
            let EventKind::Compaction { covers_to, digest, responses_before, .. } = &event.kind
            else {
                unreachable!()
            };
            assert_eq!(*responses_before, Some(responses), "compaction #{}", event.seq);
            if next > 0 {
                let previous = all[next - 1];
                let EventKind::Compaction {
                    covers_to: previous_to, digest: previous_digest, ..
                } = &previous.kind
                else {
                    unreachable!()
                };
                let chain = chain_of(event).expect("later compactions are chained");
                assert_eq!(
                    chain,
                    &DigestChain {
                        compaction: previous.seq,
                        covers_to: *previous_to,
                        digest: previous_digest.clone(),
                    }
                );
                let segment = context::covered(&events, previous_to.next(), *covers_to).unwrap();
                assert_eq!(*digest, context::chained_digest(previous_digest, segment));
            }
            next += 1;
        }
        if event.kind.is_conversation_response() {
            responses += 1;
        }
    }
    let mut verified = BTreeMap::new();
    let active = context::active_compaction(&events, &mut verified).map(|event| event.seq);
    assert_eq!(active, all.last().map(|event| event.seq));
}

/// DESIGN.md §7: a later change to the covered events invalidates the compaction, also
/// when the change is to events an earlier compaction of the chain covers.
#[tokio::test]
async fn issue_13_a_change_to_any_covered_event_invalidates_the_chained_compaction() {
    let mut harness = Harness::new();
    let (_, events) = long_session(&mut harness).await;
    let all: Vec<RuntimeEvent> = compactions(&events).into_iter().cloned().collect();
    let (first, last) = (&all[0], &all[all.len() - 1]);
    let covers_to = |event: &RuntimeEvent| match &event.kind {
        EventKind::Compaction { covers_to, .. } => *covers_to,
        _ => unreachable!(),
    };
    let tamper = |events: &[RuntimeEvent], at: Seq| -> Vec<RuntimeEvent> {
        let mut changed = events.to_vec();
        let target = changed
            .iter_mut()
            .filter(|event| event.seq <= at)
            .rev()
            .find(|event| matches!(event.kind, EventKind::ToolResult { .. }))
            .unwrap();
        if let EventKind::ToolResult { content, .. } = &mut target.kind {
            content.push('!');
        }
        changed
    };
    let active = |events: &[RuntimeEvent]| {
        context::active_compaction(events, &mut BTreeMap::new()).map(|event| event.seq)
    };
    assert_eq!(active(&events), Some(last.seq));

    // A result the first compaction covers: every compaction is chained on it.
    assert_eq!(active(&tamper(&events, covers_to(first))), None);
    // A result only the last compaction covers: the one before it is the active one.
    let before_last = &all[all.len() - 2];
    let changed = tamper(&events, covers_to(last));
    let differs = changed.iter().zip(&events).find(|(a, b)| a != b).map(|(a, _)| a.seq);
    assert!(differs.is_some_and(|seq| seq > covers_to(before_last) && seq <= covers_to(last)));
    assert_eq!(active(&changed), Some(before_last.seq));
    // The untampered history still checks out; the checks are cached by seq.
    let mut verified = BTreeMap::new();
    assert!(context::active_compaction(&events, &mut verified).is_some());
    assert!(verified.values().all(|ok| *ok));
}

#[tokio::test]
async fn issue_13_a_new_turn_reads_only_from_the_latest_compaction_and_projects_the_same() {
    let mut harness = Harness::new();
    let (session, events) = long_session(&mut harness).await;
    let latest = *compactions(&events).last().unwrap();
    let base = chain_of(latest).expect("the latest compaction is chained").covers_to;

    // The same ledger in a second store, loaded whole (its compactions are hidden).
    let copy = MemStore::new();
    copy.append(&events).await.unwrap();
    let mut runs = Vec::new();
    for (store, hide) in [(harness.store.clone(), false), (Arc::new(copy) as Arc<dyn Store>, true)]
    {
        let watched = Watched::new(store, hide);
        let mut turn = Harness::new();
        turn.extra_tools.push(Emit::tool());
        turn.context = harness.context;
        turn.store = watched.clone();
        // Ids and times continue the first turn's, so nothing collides with its ids.
        turn.ids = harness.ids.clone();
        turn.clock = harness.clock.clone();
        let model = keel_testkit::ScriptedModel::new(
            serde_json::from_str(&script(150)).unwrap(),
            "test-script",
        );
        let requests: Arc<Mutex<Vec<ModelRequest>>> = Arc::default();
        let kernel = turn.kernel_with(Arc::new(Recording {
            inner: Arc::new(model),
            requests: Arc::clone(&requests),
        }));
        let report = kernel
            .run_turn(session, "and once more", &turn.run_config(), &Cancellation::new())
            .await
            .unwrap();
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "second done".into() });
        let requests = requests.lock().unwrap().clone();
        runs.push((watched.take(), requests, turn.events(session).await));
    }
    let (tail_reads, tail_requests, tail_events) = &runs[0];
    let (full_reads, full_requests, full_events) = &runs[1];
    // Loading from the compaction reads the facts up to its base and the events after it.
    assert!(base > Seq(1));
    assert!(tail_reads.contains(&ReadCall::Kinds { up_to: base }), "{tail_reads:?}");
    assert!(tail_reads.contains(&ReadCall::Read { after: base }), "{tail_reads:?}");
    let whole = ReadCall::Read { after: Seq(0) };
    // (The harness's own `events` reads after the turn are not in the log: taken before.)
    assert!(!tail_reads.contains(&whole), "the whole ledger was read: {tail_reads:?}");
    assert!(full_reads.contains(&whole), "{full_reads:?}");
    // And the model was asked exactly the same, with the carried task in the system prompt.
    assert_eq!(tail_requests, full_requests);
    assert!(tail_requests[0].system.contains("Constraint: keep the public API."));
    // Both ledgers grew the same way (ids and times come from the same fakes).
    let kinds =
        |events: &[RuntimeEvent]| events.iter().map(|event| event.kind.name()).collect::<Vec<_>>();
    assert_eq!(kinds(tail_events), kinds(full_events));
    let outcome = tail_events.iter().rev().find_map(|event| match &event.kind {
        EventKind::ToolResult { outcome, .. } => Some(*outcome),
        _ => None,
    });
    assert_eq!(outcome, Some(Outcome::Ok));
}

/// `steps` emit steps where steps 5, 40 and 80 make the same invalid call, then that call
/// once more (for the resumed run) and "done".
fn failing_script(steps: usize) -> String {
    let mut json = String::from(r#"{"steps":["#);
    let failing = r#"{"text":"bad","tool_calls":[{"name":"emit","arguments":{"bytes":-1}}]},"#;
    for step in 0..steps {
        if [5, 40, 80].contains(&step) {
            json.push_str(failing);
        } else {
            json.push_str(&format!(
                r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":3000}}}}]}},"#
            ));
        }
    }
    json.push_str(failing);
    json.push_str(r#"{"text":"done"}], "compaction": "Summary: emitted results."}"#);
    json
}

/// The repeated-failure guard of a turn survives a resume that reads only from the latest
/// compaction: the failures it covers come from the counts the compactions recorded.
#[tokio::test]
async fn issue_13_a_resumed_long_turn_keeps_its_failure_counts_without_reading_the_turn() {
    let steps = 150;
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(Some(6000));
    harness.max_steps = Some(u32::try_from(steps).unwrap());
    let kernel = harness.kernel(&failing_script(steps));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{:?}", report.outcome);
    let events = harness.events(session).await;
    let latest = *compactions(&events).last().unwrap();
    let base = chain_of(latest).unwrap().covers_to;
    let failures = events
        .iter()
        .filter(|event| {
            matches!(&event.kind, EventKind::ToolResult { outcome: Outcome::Error, .. })
        })
        .map(|event| event.seq)
        .collect::<Vec<_>>();
    assert_eq!(failures.len(), 3);
    assert!(failures.iter().all(|seq| *seq < base), "{failures:?} not all below {base}");
    let EventKind::Compaction { failures: Some(recorded), .. } = &latest.kind else {
        panic!("the latest compaction records the turn's failures")
    };
    assert_eq!(recorded.counts.iter().map(|count| count.failures).collect::<Vec<_>>(), [3]);

    let copy = MemStore::new();
    copy.append(&events).await.unwrap();
    let mut results = Vec::new();
    for (store, hide) in [(harness.store.clone(), false), (Arc::new(copy) as Arc<dyn Store>, true)]
    {
        let watched = Watched::new(store, hide);
        let mut resumed = Harness::new();
        resumed.extra_tools.push(Emit::tool());
        resumed.context = harness.context;
        resumed.store = watched.clone();
        resumed.ids = harness.ids.clone();
        resumed.clock = harness.clock.clone();
        let kernel = resumed.kernel(&failing_script(steps));
        let report =
            kernel.resume(session, &resumed.run_config(), &Cancellation::new()).await.unwrap();
        assert_eq!(report.outcome, TurnOutcome::Completed { text: "done".into() });
        let reads = watched.take();
        let after = resumed.events(session).await;
        let blocked = after.iter().rev().find_map(|event| match &event.kind {
            EventKind::ToolResult { content, .. } => Some(content.clone()),
            _ => None,
        });
        results.push((reads, blocked));
    }
    let (tail_reads, tail_blocked) = &results[0];
    let (_, full_blocked) = &results[1];
    assert!(
        tail_blocked.as_deref().is_some_and(|text| text.contains("already failed 3 times")),
        "{tail_blocked:?}"
    );
    assert_eq!(tail_blocked, full_blocked);
    // Nothing at or below the base was read whole: only the facts, by kind.
    let below =
        tail_reads.iter().find(|read| matches!(read, ReadCall::Read { after } if *after < base));
    assert_eq!(below, None, "{tail_reads:?}");
}

/// `steps` emit calls of `bytes` bytes each, then "done".
fn emit_script(steps: usize, bytes: usize) -> String {
    let mut json = String::from(r#"{"steps":["#);
    for step in 0..steps {
        json.push_str(&format!(
            r#"{{"text":"step {step}","tool_calls":[{{"name":"emit","arguments":{{"bytes":{bytes}}}}}]}},"#
        ));
    }
    json.push_str(r#"{"text":"done"}], "compaction": "Summary: emitted results."}"#);
    json
}

/// The checkpoint of a run suspended by its step budget after `steps` steps of `bytes`
/// each in `window`: the session's events, the checkpoint's evidence, and the store's
/// reads.
async fn suspended_checkpoint(
    steps: usize,
    bytes: usize,
    window: Option<u64>,
) -> (Vec<RuntimeEvent>, Vec<keel_contracts::Evidence>, Vec<ReadCall>) {
    let watched = Watched::new(Arc::new(MemStore::new()), false);
    let mut harness = Harness::new();
    harness.extra_tools.push(Emit::tool());
    harness.context = ContextPolicy::for_window(window);
    harness.max_steps = Some(u32::try_from(steps).unwrap());
    harness.store = watched.clone();
    let kernel = harness.kernel(&emit_script(steps, bytes));
    let session = harness.session(&kernel).await;
    let report =
        kernel.run_turn(session, TASK, &harness.run_config(), &Cancellation::new()).await.unwrap();
    assert!(matches!(report.outcome, TurnOutcome::Suspended { .. }), "{:?}", report.outcome);
    let reads = watched.take();
    let events = harness.events(session).await;
    let evidence = events
        .iter()
        .find_map(|event| match &event.kind {
            EventKind::Checkpoint { evidence, .. } => Some(evidence.clone()),
            _ => None,
        })
        .unwrap();
    (events, evidence, reads)
}

fn result_seqs(events: &[RuntimeEvent]) -> Vec<Seq> {
    events
        .iter()
        .filter(|event| matches!(event.kind, EventKind::ToolResult { .. }))
        .map(|event| event.seq)
        .collect()
}

/// A checkpoint lists the run's last 64 results (issue #13: it is in the suffix every
/// later load reads, so it must not grow with the run), with their calls' arguments.
#[tokio::test]
async fn issue_13_a_checkpoint_lists_the_runs_last_64_results() {
    let (events, evidence, _) = suspended_checkpoint(100, 10, None).await;
    let results = result_seqs(&events);
    assert!(results.len() > 64, "{} results", results.len());
    let listed: Vec<Seq> = evidence.iter().map(|item| item.seq).collect();
    assert_eq!(listed, results[results.len() - 64..]);
    assert!(
        evidence.iter().all(|item| item.tool == "emit" && item.arguments == r#"{"bytes":10}"#),
        "{evidence:?}"
    );
}

/// A run that began long before the retained window: its checkpoint lists the latest
/// results held in memory, and nothing below the base is read from the store for it.
#[tokio::test]
async fn issue_13_a_long_runs_checkpoint_is_built_from_memory_without_reading_the_run() {
    let (events, evidence, reads) = suspended_checkpoint(150, 3000, Some(6000)).await;
    let base = chain_of(compactions(&events).last().unwrap()).unwrap().covers_to;
    let run_started =
        events.iter().find(|event| matches!(event.kind, EventKind::RunStarted { .. })).unwrap().seq;
    assert!(run_started < base, "the run began at #{run_started}, the base is #{base}");
    let results = result_seqs(&events);
    let listed: Vec<Seq> = evidence.iter().map(|item| item.seq).collect();
    assert!(!listed.is_empty() && listed.len() <= 64, "{listed:?}");
    assert_eq!(listed, results[results.len() - listed.len()..]);
    assert!(listed.iter().all(|seq| *seq > base), "{listed:?} not all above #{base}");
    // Only the new session's first load (nothing compacted yet) reads from #0.
    let below = reads
        .iter()
        .find(|read| matches!(read, ReadCall::Read { after } if *after > Seq(0) && *after < base));
    assert_eq!(below, None, "{reads:?}");
}
