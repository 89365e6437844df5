//! The outbox (DESIGN.md §6): the user's `[[outbox]]` sinks, mirrored by keel-outbox.
//!
//! keel-kernel only knows its `Outbox` hook and keel-outbox only knows the `Store`; this
//! module joins them. The kernel's flush before each terminal event becomes
//! `Mirror::flush`, every durable event wakes the mirror through the observer, and the
//! process flushes every session it saw before it exits (the terminal event itself is
//! appended after the kernel's flush).

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use async_trait::async_trait;
use keel_contracts::{RuntimeEvent, SessionId, Store, StreamDelta, SystemClock};
use keel_kernel::{Kernel, OUTBOX_FLUSH_TIMEOUT, Observer};
use keel_outbox::{Mirror, MirrorConfig, OtlpEnv};

use crate::config::ConfigFile;

/// The configured mirror, if any sink is configured.
#[derive(Debug)]
pub struct Outbox {
    mirror: Option<Arc<Mirror>>,
}

/// Starts mirroring `store` to the sinks of `config` (the user's own `[[outbox]]` tables:
/// a workspace file never adds one, see `crate::config`); cursors live in
/// `KEEL_HOME/outbox`.
pub fn start(config: &ConfigFile, home: &Path, store: Arc<dyn Store>) -> anyhow::Result<Outbox> {
    if config.outbox.is_empty() {
        return Ok(Outbox { mirror: None });
    }
    let mut mirror_config = MirrorConfig::new(home.join("outbox"), Arc::new(SystemClock));
    // The standard exporter variables fill in what a user's `otlp` table leaves out; they
    // never declare a sink by themselves.
    mirror_config.otlp_env = OtlpEnv::from_process();
    let mirror =
        Mirror::from_config(store, &config.outbox, mirror_config).map_err(|error| match error {
            keel_outbox::OpenError::Config(config) => crate::error::config_error(config),
            other => anyhow::Error::new(other),
        });
    let mirror = mirror.context("cannot start the outbox")?;
    Ok(Outbox { mirror: Some(Arc::new(mirror)) })
}

impl Outbox {
    /// `inner`, also waking the mirror for every durable event.
    pub fn observer(&self, inner: Arc<dyn Observer>) -> Arc<dyn Observer> {
        match &self.mirror {
            Some(mirror) => Arc::new(Notifying { inner, mirror: mirror.clone() }),
            None => inner,
        }
    }

    /// `kernel`, flushing the mirror before every terminal event.
    pub fn install(&self, kernel: Kernel) -> Kernel {
        match &self.mirror {
            Some(mirror) => kernel.with_outbox(Arc::new(Hook(mirror.clone()))),
            None => kernel,
        }
    }

    /// Delivers what this process recorded (terminal events included), bounded like the
    /// kernel's flush; says on stderr which sinks are behind.
    pub async fn finish(&self) {
        let Some(mirror) = &self.mirror else { return };
        match tokio::time::timeout(OUTBOX_FLUSH_TIMEOUT, mirror.flush_known()).await {
            Ok(lags) => {
                for lag in lags {
                    eprintln!(
                        "keel: outbox sink '{}' is behind on session {} (delivered up to {}): \
                         {}; the next keel run retries",
                        lag.sink, lag.session_id, lag.delivered, lag.error
                    );
                }
            }
            Err(_) => eprintln!(
                "keel: outbox delivery did not finish within {} s; the next keel run retries",
                OUTBOX_FLUSH_TIMEOUT.as_secs()
            ),
        }
    }
}

/// The kernel's outbox hook over a mirror.
#[derive(Debug)]
struct Hook(Arc<Mirror>);

#[async_trait]
impl keel_kernel::Outbox for Hook {
    async fn flush(&self, session_id: SessionId) {
        // A sink that stays behind is redriven in the background and reported at exit.
        let _lags = self.0.flush(session_id).await;
    }
}

/// An observer that also wakes the mirror.
#[derive(Debug)]
struct Notifying {
    inner: Arc<dyn Observer>,
    mirror: Arc<Mirror>,
}

impl Observer for Notifying {
    fn on_event(&self, event: &RuntimeEvent) {
        self.inner.on_event(event);
        self.mirror.notify(event.session_id, event.seq);
    }

    fn on_delta(&self, delta: &StreamDelta) {
        self.inner.on_delta(delta);
    }
}
