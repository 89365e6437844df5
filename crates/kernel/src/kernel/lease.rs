//! The kernel's side of run leases ([`crate::lease`]): taking a session's lease before
//! anything is recovered or run, letting it go, and the startup repair of runs whose
//! holder died.

use keel_contracts::LeaseError;

use super::Kernel;
use crate::lease::LEASE_TTL;
use crate::ledger::Ledger;
use crate::{KernelError, Result};

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
