//! Context accounting (DESIGN.md §7): how many tokens a request costs, and the window
//! policy the projection keeps to.

use std::fmt::Debug;

use serde::{Deserialize, Serialize};

use crate::{Message, ModelRequest};

/// Counts tokens of text for one model family.
pub trait TokenCounter: Send + Sync + Debug {
    /// Tokens in `text`.
    fn count(&self, text: &str) -> u64;
    /// What this counter is (`o200k_base`, `approx: ceil(bytes / 3)`), for the ledger.
    fn name(&self) -> &str;
}

/// The stated approximation used where no real tokenizer is known: one token per three
/// bytes, rounded up. Real tokenizers give about four bytes per token for English prose
/// and three for code, so this over-estimates, which is the safe side for a window.
#[derive(Debug, Default, Clone, Copy)]
pub struct ApproxCounter;

impl TokenCounter for ApproxCounter {
    fn count(&self, text: &str) -> u64 {
        (text.len() as u64).div_ceil(3)
    }

    fn name(&self) -> &str {
        "approx: ceil(bytes / 3)"
    }
}

/// Tokens a provider adds per message for roles and separators (OpenAI's documented
/// figure is 3–4; 4 is used for every provider).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// The estimated size of a request in tokens: system prompt, every message, tool
/// definitions, with a per-message overhead.
pub fn estimate_request_tokens(request: &ModelRequest, counter: &dyn TokenCounter) -> u64 {
    let tools = if request.tools.is_empty() {
        0
    } else {
        counter.count(&serde_json::to_string(&request.tools).unwrap_or_default())
    };
    counter.count(&request.system) + tools + estimate_messages_tokens(&request.messages, counter)
}

/// The estimated size of messages in tokens.
pub fn estimate_messages_tokens(messages: &[Message], counter: &dyn TokenCounter) -> u64 {
    messages.iter().map(|message| estimate_message_tokens(message, counter)).sum()
}

/// The estimated size of one message in tokens.
pub fn estimate_message_tokens(message: &Message, counter: &dyn TokenCounter) -> u64 {
    MESSAGE_OVERHEAD_TOKENS
        + match message {
            Message::User { text } => counter.count(text),
            Message::Assistant { text, reasoning, tool_calls } => {
                counter.count(text)
                    + reasoning
                        .iter()
                        .map(|part| {
                            counter.count(&part.text)
                                + part.signature.as_deref().map_or(0, |s| counter.count(s))
                                + part.redacted.as_deref().map_or(0, |s| counter.count(s))
                        })
                        .sum::<u64>()
                    + tool_calls
                        .iter()
                        .map(|call| {
                            counter.count(&call.name)
                                + counter.count(&call.arguments.to_string())
                                + MESSAGE_OVERHEAD_TOKENS
                        })
                        .sum::<u64>()
            }
            Message::ToolResult { content, call_id, .. } => {
                counter.count(content) + counter.count(call_id.as_str())
            }
        }
}

/// How the projection keeps a request inside the model's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextPolicy {
    /// The model's context window in tokens; `None`: unknown. The kernel's turn loop then
    /// assumes [`ContextPolicy::DEFAULT_WINDOW_TOKENS`] ([`ContextPolicy::or_default_window`]),
    /// so pruning and compaction bound every request.
    pub window: Option<u64>,
    /// Tokens reserved for the answer.
    pub reserve: u64,
    /// Tool results larger than this many bytes are shown as a head/tail preview with a
    /// handle for `read_tool_result`.
    pub inline_limit_bytes: usize,
}

impl ContextPolicy {
    /// The default inline limit: 16 KiB.
    pub const DEFAULT_INLINE_LIMIT_BYTES: usize = 16 * 1024;

    /// The window assumed for a model whose window is unknown, in tokens: 128 000, the
    /// smallest window of the current frontier models, so a request that fits it fits them.
    pub const DEFAULT_WINDOW_TOKENS: u64 = 128_000;

    /// This policy, or, when the window is unknown, the policy for
    /// [`ContextPolicy::DEFAULT_WINDOW_TOKENS`] with this inline limit.
    pub fn or_default_window(self) -> ContextPolicy {
        match self.window {
            Some(_) => self,
            None => ContextPolicy {
                inline_limit_bytes: self.inline_limit_bytes,
                ..ContextPolicy::for_window(Some(ContextPolicy::DEFAULT_WINDOW_TOKENS))
            },
        }
    }

    /// A policy for `window` with the default reserve (a quarter of the window, at most
    /// 8192 tokens) and inline limit.
    pub fn for_window(window: Option<u64>) -> ContextPolicy {
        ContextPolicy {
            window,
            reserve: window.map_or(0, |window| (window / 4).min(8192)),
            inline_limit_bytes: ContextPolicy::DEFAULT_INLINE_LIMIT_BYTES,
        }
    }

    /// Tokens a request may use: the window minus the reserve.
    pub fn budget(&self) -> Option<u64> {
        self.window.map(|window| window.saturating_sub(self.reserve))
    }
}

impl Default for ContextPolicy {
    fn default() -> Self {
        ContextPolicy::for_window(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approximation_rounds_up() {
        assert_eq!(ApproxCounter.count(""), 0);
        assert_eq!(ApproxCounter.count("abcd"), 2);
        assert_eq!(ApproxCounter.count("abc"), 1);
    }

    #[test]
    fn policy_reserve() {
        let policy = ContextPolicy::for_window(Some(8000));
        assert_eq!(policy.reserve, 2000);
        assert_eq!(policy.budget(), Some(6000));
        assert_eq!(ContextPolicy::for_window(Some(200_000)).reserve, 8192);
        assert_eq!(ContextPolicy::for_window(None).budget(), None);
    }
}
