//! The kernel's handle on one session's ledger: stages events in memory, commits them to
//! the store in groups (one [`Store::append`], one transaction, one fsync), and keeps them
//! as the projection's source.
//!
//! Group commit (docs/decisions.md, "Group commit in the kernel"): [`Ledger::stage`] gives
//! an event its seq and puts it in `events` at once, so the projection sees it;
//! [`Ledger::commit`] makes every staged event durable in one store append, and only then
//! reports them to the observer. [`Ledger::append`] is stage + commit. The loop commits
//! where durability is needed: before an effect (`tool_attempt_prepared`), before anything
//! leaves the process (a model request, a permission prompt, a child, an outbox flush) and
//! with the terminal event; everything else is staged and rides along.
//!
//! Memory is bounded by the retained window, not the history (issue #13). The ledger holds
//! every event after its *base* and, at or below the base, only the session's facts
//! ([`FACT_KINDS`]: `session_created`, turn and run starts and ends, permission answers,
//! boundary revisions, sealing), which are few and small. The base is the `covers_to` of
//! the active compaction: the projection starts after it, so nothing the projection needs
//! is below it. A compaction is checked against its covered events while they are held
//! (when it is committed, or when the session is loaded), and the check is kept
//! ([`Ledger::checks`]): from then on that compaction is the anchor of its chain in
//! memory, as it would be for any reader that does not hold what it covers. The store
//! keeps everything, and what needs covered history reads it from there
//! ([`Ledger::history_from`]).
//!
//! The held events grow by a quarter at a time, not by doubling (a `Vec`'s slack at a
//! window of thousands of events is megabytes), and shrink to fit when a compaction drops
//! what it covers.
//!
//! [`Ledger::load`] reads from the store: the latest compaction (an indexed query), the
//! facts at or below the base of its digest chain, and the events after it, so resuming a
//! session of 100 000 events reads a bounded suffix; the compaction is checked against what
//! was read, and what it covers is then dropped from memory as at a commit. When that
//! compaction does not check out against what was read, the whole ledger is read instead.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use keel_contracts::{Clock, EventKind, RunId, RuntimeEvent, Seq, SessionId, Store, TurnId};

use crate::{KernelError, Observer};

/// Kinds of events kept in memory below the base: the session's facts, which the loop
/// reads from the whole session (grants, the boundary, the turn and run being resumed).
/// keel-store's SQLite indexes these kinds by kind (`INDEXED_KINDS`, a partial index): a
/// kind added here is added there, in a new migration.
pub(crate) const FACT_KINDS: &[&str] = &[
    "session_created",
    "session_sealed",
    "plan_approved",
    "turn_started",
    "run_started",
    "run_completed",
    "run_failed",
    "run_suspended",
    "run_cancelled",
    "run_denied",
    "permission_settled",
    "boundary_revised",
];

/// Events the held ones grow by, at least, when they are full.
const GROWTH_MIN: usize = 64;

/// Whether `kind` is one of [`FACT_KINDS`].
fn is_fact(kind: &EventKind) -> bool {
    FACT_KINDS.contains(&kind.name())
}

/// A session's events (the retained suffix and the session's facts) plus the means to
/// append more.
///
/// `events` is in seq order: `events[..durable]` is exactly what the store acknowledged,
/// `events[durable..]` is staged (seqs assigned, not yet written). A failed commit drops
/// the staged events again, so `events` never holds what the store refused. Every event
/// with seq above `base` is in it.
pub(crate) struct Ledger {
    pub(crate) session_id: SessionId,
    events: Vec<RuntimeEvent>,
    /// How many of `events` are durable (the rest are staged).
    durable: usize,
    /// Events at or below this seq are held only if they are facts ([`FACT_KINDS`]).
    base: Seq,
    /// The session's last seq (held or not).
    last_seq: Seq,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    /// Model responses recorded in the session (the scripted model's position).
    responses: u64,
    /// The lease this process drives the session under; appends are fenced by it.
    pub(crate) lease: Option<keel_contracts::Lease>,
    /// Digest checks of the held compactions, by seq (see [`Ledger::checks`]).
    checks: BTreeMap<Seq, bool>,
}

