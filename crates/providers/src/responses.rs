//! [`OpenAiResponses`]: a [`ModelClient`] for OpenAI's Responses API, streaming over
//! server-sent events.
//!
//! Format sources: the OpenAI API reference, "Create a model response"
//! (<https://platform.openai.com/docs/api-reference/responses/create>) and "Streaming
//! events" (<https://platform.openai.com/docs/api-reference/responses-streaming>), and the
//! reasoning guide (<https://platform.openai.com/docs/guides/reasoning>). The request is
//! `POST {base_url}/responses` with `stream: true`, `store: false` and `include:
//! ["reasoning.encrypted_content"]`; the reply is a `text/event-stream` of typed events
//! ending with `response.completed`, `response.incomplete` or `response.failed`, parsed by
//! keel's own SSE parser (`crate::sse`) and assembled by `responses::assemble`.
//!
//! Invariants:
//! - Requests are stateless: the whole conversation is sent each time, and reasoning items
//!   are replayed from their `encrypted_content`, kept byte-exact in
//!   [`ReasoningPart::redacted`](keel_contracts::ReasoningPart::redacted).
//! - Usage: `output_tokens` excludes `reasoning_tokens`; whether the server counted
//!   reasoning inside its `output_tokens` is decided from `total_tokens` (see
//!   `assemble::finish::usage_from_wire`); the server's own `usage` is kept as `raw_usage`.
//! - A call item of a kind keel never declares is a refused tool call, never an empty
//!   answer; events keel ignores never fail a response (see `assemble`).
//! - An aborted or truncated stream, `response.failed` or an `error` event is an error,
//!   never a success (DESIGN.md §3 step 2).
//! - The API key appears in no error message, log line or `Debug` output.
//! - Retries are bounded by [`RetryPolicy`](crate::RetryPolicy) and resend the whole
//!   request.

mod assemble;
mod wire;

use std::fmt;

use async_trait::async_trait;
use bytes::Bytes;
use keel_contracts::{
    ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest, ModelResponse, StreamDelta,
};

use crate::error::BuildError;
use crate::openai::OpenAiConfig;
use crate::retry::{Failure, Jitter, with_retries};
use crate::transport::{self, Overflow, StreamEnd, Transport};
use assemble::{Assembler, OnDelta};
use wire::{RequestSettings, ResponsesRequest};

/// The largest non-streaming response body accepted, in bytes.
const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Request options of the Responses API that keel does not need for every model.
///
/// The default sends none of them, which every model accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponsesOptions {
    /// `reasoning.effort` for reasoning models (`minimal`, `low`, `medium`, `high`).
    pub reasoning_effort: Option<String>,
    /// `reasoning.summary` for reasoning models (`auto`, `concise`, `detailed`): without it
    /// no reasoning summary text is returned (the encrypted reasoning still is).
    pub reasoning_summary: Option<String>,
    /// `max_output_tokens`: the most tokens one response may have, reasoning included.
    pub max_output_tokens: Option<u32>,
}

/// A [`ModelClient`] for OpenAI's Responses API, streaming over server-sent events.
///
/// One `OpenAiResponses` may serve many concurrent requests; it holds a connection pool.
/// `Debug` never shows the API key.
#[derive(Clone)]
pub struct OpenAiResponses {
    config: OpenAiConfig,
    options: ResponsesOptions,
    transport: Transport,
}

impl fmt::Debug for OpenAiResponses {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiResponses")
            .field("config", &self.config)
            .field("options", &self.options)
            .field("endpoint", &self.transport.endpoint().as_str())
            .finish_non_exhaustive()
    }
}

