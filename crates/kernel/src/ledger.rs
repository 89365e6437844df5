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

use std::sync::Arc;

use keel_contracts::{Clock, EventKind, RunId, RuntimeEvent, Seq, SessionId, Store, TurnId};

use crate::{KernelError, Observer};

/// A session's events plus the means to append more.
///
/// `events` is in seq order: `events[..durable]` is exactly what the store acknowledged,
/// `events[durable..]` is staged (seqs assigned, not yet written). A failed commit drops
/// the staged events again, so `events` never holds what the store refused.
pub(crate) struct Ledger {
    pub(crate) session_id: SessionId,
    pub(crate) events: Vec<RuntimeEvent>,
    /// How many of `events` are durable (the rest are staged).
    durable: usize,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    observer: Arc<dyn Observer>,
    /// Model responses recorded in the session (the scripted model's position).
    responses: u64,
    /// The lease this process drives the session under; appends are fenced by it.
    pub(crate) lease: Option<keel_contracts::Lease>,
}

impl Ledger {
    /// Loads a session's whole ledger.
    pub(crate) async fn load(
        session_id: SessionId,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
    ) -> Result<Ledger, KernelError> {
        let events = store.read(session_id, Seq(0)).await?;
        let responses = crate::projection::responses_in_session(&events);
        let durable = events.len();
        Ok(Ledger { session_id, events, durable, store, clock, observer, responses, lease: None })
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
            store,
            clock,
            observer,
            responses: 0,
            lease: None,
        }
    }

    /// Model responses recorded in the session.
    pub(crate) fn responses(&self) -> u64 {
        self.responses
    }

    fn last_seq(&self) -> Seq {
        self.events.last().map_or(Seq(0), |event| event.seq)
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
            seq: self.last_seq().next(),
            session_id: self.session_id,
            turn_id,
            run_id,
            ts: self.clock.now(),
            kind,
        };
        if event.kind.is_conversation_response() {
            self.responses += 1;
        }
        self.events.push(event);
        self.events.last().unwrap_or_else(|| unreachable!("an event was just pushed"))
    }

    /// Whether events are staged and not yet durable.
    pub(crate) fn has_staged(&self) -> bool {
        self.durable < self.events.len()
    }

    /// Makes every staged event durable in one store append (one transaction), then
    /// reports them to the observer in seq order. A no-op when nothing is staged.
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
            return Err(error.into());
        }
        for event in &self.events[self.durable..] {
            self.observer.on_event(event);
        }
        self.durable = self.events.len();
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
}
