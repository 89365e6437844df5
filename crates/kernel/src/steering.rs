//! Steering: input a user sends while a run is active (issue #20). The host pushes it into
//! the run's [`Steering`] inbox; the kernel joins it at the next step boundary (before the
//! next model request, never while a call is being settled), records one `input_joined`
//! event per input, and tells the sender the seq once that event is durable.
//!
//! A run that would end with input still queued (the model answered without tool calls)
//! takes another step instead, so queued input is never dropped by a completing run. When
//! the run ends anyway (failure, cancel, budget), the inbox is closed: queued input is
//! handed back unjoined ([`Joined::wait`] answers `None`) and later sends are refused, so
//! the sender always learns whether its input joined.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use keel_contracts::Seq;
use tokio::sync::oneshot;

/// The inbox of one run's steering input. Cheap to clone; every clone is the same inbox.
#[derive(Debug, Clone, Default)]
pub struct Steering {
    inner: Arc<Mutex<Inbox>>,
}

#[derive(Debug, Default)]
struct Inbox {
    queued: VecDeque<(String, oneshot::Sender<Seq>)>,
    closed: bool,
}

/// The answer to a [`Steering::send`] that was queued.
#[derive(Debug)]
pub struct Joined(oneshot::Receiver<Seq>);

impl Joined {
    /// Waits until the input joined the run: the seq of its durable `input_joined`, or
    /// `None` when the run ended before it could join.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping it does not withdraw the input.
    pub async fn wait(self) -> Option<Seq> {
        self.0.await.ok()
    }
}

/// A [`Steering::send`] refused: the run is ending or over. The input is handed back (send
/// it as a new turn).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the run is ending; send the input as a new turn")]
pub struct SteeringClosed(pub String);

impl Steering {
    /// An empty, open inbox.
    pub fn new() -> Steering {
        Steering::default()
    }

    fn inbox(&self) -> std::sync::MutexGuard<'_, Inbox> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `input` for the run's next step boundary.
    ///
    /// # Errors
    ///
    /// [`SteeringClosed`] when the run is ending or over.
    pub fn send(&self, input: impl Into<String>) -> Result<Joined, SteeringClosed> {
        let mut inbox = self.inbox();
        let input = input.into();
        if inbox.closed {
            return Err(SteeringClosed(input));
        }
        let (sender, receiver) = oneshot::channel();
        inbox.queued.push_back((input, sender));
        Ok(Joined(receiver))
    }

    /// Whether input is queued.
    pub fn has_queued(&self) -> bool {
        !self.inbox().queued.is_empty()
    }

    /// Takes every queued input, in the order it was sent.
    pub(crate) fn take(&self) -> Vec<(String, oneshot::Sender<Seq>)> {
        self.inbox().queued.drain(..).collect()
    }

    /// Closes the inbox when nothing is queued (the run may end): `false` when input is
    /// queued, so the run takes it instead.
    pub(crate) fn close_if_empty(&self) -> bool {
        let mut inbox = self.inbox();
        if inbox.queued.is_empty() {
            inbox.closed = true;
        }
        inbox.closed
    }

    /// Closes the inbox; what is queued is dropped (its senders learn it did not join).
    pub(crate) fn close(&self) {
        let mut inbox = self.inbox();
        inbox.closed = true;
        inbox.queued.clear();
    }
}