impl OpenAiResponses {
    /// A client for `{config.base_url}/responses`, without [`ResponsesOptions`].
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidBaseUrl`] when `base_url` is not an absolute http(s) URL,
    /// [`BuildError::InvalidApiKey`] when the key cannot be sent in a header,
    /// [`BuildError::HttpClient`] when the HTTP client cannot be set up.
    pub fn new(config: OpenAiConfig) -> Result<Self, BuildError> {
        OpenAiResponses::with_options(config, ResponsesOptions::default())
    }

    /// A client for `{config.base_url}/responses` that sends `options` with every request.
    ///
    /// # Errors
    ///
    /// As [`OpenAiResponses::new`].
    pub fn with_options(
        config: OpenAiConfig,
        options: ResponsesOptions,
    ) -> Result<Self, BuildError> {
        let transport = config.transport("responses")?;
        Ok(OpenAiResponses { config, options, transport })
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// One attempt: send the request and read the whole response.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection; the partial response is discarded.
    async fn attempt(&self, body: Bytes, on_delta: OnDelta<'_>) -> Result<ModelResponse, Failure> {
        let response = self.transport.send(body, "text/event-stream, application/json").await?;
        let mut assembler = Assembler::new(on_delta, self.transport.secret());
        if transport::is_json(&response) {
            let body =
                self.transport.read_body(response, MAX_JSON_BODY_BYTES, Overflow::Fail).await?;
            assembler.apply_body(&body)?;
            return Ok(assembler.finish());
        }
        let end = self
            .transport
            .read_events(response, |event| assembler.apply_event(&event.event, &event.data))
            .await?;
        match end {
            StreamEnd::Done => Ok(assembler.finish()),
            StreamEnd::BodyEnded if assembler.has_ended() => Ok(assembler.finish()),
            StreamEnd::BodyEnded => Err(self.transport.error(
                ModelErrorKind::Stream,
                None,
                "stream ended before response.completed: the response is truncated",
            )),
        }
    }
}

#[async_trait]
impl ModelClient for OpenAiResponses {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "openai".to_owned(),
            model: self.config.model.clone(),
            context_window: self.config.context_window,
        }
    }

    /// Streams one Responses request, retrying retryable failures as
    /// [`OpenAiConfig::retry`] says.
    ///
    /// The model is `request.model`, or [`OpenAiConfig::model`] when that is empty.
    /// `on_delta` sees the deltas of every attempt as they arrive; when an attempt fails
    /// part-way and is retried, what it showed is superseded by the next attempt, and only
    /// the returned response counts. Before each retry's wait, `on_delta` receives
    /// [`StreamDelta::Retrying`] (attempt, status, error kind, the wait chosen).
    ///
    /// # Errors
    ///
    /// The [`ModelError`] of the last attempt: [`ModelErrorKind::InvalidResponse`] (a
    /// complete response keel cannot read, never retried), [`ModelErrorKind::Auth`],
    /// [`ModelErrorKind::QuotaExhausted`], [`ModelErrorKind::ContextTooLong`] and
    /// [`ModelErrorKind::InvalidRequest`] at once; [`ModelErrorKind::RateLimited`],
    /// [`ModelErrorKind::Overloaded`], [`ModelErrorKind::Server`],
    /// [`ModelErrorKind::Transport`] and [`ModelErrorKind::Stream`] (an aborted,
    /// truncated or failed stream) once the retries are spent.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the request (closing its connection) or the wait
    /// before a retry; nothing is recorded for it.
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError> {
        let model = if request.model.is_empty() { &self.config.model } else { &request.model };
        let settings = RequestSettings {
            model,
            reasoning_effort: self.options.reasoning_effort.as_deref(),
            reasoning_summary: self.options.reasoning_summary.as_deref(),
            max_output_tokens: self.options.max_output_tokens,
        };
        let body = serde_json::to_vec(&ResponsesRequest::streaming(settings, request)).map_err(
            |error| {
                ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    None,
                    format!("request cannot be encoded: {error}"),
                )
            },
        )?;
        let body = Bytes::from(body);
        let mut jitter = Jitter::from_entropy();
        with_retries(&self.config.retry, &mut jitter, on_delta, |_n_retries| {
            self.attempt(body.clone(), on_delta)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_and_debug() {
        let mut config = OpenAiConfig::new("https://api.openai.com/v1/", "gpt-5");
        config.api_key = Some("sk-very-secret".to_owned());
        let client = OpenAiResponses::new(config).unwrap();
        assert_eq!(client.transport.endpoint().as_str(), "https://api.openai.com/v1/responses");
        assert!(!format!("{client:?}").contains("sk-very-secret"));
        assert_eq!(client.info().provider, "openai");
    }

    #[test]
    fn client_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<OpenAiResponses>();
    }
}
