//! keel-providers: model clients behind keel-contracts' [`ModelClient`](keel_contracts::ModelClient).
//!
//! | feature | default | client |
//! |---|---|---|
//! | `openai` | yes | [`OpenAiChat`]: OpenAI-compatible Chat Completions with SSE streaming |
//! | (always) | yes | [`ScriptedModel`]: the deterministic scripted model of DESIGN.md §9 |
//!
//! Entry points: [`OpenAiChat::new`] with an [`OpenAiConfig`]; retries are set with a
//! [`RetryPolicy`]. A client that cannot be built says why with a [`BuildError`].
//!
//! Invariants of the network clients:
//! - One error model: every failure (HTTP status, error body, error event inside a 200
//!   stream) is mapped to a `ModelError` in one place (`failure.rs`).
//! - An aborted, truncated or error-carrying stream is a `ModelError`, never a success.
//! - Retries are bounded, back off with jitter, honour `Retry-After` up to a cap, and resend
//!   the whole request; a partial stream is discarded.
//! - API keys never appear in errors, logs or `Debug` output.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "openai")]
mod arguments;
#[cfg(feature = "openai")]
mod error;
#[cfg(feature = "openai")]
mod failure;
#[cfg(feature = "openai")]
mod openai;
mod retry;
mod scripted;
#[cfg_attr(not(feature = "openai"), allow(dead_code))]
mod sse;
#[cfg(feature = "openai")]
mod transport;

#[cfg(feature = "openai")]
pub use error::BuildError;
#[cfg(feature = "openai")]
pub use openai::{OpenAiChat, OpenAiConfig};
pub use retry::RetryPolicy;
pub use scripted::{ScriptError, ScriptedModel};
