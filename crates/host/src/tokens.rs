//! Token counting for the context window: OpenAI's own BPE vocabularies (tiktoken-rs,
//! embedded in the crate, no download) for OpenAI models, and keel-contracts' stated
//! approximation (`ceil(bytes / 3)`) for every other model.

use std::sync::{Arc, OnceLock};

use keel_contracts::{ApproxCounter, TokenCounter};
use tiktoken_rs::CoreBPE;

/// A tiktoken vocabulary.
struct Tiktoken {
    name: &'static str,
    bpe: &'static CoreBPE,
}

impl std::fmt::Debug for Tiktoken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tiktoken").field("name", &self.name).finish()
    }
}

impl TokenCounter for Tiktoken {
    fn count(&self, text: &str) -> u64 {
        self.bpe.count_ordinary(text) as u64
    }

    fn name(&self) -> &str {
        self.name
    }
}

fn o200k() -> Option<&'static CoreBPE> {
    static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::o200k_base().ok()).as_ref()
}

fn cl100k() -> Option<&'static CoreBPE> {
    static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::cl100k_base().ok()).as_ref()
}

/// The counter for `provider:model`: o200k_base for GPT-4o, GPT-4.1, GPT-5 and the o-series,
/// cl100k_base for GPT-4 and GPT-3.5 (OpenAI's published encodings), else the approximation.
pub fn counter_for(provider: &str, model: &str) -> Arc<dyn TokenCounter> {
    let openai = matches!(provider, "openai" | "openai-responses");
    let model = model.rsplit('/').next().unwrap_or(model);
    let modern = ["gpt-4o", "gpt-4.1", "gpt-4.5", "gpt-5", "o1", "o3", "o4", "chatgpt-4o"];
    let is_modern = modern.iter().any(|prefix| model.starts_with(prefix));
    let is_older = model.starts_with("gpt-4") || model.starts_with("gpt-3.5");
    let found = match (openai, is_modern, is_older) {
        (true, true, _) => o200k().map(|bpe| Tiktoken { name: "o200k_base", bpe }),
        (true, false, true) => cl100k().map(|bpe| Tiktoken { name: "cl100k_base", bpe }),
        _ => None,
    };
    match found {
        Some(counter) => Arc::new(counter),
        None => Arc::new(ApproxCounter),
    }
}

/// Known context windows in tokens, from the providers' model pages (2026-11).
pub fn known_window(provider: &str, model: &str) -> Option<u64> {
    let model = model.rsplit('/').next().unwrap_or(model);
    let table: &[(&str, &str, u64)] = &[
        ("openai", "gpt-4o", 128_000),
        ("openai", "gpt-4.1", 1_047_576),
        ("openai", "gpt-5", 400_000),
        ("openai", "o4-mini", 200_000),
        ("openai", "o3", 200_000),
        ("openai", "gpt-4-turbo", 128_000),
        ("openai", "gpt-3.5-turbo", 16_385),
        ("anthropic", "claude-", 200_000),
    ];
    let provider = if provider == "openai-responses" { "openai" } else { provider };
    table
        .iter()
        .find(|(p, prefix, _)| *p == provider && model.starts_with(prefix))
        .map(|(_, _, window)| *window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openai_models_get_their_real_tokenizer() {
        let counter = counter_for("openai", "gpt-4o-mini");
        assert_eq!(counter.name(), "o200k_base");
        assert_eq!(counter.count("hello world"), 2);
        assert_eq!(counter_for("openai", "gpt-4").name(), "cl100k_base");
        assert_eq!(counter_for("anthropic", "claude-sonnet-4-5").name(), "approx: ceil(bytes / 3)");
        assert_eq!(counter_for("openai", "qwen2.5-coder").name(), "approx: ceil(bytes / 3)");
        assert_eq!(known_window("anthropic", "claude-haiku-4-5"), Some(200_000));
        assert_eq!(known_window("openai", "llama3"), None);
    }
}
