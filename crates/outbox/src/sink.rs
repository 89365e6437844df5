//! Where events go: the [`Sink`] trait and the sinks keel configures,
//! [`JsonlSink`], [`WebhookSink`] and [`OtlpSink`].

mod jsonl;
mod otlp;
mod webhook;

use std::fmt::Debug;

use async_trait::async_trait;
use keel_contracts::RuntimeEvent;

use crate::error::DeliveryError;

pub use jsonl::JsonlSink;
pub use otlp::genai::SEMCONV_VERSION;
pub use otlp::{OtlpEnv, OtlpHeaders, OtlpOptions, OtlpSink};
pub use webhook::WebhookSink;

/// An outside destination for ledger events.
#[async_trait]
pub trait Sink: Send + Sync + Debug {
    /// Where it delivers (`jsonl:/var/log/keel.jsonl`, `webhook:https://…`,
    /// `otlp:http://…`). Cursors are
    /// kept per target: pointing a sink elsewhere starts its cursors afresh.
    fn target(&self) -> String;

    /// The most events one [`Sink::deliver`] call receives (at least 1).
    fn max_batch(&self) -> usize;

    /// Delivers `events`: one session's, contiguous, in seq order, never empty.
    /// `Ok` means the destination has them all; the mirror then moves the cursor.
    ///
    /// # Errors
    ///
    /// [`DeliveryError`] when any of them may not have arrived; the same batch (or one
    /// starting at the same event) is delivered again later.
    ///
    /// # Cancel safety
    ///
    /// If dropped, the batch counts as not delivered and is sent again.
    async fn deliver(&self, events: &[RuntimeEvent]) -> Result<(), DeliveryError>;
}
