//! [`AnthropicMessages`]: a [`ModelClient`] for Anthropic's Messages API, streaming over
//! server-sent events.
//!
//! Format sources: Anthropic's API reference, "Messages"
//! (<https://docs.anthropic.com/en/api/messages>), "Streaming Messages"
//! (<https://docs.anthropic.com/en/docs/build-with-claude/streaming>), "Extended thinking"
//! (<https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking>) and "Errors"
//! (<https://docs.anthropic.com/en/api/errors>). The request is `POST
//! {base_url}/v1/messages` with `x-api-key`, `anthropic-version: 2023-06-01` and
//! `stream: true`; the reply is a `text/event-stream` parsed by keel's own SSE parser
//! (`crate::sse`) and assembled by `anthropic::assemble`.
//!
//! Invariants:
//! - Thinking is kept byte-exact (text plus signature, redacted data unchanged) and sent
//!   back first in its assistant message (B06).
//! - An aborted or truncated stream, or one carrying an `error` event, is an error, never a
//!   success (DESIGN.md §3 step 2); an in-stream `overloaded_error` is retried like a 529.
//! - Usage: thinking is counted inside `output_tokens` and `reasoning_tokens` is `None`
//!   (see `assemble::finish::usage_from_wire`); the `usage` objects of `message_start` and
//!   `message_delta` are kept as `raw_usage`.
//! - Adjacent text blocks are joined as sent; a `message_start` for another message
//!   before `message_stop` is a spliced stream (an error, see `assemble`).
//! - The API key appears in no error message, log line or `Debug` output.
//! - Retries are bounded by [`RetryPolicy`] and resend the whole request.

mod assemble;
mod wire;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use keel_contracts::{
    ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest, ModelResponse, StreamDelta,
};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};

use crate::error::BuildError;
use crate::retry::{Failure, Jitter, RetryPolicy, with_retries};
use crate::transport::{self, Credential, Overflow, StreamEnd, Timeouts, Transport};
use assemble::{Assembler, OnDelta};
use wire::{MessagesRequest, RequestSettings};

/// The `anthropic-version` header keel speaks.
const API_VERSION: &str = "2023-06-01";
/// The largest non-streaming message body accepted, in bytes.
const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;
/// The smallest thinking budget the API accepts, in tokens.
const MIN_THINKING_BUDGET_TOKENS: u32 = 1024;

/// How to reach Anthropic's Messages API.
///
/// [`AnthropicConfig::new`] fills in the defaults for everything but the endpoint and the
/// model; the fields are public so a caller can change any of them before
/// [`AnthropicMessages::new`]. `Debug` shows `api_key` as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct AnthropicConfig {
    /// The API root, [`AnthropicConfig::DEFAULT_BASE_URL`] or a compatible server; requests
    /// go to `{base_url}/v1/messages` (a base URL that already ends in `/v1` is not
    /// doubled).
    pub base_url: String,
    /// Sent as `x-api-key` when set.
    pub api_key: Option<String>,
    /// The model name as the API knows it; used when a request does not name one.
    pub model: String,
    /// The most tokens one response may have (`max_tokens`, required by the API; thinking
    /// counts against it).
    pub max_tokens: u32,
    /// When set, extended thinking is enabled with this budget (`thinking: {type: enabled,
    /// budget_tokens}`); at least 1024 and below [`AnthropicConfig::max_tokens`].
    pub thinking_budget_tokens: Option<u32>,
    /// The model's context window in tokens, when known (reported by
    /// [`ModelClient::info`]).
    pub context_window: Option<u64>,
    /// Retries of failed requests.
    pub retry: RetryPolicy,
    /// The longest wait for a TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// The longest wait from sending a request to receiving the response headers.
    pub request_timeout: Duration,
    /// The longest silence allowed between two pieces of a response body; a stream that
    /// stalls longer fails (and may be retried). Anthropic sends `ping` events to keep a
    /// slow stream alive.
    pub stream_idle_timeout: Duration,
}

impl AnthropicConfig {
    /// Anthropic's own endpoint.
    pub const DEFAULT_BASE_URL: &'static str = "https://api.anthropic.com";

