//! The kernel's handle on one session's ledger: appends durably, then keeps the durable
//! events in memory as the projection's source.

use std::sync::Arc;

use keel_contracts::{Clock, EventKind, RunId, RuntimeEvent, Seq, SessionId, Store, TurnId};

use crate::{KernelError, Observer};

/// A session's durable events plus the means to append more.
///
/// `events` holds exactly what the store acknowledged, in seq order: an event enters it
/// only after [`Store::append`] returned `Ok`.
pub(crate) struct Ledger {
    pub(crate) session_id: SessionId,
    pub(crate) events: Vec<RuntimeEvent>,
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
        Ok(Ledger { session_id, events, store, clock, observer, responses, lease: None })
    }

    /// An empty ledger for a session about to be created.
    pub(crate) fn new_session(
        session_id: SessionId,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        observer: Arc<dyn Observer>,
    ) -> Ledger {
        Ledger { session_id, events: Vec::new(), store, clock, observer, responses: 0, lease: None }
    }

    /// Model responses recorded in the session.
    pub(crate) fn responses(&self) -> u64 {
        self.responses
    }

    fn last_seq(&self) -> Seq {
        self.events.last().map_or(Seq(0), |event| event.seq)
    }

    /// Appends one event durably and returns it.
    pub(crate) async fn append(
        &mut self,
        turn_id: Option<TurnId>,
        run_id: Option<RunId>,
        kind: EventKind,
    ) -> Result<&RuntimeEvent, KernelError> {
        let event = RuntimeEvent {
            seq: self.last_seq().next(),
            session_id: self.session_id,
            turn_id,
            run_id,
            ts: self.clock.now(),
            kind,
        };
        match &self.lease {
            Some(lease) => self.store.append_leased(std::slice::from_ref(&event), lease).await?,
            None => self.store.append(std::slice::from_ref(&event)).await?,
        }
        self.observer.on_event(&event);
        if event.kind.is_conversation_response() {
            self.responses += 1;
        }
        self.events.push(event);
        Ok(self.events.last().unwrap_or_else(|| unreachable!("an event was just pushed")))
    }
}
