//! [`FaultyStore`]: wraps any [`Store`] and fails appends on command.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use keel_contracts::{
    AppendError, ReadError, ResolveError, RuntimeEvent, Seq, SessionId, SessionSummary, Store,
};

/// The failure a [`FaultyStore`] reports. Each is an [`AppendError::Backend`] with the
/// message a real backend would give, and nothing reaches the wrapped store.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// The disk is full (SQLite: `SQLITE_FULL`).
    DiskFull,
    /// Flushing to stable storage failed (SQLite: `SQLITE_IOERR_FSYNC`).
    FsyncFailed,
    /// Any other I/O error, with its message.
    Io(String),
}

impl Fault {
    /// The backend message this fault reports.
    pub fn message(&self) -> String {
        match self {
            Fault::DiskFull => "database or disk is full".to_owned(),
            Fault::FsyncFailed => "disk I/O error: fsync failed".to_owned(),
            Fault::Io(message) => message.clone(),
        }
    }

    fn error(&self) -> AppendError {
        AppendError::Backend { message: self.message() }
    }
}

/// A store that passes everything through to `inner` except the appends it was told to
/// fail.
///
/// Appends are counted from 1 across the wrapper's life, failed ones included. A failed
/// append writes nothing, as the [`Store`] contract promises for `Backend` errors. Reads,
/// listings and cancel requests always pass through.
#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    plan: Mutex<Plan>,
}

#[derive(Debug, Default)]
struct Plan {
    n_appends: u64,
    rules: Vec<Rule>,
}

#[derive(Debug)]
enum Rule {
    /// Fail exactly the append with this number.
    Nth(u64, Fault),
    /// Fail every append numbered above this.
    After(u64, Fault),
    /// Fail any append whose batch holds an event of this kind (`tool_result`).
    Kind(&'static str, Fault),
}

impl FaultyStore {
    /// Wraps `inner`, failing nothing yet.
    pub fn new(inner: Arc<dyn Store>) -> FaultyStore {
        FaultyStore { inner, plan: Mutex::new(Plan::default()) }
    }

    /// Fails the `n`th append call (1-based, counting every call to `append`).
    pub fn fail_nth_append(&self, n: u64, fault: Fault) {
        self.plan().rules.push(Rule::Nth(n, fault));
    }

    /// Lets appends `1..=n` through and fails every later one, like a disk that fills up.
    pub fn fail_appends_after(&self, n: u64, fault: Fault) {
        self.plan().rules.push(Rule::After(n, fault));
    }

    /// Fails every append whose batch holds an event of `kind` (its wire spelling, e.g.
    /// `"tool_result"`): a crash between `tool_attempt_prepared` and its result.
    pub fn fail_appends_of_kind(&self, kind: &'static str, fault: Fault) {
        self.plan().rules.push(Rule::Kind(kind, fault));
    }

    /// Forgets every injected failure; counting continues.
    pub fn heal(&self) {
        self.plan().rules.clear();
    }

    /// How many times `append` was called, failed calls included.
    pub fn append_calls(&self) -> u64 {
        self.plan().n_appends
    }

    /// The wrapped store, to inspect what really got written.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    fn plan(&self) -> MutexGuard<'_, Plan> {
        self.plan.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl FaultyStore {
    /// The injected failure for this append, if one fires.
    fn injected(&self, events: &[RuntimeEvent]) -> Option<AppendError> {
        {
            let mut plan = self.plan();
            plan.n_appends += 1;
            let call = plan.n_appends;
            plan.rules.iter().find_map(|rule| {
                let fires = match rule {
                    Rule::Nth(n, _) => call == *n,
                    Rule::After(n, _) => call > *n,
                    Rule::Kind(kind, _) => events.iter().any(|event| event.kind.name() == *kind),
                };
                let fault = match rule {
                    Rule::Nth(_, fault) | Rule::After(_, fault) | Rule::Kind(_, fault) => fault,
                };
                fires.then(|| fault.error())
            })
        }
    }
}

#[async_trait]
impl Store for FaultyStore {
    async fn append(&self, events: &[RuntimeEvent]) -> Result<(), AppendError> {
        match self.injected(events) {
            Some(error) => Err(error),
            None => self.inner.append(events).await,
        }
    }

    async fn append_leased(
        &self,
        events: &[RuntimeEvent],
        lease: &keel_contracts::Lease,
    ) -> Result<(), AppendError> {
        match self.injected(events) {
            Some(error) => Err(error),
            None => self.inner.append_leased(events, lease).await,
        }
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
