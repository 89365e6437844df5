//! The HTTP webhook sink.

use std::error::Error as _;
use std::time::Duration;

use async_trait::async_trait;
use keel_contracts::RuntimeEvent;

use crate::error::DeliveryError;
use crate::sink::Sink;

/// POSTs each batch as a JSON array of events (each exactly the [`RuntimeEvent`]
/// serialization) with `Content-Type: application/json`.
///
/// Only a 2xx answer counts as delivered; any other status (redirects included: none is
/// followed), a transport error or a timeout means the batch is sent again later.
#[derive(Debug, Clone)]
pub struct WebhookSink {
    url: reqwest::Url,
    max_batch: usize,
    client: reqwest::Client,
}

impl WebhookSink {
    /// A sink posting to `url`, at most `max_batch` events (at least 1) per request, each
    /// request bounded by `timeout`.
    ///
    /// # Errors
    ///
    /// When the HTTP client cannot be built (its TLS setup fails).
    pub fn new(
        url: reqwest::Url,
        max_batch: usize,
        timeout: Duration,
    ) -> Result<WebhookSink, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(WebhookSink { url, max_batch: max_batch.max(1), client })
    }
}

#[async_trait]
impl Sink for WebhookSink {
    fn target(&self) -> String {
        super::http_target("webhook", &self.url)
    }

    fn max_batch(&self) -> usize {
        self.max_batch
    }

    async fn deliver(&self, events: &[RuntimeEvent]) -> Result<(), DeliveryError> {
        let response = self
            .client
            .post(self.url.clone())
            .json(events)
            .send()
            .await
            .map_err(|error| DeliveryError::Transport { message: describe(error) })?;
        let status = response.status();
        if !status.is_success() {
            return Err(DeliveryError::Status { status: status.as_u16() });
        }
        // The receiver has the batch; reading the rest only lets the connection be reused.
        let _ = response.bytes().await;
        Ok(())
    }
}

/// The error and its causes, without the URL (it may carry a token).
pub(crate) fn describe(error: reqwest::Error) -> String {
    let error = error.without_url();
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
