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
mod failure;
mod wire;

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use keel_contracts::{
    ModelClient, ModelError, ModelErrorKind, ModelInfo, ModelRequest, ModelResponse, StreamDelta,
};
use reqwest::header::{self, HeaderMap, HeaderValue};

use crate::retry::{Failure, Jitter, RetryPolicy, with_retries};
use crate::sse::SseParser;
use assemble::{Assembler, Flow, OnDelta};
use wire::{ChatCompletion, ChatRequest};

/// The most of an error body that is read, in bytes; the rest is ignored.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;
/// The largest non-streaming completion body accepted, in bytes.
const MAX_JSON_BODY_BYTES: usize = 16 * 1024 * 1024;

/// What [`OpenAiChat::read_body`] does with a body longer than its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Overflow {
    /// Keep the first bytes, drop the rest (error bodies only explain a failure).
    Truncate,
    /// Fail: a cut completion would be a wrong answer.
    Fail,
}

/// How to reach an OpenAI-compatible Chat Completions endpoint.
///
/// [`OpenAiConfig::new`] fills in the defaults for everything but the endpoint and the
/// model; the fields are public so a caller can change any of them before
/// [`OpenAiChat::new`]. `Debug` shows `api_key` as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`;
    /// requests go to `{base_url}/chat/completions`.
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

/// Why an [`OpenAiChat`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenAiBuildError {
    /// The base URL is not an absolute `http` or `https` URL.
    #[error("base url {base_url:?} is not an absolute http(s) url")]
    InvalidBaseUrl {
        /// The URL given.
        base_url: String,
    },
    /// The API key cannot be sent in an HTTP header (it has control characters or
    /// non-ASCII bytes). The key itself is not repeated here.
    #[error("api key contains characters that cannot be sent in an http header")]
    InvalidApiKey,
    /// The HTTP client could not be set up (for example, no TLS roots).
    #[error("http client could not be built: {message}")]
    HttpClient {
        /// The HTTP library's message.
        message: String,
    },
}

/// A [`ModelClient`] for an OpenAI-compatible Chat Completions endpoint, streaming over
/// server-sent events.
///
/// One `OpenAiChat` may serve many concurrent requests; it holds a connection pool.
/// `Debug` never shows the API key.
#[derive(Clone)]
pub struct OpenAiChat {
    config: OpenAiConfig,
    endpoint: reqwest::Url,
    authorization: Option<HeaderValue>,
    http: reqwest::Client,
}

impl fmt::Debug for OpenAiChat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiChat")
            .field("config", &self.config)
            .field("endpoint", &self.endpoint.as_str())
            .finish_non_exhaustive()
    }
}

