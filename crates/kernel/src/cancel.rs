//! Cancellation of a run: Ctrl-C, `keel stop`, or a host shutting a session down.
//! A child token ([`Cancellation::child`]) is cancelled with its parent, never the reverse:
//! cancelling a parent run cancels its sub-agents.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use keel_contracts::{SessionId, Store};
use tokio::sync::Notify;

/// A cloneable cancellation flag. Once cancelled it stays cancelled.
#[derive(Debug, Clone, Default)]
pub struct Cancellation {
    inner: Arc<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    cancelled: AtomicBool,
    notify: Notify,
    parent: Option<Arc<Inner>>,
}

impl Inner {
    fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
            || self.parent.as_ref().is_some_and(|parent| parent.is_cancelled())
    }
}

impl Cancellation {
    /// A fresh, uncancelled flag.
    pub fn new() -> Cancellation {
        Cancellation::default()
    }

    /// A flag that is cancelled when this one is (and may be cancelled on its own).
    pub fn child(&self) -> Cancellation {
        Cancellation {
            inner: Arc::new(Inner {
                cancelled: AtomicBool::new(false),
                notify: Notify::new(),
                parent: Some(self.inner.clone()),
            }),
        }
    }

    /// Cancels: every waiter wakes, every later check sees it.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Whether this flag or an ancestor was cancelled.
    pub fn is_cancelled(&self) -> bool {
        self.inner.is_cancelled()
    }

    /// Resolves once this flag or an ancestor is cancelled.
    ///
    /// # Cancel safety
    ///
    /// Safe to drop and call again.
    pub async fn cancelled(&self) {
        let mut chain = Vec::new();
        let mut node = Some(&self.inner);
        while let Some(inner) = node {
            chain.push(inner.clone());
            node = inner.parent.as_ref();
        }
        loop {
            let waits: Vec<_> =
                chain.iter().map(|inner| Box::pin(inner.notify.notified())).collect();
            if self.is_cancelled() {
                return;
            }
            futures::future::select_all(waits).await;
        }
    }
}

/// Polls the store for `keel stop` requests while a run is active; stops when dropped.
pub(crate) struct StopWatcher(tokio::task::JoinHandle<()>);

impl StopWatcher {
    pub(crate) fn spawn(
        store: Arc<dyn Store>,
        session_id: SessionId,
        cancel: Cancellation,
        every: Duration,
    ) -> StopWatcher {
        StopWatcher(tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if let Ok(true) = store.take_cancel_request(session_id).await {
                    cancel.cancel();
                    return;
                }
            }
        }))
    }
}

impl Drop for StopWatcher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_parent_cancels_its_children_not_the_reverse() {
        let parent = Cancellation::new();
        let child = parent.child();
        let grandchild = child.child();
        child.cancel();
        assert!(child.is_cancelled() && grandchild.is_cancelled());
        assert!(!parent.is_cancelled());
        let other = parent.child();
        let waiter = tokio::spawn(async move { other.cancelled().await });
        tokio::task::yield_now().await;
        parent.cancel();
        waiter.await.unwrap();
    }
}
