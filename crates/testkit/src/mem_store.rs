//! [`MemStore`]: the in-memory reference implementation of [`Store`].
//!
//! It keeps what SQLite keeps (the serialized body of each event) so that idempotency
//! compares the same bytes, corruption can be injected, and a read decodes every body the
//! way a durable store must.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use keel_contracts::{
    AppendError, EventKind, Lease, LeaseError, ReadError, ResolveError, RuntimeEvent, Seq,
    SessionId, SessionSummary, Store, ToolCallId,
};

/// An in-memory ledger with exactly the semantics of the durable stores.
///
/// Clones share the same ledger, which is how the conformance suite "reopens" it. Nothing
/// survives the last clone.
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    sessions: BTreeMap<SessionId, SessionLedger>,
    cancel_requests: BTreeSet<SessionId>,
    /// The newest lease per session (token, holder, expiry).
    leases: BTreeMap<SessionId, Lease>,
}

#[derive(Debug)]
struct SessionLedger {
    /// The JSON body of each event; index `i` holds seq `i + 1`.
    bodies: Vec<String>,
    /// Each answered call id's latest `tool_result`, as an index into `bodies`: what a
    /// database's index on the results' call ids gives, so [`Store::last_tool_result`]
    /// costs the same at event 1 000 and 100 000 here too.
    tool_results: HashMap<ToolCallId, usize>,
    summary: SessionSummary,
}