impl Ledger {
    /// Loads a session: from its latest compaction on when that compaction checks out
    /// (see the module docs), else the whole ledger. An unknown session loads empty.
    pub(crate) async fn load(
        session_id: SessionId,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
    ) -> Result<Ledger, KernelError> {
        let mut ledger = Ledger {
            session_id,
            events: Vec::new(),
            durable: 0,
            base: Seq(0),
            last_seq: Seq(0),
            store,
            clock,
            observer,
            responses: 0,
            lease: None,
            checks: BTreeMap::new(),
        };
        if !ledger.load_tail().await? {
            let events = ledger.store.read(session_id, Seq(0)).await?;
            ledger.responses = crate::projection::responses_in_session(&events);
            ledger.last_seq = events.last().map_or(Seq(0), |event| event.seq);
            ledger.events = events;
            ledger.base = Seq(0);
            ledger.checks.clear();
        }
        ledger.durable = ledger.events.len();
        ledger.drop_covered();
        Ok(ledger)
    }

    /// Reads the facts up to the latest compaction's base and every event after it;
    /// `false` (nothing kept) when there is no chained compaction or it does not check out.
    /// What the compaction covers is dropped afterwards, by [`Ledger::load`].
    async fn load_tail(&mut self) -> Result<bool, KernelError> {
        let Some(latest) = self.store.last_of_kind(self.session_id, "compaction").await? else {
            return Ok(false);
        };
        let EventKind::Compaction { chain: Some(chain), responses_before: Some(before), .. } =
            &latest.kind
        else {
            return Ok(false);
        };
        let base = chain.covers_to;
        let mut events = self.store.read_kinds(self.session_id, FACT_KINDS, base).await?;
        if events.iter().any(|event| event.seq > base) {
            return Ok(false);
        }
        let tail = self.store.read(self.session_id, base).await?;
        if tail.first().is_some_and(|first| first.seq != base.next()) {
            return Ok(false);
        }
        events.extend(tail);
        let mut checks = BTreeMap::new();
        let active = crate::context::active_compaction(&events, &mut checks);
        if active.map(|event| event.seq) != Some(latest.seq) {
            return Ok(false);
        }
        let after = events.partition_point(|event| event.seq <= latest.seq);
        self.responses = before + crate::projection::responses_in_session(&events[after..]);
        self.last_seq = events.last().map_or(Seq(0), |event| event.seq);
        self.events = events;
        self.base = base;
        self.checks = checks;
        Ok(true)
    }

    /// An empty ledger for a session about to be created.
    pub(crate) fn new_session(
        session_id: SessionId,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
    ) -> Ledger {
        Ledger {
            session_id,
            events: Vec::new(),
            durable: 0,
            base: Seq(0),
            last_seq: Seq(0),
            store,
            clock,
            observer,
            responses: 0,
            lease: None,
            checks: BTreeMap::new(),
        }
    }

    /// The events held in memory, in seq order: every event after [`Ledger::base`], and
    /// at or below it only the session's facts ([`FACT_KINDS`]).
    pub(crate) fn events(&self) -> &[RuntimeEvent] {
        &self.events
    }

    /// The seq at or below which only the session's facts are held ([`FACT_KINDS`]);
    /// every event after it is in [`Ledger::events`].
    pub(crate) fn base(&self) -> Seq {
        self.base
    }

    /// The digest checks of the held compactions, by seq, made while their covered events
    /// were held (at a commit, or at load from what the store gave): seed a check of
    /// [`Ledger::events`] with these ([`crate::context::active_compaction`]'s `verified`),
    /// since the active compaction's covered events are no longer held to check again.
    pub(crate) fn checks(&self) -> &BTreeMap<Seq, bool> {
        &self.checks
    }

    /// The first event (`session_created` in a well-formed session).
    pub(crate) fn first(&self) -> Option<&RuntimeEvent> {
        self.events.first().filter(|event| event.seq == Seq(1))
    }

