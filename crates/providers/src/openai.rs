//! [`OpenAiChat`]: a [`ModelClient`] for OpenAI-compatible Chat Completions endpoints
//! (OpenAI itself, and the many servers that copy its format: vLLM, Ollama, LM Studio,
//! OpenRouter, Groq, Together, xAI, Mistral, DeepSeek, Gemini's compatibility endpoint).
//!
//! Format source: the OpenAI API reference for Chat Completions
//! (<https://platform.openai.com/docs/api-reference/chat/create>) and its streaming
//! chunk object (<https://platform.openai.com/docs/api-reference/chat-streaming>). The
//! request is `POST {base_url}/chat/completions` with `stream: true` and
//! `stream_options.include_usage`; the reply is a `text/event-stream` of
//! `chat.completion.chunk` payloads ending with `data: [DONE]`, parsed by keel's own
//! SSE parser (`crate::sse`). A plain `application/json` completion is accepted as well.
//!
//! Invariants:
//! - An aborted, truncated or error-carrying stream is an error, never a success
//!   (DESIGN.md §3 step 2).
//! - A response with an error status is never fed to the SSE parser.
//! - The API key appears in no error message, log line or `Debug` output.
//! - Retries are bounded by [`RetryPolicy`] and resend the whole request.

mod assemble;
mod body;
mod wire;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use keel_contracts::{
    ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest, ModelResponse, StreamDelta,
};
use reqwest::header::{self, HeaderMap};

use crate::error::BuildError;
use crate::retry::{Failure, Jitter, RetryPolicy, with_retries};
use crate::transport::{self, Credential, Overflow, StreamEnd, Timeouts, Transport};
use assemble::{Assembler, OnDelta};
use body::BodyCache;
use wire::ChatCompletion;

/// The largest non-streaming completion body accepted, in bytes.
const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;

/// How to reach an OpenAI-compatible Chat Completions endpoint.
///
/// [`OpenAiConfig::new`] fills in the defaults for everything but the endpoint and the
/// model; the fields are public so a caller can change any of them before
/// [`OpenAiChat::new`] (or [`OpenAiResponses::new`](crate::OpenAiResponses::new), which
/// takes the same configuration). `Debug` shows `api_key` as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`;
    /// requests go to `{base_url}/chat/completions` (or `{base_url}/responses`).
    pub base_url: String,
    /// Sent as `Authorization: Bearer …` when set (local servers often need none).
    pub api_key: Option<String>,
    /// The model name as the server knows it; used when a request does not name one.
    pub model: String,
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
    /// stalls longer fails (and may be retried).
    pub stream_idle_timeout: Duration,
}

impl OpenAiConfig {
    /// A configuration for `model` at `base_url`, without an API key, with
    /// [`RetryPolicy::default`], a 10 s connect timeout, a 120 s request timeout and a
    /// 120 s stream idle timeout.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            api_key: None,
            model: model.into(),
            context_window: None,
            retry: RetryPolicy::default(),
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(120),
            stream_idle_timeout: Duration::from_secs(120),
        }
    }

    /// The transport for `{base_url}/{path}` with this configuration's key and timeouts.
    pub(crate) fn transport(&self, path: &str) -> Result<Transport, BuildError> {
        let bearer = self.api_key.as_ref().map(|key| format!("Bearer {key}"));
        let credential = match (&self.api_key, &bearer) {
            (Some(key), Some(value)) => {
                Some(Credential { header: header::AUTHORIZATION, value, secret: key })
            }
            _ => None,
        };
        let timeouts = Timeouts {
            connect: self.connect_timeout,
            request: self.request_timeout,
            stream_idle: self.stream_idle_timeout,
        };
        Transport::new(&self.base_url, path, HeaderMap::new(), credential, timeouts)
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("model", &self.model)
            .field("context_window", &self.context_window)
            .field("retry", &self.retry)
            .field("connect_timeout", &self.connect_timeout)
            .field("request_timeout", &self.request_timeout)
            .field("stream_idle_timeout", &self.stream_idle_timeout)
            .finish()
    }
}

/// A [`ModelClient`] for an OpenAI-compatible Chat Completions endpoint, streaming over
/// server-sent events.
///
/// One `OpenAiChat` may serve many concurrent requests; it holds a connection pool, and
/// the JSON of its last request's parts (system prompt, tools, messages), which the next
/// request's body copies where they are unchanged (clones share it).
/// `Debug` never shows the API key.
#[derive(Clone)]
pub struct OpenAiChat {
    config: OpenAiConfig,
    transport: Transport,
    bodies: Arc<Mutex<BodyCache>>,
}