    /// A configuration for `model` at `base_url`, without an API key or thinking, with
    /// `max_tokens` 8192, [`RetryPolicy::default`], a 10 s connect timeout, a 120 s request
    /// timeout and a 120 s stream idle timeout.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        AnthropicConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            max_tokens: 8192,
            thinking_budget_tokens: None,
            context_window: None,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            stream_idle_timeout: Duration::from_secs(120),
        }
    }
}

impl fmt::Debug for AnthropicConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("max_tokens", &self.max_tokens)
            .field("thinking_budget_tokens", &self.thinking_budget_tokens)
            .field("context_window", &self.context_window)
            .field("retry", &self.retry)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish()
    }
}

/// A [`ModelClient`] for Anthropic's Messages API, streaming over server-sent events.
///
/// One `AnthropicMessages` may serve many concurrent requests; it holds a connection
/// pool. `Debug` never shows the API key.
#[derive(Clone)]
pub struct AnthropicMessages {
    config: AnthropicConfig,
    transport: Transport,
}

impl fmt::Debug for AnthropicMessages {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicMessages")
            .field("config", &self.config)
            .field("endpoint", &self.transport.endpoint().as_str())
            .finish_non_exhaustive()
    }
}

impl AnthropicMessages {
    /// A client for the endpoint and model in `config`.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidBaseUrl`] when `base_url` is not an absolute http(s) URL,
    /// [`BuildError::InvalidApiKey`] when the key cannot be sent in a header,
    /// [`BuildError::InvalidSetting`] when `max_tokens` is zero or the thinking budget is
    /// below 1024 or not below `max_tokens`, [`BuildError::HttpClient`] when the HTTP
    /// client cannot be set up.
    pub fn new(config: AnthropicConfig) -> Result<Self, BuildError> {
        if config.max_tokens == 0 {
            return Err(BuildError::InvalidSetting {
                setting: "max_tokens",
                reason: "must be at least 1".to_owned(),
            });
        }
        if let Some(budget) = config.thinking_budget_tokens
            && (budget < MIN_THINKING_BUDGET_TOKENS || budget >= config.max_tokens)
        {
            return Err(BuildError::InvalidSetting {
                setting: "thinking_budget_tokens",
                reason: format!(
                    "{budget} is outside {MIN_THINKING_BUDGET_TOKENS}..{} (it must be below \
                     max_tokens)",
                    config.max_tokens
                ),
            });
        }
        let mut headers = HeaderMap::new();
        headers.insert(
            HeaderName::from_static("anthropic-version"),
            HeaderValue::from_static(API_VERSION),
        );
        let credential = config.api_key.as_deref().map(|key| Credential {
            header: HeaderName::from_static("x-api-key"),
            value: key,
            secret: key,
        });
        let timeouts = Timeouts {
            connect: config.connect_timeout,
            request: config.request_timeout,
            stream_idle: config.stream_idle_timeout,
        };
        let base_url = config.base_url.trim().trim_end_matches('/');
        let base_url = base_url.strip_suffix("/v1").unwrap_or(base_url);
        let transport = Transport::new(base_url, "v1/messages", headers, credential, timeouts)
            .map_err(|error| match error {
                // Name the URL the caller gave, not the trimmed one.
                BuildError::InvalidBaseUrl { .. } => {
                    BuildError::InvalidBaseUrl { base_url: config.base_url.clone() }
                }
                other => other,
            })?;
        Ok(AnthropicMessages { config, transport })
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &AnthropicConfig {
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
            // A server that answers a stream request with one JSON message (or an error
            // object) with status 200.
            let body =
                self.transport.read_body(response, MAX_JSON_BODY_BYTES, Overflow::Fail).await?;
            let body = String::from_utf8_lossy(&body);
            return match assembler.apply_event("message", &body)? {
                transport::Flow::Done => Ok(assembler.finish()),
                transport::Flow::Continue => Err(self.transport.error(
                    ModelErrorKind::InvalidResponse,
                    None,
                    "json body is neither a message nor an error",
                )),
            };
        }
        let end = self
            .transport
            .read_events(response, |event| assembler.apply_event(&event.event, &event.data))
            .await?;
        match end {
            StreamEnd::Done => Ok(assembler.finish()),
            // `message_stop` carries nothing after the stop reason.
            StreamEnd::BodyEnded if assembler.has_stop_reason() => Ok(assembler.finish()),
            StreamEnd::BodyEnded => Err(self.transport.error(
                ModelErrorKind::Stream,
                None,
                "stream ended before a stop reason or message_stop: the response is truncated",
            )),
        }
    }
}

