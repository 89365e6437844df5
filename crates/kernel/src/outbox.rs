//! The outbox hook (DESIGN.md §6): observational events are mirrored to outside sinks by
//! the host, from the ledger, in the background. The kernel's only duty is to let the
//! outbox catch up before a run's terminal event is appended, so a sink never sees a run
//! end before the events that led to it. Enforcement (budgets, admission, cancellation)
//! never goes through it.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::SessionId;

/// How long the kernel waits for an outbox flush before it records the terminal event
/// anyway (the outbox keeps redriving in the background; the ledger has every event).
pub const OUTBOX_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Delivers ledger events to outside sinks.
#[async_trait]
pub trait Outbox: Send + Sync + Debug {
    /// Delivers everything recorded for `session_id` so far, or gives up trying for now.
    ///
    /// # Cancel safety
    ///
    /// The kernel bounds this with [`OUTBOX_FLUSH_TIMEOUT`] and drops it after; delivery
    /// state must stay consistent when dropped (an event is delivered again rather than
    /// lost).
    async fn flush(&self, session_id: SessionId);

    /// Whether this outbox delivers anything. The kernel commits what it staged before a
    /// flush (the outbox reads the store); an outbox that delivers nothing spares that
    /// commit, and the staged events go with the terminal event. Default `true`.
    fn delivers(&self) -> bool {
        true
    }
}

/// No sinks.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoOutbox;

#[async_trait]
impl Outbox for NoOutbox {
    async fn flush(&self, _session_id: SessionId) {}

    fn delivers(&self) -> bool {
        false
    }
}