impl fmt::Debug for OpenAiChat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChat")
            .field("config", &self.config)
            .field("endpoint", &self.transport.endpoint().as_str())
            .finish_non_exhaustive()
    }
}

impl OpenAiChat {
    /// A client for the endpoint and model in `config`.
    ///
    /// # Errors
    ///
    /// [`BuildError::InvalidBaseUrl`] when `base_url` is not an absolute http(s) URL,
    /// [`BuildError::InvalidApiKey`] when the key cannot be sent in a header,
    /// [`BuildError::HttpClient`] when the HTTP client cannot be set up.
    pub fn new(config: OpenAiConfig) -> Result<Self, BuildError> {
        let transport = config.transport("chat/completions")?;
        Ok(OpenAiChat { config, transport, bodies: Arc::default() })
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
        let secret = self.transport.secret();
        if transport::is_json(&response) {
            let body =
                self.transport.read_body(response, MAX_JSON_BODY_BYTES, Overflow::Fail).await?;
            let completion: ChatCompletion = serde_json::from_slice(&body).map_err(|error| {
                self.transport.error(
                    ModelErrorKind::InvalidResponse,
                    None,
                    format!("malformed completion body: {error}"),
                )
            })?;
            return Assembler::new(on_delta, secret)
                .apply_completion(completion)
                .map_err(Failure::from);
        }
        let mut assembler = Assembler::new(on_delta, secret);
        let end = self
            .transport
            .read_events(response, |event| assembler.apply_event(&event.event, &event.data))
            .await?;
        match end {
            StreamEnd::Done => Ok(assembler.finish()),
            // Some servers close the stream after the finish chunk without `[DONE]`.
            StreamEnd::BodyEnded if assembler.has_finish_reason() => Ok(assembler.finish()),
            StreamEnd::BodyEnded => Err(self.transport.error(
                ModelErrorKind::Stream,
                None,
                "stream ended before a finish reason or [DONE]: the response is truncated",
            )),
        }
    }
}

#[async_trait]
impl ModelClient for OpenAiChat {
    fn info(&self) -> ModelInfo {
        ModelInfo {
            provider: "openai".to_owned(),
            model: self.config.model.clone(),
            context_window: self.config.context_window,
        }
    }

    /// Streams one Chat Completions request, retrying retryable failures as
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
    /// truncated or error-carrying stream) once the retries are spent.
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
        let body = {
            let mut bodies = self.bodies.lock().unwrap_or_else(PoisonError::into_inner);
            bodies.render(model, request).map_err(|error| {
                ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    None,
                    format!("request cannot be encoded: {error}"),
                )
            })?
        };
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
        let mut config = OpenAiConfig::new("https://api.example.invalid/v1", "m");
        config.api_key = Some("sk-very-secret".to_owned());
        let client = OpenAiChat::new(config.clone()).unwrap();
        assert!(!format!("{config:?}").contains("sk-very-secret"));
        assert!(!format!("{client:?}").contains("sk-very-secret"));
        assert!(format!("{client:?}").contains("[redacted]"));
    }

    #[test]
    fn endpoint_is_built_from_the_base_url() {
        let client = OpenAiChat::new(OpenAiConfig::new("http://127.0.0.1:11434/v1/", "m")).unwrap();
        assert_eq!(
            client.transport.endpoint().as_str(),
            "http://127.0.0.1:11434/v1/chat/completions"
        );
    }

    #[test]
    fn bad_base_urls_and_keys_are_rejected() {
        for base_url in ["", "api.openai.com/v1", "ftp://host/v1", "file:///tmp"] {
            assert!(
                matches!(
                    OpenAiChat::new(OpenAiConfig::new(base_url, "m")),
                    Err(BuildError::InvalidBaseUrl { .. })
                ),
                "{base_url}"
            );
        }
        let mut config = OpenAiConfig::new("http://localhost/v1", "m");
        config.api_key = Some("line\nbreak-secret".to_owned());
        let error = OpenAiChat::new(config).unwrap_err();
        assert!(matches!(error, BuildError::InvalidApiKey));
        assert!(!error.to_string().contains("break-secret"));
    }

    #[test]
    fn client_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<OpenAiChat>();
        assert_send_sync::<OpenAiConfig>();
    }
}
