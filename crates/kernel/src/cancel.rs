//! Cancellation of a run: Ctrl-C, `keel stop`, or a host shutting a session down.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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
}

impl Cancellation {
    /// A fresh, uncancelled flag.
    pub fn new() -> Cancellation {
        Cancellation::default()
    }

    /// Cancels: every waiter wakes, every later check sees it.
    pub fn cancel(&self) {
        self.inner.cancelled.store(true, Ordering::SeqCst);
        self.inner.notify.notify_waiters();
    }

    /// Whether [`Cancellation::cancel`] was called.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled.load(Ordering::SeqCst)
    }

    /// Resolves once cancelled.
    ///
    /// # Cancel safety
    ///
    /// Safe to drop and call again.
    pub async fn cancelled(&self) {
        loop {
            let notified = self.inner.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}
