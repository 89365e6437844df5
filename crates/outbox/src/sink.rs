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

/// The [`Sink::target`] of an HTTP sink: `KIND:URL` without its query and fragment,
/// which often carry a token (`?api_key=…`) and must not sit in a cursor file. A digest
/// of them stands in, so a changed query still starts the cursors afresh.
pub(crate) fn http_target(kind: &str, url: &reqwest::Url) -> String {
    let mut bare = url.clone();
    bare.set_query(None);
    bare.set_fragment(None);
    match (url.query(), url.fragment()) {
        (None, None) => format!("{kind}:{bare}"),
        (query, fragment) => {
            let secret = format!("{}#{}", query.unwrap_or_default(), fragment.unwrap_or_default());
            let digest = keel_contracts::sha256_hex(secret.as_bytes());
            format!("{kind}:{bare}?sha256={}", &digest[..16])
        }
    }
}

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

#[cfg(test)]
mod tests {
    use super::http_target;

    /// A token in the query never reaches the target (and so the cursor file), while a
    /// different token still makes a different target.
    #[test]
    fn http_targets_leave_out_the_query() {
        let url = |text: &str| reqwest::Url::parse(text).unwrap();
        let plain = http_target("otlp", &url("http://127.0.0.1:4318/v1/traces"));
        assert_eq!(plain, "otlp:http://127.0.0.1:4318/v1/traces");
        let a = http_target("webhook", &url("https://hooks.example/x?token=SECRET-A"));
        let b = http_target("webhook", &url("https://hooks.example/x?token=SECRET-B"));
        assert!(!a.contains("SECRET") && !b.contains("SECRET"), "{a} {b}");
        assert!(a.starts_with("webhook:https://hooks.example/x?sha256="), "{a}");
        assert_ne!(a, b);
    }
}
