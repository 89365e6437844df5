//! [`CountingStore`]: wraps any [`Store`] and records every durable commit (each append
//! call is one transaction, one fsync on a durable backend), for tests that bound how
//! many commits the kernel makes per step.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};

/// A store that passes everything through to `inner` and keeps, for every append that
/// the inner store acknowledged, the kinds of the events it committed (their wire
/// spelling, e.g. `"tool_result"`), in order.
///
/// Failed appends and empty batches are not commits and are not recorded. Reads, leases,
/// listings and cancel requests pass through uncounted.
#[derive(Debug)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    commits: Mutex<Vec<Vec<&'static str>>>,
}

impl CountingStore {
    /// Wraps `inner`, with no commits recorded yet.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore { inner, commits: Mutex::new(Vec::new()) }
    }

    /// Every acknowledged commit so far: the event kinds of each, in commit order.
    pub fn commits(&self) -> Vec<Vec<&'static str>> {
        self.lock().clone()
    }

    /// How many commits were acknowledged so far.
    pub fn n_commits(&self) -> usize {
        self.lock().len()
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Vec<&'static str>>> {
        self.commits.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, events: &[RuntimeEvent]) {
        if !events.is_empty() {
            self.lock().push(events.iter().map(|event| event.kind.name()).collect());
        }
    }
}

#[async_trait]
impl Store for CountingStore {
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        self.inner.append(events).await?;
        self.record(events);
        Ok(())
    }

    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &keel_contracts::Lease,
    ) -> Result<(), AppendError> {
        self.inner.append_leased(events, lease).await?;
        self.record(events);
        Ok(())
    }

    async fn acquire_lease(
        &self,
        session_id: SessionId,
        holder: &str,
        now: chrono::DateTime<chrono::Utc>,
        ttl: std::time::Duration,
    ) -> Result<keel_contracts::Lease, keel_contracts::LeaseError> {
        self.inner.acquire_lease(session_id, holder, now, ttl).await
    }

    async fn current_lease(
        &self,
        session_id: SessionId,
    ) -> Result<Option<keel_contracts::Lease>, keel_contracts::LeaseError> {
        self.inner.current_lease(session_id).await
    }

    async fn renew_lease(
        &self,
        lease: &keel_contracts::Lease,
        now: chrono::DateTime<chrono::Utc>,
        ttl: std::time::Duration,
    ) -> Result<keel_contracts::Lease, keel_contracts::LeaseError> {
        self.inner.renew_lease(lease, now, ttl).await
    }

    async fn release_lease(
        &self,
        lease: &keel_contracts::Lease,
    ) -> Result<(), keel_contracts::LeaseError> {
        self.inner.release_lease(lease).await
    }

    async fn read(
        &self,
        session_id: SessionId,
        after: Seq,
    ) -> Result<Vec<RuntimeEvent>, ReadError> {
        self.inner.read(session_id, after).await
    }

    async fn sessions(&self) -> Result<Vec<SessionSummary>, ReadError> {
        self.inner.sessions().await
    }

    async fn resolve_session(&self, prefix: &str) -> Result<SessionId, ResolveError> {
        self.inner.resolve_session(prefix).await
    }

    async fn request_cancel(&self, session_id: SessionId) -> Result<(), AppendError> {
        self.inner.request_cancel(session_id).await
    }

    async fn take_cancel_request(&self, session_id: SessionId) -> Result<bool, ReadError> {
        self.inner.take_cancel_request(session_id).await
    }
}