    /// Model responses recorded in the session.
    pub(crate) fn responses(&self) -> u64 {
        self.responses
    }

    /// The session's last seq.
    pub(crate) fn last_seq(&self) -> Seq {
        self.last_seq
    }

    /// Every event from `from` on: borrowed when memory holds them all, otherwise read from
    /// the store (covered history: rare paths such as recovery of a run that began before
    /// the retained window, or paging an old result).
    ///
    /// # Errors
    ///
    /// [`KernelError`] when the store cannot be read.
    pub(crate) async fn history_from(
        &self,
        from: Seq,
    ) -> Result<Cow<'_, [RuntimeEvent]>, KernelError> {
        if from > self.base {
            let start = self.events.partition_point(|event| event.seq < from);
            return Ok(Cow::Borrowed(&self.events[start..]));
        }
        let after = Seq(from.0.saturating_sub(1));
        let mut history = self.store.read(self.session_id, after).await?;
        // The store has only what is durable; what is staged follows it.
        let read_to = history.last().map_or(after, |event| event.seq);
        history.extend(self.events[self.durable..].iter().filter(|e| e.seq > read_to).cloned());
        Ok(Cow::Owned(history))
    }

    /// The latest recorded result of the call `call_id` other than the pager's own (the
    /// tool that pages results, `read_tool_result`), for a result memory does not hold:
    /// one indexed store lookup ([`Store::last_tool_result`]), or, when that finds a
    /// result of `pager` with the id (ids repeated in a ledger older than the unique ids),
    /// the session read from the store. `None` when there is none.
    ///
    /// # Errors
    ///
    /// [`KernelError`] when the store cannot be read.
    pub(crate) async fn last_tool_result(
        &self,
        call_id: &str,
        pager: &str,
    ) -> Result<Option<Cow<'_, [RuntimeEvent]>>, KernelError> {
        let id = keel_contracts::ToolCallId(call_id.to_owned());
        let Some(found) = self.store.last_tool_result(self.session_id, &id).await? else {
            return Ok(None);
        };
        match &found.kind {
            EventKind::ToolResult { tool, .. } if tool != pager => {
                Ok(Some(Cow::Owned(vec![found])))
            }
            _ => Ok(Some(self.history_from(Seq(1)).await?)),
        }
    }

    /// The repeated-failure counts `turn_id` already has (see
    /// [`crate::repeats::failures_in_turn`]): from the held events when the turn began
    /// after the base, else from the counts the compaction at the base recorded plus the
    /// events after it, else (a ledger compacted before compactions recorded them) from the
    /// turn's events read from the store.
    ///
    /// # Errors
    ///
    /// [`KernelError`] when the store cannot be read.
    pub(crate) async fn failures_in_turn(
        &self,
        turn_id: TurnId,
    ) -> Result<BTreeMap<(String, String), u32>, KernelError> {
        let turn_start = self
            .events
            .iter()
            .rev()
            .find(|event| {
                event.turn_id == Some(turn_id)
                    && matches!(event.kind, EventKind::TurnStarted { .. })
            })
            .map_or(Seq(1), |event| event.seq);
        let after_base = self.events.partition_point(|event| event.seq <= self.base);
        if turn_start > self.base {
            return Ok(crate::repeats::failures_in_turn(&self.events[after_base..], turn_id));
        }
        let at_base = self.events[after_base..].iter().find_map(|event| match &event.kind {
            EventKind::Compaction { covers_to, failures: Some(failures), .. }
                if *covers_to == self.base && failures.turn_id == turn_id =>
            {
                Some(failures)
            }
            _ => None,
        });
        if let Some(at_base) = at_base {
            let mut counts: BTreeMap<(String, String), u32> = at_base
                .counts
                .iter()
                .map(|count| ((count.tool.clone(), count.arguments_sha256.clone()), count.failures))
                .collect();
            let since = crate::repeats::failures_in_turn(&self.events[after_base..], turn_id);
            for (key, failures) in since {
                *counts.entry(key).or_insert(0) += failures;
            }
            return Ok(counts);
        }
        let history = self.history_from(turn_start).await?;
        Ok(crate::repeats::failures_in_turn(&history, turn_id))
    }

    /// Stages one event: gives it the next seq and the clock's time and keeps it in
    /// `events`, where the projection sees it at once. It is durable, and reaches the
    /// observer, only at the next [`Ledger::commit`] (or [`Ledger::append`]).
    pub(crate) fn stage(
        &mut self,
        turn_id: Option<TurnId>,
        run_id: Option<RunId>,
        kind: EventKind,
    ) -> &RuntimeEvent {
        let event = RuntimeEvent {
            seq: self.last_seq.next(),
            session_id: self.session_id,
            turn_id,
            run_id,
            ts: self.clock.now(),
            kind,
        };
        if event.kind.is_conversation_response() {
            self.responses += 1;
        }
        self.last_seq = event.seq;
        if self.events.len() == self.events.capacity() {
            // Grow by a quarter: doubling leaves up to a whole window of slack.
            self.events.reserve_exact((self.events.len() / 4).max(GROWTH_MIN));
        }
        self.events.push(event);
        self.events.last().unwrap_or_else(|| unreachable!("an event was just pushed"))
    }

    /// Whether events are staged and not yet durable.
    pub(crate) fn has_staged(&self) -> bool {
        self.durable < self.events.len()
    }

    /// Makes every staged event durable in one store append (one transaction), then
    /// reports them to the observer in seq order, and drops from memory what a compaction
    /// among them covers once it checks out (see the module docs). A no-op when nothing is staged.
    ///
    /// # Errors
    ///
    /// [`KernelError::Append`] when the store refuses the batch; the staged events are
    /// dropped from `events` (the store holds all of them or none, see [`Store::append`]),
    /// so memory never runs ahead of the ledger.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the staged events stay staged in memory while the store may or may not
    /// have written them; the ledger must not be used after that (the loop never drops it
    /// mid-commit and then continues).
    pub(crate) async fn commit(&mut self) -> Result<(), KernelError> {
        if !self.has_staged() {
            return Ok(());
        }
        let staged = &self.events[self.durable..];
        let written = match &self.lease {
            Some(lease) => self.store.append_leased(staged, lease).await,
            None => self.store.append(staged).await,
        };
        if let Err(error) = written {
            let dropped = self.events.split_off(self.durable);
            let responses =
                dropped.iter().filter(|event| event.kind.is_conversation_response()).count();
            self.responses =
                self.responses.saturating_sub(u64::try_from(responses).unwrap_or(u64::MAX));
            if let Some(first) = dropped.first() {
                self.last_seq = Seq(first.seq.0.saturating_sub(1));
            }
            return Err(error.into());
        }
        let mut compacted = false;
        for event in &self.events[self.durable..] {
            self.observer.on_event(event);
            compacted |= matches!(event.kind, EventKind::Compaction { .. });
        }
        self.durable = self.events.len();
        if compacted {
            self.drop_covered();
        }
        Ok(())
    }

    /// Stages one event and commits it with everything staged before it; returns it.
    ///
    /// # Errors
    ///
    /// As [`Ledger::commit`]: on error neither this event nor the staged ones are kept.
    pub(crate) async fn append(
        &mut self,
        turn_id: Option<TurnId>,
        run_id: Option<RunId>,
        kind: EventKind,
    ) -> Result<&RuntimeEvent, KernelError> {
        self.stage(turn_id, run_id, kind);
        self.commit().await?;
        Ok(self.events.last().unwrap_or_else(|| unreachable!("an event was just committed")))
    }

    /// Checks the held compactions (while what they cover is held; the checks are kept
    /// in [`Ledger::checks`]) and drops the events at or below the active one's
    /// `covers_to` that are not facts: the projection starts after it. Called only when
    /// every held event is durable (at load, or after a commit with a compaction).
    fn drop_covered(&mut self) {
        let active = crate::context::active_compaction(&self.events, &mut self.checks);
        let Some(EventKind::Compaction { covers_to, .. }) = active.map(|event| &event.kind) else {
            return;
        };
        let new_base = *covers_to;
        if new_base <= self.base {
            return;
        }
        self.events.retain(|event| event.seq > new_base || is_fact(&event.kind));
        self.events.shrink_to_fit();
        self.durable = self.events.len();
        // Checks of compactions no longer held are of no use.
        self.checks.retain(|seq, _| *seq > new_base);
        self.base = new_base;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_contracts::{CarriedContext, DigestChain, RequestPurpose};
    use keel_testkit::{FakeClock, MemStore};

    const READ: &str = "read_tool_result";

    fn requested(step: u32) -> EventKind {
        EventKind::ModelRequested {
            step,
            messages: 1,
            request_sha256: format!("r{step}"),
            tokens: None,
            tokens_before_pruning: None,
            pruned_results: 0,
            purpose: RequestPurpose::Conversation,
        }
    }

    fn compaction(chain: Option<DigestChain>, covers_to: u64, digest: String) -> EventKind {
        EventKind::Compaction {
            covers_from: Seq(1),
            covers_to: Seq(covers_to),
            digest,
            chain,
            responses_before: Some(0),
            failures: None,
            summary: "s".into(),
            carried: CarriedContext::default(),
            tokens_before: 0,
            tokens_after: 0,
        }
    }

    fn held(ledger: &Ledger) -> Vec<u64> {
        ledger.events().iter().map(|event| event.seq.0).collect()
    }

    /// A compaction that checks out drops what it covers from memory, keeping the facts
    /// (chained or not); one that does not check out drops nothing; covered history is
    /// still read from the store, and a reload holds the same.
    #[tokio::test]
    async fn a_compaction_drops_what_it_covers_but_keeps_the_facts() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let session_id = SessionId(uuid::Uuid::from_u128(7));
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::new());
        let observer: Arc<dyn Observer> = Arc::new(crate::NoopObserver);
        let mut ledger =
            Ledger::new_session(session_id, store.clone(), clock.clone(), observer.clone());
        let created = serde_json::json!({
            "kind": "session_created", "workspace": "/w", "model": "m",
            "envelope": keel_contracts::Envelope::executor(), "mode": "live",
        });
        ledger.append(None, None, serde_json::from_value(created).unwrap()).await.unwrap();
        ledger.append(None, None, EventKind::TurnStarted { input: "task".into() }).await.unwrap();
        for step in 0..4 {
            ledger.append(None, None, requested(step)).await.unwrap();
        }
        // #7: a compaction whose digest does not match what it covers drops nothing.
        ledger.append(None, None, compaction(None, 4, "wrong".into())).await.unwrap();
        assert_eq!(held(&ledger), [1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(ledger.base(), Seq(0));
        // #8, unchained, over #1–#4: #3 and #4 leave memory, the facts #1 and #2 stay.
        let first = crate::context::digest_of(&ledger.events()[..4]);
        ledger.append(None, None, compaction(None, 4, first.clone())).await.unwrap();
        assert_eq!(held(&ledger), [1, 2, 5, 6, 7, 8]);
        assert_eq!(ledger.base(), Seq(4));
        for step in 4..8 {
            ledger.append(None, None, requested(step)).await.unwrap();
        }
        // #13, chained on #8, over #5–#10 (#7 and #8 among them).
        let segment = crate::context::covered(ledger.events(), Seq(5), Seq(10)).unwrap();
        let digest = crate::context::chained_digest(&first, segment);
        let chain = DigestChain { compaction: Seq(8), covers_to: Seq(4), digest: first };
        ledger.append(None, None, compaction(Some(chain), 10, digest)).await.unwrap();
        assert_eq!(held(&ledger), [1, 2, 11, 12, 13]);
        assert_eq!(ledger.base(), Seq(10));
        assert_eq!(ledger.checks().keys().copied().collect::<Vec<_>>(), [Seq(13)]);
        assert_eq!(ledger.last_seq(), Seq(13));
        assert_eq!(ledger.first().map(|event| event.kind.name()), Some("session_created"));
        // The active compaction is still found in what is held, from the kept check.
        let mut checks = ledger.checks().clone();
        let active = crate::context::active_compaction(ledger.events(), &mut checks);
        assert_eq!(active.map(|event| event.seq), Some(Seq(13)));
        let from_store = ledger.history_from(Seq(3)).await.unwrap();
        assert!(matches!(from_store, Cow::Owned(_)));
        assert_eq!(from_store.first().map(|event| event.seq), Some(Seq(3)));
        assert_eq!(from_store.len(), 11);
        let held_tail = ledger.history_from(Seq(12)).await.unwrap();
        assert!(matches!(held_tail, Cow::Borrowed(_)));
        assert_eq!(held_tail.len(), 2);
        // The next event still gets the next seq.
        let next = ledger.append(None, None, requested(9)).await.unwrap().seq;
        assert_eq!(next, Seq(14));
        // A load holds the same: it reads from #13's chain on, checks #13 and drops the rest.
        let loaded = Ledger::load(session_id, store, clock, observer).await.unwrap();
        assert_eq!(held(&loaded), [1, 2, 11, 12, 13, 14]);
        assert_eq!(loaded.base(), Seq(10));
        assert_eq!(loaded.checks().get(&Seq(13)), Some(&true));
    }

    fn result(call_id: &str, tool: &str, content: &str) -> EventKind {
        EventKind::ToolResult {
            call_id: call_id.into(),
            attempt_id: None,
            tool: tool.to_owned(),
            outcome: keel_contracts::Outcome::Ok,
            content: content.to_owned(),
            bytes: content.len() as u64,
            raw: None,
        }
    }

    /// A result a compaction covered is found in the store by its call id, alone; one whose
    /// latest result with that id is `read_tool_result`'s own is looked for in the session.
    #[tokio::test]
    async fn a_covered_result_is_read_from_the_store_by_its_call_id() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let session_id = SessionId(uuid::Uuid::from_u128(9));
        let mut ledger = Ledger::new_session(
            session_id,
            store,
            Arc::new(FakeClock::new()),
            Arc::new(crate::NoopObserver),
        );
        let created = serde_json::json!({
            "kind": "session_created", "workspace": "/w", "model": "m",
            "envelope": keel_contracts::Envelope::executor(), "mode": "live",
        });
        ledger.append(None, None, serde_json::from_value(created).unwrap()).await.unwrap();
        ledger.append(None, None, result("old", "read_file", "old body")).await.unwrap();
        ledger.append(None, None, result("twice", "read_file", "first")).await.unwrap();
        ledger.append(None, None, result("twice", READ, "paged")).await.unwrap();
        let digest = crate::context::digest_of(ledger.events());
        ledger.append(None, None, compaction(None, 4, digest)).await.unwrap();
        assert_eq!(held(&ledger), [1, 5]);
        let found = ledger.last_tool_result("old", READ).await.unwrap().unwrap();
        assert_eq!(found.iter().map(|event| event.seq.0).collect::<Vec<_>>(), [2]);
        let whole = ledger.last_tool_result("twice", READ).await.unwrap().unwrap();
        assert_eq!(whole.len(), 5, "the session, read from the store");
        assert!(ledger.last_tool_result("never", READ).await.unwrap().is_none());
    }

    /// The held events grow by a quarter, not by doubling.
    #[tokio::test]
    async fn the_held_events_grow_by_a_quarter() {
        let store: Arc<dyn Store> = Arc::new(MemStore::new());
        let mut ledger = Ledger::new_session(
            SessionId(uuid::Uuid::from_u128(8)),
            store,
            Arc::new(FakeClock::new()),
            Arc::new(crate::NoopObserver),
        );
        for step in 0..1000 {
            ledger.stage(None, None, requested(step));
            let (len, capacity) = (ledger.events.len(), ledger.events.capacity());
            assert!(
                capacity <= len + (len / 4).max(GROWTH_MIN),
                "{len} events, room for {capacity}"
            );
        }
    }
}
