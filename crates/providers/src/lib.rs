//! keel-providers: model clients behind keel-contracts' [`ModelClient`](keel_contracts::ModelClient).
//!
//! | feature | default | client |
//! |---|---|---|
//! | `openai` | yes | [`OpenAiChat`]: OpenAI-compatible Chat Completions with SSE streaming |
//! | (always) | yes | [`ScriptedModel`]: the deterministic scripted model of DESIGN.md §9 |
//!
//! Entry points: [`OpenAiChat::new`] with an [`OpenAiConfig`]; retries are set with a
//! [`RetryPolicy`].
//!
//! Invariants of the network clients:
//! - An aborted, truncated or error-carrying stream is a `ModelError`, never a success.
//! - Retries are bounded, back off with jitter, honour `Retry-After` up to a cap, and resend
//!   the whole request; a partial stream is discarded.
//! - API keys never appear in errors, logs or `Debug` output.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

#[cfg(feature = "openai")]
mod openai;
mod retry;
mod scripted;
#[cfg_attr(not(feature = "openai"), allow(dead_code))]
mod sse;

#[cfg(feature = "openai")]
pub use openai::{OpenAiBuildError, OpenAiChat, OpenAiConfig};
pub use retry::RetryPolicy;
pub use scripted::{ScriptError, ScriptedModel};
