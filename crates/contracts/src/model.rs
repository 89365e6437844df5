//! The [`ModelClient`] trait and the one error model shared by every provider.

use std::fmt::Debug;
use std::time::Duration;

use async_trait::async_trait;

use crate::{ModelRequest, ModelResponse, StreamDelta};

/// What a client says about the model behind it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// Provider name (`openai`, `anthropic`, `scripted`).
    pub provider: String,
    /// Model name.
    pub model: String,
    /// Context window in tokens, when known.
    pub context_window: Option<u64>,
}

/// The kind of a provider failure; decides retry and how the run ends.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ModelErrorKind {
    /// Bad or missing credentials (401/403). Not retryable.
    Auth,
    /// Too many requests (429 `rate_limit_exceeded`). Retryable after the delay, if given.
    RateLimited {
        /// The server's `Retry-After`, when sent.
        retry_after: Option<Duration>,
    },
    /// The account's quota or credit is exhausted (429 `insufficient_quota`). Not retryable.
    QuotaExhausted,
    /// The provider is overloaded (529, 503). Retryable.
    Overloaded,
    /// The request does not fit the model's context window. Not retryable as is.
    ContextTooLong,
    /// The provider rejected the request (400, 404, 422). Not retryable.
    InvalidRequest,
    /// The provider failed (5xx). Retryable.
    Server,
    /// The connection failed or timed out before a response. Retryable.
    Transport,
    /// The stream was aborted, truncated or spliced, or carried an error event. Retryable.
    Stream,
    /// The provider's response arrived whole but keel cannot read it: a payload that is not
    /// valid JSON, or a body that is neither a response nor an error. Not retryable: the same
    /// request would be answered (and billed) the same way again.
    InvalidResponse,
    /// The scripted model's script ran out or an expectation failed. Not retryable.
    Script,
}

impl ModelErrorKind {
    /// A stable snake_case name for the kind (`rate_limited`, `server`, ...), as recorded in
    /// `model_retry.error`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ModelErrorKind::Auth => "auth",
            ModelErrorKind::RateLimited { .. } => "rate_limited",
            ModelErrorKind::QuotaExhausted => "quota_exhausted",
            ModelErrorKind::Overloaded => "overloaded",
            ModelErrorKind::ContextTooLong => "context_too_long",
            ModelErrorKind::InvalidRequest => "invalid_request",
            ModelErrorKind::Server => "server",
            ModelErrorKind::Transport => "transport",
            ModelErrorKind::Stream => "stream",
            ModelErrorKind::InvalidResponse => "invalid_response",
            ModelErrorKind::Script => "script",
        }
    }
}

/// A provider failure, with the provider's own message (never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ModelError {
    /// What kind of failure.
    pub kind: ModelErrorKind,
    /// HTTP status, when there was one.
    pub status: Option<u16>,
    /// The provider's message, or ours.
    pub message: String,
}

impl ModelError {
    /// A new error.
    pub fn new(kind: ModelErrorKind, status: Option<u16>, message: impl Into<String>) -> Self {
        ModelError { kind, status, message: message.into() }
    }

    /// Whether the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self.kind,
            ModelErrorKind::RateLimited { .. }
                | ModelErrorKind::Overloaded
                | ModelErrorKind::Server
                | ModelErrorKind::Transport
                | ModelErrorKind::Stream
        )
    }
}

/// A model behind any provider, including the scripted model.
#[async_trait]
pub trait ModelClient: Send + Sync + Debug {
    /// Describes the provider and model.
    fn info(&self) -> ModelInfo;

    /// Sends one request and returns the whole response, calling `on_delta` as it streams.
    ///
    /// Implementations retry retryable failures a bounded number of times themselves; a
    /// stream that fails part-way is retried whole and its partial content is discarded.
    /// Before waiting to retry, an implementation calls `on_delta` with
    /// [`StreamDelta::Retrying`], so the caller can record the retry and discard what the
    /// failed attempt streamed.
    ///
    /// # Errors
    ///
    /// A [`ModelError`] when no complete response could be had.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future abandons the request; nothing is recorded for it.
    async fn complete(
        &self,
        request: &ModelRequest,
        on_delta: &(dyn Fn(StreamDelta) + Send + Sync),
    ) -> Result<ModelResponse, ModelError>;
}