impl OpenAiChat {
    /// A client for the endpoint and model in `config`.
    ///
    /// # Errors
    ///
    /// [`OpenAiBuildError::InvalidBaseUrl`] when `base_url` is not an absolute http(s)
    /// URL, [`OpenAiBuildError::InvalidApiKey`] when the key cannot be sent in a header,
    /// [`OpenAiBuildError::HttpClient`] when the HTTP client cannot be set up.
    pub fn new(config: OpenAiConfig) -> Result<Self, OpenAiBuildError> {
        let invalid_url = || OpenAiBuildError::InvalidBaseUrl { base_url: config.base_url.clone() };
        let endpoint = format!("{}/chat/completions", config.base_url.trim().trim_end_matches('/'));
        let endpoint = reqwest::Url::parse(&endpoint).map_err(|_| invalid_url())?;
        if !matches!(endpoint.scheme(), "http" | "https") || endpoint.host_str().is_none() {
            return Err(invalid_url());
        }
        let authorization = match &config.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}"))
                    .map_err(|_| OpenAiBuildError::InvalidApiKey)?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|error| OpenAiBuildError::HttpClient { message: error.to_string() })?;
        Ok(OpenAiChat { config, endpoint, authorization, http })
    }

    /// The configuration this client was built from.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    fn secret(&self) -> Option<&str> {
        self.config.api_key.as_deref()
    }

    /// One attempt: send the request and read the whole response.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection; the partial response is discarded.
    async fn attempt(&self, body: Bytes, on_delta: OnDelta<'_>) -> Result<ModelResponse, Failure> {
        let mut request = self
            .http
            .post(self.endpoint.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "text/event-stream, application/json")
            .body(body);
        if let Some(authorization) = &self.authorization {
            request = request.header(header::AUTHORIZATION, authorization.clone());
        }
        let response = match tokio::time::timeout(self.config.request_timeout, request.send()).await
        {
            Err(_elapsed) => {
                return Err(self.error(
                    ModelErrorKind::Transport,
                    None,
                    format!("no response within {:?}", self.config.request_timeout),
                ));
            }
            Ok(Err(error)) => {
                return Err(self.error(
                    ModelErrorKind::Transport,
                    None,
                    format!("request failed: {}", error_chain(&error)),
                ));
            }
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if !status.is_success() {
            let headers = response.headers();
            let retry_after = failure::retry_after(
                header_str(headers, "retry-after-ms"),
                header_str(headers, header::RETRY_AFTER.as_str()),
                header_str(headers, header::DATE.as_str()),
            );
            // The body only explains the failure: a partial or unreadable one still maps.
            let body = self
                .read_body(response, MAX_ERROR_BODY_BYTES, Overflow::Truncate)
                .await
                .unwrap_or_default();
            let failure = failure::http_failure(status.as_u16(), &body, retry_after, self.secret());
            tracing::debug!(status = status.as_u16(), kind = ?failure.error.kind, "chat completions request failed");
            return Err(failure);
        }

        let is_json = header_str(response.headers(), header::CONTENT_TYPE.as_str())
            .is_some_and(|content_type| content_type.to_ascii_lowercase().contains("json"));
        if is_json {
            let body = self.read_body(response, MAX_JSON_BODY_BYTES, Overflow::Fail).await?;
            let completion: ChatCompletion = serde_json::from_slice(&body).map_err(|error| {
                self.error(
                    ModelErrorKind::Stream,
                    None,
                    format!("malformed completion body: {error}"),
                )
            })?;
            return Assembler::new(on_delta, self.secret())
                .apply_completion(completion)
                .map_err(Failure::from);
        }
        self.read_stream(response, on_delta).await
    }

    /// Reads a `text/event-stream` body into a response.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection; the partial response is discarded.
    async fn read_stream(
        &self,
        mut response: reqwest::Response,
        on_delta: OnDelta<'_>,
    ) -> Result<ModelResponse, Failure> {
        let mut parser = SseParser::new();
        let mut assembler = Assembler::new(on_delta, self.secret());
        loop {
            let chunk =
                match tokio::time::timeout(self.config.stream_idle_timeout, response.chunk()).await
                {
                    Err(_elapsed) => {
                        return Err(self.error(
                            ModelErrorKind::Stream,
                            None,
                            format!(
                                "stream stalled: no data for {:?}",
                                self.config.stream_idle_timeout
                            ),
                        ));
                    }
                    Ok(Err(error)) => {
                        return Err(self.error(
                            ModelErrorKind::Stream,
                            None,
                            format!("stream aborted: {}", error_chain(&error)),
                        ));
                    }
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(chunk))) => chunk,
                };
            let events = parser
                .push(&chunk)
                .map_err(|error| self.error(ModelErrorKind::Stream, None, error.to_string()))?;
            for event in events {
                if assembler.apply_event(&event.event, &event.data)? == Flow::Done {
                    return Ok(assembler.finish());
                }
            }
        }
        // The body ended. A last event without its blank line still counts.
        if let Some(event) = parser.finish()
            && assembler.apply_event(&event.event, &event.data)? == Flow::Done
        {
            return Ok(assembler.finish());
        }
        if assembler.has_finish_reason() {
            // Some servers close the stream after the finish chunk without `[DONE]`.
            return Ok(assembler.finish());
        }
        Err(self.error(
            ModelErrorKind::Stream,
            None,
            "stream ended before a finish reason or [DONE]: the response is truncated",
        ))
    }

    /// Reads a whole body, at most `limit_bytes` of it; `overflow` says what happens to a
    /// longer one.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future closes the connection.
    async fn read_body(
        &self,
        mut response: reqwest::Response,
        limit_bytes: usize,
        overflow: Overflow,
    ) -> Result<Vec<u8>, Failure> {
        let mut body = Vec::new();
        loop {
            let chunk =
                match tokio::time::timeout(self.config.stream_idle_timeout, response.chunk()).await
                {
                    Err(_elapsed) => {
                        return Err(self.error(
                            ModelErrorKind::Stream,
                            None,
                            "response body stalled",
                        ));
                    }
                    Ok(Err(error)) => {
                        return Err(self.error(
                            ModelErrorKind::Stream,
                            None,
                            format!("response body aborted: {}", error_chain(&error)),
                        ));
                    }
                    Ok(Ok(None)) => return Ok(body),
                    Ok(Ok(Some(chunk))) => chunk,
                };
            if body.len().saturating_add(chunk.len()) > limit_bytes {
                if overflow == Overflow::Truncate {
                    let room = limit_bytes.saturating_sub(body.len());
                    body.extend_from_slice(chunk.get(..room).unwrap_or_default());
                    return Ok(body);
                }
                return Err(self.error(
                    ModelErrorKind::Stream,
                    None,
                    format!("response body exceeds {limit_bytes} bytes"),
                ));
            }
            body.extend_from_slice(&chunk);
        }
    }

    fn error(
        &self,
        kind: ModelErrorKind,
        status: Option<u16>,
        message: impl AsRef<str>,
    ) -> Failure {
        Failure::from(ModelError::new(
            kind,
            status,
            failure::redact(message.as_ref(), self.secret()),
        ))
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
    /// the returned response counts.
    ///
    /// # Errors
    ///
    /// The [`ModelError`] of the last attempt: [`ModelErrorKind::Auth`],
    /// [`ModelErrorKind::QuotaExhausted`], [`ModelErrorKind::ContextTooLong`] and
    /// [`ModelErrorKind::InvalidRequest`] at once; [`ModelErrorKind::RateLimited`],
    /// [`ModelErrorKind::Overloaded`], [`ModelErrorKind::Server`],
    /// [`ModelErrorKind::Transport`] and [`ModelErrorKind::Stream`] (a malformed,
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
        let body =
            serde_json::to_vec(&ChatRequest::streaming(model, request)).map_err(|error| {
                ModelError::new(
                    ModelErrorKind::InvalidRequest,
                    None,
                    format!("request cannot be encoded: {error}"),
                )
            })?;
        let body = Bytes::from(body);
        let mut jitter = Jitter::from_entropy();
        with_retries(&self.config.retry, &mut jitter, |_n_retries| {
            self.attempt(body.clone(), on_delta)
        })
        .await
    }
}

fn header_str<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// An error and its sources, one after the other (reqwest's own message is terse).
fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
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
        assert_eq!(client.endpoint.as_str(), "http://127.0.0.1:11434/v1/chat/completions");
    }

    #[test]
    fn bad_base_urls_and_keys_are_rejected() {
        for base_url in ["", "api.openai.com/v1", "ftp://host/v1", "file:///tmp"] {
            assert!(
                matches!(
                    OpenAiChat::new(OpenAiConfig::new(base_url, "m")),
                    Err(OpenAiBuildError::InvalidBaseUrl { .. })
                ),
                "{base_url}"
            );
        }
        let mut config = OpenAiConfig::new("http://localhost/v1", "m");
        config.api_key = Some("line\nbreak-secret".to_owned());
        let error = OpenAiChat::new(config).unwrap_err();
        assert!(matches!(error, OpenAiBuildError::InvalidApiKey));
        assert!(!error.to_string().contains("break-secret"));
    }

    #[test]
    fn client_is_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<OpenAiChat>();
        assert_send_sync::<OpenAiConfig>();
    }
}
