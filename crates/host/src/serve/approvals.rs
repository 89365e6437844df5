//! Remote approvals (DESIGN.md §9): a hosted run that needs consent has recorded
//! `permission_requested` (the kernel does, before it asks) and waits here for an answer
//! posted over HTTP, at most until `approval_timeout` after the call was first asked, which
//! ends as deny with that reason. The request is a ledger fact, so a host that restarts
//! finds it pending and asks again; the answer becomes a ledger fact when the kernel
//! records `permission_settled`. The first answer wins: [`Approvals::deliver`] refuses a
//! different one while the first is in flight, and the HTTP layer compares later ones with
//! the recorded answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::{Clock, PermissionAnswer, Seq, SessionId, Store, SystemClock};
use keel_kernel::{PermissionHook, PermissionRequest};
use tokio::sync::oneshot;

/// Who answered, as `permission_settled` records it.
pub(crate) const BY_REMOTE: &str = "remote (keel serve)";

type Key = (SessionId, String);

/// One call's slot: a run waiting for its answer, or an answer not yet taken by a run.
#[derive(Debug)]
enum Slot {
    Waiting(oneshot::Sender<PermissionAnswer>),
    Answered(PermissionAnswer),
}

/// The answers in flight on this host, by session and call.
#[derive(Debug, Default)]
pub(crate) struct Approvals {
    slots: Mutex<HashMap<Key, Slot>>,
}

impl Approvals {
    /// Hands `answer` to the run waiting for it, or keeps it for the run that will ask.
    /// `Err(first)` when a different answer was given first. Returns whether a run was
    /// waiting.
    pub(crate) fn deliver(
        &self,
        session_id: SessionId,
        call_id: &str,
        answer: PermissionAnswer,
    ) -> Result<bool, PermissionAnswer> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (session_id, call_id.to_owned());
        match slots.remove(&key) {
            Some(Slot::Answered(first)) => {
                slots.insert(key, Slot::Answered(first));
                if first == answer { Ok(false) } else { Err(first) }
            }
            Some(Slot::Waiting(waiter)) => {
                let delivered = waiter.send(answer).is_ok();
                slots.insert(key, Slot::Answered(answer));
                Ok(delivered)
            }
            None => {
                slots.insert(key, Slot::Answered(answer));
                Ok(false)
            }
        }
    }

    /// Forgets the call's slot once its answer is in the ledger.
    pub(crate) fn forget(&self, session_id: SessionId, call_id: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (session_id, call_id.to_owned());
        if matches!(slots.get(&key), Some(Slot::Answered(_))) {
            slots.remove(&key);
        }
    }

    /// An answer already given for the call, or a receiver for the one to come.
    fn wait(
        &self,
        session_id: SessionId,
        call_id: &str,
    ) -> Result<PermissionAnswer, oneshot::Receiver<PermissionAnswer>> {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (session_id, call_id.to_owned());
        if let Some(Slot::Answered(answer)) = slots.remove(&key) {
            return Ok(answer);
        }
        let (sender, receiver) = oneshot::channel();
        slots.insert(key, Slot::Waiting(sender));
        Err(receiver)
    }

    fn abandon(&self, session_id: SessionId, call_id: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let key = (session_id, call_id.to_owned());
        if matches!(slots.get(&key), Some(Slot::Waiting(_))) {
            slots.remove(&key);
        }
    }
}

/// The person a hosted run asks: whoever answers over HTTP (or the editor), within the
/// approval timeout.
#[derive(Debug)]
pub(crate) struct RemotePerson {
    pub(crate) approvals: Arc<Approvals>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) timeout: Duration,
}

/// Removes a waiting slot when the run stops waiting (answered, timed out or cancelled).
struct Abandon<'a> {
    approvals: &'a Approvals,
    session_id: SessionId,
    call_id: &'a str,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.approvals.abandon(self.session_id, self.call_id);
    }
}

#[async_trait]
impl PermissionHook for RemotePerson {
    async fn decide(&self, request: &PermissionRequest<'_>) -> (PermissionAnswer, String) {
        let call_id = request.call_id.0.as_str();
        let receiver = match self.approvals.wait(request.session_id, call_id) {
            Ok(answer) => return (answer, BY_REMOTE.to_owned()),
            Err(receiver) => receiver,
        };
        let _abandon =
            Abandon { approvals: &self.approvals, session_id: request.session_id, call_id };
        // The wait counts from the call's first request, so restarts do not extend it.
        let now = SystemClock.now();
        let first = match self.store.read(request.session_id, Seq(0)).await {
            Ok(events) => super::ledger::first_requested_at(&events, call_id).unwrap_or(now),
            Err(_) => now,
        };
        let waited = (now - first).to_std().unwrap_or_default();
        let remaining = self.timeout.saturating_sub(waited);
        match tokio::time::timeout(remaining, receiver).await {
            Ok(Ok(answer)) => (answer, BY_REMOTE.to_owned()),
            Ok(Err(_)) => {
                (PermissionAnswer::Deny, "the host stopped waiting for an answer".to_owned())
            }
            Err(_) => (
                PermissionAnswer::Deny,
                format!(
                    "approval_timeout: no answer within {}",
                    crate::serve::human_duration(self.timeout)
                ),
            ),
        }
    }
}