#[async_trait]
impl ModelClient for AnthropicMessages {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "anthropic".to_owned(),
            model: self.config.model.clone(),
            context_window: self.config.context_window,
        }
    }

    /// Streams one Messages request, retrying retryable failures as
    /// [`AnthropicConfig::retry`] says.
    ///
    /// The model is `request.model`, or [`AnthropicConfig::model`] when that is empty.
    /// `on_delta` sees the deltas of every attempt as they arrive; when an attempt fails
    /// part-way and is retried, what it showed is superseded by the next attempt, and only
    /// the returned response counts. Before each retry's wait, `on_delta` receives
    /// [`StreamDelta::Retrying`] (attempt, status, error kind, the wait chosen).
    ///
    /// # Errors
    ///
    /// The [`ModelError`] of the last attempt: [`ModelErrorKind::InvalidResponse`] (a
    /// complete response keel cannot read, never retried), [`ModelErrorKind::Auth`] (401,
    /// 403), [`ModelErrorKind::ContextTooLong`] ("prompt is too long", 413) and
    /// [`ModelErrorKind::InvalidRequest`] (other 400s, e.g. a `tool_result` without its
    /// `tool_use`) at once; [`ModelErrorKind::RateLimited`] (429, honouring
    /// `retry-after`), [`ModelErrorKind::Overloaded`] (529, or `overloaded_error` inside
    /// the stream), [`ModelErrorKind::Server`], [`ModelErrorKind::Transport`] and
    /// [`ModelErrorKind::Stream`] (an aborted, truncated, spliced or error-carrying
    /// stream) once the retries are spent.
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
            max_tokens: self.config.max_tokens,
            thinking_budget_tokens: self.config.thinking_budget_tokens,
        };
        let body = serde_json::to_vec(&MessagesRequest::streaming(settings, request)).map_err(
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
    fn debug_never_shows_the_api_key() {
        let mut config = AnthropicConfig::new(AnthropicConfig::DEFAULT_BASE_URL, "claude");
        config.api_key = Some("sk-ant-very-secret".to_owned());
        let client = AnthropicMessages::new(config.clone()).unwrap();
        assert!(!format!("{config:?}").contains("sk-ant-very-secret"));
        assert!(!format!("{client:?}").contains("sk-ant-very-secret"));
        assert!(format!("{client:?}").contains("[redacted]"));
    }

    #[test]
    fn endpoint_is_v1_messages_under_the_base_url() {
        for base_url in [
            "https://api.anthropic.com",
            "https://api.anthropic.com/",
            "https://api.anthropic.com/v1",
        ] {
            let client = AnthropicMessages::new(AnthropicConfig::new(base_url, "m")).unwrap();
            assert_eq!(
                client.transport.endpoint().as_str(),
                "https://api.anthropic.com/v1/messages"
            );
        }
        let client =
            AnthropicMessages::new(AnthropicConfig::new("http://127.0.0.1:8080/proxy", "m"))
                .unwrap();
        assert_eq!(client.transport.endpoint().as_str(), "http://127.0.0.1:8080/proxy/v1/messages");
    }

    #[test]
    fn bad_settings_are_rejected() {
        let error = AnthropicMessages::new(AnthropicConfig::new("/v1", "m")).unwrap_err();
        assert!(matches!(error, BuildError::InvalidBaseUrl { base_url } if base_url == "/v1"));
        for budget in [0, 1023, 8192, 9000] {
            let mut config = AnthropicConfig::new(AnthropicConfig::DEFAULT_BASE_URL, "m");
            config.thinking_budget_tokens = Some(budget);
            assert!(
                matches!(
                    AnthropicMessages::new(config),
                    Err(BuildError::InvalidSetting { setting: "thinking_budget_tokens", .. })
                ),
                "{budget}"
            );
        }
        let mut config = AnthropicConfig::new(AnthropicConfig::DEFAULT_BASE_URL, "m");
        config.max_tokens = 0;
        assert!(AnthropicMessages::new(config).is_err());
    }

    #[test]
    fn client_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<AnthropicMessages>();
        assert_send_sync::<AnthropicConfig>();
    }
}
