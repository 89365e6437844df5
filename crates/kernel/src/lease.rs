//! Run leases (DESIGN.md §6): one process drives a session at a time. The kernel takes the
//! session's lease before it recovers or runs anything, renews it while a run is active,
//! and every append carries its fencing token, so a process whose lease lapsed and was
//! taken over cannot write another event.

use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{Clock, Lease, LeaseError, Store};

use crate::Cancellation;

/// How long a lease lasts without renewal.
pub const LEASE_TTL: Duration = Duration::from_secs(30);
/// Tells whether the process a lease holder label names is alive.
pub trait HolderLiveness: Send + Sync + std::fmt::Debug {
    /// `Some(false)` only when the holder is known to be gone (its lease is then taken over
    /// at once); `Some(true)` when alive; `None` when unknown (wait for the lease to lapse).
    fn alive(&self, holder: &str) -> Option<bool>;
}

/// Knows nothing about other holders.
#[derive(Debug, Default, Clone, Copy)]
pub struct UnknownLiveness;

impl HolderLiveness for UnknownLiveness {
    fn alive(&self, _holder: &str) -> Option<bool> {
        None
    }
}

/// How often an active run renews its lease.
pub const LEASE_RENEW_EVERY: Duration = Duration::from_secs(10);

/// Renews a lease in the background while a run is active; cancels the run when the lease
/// is lost. Stops when dropped.
pub(crate) struct LeaseKeeper(Option<tokio::task::JoinHandle<()>>);

impl LeaseKeeper {
    pub(crate) fn spawn(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        lease: Option<Lease>,
        cancel: Cancellation,
    ) -> LeaseKeeper {
        let Some(mut lease) = lease else { return LeaseKeeper(None) };
        LeaseKeeper(Some(tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_RENEW_EVERY).await;
                match store.renew_lease(&lease, clock.now(), LEASE_TTL).await {
                    Ok(renewed) => lease = renewed,
                    Err(LeaseError::Lost { .. }) => {
                        // Another process took the session over: stop driving it. Any
                        // append from here on is fenced anyway.
                        cancel.cancel();
                        return;
                    }
                    // A transient failure: try again at the next tick; the lease lapses by
                    // itself if the store stays down.
                    Err(_) => {}
                }
            }
        })))
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if let Some(handle) = self.0.take() {
            handle.abort();
        }
    }
}
