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
use keel_contracts::{
    Clock, ElicitationAnswer, PermissionAnswer, Seq, SessionId, Store, SystemClock,
};
use keel_kernel::{ElicitationQuestion, PermissionHook, PermissionRequest};
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
    /// Runs waiting for the answer to a server's question, by session and question id.
    /// No answer is kept for later: the MCP request that asked ends with the process.
    questions: Mutex<HashMap<Key, oneshot::Sender<ElicitationAnswer>>>,
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

    /// Hands `answer` to the run waiting for the question; `false` when none waits here.
    pub(crate) fn answer_question(
        &self,
        session_id: SessionId,
        question: &str,
        answer: ElicitationAnswer,
    ) -> bool {
        let mut questions = self.questions.lock().unwrap_or_else(PoisonError::into_inner);
        match questions.remove(&(session_id, question.to_owned())) {
            Some(waiter) => waiter.send(answer).is_ok(),
            None => false,
        }
    }

    fn wait_question(
        &self,
        session_id: SessionId,
        question: &str,
    ) -> oneshot::Receiver<ElicitationAnswer> {
        let (sender, receiver) = oneshot::channel();
        let mut questions = self.questions.lock().unwrap_or_else(PoisonError::into_inner);
        questions.insert((session_id, question.to_owned()), sender);
        receiver
    }

    fn abandon_question(&self, session_id: SessionId, question: &str) {
        let mut questions = self.questions.lock().unwrap_or_else(PoisonError::into_inner);
        questions.remove(&(session_id, question.to_owned()));
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

/// Removes a waiting question when the run stops waiting.
struct AbandonQuestion<'a> {
    approvals: &'a Approvals,
    session_id: SessionId,
    question: &'a str,
}

impl Drop for AbandonQuestion<'_> {
    fn drop(&mut self) {
        self.approvals.abandon_question(self.session_id, self.question);
    }
}

#[async_trait]
impl PermissionHook for RemotePerson {
    /// A server's question waits for an answer posted over HTTP (`POST
    /// …/questions/{question}`, checked against the form there), at most the approval
    /// timeout; then it is cancelled with that reason.
    async fn elicit(&self, question: &ElicitationQuestion<'_>) -> ElicitationAnswer {
        let receiver = self.approvals.wait_question(question.session_id, question.question);
        let _abandon = AbandonQuestion {
            approvals: &self.approvals,
            session_id: question.session_id,
            question: question.question,
        };
        match tokio::time::timeout(self.timeout, receiver).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => {
                ElicitationAnswer::cancel("keel", "the host stopped waiting for an answer")
            }
            Err(_) => ElicitationAnswer::cancel(
                "keel",
                format!(
                    "approval_timeout: no answer within {}",
                    keel_host::duration::human_duration(self.timeout)
                ),
            ),
        }
    }

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
            Ok(events) => crate::ledger::first_requested_at(&events, call_id).unwrap_or(now),
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
                    keel_host::duration::human_duration(self.timeout)
                ),
            ),
        }
    }
}
