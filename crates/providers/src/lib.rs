//! keel-providers: model clients behind keel-contracts' [`ModelClient`](keel_contracts::ModelClient).
//!
//! | feature | default | client |
//! |---|---|---|
//! | `openai` | yes | [`OpenAiChat`]: OpenAI-compatible Chat Completions with SSE streaming |
//! | `openai` | yes | [`OpenAiResponses`]: OpenAI's Responses API with SSE streaming |
//! | `anthropic` | yes | [`AnthropicMessages`]: Anthropic's Messages API with SSE streaming |
//! | (always) | yes | [`ScriptedModel`]: the deterministic scripted model of DESIGN.md §9 |
//!
//! Entry points: [`OpenAiChat::new`] and [`OpenAiResponses::new`] with an [`OpenAiConfig`]
//! (the Responses API's extra knobs in [`ResponsesOptions`]), [`AnthropicMessages::new`]
//! with an [`AnthropicConfig`]; retries are set with a [`RetryPolicy`]. A client that
//! cannot be built says why with a [`BuildError`].
//!
//! Invariants of the network clients:
//! - One error model: every failure (HTTP status, error body, error event inside a 200
//!   stream) is mapped to a `ModelError` in one place (`failure.rs`).
//! - An aborted, truncated, spliced or error-carrying stream is a `ModelError`, never a
//!   success; a complete response that cannot be read is `InvalidResponse`, not retried.
//! - Response fields are read leniently (`lenient`): a field of an unexpected shape, or an
//!   event keel ignores, never fails a response.
//! - Tools off keeps the tool definitions and says "none" (`tooling`), so a history with
//!   tool calls stays valid on every wire API.
//! - Usage: whether reasoning is inside the completion count is decided from the
//!   provider's totals (`usage`); the provider's own usage object is kept raw.
//! - Retries are bounded, back off with jitter, honour `Retry-After` up to a cap, and resend
//!   the whole request; a partial stream is discarded.
//! - Reasoning that a provider needs back (Anthropic thinking signatures and redacted
//!   blocks, OpenAI encrypted reasoning) is kept byte-exact in `ReasoningPart` and replayed
//!   unchanged.
//! - API keys never appear in errors, logs or `Debug` output.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "anthropic")]
mod anthropic;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod arguments;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod error;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod failure;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod lenient;
#[cfg(feature = "openai")]
mod openai;
#[cfg(feature = "openai")]
mod responses;
mod retry;
mod scripted;
#[cfg_attr(not(any(feature = "openai", feature = "anthropic")), allow(dead_code))]
mod sse;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod tooling;
#[cfg(any(feature = "openai", feature = "anthropic"))]
mod transport;
#[cfg(feature = "openai")]
mod usage;

#[cfg(feature = "anthropic")]
pub use anthropic::{AnthropicConfig, AnthropicMessages};
#[cfg(any(feature = "openai", feature = "anthropic"))]
pub use error::BuildError;
#[cfg(feature = "openai")]
pub use openai::{OpenAiChat, OpenAiConfig};
#[cfg(feature = "openai")]
pub use responses::{OpenAiResponses, ResponsesOptions};
pub use retry::RetryPolicy;
pub use scripted::{MAX_SCRIPT_BYTES, ScriptError, ScriptedModel};
