//! Run leases (DESIGN.md §6): one process drives a session at a time. The kernel takes the
//! session's lease before it recovers or runs anything, renews it while a run is active,
//! and every append carries its fencing token, so a process whose lease lapsed and was
//! taken over cannot write another event.

use std::sync::Arc;
use std::time::Duration;

use keel_contracts::{Clock, Lease, LeaseError, Store};

use crate::ledger::Ledger;
use crate::{Cancellation, Kernel, KernelError, Result};

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

impl Kernel {
    /// Takes the session's lease for this kernel's holder and fences the ledger's appends
    /// with it. A store without leases leaves the ledger unfenced.
    ///
    /// # Errors
    ///
    /// [`KernelError::Leased`] when another process holds an unexpired lease.
    pub(crate) async fn take_lease(&self, ledger: &mut Ledger) -> Result<()> {
        let now = self.deps.clock.now();
        let store = &self.deps.store;
        let mut attempt =
            store.acquire_lease(ledger.session_id, &self.holder, now, LEASE_TTL).await;
        if let Err(LeaseError::Held { holder, expires_at, .. }) = &attempt
            && self.holder_liveness.alive(holder) == Some(false)
        {
            // The holder's process is known to be gone (it crashed): take over now rather
            // than wait for the lease to lapse. The store still serializes takeovers: of
            // two processes doing this, the second finds the first's live lease.
            let after = (*expires_at + chrono::TimeDelta::milliseconds(1)).max(now);
            attempt = store.acquire_lease(ledger.session_id, &self.holder, after, LEASE_TTL).await;
        }
        match attempt {
            Ok(lease) => {
                ledger.lease = Some(lease);
                Ok(())
            }
            Err(LeaseError::Unsupported) => Ok(()),
            Err(LeaseError::Held { holder, expires_at, .. }) => Err(KernelError::Leased {
                session_id: ledger.session_id,
                holder,
                until: expires_at.to_rfc3339(),
            }),
            Err(error) => Err(KernelError::Lease(error)),
        }
    }

    /// Gives the ledger's lease up (best effort: an unreleased lease lapses by itself).
    pub(crate) async fn drop_lease(&self, ledger: &mut Ledger) {
        if let Some(lease) = ledger.lease.take() {
            let _ = self.deps.store.release_lease(&lease).await;
        }
    }
}

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

impl Kernel {
    /// Startup repair: every session whose last run has no terminal event and whose lease
    /// has lapsed (its process died) gets that run closed now, as the next run of it would
    /// (prepared calls `indeterminate`, the rest `cancelled`, the run `run_failed`). Sessions
    /// another live process holds are left alone. Returns the sessions repaired.
    ///
    /// # Errors
    ///
    /// [`KernelError`] when the store cannot list sessions; a session that cannot be
    /// repaired now is skipped (it is repaired when next run).
    ///
    /// # Cancel safety
    ///
    /// Each repair is a few appends under the session's lease; a dropped future leaves a
    /// valid ledger and an unreleased lease that lapses.
    pub async fn repair_interrupted(&self) -> Result<Vec<keel_contracts::SessionId>> {
        let mut repaired = Vec::new();
        let running = self
            .deps
            .store
            .sessions()
            .await?
            .into_iter()
            .filter(|session| session.status == keel_contracts::SessionStatus::Running);
        for session in running {
            let Ok(mut ledger) = self.load_session(session.id).await else { continue };
            if self.take_lease(&mut ledger).await.is_err() {
                continue;
            }
            let before = ledger.last_seq();
            let closed =
                crate::recovery::close_dangling_run(&mut ledger, self.outbox.as_ref()).await;
            self.drop_lease(&mut ledger).await;
            if closed.is_ok() && ledger.last_seq() > before {
                repaired.push(session.id);
            }
        }
        Ok(repaired)
    }
}