impl MemStore {
    /// An empty ledger.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Replaces the stored body at `seq` with `garbage`, as disk corruption would.
    ///
    /// Returns whether such an event existed.
    pub fn corrupt(&self, session_id: SessionId, seq: Seq, garbage: &str) -> bool {
        let mut state = self.lock();
        let Some(ledger) = state.sessions.get_mut(&session_id) else { return false };
        match body_index(seq).and_then(|index| ledger.bodies.get_mut(index)) {
            Some(body) => {
                *body = garbage.to_owned();
                true
            }
            None => false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied batch: `append`
        // mutates only after every check passed, with infallible pushes.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn encode_batch(events: &[RuntimeEvent]) -> Result<Vec<String>, AppendError> {
    validate_batch(events)?;
    events
        .iter()
        .map(|event| {
            serde_json::to_string(event)
                .map_err(|error| AppendError::Backend { message: error.to_string() })
        })
        .collect()
}

/// Appends a validated, encoded batch with the state locked (so lease checks and the
/// append are one atomic step).
fn append_locked(
    state: &mut State,
    events: &[RuntimeEvent],
    bodies: &[String],
) -> Result<(), AppendError> {
    let Some(first) = events.first() else { return Ok(()) };
    let session_id = first.session_id;
    {
        let ledger = state.sessions.get(&session_id);
        let last_seq = ledger.map_or(Seq(0), |ledger| ledger.summary.last_seq);
        let mut first_new = None;
        for (index, (event, body)) in events.iter().zip(bodies).enumerate() {
            if event.seq > last_seq {
                first_new = Some(index);
                break;
            }
            let stored = ledger
                .and_then(|ledger| body_index(event.seq).and_then(|at| ledger.bodies.get(at)));
            if stored != Some(body) {
                return Err(AppendError::SeqConflict {
                    session_id,
                    expected: last_seq.next(),
                    got: event.seq,
                });
            }
        }
        let Some(first_new) = first_new else { return Ok(()) };
        if events[first_new].seq != last_seq.next() {
            return Err(AppendError::SeqConflict {
                session_id,
                expected: last_seq.next(),
                got: events[first_new].seq,
            });
        }

        let new_events = &events[first_new..];
        let new_bodies = &bodies[first_new..];
        let ledger = match state.sessions.entry(session_id) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(SessionLedger {
                bodies: Vec::new(),
                tool_results: HashMap::new(),
                summary: summary_start(&new_events[0]),
            }),
        };
        for (event, body) in new_events.iter().zip(new_bodies) {
            if let EventKind::ToolResult { call_id, .. } = &event.kind {
                ledger.tool_results.insert(call_id.clone(), ledger.bodies.len());
            }
            ledger.bodies.push(body.clone());
            summary_apply(&mut ledger.summary, event);
        }
        Ok(())
    }
}

#[async_trait]
impl Store for MemStore {
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        let bodies = encode_batch(events)?;
        append_locked(&mut self.lock(), events, &bodies)
    }

    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &Lease,
    ) -> Result<(), AppendError> {
        let bodies = encode_batch(events)?;
        let mut state = self.lock();
        let current = state.leases.get(&lease.session_id).map_or(0, |held| held.token);
        if current != lease.token {
            return Err(AppendError::Fenced {
                session_id: lease.session_id,
                current,
                offered: lease.token,
            });
        }
        append_locked(&mut state, events, &bodies)
    }

    async fn acquire_lease(
        &self,
        session_id: SessionId,
        holder: &str,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        let mut state = self.lock();
        let previous = state.leases.get(&session_id);
        if let Some(held) = previous
            && held.holder != holder
            && held.expires_at > now
        {
            return Err(LeaseError::Held {
                session_id,
                holder: held.holder.clone(),
                expires_at: held.expires_at,
            });
        }
        let token = previous.map_or(0, |held| held.token) + 1;
        let lease = Lease {
            session_id,
            holder: holder.to_owned(),
            token,
            expires_at: now + chrono::TimeDelta::from_std(ttl).unwrap_or(chrono::TimeDelta::MAX),
        };
        state.leases.insert(session_id, lease.clone());
        Ok(lease)
    }

    async fn current_lease(&self, session_id: SessionId) -> Result<Option<Lease>, LeaseError> {
        Ok(self.lock().leases.get(&session_id).cloned())
    }

    async fn renew_lease(
        &self,
        lease: &Lease,
        now: DateTime<Utc>,
        ttl: std::time::Duration,
    ) -> Result<Lease, LeaseError> {
        let mut state = self.lock();
        match state.leases.get_mut(&lease.session_id) {
            Some(held) if held.token == lease.token => {
                held.expires_at =
                    now + chrono::TimeDelta::from_std(ttl).unwrap_or(chrono::TimeDelta::MAX);
                Ok(held.clone())
            }
            _ => Err(LeaseError::Lost { session_id: lease.session_id, token: lease.token }),
        }
    }

    async fn release_lease(&self, lease: &Lease) -> Result<(), LeaseError> {
        let mut state = self.lock();
        if let Some(held) = state.leases.get_mut(&lease.session_id)
            && held.token == lease.token
        {
            // Keep the token (fencing stays monotonic); just let it lapse now.
            held.expires_at = DateTime::<Utc>::MIN_UTC;
        }
        Ok(())
    }

    async fn read(
        &self,
        session_id: SessionId,
        after: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        let state = self.lock();
        let Some(ledger) = state.sessions.get(&session_id) else { return Ok(Vec::new()) };
        let skip = usize::try_from(after.0).unwrap_or(usize::MAX);
        let mut events = Vec::new();
        for (index, body) in ledger.bodies.iter().enumerate().skip(skip) {
            let seq = Seq(index as u64 + 1);
            events.push(decode(session_id, seq, body)?);
        }
        Ok(events)
    }

    async fn last_tool_result(
        &self,
        session_id: SessionId,
        call_id: &ToolCallId,
    ) -> Result<Option<RuntimeEvent>, ReadError> {
        let state = self.lock();
        let Some(ledger) = state.sessions.get(&session_id) else { return Ok(None) };
        let Some(&index) = ledger.tool_results.get(call_id) else { return Ok(None) };
        let Some(body) = ledger.bodies.get(index) else { return Ok(None) };
        decode(session_id, Seq(index as u64 + 1), body).map(Some)
    }

    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError> {
        let state = self.lock();
        let mut summaries: Vec<SessionSummary> =
            state.sessions.values().map(|ledger| ledger.summary.clone()).collect();
        summaries.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        Ok(summaries)
    }

    async fn resolve_session(&self, prefix: &str) -> Result<SessionId, ResolveError> {
        let not_found = || ResolveError::NotFound { prefix: prefix.to_owned() };
        let Some(wanted) = normalize_prefix(prefix) else { return Err(not_found()) };
        let state = self.lock();
        let matches: Vec<SessionId> = state
            .sessions
            .keys()
            .filter(|id| id.as_uuid().simple().to_string().starts_with(&wanted))
            .copied()
            .collect();
        match matches.as_slice() {
            [] => Err(not_found()),
            [only] => Ok(*only),
            more => Err(ResolveError::Ambiguous { prefix: prefix.to_owned(), count: more.len() }),
        }
    }

    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError> {
        self.lock().cancel_requests.insert(session_id);
        Ok(())
    }

    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError> {
        Ok(self.lock().cancel_requests.remove(&session_id))
    }
}

/// Checks what needs no stored state: one session, contiguous seqs, none below 1.
fn validate_batch(events: &[RuntimeEvent]) -> Result<(), AppendError> {
    let Some(first) = events.first() else { return Ok(()) };
    if first.seq == Seq(0) {
        return Err(AppendError::InvalidBatch { reason: "seq starts at 1, got 0".to_owned() });
    }
    for pair in events.windows(2) {
        if pair[1].session_id != first.session_id {
            return Err(AppendError::InvalidBatch {
                reason: format!(
                    "batch mixes sessions {} and {}",
                    first.session_id, pair[1].session_id
                ),
            });
        }
        if pair[1].seq != pair[0].seq.next() {
            return Err(AppendError::InvalidBatch {
                reason: format!("seq {} follows {} in one batch", pair[1].seq, pair[0].seq),
            });
        }
    }
    Ok(())
}

fn body_index(seq: Seq) -> Option<usize> {
    usize::try_from(seq.0.checked_sub(1)?).ok()
}

fn decode(session_id: SessionId, seq: Seq, body: &str) -> Result<RuntimeEvent, ReadError> {
    let corrupt = |message: String| ReadError::Corrupt { session_id, seq, message };
    let event: RuntimeEvent =
        serde_json::from_str(body).map_err(|error| corrupt(error.to_string()))?;
    if event.seq != seq || event.session_id != session_id {
        return Err(corrupt(format!("body says session {} seq {}", event.session_id, event.seq)));
    }
    Ok(event)
}

/// Lowercase hex without dashes, or `None` when `prefix` cannot prefix any session id.
fn normalize_prefix(prefix: &str) -> Option<String> {
    let wanted: String = prefix.trim().chars().filter(|c| *c != '-').collect();
    let wanted = wanted.to_ascii_lowercase();
    let valid =
        !wanted.is_empty() && wanted.len() <= 32 && wanted.chars().all(|c| c.is_ascii_hexdigit());
    valid.then_some(wanted)
}

/// The summary of a session whose first stored event is `first` (normally
/// `session_created`), before `first` itself is applied.
fn summary_start(first: &RuntimeEvent) -> SessionSummary {
    SessionSummary::starting(first.session_id, first.ts)
}

/// Folds one appended event into the session's summary. Must match keel-store's
/// `summary::apply`; the conformance suite pins both.
fn summary_apply(summary: &mut SessionSummary, event: &RuntimeEvent) {
    summary.last_seq = event.seq;
    summary.updated_at = event.ts;
    match &event.kind {
        EventKind::SessionCreated { workspace, model, lineage, .. } => {
            summary.created_at = event.ts;
            summary.workspace.clone_from(workspace);
            summary.model.clone_from(model);
            summary.parent = lineage.as_ref().map(|lineage| lineage.parent_session_id);
        }
        EventKind::TurnStarted { input } => {
            if summary.title.is_empty() {
                summary.title = keel_contracts::session_title(input);
            }
        }
        // Every purpose: summaries are model calls like any other (DESIGN.md §4).
        EventKind::ModelResponse { usage, estimated_usage, cost_usd, .. } => {
            summary.usage.add(usage, estimated_usage.as_ref(), *cost_usd);
        }
        other => {
            if let Some(status) = other.session_status() {
                summary.status = summary.status.then(status);
            }
        }
    }
}
